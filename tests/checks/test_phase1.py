"""The check cells of labs 01-05 can fail: each lab's namespace builder and its doctored
measurements (how they are run: tests/checks/harness.py).
"""


from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from helpers import runtime, settings, sizing
from tests.checks.harness import (Doctor, SMOLLM2, check_cell, checks_for, lab, make_cpu_log, make_records,
                                  make_run, make_startup, set_value)


# ================================================================================================== lab 01
def _doctor_first_event(ns):
    ns["events"][0] = (ns["events"][0][0], "The", 1)


@lab("01",
     Doctor("answer does not name Paris", lambda ns: ns.update(answer="The capital of France is Lyon."),
            '"Paris" in answer'),
     Doctor("first stream event carries text", _doctor_first_event, "events[0][1] in (None"),
     Doctor("stream counted a token fewer than usage",
            lambda ns: setattr(ns["reply"].usage, "completion_tokens", 9), "streamed_tokens == reply.usage"),
     Doctor("first text after the last event", lambda ns: ns.update(first_content=ns["events"][-1][0] + 0.01),
            "0 < first_content < events[-1][0]"),
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
    info = make_startup(*make_cpu_log(1.06, 24576, "3.00"), block_size=128, num_blocks=192)
    kv_bytes_per_token = sizing.kv_bytes_per_token(sizing.load_config(SMOLLM2, dtype="float32"))  # 46,080
    # What the lab derives (its section 7), from the server's numbers:
    block_bytes = kv_bytes_per_token * info.block_size
    lo, hi = info.kv_gib_interval()
    blocks_range = (int(lo) // block_bytes, int(hi) // block_bytes)
    predicted_tokens = info.num_blocks * info.block_size
    predicted_concurrency = info.num_blocks / -(-info.concurrency_len // info.block_size)
    # The stream: a role-only event, one event per token (usage counted so far), the finish and usage events.
    pieces = ["The", " capital", " of", " France", " is", " Paris", "."]
    events = [(0.184, "", 0)] + [(0.185 + 0.06 * k, t, k + 1) for k, t in enumerate(pieces)]
    events += [(0.603, "", 8), (0.621, None, 8)]
    return dict(
        answer="The capital of France is Paris.",
        reply=SimpleNamespace(usage=SimpleNamespace(completion_tokens=8, prompt_tokens=42)),
        events=events, first_content=next(t for t, text, _ in events if text),
        streamed_tokens=[n for _, _, n in events if n is not None][-1],
        info=info, srv=SimpleNamespace(startup=info),
        models_list={"data": [{"id": "smollm2", "root": "llm-serving-labs/smollm2-135m-instruct",
                               "max_model_len": 8192}]},
        blocks_range=blocks_range, predicted_tokens=predicted_tokens, predicted_concurrency=predicted_concurrency)


# ================================================================================================== lab 02
PROMPT_LENGTHS_02 = [128, 256, 512, 1024]   # the cpu quick plan
BATCH_SIZES_02 = [1, 2, 4, 8]


def _lab02_tables(ttft_ms: list[float], tpot_ms: list[float]) -> dict[str, Any]:
    """Lab 02's sections 2-3 from the measured medians: the two tables and their fitted lines."""
    ttft = pd.DataFrame({"prompt tokens": PROMPT_LENGTHS_02, "TTFT p50 (ms)": ttft_ms, "failed": [0] * 4})
    prefill_fit = sizing.fit_line(zip(ttft["prompt tokens"], ttft["TTFT p50 (ms)"]))
    ttft["fit (ms)"] = [prefill_fit.predict(L) for L in PROMPT_LENGTHS_02]
    ttft["per-token part"] = prefill_fit.slope * ttft["prompt tokens"] / ttft["TTFT p50 (ms)"]
    step = pd.DataFrame({"batch": BATCH_SIZES_02, "TPOT p50 (ms)": tpot_ms, "failed": [0] * 4})
    decode_fit = sizing.fit_line(zip(step["batch"], step["TPOT p50 (ms)"]))
    step["decode tokens/s"] = step["batch"] * 1000 / step["TPOT p50 (ms)"]
    step["tokens/s vs batch 1"] = step["decode tokens/s"] / step["decode tokens/s"].iloc[0]
    return dict(ttft=ttft, step=step, prefill_fit=prefill_fit, decode_fit=decode_fit)


# Prefill medians of a real cpu run of lab 02 (2 EPYC cores; R2 0.985). Decode steps that barely grow with the batch,
# as the lab predicts: that run's own decode medians were noisy (see the "decode step shrinks" doctor).
TTFT_02 = [2463.3, 3080.0, 4564.8, 9219.5]
TPOT_02 = [393.2, 398.0, 405.1, 421.7]
#: A flat decode step measured with noise (float32 on this machine, lab 02's own output): its slope came out
#: slightly negative, -1.5 ms per sequence on 87.8, which a check of `0 <= slope` failed.
TPOT_02_FLAT = [81.6, 96.5, 72.7, 78.1]


@lab("02",
     Doctor("a prefill request failed", lambda ns: set_value(ns["ttft"], 1, "failed", 1), 'ttft["failed"].sum() == 0'),
     Doctor("a decode request failed", lambda ns: set_value(ns["step"], 3, "failed", 1), 'step["failed"].sum() == 0'),
     Doctor("TTFT at 512 tokens above TTFT at 1,024", lambda ns: set_value(ns["ttft"], 2, "TTFT p50 (ms)", 9300.0),
            "sorted(ttft["),
     Doctor("prefill not a line (R2 0.86)", lambda ns: ns.update(_lab02_tables([2463, 2600, 2700, 9219], TPOT_02)),
            "prefill_fit.r2 >= 0.95"),
     Doctor("fixed cost dominates TTFT at the longest prompt",
            lambda ns: ns.update(_lab02_tables([8000, 8200, 8600, 9400], TPOT_02)), 'ttft["per-token part"]'),
     # the decode steps of a real noisy 2-core run (lab 02's own output): the fitted line fell by 40% from batch 1 to 8
     Doctor("decode step shrinks with the batch", lambda ns: ns.update(_lab02_tables(TTFT_02, [393, 445, 245, 258])),
            "decode_fit.slope * (step"),
     Doctor("one more sequence costs a third of a step",
            lambda ns: ns.update(_lab02_tables(TTFT_02, [393, 520, 780, 1300])), "decode_fit.slope < 0.25"),
     # Implied by the fit assert whenever the line describes the points (slope < intercept/4 gives >= 2.67x at
     # batch 8): only the derived column can show it failing alone.
     Doctor("largest batch under 2x the tokens/s of batch 1",
            lambda ns: set_value(ns["step"], 3, "tokens/s vs batch 1", 1.9), 'step["tokens/s vs batch 1"]'),
     )
def lab_02(tmp: Path, tpot_ms: list[float] = TPOT_02) -> dict[str, Any]:
    return dict(_lab02_tables(TTFT_02, tpot_ms), PROMPT_LENGTHS=PROMPT_LENGTHS_02, BATCH_SIZES=BATCH_SIZES_02)


def test_lab02_check_passes_on_a_flat_decode_step_measured_with_noise(tmp_path):
    """Memory-bound decode is flat in the batch; measured with noise its fitted slope is negative half the time."""
    check_cell("02").run(lab_02(tmp_path, TPOT_02_FLAT))


# ================================================================================================== lab 03
def _lost_request(ns):
    ns["load"].summary.completed = 7


def _doctor_big_model(ns):
    big = ns["big"]
    big.loc[(big["model"] == "llama-3.1-8b") & (big["context"] == 131072), "KV / weights"] = 0.9


@lab("03",
     Doctor("by-hand bytes per token assumes bf16", lambda ns: ns.update(by_hand=ns["by_hand"] // 2),
            "per_token == by_hand"),
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
     Doctor("load held one block more than predicted", lambda ns: ns.update(measured_blocks=65),
            "measured_blocks == predicted_blocks"),
     # arithmetic on the shipped llama-3.1-8b config, not on this run: only a changed config can fail it
     Doctor("8B model's 128K cache under its weights", _doctor_big_model, 'big.query("model == @BIG_MODEL'),
     )
def lab_03(tmp: Path) -> dict[str, Any]:
    # Lab 03 on the cpu profile (quick plan): the logged 1.12 GiB pool, 204 blocks, 26,112 tokens, 3.19x; a load of
    # 8 requests x 8 blocks that held exactly 64 blocks.
    st = make_startup(*make_cpu_log(1.12, 26112, "3.19"), block_size=128, num_blocks=204)
    cfg = sizing.load_config(SMOLLM2, dtype=st.dtype)
    by_hand = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * sizing.dtype_bytes(cfg.dtype)
    per_token = sizing.kv_bytes_per_token(cfg)
    lo, hi = st.kv_gib_interval()
    blocks_range = [sizing.vllm_kv_capacity(cfg, b, st.block_size, st.max_model_len).num_blocks for b in (lo, hi)]
    pred = sizing.vllm_kv_capacity(cfg, st.num_blocks * st.block_size * per_token, st.block_size, st.max_model_len)
    load_requests = 8
    rows = []
    for name, c in [("llama-3.1-8b", sizing.load_config("llama-3.1-8b")), (cfg.name, cfg)]:
        w = sizing.weight_bytes(c).total
        for ctx in [4096, 32768, 131072]:
            rows.append({"model": name, "context": ctx, "weights GB": w / 1e9,
                         "KV GB, one sequence": sizing.kv_bytes_for_context(c, ctx) / 1e9,
                         "KV / weights": sizing.kv_bytes_for_context(c, ctx) / w})
    return dict(
        per_token=per_token, by_hand=by_hand, blocks_range=blocks_range, st=st, pred=pred,
        load=make_run(completed=load_requests, input_tokens={"total": 8 * 1016, "mean": 1016.0, "expected_mean": 1016.0,
                                                         "checked": 8, "mismatched": 0}),
        LOAD_REQUESTS=load_requests, measured_blocks=64, predicted_blocks=load_requests * 8,
        big=pd.DataFrame(rows), BIG_MODEL="llama-3.1-8b")


# ================================================================================================== lab 04
REAL_MODELS_04 = ["llama-3.1-8b", "qwen3-30b-a3b", "mistral-7b-v0.1", "gemma-2-9b-it", "gpt-oss-20b", "deepseek-v3"]
TINY_KV_BYTES_04 = 268435456  # the cpu plan's pool for every tiny server, set exactly


def _served(ns, design):
    return next(r for r in ns["results"] if r["design"] == design)


def _lab04_requests_table(context: int, budget_gib: int) -> pd.DataFrame:
    rows = []
    for name in REAL_MODELS_04:
        per_seq = sizing.kv_bytes_for_context(sizing.load_config(name), context)
        rows.append({"model": name, "MiB per request": per_seq / 2**20, f"requests in {budget_gib} GiB":
                     budget_gib * 2**30 // per_seq})
    return pd.DataFrame(rows)


@lab("04",
     Doctor("a design never came up", lambda ns: ns.update(results=ns["results"][:2]), "list(served) == list(DESIGNS)"),
     Doctor("vLLM's MHA line a block of tokens off", lambda ns: _served(ns, "tiny-mha").update(
         {"vLLM tokens": 32768 - 128}), 'r["predicted tokens"] == r["vLLM tokens"]'),
     Doctor("vLLM's GQA concurrency 0.01 off", lambda ns: _served(ns, "tiny-gqa").update(
         {"vLLM concurrency": 32.01}), 'abs(r["predicted concurrency"] - r["vLLM concurrency"])'),
     Doctor("the probe held a block more than predicted", lambda ns: _served(ns, "tiny-swa").update(
         {"measured blocks/request": 6}), 'r["lo"] <= r["measured blocks/request"] <= r["hi"]'),
     Doctor("the probe saw no plateau", lambda ns: _served(ns, "tiny-gqa").update(
         {"measured blocks/request": None}), 'r["measured blocks/request"] is not None'),
     # The next two are pinned by the per-design asserts above (held blocks in sizing's [lo, hi], MiB = blocks x pool /
     # num_blocks): with those passing, only the derived MiB column can show them failing (see the report).
     Doctor("sliding window held half of GQA's memory", lambda ns: _served(ns, "tiny-swa").update(
         {"measured MiB/request": _served(ns, "tiny-gqa")["measured MiB/request"] / 2}),
         'served["tiny-swa"]["measured MiB/request"] <'),
     Doctor("MHA held only 3x GQA's memory", lambda ns: _served(ns, "tiny-mha").update(
         {"measured MiB/request": 3 * _served(ns, "tiny-gqa")["measured MiB/request"]}), "3.6 < ratio < 4.4"),
     # arithmetic on the shipped deepseek-v3 config, not on this run
     Doctor("MLA saving computed as 64x", lambda ns: ns.update(mla_saving=64.0), "70 <= mla_saving <= 72"),
     )
def lab_04(tmp: Path) -> dict[str, Any]:
    # Lab 04 on the cpu profile: three tiny designs, each served with a 256 MiB pool (float32, 128-token blocks); one
    # 3,064-token request held 24, 24 and 5 blocks. Predictions from helpers.sizing as the lab makes them; vLLM's
    # lines as that run logged them.
    designs_served = ["tiny-gqa", "tiny-mha", "tiny-swa"]
    logged = {"tiny-gqa": (131072, 32.0, 1024, 24), "tiny-mha": (32768, 8.0, 256, 24),
              "tiny-swa": (199728, 48.76, 1024, 5)}  # tokens, concurrency, num_blocks, blocks the probe held
    results = []
    for name in designs_served:
        tiny = json.loads((settings.data_dir() / "tiny" / f"{name}.json").read_text())
        cfg = sizing.load_config(tiny, name=name, dtype="float32")
        pred = sizing.vllm_kv_capacity(cfg, TINY_KV_BYTES_04, 128, 4096, max_num_batched_tokens=2048,
                                       concurrent_batches=1)
        lo = sizing.workload_concurrency(cfg, TINY_KV_BYTES_04, 128, 3000, 1)
        hi = sizing.workload_concurrency(cfg, TINY_KV_BYTES_04, 128, 3000, 64)
        tokens, concurrency, num_blocks, held = logged[name]
        results.append({"design": name, "block size": 128, "groups": len(pred.groups),
                        "predicted tokens": pred.kv_cache_tokens, "vLLM tokens": tokens,
                        "predicted concurrency": round(pred.max_concurrency, 2), "vLLM concurrency": concurrency,
                        "lo": lo.blocks_per_request, "hi": hi.blocks_per_request, "measured blocks/request": held,
                        "measured MiB/request": held * TINY_KV_BYTES_04 / num_blocks / 2**20})
    ds = sizing.load_config("deepseek-v3")
    ds_text = json.loads((sizing.CONFIG_DIR / "deepseek-v3.json").read_text())
    mha_per_layer = ds_text["num_attention_heads"] * (
        ds_text["qk_nope_head_dim"] + ds_text["qk_rope_head_dim"] + ds_text["v_head_dim"]) * 2
    designs = _lab04_requests_table(32768, 40)
    return dict(results=results, DESIGNS=designs_served, table=pd.DataFrame(results),
                mla_saving=mha_per_layer / (sizing.kv_bytes_per_token(ds) // ds.layers),
                designs=designs, KV_BUDGET_GIB=40)


# ================================================================================================== lab 05
def _measure_sheet(sheet, *, skip: tuple[str, ...] = (), **measured: Any) -> None:
    """Fill the sheet as lab 05's section 3 does; ``measured`` overrides a row's (value, ci)."""
    p = {r.name: r.predicted for r in sheet.rows}
    step = p["decode_step_s"] * 1.04
    values = {
        "params_total": (p["params_total"], None), "checkpoint_bytes": (p["checkpoint_bytes"], None),
        "kv_bytes_per_token": (46080.0, None), "kv_bytes_per_request": (32 * 128 * 46080, None),
        "num_blocks": (204, None), "kv_cache_tokens": (26112, None), "max_concurrency": (3.19, None),
        "ttft_s": (p["ttft_s"] / 0.95, (p["ttft_s"] / 0.95 * 0.97, p["ttft_s"] / 0.95 * 1.04)),
        "decode_step_s": (step, (step * 0.95, step * 1.08)),
        "decode_tokens_per_s": (1 / step, (1 / (step * 1.08), 1 / (step * 0.95)))}
    values.update(measured)
    for name, (value, ci) in values.items():
        if name not in skip:
            sheet.measure(name, value, "test: a cpu run's measurement", ci=ci)


def _lab05_sheet(**kw):
    cfg = sizing.load_config(SMOLLM2, dtype="float32")
    sheet = sizing.predict_sheet(cfg, sizing.HARDWARE["cpu"], 4096, kv_cache_bytes=204 * 128 * 46080, block_size=128,
                                 max_model_len=8192, prompt_tokens=4080, model_name=cfg.name,
                                 checkpoint_dtype="bfloat16")
    _measure_sheet(sheet, **kw)
    return sheet


def _decode_step(factor: float, spread: float):
    def doctor(ns):
        pred = ns["sheet"]["decode_step_s"].predicted
        m = pred * factor
        ns["sheet"] = _lab05_sheet(decode_step_s=(m, (m * (1 - spread), m * (1 + spread))))
    return doctor


def _ttft(factor: float, spread: float):
    def doctor(ns):
        m = ns["sheet"]["ttft_s"].predicted * factor
        ns["sheet"] = _lab05_sheet(ttft_s=(m, (m * (1 - spread), m * (1 + spread))))
    return doctor


@lab("05",
     Doctor("a request failed", lambda ns: ns.update(failed=1), "failed == 0 and len(done[prompt])"),
     Doctor("one of the long requests is missing", lambda ns: ns["done"][ns["prompt"]].pop(),
            "failed == 0 and len(done[prompt])"),
     Doctor("TTFT 15% faster than predicted, tightly measured", _ttft(1 / 1.15, 0.02), "assert not misses"),
     Doctor("TTFT measured too loosely (CI +-20%)", _ttft(1.0, 0.2), "ttft_ci[1] / ttft_ci[0] < 1.35"),
     Doctor("decode 20% slower than predicted, tightly measured", _decode_step(1.2, 0.04), "assert not misses"),
     Doctor("decode measured too loosely (CI +-20%)", _decode_step(1.0, 0.2), "decode_ci[1] / decode_ci[0] < 1.35"),
     Doctor("TTFT row left unmeasured", lambda ns: ns.update(sheet=_lab05_sheet(skip=("ttft_s",))),
            '"decode_step_s"} <= measured_rows'),
     Doctor("vLLM made a block fewer than predicted", lambda ns: ns["sheet"].measure("num_blocks", 203),
            'sheet["kv_cache_tokens"].error == 0'),
     Doctor("decode beat the bandwidth ceiling", lambda ns: set_value(ns["roof"], 0, "fraction of ceiling", 1.2),
            'roof["fraction of ceiling"]'),
     Doctor("batch-1 decode used 30% of compute", lambda ns: set_value(ns["roof"], 0, "compute utilisation", 0.3),
            'roof["compute utilisation"]'),
     Doctor("the HTML sheet was not written", lambda ns: ns["paths"]["html"].unlink(), 'paths["html"].exists()'),
     )
def lab_05(tmp: Path) -> dict[str, Any]:
    # Lab 05 on the cpu profile (quick plan, 4,096-token context): the sheet predicted by helpers.sizing for smollm2
    # in float32 with the server's 204 x 128-token pool; measurements within a few % of it, decode with its 95% CI.
    sheet = _lab05_sheet()
    prompt, repeats = 4096 - 16, 3
    return dict(
        failed=0, done={L: make_records(repeats, rate=0.05, ttft_ms=ttft, tpot_ms=325.0, output_tokens=16, input_tokens=L)
                        for L, ttft in [(512, 3900.0), (1024, 8600.0), (2048, 18900.0), (prompt, 44200.0)]},
        prompt=prompt, REPEATS=repeats, sheet=sheet, TOLERANCE=0.10,
        roof=pd.DataFrame([{"batch": 1, "measured ms/step": 325.4, "ceiling ms/step": 31.64,
                            "fraction of ceiling": 31.64 / 325.4, "compute utilisation": 0.004},
                           {"batch": 16, "measured ms/step": 402.0, "ceiling ms/step": 94.01,
                            "fraction of ceiling": 94.01 / 402.0, "compute utilisation": 0.052}]),
        paths=sheet.write(tmp / "reports"))


test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert = checks_for('phase1')
