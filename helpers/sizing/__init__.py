"""Sizing: parameters, weight bytes, the KV cache, vLLM's own capacity accounting, and the roofline.

Pure functions over a Hugging Face ``config.json`` (a path, a checkpoint folder, a dict, or a shipped
name such as ``"llama-3.1-8b"`` from ``data/configs/``)::

    from helpers import sizing
    cfg = sizing.load_config("llama-3.1-8b")
    sizing.param_count(cfg).total                    # 8,030,261,248
    sizing.kv_bytes_per_token(cfg)                   # 131,072 bytes in bf16
    sizing.vllm_kv_capacity("default", 2**30, 128, 2048).log_line()
    # 'CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x'

From a shell: ``python -m helpers.sizing llama-3.1-8b --context 131072 [--json]``.
"""

from .calibrate import DecodeFit, LinearFit, PrefillFit, fit_decode, fit_line, fit_prefill, prefill_flops
from .config import CONFIG_DIR, ModelConfig, config_names, dtype_bytes, load_config, normalize_dtype
from .hardware import (HARDWARE, PRICE_ASSUMPTION, Hardware, compute_flops, hardware, measure, measure_cpu,
                       measure_gpu)
from .parallel import LINKS, Link, allreduce_time, fit_link, measure_allreduce, pp_bubble, tp_comm_per_step, transfer_time
from .kv import (
    prefix_hit_rate,
    KV_DTYPES,
    CacheTooSmall,
    KVCapacity,
    Concurrency,
    KVGroup,
    kv_bytes_for_context,
    kv_bytes_per_token,
    kv_cache_tokens,
    vllm_kv_capacity,
    workload_concurrency,
)
from .params import (
    WEIGHT_DTYPES,
    Params,
    Tensor,
    WeightBytes,
    param_count,
    resolved_weight_dtype,
    tensors,
    weight_bytes,
)
from .roofline import (
    CriticalBatch,
    StepTime,
    arithmetic_intensity,
    critical_batch,
    decode_step_time,
    expected_experts,
    prefill_time,
)
from .sheet import Prediction, SizingSheet, check_request, plan_sheet, predict_sheet

__all__ = [
    "CONFIG_DIR", "ModelConfig", "config_names", "dtype_bytes", "load_config", "normalize_dtype",
    "Tensor", "Params", "WeightBytes", "WEIGHT_DTYPES", "tensors", "param_count", "weight_bytes",
    "resolved_weight_dtype",
    "KV_DTYPES", "KVGroup", "KVCapacity", "CacheTooSmall", "Concurrency", "kv_bytes_per_token", "kv_bytes_for_context",
    "vllm_kv_capacity", "kv_cache_tokens", "workload_concurrency", "prefix_hit_rate",
    "Hardware", "HARDWARE", "PRICE_ASSUMPTION", "hardware", "measure", "measure_cpu", "measure_gpu", "compute_flops",
    "StepTime", "CriticalBatch", "prefill_time", "decode_step_time", "arithmetic_intensity", "critical_batch",
    "expected_experts",
    "Prediction", "SizingSheet", "check_request", "predict_sheet", "plan_sheet",
    "PrefillFit", "DecodeFit", "LinearFit", "fit_prefill", "fit_decode", "fit_line", "prefill_flops",
    "summary",
    "Link", "LINKS", "allreduce_time", "tp_comm_per_step", "pp_bubble", "transfer_time", "measure_allreduce",
    "fit_link",
]


def summary(src, context: int, kv_dtype: str = "auto", weight_dtype: str = "auto", tp: int = 1,
            group_size: int = 128) -> dict:
    """The headline numbers for one model at one context, as a dict (what the CLI prints).

    Keys: ``model``, ``params_total``, ``params_active``, ``weight_dtype``, ``weight_bytes``,
    ``kv_dtype``, ``kv_bytes_per_cached_token`` (what one token costs while the cache holds it: every layer, sliding
    windows included), ``kv_bytes_per_token_beyond_window`` (what each token past the longest window adds: the
    full-attention layers only; 0 for a model that windows every layer, as Mistral-7B-v0.1 does), ``context`` and
    ``kv_bytes_for_context`` (one sequence of ``context`` tokens, windows applied). ``group_size`` is
    for ``weight_dtype="int4"``.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = load_config(src)
    wd = normalize_dtype(weight_dtype)
    kd = normalize_dtype(kv_dtype)
    p = param_count(cfg)
    wb = weight_bytes(cfg, wd, group_size=group_size)
    return {
        "model": cfg.name,
        "params_total": p.total,
        "params_active": p.active,
        "weight_dtype": resolved_weight_dtype(cfg, wd),
        "weight_bytes": wb.total,
        "kv_dtype": cfg.dtype if kd == "auto" else kd,
        "kv_bytes_per_cached_token": kv_bytes_per_token(cfg, kd, tp=tp, include_sliding=True),
        "kv_bytes_per_token_beyond_window": kv_bytes_per_token(cfg, kd, tp=tp),
        "context": int(context),
        "kv_bytes_for_context": kv_bytes_for_context(cfg, context, kd, tp=tp),
        "layers": cfg.layers,
        "full_attention_layers": cfg.full_layers,
        "sliding_window_layers": cfg.sliding_layers,
        "sliding_window": cfg.sliding_window,
    }
