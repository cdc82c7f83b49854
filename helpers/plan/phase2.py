"""Plans of phase 2 (labs 06-11): paged attention, batching, chunked prefill, prefix caching, load tests, goodput."""

from __future__ import annotations

from typing import Any

from .. import runtime, sizing
from . import resources as res
from .core import fits_context, gpu, gpu_fit, long_enough, model_config, register

@register("06")
def _lab06(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    load_in, load_out = (256, 256) if quick else (384, 384)
    cfg = model_config(p)
    # The small pool: just over one max_model_len request, set explicitly so the same arithmetic holds anywhere.
    small = int(1.15 * sizing.kv_bytes_for_context(cfg, p.max_model_len))
    # The small server beside the big one: on a CPU both pools come out of RAM; on a card the big server holds its
    # whole share and the small one must find its own share free (vLLM 0.32 refuses it otherwise), so the lab stops
    # the big server while the small one runs and starts it again after.
    both = [res.server("big (memory knob)", p, p.max_model_len),
            res.server("small (set exactly)", p, p.max_model_len, kv_bytes=small)]
    beside = all(c["ok"] for c in res.servers_on_card(p, both)[1])
    return {"max_model_len": p.max_model_len, "max_request_tokens": load_in + load_out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"load_input": load_in, "load_output": load_out, "overload": 1.05,
                       "small_kv_bytes": small, "block_sizes": [16, 128], "parallel_n": 4,
                       "small_beside_big": beside},
            "rehearsal": {"load_output": 16, "overload": 0.25},
            "checks": [fits_context(load_in + load_out, p.max_model_len, "each request of the load"),
                       gpu_fit(p, p.utilization, p.max_model_len)]}


@register("07")
def _lab07(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    conc = ([1, 4, 16] if quick else [1, 2, 4, 8, 16, 32]) if not gpu(p) else \
        ([1, 16, 64] if quick else [1, 8, 32, 64, 128, 256])
    inp, out = 128, (48 if quick else 96)
    duration = 20.0 if quick else 45.0
    return {"max_model_len": p.max_model_len, "max_request_tokens": inp + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": duration,
            "values": {"concurrencies": conc, "input_len": inp, "output_len": out, "timeline_s": duration,
                       "max_num_seqs": 4, "capped_concurrency": 16 if not gpu(p) else 64,
                       # static vs continuous: batches of one long reply and short ones. The sample chat replies
                       # (24-128 tokens) gave a 10-15% gap on a CPU, whose step grows with the batch; runs here
                       # measured it at 0.84-0.98 and CI once at 1.08, static ahead.
                       "static_batch": 4 if not gpu(p) else 32, "static_batches": 4 if quick else 8,
                       "long_reply": 128 if quick else 256, "short_reply": 16 if quick else 32},
            "rehearsal": {"output_len": 4, "timeline_s": 2.0, "static_batches": 2, "long_reply": 16, "short_reply": 4},
            "checks": [fits_context(inp + out, p.max_model_len, "each request"),
                       long_enough(p, duration, inp, out, batch=4, what="the mid-flight timeline (a few requests in flight)")]}


@register("08")
def _lab08(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    default = int(p.engine_args.get("max_num_batched_tokens", 2048))
    # Quick: half the prompt (four chunks at the smallest budget, not eight). The lab spaces the prompts at twice
    # their prefill and runs the decoders until the last one, so the run's length follows the prompt's: on a 2-core
    # CPU a 1,843-token prompt waited 7.8 s for its first token and the lab took 6.6 minutes of CI.
    long_prompt = min(int((0.45 if quick else 0.9) * default), p.max_model_len - 64)
    budgets = [default, default // 8] if quick else [default, default // 4, default // 8]
    decoders = 4 if not gpu(p) else 32
    dec_out = 240 if quick else 480
    hol_long = min(long_prompt, 4 * budgets[-1])  # four chunks: the head-of-line wait is long, the run short
    return {"max_model_len": p.max_model_len, "max_request_tokens": max(long_prompt + 8, 64 + dec_out),
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"budgets": budgets, "long_prompt": long_prompt, "decoders": decoders, "decode_output": dec_out,
                       # the lab spaces the prompts at least twice its measured prefill apart, and lengthens the
                       # decoders to outlast them: these are floors
                       "long_prompts": 3 if quick else 6, "prompt_every_s": 2.5 if not gpu(p) else 0.5,
                       "lead_s": 1.0 if not gpu(p) else 0.2,
                       # section 5: a short prompt behind a long one at the smallest budget, the cap off and on;
                       # an odd number of pairs, so the median is one request's TTFT, not the mean of two
                       "hol": {"long": hol_long, "short": 64, "cap": budgets[-1] // 4, "pairs": 3 if quick else 5}},
            "rehearsal": {"decode_output": 48, "long_prompts": 2,
                          "hol": {"long": hol_long, "short": 64, "cap": budgets[-1] // 4, "pairs": 1}},
            "checks": [fits_context(long_prompt + 8, p.max_model_len, "a long prompt"),
                       {"claim": f"section 5's cap ({budgets[-1] // 4}) plus its short prompt (64) fit one step of the "
                                 f"smallest budget ({budgets[-1]}), and its long prompt ({hol_long}) needs several",
                        "ok": budgets[-1] // 4 + 64 <= budgets[-1] < hol_long},
                       {"claim": f"the long prompt ({long_prompt:,}) fits in one step at the default budget "
                                 f"({default:,}), so without chunking it stalls the decoders for a whole prefill",
                        "ok": long_prompt <= default}]}


@register("09")
def _lab09(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    # explicitly, on every device, and other than the CPU's default 128: 32, since vLLM's CPU attention takes only
    # multiples of 32 (measured: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])") and GPUs take 32 too
    block = 32
    system, suffix = 1024, 64
    return {"max_model_len": p.max_model_len, "max_request_tokens": system + suffix + 16,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0,
            "values": {"block_size": block, "requests": 8 if quick else 24, "system_prompt": system,
                       "suffix": suffix, "short_prefix": block - 4, "output": 16},
            "rehearsal": {"requests": 4, "output": 4},
            "checks": [fits_context(system + suffix + 16, p.max_model_len, "each request")]}


@register("10")
def _lab10(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    inp, out = (128, 32) if quick else (256, 64)
    duration = 12.0 if quick else 40.0
    return {"max_model_len": p.max_model_len, "max_request_tokens": max(inp + out, 1024 + 16),
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": duration,
            "values": {"input_len": inp, "output_len": out, "duration_s": duration, "load_fraction": 0.8,
                       "warm_requests": 6 if quick else 30, "client_cap": 2},
            "rehearsal": {"duration_s": 1.0, "warm_requests": 4, "output_len": 8},
            "checks": [fits_context(1024 + 16, p.max_model_len, "the warmup-pitfall prompts"),
                       long_enough(p, duration, inp, out, batch=16, what="each arrival run")]}


@register("11")
def _lab11(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    inp, out = (128, 32) if quick else (256, 64)
    # Full size on a CPU must finish inside a learner's 15 minutes: three server starts, a sweep that drains past
    # capacity and three searches. Measured on a 2-core CPU at 40 s sweeps, 30 s probes and 7 probes a search, the
    # sweep and one search alone took 11 minutes, so a CPU probes for 24 s (three predicted E2Es at batch 16, the
    # check below), 5 times; a GPU's rates are high enough that its probes' length is not the cost.
    probe_s = 12.0 if quick else (30.0 if gpu(p) else 24.0)
    return {"max_model_len": p.max_model_len, "max_request_tokens": inp + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": probe_s,
            "values": {"input_len": inp, "output_len": out, "saturation_concurrency": 16 if not gpu(p) else 256,
                       # the last rate well past capacity: a 10-s quick run's Poisson arrivals are
                       # ~20% noisy, and once came in at 1.2x capacity for 1.5x offered (tracking 0.79, check 0.77);
                       # and Little's law at saturation_concurrency in flight underestimates a server whose batch can
                       # grow further (AMX CPU: 11.1 req/s by Little's law, 16.6 served at 2x that offered)
                       "sweep_fractions": [0.25, 0.5, 0.9, 2.5],
                       "sweep_s": 10.0 if quick else (40.0 if gpu(p) else 30.0),
                       "probe_s": probe_s, "search_runs": 3 if quick else (7 if gpu(p) else 5),
                       "p99_ttft_target_ms": 1500 if not gpu(p) else 500, "tpot_slo_ms": 100 if not gpu(p) else 50,
                       "configs": {"default": {}, "chunked prefill tuned (max_num_batched_tokens=512)":
                                   {"max_num_batched_tokens": 512}, "max_num_seqs limited (8)": {"max_num_seqs": 8}}},
            "rehearsal": {"output_len": 8, "sweep_s": 1.0, "probe_s": 1.0, "search_runs": 2, "saturation_concurrency": 32},
            "checks": [fits_context(inp + out, p.max_model_len, "each request"),
                       long_enough(p, probe_s, inp, out, batch=16, what="each probe of the search")]}


