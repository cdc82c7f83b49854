"""The capstone's plan (lab 24): the worked design from brief to bill."""

from __future__ import annotations

import math
from typing import Any

from .. import runtime, sizing
from . import resources as res
from .core import GPU_OVERHEAD_GIB, fits_context, fleet_model, geometric, gpu, gpu_fit, model_config, register
from .phase4 import _model_download

# ------------------------------------------------------------------------------------------ capstone
@register("24")
def _lab24(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    # The worked design's workload (1,500 shared + 2,000 unique tokens in, 400 out) kept on a GPU, scaled down on a
    # CPU so that a request takes about a second and a benchmark a few. The SLO is the lab's: the brief's headroom
    # over this device's measured single stream.
    if gpu(p):
        shared, unique, out = 1536, 2048, (128 if quick else 400)
        max_len = 8192
        cfg = model_config(p)
        room = p.utilization * p.gpu_memory_gib - sizing.weight_bytes(cfg).total / 2**30 - GPU_OVERHEAD_GIB
        fits = int(room * 2**30 // sizing.kv_bytes_for_context(cfg, shared + unique + out))
        top = 2 ** int(math.log2(max(1, min(fits, 32 if quick else 64))))  # the most requests the card holds
        # one request in flight always among them: the drafting misconception is measured there (and the "one
        # request" row reads it), whatever the card holds
        concurrencies = sorted({1, max(1, top // 8), max(1, top // 2), top}) if quick else \
            sorted({1} | {c for c in geometric(top, 5) if c >= 1})
        fault_concurrency = top
    else:
        shared, unique, out = (256, 64, 32) if quick else (512, 128, 64)
        concurrencies = [1, 4] if quick else [1, 2, 4, 8]
        fault_concurrency, max_len = 6, (1024 if quick else 2048)
    max_len = min(max_len, p.max_model_len)
    request = shared + unique + out
    # The planted fault: a KV pool just over one max_model_len request (lab 06's), so a few requests fill it.
    small_kv = int(1.15 * sizing.kv_bytes_for_context(model_config(p), max_len))
    small_tokens = int(1.15 * max_len)
    # Check question 3: steady decoders joined by long prompts on the design's server, whose token budget holds a whole
    # long prompt, so each prefill stalls every stream for one long step (lab 08's traffic). The lab paces it from two
    # measurements (bench.stall_pacing): the prompts 1.5 prefills apart, the decoders outlasting them. A stream then
    # stalls once per spacing x prefill / step tokens, so the prompt is kept short enough (half the context on a CPU,
    # where a 768-token prefill took 27 decode steps here) that the stalls are more than 1% of the gaps: the p99 the
    # doctor reads lands on them.
    budget = int(p.engine_args.get("max_num_batched_tokens", 2048))
    decoders = min(32, fault_concurrency) if gpu(p) else 4  # on a GPU, as many as the card holds (lab 08's 32 at most)
    stall = {"decoders": decoders, "long_prompts": 4, "spacing": 1.5, "lead_s": 0.2 if gpu(p) else 0.5,
             "long_prompt": min(budget - 2 * decoders, int((0.75 if gpu(p) else 0.5) * max_len)) // 16 * 16,
             "max_output": min(max_len - 72, 1024)}
    # Operate: the gateway's baseline replica and its canary run side by side, each at half the card on a GPU (the
    # design's server, at the profile's utilization, is stopped first); on a CPU each sizes its KV pool in RAM. Where
    # two copies of the profile's model do not share the card (an 8B on an L4), both serve the fleet labs' model.
    operate_util = round(p.utilization / 2, 2) if gpu(p) else None
    fp8_kv = {"kv_cache_dtype": "fp8"}
    ngram = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                    "prompt_lookup_min": 2}}
    model = fleet_model(p)
    operate = {**({"model": model} if model != p.model else {}),
               **({} if operate_util is None else {"gpu_memory_utilization": operate_util})}
    servers = [res.server(name, p, max_len, utilization=operate_util, model=model)
               for name in ("baseline replica", "canary replica")]
    return {"max_model_len": max_len, "max_request_tokens": request,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"shared_prefix": shared, "unique": unique, "output": out,
                       "concurrencies": concurrencies, "requests_per_slot": 2,
                       "fault_concurrency": fault_concurrency, "fault_requests": 2 * fault_concurrency,
                       "small_kv_bytes": small_kv, "safety": 1.3,
                       "brief_models": ["llama-3.1-70b"], "brief_cards": ["h100", "h200"],
                       # the SLO this device's run is judged by, set before the run (never from it): on a GPU the
                       # brief's own (an 8B model on one card has room where a 70B on H100s was designed to it); on
                       # a CPU one that a 2-core machine without native bf16 meets above one request in flight
                       # (measured: float32 on an AVX2 EPYC decodes ~70 ms per token alone; this AMX-less AVX-512
                       # machine, bf16: p99 TTFT 512 ms and TPOT 36 ms at 4 in flight)
                       "slo": {"ttft_p99_ms": 800.0, "tpot_p99_ms": 40.0} if gpu(p) else
                       {"ttft_p99_ms": 4000.0, "tpot_p99_ms": 250.0},
                       # Operate (lab 24's gateway): enough requests through it that nginx's weighted round-robin
                       # puts the canary's share within two points of the configured one (smooth WRR sends exactly one
                       # in five to a 4:1 canary, so 60 requests miss by at most one: 1.7 points), each short on a CPU
                       # (there the two replicas share two cores: 100 requests of 8 tokens took 67 s, measured); the
                       # candidate is the first of these this device serves (helpers.support decides)
                       "operate_engine": operate, "canary_percent": 20,
                       "gateway_requests": 200 if gpu(p) else 60, "gateway_output": out if gpu(p) else 4,
                       "gateway_concurrency": concurrencies[-1] if gpu(p) else 8,
                       "canary_candidates": [fp8_kv, ngram],
                       # two misconceptions measured on the design's engine with one change each, on its own load:
                       # drafting at one request and at the knee; the FP8 KV cache, and the same model's weights at
                       # the second precision lab 17 gated and priced on this device (its saved checkpoint), at the knee.
                       # The FP8 cache last: where servers are reused (make test), the operate section's canary, the
                       # first candidate, is that server, still parked
                       "variants": {"n-gram drafting": {"engine": ngram, "at": ["one request", "knee"]},
                                    "quantized weights": {"weights": "lab 17", "at": ["knee"]},
                                    "FP8 KV cache": {"engine": fp8_kv, "at": ["knee"]}},
                       "rate_limit": {"per_second": 5, "burst": 5}, "rate_probe_requests": 40, "stall": stall,
                       # the canary's drift from the baseline, on texts sampled from lab 15's drift set
                       "canary_drift_texts": 8 if quick else 40,
                       # the prompt-injection check on the baseline replica: code-explanation requests per condition
                       # (the injected comment, the same defended, a clean control) and the tokens of each reply
                       "injection_requests": 8 if quick else 32, "injection_tokens": 48},
            "rehearsal": {"output": 8, "requests_per_slot": 1, "fault_concurrency": min(fault_concurrency, 4),
                          "fault_requests": 2 * min(fault_concurrency, 4),
                          "gateway_requests": 20, "rate_probe_requests": 12, "canary_drift_texts": 4,
                          "injection_requests": 2, "injection_tokens": 16, "stall": dict(stall, long_prompts=2),
                          "gateway_output": min(out, 16) if gpu(p) else 8},
            "servers": servers, "disk_bytes": res.disk(*_model_download(p, model)),
            "tools": res.tools("PyYAML", "nginx"),
            "checks": [fits_context(request, max_len, "a request of the scaled workload"),
                       fits_context(stall["long_prompt"] + 8, max_len, "check question 3's long prompt"),
                       {"claim": f"check question 3's long prompt ({stall['long_prompt']:,}) and {decoders} decoding "
                                 f"streams fit one step of the design's budget ({budget:,}): the prefill stalls them",
                        "ok": stall["long_prompt"] + decoders <= budget},
                       {"claim": f"the planted small KV pool (~{small_tokens:,} tokens) holds fewer than "
                                 f"{fault_concurrency} requests of {request:,} tokens, so the fault shows",
                        "ok": small_tokens < fault_concurrency * request},
                       gpu_fit(p, p.utilization, request, max(concurrencies)),
                       gpu_fit(p, p.utilization, 64 + stall["max_output"], decoders + stall["long_prompts"])]}


