"""The comparison: the same definitions on every tool's records, bootstrap ratios, and the verdict.

Other processes on these cores make the server itself faster or slower from one run to the next, so a plain
difference of client means is mostly machine noise. The verdict (TTFT mean and TPOT mean within
:data:`TOLERANCE` of ours) therefore compares each client's mean divided by the server's own mean over exactly
the same requests (``/metrics`` scraped around each run): the server's speed cancels, what is left is how each
client measures. The plain difference is kept beside it, with a bootstrap interval and its value per round.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from helpers.bench.stats import bootstrap_ci

from .process import STARTUP_S
from .records import Load, Req, ToolRun, matched_metrics, mean, median, pct

__all__ = ["TOLERANCE", "FIRST_K", "pooled", "boot_ratio", "compare_matched", "verdict", "reported_summary",
           "chunking", "lost", "summarize_runs"]

TOLERANCE = 0.05
FIRST_K = 5  # "the first requests" of a run


def pooled(runs: Sequence[ToolRun], tool: str) -> list[Req]:
    """Every request of ``tool``'s successful runs, all rounds together."""
    return [r for run in runs if run.tool == tool and run.ok for r in run.reqs]


def boot_ratio(a: Sequence[float], b: Sequence[float], seed: int = 0, n_boot: int = 4000) -> tuple[float, float]:
    """95% bootstrap interval of mean(b) / mean(a), requests resampled within each tool."""
    ci = bootstrap_ci([list(a), list(b)], lambda xa, xb: xb.mean() / xa.mean(), n_boot=n_boot, seed=seed)
    if ci is None:
        raise ValueError(f"a bootstrap ratio needs two requests or more from each tool: {len(a)} and {len(b)}")
    return ci


def _server_weighted(runs: Sequence[ToolRun], tool: str, metric: str) -> float | None:
    """The server's own mean of ``metric`` over a tool's runs (each run weighted by its requests)."""
    num = den = 0.0
    for run in runs:
        if run.tool != tool or not run.ok:
            continue
        v, n = run.server_mean(metric), run.matched["n"]
        if v is None or not n:
            return None
        num, den = num + v * n, den + n
    return num / den if den else None


def _per_round(runs: Sequence[ToolRun], tool: str, base: str, metric: str, paired: bool) -> list[float]:
    vals = []
    for rnd in sorted({run.round for run in runs}):
        ra = [r for r in runs if r.tool == base and r.round == rnd and r.ok]
        rb = [r for r in runs if r.tool == tool and r.round == rnd and r.ok]
        if not ra or not rb:
            continue
        ca, cb = ra[0].matched[f"{metric}_mean"], rb[0].matched[f"{metric}_mean"]
        sa, sb = ra[0].server_mean(metric), rb[0].server_mean(metric)
        if not ca or not cb or (paired and (not sa or not sb)):
            continue
        vals.append(_gap_diff(ca, sa, cb, sb) if paired else cb / ca - 1.0)
    return vals


def _gap_diff(ca: float, sa: float, cb: float, sb: float) -> float:
    """How much more tool b's client adds to the server's own mean than tool a's does (client mean - server mean
    over the same requests), as a fraction of the smaller server mean.

    The gap is HTTP, JSON and the client's event loop: milliseconds that do not grow with the server's time. A
    ratio of client/server ratios would scale each tool's gap by its own server mean; measured in `make test` (the
    CPU-only tests beside the server), the server's TTFT was 52 ms in vLLM's runs and 434 ms in ours, the gaps
    3.6 and 2.6 ms, and the ratios differed by 6.2% for one millisecond of difference."""
    return ((cb - sb) - (ca - sa)) / min(sa, sb)


def compare_matched(runs: Sequence[ToolRun], tool: str, base: str = "ours",
                    tolerance: float = TOLERANCE) -> dict[str, Any]:
    """TTFT and TPOT means of ``tool`` against ``base`` on the same definitions, two ways.

    ``raw``: the client means pooled over rounds, with a bootstrap interval over requests and the per-round
    differences. ``paired`` (the verdict): each client's gap over the server's own mean for exactly the same
    requests (vLLM's TTFT from arrival to first token, its TPOT = decode time / (n - 1): the same definitions),
    tool against base, as a fraction of the server's mean (:func:`_gap_diff`); the ratios are kept for display.
    """
    out: dict[str, Any] = {}
    a_reqs, b_reqs = pooled(runs, base), pooled(runs, tool)
    for metric in ("ttft", "tpot"):
        a = [getattr(r, f"{metric}_ms") for r in a_reqs if r.ok and getattr(r, f"{metric}_ms") is not None]
        b = [getattr(r, f"{metric}_ms") for r in b_reqs if r.ok and getattr(r, f"{metric}_ms") is not None]
        if not a or not b:
            out[metric] = {"available": False}
            continue
        ma, mb = float(np.mean(a)), float(np.mean(b))
        raw = {"base_mean": ma, "mean": mb, "rel_diff": mb / ma - 1.0,
               "ci95": [x - 1.0 for x in boot_ratio(a, b)],
               "per_round_rel_diff": _per_round(runs, tool, base, metric, paired=False)}
        sa, sb = _server_weighted(runs, base, metric), _server_weighted(runs, tool, metric)
        paired: dict[str, Any] = {"available": bool(sa and sb)}
        if sa and sb:
            paired.update({"base_server_mean": sa, "server_mean": sb, "base_ratio": ma / sa, "ratio": mb / sb,
                           "base_gap_ms": ma - sa, "gap_ms": mb - sb, "rel_diff": _gap_diff(ma, sa, mb, sb),
                           "per_round_rel_diff": _per_round(runs, tool, base, metric, paired=True),
                           "server_rel_diff": sb / sa - 1.0})
        rel = paired["rel_diff"] if paired["available"] else raw["rel_diff"]
        out[metric] = {"available": True, "raw": raw, "paired": paired, "rel_diff": rel,
                       "verdict_on": "paired" if paired["available"] else "raw",
                       "within_tolerance": abs(rel) <= tolerance}
    return out


def verdict(runs: Sequence[ToolRun], tools: Sequence[str]) -> bool:
    """True when every tool's TTFT mean and TPOT mean agree with ours within the tolerance."""
    comps = [compare_matched(runs, t) for t in tools if t != "ours"]
    return all(c[m].get("within_tolerance", False) for c in comps for m in ("ttft", "tpot"))


def reported_summary(runs: Sequence[ToolRun], tool: str) -> dict[str, Any]:
    """Each number as the tool reports it: the median over rounds, with the min and max."""
    rs = [run for run in runs if run.tool == tool and run.ok]
    out = {}
    for k in (rs[0].reported.keys() if rs else []):
        vals = [run.reported.get(k) for run in rs if run.reported.get(k) is not None]
        if k in ("completed", "failed"):
            out[k] = {"value": int(sum(vals)), "min": None, "max": None}
        else:
            out[k] = {"value": median(vals), "min": float(min(vals)) if vals else None,
                      "max": float(max(vals)) if vals else None}
    return out


def chunking(runs: Sequence[ToolRun], tool: str) -> dict[str, Any]:
    """How many output tokens each chunk carried, and ITL by the per-chunk and per-token rules."""
    from helpers.bench import itl_values

    reqs = [r for r in pooled(runs, tool) if r.ok]
    chunks = sum(r.chunks or 0 for r in reqs)
    tokens = sum(r.n_out or 0 for r in reqs)
    multi = None
    if reqs and all(r.chunk_tokens is not None for r in reqs):
        multi = sum(1 for r in reqs for k in r.chunk_tokens if k > 1)
    out: dict[str, Any] = {"requests": len(reqs), "chunks": chunks, "tokens": tokens,
                           "tokens_per_chunk": tokens / chunks if chunks else None, "multi_token_chunks": multi}
    if reqs and all(r.gaps_ms is not None for r in reqs):
        per_chunk = [g for r in reqs for g in r.gaps_ms]  # vLLM's rule: one value per chunk after the first
        out["itl_per_chunk"] = {"n": len(per_chunk), "mean": mean(per_chunk), "p50": pct(per_chunk, 50),
                                "p99": pct(per_chunk, 99)}
        if all(r.chunk_tokens is not None for r in reqs):
            per_tok = [v * 1000.0 for r in reqs
                       for v in itl_values(np.cumsum([0.0, *r.gaps_ms]) / 1000.0, r.chunk_tokens)]
            out["itl_per_token"] = {"n": len(per_tok), "mean": mean(per_tok), "p50": pct(per_tok, 50),
                                    "p99": pct(per_tok, 99)}
        req_means = [(r.last_ms - r.ttft_ms) / (r.n_out - 1) for r in reqs if r.n_out and r.n_out > 1]
        out["itl_request_means"] = {"n": len(req_means), "mean": mean(req_means), "p50": pct(req_means, 50),
                                    "p99": pct(req_means, 99)}
    return out


def _server_and_cost(runs: Sequence[ToolRun], tool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's means over a tool's runs, and what the client itself cost."""
    rs = [r for r in runs if r.tool == tool and r.ok]
    sv = [r.server for r in rs if r.server.available]
    server: dict[str, Any] = {k: mean(getattr(s, f"{k}_ms") for s in sv) for k in
                              ("ttft_mean", "tpot_mean", "itl_mean", "e2e_mean", "queue_mean", "prefill_mean")}
    nreq = sum(s.requests or 0 for s in sv)
    server["requests"] = nreq
    server["prompt_tokens_per_request"] = sum(s.prompt_tokens or 0 for s in sv) / nreq if nreq else None
    server["prefix_cache_hits"] = sum(s.prefix_cache_hits or 0 for s in sv)
    first, rest = [], []
    for r in rs:
        ordered = sorted((q for q in r.reqs if q.t0_wall is not None), key=lambda q: q.t0_wall)
        first += [q.ttft_ms for q in ordered[:FIRST_K] if q.ok]
        rest += [q.ttft_ms for q in ordered[FIRST_K:] if q.ok]
    server["client_ttft_first_mean"], server["client_ttft_rest_mean"] = mean(first), mean(rest)
    n = sum(len(r.reqs) for r in rs)
    win = sum(r.window_s or 0 for r in rs)
    cpu_win = [r.cpu_in_window_s for r in rs if r.cpu_in_window_s is not None]
    cost = {
        "cpu_s_per_run": mean(r.cpu_s for r in rs), "wall_s_per_run": mean(r.wall_s for r in rs),
        "cpu_in_window_per_request_ms": (sum(cpu_win) / n * 1000.0) if cpu_win and n else None,
        "cores_in_window": (sum(cpu_win) / win) if cpu_win and win else None,
        "cores_first_s": mean(r.extra.get("cores_first_s") for r in rs),
        "cores_after_first_s": mean(r.extra.get("cores_after_first_s") for r in rs),
    }
    return server, cost


def _throughput(runs: Sequence[ToolRun], load: Load, tools: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"offered_tok_s": load.rate * load.output_len}
    for t in tools:
        rs = [r for r in runs if r.tool == t and r.ok]
        row: dict[str, Any] = {"reported": median(r.reported.get("output_throughput") for r in rs),
                               "duration_s": median(r.extra.get("duration_s") for r in rs)}
        if t == "ours":
            row["whole_span"] = median(r.extra.get("total_output_throughput") for r in rs)
            row["window_s"] = median((r.extra.get("window") or {}).get("duration_s") for r in rs)
            row["window_note"] = next(((r.extra.get("window") or {}).get("note") for r in rs), None)
        if t == "guidellm":
            row["worker_processes"] = next((r.extra.get("worker_processes") for r in rs), None)
            row["tokens_over_duration"] = median(r.extra["output_tokens"] / r.extra["duration_s"] for r in rs
                                                 if r.extra.get("duration_s"))
        out[t] = row
    return out


def _guidellm_tpot_check(runs: Sequence[ToolRun]) -> dict[str, Any]:
    """GuideLLM's TPOT formula, (last token - start) / n, applied to its own records and to ours."""
    def gl_tpot(reqs: Sequence[Req]) -> float | None:
        return mean(r.last_ms / r.n_out for r in reqs if r.ok and r.n_out)

    return {"guidellm_formula_on_guidellm_records": gl_tpot(pooled(runs, "guidellm")),
            "guidellm_formula_on_our_records": gl_tpot(pooled(runs, "ours")),
            "our_tpot_on_our_records": mean(r.tpot_ms for r in pooled(runs, "ours"))}


def lost(run: ToolRun, load: Load) -> int:
    """Requests the tool was asked to send but left no record of (neither completed nor failed)."""
    return max(0, load.num_requests - len(run.reqs)) if run.ok else 0


def summarize_runs(runs: Sequence[ToolRun], load: Load, tools: Sequence[str]) -> dict[str, Any]:
    """Every number the report shows, computed from the runs (nothing here reads a file or a server)."""
    tools = [t for t in tools if any(run.tool == t for run in runs)]
    server_cost = {t: _server_and_cost(runs, t) for t in tools}
    matched = {t: {**matched_metrics(pooled(runs, t)), "lost": sum(lost(r, load) for r in runs if r.tool == t)}
               for t in tools}
    return {
        "tools": tools,
        "reported": {t: reported_summary(runs, t) for t in tools},
        "matched": matched,
        "lost_records": [f"round {r.round + 1} {r.tool}: its output holds {len(r.reqs)} of the {load.num_requests} "
                         "requests it was asked to send; the others left no record" for r in runs if lost(r, load)],
        "comparison": {t: compare_matched(runs, t) for t in tools if t != "ours"},
        "chunking": {t: chunking(runs, t) for t in tools},
        "server": {t: server_cost[t][0] for t in tools},
        "cost": {t: server_cost[t][1] for t in tools},
        "throughput": _throughput(runs, load, tools),
        "e2e_close": {t: mean((r.close_ms - r.last_ms) for r in pooled(runs, t)
                              if r.ok and r.close_ms is not None and r.last_ms is not None) for t in tools},
        "guidellm_tpot_check": _guidellm_tpot_check(runs) if "guidellm" in tools else None,
        "failed_runs": [f"round {r.round + 1} {r.tool}: {r.error}" for r in runs if not r.ok],
        "passed": verdict(runs, tools),
        "startup_s": STARTUP_S, "first_k": FIRST_K, "tolerance": TOLERANCE,
    }
