"""The report: Markdown tables and text from one report dict, written through :func:`helpers.artifacts.write` as
``report.md``, ``report.json``, ``report.html`` and one PNG per chart, with the provenance of the numbers."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from helpers import artifacts, settings

from .explain import DEFINITIONS, differences, fmt, sub
from .records import Target
from .tools import LABELS

__all__ = ["render_markdown", "charts", "write_report", "provenance_of", "STEM"]

STEM = "report"
_REPORTED = [("TTFT mean", "ttft_mean"), ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"),
             ("TPOT mean", "tpot_mean"), ("TPOT p50", "tpot_p50"), ("ITL mean", "itl_mean"), ("ITL p50", "itl_p50"),
             ("ITL p99", "itl_p99"), ("E2E mean", "e2e_mean"), ("E2E p50", "e2e_p50"),
             ("output throughput (tok/s)", "output_throughput"), ("completed", "completed"), ("failed", "failed")]
_MATCHED = [("requests completed", "n"), ("failed", "failed"), ("lost (no record)", "lost"),
            ("TTFT mean", "ttft_mean"), ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"), ("TPOT mean", "tpot_mean"),
            ("TPOT p50", "tpot_p50"), ("E2E mean", "e2e_mean"), ("E2E p50", "e2e_p50")]
_SERVER = [("server TTFT mean (ms)", "ttft_mean"), ("server TPOT mean (ms)", "tpot_mean"),
           ("server ITL mean (ms)", "itl_mean"), ("server E2E mean (ms)", "e2e_mean"),
           ("server queue mean (ms)", "queue_mean"), ("server prefill mean (ms)", "prefill_mean")]


def _rel(v: float | None, base: float | None) -> str:
    return "" if v is None or not base else f" ({v / base - 1:+.1%})"


def _header(tools: list[str], first: str = "metric") -> list[str]:
    return [f"| {first} | " + " | ".join(LABELS[t] for t in tools) + " |", "|---|" + "---|" * len(tools)]


def _table1(rep: dict[str, Any]) -> list[str]:
    tools = rep["tools"]
    L = ["## 1. As each tool reports it\n",
         "Median over rounds of each tool's own number (its own definition; see section 4), with the spread over "
         "rounds [min-max] and the difference from ours. Milliseconds unless said; `-`: the tool has no number by "
         "that name.\n", *_header(tools)]
    for name, key in _REPORTED:
        base = rep["reported"].get("ours", {}).get(key, {}).get("value")
        cells = []
        for t in tools:
            c = rep["reported"][t].get(key, {})
            v = c.get("value")
            if key in ("completed", "failed"):
                cells.append(fmt(v, "d") if v is not None else "-")
                continue
            spread = f" [{fmt(c.get('min'))}-{fmt(c.get('max'))}]" if rep["rounds"] > 1 and v is not None else ""
            cells.append(fmt(v) + spread + (_rel(v, base) if t != "ours" else ""))
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    return L + [""]


def _table2(rep: dict[str, Any]) -> list[str]:
    tools, tol = rep["tools"], rep["tolerance"]
    L = ["## 2. The same definitions on every tool's records\n",
         "Our definitions (TTFT = first output-carrying chunk - send; TPOT = (last output chunk - first) / (n - 1); "
         "E2E = last output chunk - send) applied to the per-request records each tool saved, pooled over rounds. "
         "For `vllm bench serve` and AIPerf on completions these are exactly their own TTFT and TPOT. Below them, "
         "the server's own means over exactly the same requests (vLLM's `/metrics` histograms, scraped before and "
         "after each run; same definitions: TTFT from arrival to first token, TPOT = decode time / (n - 1), "
         f"`{rep['sources']['vllm_stats']}`), and each client's mean over the server's.\n", *_header(tools)]
    for name, key in _MATCHED:
        base = rep["matched"]["ours"].get(key) if "ours" in rep["matched"] else None
        cells = [str(rep["matched"][t].get(key)) if key in ("n", "failed", "lost") else
                 fmt(rep["matched"][t].get(key)) + (_rel(rep["matched"][t].get(key), base) if t != "ours" else "")
                 for t in tools]
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    for m in ("ttft", "tpot"):
        sv = {t: rep["server"][t].get(f"{m}_mean") for t in tools}
        L.append(f"| server {m.upper()} mean, same requests | " + " | ".join(
            fmt(sv[t]) + (_rel(sv[t], sv.get("ours")) if t != "ours" else "") for t in tools) + " |")
        L.append(f"| client - server, {m.upper()} mean | " + " | ".join(
            fmt(sub(rep["matched"][t].get(f"{m}_mean"), sv[t])) for t in tools) + " |")
    L += ["", "The verdict compares what each client adds to the server's own mean for the same requests (client "
          "minus server, as a fraction of the server's mean: the server's speed, which other processes on these "
          "cores change from run to run, cancels); the plain difference of client means is shown with its bootstrap "
          "95% interval and its per-round values, which is what machine noise does to a naive comparison.\n"]
    for t, c in rep["comparison"].items():
        for m in ("ttft", "tpot"):
            x = c[m]
            if not x.get("available"):
                L.append(f"- {LABELS[t]} {m.upper()}: not available")
                continue
            raw, pa = x["raw"], x["paired"]
            line = f"- {LABELS[t]} vs ours, {m.upper()} mean: "
            if pa.get("available"):
                pr = ", ".join(f"{d:+.1%}" for d in pa["per_round_rel_diff"])
                line += (f"client - server {pa['gap_ms']:.1f} vs {pa['base_gap_ms']:.1f} ms: **{pa['rel_diff']:+.1%}** "
                         f"(per round: {pr}), {'within' if x['within_tolerance'] else 'OUTSIDE'} {tol:.0%}. ")
            pr = ", ".join(f"{d:+.1%}" for d in raw["per_round_rel_diff"])
            line += (f"Plain: {raw['mean']:.1f} vs {raw['base_mean']:.1f} ms, {raw['rel_diff']:+.1%} (95% CI "
                     f"{raw['ci95'][0]:+.1%} to {raw['ci95'][1]:+.1%}; per round: {pr})")
            if pa.get("available"):
                line += f", while the server itself was {pa['server_rel_diff']:+.1%} during its runs."
            L.append(line)
    return L + [""]


def _table3(rep: dict[str, Any]) -> list[str]:
    tools, cost, srv = rep["tools"], rep["cost"], rep["server"]
    L = ["## 3. The server's view and each client's cost\n",
         "vLLM's own histograms (`/metrics` scraped before and after each run, so each column holds only that "
         "tool's requests), and the CPU each client used. On a 2-core machine a client's CPU is taken from the "
         "server.\n", *_header(tools, "")]
    L += [f"| {name} | " + " | ".join(fmt(srv[t].get(key)) for t in tools) + " |" for name, key in _SERVER]
    L.append("| client TTFT mean - server TTFT mean (ms) | " + " | ".join(
        fmt(sub(rep["matched"][t].get("ttft_mean"), srv[t].get("ttft_mean"))) for t in tools) + " |")
    L.append("| prompt tokens per request (server count) | " + " | ".join(
        fmt(srv[t].get("prompt_tokens_per_request")) for t in tools) + " |")
    L.append("| prefix-cache hits (tokens) | " + " | ".join(fmt(srv[t].get("prefix_cache_hits"), ".0f")
                                                            for t in tools) + " |")
    L.append("| client CPU while requests were in flight (cores) | " + " | ".join(
        fmt(cost[t].get("cores_in_window"), ".2f") for t in tools) + " |")
    L.append(f"| client CPU in the first {rep['startup_s']:g} s of requests / after (cores) | " + " | ".join(
        f"{fmt(cost[t].get('cores_first_s'), '.2f')} / {fmt(cost[t].get('cores_after_first_s'), '.2f')}"
        for t in tools) + " |")
    L.append(f"| client TTFT mean, first {rep['first_k']} requests of a run / the rest (ms) | " + " | ".join(
        f"{fmt(srv[t].get('client_ttft_first_mean'))} / {fmt(srv[t].get('client_ttft_rest_mean'))}"
        for t in tools) + " |")
    L.append("| client CPU per request in flight (ms) | " + " | ".join(
        fmt(cost[t].get("cpu_in_window_per_request_ms")) for t in tools) + " |")
    L.append("| client CPU per run, start-up included (s) | " + " | ".join(
        fmt(cost[t].get("cpu_s_per_run")) for t in tools) + " |")
    L.append("| wall time per run (s) | " + " | ".join(fmt(cost[t].get("wall_s_per_run")) for t in tools) + " |")
    return L + [""]


def _calibration(rep: dict[str, Any]) -> list[str]:
    cal = rep.get("calibration")
    if not cal or not cal.get("rows"):
        return []
    tr = cal["truth"]
    L = ["### Against a server whose answers are known\n",
         f"helpers.bench's calibration server streams like vLLM 0.32 on a fixed schedule: first token "
         f"{tr['ttft_ms']:g} ms after receipt, then one token every {tr['tpot_ms']:g} ms, sent "
         f"{cal['config']['tokens_per_chunk']} tokens per chunk (as with speculative decoding or a busy API server), "
         f"and on chat a role-only chunk at once. {cal['num_requests']} requests of {cal['output_len']} tokens per "
         f"row; the server's own worst lateness against its schedule: {fmt(cal.get('server_lateness_max_ms'))} ms. "
         "Each tool's own numbers (ms), and our TTFT and TPOT on its records:\n",
         "| endpoint | tool | TTFT mean | TPOT mean | ITL mean | ITL p50 | ITL p99 | chunks per request | "
         "TTFT, TPOT (our definitions) |", "|---|---|---|---|---|---|---|---|---|",
         f"| (truth) | | {tr['ttft_ms']:g} | {tr['tpot_ms']:g} | {tr['itl_per_token_ms']:g} per token, "
         f"{tr['chunk_gap_ms']:g} per chunk | | | | |"]
    for r in cal["rows"]:
        L.append(f"| {r['endpoint']} | {LABELS[r['tool']]} | {fmt(r['ttft_mean'])} | {fmt(r['tpot_mean'])} | "
                 f"{fmt(r['itl_mean'])} | {fmt(r['itl_p50'])} | {fmt(r['itl_p99'])} | {fmt(r['chunks_per_request'])} | "
                 f"{fmt(r.get('matched_ttft_mean'))}, {fmt(r.get('matched_tpot_mean'))} |"
                 + (f" failed: {r['error']}" if not r["ok"] else ""))
    return L + [""]


def _runs(rep: dict[str, Any]) -> list[str]:
    root = settings.repo_root()
    L = ["## 6. Every run\n",
         "| round | tool | completed | failed | TTFT mean | TPOT mean | server TTFT mean | wall (s) | folder |",
         "|---|---|---|---|---|---|---|---|---|"]
    for run in rep["runs"]:
        m, where = run.matched, run.out_dir
        where = os.path.relpath(where, root) if root and where.startswith(str(root)) else where
        L.append(f"| {run.round + 1} | {LABELS[run.tool]} | {m['n']} | {m['failed']} | {fmt(m['ttft_mean'])} | "
                 f"{fmt(m['tpot_mean'])} | {fmt(run.server_mean('ttft'))} | {fmt(run.wall_s, '.0f')} | `{where}` |")
    L += ["", "Commands (round 1):\n"]
    for t in rep["tools"]:
        run = next((r for r in rep["runs"] if r.tool == t), None)
        if run:
            L.append(f"- {LABELS[t]}: `{run.command}`")
    return L + [""]


def _reproduce() -> str:
    # the package's docstring, read from its file (importing the package from here would be a circle)
    doc = ast.get_docstring(ast.parse(Path(__file__).with_name("__init__.py").read_text()))
    start = (doc or "").find("## How to run")
    return doc[start:].split("\n", 1)[1].strip("\n") if start >= 0 else (doc or "")


def render_markdown(rep: dict[str, Any]) -> str:
    """The whole report as Markdown (the provenance and charts are appended by :func:`write_report`)."""
    tools = rep["tools"]
    L = [f"# Side by side: {', '.join(LABELS[t] for t in tools)}\n",
         f"{rep['date']}; server {rep['target']['base_url']} serving `{rep['target']['model']}`; versions: "
         + ", ".join(f"{k} {v}" for k, v in rep["versions"].items() if v) + ".\n",
         f"Load: {rep['load_description']}; {rep['rounds']} rounds, each tool once per round in a rotated order; "
         f"{rep['elapsed_s'] / 60:.1f} min in all.\n"]
    L += [f"> **Note**: {n}\n" for n in rep["notes"]]
    L += [f"> **Failed run**: {f}\n" for f in rep["failed_runs"]]
    L += [f"> **Lost requests**: {f}\n" for f in rep.get("lost_records", [])]
    agree = f"**agree within {rep['tolerance']:.0%}**" if rep["passed"] else \
        f"**do NOT all agree within {rep['tolerance']:.0%}**"
    L.append(f"On the definitions they share (TTFT mean and TPOT mean, recomputed from each tool's per-request "
             f"records and divided by the server's own mean for the same requests), the tools {agree} with ours "
             "(table 2).\n")
    L += _table1(rep) + _table2(rep) + _table3(rep)
    L.append("## 4. Definitions, as read in each tool's source\n")
    for t in tools:
        L += [f"**{LABELS[t]}**\n", *[f"- {name}: {text.format(**rep['sources'])}" for name, text in DEFINITIONS[t]],
              ""]
    L += ["## 5. Where they differ and why\n", *differences(rep), ""]
    L += _calibration(rep) + _runs(rep)
    L += ["## 7. How to reproduce\n", _reproduce()]
    return "\n".join(L) + "\n"


def charts(rep: dict[str, Any]) -> dict[str, Any]:
    """Two charts: what each run's client added to the server's own mean (the verdict, run by run), and each
    tool's TTFT distribution."""
    import altair as alt
    import pandas as pd

    gaps = pd.DataFrame([{"tool": LABELS[r.tool], "round": r.round + 1, "metric": m.upper(),
                          "client - server (ms)": sub(r.matched[f"{m}_mean"], r.server_mean(m))}
                         for r in rep["runs"] if r.ok for m in ("ttft", "tpot")]).dropna()
    ttft = pd.DataFrame([{"tool": LABELS[r.tool], "TTFT (ms)": q.ttft_ms} for r in rep["runs"] if r.ok
                         for q in r.reqs if q.ok and q.ttft_ms is not None])
    out: dict[str, Any] = {}
    if not gaps.empty:
        out["Client mean minus server mean, each run"] = alt.Chart(gaps).mark_point(filled=True, size=80).encode(
            x=alt.X("client - server (ms):Q", scale=alt.Scale(zero=False)), y=alt.Y("tool:N", title=None),
            color="tool:N", shape="round:N", row=alt.Row("metric:N", title=None)).properties(width=480
        ).resolve_scale(x="independent")
    if not ttft.empty:
        out["TTFT distribution per tool"] = alt.Chart(ttft).transform_window(
            cdf="cume_dist()", sort=[{"field": "TTFT (ms)"}], groupby=["tool"]).mark_line(interpolate="step-after"
        ).encode(x="TTFT (ms):Q", y=alt.Y("cdf:Q", title="share of requests"), color="tool:N").properties(width=480)
    return out


def provenance_of(server: Any, target: Target) -> dict[str, Any]:
    """Where the numbers came from: versions, commit, device, model and (when started here) the server."""
    from helpers import provenance

    return provenance.provenance(model=None if server is not None else target.model_path, server=server)


def write_report(out: Path, rep: dict[str, Any], prov: dict[str, Any] | None) -> dict[str, Any]:
    """``report.md``, ``report.json``, ``report.html`` and the charts' PNGs in ``out``; returns their paths."""
    tools = ", ".join(LABELS[t] for t in rep["tools"])
    return artifacts.write(out, STEM, title=f"Side by side: {tools}", markdown=render_markdown(rep), data=rep,
                           basis="measured: each tool's records of the same requests in this run, the server's own "
                                 "record beside them (settings, versions and sources are named as they ran)",
                           charts=charts(rep), provenance=prov)
