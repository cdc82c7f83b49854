"""The KV cache: bytes per token and per sequence, and vLLM's own block accounting, to the token.

vLLM (v1, 0.32) sizes its cache like this (``vllm/v1/core/kv_cache_utils.py``):

1. Each attention layer gets a spec: full attention, sliding window, or MLA. One *page* holds
   ``block_size`` tokens of one layer: ``block_size * kv_heads_per_rank * (head_dim + v_head_dim) * bytes``
   (MLA: ``block_size * (kv_lora_rank + qk_rope_head_dim) * bytes``; ``fp8_ds_mla`` packs 656 bytes a token).
2. Layers are grouped. One kind of layer -> one group of all layers. Full *and* sliding layers (Gemma 2/3,
   gpt-oss) -> groups of equal size (the smaller count, or the larger if within 1.5x), e.g. Gemma-2's
   21 full + 21 sliding -> two groups of 21; Gemma-3's 5:1 pattern -> one full group and several sliding
   ones. All groups draw block ids from ONE pool; a pool block holds one page of every layer of a group,
   so ``num_blocks = kv_cache_bytes // (layers_in_largest_group * page_bytes)``. (vLLM first makes pages
   equal by raising a smaller layer's block size; every model here has one page size for all layers.)
3. A request of ``max_model_len`` tokens needs ``ceil(max_model_len / block_size)`` blocks in each full
   group, and ``ceil(min(window - 1 + in_flight, max_model_len) / block_size) + 1`` in each sliding group
   (``in_flight`` = ``max_num_batched_tokens`` x batches in flight: 1 on CPU, 2 with GPU async scheduling).
4. ``max_concurrency = num_blocks / sum(blocks per request over groups)`` and
   ``kv_cache_tokens = int(max_concurrency * max_model_len)``: the "KV cache size: N tokens, Maximum
   concurrency for L tokens per request: Xx" startup line. vLLM refuses to start when one request does
   not fit in the cache less one block (the pool's null block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .config import FULL, SLIDING, ModelConfig, dtype_bytes, load_config, normalize_dtype

__all__ = [
    "KV_DTYPES",
    "prefix_hit_rate",
    "kv_bytes_per_token",
    "kv_bytes_for_context",
    "KVGroup",
    "KVCapacity",
    "CacheTooSmall",
    "vllm_kv_capacity",
    "kv_cache_tokens",
    "Concurrency",
    "workload_concurrency",
]

#: KV cache dtypes, as vLLM's ``--kv-cache-dtype`` names them.
KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")

_FP8_DS_MLA_BYTES = 656  # DeepSeek's packed MLA row: 512 fp8 + 4 fp32 scales + 64 bf16 rope values


def _kv_token_bytes_per_layer(cfg: ModelConfig, kv_dtype: str, tp: int) -> int:
    """Bytes one token occupies in one attention layer's cache on one tensor-parallel rank."""
    kd = normalize_dtype(kv_dtype)
    if kd == "auto":
        kd = cfg.dtype
    if kd == "fp8_ds_mla":
        if not cfg.is_mla:
            raise ValueError("kv_dtype='fp8_ds_mla' is DeepSeek's MLA cache layout; this model has no MLA")
        return _FP8_DS_MLA_BYTES
    if kd not in ("bf16", "fp16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2"):
        raise ValueError(f"kv_dtype {kv_dtype!r} is not a KV cache dtype; use one of {', '.join(KV_DTYPES)}")
    if tp < 1:
        raise ValueError("tp (tensor-parallel size) must be >= 1")
    b = dtype_bytes(kd)
    if cfg.is_mla:
        return cfg.kv_width * b  # one latent per token, replicated on every TP rank, no separate V
    heads = max(1, cfg.kv_heads // tp)  # KV heads split across ranks; replicated when tp > kv_heads
    return heads * (cfg.head_dim + cfg.v_head_dim) * b


def kv_bytes_per_token(cfg: "ModelConfig | Mapping[str, Any] | str", kv_dtype: str = "auto", *, tp: int = 1,
                       include_sliding: bool = False) -> int:
    """Bytes ONE token adds to the KV cache across every full-attention layer.

    MHA/GQA/MQA: ``2 * kv_heads * head_dim * bytes`` per layer (K and V); MLA (DeepSeek):
    ``(kv_lora_rank + qk_rope_head_dim) * bytes`` per layer, no factor 2 (``fp8_ds_mla``: 656 bytes).
    Sliding-window layers are left out (past the window a token costs them nothing; see
    :func:`kv_bytes_for_context`) unless ``include_sliding``. With ``tp`` > 1: bytes on one rank.
    Llama-3.1-8B in bf16: 32 x 2 x 8 x 128 x 2 = 131,072.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = load_config(cfg)
    layers = cfg.layers if include_sliding else cfg.full_layers
    return layers * _kv_token_bytes_per_layer(cfg, kv_dtype, tp)


def kv_bytes_for_context(cfg: "ModelConfig | Mapping[str, Any] | str", context: int, kv_dtype: str = "auto", *,
                         tp: int = 1) -> int:
    """Bytes of KV cache that ONE sequence of ``context`` tokens holds, sliding windows applied.

    Full-attention layers keep every token; sliding-window layers at most ``sliding_window`` (Gemma-2
    and gpt-oss alternate, Gemma-3 is 5:1, Mistral-7B-v0.1 windows every layer). Exact arithmetic,
    without vLLM's rounding up to whole blocks (see :func:`vllm_kv_capacity` for that).

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    cfg = load_config(cfg)
    if context < 0:
        raise ValueError("context must be >= 0 tokens")
    per = _kv_token_bytes_per_layer(cfg, kv_dtype, tp)
    windowed = min(context, cfg.sliding_window or context)
    return per * (cfg.full_layers * context + cfg.sliding_layers * windowed)


# ------------------------------------------------------------------------ vLLM's accounting
@dataclass(frozen=True)
class KVGroup:
    """One KV cache group as vLLM forms it: layers sharing a block table.

    ``kind`` is ``"full"``, ``"mla"`` or ``"sliding"``; ``blocks_per_request`` is what one request of
    the capacity's length takes from the shared pool for this group.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """

    kind: str
    layers: tuple[int, ...]
    window: int | None
    blocks_per_request: int


@dataclass(frozen=True)
class KVCapacity:
    """vLLM's KV cache capacity, as its startup log states it, with the working shown.

    ``page_bytes``: one layer's page (``block_size`` tokens); ``bytes_per_block``: one pool block
    (a page of every layer in the largest group); ``num_blocks = kv_cache_bytes // bytes_per_block``.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    block_size: int
    page_bytes: int
    bytes_per_block: int
    blocks_per_request: int
    groups: tuple[KVGroup, ...]
    kv_cache_bytes: int

    def log_line(self, device: str = "CPU") -> str:
        """The line vLLM logs at startup, e.g. ``CPU KV cache size: 46,592 tokens, Maximum concurrency for
        2,048 tokens per request: 22.75x`` (``device`` is ``"GPU"`` on CUDA)."""
        return (f"{device} KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
                f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x")


class CacheTooSmall(ValueError):
    """vLLM would refuse to start: one request of ``max_model_len`` tokens does not fit in the KV cache.

    ``needed_bytes`` is what that one request takes (whole blocks, every group); ``available_bytes``
    the cache less the one block vLLM's block pool holds back; ``fits_max_model_len`` the largest
    ``max_model_len`` that would fit (0 if none), as vLLM's error message estimates it.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    def __init__(self, message: str, needed_bytes: int, available_bytes: int, fits_max_model_len: int):
        super().__init__(message)
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        self.fits_max_model_len = fits_max_model_len


def _layer_kinds(cfg: ModelConfig, hybrid: bool) -> list[tuple[str, int | None]]:
    has_full = FULL in cfg.layer_types
    kinds = []
    for t in cfg.layer_types:
        if cfg.is_mla:
            kinds.append(("mla", None))
        elif t == SLIDING and (hybrid or not has_full):
            kinds.append(("sliding", cfg.sliding_window))
        else:
            # With the hybrid manager off, vLLM allocates sliding layers like full ones.
            kinds.append(("full", None))
    return kinds


def _groups(kinds: list[tuple[str, int | None]]) -> list[tuple[tuple[str, int | None], tuple[int, ...]]]:
    """Split layers into vLLM's KV cache groups (``_get_kv_cache_groups_uniform_page_size``)."""
    buckets: dict[tuple[str, int | None], list[int]] = {}
    for i, k in enumerate(kinds):
        buckets.setdefault(k, []).append(i)
    if len(buckets) == 1:
        (k, layers), = buckets.items()
        return [(k, tuple(layers))]
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < 1.5 * min(sizes):
        group_size = max(sizes)  # e.g. 12 sliding + 13 full: pad to 13 + 13 rather than split
    out = []
    for k, layers in buckets.items():
        n = math.ceil(len(layers) / group_size)
        out += [(k, tuple(layers[i::n])) for i in range(n)]
    return out


def _blocks_per_request(kind: str, window: int | None, length: int, block_size: int, in_flight: int) -> int:
    if kind == "sliding":
        assert window is not None
        return math.ceil(min(window - 1 + in_flight, length) / block_size) + 1
    return math.ceil(length / block_size)


def vllm_kv_capacity(
    cfg: "ModelConfig | Mapping[str, Any] | str",
    kv_cache_bytes: int,
    block_size: int,
    max_model_len: int,
    kv_dtype: str = "auto",
    tp: int = 1,
    *,
    hybrid: bool = True,
    max_num_batched_tokens: int = 2048,
    concurrent_batches: int = 1,
    check: bool = True,
) -> KVCapacity:
    """vLLM's KV cache blocks, tokens and maximum concurrency, exactly as its startup log reports them.

    ``kv_cache_bytes`` is the memory for the cache on ONE worker (``--kv-cache-memory-bytes``, or what
    vLLM logs as available KV cache memory); with ``tp`` > 1 each rank holds ``kv_heads / tp`` heads
    (MLA's latent is replicated). ``block_size``: 128 on CPU, 16 on most GPU backends.

    Sliding-window groups depend on the tokens a step may keep in flight: ``max_num_batched_tokens``
    (CPU and small-GPU default 2048; H100/H200 8192; B200 16384) times ``concurrent_batches`` (1 on
    CPU; 2 on GPU, where async scheduling is on by default). ``hybrid=False`` mirrors
    ``--disable-hybrid-kv-cache-manager``: sliding layers next to full ones are then sized as full.

    Like vLLM, raises :class:`CacheTooSmall` when one request of ``max_model_len`` tokens does not fit
    (its message gives the largest ``max_model_len`` that would); ``check=False`` computes anyway.

    Introduced in lab 03 (Sizing the KV Cache).
    """
    cfg = load_config(cfg)
    if block_size < 1 or max_model_len < 1:
        raise ValueError("block_size and max_model_len must be positive")
    per_token = _kv_token_bytes_per_layer(cfg, kv_dtype, tp)
    page = block_size * per_token
    grouped = _groups(_layer_kinds(cfg, hybrid))
    bytes_per_block = max(len(layers) for _, layers in grouped) * page
    num_blocks = int(kv_cache_bytes) // bytes_per_block
    in_flight = max_num_batched_tokens * concurrent_batches
    groups = tuple(
        KVGroup(kind=k, layers=layers, window=w,
                blocks_per_request=_blocks_per_request(k, w, max_model_len, block_size, in_flight))
        for (k, w), layers in grouped
    )
    per_request = sum(g.blocks_per_request for g in groups)
    available = int(kv_cache_bytes) - bytes_per_block  # the block pool keeps one null block
    if check and bytes_per_block * per_request > available:
        def needed(length: int) -> int:
            blocks = sum(_blocks_per_request(k, w, length, block_size, in_flight) for (k, w), _ in grouped)
            return bytes_per_block * blocks
        fits, lo, hi = 0, 1, max_model_len
        while lo <= hi:  # largest length whose one request fits
            mid = (lo + hi) // 2
            if needed(mid) <= available:
                fits, lo = mid, mid + 1
            else:
                hi = mid - 1
        need = bytes_per_block * per_request
        hint = f"; the largest max_model_len that fits is {fits:,}" if fits else ""
        raise CacheTooSmall(
            f"vLLM would refuse to start: one request of max_model_len={max_model_len:,} tokens needs "
            f"{need / 2**30:.2f} GiB of KV cache, more than the {max(available, 0) / 2**30:.2f} GiB available{hint}. "
            "Give the KV cache more memory (--kv-cache-memory-bytes, --gpu-memory-utilization) or lower max_model_len.",
            need, available, fits)
    concurrency = num_blocks / per_request
    return KVCapacity(num_blocks=num_blocks, kv_cache_tokens=int(concurrency * max_model_len),
                    max_concurrency=concurrency, max_model_len=max_model_len, block_size=block_size,
                    page_bytes=page, bytes_per_block=bytes_per_block, blocks_per_request=per_request,
                    groups=groups, kv_cache_bytes=int(kv_cache_bytes))


def kv_cache_tokens(cfg: "ModelConfig | Mapping[str, Any] | str", kv_cache_bytes: int, block_size: int,
                    max_model_len: int, kv_dtype: str = "auto", **kwargs: Any) -> int:
    """The token count in vLLM's "KV cache size: N tokens" line (shortcut for :func:`vllm_kv_capacity`).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    return vllm_kv_capacity(cfg, kv_cache_bytes, block_size, max_model_len, kv_dtype, **kwargs).kv_cache_tokens


@dataclass(frozen=True)
class Concurrency:
    """How many requests of a real workload fit in the KV cache at once.

    ``requests`` whole requests fit (``num_blocks // blocks_per_request``); ``ratio`` is the
    unrounded ``num_blocks / blocks_per_request``, comparable to vLLM's max-concurrency figure.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """

    requests: int
    ratio: float
    tokens_per_request: int
    blocks_per_request: int
    num_blocks: int
    groups: tuple[KVGroup, ...]


def workload_concurrency(
    cfg: "ModelConfig | Mapping[str, Any] | str",
    kv_cache_bytes: int,
    block_size: int,
    input_tokens: int,
    output_tokens: int,
    kv_dtype: str = "auto",
    tp: int = 1,
    *,
    hybrid: bool = True,
) -> Concurrency:
    """How many requests of ``input_tokens + output_tokens`` tokens fit in the KV cache at once.

    The concurrency a real workload gets, rather than the ``max_model_len`` worst case vLLM logs.

    Each full (or MLA) group holds ``ceil((in + out) / block_size)`` blocks per request; a sliding
    group holds the same, capped at the blocks its window can span (``ceil(window / block_size) + 1``).
    All groups draw from one pool of ``num_blocks`` (the same pool :func:`vllm_kv_capacity` computes).

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    length = int(input_tokens) + int(output_tokens)
    if length < 1:
        raise ValueError("a request needs at least one token")
    cap = vllm_kv_capacity(cfg, kv_cache_bytes, block_size, length, kv_dtype, tp, hybrid=hybrid, check=False)
    whole = math.ceil(length / block_size)
    groups = tuple(
        KVGroup(kind=g.kind, layers=g.layers, window=g.window,
                blocks_per_request=min(whole, math.ceil(g.window / block_size) + 1) if g.kind == "sliding" else whole)
        for g in cap.groups
    )
    per_request = sum(g.blocks_per_request for g in groups)
    return Concurrency(requests=cap.num_blocks // per_request, ratio=cap.num_blocks / per_request,
                       tokens_per_request=length, blocks_per_request=per_request,
                       num_blocks=cap.num_blocks, groups=groups)


def prefix_hit_rate(shared_tokens: int, prompt_tokens: int, block_size: int, requests: int) -> float:
    """The prefix-cache hit rate vLLM reports (hit tokens / queried tokens) for ``requests`` prompts of
    ``prompt_tokens`` tokens sent one after another, all starting with the same ``shared_tokens``.

    vLLM hashes each *full* block with the hash of the block before it, so a prompt reuses the cached blocks up to its
    first difference, in whole blocks: ``floor(shared / block) x block`` tokens — minus one block when that would be
    the whole prompt (the last token is always computed). The first request finds nothing.

    Introduced in lab 09 (Prefix Caching, Measured).
    """
    if requests < 1 or prompt_tokens < 1 or block_size < 1:
        raise ValueError("requests, prompt_tokens and block_size must be positive")
    hit = (min(shared_tokens, prompt_tokens) // block_size) * block_size
    if hit >= prompt_tokens:  # a fully cached prompt still recomputes its last block
        hit = ((prompt_tokens - 1) // block_size) * block_size
    return (requests - 1) / requests * hit / prompt_tokens
