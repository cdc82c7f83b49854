"""Plans of phase 1 (labs 01-05): one request, one server, the KV cache and the roofline."""

from __future__ import annotations

from typing import Any

from .. import runtime
from . import resources as res
from .core import fits_context, geometric, gpu, gpu_fit, register

@register("01")
def _lab01(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    max_tokens = 48
    return {"max_model_len": p.max_model_len, "max_request_tokens": 64 + max_tokens,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"max_tokens": max_tokens},
            "disk_bytes": res.disk(res.item(f"{p.model}: the model in the Hugging Face hub cache (every lab serves it)",
                                            res.checkpoint_bytes(p, "plain"), "the hub cache: every lab serves it",
                                            key=f"model:{p.model}")),
            "checks": [fits_context(64 + max_tokens, p.max_model_len, "the question and its answer"),
                       gpu_fit(p, p.utilization, p.max_model_len)]}


@register("02")
def _lab02(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    if gpu(p):
        top = min(p.max_model_len // 2, 8192 if quick else 16384)
        lengths = geometric(top, 4 if quick else 5, 4 if not quick else 2)
        batches = [1, 8, 32, 128] if quick else [1, 4, 16, 64, 128, 256]
    else:
        lengths = [128, 256, 512, 1024] if quick else [128, 256, 512, 1024, 2048, 4096]
        batches = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32]
    dec_in, dec_out = 64, (32 if quick else 64)
    return {"max_model_len": p.max_model_len, "max_request_tokens": max(lengths[-1] + 1, dec_in + dec_out),
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None,
            "min_run_s": 0.0,
            "values": {"prompt_lengths": lengths, "batch_sizes": batches, "decode_input": dec_in,
                       "decode_output": dec_out, "repeats": 3},
            "rehearsal": {"repeats": 1, "decode_output": 4},
            "checks": [fits_context(lengths[-1] + 1, p.max_model_len, "the longest prefill"),
                       gpu_fit(p, p.utilization, p.max_model_len),
                       {"claim": f"batches {batches} <= the profile's max_num_seqs",
                        "ok": batches[-1] <= int(p.engine_args.get("max_num_seqs", 256))}]}


@register("03")
def _lab03(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    tokens, requests, output = 1024, 8, 8
    return {"max_model_len": p.max_model_len, "max_request_tokens": tokens,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"load_tokens": tokens, "load_requests": requests, "load_output": output,
                       "contexts": [4096, 32768, 131072], "big_model": "llama-3.1-8b"},
            "checks": [fits_context(tokens, p.max_model_len, "each request of the known load"),
                       gpu_fit(p, p.utilization, tokens, requests)]}


@register("04")
def _lab04(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    designs = ["tiny-gqa", "tiny-mha", "tiny-swa"] if quick else \
        ["tiny-mha", "tiny-gqa", "tiny-swa", "tiny-interleaved", "tiny-mla"]
    max_len, probe, out = 4096, 3000, 64
    async_sched = gpu(p)  # vLLM forces it off on CPU; on a GPU it overlaps 2 batches (the default)
    return {"max_model_len": max_len, "max_request_tokens": probe + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"designs": designs, "tiny_max_len": max_len, "tiny_kv_bytes": 256 * 2**20,
                       "probe_prompt": probe, "probe_output": out, "max_num_batched_tokens": 2048,
                       "async_scheduling": async_sched, "concurrent_batches": 2 if async_sched else 1},
            "checks": [fits_context(probe + out, max_len, "the probe request")]}


@register("05")
def _lab05(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    context = min(p.sizing_context, p.max_model_len)
    if quick:
        context = min(context, 4096 if not gpu(p) else 32768)
    # Four lengths for three coefficients, the longest within 3/4 of the target's: on a CPU, three points fit
    # exactly and extrapolated 2x, one noisy point moved the predicted TTFT by 15% (make test measured 15.3 s
    # against 17.5 s predicted at 4,096 tokens from 512-2,048).
    # On a GPU five lengths from a sixteenth to three quarters of the target (four quick): three fixed lengths under
    # a T4's 8,192-token target left one (a fit of three coefficients on one point), an L4's 16,384 two, and an H100's
    # three fitted at 2-16K extrapolated 8x to 131,072.
    if gpu(p):
        calib = sorted({max(256, round(context * f / 256) * 256) for f in
                        ((1 / 8, 1 / 4, 1 / 2, 3 / 4) if quick else (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4))})
    else:
        calib = [c for c in (512, 1024, 2048, 3072) if c < context] or [context // 8, context // 4, context // 2]
    out = 16
    # Three repeats, quick or not: one request's TTFT moved by 3-5% between repeats here (the 4,080-token target
    # measured 7.31-8.26 s in five runs of this lab, the fit's error -6% to +6%), and the fit carries that to the
    # target. Counting attention per prefill chunk as a full square instead of causal pairs was tried and did no
    # better here (-8% to +3%).
    # Decode rounds: at least decode_rounds, then more while the target's ITL CI is wide. CI's shared runner once
    # measured 80-177 ms from five requests (one slow spell) where this machine measured 79-97 ms.
    return {"max_model_len": p.max_model_len, "max_request_tokens": context,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"context": context, "long_output": out, "calibration_lengths": calib,
                       "calibration_output": 16, "decode_rounds": 3 if quick else 8,
                       "decode_max_rounds": 8 if quick else 16, "repeats": 3,
                       "batch": 16 if not gpu(p) else 64},
            "rehearsal": {"context": min(context, 8192), "long_output": 4, "calibration_output": 4,
                          "calibration_lengths": [max(256, round(c * min(context, 8192) / context / 256) * 256)
                                                  for c in calib], "decode_rounds": 2,
                          "decode_max_rounds": 2, "repeats": 2},
            "checks": [fits_context(context, p.max_model_len, "the Sizing Sheet's long request"),
                       gpu_fit(p, p.utilization, context)]}


