"""The roofline for one step of a model: FLOPs and bytes, and which of the two limits the time.

A step takes at least ``flops / peak_flops`` (compute) and at least ``bytes / bandwidth`` (memory);
the estimate is the larger. Decode reads every weight once per step whatever the batch, so it is
memory-bound until the batch is large enough; prefill of a long prompt is compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .config import FULL, ModelConfig, load_config, normalize_dtype
from .hardware import Hardware, compute_flops
from .kv import kv_bytes_for_context
from .params import resolved_weight_dtype, tensors, weight_bytes

__all__ = ["StepTime", "CriticalBatch", "prefill_time", "decode_step_time", "arithmetic_intensity", "critical_batch",
           "expected_experts"]

_MATMUL_COMPONENTS = ("attention", "mlp", "experts", "shared_experts", "router", "other")


@dataclass(frozen=True)
class StepTime:
    """One prefill or decode step on one device, with its working.

    ``flops`` over ``flops_per_s`` gives ``t_compute``; ``weight_bytes + kv_bytes`` over
    ``bandwidth`` gives ``t_memory``; ``time`` is the larger and ``bound`` names it. Peak rates are
    already multiplied by the efficiency asked for.

    Introduced in lab 05 (Where the Time Goes).
    """

    phase: str
    hardware: str
    batch: int
    new_tokens: int
    context: int
    flops: float
    weight_bytes: int
    kv_bytes: int
    compute_dtype: str
    flops_per_s: float
    bandwidth: float

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def t_compute(self) -> float:
        return self.flops / self.flops_per_s

    @property
    def t_memory(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def time(self) -> float:
        return max(self.t_compute, self.t_memory)

    @property
    def bound(self) -> str:
        return "compute" if self.t_compute >= self.t_memory else "memory"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved in this step."""
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second (decode: the batch's combined output rate)."""
        return self.new_tokens / self.time

    def explain(self) -> str:
        """The working, in a few lines."""
        return "\n".join([
            f"{self.phase} on {self.hardware}: batch {self.batch}, {self.new_tokens:,} new tokens, "
            f"context {self.context:,}",
            f"  compute: {self.flops:.3e} FLOP / {self.flops_per_s:.3e} FLOP/s ({self.compute_dtype})"
            f" = {self.t_compute * 1e3:.3f} ms",
            f"  memory:  ({self.weight_bytes:,} weight + {self.kv_bytes:,} KV) B / {self.bandwidth:.3e} B/s"
            f" = {self.t_memory * 1e3:.3f} ms",
            f"  -> {self.time * 1e3:.3f} ms, {self.bound}-bound (intensity {self.intensity:.1f} FLOP/B)",
        ])


def expected_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens touch in one MoE layer, routing uniformly:
    ``E * (1 - (1 - k/E) ** tokens)``. One token: k; many tokens: all E.

    Introduced in lab 05 (Where the Time Goes).
    """
    if n_experts <= 0:
        return 0.0
    return n_experts * (1 - (1 - top_k / n_experts) ** max(0, tokens))


def _matmul_params(cfg: ModelConfig) -> int:
    """Parameters each token multiplies through, LM head excluded (it runs once per logits row)."""
    return sum(t.active_params for t in tensors(cfg) if t.kind == "linear" and t.component in _MATMUL_COMPONENTS)


def _attn_dims(cfg: ModelConfig, phase: str) -> tuple[int, int]:
    """(query-key width, value width) per head that attention multiplies against each cached token."""
    if cfg.is_mla:
        lora, rope = int(cfg.kv_lora_rank or 0), int(cfg.qk_rope_head_dim or 0)
        if phase == "decode":  # weight-absorbed MLA attends in the latent space
            return lora + rope, lora
        return cfg.head_dim, cfg.v_head_dim
    return cfg.head_dim, cfg.v_head_dim


def _sum_keys(start: int, n: int, window: int | None) -> int:
    """Sum over query positions start+1 .. start+n of the keys each attends: min(position, window)."""
    def prefix(m: int) -> int:  # sum_{j=1..m} min(j, w)
        if window is None or m <= window:
            return m * (m + 1) // 2
        return window * (window + 1) // 2 + (m - window) * window
    return prefix(start + n) - prefix(start)


def _attention_flops(cfg: ModelConfig, phase: str, start: int, n: int) -> float:
    """FLOPs of QK^T and AV for ``n`` query tokens after ``start`` cached ones, summed over layers."""
    qk, v = _attn_dims(cfg, phase)
    per_key = 2 * cfg.heads * (qk + v)
    keys = sum(_sum_keys(start, n, None if t == FULL else cfg.sliding_window) for t in cfg.layer_types)
    return float(per_key * keys)


def _weights_read(cfg: ModelConfig, weight_dtype: str, tokens: int) -> int:
    wb = weight_bytes(cfg, weight_dtype, strict=False)
    if not cfg.is_moe:
        return wb.total
    touched = expected_experts(cfg.n_routed_experts, cfg.experts_per_token, tokens) / cfg.n_routed_experts
    return int(wb.total - wb.routed_expert_bytes + wb.routed_expert_bytes * touched)


def _decode_work(cfg: ModelConfig, batch: int, context: int, weight_dtype: str, kv_dtype: str
                 ) -> tuple[float, int, int]:
    flops = batch * (2.0 * _matmul_params(cfg) + 2.0 * cfg.vocab * cfg.hidden
                     + _attention_flops(cfg, "decode", context, 1))
    return flops, _weights_read(cfg, weight_dtype, batch), batch * kv_bytes_for_context(cfg, context, kv_dtype)


def _rates(hw: Hardware, weight_dtype: str, compute_dtype: str | None, efficiency: float) -> tuple[str, float, float]:
    if not 0 < efficiency <= 1:
        raise ValueError("efficiency is a fraction of the peak, in (0, 1]")
    if compute_dtype is None:
        cd, peak = compute_flops(hw, weight_dtype)
    else:
        cd, peak = compute_dtype, hw.flops_for(compute_dtype)
    return cd, peak * efficiency, hw.memory_bandwidth * efficiency


def _weight_dtype(weight_dtype: str) -> str:
    return normalize_dtype(weight_dtype)  # may stay "auto": weight_bytes knows what the checkpoint ships


def prefill_time(cfg: "ModelConfig | Mapping[str, Any] | str", hw: Hardware, tokens: int, *, batch: int = 1,
                 cached: int = 0, weight_dtype: str = "auto", kv_dtype: str = "auto", compute_dtype: str | None = None,
                 efficiency: float = 1.0) -> StepTime:
    """Roofline time to prefill ``batch`` prompts of ``tokens`` tokens each.

    ``cached`` tokens may already sit in the cache before them (a prefix-cache hit).

    FLOPs: ``2 * active_matmul_params * tokens`` (MoE: top-k experts) + attention (QK^T and AV over
    the causal triangle, windows applied) + the LM head for the last position of each prompt. Bytes:
    the weights once (MoE: the experts these tokens touch) + the KV cache written and the cached KV
    read. ``efficiency`` = 1.0 is the ideal ceiling; real kernels reach perhaps 0.4-0.7 of peak FLOP/s.

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    wd = _weight_dtype(weight_dtype)
    cd, fps, bw = _rates(hw, resolved_weight_dtype(cfg, wd), compute_dtype, efficiency)
    flops = batch * (2.0 * _matmul_params(cfg) * tokens + _attention_flops(cfg, "prefill", cached, tokens)
                     + 2.0 * cfg.vocab * cfg.hidden)
    kv = batch * kv_bytes_for_context(cfg, cached + tokens, kv_dtype)
    return StepTime(phase="prefill", hardware=hw.name, batch=batch, new_tokens=batch * tokens, context=cached + tokens,
                    flops=flops, weight_bytes=_weights_read(cfg, wd, batch * tokens), kv_bytes=kv,
                    compute_dtype=cd, flops_per_s=fps, bandwidth=bw)


def decode_step_time(cfg: "ModelConfig | Mapping[str, Any] | str", hw: Hardware, batch: int, context: int,
                     weight_dtype: str = "auto", kv_dtype: str = "auto", *, compute_dtype: str | None = None,
                     efficiency: float = 1.0) -> StepTime:
    """Roofline time of ONE decode step: ``batch`` sequences each add a token to ``context`` cached ones.

    Bytes read = the weights (once for the whole batch; MoE: the experts the batch touches) + ``batch``
    x the KV cache of ``context`` tokens (windows applied). FLOPs = ``batch`` x (2 x active matmul
    params + LM head + attention over ``context`` keys; MLA in its absorbed latent form). Step time is
    the larger of bytes/bandwidth and FLOPs/(FLOP/s).

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    if batch < 1:
        raise ValueError("batch must be >= 1")
    wd = _weight_dtype(weight_dtype)
    cd, fps, bw = _rates(hw, resolved_weight_dtype(cfg, wd), compute_dtype, efficiency)
    flops, wbytes, kvbytes = _decode_work(cfg, batch, context, wd, kv_dtype)
    return StepTime(phase="decode", hardware=hw.name, batch=batch, new_tokens=batch, context=context, flops=flops,
                    weight_bytes=wbytes, kv_bytes=kvbytes, compute_dtype=cd, flops_per_s=fps, bandwidth=bw)


def arithmetic_intensity(cfg: "ModelConfig | Mapping[str, Any] | str", batch: int, context: int,
                         weight_dtype: str = "auto", kv_dtype: str = "auto") -> float:
    """FLOPs per byte of one decode step (compare with :meth:`Hardware.ridge_point`).

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    flops, w, kv = _decode_work(cfg, batch, context, _weight_dtype(weight_dtype), kv_dtype)
    return flops / (w + kv)


@dataclass(frozen=True)
class CriticalBatch:
    """The smallest decode batch at which a step turns compute-bound, or ``None`` if none does.

    ``ridge`` is the hardware's FLOPs per byte; ``intensity_limit`` the decode intensity as the batch
    grows without bound (per-sequence FLOPs over per-sequence KV bytes): if it stays below the ridge,
    KV reads grow as fast as FLOPs and decode never becomes compute-bound at this context.

    Introduced in lab 05 (Where the Time Goes).
    """

    batch: int | None
    context: int
    ridge: float
    intensity_at_1: float
    intensity_limit: float
    compute_dtype: str

    def explain(self) -> str:
        if self.batch is None:
            return (f"never compute-bound at context {self.context:,}: intensity tends to {self.intensity_limit:.1f} "
                    f"FLOP/B, below the ridge of {self.ridge:.1f} FLOP/B")
        return (f"compute-bound from batch {self.batch:,} at context {self.context:,} (ridge {self.ridge:.1f} FLOP/B; "
                f"batch 1 runs at {self.intensity_at_1:.2f} FLOP/B)")


def critical_batch(cfg: "ModelConfig | Mapping[str, Any] | str", hw: Hardware, context: int,
                   weight_dtype: str = "auto", kv_dtype: str = "auto", *, compute_dtype: str | None = None,
                   max_batch: int = 1 << 20) -> CriticalBatch:
    """The batch at which decode turns compute-bound on ``hw`` at ``context`` tokens per sequence.

    Found by search over :func:`decode_step_time` (MoE weight reads are not linear in the batch).

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    wd = _weight_dtype(weight_dtype)
    cd, _, _ = _rates(hw, resolved_weight_dtype(cfg, wd), compute_dtype, 1.0)
    ridge = hw.flops_for(cd) / hw.memory_bandwidth

    def compute_bound(b: int) -> bool:
        s = decode_step_time(cfg, hw, b, context, wd, kv_dtype, compute_dtype=cd)
        return s.t_compute >= s.t_memory

    f1, w1, kv1 = _decode_work(cfg, 1, context, wd, kv_dtype)
    limit = f1 / kv1 if kv1 else float("inf")
    common = dict(context=context, ridge=ridge, intensity_at_1=f1 / (w1 + kv1), intensity_limit=limit,
                  compute_dtype=cd)
    if limit <= ridge:
        return CriticalBatch(batch=None, **common)  # intensity only approaches the limit from below
    hi = 1
    while not compute_bound(hi):
        if hi >= max_batch:
            return CriticalBatch(batch=None, **common)
        hi = min(hi * 2, max_batch)
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if compute_bound(mid):
            hi = mid
        else:
            lo = mid
    return CriticalBatch(batch=hi, **common)
