"""Plans of phase 3 (labs 12-17): quantization, the accuracy gate, speculative decoding and cost."""

from __future__ import annotations

from typing import Any

from .. import runtime
from .core import fits_context, gpu, gpu_fit, hardware, long_enough, register

# ------------------------------------------------------------------------------------ phase 3 (labs 12-14)
# A configuration is ``{"recipe": name}`` (built by helpers.quant, served through quant.servable: dequantized where
# this device has no kernel), ``{"fake": format, ...options}`` (a fake-quantized checkpoint: the format's accuracy on
# any device) or ``{"engine": {...}}`` (engine arguments on the profile's own checkpoint).
def _drift_texts(quick: bool) -> int | None:
    return 16 if quick else None  # None: all 40 shipped drift texts


@register("12")
def _lab12(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    if gpu(p) and hardware(p).fp8_flops:  # FP8 tensor cores (Ada, Hopper, Blackwell): vLLM quantizes at load
        weights = {"FP8 weights (vLLM --quantization fp8)": {"engine": {"quantization": "fp8"}}}
    else:  # no FP8 compute: the format's accuracy through fake quantization
        weights = {"FP8 E4M3 weights (fake-quantized)": {"fake": "fp8_e4m3"},
                   "FP8 E5M2 weights (fake-quantized)": {"fake": "fp8_e5m2"}}
    return {"max_model_len": p.max_model_len, "max_request_tokens": 512,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"weights": weights, "kv_cache_dtype": "fp8", "drift_texts": _drift_texts(quick),
                       "sample_layers": 3, "sample_weights": 2**18 if quick else 2**20,
                       "greedy_prompts": 4 if quick else 8, "greedy_tokens": 32},
            "checks": [gpu_fit(p, p.utilization, p.max_model_len)]}


@register("13")
def _lab13(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    if gpu(p):  # llm-compressor's own checkpoints: served natively on Blackwell, dequantized elsewhere
        formats = {"NVFP4": {"recipe": "nvfp4" if hardware(p).fp4_flops else "nvfp4a16"},
                   "MXFP4": {"recipe": "mxfp4" if hardware(p).fp4_flops else "mxfp4a16"}}
    else:
        formats = {"NVFP4": {"fake": "nvfp4"}, "MXFP4": {"fake": "mxfp4"}}
    return {"max_model_len": p.max_model_len, "max_request_tokens": 512,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"formats": formats, "block_sizes": [8, 16, 32, 64, 128], "scale_formats": ["fp32", "e4m3", "e8m0"],
                       "sample_layers": 2 if quick else 4, "sample_weights": 2**18 if quick else 2**20,
                       "drift_texts": _drift_texts(quick)},
            "checks": [gpu_fit(p, p.utilization, p.max_model_len)]}


@register("14")
def _lab14(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    # GPTQ over all 30 layers of SmolLM2 took 18 minutes on a 2-core AVX2 CPU (16 samples): the CPU compares the
    # 4-bit algorithms on the first 3 decoder layers (both quantize the same layers; the rest stays as it is).
    first = {"first_layers": 3} if not gpu(p) else {}
    configs = {"W8A8 INT8 (round to nearest)": {"recipe": "w8a8-rtn"},
               "INT8 weights only (W8A8's weights, dequantized)": {"recipe": "w8a8-rtn", "dequantize": True},
               "W4A16 GPTQ, group 64": {"recipe": "w4a16-gptq-g64", **first},
               "W4A16 round to nearest, group 64": {"recipe": "w4a16-rtn-g64", **first}}
    if not quick:
        configs.update({"W8A8 INT8 (SmoothQuant + GPTQ)": {"recipe": "w8a8-sq-gptq"},
                        "W4A16 GPTQ without act-order, group 64": {"recipe": "w4a16-gptq-noact-g64", **first},
                        "INT4 round to nearest, per channel": {"fake": "int4", "granularity": "channel", **first}})
    return {"max_model_len": p.max_model_len, "max_request_tokens": 128 + 64,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"configs": configs, "awq": {"recipe": "w4a16-awq-g64", **first},
                       "calibration_samples": 16 if not gpu(p) else 128, "drift_texts": _drift_texts(quick),
                       "speed_input": 128, "speed_output": 32 if quick else 64, "speed_requests": 3 if quick else 8},
            "checks": [fits_context(128 + 64, p.max_model_len, "a speed probe"),
                       gpu_fit(p, p.utilization, p.max_model_len)]}


# ------------------------------------------------------------------------------------ phase 3 (labs 15-17)
def _quant_candidates(p: runtime.Profile, quick: bool) -> dict[str, dict[str, Any]]:
    """Configurations of labs 12-14 that lab 15 gates and lab 17 prices: ``recipe`` (a ``helpers.quant`` recipe,
    served through ``quant.servable``), ``fake`` (a fake-quantized bf16 checkpoint), or ``engine`` (engine arguments
    on the profile's own checkpoint). FP8 compute needs FP8 tensor cores; NVFP4/MXFP4 needs FP4 ones (Blackwell)."""
    hw = hardware(p)
    out: dict[str, dict[str, Any]] = {}
    if gpu(p) and hw.fp8_flops:
        out["FP8 dynamic (W8A8)"] = {"recipe": "fp8-dynamic"}
    else:
        out["INT8 W8A8 (round to nearest)"] = {"recipe": "w8a8-rtn"}
    # The worked example: 4-bit MXFP4 weights (32-element blocks, power-of-two scales) — the task average barely
    # moves on a CI-sized task set; drift reads thousands of positions.
    out["MXFP4 weights (fake-quantized)"] = {"fake": "mxfp4"}
    if not quick:
        out["INT4 weights, group 64 (fake-quantized)"] = {"fake": "int4", "granularity": "group", "group_size": 64}
        out["W4A16 GPTQ, group 64"] = {"recipe": "w4a16-gptq-g64"}
        out["FP8 KV cache"] = {"engine": {"kv_cache_dtype": "fp8"}}
        if gpu(p) and hw.fp4_flops:
            out["NVFP4 (W4A4)"] = {"recipe": "nvfp4"}
    return out


def _spec_configs(p: runtime.Profile, k: int) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Speculative configurations a profile serves, and those it cannot (with why)."""
    served = {f"n-gram, k={k}": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                                  "prompt_lookup_min": 2}}
    not_served = {"MTP (multi-token prediction heads)":
                  f"{p.model} was not trained with MTP layers; MTP needs a model that ships them (DeepSeek-V3/R1, "
                  "GLM-4.5, Qwen3-Next, MiMo): {'method': 'mtp', 'num_speculative_tokens': 1}"}
    if gpu(p) and "llama-3.1-8b" in p.model.lower():
        served["EAGLE-3, k=3"] = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                  "num_speculative_tokens": 3}
    else:
        not_served["EAGLE-3"] = (f"no EAGLE-3 draft head is published for {p.model}, and on a CPU a draft "
                                 "model's forward passes cost as much as the target's")
    return served, not_served


@register("15")
def _lab15(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    if gpu(p):
        top = min(p.max_model_len, 131072) - 256
        lengths = [2048, min(8192, top)] if quick else [4096, min(16384, top), top]
    else:
        lengths = [512, 2048] if quick else [512, 2048, 4096]
    return {"max_model_len": p.max_model_len, "max_request_tokens": lengths[-1] + 64,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"candidates": _quant_candidates(p, quick), "limit": 8 if quick else None,
                       "lengths": lengths, "haystacks": 1 if quick else 2, "drift_texts": 16 if quick else None,
                       "gate": {"max_task_drop": 0.05, "max_kl": 0.05, "min_top1": 0.90, "max_long_drop": 0.25}},
            "checks": [fits_context(lengths[-1] + 64, p.max_model_len, "the longest haystack and its question"),
                       gpu_fit(p, p.utilization, lengths[-1] + 64)]}


@register("16")
def _lab16(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    k = 3
    served, not_served = _spec_configs(p, k)
    out = 64 if quick else 128
    conc = ([1, 32] if quick else [1, 8, 32, 64]) if gpu(p) else ([1, 8] if quick else [1, 4, 16])
    return {"max_model_len": p.max_model_len, "max_request_tokens": 256 + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"k": k, "speculative": served, "not_served": not_served, "output_len": out,
                       "requests_at_1": 3 if quick else 8, "concurrency": conc,
                       "temperature": {"copy": 0.0, "open": 0.8}},
            "checks": [fits_context(256 + out, p.max_model_len, "a prompt and its answer"),
                       gpu_fit(p, p.utilization, 256 + out, conc[-1])]}


@register("17")
def _lab17(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    k = 3
    served, _ = _spec_configs(p, k)
    quant = next(iter(_quant_candidates(p, True).items()))  # the first candidate: the format this device runs fast
    # A probe's window judges the requests dispatched after the first median E2E: at 4 req/s a 12 s probe left 33,
    # too few to show 90% (35), so it was rerun at twice the length; 16 s leaves about 50.
    out, probe_s = (32, 16.0) if quick else (64, 30.0)
    # CPU, measured on a 2-core machine (bf16, 128 in / 32 out): TPOT p90 50 ms at 1-2 req/s, 70-150 ms at 4, and at
    # 8 req/s a median of 190-430 ms with 5.4-6.9 req/s served (past saturation). An SLO of TTFT 5 s and TPOT 500 ms
    # let every configuration pass a 12 s probe at 8 req/s, overloaded: the searches ended unbracketed and compared
    # where they stopped. TTFT 2 s and TPOT 200 ms put the limits at 3.5-7 req/s here (bracketed), with room for a CPU
    # at half this speed (float32 without AVX512-BF16: TPOT ~70 ms alone).
    slo = {"ttft_ms": 2000, "tpot_ms": 200} if not gpu(p) else {"ttft_ms": 500, "tpot_ms": 40}
    return {"max_model_len": p.max_model_len, "max_request_tokens": 256 + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": probe_s,
            "values": {"input_len": 128 if quick else 256, "output_len": out, "probe_s": probe_s,
                       # Enough probes to double past the limit and bisect once (from half the capacity: 0.5x,
                       # 1x, 2x, then between); the later configurations start at the baseline's rate.
                       "search_runs": (4 if quick else 6) + (1 if gpu(p) else 0), "slo": slo,
                       # The baseline's search starts at half the capacity measured on its own server (requests
                       # completed per second with 16 in flight, 64 on a GPU), not at a fixed rate: CPUs differ by
                       # 5x (AVX2 float32 to AMX bf16) and a fixed start of 2 req/s left an AMX machine's four probes
                       # (2, 4, 8, 16 req/s) all passing, unbracketed. From half the capacity, the second probe
                       # is at the capacity and the third at twice it, past any SLO.
                       "attainment": 0.9, "start_rate": None, "start_fraction": 0.5,
                       "capacity_concurrency": 16 if not gpu(p) else 64, "capacity_s": probe_s,
                       "quantized": {"name": quant[0], **quant[1]},
                       "speculative": {"name": next(iter(served)), **next(iter(served.values()))},
                       "device": p.hardware, "compare_devices": ["h200", "b200"],
                       "compare_model": "llama-3.1-8b", "compare_context": 2048},
            "checks": [fits_context(256 + out, p.max_model_len, "a prompt and its answer"),
                       gpu_fit(p, p.utilization, 256 + out, 64),
                       long_enough(p, probe_s, 256, out, batch=8, what="each probe of the search"),
                       long_enough(p, probe_s, 128 if quick else 256, out, batch=16 if not gpu(p) else 64,
                                    what="the baseline's capacity run")]}


