"""A Hugging Face ``config.json`` read into one typed record, whatever the architecture calls its fields."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from .. import models, settings

__all__ = ["ModelConfig", "load_config", "config_names", "hub_ids", "CONFIG_DIR", "dtype_bytes", "normalize_dtype"]

#: The real configs shipped with the labs (``data/configs/<short-name>.json``).
CONFIG_DIR = settings.data_dir() / "configs"

FULL = "full"
SLIDING = "sliding"

# dtype names as people write them -> one canonical name per format.
_DTYPE_ALIASES = {
    "auto": "auto",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "float8_e4m3fn": "fp8_e4m3",
    "fp8_ds_mla": "fp8_ds_mla",
    "int8": "int8", "w8a8": "int8",
    "int4": "int4", "w4a16": "int4",
    "nvfp4": "nvfp4", "mxfp4": "mxfp4", "fp4": "nvfp4",
}
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


def normalize_dtype(name: str) -> str:
    """Canonical dtype name: ``"bfloat16"`` -> ``"bf16"``, ``"float8_e4m3fn"`` -> ``"fp8_e4m3"``, ...

    Introduced in lab 03 (Sizing the KV Cache).
    """
    key = str(name).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {name!r}; use one of: {', '.join(sorted(set(_DTYPE_ALIASES) - {'auto'}))} "
                         "or 'auto' (the model's own dtype)")
    return _DTYPE_ALIASES[key]


def dtype_bytes(name: str) -> int:
    """Bytes per element of an unpacked dtype (bf16 -> 2, fp8 -> 1); packed 4-bit formats have no whole size.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    canon = normalize_dtype(name)
    if canon not in _DTYPE_BYTES:
        raise ValueError(f"{name!r} is a packed format with no whole bytes per element; use weight_bytes() for it")
    return _DTYPE_BYTES[canon]


@dataclass(frozen=True)
class ModelConfig:
    """The numbers sizing needs, with one name each, from any supported ``config.json``.

    ``layer_types`` holds ``"full"`` or ``"sliding"`` per layer; ``dense_layers`` the indices of the
    layers whose MLP is dense in an MoE model (DeepSeek's ``first_k_dense_replace``, Qwen-MoE's
    ``mlp_only_layers``). MLA models (DeepSeek-V2/V3) set ``kv_lora_rank`` and keep
    ``head_dim = qk_nope_head_dim + qk_rope_head_dim`` (the query/key width per head).
    ``quant_method`` is set when the checkpoint ships quantized in a way sizing can count from the
    config alone: ``"fp8"`` (``quant_block`` = DeepSeek's 128x128 scale blocks) or ``"mxfp4"`` (gpt-oss).

    Introduced in lab 03 (Sizing the KV Cache).
    """

    name: str
    model_type: str
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    intermediate: int
    vocab: int
    tie_word_embeddings: bool
    dtype: str = "bf16"
    max_position_embeddings: int | None = None
    # biases and extra small tensors
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    attention_sinks: bool = False
    fused_qkv: bool = False
    # mixture of experts
    n_routed_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    router_bias: bool = False
    expert_bias: bool = False
    score_correction_bias: bool = False
    # multi-head latent attention
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    mtp_layers: int = 0
    # how the checkpoint itself is quantized, when its config says so ("fp8" with a block, or "mxfp4")
    quant_method: str | None = None
    quant_block: tuple[int, int] | None = None
    # sliding windows
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ derived
    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def moe_layers(self) -> int:
        """How many layers route tokens to experts."""
        return self.layers - len(self.dense_layers) if self.is_moe else 0

    @property
    def full_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == FULL)

    @property
    def sliding_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == SLIDING)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def kv_width(self) -> int:
        """Elements cached per token per layer: 2*kv_heads*head_dim (K and V), or the MLA latent plus rope key."""
        if self.is_mla:
            return int(self.kv_lora_rank) + int(self.qk_rope_head_dim or 0)
        return self.kv_heads * (self.head_dim + self.v_head_dim)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (e.g. ``cfg.replace(layers=2)`` for a toy)."""
        return replace(self, **changes)

    def describe(self) -> str:
        """One line: layers, widths, attention kind, experts, windows."""
        attn = (f"MLA (latent {self.kv_lora_rank} + rope {self.qk_rope_head_dim})" if self.is_mla
                else f"{self.heads} heads / {self.kv_heads} KV heads x {self.head_dim}")
        parts = [f"{self.name}: {self.layers} layers, hidden {self.hidden}, {attn}"]
        if self.is_moe:
            parts.append(f"{self.n_routed_experts} experts (top-{self.experts_per_token})"
                         + (f" + {self.n_shared_experts} shared" if self.n_shared_experts else ""))
        if self.sliding_layers:
            parts.append(f"{self.sliding_layers}/{self.layers} layers windowed at {self.sliding_window}")
        return ", ".join(parts) + f", {self.dtype}"


# ---------------------------------------------------------------------------------- loading
def config_names() -> list[str]:
    """Short names of the configs shipped in ``data/configs/`` (``llama-3.1-8b``, ``deepseek-v3``, ...).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json") if p.stem != "hub_ids")


def hub_ids() -> dict[str, str]:
    """Hugging Face ids with a shipped config: ``{"Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct", ...}``.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    raw = json.loads((CONFIG_DIR / "hub_ids.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def _resolve_path(src: str | os.PathLike) -> Path:
    """A config file for ``src``: a file, a checkpoint folder, a shipped name, or a Hugging Face id (the hub cache
    first, then the shipped copy, then ``config.json`` alone fetched from the Hub)."""
    text = str(src)
    if text == "default":
        return models.default_model(quiet=True) / "config.json"
    if text.startswith(models.RANDOM_PREFIX):
        return models.tiny_config_path(text[len(models.RANDOM_PREFIX):])
    p = Path(text).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} is a folder without a config.json: "
                                    "point at a checkpoint folder or a config file.")
        return p / "config.json"
    if p.is_file():
        return p
    for candidate in (CONFIG_DIR / f"{text}.json", CONFIG_DIR / text):
        if candidate.is_file():
            return candidate
    if "/" in text:
        local = models.local_path(text)
        if local is not None and (local / "config.json").is_file():
            return local / "config.json"
        shipped = hub_ids().get(text)
        if shipped:
            return CONFIG_DIR / f"{shipped}.json"
        if not models.is_local_id(text):
            try:
                from huggingface_hub import hf_hub_download

                return Path(hf_hub_download(text, "config.json"))
            except Exception as e:  # noqa: BLE001 - offline, gated, or no such repository
                raise FileNotFoundError(
                    f"no config for {text!r}: it is not in the hub cache, not shipped (data/configs/hub_ids.json), and "
                    f"fetching its config.json failed ({type(e).__name__}: {e}). Online, set HF_TOKEN for a gated "
                    "model; offline, put its config.json in data/configs/ and map the id in hub_ids.json.") from e
    raise FileNotFoundError(
        f"no config at {text!r}: give a config.json, a checkpoint folder, a Hugging Face id, 'default' (the "
        f"embedded model), or one of the shipped names: {', '.join(config_names())}"
    )


def _text_part(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: a nested ``text_config`` wins, top-level keys fill its gaps."""
    cfg = dict(raw)
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        merged = dict(text)
        for key in ("tie_word_embeddings", "torch_dtype", "dtype", "_name_or_path", "architectures"):
            if key not in merged and key in cfg:
                merged[key] = cfg[key]
        return merged
    return cfg


def _need(cfg: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    raise KeyError(f"config has none of {keys}: is this a decoder-only language model's config.json?")


def _layer_types(cfg: Mapping[str, Any], model_type: str, layers: int) -> tuple[tuple[str, ...], int | None]:
    """Which layers use a sliding window, following transformers' defaults and vLLM's reading of them."""
    window = cfg.get("sliding_window")
    if model_type.startswith(("qwen2", "qwen3")) and not cfg.get("use_sliding_window", False):
        window = None  # Qwen configs carry a window that is off unless use_sliding_window is true
    if not window:
        return (FULL,) * layers, None
    window = int(window)
    explicit = cfg.get("layer_types")
    if explicit:
        mapping = {"full_attention": FULL, "sliding_attention": SLIDING}
        unknown = sorted({t for t in explicit if t not in mapping})
        if unknown:
            raise ValueError(f"layer types {unknown} are not plain or sliding-window attention; "
                             "sizing supports full and sliding attention layers only")
        if len(explicit) != layers:
            raise ValueError(f"layer_types lists {len(explicit)} layers, num_hidden_layers says {layers}")
        types = tuple(mapping[t] for t in explicit)
    elif model_type.startswith(("qwen2", "qwen3")):
        first = int(cfg.get("max_window_layers", layers))
        types = tuple(SLIDING if i >= first else FULL for i in range(layers))
    elif model_type in ("gemma2", "gpt_oss"):
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))  # even layers local
    elif model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern", 6))
        types = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    else:
        # Mistral-7B-v0.1, Phi-3, ...: no per-layer list, so every layer is windowed (as in vLLM).
        types = (SLIDING,) * layers
    if SLIDING not in types:
        window = None
    return types, window


def _dense_layers(cfg: Mapping[str, Any], model_type: str, layers: int, experts: int) -> tuple[int, ...]:
    if not experts:
        return ()
    if "first_k_dense_replace" in cfg or model_type.startswith("deepseek"):
        k = int(cfg.get("first_k_dense_replace", 0) or 0)
        freq = int(cfg.get("moe_layer_freq", 1) or 1)
        return tuple(i for i in range(layers) if not (i >= k and i % freq == 0))
    only = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    return tuple(i for i in range(layers) if i in only or (i + 1) % step != 0)


def _model_dtype(value: Any) -> str:
    """The checkpoint's dtype; bf16 when the config names none (or something sizing cannot use)."""
    try:
        canon = normalize_dtype(str(value)) if value else "bf16"
    except ValueError:
        return "bf16"
    return canon if canon in ("bf16", "fp16", "fp32") else "bf16"


def _from_dict(raw: Mapping[str, Any], name: str | None) -> ModelConfig:
    cfg = _text_part(raw)
    model_type = str(cfg.get("model_type", "")).lower()
    archs = cfg.get("architectures") or [""]
    layers = int(_need(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(_need(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_need(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    vocab = int(_need(cfg, "vocab_size"))
    intermediate = int(cfg.get("intermediate_size") or 0)

    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora:
        rope, nope = int(cfg.get("qk_rope_head_dim", 64)), int(cfg.get("qk_nope_head_dim", 128))
        head_dim, v_head_dim = rope + nope, int(cfg.get("v_head_dim", nope))
    else:
        rope = nope = None
        explicit = cfg.get("head_dim")
        head_dim = int(explicit) if explicit else hidden // heads  # an explicit head_dim wins (Gemma, Qwen3)
        v_head_dim = head_dim

    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or cfg.get("moe_topk") or 0)
    if experts and not top_k:
        raise KeyError("an MoE config without num_experts_per_tok: cannot tell how many experts a token uses")
    shared = int(cfg.get("n_shared_experts") or 0)
    shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or (intermediate if experts else 0))

    types, window = _layer_types(cfg, model_type, layers)
    quant = raw.get("quantization_config") or cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, Mapping) else ""
    block = quant.get("weight_block_size") if method == "fp8" else None
    attention_bias = bool(cfg.get("attention_bias", False))
    is_qwen2 = model_type in ("qwen2", "qwen2_moe")
    dtype = _model_dtype(cfg.get("torch_dtype") or cfg.get("dtype"))
    default_tie = model_type.startswith("gemma")
    if name is None:
        name = str(cfg.get("_name_or_path") or archs[0] or model_type or "model")

    return ModelConfig(
        name=name,
        model_type=model_type,
        architecture=str(archs[0]),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", default_tie)),
        dtype=dtype,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        qkv_bias=True if is_qwen2 else attention_bias,
        o_bias=False if is_qwen2 else attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type.startswith(("qwen3", "gemma3", "olmo2")),
        norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
        attention_sinks=model_type == "gpt_oss",
        fused_qkv=model_type == "phi3",
        n_routed_experts=experts,
        experts_per_token=top_k,
        n_shared_experts=shared,
        moe_intermediate=moe_inter,
        shared_expert_intermediate=shared_inter or (shared * moe_inter),
        shared_expert_gate=bool(shared_inter),
        dense_layers=_dense_layers(cfg, model_type, layers, experts),
        router_bias=model_type == "gpt_oss",
        expert_bias=model_type == "gpt_oss",
        score_correction_bias=cfg.get("topk_method") == "noaux_tc",
        kv_lora_rank=int(kv_lora) if kv_lora else None,
        q_lora_rank=int(cfg["q_lora_rank"]) if kv_lora and cfg.get("q_lora_rank") else None,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        quant_method=method if method in ("fp8", "mxfp4") else None,
        quant_block=(int(block[0]), int(block[1])) if block else None,
        layer_types=types,
        sliding_window=window,
        raw=dict(raw),
    )


def load_config(src: "str | os.PathLike | Mapping[str, Any] | ModelConfig", name: str | None = None,
                dtype: str | None = None) -> ModelConfig:
    """Read a Hugging Face ``config.json`` into a :class:`ModelConfig`.

    ``src`` is a path to a config file, a checkpoint folder, a dict, a shipped name from
    ``data/configs/`` (``"llama-3.1-8b"``), a Hugging Face id (``"Qwen/Qwen2.5-1.5B-Instruct"``: from the hub
    cache, else the shipped copy, else fetched), or ``"default"`` (the embedded SmolLM2 checkpoint).
    Handles Llama, Qwen2/2.5/3 (+MoE), Mistral, Mixtral, Gemma 2/3, DeepSeek-V2/V3 (MLA), gpt-oss
    and Phi-3 field names, and a nested ``text_config`` (the language model only; a vision tower is not
    counted).

    ``dtype`` is the dtype the model is *served* in when it differs from the checkpoint's (``--dtype float32`` on a
    CPU without native bf16): weights and an ``"auto"`` KV cache then take its bytes. Labs pass the live server's
    (``srv.startup.dtype``).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = _load(src, name)
    return cfg if dtype in (None, "auto") else cfg.replace(dtype=_model_dtype(dtype))


def _load(src: "str | os.PathLike | Mapping[str, Any] | ModelConfig", name: str | None) -> ModelConfig:
    if isinstance(src, ModelConfig):
        return src if name is None else src.replace(name=name)
    if isinstance(src, Mapping):
        return _from_dict(src, name)
    path = _resolve_path(src)
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if name is None:
        text = str(src)
        if text.startswith(models.RANDOM_PREFIX):
            name = text[len(models.RANDOM_PREFIX):]
        elif "/" in text and not Path(text).expanduser().exists():
            name = text.split("/")[-1].lower()  # a hub id
        elif path.parent.parent.name == "snapshots":  # a hub-cache snapshot: models--org--name/snapshots/<rev>/
            name = path.parent.parent.parent.name.split("--")[-1].lower()
        else:
            name = path.parent.name if path.name == "config.json" else path.stem
    return _from_dict(raw, name)
