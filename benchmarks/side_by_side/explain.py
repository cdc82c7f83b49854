"""Why the tools' numbers differ: each tool's definitions as read in its source, and the report's section 5
("Where they differ and why"), written from the numbers of one report."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from helpers import settings

from .tools import LABELS, aiperf, guidellm, venvs

__all__ = ["DEFINITIONS", "source_paths", "differences", "fmt", "sub", "div"]


def fmt(v: Any, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return format(v, spec)


def sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def source_paths() -> dict[str, str]:
    """Where each definition below is written, in this machine's installed copies of the tools."""
    root = settings.repo_root()
    spec = importlib.util.find_spec("vllm")
    vllm_dir = Path(spec.origin).parent if spec and spec.origin else Path("vllm")
    gdir = (venvs.site_packages(guidellm.venv()) or guidellm.venv() / "lib/python3.X/site-packages") / "guidellm"
    adir = (venvs.site_packages(aiperf.venv()) or aiperf.venv() / "lib/python3.X/site-packages") / "aiperf"
    rel = lambda p: os.path.relpath(p, root) if root and str(p).startswith(str(root)) else str(p)  # noqa: E731
    return {
        "ours_records": "helpers/bench/records.py", "ours_client": "helpers/bench/client.py",
        "ours_stats": "helpers/bench/stats.py",
        "vllm_serve": rel(vllm_dir / "benchmarks" / "serve.py"),
        "vllm_request": rel(vllm_dir / "benchmarks" / "lib" / "endpoint_request_func.py"),
        "vllm_stats": rel(vllm_dir / "v1" / "metrics" / "stats.py"),
        "guidellm_stats": rel(gdir / "schemas" / "base" / "request_stats.py"),
        "guidellm_http": rel(gdir / "backends" / "openai" / "http.py"),
        "guidellm_handlers": rel(gdir / "backends" / "openai" / "request_handlers.py"),
        "guidellm_metrics": rel(gdir / "benchmark" / "schemas" / "metrics.py"),
        "aiperf_client": rel(adir / "transports" / "aiohttp_client.py"),
        "aiperf_metrics": rel(adir / "metrics" / "types"),
        "aiperf_records": rel(adir / "common" / "models" / "record_models.py"),
    }


DEFINITIONS = {
    "ours": [
        ("TTFT", "arrival of the first chunk whose cumulative `usage.completion_tokens` grew (never the role-only "
                 "chunk) minus the dispatch time, `perf_counter`, taken just before `session.post` "
                 "(`{ours_client}` `send`; `{ours_records}` `RequestResult.ttft_ms`)"),
        ("TPOT", "(E2E - TTFT) / (n - 1), n = the server's `usage.completion_tokens`; per request, then mean/p50 "
                 "over requests (`RequestResult.tpot_ms`)"),
        ("ITL", "one value per output token after the first: a chunk carrying k tokens after a gap g gives k "
                "values g/k (`{ours_records}` `itl_values`), pooled over requests; so mean ITL = mean TPOT "
                "whatever the chunking"),
        ("E2E", "last output-carrying chunk minus dispatch"),
        ("output throughput", "output tokens whose chunk arrived inside the steady-state window [first dispatch "
                              "+ median E2E, last dispatch], divided by its length (`{ours_stats}` "
                              "`steady_state_window`, `summarize`); the whole-span number is kept apart"),
    ],
    "vllm": [
        ("TTFT", "`perf_counter` at the first SSE event with a non-empty `choices` list (even if its text is "
                 "empty) minus `perf_counter` taken before `session.post(json=payload)`, so the JSON encoding is "
                 "inside the timed span (`{vllm_request}` `async_request_openai_completions`; for chat, "
                 "`async_request_openai_chat_completions` does the same, so the role-only chunk counts as the "
                 "first token)"),
        ("TPOT", "(latency - ttft) / (output_tokens - 1) per request, output_tokens from the final usage chunk; "
                 "mean/median over requests (`{vllm_serve}` `calculate_metrics`)"),
        ("ITL", "one value per chunk after the first (`output.itl.append(timestamp - most_recent_timestamp)`), "
                "pooled over requests, whatever the number of tokens in a chunk"),
        ("E2E", "`latency` = last event with `choices` minus send"),
        ("output throughput", "all output tokens / `benchmark_duration`, which runs from before the first "
                              "inter-arrival sleep (with `--burstiness inf` the first request waits 1/rate) to the "
                              "last completion (`{vllm_serve}` `benchmark`, `calculate_metrics`)"),
    ],
    "guidellm": [
        ("TTFT", "`time_to_first_token_ms` = `first_token_iteration - request_start`, `time.time()`; "
                 "`request_start` is re-stamped at httpx's first header write (`_trace_request_start`), "
                 "`first_token_iteration` at the first SSE line whose `text` is non-empty (`{guidellm_http}` "
                 "`_resolve_streaming`; `{guidellm_handlers}` `add_streaming_line`; `{guidellm_stats}`)"),
        ("TPOT", "`time_per_output_token_ms` = (last_token_iteration - request_start) / output_tokens: it "
                 "*includes* the first token's wait (`{guidellm_stats}`)"),
        ("ITL", "`inter_token_latency_ms` = (last_token_iteration - first_token_iteration) / (output_tokens - 1) "
                "per request, i.e. our TPOT; its distribution is over request averages, not over token gaps"),
        ("E2E", "`request_latency` = request_end - request_start, `request_end` taken after the stream has "
                "closed"),
        ("output throughput", "mean of `output_tokens_per_second`, a rate distribution over the benchmark's "
                              "window [first request start, last request end] (`{guidellm_metrics}`); its mean is "
                              "total output tokens / `duration`"),
    ],
    "aiperf": [
        ("TTFT", "`time_to_first_token` = the first response whose parsed data is non-empty "
                 "(`content_responses[0]`, so a role-only chat chunk with empty content does not count) minus "
                 "`start_perf_ns`, `perf_counter_ns`, re-stamped just before `session.request(...)` "
                 "(`{aiperf_client}`; `{aiperf_metrics}/ttft_metric.py`; `{aiperf_records}` `content_responses`)"),
        ("TPOT", "no metric of that name: its `inter_token_latency` = (request_latency - TTFT) / (output tokens - "
                 "tokens of the first chunk, 1 unless `--per-chunk-usage`), per request, i.e. our TPOT "
                 "(`{aiperf_metrics}/inter_token_latency_metric.py`)"),
        ("ITL", "`inter_token_latency` (above) is one average per request; the per-chunk gaps are "
                "`inter_chunk_latency`, one value per content chunk after the first, whatever the tokens in it "
                "(vLLM's rule; `{aiperf_metrics}/inter_chunk_latency_metric.py`)"),
        ("E2E", "`request_latency` = the last content response (usage-only chunks excluded) minus start: ours "
                "(`{aiperf_metrics}/request_latency_metric.py`)"),
        ("output throughput", "total output tokens / `benchmark_duration` = last response - first request "
                              "(`{aiperf_metrics}/output_token_throughput_metrics.py`, "
                              "`benchmark_duration_metric.py`): the whole span, ramp-up and drain included"),
    ],
}


def _cal_pair(rep: dict[str, Any], endpoint: str) -> tuple[dict, dict, dict] | None:
    """vLLM's and our calibration rows on ``endpoint`` and the calibration server's truth; ``None`` unless both ran."""
    cal = _cal_rows(rep)
    if (endpoint, "vllm") not in cal or (endpoint, "ours") not in cal:
        return None
    return cal[(endpoint, "vllm")], cal[(endpoint, "ours")], rep["calibration"]["truth"]


def _cal_rows(rep: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    cal = rep.get("calibration") or {}
    return {(r["endpoint"], r["tool"]): r for r in cal.get("rows", []) if r.get("ok")}


def _ttft(rep: dict[str, Any]) -> str:
    tools, m = rep["tools"], rep["matched"]
    parts = []
    for t in tools:
        c = rep["comparison"].get(t, {}).get("ttft", {})
        if c.get("available"):
            pa, raw = c["paired"], c["raw"]
            parts.append(f"{LABELS[t]}: {c['rel_diff']:+.1%} against the server's own TTFT, {raw['rel_diff']:+.1%} "
                         "plain" + (f" while the server's TTFT during its runs was {pa['server_rel_diff']:+.1%}"
                                    if pa.get("available") else ""))
    gap = {t: sub(m[t].get("ttft_mean"), rep["server"][t].get("ttft_mean")) for t in tools}
    return ("**TTFT.** All of them time the first chunk that carries output against their own send time, so on "
            "`/v1/completions` they measure the same thing. Compared with ours: " + ("; ".join(parts) or "-") + ". "
            "The client-minus-server gap (HTTP, JSON, the client's event loop; the server's clock starts when its "
            "front end has received the request) is " + ", ".join(f"{fmt(gap[t])} ms for {LABELS[t]}" for t in tools)
            + ". A plain difference between tools is mostly the server being slower or faster during one tool's "
            "runs (other processes on these 2 cores, or the client's own CPU taken from the server: see table 3), "
            "which is why the verdict compares the client-minus-server gaps, as a fraction of the server's own TTFT for "
            "the same requests.")


def _tpot(rep: dict[str, Any]) -> str:
    g = rep.get("guidellm_tpot_check")
    line = ("**TPOT.** Ours and vLLM's are the same formula, (E2E - TTFT) / (n - 1), with n the server's count; "
            "AIPerf computes it too but calls it ITL (`inter_token_latency`); table 2 compares them directly.")
    if g and g.get("guidellm_formula_on_our_records") is not None:
        rg = rep["reported"].get("guidellm", {})
        line += (f" GuideLLM's \"TPOT\" is (last token - start) / n, which includes the wait for the first token: "
                 f"it reports {fmt(rg.get('tpot_mean', {}).get('value'))} ms; the same formula on our records gives "
                 f"{fmt(g['guidellm_formula_on_our_records'])} ms against our TPOT of "
                 f"{fmt(g['our_tpot_on_our_records'])} ms. GuideLLM's \"ITL\" "
                 f"({fmt(rg.get('itl_mean', {}).get('value'))} ms) is what we and vLLM call TPOT. Its number "
                 "moves with TTFT and with the output length (a long prompt inflates it), so it is not a decode "
                 "speed; (E2E - TTFT) / (n - 1) is.")
    return line


def _itl(rep: dict[str, Any]) -> str:
    ch, m = rep["chunking"], rep["matched"]
    oc, vc = ch.get("ours", {}), ch.get("vllm", {})
    line = "**ITL.** "
    if oc:
        line += (f"Our records hold {oc['chunks']} output chunks for {oc['tokens']} tokens "
                 f"({fmt(oc['tokens_per_chunk'], '.3f')} tokens per chunk; {oc['multi_token_chunks']} chunks "
                 "carried more than one token). ")
    if vc:
        line += (f"vLLM's records: {vc['chunks']} chunks for {vc['tokens']} tokens "
                 f"({fmt(vc['tokens_per_chunk'], '.3f')} per chunk). ")
    if oc.get("itl_per_chunk") and oc.get("itl_per_token"):
        pc, pt = oc["itl_per_chunk"], oc["itl_per_token"]
        line += (f"On our records, vLLM's per-chunk rule gives ITL mean {fmt(pc['mean'])} ms over {pc['n']} "
                 f"values, ours gives {fmt(pt['mean'])} ms over {pt['n']} values (one per token after the first; "
                 f"equal to the TPOT mean, {fmt(m['ours'].get('tpot_mean'))} ms). ")
    line += ("The two rules agree only while every chunk carries one token. When the API server falls behind the "
             "engine, or with speculative decoding, a chunk carries several tokens: the per-chunk rule then "
             "counts one long gap where k tokens arrived, so its mean ITL exceeds TPOT and its p99 is inflated, "
             "while the per-token rule spreads the gap over the k tokens and keeps mean ITL = TPOT. ")
    pair = _cal_pair(rep, "completions")
    if pair:
        cv, co, tr = pair
        line += (f"Against the calibration server, which sends {rep['calibration']['config']['tokens_per_chunk']} "
                 f"tokens per chunk (truth: {tr['itl_per_token_ms']:g} ms per token, {tr['chunk_gap_ms']:g} ms "
                 f"between chunks), vLLM reports ITL mean {fmt(cv['itl_mean'])} ms and p50 {fmt(cv['itl_p50'])} ms, "
                 f"ours {fmt(co['itl_mean'])} and {fmt(co['itl_p50'])} ms; both get TPOT right "
                 f"({fmt(cv['tpot_mean'])} and {fmt(co['tpot_mean'])} ms). ")
    for t in ("guidellm", "aiperf"):
        r = rep["reported"].get(t)
        if r and oc.get("itl_per_token"):
            p99 = fmt(r.get("itl_p99", {}).get("value"))
            line += (f"{LABELS[t]}'s ITL is one average per request, so its p99 ({p99} ms) is the p99 of request "
                     f"averages, not of token gaps (ours: {fmt(oc['itl_per_token']['p99'])} ms; the p99 of our "
                     f"request averages: {fmt(oc['itl_request_means']['p99'])} ms): it hides the stalls a user sees. ")
    return line.rstrip()


def _role_chunk(rep: dict[str, Any]) -> str | None:
    p, src = rep.get("role_chunk"), rep["sources"]
    if not p or not p.get("n"):
        return None
    line = (f"**The role-only chunk (chat).** On `/v1/chat/completions` vLLM first sends `{{\"delta\": {{\"role\": "
            f"\"assistant\", \"content\": \"\"}}}}`. vLLM's chat client counts it as the first token "
            f"(`{src['vllm_request']}`: any chunk with `choices`); ours skips it (`completion_tokens` stays 0); "
            f"GuideLLM and AIPerf skip it (empty content). Measured here on {p['n']} chat streams, one at a time: the "
            f"role chunk arrived {fmt(p['gap_mean'], '.2f')} ms (max {fmt(p['gap_max'], '.2f')} ms) before the first "
            f"content chunk, in the same socket read {p['same_read']} of {p['n']} times. vLLM 0.32 emits it only "
            "once the first token exists, so here the TTFT error is small; a server that sends the role chunk on "
            "receipt (before prefill) makes a role-counting TTFT near zero, and the extra chunk adds one near-zero "
            "ITL value per request. This run uses `/v1/completions`, which has no role chunk, so all the tools "
            "time the same chunk.")
    pair = _cal_pair(rep, "chat")
    if pair:
        cv, co, tr = pair
        line += (f" The calibration server does send its role chunk at once: there vLLM's chat TTFT is "
                 f"{fmt(cv['ttft_mean'])} ms and ours {fmt(co['ttft_mean'])} ms, against a true {tr['ttft_ms']:g} ms; "
                 f"vLLM's chat TPOT becomes {fmt(cv['tpot_mean'])} ms against a true {tr['tpot_ms']:g} (the wait for "
                 f"the first token moves into its decode time) and its chat ITL mean {fmt(cv['itl_mean'])} ms (its "
                 "first gap is the whole wait for the first token).")
    return line


def _throughput(rep: dict[str, Any]) -> str:
    tp = rep["throughput"]
    line = (f"**Output throughput (windows).** The offered load is {tp['offered_tok_s']:g} output tokens/s "
            "(rate x output length); with nothing failing, the server's steady-state output rate must equal it. ")
    if "ours" in tp:
        line += (f"Ours counts tokens inside the steady-state window ({fmt(tp['ours'].get('window_s'))} s): "
                 f"{fmt(tp['ours'].get('reported'))} tok/s (whole span: {fmt(tp['ours'].get('whole_span'))}). ")
    if "vllm" in tp:
        line += (f"vLLM divides all tokens by its benchmark duration ({fmt(tp['vllm'].get('duration_s'))} s, which "
                 f"includes the first 1/rate sleep, the ramp-up and the drain): {fmt(tp['vllm'].get('reported'))} "
                 "tok/s. ")
    if "guidellm" in tp:
        line += (f"GuideLLM divides by [first request start, last request end] "
                 f"({fmt(tp['guidellm'].get('duration_s'))} s, ramp-up and drain included): "
                 f"{fmt(tp['guidellm'].get('reported'))} tok/s (its output tokens / its duration: "
                 f"{fmt(tp['guidellm'].get('tokens_over_duration'))}). ")
    if "aiperf" in tp:
        line += (f"AIPerf divides by [first request, last response] ({fmt(tp['aiperf'].get('duration_s'))} s): "
                 f"{fmt(tp['aiperf'].get('reported'))} tok/s. ")
    return line + ("Whole-span numbers are below the true rate by about E2E / (run length), so they depend on how "
                   "long the run was; the steady-state window does not.")


def _cost(rep: dict[str, Any]) -> str | None:
    tools, cost, sv = rep["tools"], rep["cost"], rep["server"]
    if not ({"guidellm", "aiperf"} & set(cost)):
        return None
    line = ("**Client cost.** While requests were in flight, the clients used "
            + ", ".join(f"{fmt(cost[t].get('cores_in_window'), '.2f')} cores ({LABELS[t]})" for t in tools)
            + f"; in the first {rep['startup_s']:g} s of a run: "
            + ", ".join(f"{fmt(cost[t].get('cores_first_s'), '.2f')}" for t in tools) + ". ")
    if "guidellm" in cost:
        line += (f"GuideLLM starts {rep['throughput'].get('guidellm', {}).get('worker_processes')} worker processes "
                 "by default and is still starting them while its first requests are in flight. ")
    if "aiperf" in cost:
        line += "AIPerf runs a dozen services (dataset, timing, workers, record processors) talking over ZMQ. "
    return line + ("On this 2-core machine every core-second a client burns is taken from the server it measures. "
                   f"The mean TTFT of the first {rep['first_k']} requests of a run against the rest: "
                   + ", ".join(f"{fmt(sv[t].get('client_ttft_first_mean'))} vs "
                               f"{fmt(sv[t].get('client_ttft_rest_mean'))} ms ({LABELS[t]})" for t in tools)
                   + ". A heavier client makes the server slower (its own TTFT histogram says so too), mostly early "
                   "in each run; that is not a different measurement, and against the server's own numbers the "
                   "comparison in table 2 takes it out.")


def differences(rep: dict[str, Any]) -> list[str]:
    """Section 5 of the report, one bullet per topic, each written from this report's numbers."""
    tools, srv = rep["tools"], rep["server"]
    out = [_ttft(rep), _tpot(rep), _itl(rep), _role_chunk(rep), _throughput(rep)]
    ec = rep.get("e2e_close") or {}
    if ec.get("guidellm") is not None:
        out.append(f"**E2E.** Ours, vLLM's and AIPerf's end at the last output chunk; GuideLLM's `request_latency` "
                   f"ends when the stream has closed, on average {fmt(ec['guidellm'], '.2f')} ms later on its records "
                   "(the final usage chunk and `[DONE]`), plus its later start stamp (first header write).")
    if rep.get("lost_records"):
        out.append("**Lost requests.** " + "; ".join(rep["lost_records"]) + ". A tool that ends its run while "
                   "requests are still in flight and writes no record of them (GuideLLM 0.8.1 can: its "
                   "`scheduler_state` then shows `processing_requests` > 0) reports fewer requests than it sent, "
                   "and its latencies miss the last, often slowest, ones; nothing in its summary says so.")
    out.append(_cost(rep))
    out.append("**Prompts.** Prompt tokens per request as the server counted them: "
               + ", ".join(f"{fmt(srv[t].get('prompt_tokens_per_request'))} ({LABELS[t]})" for t in tools)
               + "; prefix-cache hits: "
               + ", ".join(f"{fmt(srv[t].get('prefix_cache_hits'), '.0f')} ({LABELS[t]})" for t in tools) + ".")
    out.append("**Why ours is the reference.** It names things as the engine does (TTFT, TPOT = (E2E - TTFT)/(n - 1)); "
               "its ITL counts tokens, not chunks, so it does not change with how the server batches its stream; "
               "it never times the role chunk; and its throughput is a rate over the steady state, which matches "
               "the offered load instead of depending on the run's length.")
    return [f"- {x}" for x in out if x]
