"""The check cells of labs 01-05 can fail: each lab's namespace builder and its doctored
measurements (how they are run: tests/checks/harness.py).
"""


from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from helpers import bench, plan, settings, sizing
from helpers.bench.records import RequestResult, Timings
from helpers.server.startup import StartupInfo
from tests.checks.harness import (Doctor, SMOLLM2, check_cell, checks_for, lab, make_cpu_log, make_dist, make_run,
                                  make_startup)


# ================================================================================================== lab 01
def _doctor_first_event(ns):
    ns["events"][0] = (ns["events"][0][0], "The", 1)


def _doctor_late_text(ns):
    """The first event with text arrives after the stream's last event (its timestamp doctored)."""
    events = ns["events"]
    k = next(i for i, (_, text, _) in enumerate(events) if text)
    events[k] = (events[-1][0] + 0.01, *events[k][1:])


@lab("01",
     Doctor("answer does not name Paris", lambda ns: ns.update(answer="The capital of France is Lyon."),
            '"Paris" in answer'),
     Doctor("first stream event carries text", _doctor_first_event, "events[0][1] in (None"),
     Doctor("stream counted a token fewer than usage",
            lambda ns: setattr(ns["reply"].usage, "completion_tokens", 9), "streamed_tokens == reply.usage"),
     Doctor("first text after the last event", _doctor_late_text, "0 < first_content < events[-1][0]"),
     Doctor("/v1/models reports another max_model_len",
            lambda ns: ns["models_list"]["data"][0].update(max_model_len=4096), "info.concurrency_len =="),
     Doctor("vLLM made more blocks than the logged pool holds", lambda ns: setattr(ns["info"], "num_blocks", 195),
            "blocks_range[0] <= info.num_blocks"),
     Doctor("KV cache line one block off", lambda ns: setattr(ns["info"], "kv_cache_tokens", 24576 + 128),
            "predicted_tokens == info.kv_cache_tokens"),
     Doctor("concurrency line 0.02 off", lambda ns: setattr(ns["info"], "max_concurrency", 3.02),
            "abs(predicted_concurrency - info.max_concurrency)"),
     # measured: the knob priced the log's rounded "0.91 GiB" at 165 blocks where vLLM had made 164
     )
def lab_01(tmp: Path) -> dict[str, Any]:
    # Lab 01 on the cpu profile: the logged 1.06 GiB pool, 192 blocks of 128 tokens, 24,576 tokens, 3.00x at 8,192.
    # Raw: the model's config.json, the server's startup, the stream's events; the lab's derive cells compute the
    # bytes per token, the first text's time, the streamed token count and the predicted blocks, tokens, concurrency.
    info = make_startup(*make_cpu_log(1.06, 24576, "3.00"), block_size=128, num_blocks=192)
    # The stream: a role-only event, one event per token (usage counted so far), the finish and usage events.
    pieces = ["The", " capital", " of", " France", " is", " Paris", "."]
    events = [(0.184, "", 0)] + [(0.185 + 0.06 * k, t, k + 1) for k, t in enumerate(pieces)]
    events += [(0.603, "", 8), (0.621, None, 8)]
    return dict(
        cfg=sizing.load_config(SMOLLM2).raw, PROFILE=SimpleNamespace(model=SMOLLM2, dtype="float32"),
        answer="The capital of France is Paris.",
        reply=SimpleNamespace(usage=SimpleNamespace(completion_tokens=8, prompt_tokens=42)),
        events=events, info=info, srv=SimpleNamespace(startup=info),
        models_list={"data": [{"id": "smollm2", "root": "llm-serving-labs/smollm2-135m-instruct",
                               "max_model_len": 8192}]})


# ================================================================================================== lab 02
PROMPT_LENGTHS_02 = [128, 256, 512, 1024]   # the cpu quick plan
BATCH_SIZES_02 = [1, 2, 4, 8]


def _lab02_runs(ttft_ms: list[float], tpot_ms: list[float]) -> dict[str, Any]:
    """Lab 02's raw measurements: one bench run per prompt length (its TTFT median) and per batch (its TPOT median).
    The lab's derive cells build the two tables and fit the two lines from them."""
    return dict(
        prefill_runs={L: make_run(completed=3, ttft_ms=make_dist(3, p50=t, min=0.97 * t, max=1.03 * t))
                      for L, t in zip(PROMPT_LENGTHS_02, ttft_ms)},
        decode_runs={B: make_run(completed=3 * B, tpot_ms=make_dist(3 * B, p50=t)) for B, t in zip(BATCH_SIZES_02, tpot_ms)})


def _medians02(ttft_ms: list[float] | None = None, tpot_ms: list[float] | None = None):
    """Doctor lab 02's measured medians (raw: the derive cells table and fit them)."""
    def doctor(ns):
        for runs, key, values in ((ns["prefill_runs"], "ttft_ms", ttft_ms), (ns["decode_runs"], "tpot_ms", tpot_ms)):
            for run, value in zip(runs.values(), values or ()):
                dist = getattr(run.summary, key)
                dist.p50, dist.min, dist.max = value, 0.97 * value, 1.03 * value
    return doctor


# Prefill medians of a real cpu run of lab 02 (2 EPYC cores; R2 0.985). Decode steps that barely grow with the batch,
# as the lab predicts: that run's own decode medians were noisy (see the "decode step shrinks" doctor).
TTFT_02 = [2463.3, 3080.0, 4564.8, 9219.5]
TPOT_02 = [393.2, 398.0, 405.1, 421.7]
#: A flat decode step measured with noise (float32 on this machine, lab 02's own output): its slope came out
#: slightly negative, -1.5 ms per sequence on 87.8, which a check of `0 <= slope` failed.
TPOT_02_FLAT = [81.6, 96.5, 72.7, 78.1]


@lab("02",
     Doctor("a prefill request failed", lambda ns: setattr(ns["prefill_runs"][256].summary, "failed", 1),
            'ttft["failed"].sum() == 0'),
     Doctor("a decode request failed", lambda ns: setattr(ns["decode_runs"][8].summary, "failed", 1),
            'step["failed"].sum() == 0'),
     Doctor("every TTFT at 512 tokens above every TTFT at 1,024", _medians02(ttft_ms=[2463, 3080, 9900, 9219]),
            "hi[j] < lo[i]"),
     # 2 EPYC cores, 128 vs 1,024 tokens: ranges of three repeats apart by more than 3x (TTFT_02)
     Doctor("the longest prompt's TTFT within the shortest's range", _medians02(ttft_ms=[2463, 2500, 2520, 2530]),
            "lo.iloc[-1] > hi.iloc[0]"),
     Doctor("prefill not a line (R2 0.86)", _medians02(ttft_ms=[2463, 2600, 2700, 9219]), "prefill_fit.r2 >= 0.95"),
     Doctor("fixed cost dominates TTFT at the longest prompt", _medians02(ttft_ms=[8000, 8200, 8600, 9400]),
            'ttft["per-token part"]'),
     # the decode steps of a real noisy 2-core run (lab 02's own output): the fitted line fell by 40% from batch 1 to 8
     Doctor("decode step shrinks with the batch", _medians02(tpot_ms=[393, 445, 245, 258]), "decode_fit.slope * (step"),
     Doctor("one more sequence costs a third of a step", _medians02(tpot_ms=[393, 520, 780, 1300]),
            "decode_fit.slope < 0.25"),
     # A fitted line that passes (slope 34 ms on 221 fixed) over a batch-1 step 4x faster than the rest: 8 x 100 / 440
     # = 1.8x. The fit assert implies this one whenever the line describes the points; only noise breaks it alone.
     Doctor("largest batch under 2x the tokens/s of batch 1", _medians02(tpot_ms=[100, 420, 430, 440]),
            'step["tokens/s vs batch 1"]'),
     bounds=("TTFT's order by prompt length is judged only between lengths whose three repeats do not overlap "
             "(each length's min and max, measured), and the longest must clear the shortest. The strict order of "
             "two-repeat medians failed the fresh-clone run of 2026-12-07 at two neighbouring lengths, where one "
             "doubling of a short prompt adds less than this 2-core machine's noise; no tolerance was widened.",
             "The decode line may fall by a fifth of a batch-1 step across the batches: a flat step measured with "
             "noise fell by 12% (TPOT_02_FLAT, lab 02's own output: -1.5 ms per sequence on 87.8 ms over batches "
             "1-8), a real fault (a step that shrinks with the batch, from a noisy run) by 40%. Each batch is now "
             "measured in three waves, which narrows the noise; the bound is unchanged.",),
     )
def lab_02(tmp: Path, tpot_ms: list[float] = TPOT_02) -> dict[str, Any]:
    # Raw: the bench runs' medians and failures; the lab's derive cells make the tables and the fitted lines.
    return dict(_lab02_runs(TTFT_02, tpot_ms), PROMPT_LENGTHS=PROMPT_LENGTHS_02, BATCH_SIZES=BATCH_SIZES_02, pd=pd,
                sizing=sizing)


def test_lab02_check_passes_on_a_flat_decode_step_measured_with_noise(tmp_path):
    """Memory-bound decode is flat in the batch; measured with noise its fitted slope is negative half the time."""
    check_cell("02").run(lab_02(tmp_path, TPOT_02_FLAT))


# ================================================================================================== lab 03
def _lost_request(ns):
    ns["load"].summary.completed = 7


def _usage_rows03(peak_blocks: int, num_blocks: int = 204) -> list[dict[str, float]]:
    """The /metrics samples of lab 03's load: the KV cache gauge (used / (num_blocks - 1), vLLM's null block aside)
    climbing to ``peak_blocks`` while the 8 requests run, then falling back."""
    held = [0, 8, 24, 48, peak_blocks, peak_blocks, peak_blocks, 40, 16, 0]
    running = [0, 1, 3, 6, 8, 8, 8, 5, 2, 0]
    return [{"t": 1000.0 + 0.1 * i, "vllm:kv_cache_usage_perc": b / (num_blocks - 1), "vllm:num_requests_running": r}
            for i, (b, r) in enumerate(zip(held, running))]


@lab("03",
     # the lab's hand formula against sizing's, both on the served config: no measurement can part them, only the
     # lab's arithmetic, edited after its derive cell ran
     Doctor("by-hand bytes per token assumes bf16", lambda ns: ns.update(by_hand=ns["by_hand"] // 2),
            "per_token == by_hand", after_derive=True),
     Doctor("vLLM made more blocks than the logged pool allows", lambda ns: setattr(ns["st"], "num_blocks", 206),
            "blocks_range[0] <= st.num_blocks"),
     Doctor("KV cache line a block short", lambda ns: setattr(ns["st"], "kv_cache_tokens", 26112 - 128),
            "pred.kv_cache_tokens == st.kv_cache_tokens"),
     Doctor("concurrency line 3.20x", lambda ns: setattr(ns["st"], "max_concurrency", 3.2),
            "round(pred.max_concurrency, 2)"),
     Doctor("a load request failed", lambda ns: setattr(ns["load"].summary, "failed", 1), "load.summary.failed == 0"),
     Doctor("a load request never completed", _lost_request, "load.summary.failed == 0"),
     Doctor("server counted a prompt differently", lambda ns: ns["load"].summary.input_tokens.update(mismatched=1),
            'load.summary.input_tokens["mismatched"]'),
     Doctor("load held one block more than predicted", lambda ns: setattr(ns["sampler"], "rows", _usage_rows03(65)),
            "measured_blocks == predicted_blocks"),
     )
def lab_03(tmp: Path) -> dict[str, Any]:
    # Lab 03 on the cpu profile (quick plan): the logged 1.12 GiB pool, 204 blocks, 26,112 tokens, 3.19x; a load of
    # 8 requests x 8 blocks whose KV cache gauge peaked at exactly 64 blocks.
    # Raw: the startup, the config as served, the load's bench run and its gauge samples; the lab's derive cells
    # compute the bytes per token (by hand and by sizing), the block range, the prediction, the load's blocks and the
    # big-model table.
    st = make_startup(*make_cpu_log(1.12, 26112, "3.19"), block_size=128, num_blocks=204)
    return dict(
        st=st, cfg=sizing.load_config(SMOLLM2, dtype=st.dtype), sizing=sizing, pd=pd, math=math,
        LOAD_REQUESTS=8, LOAD_TOKENS=1024, LOAD_OUTPUT=8, BIG_MODEL="llama-3.1-8b", CONTEXTS=[4096, 32768, 131072],
        load=make_run(completed=8, input_tokens={"total": 8 * 1016, "mean": 1016.0, "expected_mean": 1016.0,
                                                 "checked": 8, "mismatched": 0}),
        sampler=SimpleNamespace(rows=_usage_rows03(64)))


# ================================================================================================== lab 04
def _probe(design: str, **changes: Any):
    """Doctor one design's raw measurement: its startup's fields, or ``held`` (the blocks the probe saw)."""
    def doctor(ns):
        st, held = ns["probes"][design]
        held = changes.get("held", held)
        for k, v in changes.items():
            if k != "held":
                setattr(st, k, v)
        ns["probes"][design] = (st, held)
    return doctor


@lab("04",
     Doctor("a design never came up", lambda ns: ns["probes"].pop("tiny-swa"), "list(served) == list(DESIGNS)"),
     Doctor("vLLM's MHA line a block of tokens off", _probe("tiny-mha", kv_cache_tokens=32768 - 128),
            'r["predicted tokens"] == r["vLLM tokens"]'),
     Doctor("vLLM's GQA concurrency 0.01 off", _probe("tiny-gqa", max_concurrency=32.01),
            'abs(r["predicted concurrency"] - r["vLLM concurrency"])'),
     Doctor("the probe held a block more than predicted", _probe("tiny-swa", held=6),
            'r["lo"] <= r["measured blocks/request"] <= r["hi"]'),
     Doctor("the probe saw no plateau", _probe("tiny-gqa", held=None), 'r["measured blocks/request"] is not None'),
     # The next two: the blocks held are pinned by the per-design asserts above (sizing's [lo, hi] is one count
     # here), so what moves the memory a request held is the pool's block count (vllm:cache_config_info), which no
     # other assert reads: MiB per request = blocks held x pool / num_blocks.
     # tiny-swa's 256 MiB in 427 blocks: its 5 blocks hold 3.00 MiB, half of GQA's 24 x 256 / 1,024 = 6 MiB
     Doctor("sliding window held half of GQA's memory", _probe("tiny-swa", num_blocks=427),
            'served["tiny-swa"]["measured MiB/request"] <'),
     # tiny-gqa's 256 MiB in 768 blocks: its 24 blocks hold 8 MiB, a third of MHA's 24 MiB
     Doctor("MHA held only 3x GQA's memory", _probe("tiny-gqa", num_blocks=768), "3.6 < ratio < 4.4"),
     # two formulas over the shipped deepseek-v3 config, not this run: no measurement can change either, so the value
     # sizing's formula gave (in the lab's derive cell) is edited: a cache that also kept the no-RoPE key part
     Doctor("sizing's MLA cache disagrees with the latent + RoPE-key formula",
            lambda ns: ns.update(mla_per_layer=ns["mla_per_layer"] + 2 * 128), "mla_per_layer == mla_by_hand",
            after_derive=True),
     )
def lab_04(tmp: Path) -> dict[str, Any]:
    # Lab 04 on the cpu profile: three tiny designs, each served with a 256 MiB pool (float32, 128-token blocks); one
    # 3,064-token request held 24, 24 and 5 blocks. vLLM's lines as that run logged them, its pool exactly from
    # vllm:cache_config_info (the fields of Server.startup the lab reads). Raw: each design's startup and the blocks
    # its probe held; the lab's derive cells predict, tabulate and compute the MLA saving.
    lab_plan = plan.lab("04", "cpu", quick=True)
    logged = {"tiny-gqa": (131072, 32.0, 1024, 24), "tiny-mha": (32768, 8.0, 256, 24),
              "tiny-swa": (199728, 48.76, 1024, 5)}  # tokens, concurrency, num_blocks, blocks the probe held
    probes = {name: (StartupInfo(dtype="float32", block_size=128, kv_cache_bytes=lab_plan["tiny_kv_bytes"],
                                 num_blocks=blocks, kv_cache_tokens=tokens, max_concurrency=concurrency), held)
              for name, (tokens, concurrency, blocks, held) in logged.items()}
    tiny_cfgs = {name: json.loads((settings.data_dir() / "tiny" / f"{name}.json").read_text()) for name in logged}
    return dict(probes=probes, tiny_cfgs=tiny_cfgs, PLAN=lab_plan, DESIGNS=lab_plan["designs"],
                TINY_MAX_LEN=lab_plan["tiny_max_len"], PROBE_PROMPT=lab_plan["probe_prompt"],
                PROBE_OUTPUT=lab_plan["probe_output"], sizing=sizing, pd=pd, json=json)


# ================================================================================================== lab 05
# The cpu quick plan (4,096-token context): prefill calibrated on 512-3,072-token prompts, decode on 1,024-3,072-token
# contexts, then verified on the long requests (4,080 + 16 tokens). TTFTs and steps of that run's shape (float32 on 2
# EPYC cores: 3.9 s at 512 tokens, 44.2 s at 4,080, 325 ms a token at 4,096).
CONTEXT_05, LONG_OUTPUT_05, CALIBRATION_05, REPEATS_05 = 4096, 16, [512, 1024, 2048, 3072], 3
PROMPT_05 = CONTEXT_05 - LONG_OUTPUT_05
DECODE_LENGTHS_05 = [1024, 2048, 3072]
TTFT_05 = {512: 3900.0, 1024: 8600.0, 2048: 18900.0, 3072: 30600.0, PROMPT_05: 44200.0}   # ms, median of 3
TPOT_05 = {1024: 300.0, 2048: 310.0, 3072: 318.0, PROMPT_05: 325.0}                       # ms, median ITL
SPREAD_05 = [0.97, 1.0, 1.03]   # request to request


def _request05(i: int, input_tokens: int, output_tokens: int, ttft_ms: float, tpot_ms: float, t0: float):
    first = t0 + ttft_ms / 1e3
    chunks = [first + k * tpot_ms / 1e3 for k in range(output_tokens)]
    return RequestResult(
        id=f"r{i}", endpoint="completions", ok=True, http_status=200, finish_reason="length",
        timings=Timings(t_scheduled=t0, t_dispatched=t0, t_first_token=first, t_end=chunks[-1], t_done=chunks[-1],
                        chunk_times=chunks, chunk_tokens=[1] * output_tokens),
        input_tokens=input_tokens, expected_input_tokens=input_tokens, output_tokens=output_tokens,
        max_output_tokens=output_tokens, min_output_tokens=output_tokens)


def _long05(ttft_ms: list[float] | None = None, tpot_ms: list[float] | None = None):
    """Doctor the long requests (raw records): their TTFTs (the 3 of `done`), their steps (those 3, then the decode
    rounds' 3)."""
    def doctor(ns):
        done, rounds = ns["done"][PROMPT_05], ns["rounds"][PROMPT_05]
        ttfts = ttft_ms or [r.ttft_ms for r in done]
        steps = tpot_ms or [r.itl_ms[0] for r in done + rounds]
        ns["done"][PROMPT_05] = [_request05(k, PROMPT_05, LONG_OUTPUT_05, t, steps[k], 1000.0 + 100 * k)
                                 for k, t in enumerate(ttfts)]
        ns["rounds"][PROMPT_05] = [_request05(k, PROMPT_05, 16, r.ttft_ms, steps[len(done) + k], 5000.0 + 100 * k)
                                   for k, r in enumerate(rounds)]
    return doctor


def _usage_rows05(peak_blocks: int, num_blocks: int = 204) -> list[dict[str, float]]:
    """vllm:kv_cache_usage_perc sampled over the runs (used / (num_blocks - 1)), the long request's blocks at peak."""
    return [{"t": 1000.0 + 0.25 * i, "vllm:kv_cache_usage_perc": b / (num_blocks - 1)}
            for i, b in enumerate([0, 4, 8, 16, 24, 0, 32, peak_blocks, peak_blocks, 0])]


def _failed_request(ns):
    r = ns["done"][512][1]
    r.ok, r.http_status, r.error = False, 500, "HTTP 500: Internal Server Error"


def _unmeasure(ns, name: str) -> None:
    sheet = ns["sheet"]
    i = [r.name for r in sheet.rows].index(name)
    sheet.rows[i] = dataclasses.replace(sheet.rows[i], measured=None, measured_by="", measured_ci=None)


@lab("05",
     Doctor("a request failed", _failed_request, "failed == 0 and len(done[prompt])"),
     Doctor("one of the long requests is missing", lambda ns: ns["done"][PROMPT_05].pop(),
            "failed == 0 and len(done[prompt])"),
     # predicted from the calibration: 44.8 s; measured 39.0 s (+-2%)
     Doctor("TTFT 15% faster than predicted, tightly measured", _long05(ttft_ms=[38180.0, 38960.0, 39740.0]),
            "assert not misses"),
     Doctor("TTFT measured too loosely (CI +-20%)", _long05(ttft_ms=[35360.0, 44200.0, 53040.0]),
            "ttft_ci[1] / ttft_ci[0] < 1.35"),
     # predicted from the calibration: 327 ms a token; measured 393 ms (+-4%)
     Doctor("decode 20% slower than predicted, tightly measured",
            _long05(tpot_ms=[377.0, 393.0, 409.0, 377.0, 393.0, 409.0]), "assert not misses"),
     Doctor("decode measured too loosely (CI +-20%)", _long05(tpot_ms=[250.0, 280.0, 325.0, 325.0, 370.0, 400.0]),
            "decode_ci[1] / decode_ci[0] < 1.35"),
     # the derive cell measures every row from the raw measurements, whatever they are: only a row the lab's code
     # left unmeasured (edited after it ran) can fail this
     Doctor("TTFT row left unmeasured", lambda ns: _unmeasure(ns, "ttft_s"), '"decode_step_s"} <= measured_rows',
            after_derive=True),
     # was "vLLM made a block fewer than predicted": the sheet predicts num_blocks from the pool st.num_blocks makes,
     # so no measured block count can differ from it; the KV cache line (the log's tokens) can
     Doctor("vLLM's KV cache line a block short of its blocks",
            lambda ns: setattr(ns["st"], "kv_cache_tokens", 26112 - 128), 'sheet["kv_cache_tokens"].error == 0'),
     # the roofline's batch-1 ceiling on this hardware: 32.3 ms
     Doctor("decode beat the bandwidth ceiling",
            lambda ns: setattr(ns["runs"][1].summary.tpot_ms, "p50", 26.9), 'roof["fraction of ceiling"]'),
     # a matmul probe that measured 1/32 of this CPU's FLOP/s: batch-1 decode (0.5 FLOPs a byte) turns compute-bound,
     # and its 325 ms step uses 30% of that peak (the sheet's time rows are fitted, so they still agree)
     Doctor("batch-1 decode used 30% of compute",
            lambda ns: ns.update(hw=dataclasses.replace(ns["hw"], fp32_flops=ns["hw"].fp32_flops / 32)),
            'roof["compute utilisation"]'),
     # the startup's pool line logged 1.06 GiB where its 204 blocks need 1.12: the blocks exceed what the log says
     Doctor("vLLM made more blocks than its logged pool holds",
            lambda ns: ns.update(st=make_startup(*make_cpu_log(1.06, 26112, "3.19"), block_size=128, num_blocks=204)),
            "blocks_logged[0] <= st.num_blocks"),
     Doctor("the HTML sheet was not written", lambda ns: ns["paths"]["html"].unlink(), 'paths["html"].exists()'),
     bounds=("Every measured row within 10% (the Sizing Sheet's promise), allowing the measurement's 95% interval "
             "(`Prediction.agrees`), and TTFT's and decode's intervals narrower than 1.35x (high over low), so that "
             "the 10% claim is tested at all (decode adds rounds until its interval is under 1.25x). Recorded: TTFT "
             "at the 4,080-token target 7.31-8.26 s in five runs here, the fit's error -6% to +6% (the plan's "
             "comment); the fresh-clone run of 2026-12-07 (second session) +1.3% (interval 7.47-8.43 s, 1.13x) and "
             "decode -6.9% (1.18x). Issue 40's stricter rule (the point error within 10% with a half-width under "
             "5%) is not built.",),
     )
def lab_05(tmp: Path) -> dict[str, Any]:
    # Lab 05 on the cpu profile (quick plan) in float32 with the server's 204 x 128-token pool, on sizing's nominal
    # 2-core CPU. Raw: the roofline probe's two bench runs, every request's record (the calibration, the long requests,
    # the decode rounds), the KV gauge's samples, the checkpoint's tensor count and bytes, the startup; the lab's derive
    # cells compute the roofline table, the medians and CIs, the fits, the Sizing Sheet and its measured rows.
    lengths = CALIBRATION_05 + [PROMPT_05]
    dlens = sorted(set(DECODE_LENGTHS_05) | {PROMPT_05})
    done = {L: [_request05(k, L, LONG_OUTPUT_05 if L == PROMPT_05 else 16, TTFT_05[L] * f, TPOT_05.get(L, 300.0) * f,
                           1000.0 + 100 * k) for k, f in enumerate(SPREAD_05)] for L in lengths}
    rounds = {L: [_request05(k, L, 16, 500.0, TPOT_05[L] * f, 5000.0 + 100 * k) for k, f in enumerate(SPREAD_05)]
              for L in dlens}   # round 0's prompt per length: its prefill cached
    paths = {kind: tmp / "reports" / f"sizing_sheet.{kind}" for kind in ("md", "json", "html")}
    for path in paths.values():   # what the lab's sheet.write made (the check reads only that the files exist)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("Sizing Sheet: smollm2-135m-instruct")
    return dict(
        hw=sizing.HARDWARE["cpu"], PROFILE=SimpleNamespace(device="cpu", dtype="float32"),
        st=make_startup(*make_cpu_log(1.12, 26112, "3.19"), block_size=128, num_blocks=204),
        cfg=sizing.load_config(SMOLLM2, dtype="float32"), checkpoint=sizing.load_config(SMOLLM2),
        CONTEXT=CONTEXT_05, LONG_OUTPUT=LONG_OUTPUT_05, CALIBRATION_LENGTHS=CALIBRATION_05,
        DECODE_LENGTHS=DECODE_LENGTHS_05, CALIBRATION_OUTPUT=16, REPEATS=REPEATS_05, BATCH=16, DECODE_ROUNDS=3,
        DECODE_MAX_ROUNDS=8, TOLERANCE=0.10,
        runs={1: make_run(completed=1, tpot_ms=make_dist(1, p50=325.4)),
              16: make_run(completed=16, tpot_ms=make_dist(16, p50=402.0))},
        prompt=PROMPT_05, lengths=lengths, dlens=dlens, done=done, rounds=rounds,
        sampler=SimpleNamespace(rows=_usage_rows05(32)),
        tensors=134515008, disk=269030016,   # the checkpoint's safetensors: elements and tensor bytes (bfloat16)
        paths=paths, bench=bench, sizing=sizing, pd=pd, math=math)


test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert = checks_for('phase1')
