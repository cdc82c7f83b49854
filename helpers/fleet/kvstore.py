"""KV cache outside the engine: moved from a prefill server to a decode server, or kept in a slower tier and loaded back.

vLLM's KV connectors save a request's KV blocks somewhere and load them into another engine (prefill/decode
disaggregation) or into the same engine later (offload tiers). The one that runs on every device without extra
packages is ``ExampleConnector``: one safetensors file per layer per prompt, in a folder named by the hash of the
prompt's tokens. It moves whole blocks only, so what a server loads is predictable to the token::

    cfg = fleet.kvstore.example_connector("kv_producer", store)     # --kv-transfer-config for the prefill server
    fleet.kvstore.injected_tokens(prompt_tokens, block_size)        # tokens the decode server loads, not computes
    fleet.kvstore.usage(store)                                      # prompts, files and bytes on disk
    fleet.kvstore.tiered_ttft(hit_rate, load_s, recompute_s, miss_overhead_s)   # a tier's expected TTFT

On GPUs the production connectors are NIXL (GPU to GPU over NVLink/RDMA) and LMCache (CPU DRAM, disk, object
storage); :func:`helpers.sizing.parallel.transfer_time` predicts their transfer time per link.

Introduced in lab 20 (Disaggregating Prefill and Decode).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["example_connector", "injected_tokens", "stored_tokens", "usage", "empty", "start_pd", "tiered_ttft",
           "break_even_hit_rate"]

ROLES = ("kv_producer", "kv_consumer", "kv_both")


def example_connector(role: str, path: str | os.PathLike) -> dict[str, Any]:
    """``--kv-transfer-config`` for vLLM's ExampleConnector with its store at ``path``: ``kv_producer`` saves every
    prompt's KV, ``kv_consumer`` loads it when the prompt's folder exists, ``kv_both`` does both (a disk tier).

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    if role not in ROLES:
        raise ValueError(f"kv_role {role!r}: one of {', '.join(ROLES)}")
    Path(path).mkdir(parents=True, exist_ok=True)
    return {"kv_connector": "ExampleConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(Path(path).resolve())}}


def stored_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens of a ``prompt_tokens``-token prompt that ExampleConnector saves: whole blocks of all but the last token.

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    return max(0, (prompt_tokens - 1) // block_size * block_size)


def injected_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens a consumer loads instead of computing: whole blocks of the prompt less its last two tokens (the last
    one is always computed, to produce the first output token; vLLM 0.32's ExampleConnector aligns ``n - 1``).

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    return max(0, (prompt_tokens - 2) // block_size * block_size)


def usage(path: str | os.PathLike) -> dict[str, int]:
    """What a store holds: ``prompts`` (folders), ``files`` (one per layer per prompt) and ``bytes``.

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    root = Path(path)
    folders = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    files = [f for d in folders for f in d.glob("*.safetensors")]
    return {"prompts": len(folders), "files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def empty(path: str | os.PathLike) -> dict[str, int]:
    """Delete every prompt's folder from a store, keeping the store itself (the servers go on writing to it); returns
    what it held (:func:`usage`). A lab that measures one length at a time never holds more than that length's KV.

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    held = usage(path)
    root = Path(path)
    for d in (d for d in root.iterdir() if d.is_dir()) if root.is_dir() else ():
        shutil.rmtree(d)
    return held


def start_pd(profile: Any, store: str | os.PathLike, **engine_overrides: Any) -> tuple[Any, Any]:
    """A prefill server (``kv_producer``) and a decode server (``kv_consumer``) sharing ``store``, each on its half
    of the device (a core set or a card), started together. Returns ``(prefill, decode)``.

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    from .replicas import start_replica, stop_replicas

    roles = ("kv_producer", "kv_consumer")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(start_replica, profile, i, 2, progress=False,
                               kv_transfer_config=example_connector(role, store), **engine_overrides)
                   for i, role in enumerate(roles)]
        done, errors = [], []
        for f in futures:
            try:
                done.append(f.result())
            except Exception as exc:  # noqa: BLE001 - both are reported below
                errors.append(exc)
    if errors:
        stop_replicas(done)
        raise RuntimeError(f"the prefill/decode pair did not start: {errors[0]}") from errors[0]
    return done[0], done[1]


def tiered_ttft(hit_rate: float, load_s: float, recompute_s: float, miss_overhead_s: float = 0.0) -> float:
    """Expected TTFT with a KV tier: a hit loads (``load_s``), a miss recomputes and pays the tier's overhead
    (looking it up, saving the new KV).

    Introduced in lab 21 (KV Offload and Tiers).
    """
    if not 0.0 <= hit_rate <= 1.0:
        raise ValueError("hit_rate must lie in [0, 1]")
    return hit_rate * load_s + (1.0 - hit_rate) * (recompute_s + miss_overhead_s)


def break_even_hit_rate(load_s: float, recompute_s: float, miss_overhead_s: float = 0.0) -> float | None:
    """The hit rate above which the tier lowers mean TTFT: ``overhead / (recompute − load + overhead)``; ``None``
    when loading is no faster than recomputing (no hit rate pays for the hop).

    Introduced in lab 21 (KV Offload and Tiers).
    """
    gain = recompute_s - load_s
    if gain <= 0:
        return None
    return max(0.0, miss_overhead_s) / (gain + max(0.0, miss_overhead_s))
