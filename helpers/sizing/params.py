"""Every weight tensor of a model, counted once: parameters (total and active) and bytes per precision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .config import ModelConfig, load_config, normalize_dtype

__all__ = ["Tensor", "Params", "WeightBytes", "tensors", "param_count", "weight_bytes", "resolved_weight_dtype",
           "WEIGHT_DTYPES"]

#: Weight precisions :func:`weight_bytes` understands.
WEIGHT_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "int8", "int4", "nvfp4", "mxfp4")

_CAST_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

COMPONENTS = ("embedding", "lm_head", "attention", "mlp", "experts", "shared_experts", "router", "norms", "biases",
              "other")


@dataclass(frozen=True)
class Tensor:
    """One weight tensor of one layer, and how many copies of it the model holds.

    ``shape`` is ``(out_features, in_features)`` for a linear layer. ``count`` copies exist in the
    model (layers x experts); ``active`` of them touch each token (MoE: top-k of the routed experts).
    ``kind`` is ``"linear"``, ``"embedding"``, ``"norm"``, ``"bias"`` or ``"vector"``.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    name: str
    component: str
    shape: tuple[int, ...]
    count: int
    active: int
    kind: str = "linear"
    routed_expert: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def params(self) -> int:
        return self.numel * self.count

    @property
    def active_params(self) -> int:
        return self.numel * self.active


@dataclass(frozen=True)
class Params:
    """Parameter counts: total, active per token, and per component.

    ``active`` counts only the top-k routed experts of each MoE layer (shared experts, dense layers,
    attention, embeddings and the LM head always count). ``embedding`` is the input table;
    ``lm_head`` is 0 when it is tied to the embedding.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    total: int
    active: int
    by_component: dict[str, int]
    active_by_component: dict[str, int]

    @property
    def embedding(self) -> int:
        return self.by_component.get("embedding", 0)

    @property
    def lm_head(self) -> int:
        return self.by_component.get("lm_head", 0)

    @property
    def non_embedding(self) -> int:
        """Everything but the input embedding table and the LM head."""
        return self.total - self.embedding - self.lm_head

    def table(self) -> str:
        """A small text table of the breakdown."""
        rows = [f"{'component':<16}{'total':>18}{'active':>18}"]
        for comp in COMPONENTS:
            if self.by_component.get(comp):
                rows.append(f"{comp:<16}{self.by_component[comp]:>18,}{self.active_by_component.get(comp, 0):>18,}")
        rows.append(f"{'TOTAL':<16}{self.total:>18,}{self.active:>18,}")
        return "\n".join(rows)


def _layer_attention(cfg: ModelConfig, n: int) -> list[Tensor]:
    h, hd, vd = cfg.hidden, cfg.head_dim, cfg.v_head_dim
    out: list[Tensor] = []
    if cfg.is_mla:
        rope, nope, lora = int(cfg.qk_rope_head_dim or 0), int(cfg.qk_nope_head_dim or 0), int(cfg.kv_lora_rank or 0)
        if cfg.q_lora_rank:
            out += [Tensor("attn.q_a_proj", "attention", (cfg.q_lora_rank, h), n, n),
                    Tensor("attn.q_a_layernorm", "norms", (cfg.q_lora_rank,), n, n, "norm"),
                    Tensor("attn.q_b_proj", "attention", (cfg.heads * (nope + rope), cfg.q_lora_rank), n, n)]
        else:
            out.append(Tensor("attn.q_proj", "attention", (cfg.heads * (nope + rope), h), n, n))
        out += [Tensor("attn.kv_a_proj_with_mqa", "attention", (lora + rope, h), n, n),
                Tensor("attn.kv_a_layernorm", "norms", (lora,), n, n, "norm"),
                Tensor("attn.kv_b_proj", "attention", (cfg.heads * (nope + vd), lora), n, n),
                Tensor("attn.o_proj", "attention", (h, cfg.heads * vd), n, n)]
        return out
    q, k, v = cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * vd
    if cfg.fused_qkv:
        out.append(Tensor("attn.qkv_proj", "attention", (q + k + v, h), n, n))
    else:
        out += [Tensor("attn.q_proj", "attention", (q, h), n, n),
                Tensor("attn.k_proj", "attention", (k, h), n, n),
                Tensor("attn.v_proj", "attention", (v, h), n, n)]
    out.append(Tensor("attn.o_proj", "attention", (h, cfg.heads * vd), n, n))
    if cfg.qkv_bias:
        out.append(Tensor("attn.qkv_bias", "biases", (q + k + v,), n, n, "bias"))
    if cfg.o_bias:
        out.append(Tensor("attn.o_bias", "biases", (h,), n, n, "bias"))
    if cfg.qk_norm:
        out.append(Tensor("attn.qk_norm", "norms", (2 * hd,), n, n, "norm"))
    if cfg.attention_sinks:
        out.append(Tensor("attn.sinks", "other", (cfg.heads,), n, n, "vector"))
    return out


def _mlp(prefix: str, component: str, hidden: int, inter: int, n: int, active: int, bias: bool,
         routed: bool = False) -> list[Tensor]:
    out = [Tensor(f"{prefix}.gate_proj", component, (inter, hidden), n, active, routed_expert=routed),
           Tensor(f"{prefix}.up_proj", component, (inter, hidden), n, active, routed_expert=routed),
           Tensor(f"{prefix}.down_proj", component, (hidden, inter), n, active, routed_expert=routed)]
    if bias:
        out.append(Tensor(f"{prefix}.bias", "biases", (2 * inter + hidden,), n, active, "bias"))
    return out


def _moe_block(cfg: ModelConfig, n: int, prefix: str = "mlp") -> list[Tensor]:
    e, k, h = cfg.n_routed_experts, cfg.experts_per_token, cfg.hidden
    out = [Tensor(f"{prefix}.router", "router", (e, h), n, n)]
    if cfg.router_bias:
        out.append(Tensor(f"{prefix}.router_bias", "biases", (e,), n, n, "bias"))
    if cfg.score_correction_bias:
        out.append(Tensor(f"{prefix}.e_score_correction_bias", "biases", (e,), n, n, "bias"))
    out += _mlp(f"{prefix}.experts", "experts", h, cfg.moe_intermediate, n * e, n * k, cfg.expert_bias, routed=True)
    if cfg.shared_expert_intermediate:
        out += _mlp(f"{prefix}.shared_experts", "shared_experts", h, cfg.shared_expert_intermediate, n, n, cfg.mlp_bias)
        if cfg.shared_expert_gate:
            out.append(Tensor(f"{prefix}.shared_expert_gate", "shared_experts", (1, h), n, n))
    return out


def tensors(cfg: "ModelConfig | Mapping[str, Any] | str", include_mtp: bool = False) -> list[Tensor]:
    """The model's weight tensors, each with its shape and copy count: the one inventory sizing counts from.

    Layer tensors carry a count of layers (times experts); ``include_mtp`` adds DeepSeek's
    multi-token-prediction layer(s), which vLLM loads only for speculative decoding.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = load_config(cfg)
    L, h = cfg.layers, cfg.hidden
    out = [Tensor("embed_tokens", "embedding", (cfg.vocab, h), 1, 1, "embedding")]
    out += _layer_attention(cfg, L)
    out.append(Tensor("layer_norms", "norms", (cfg.norms_per_layer * h,), L, L, "norm"))
    dense = len(cfg.dense_layers) if cfg.is_moe else L
    if dense:
        out += _mlp("mlp", "mlp", h, cfg.intermediate, dense, dense, cfg.mlp_bias)
    if cfg.is_moe and cfg.moe_layers:
        out += _moe_block(cfg, cfg.moe_layers)
    out.append(Tensor("final_norm", "norms", (h,), 1, 1, "norm"))
    if not cfg.tie_word_embeddings:
        out.append(Tensor("lm_head", "lm_head", (cfg.vocab, h), 1, 1, "embedding"))
    if include_mtp and cfg.mtp_layers:
        m = cfg.mtp_layers  # DeepSeek's MTP module: eh_proj, enorm/hnorm/head norm, and one more decoder layer
        out += [Tensor("mtp.eh_proj", "other", (h, 2 * h), m, m),
                Tensor("mtp.norms", "norms", ((3 + cfg.norms_per_layer) * h,), m, m, "norm")]
        out += [replace(t, name="mtp." + t.name) for t in _layer_attention(cfg, m)]
        out += (_moe_block(cfg, m, "mtp.mlp") if cfg.is_moe
                else _mlp("mtp.mlp", "mlp", h, cfg.intermediate, m, m, cfg.mlp_bias))
    return out


def param_count(cfg: "ModelConfig | Mapping[str, Any] | str", include_mtp: bool = False) -> Params:
    """Total and active parameters, with a per-component breakdown.

    Counts every tensor the Hugging Face model defines (embeddings, an untied LM head, attention,
    dense MLP, routed and shared experts, router, norms, biases, attention sinks). MoE ``active``
    counts the top-k routed experts per token. DeepSeek's MTP layer is left out unless ``include_mtp``.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    by: dict[str, int] = {c: 0 for c in COMPONENTS}
    act: dict[str, int] = {c: 0 for c in COMPONENTS}
    for t in tensors(cfg, include_mtp=include_mtp):
        by[t.component] += t.params
        act[t.component] += t.active_params
    by = {k: v for k, v in by.items() if v}
    act = {k: v for k, v in act.items() if v}
    return Params(total=sum(by.values()), active=sum(act.values()), by_component=by, active_by_component=act)


# -------------------------------------------------------------------------------- weight bytes
@dataclass(frozen=True)
class WeightBytes:
    """Bytes of a model's weights in one precision, scales included, with the working shown.

    ``quantized_params`` were stored in ``dtype``; ``kept_params`` stayed in the model's own dtype
    (norms, biases, router, and embeddings/LM head unless asked). ``scale_bytes`` is the overhead of
    quantization scales and zero points. ``routed_expert_bytes`` is the part a decode step reads only
    for the experts its tokens pick.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    dtype: str
    total: int
    quantized_params: int
    kept_params: int
    scale_bytes: int
    routed_expert_bytes: int
    by_component: dict[str, int] = field(default_factory=dict)

    @property
    def gib(self) -> float:
        return self.total / 2**30

    @property
    def bits_per_param(self) -> float:
        return 8 * self.total / max(1, self.quantized_params + self.kept_params)


def _quant_bytes(t: Tensor, dtype: str, model_bytes: int, *, group_size: int, zero_points: bool, fp8_scales: str,
                 block: tuple[int, int], scale_bytes: int | None, strict: bool) -> tuple[int, int]:
    """(data bytes, scale bytes) for ONE copy of a linear tensor stored in ``dtype``."""
    n = t.numel
    out_f, in_f = t.shape[0], t.shape[-1]
    sb = model_bytes if scale_bytes is None else scale_bytes
    if dtype in ("bf16", "fp16"):
        return 2 * n, 0
    if dtype == "fp32":
        return 4 * n, 0
    if dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        if fp8_scales == "tensor":
            return n, 4  # one fp32 scale per tensor
        if fp8_scales == "channel":
            return n, out_f * sb  # one scale per output channel (compressed-tensors: in the model's dtype)
        if fp8_scales == "block":
            return n, math.ceil(out_f / block[0]) * math.ceil(in_f / block[1]) * 4  # DeepSeek weight_scale_inv, fp32
        raise ValueError(f"fp8_scales must be 'tensor', 'channel' or 'block', not {fp8_scales!r}")
    if dtype == "int8":
        return n, out_f * sb  # per-channel scales
    if dtype == "int4":
        if strict and in_f % group_size:
            raise ValueError(
                f"{t.name} has {in_f} input columns, not a multiple of group_size={group_size}: vLLM refuses such a "
                f"checkpoint ('weight column counts not divisible by group_size', seen with SmolLM2 at 128). "
                f"Pick a group size that divides {in_f} (e.g. 64), or pass strict=False to size it anyway."
            )
        groups = out_f * math.ceil(in_f / group_size)
        return n // 2, groups * sb + (math.ceil(groups / 2) if zero_points else 0)  # zero points packed 4-bit
    if dtype == "nvfp4":
        if strict and in_f % 16:
            raise ValueError(f"{t.name}: NVFP4 needs input columns in multiples of 16, got {in_f}")
        return n // 2, math.ceil(n / 16) + 4  # fp8 E4M3 scale per 16 values + one fp32 global scale
    if dtype == "mxfp4":
        if strict and in_f % 32:
            raise ValueError(f"{t.name}: MXFP4 needs input columns in multiples of 32, got {in_f}")
        return n // 2, math.ceil(n / 32)  # E8M0 (one byte) scale per 32 values
    raise ValueError(f"unknown weight dtype {dtype!r}; use one of {', '.join(WEIGHT_DTYPES)}")


def weight_bytes(
    cfg: "ModelConfig | Mapping[str, Any] | str",
    dtype: str = "auto",
    *,
    group_size: int = 128,
    zero_points: bool = False,
    fp8_scales: str = "channel",
    block: tuple[int, int] = (128, 128),
    scale_bytes: int | None = None,
    keep_embeddings: bool = True,
    quantize_router: bool = False,
    experts_only: bool = False,
    include_mtp: bool = False,
    strict: bool = True,
) -> WeightBytes:
    """Bytes of the weights stored in ``dtype``, quantization scales included.

    ``dtype``: ``auto`` (as the checkpoint ships: its ``torch_dtype``, or the FP8 / MXFP4 layout its
    ``quantization_config`` names), ``bf16``/``fp16``/``fp32``; ``fp8`` with ``fp8_scales``
    ``"channel"`` (default: one scale per output row, like llmcompressor's FP8_DYNAMIC), ``"tensor"``
    (one fp32) or ``"block"`` (fp32 per ``block`` = 128x128 tile, DeepSeek-V3's layout); ``int8``
    (per-channel scales); ``int4`` group-wise (``group_size`` columns share a scale, + 4-bit zero
    points when ``zero_points``); ``nvfp4`` (16-value blocks with an FP8 E4M3 scale each, plus one
    fp32 scale per tensor = 4.5 bits/weight); ``mxfp4`` (32-value blocks with an E8M0 scale = 4.25
    bits/weight). Scales are ``scale_bytes`` wide where the format leaves it open (default: the
    model's dtype, as compressed-tensors stores them).

    ``bf16``/``fp16``/``fp32`` are plain casts: every tensor in that dtype. For the quantized formats
    only linear weights are quantized. The embedding table and LM head stay in the model's dtype
    unless ``keep_embeddings=False``; norms, biases and attention sinks always do, and so does the
    MoE router unless ``quantize_router``. ``experts_only`` quantizes just the routed experts
    (gpt-oss ships that way: MXFP4 experts, bf16 everything else).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = load_config(cfg)
    want = normalize_dtype(dtype)
    model_bytes = cfg.dtype_bytes
    target = cfg.dtype if want == "auto" else want
    if want == "auto" and cfg.quant_method == "fp8":  # as shipped, e.g. DeepSeek-V3's FP8 checkpoint
        target = "fp8"
        if cfg.quant_block:
            fp8_scales, block = "block", cfg.quant_block
        else:
            fp8_scales = "tensor"
    elif want == "auto" and cfg.quant_method == "mxfp4":  # gpt-oss: MXFP4 experts, the rest bf16
        target, experts_only = "mxfp4", True
    by: dict[str, int] = {}
    quantized = kept = scales = routed = 0
    cast = target in ("bf16", "fp16", "fp32")  # a plain cast stores every tensor in that dtype
    for t in tensors(cfg, include_mtp=include_mtp):
        if cast:
            nbytes = t.params * _CAST_BYTES[target]
            by[t.component] = by.get(t.component, 0) + nbytes
            quantized += t.params
            routed += nbytes if t.routed_expert else 0
            continue
        quantize = t.kind == "linear" or (t.kind == "embedding" and not keep_embeddings)
        if t.component == "router" and not quantize_router:
            quantize = False
        if experts_only and not t.routed_expert:
            quantize = False
        if quantize:
            data, sc = _quant_bytes(t, target, model_bytes, group_size=group_size, zero_points=zero_points,
                                    fp8_scales=fp8_scales, block=block, scale_bytes=scale_bytes, strict=strict)
            nbytes = (data + sc) * t.count
            quantized += t.params
            scales += sc * t.count
        else:
            nbytes = t.params * model_bytes
            kept += t.params
        by[t.component] = by.get(t.component, 0) + nbytes
        if t.routed_expert:
            routed += nbytes
    return WeightBytes(dtype=target, total=sum(by.values()), quantized_params=quantized, kept_params=kept,
                       scale_bytes=scales, routed_expert_bytes=routed, by_component=by)


def resolved_weight_dtype(cfg: ModelConfig, dtype: str) -> str:
    """The weight format ``dtype`` names for ``cfg``: ``"auto"`` becomes the checkpoint's own (its quantization if any).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    want = normalize_dtype(dtype)
    if want != "auto":
        return want
    return cfg.quant_method or cfg.dtype
