"""What splitting a model or moving its KV cache costs on a link: all-reduce, KV transfer, the pipeline bubble.

The alpha-beta model of a collective: a ring all-reduce of ``S`` bytes over ``n`` ranks moves ``2 (n-1)/n x S``
bytes through each rank's link and takes ``2 (n-1)`` latency-bound steps::

    t = 2 (n-1) / n * S / bandwidth  +  2 (n-1) * latency

Tensor parallelism does two all-reduces per transformer layer (after attention's output projection and after the
MLP), each of ``tokens x hidden`` activations, on every forward step. Pipeline parallelism sends one activation
tensor between stages instead, and pays a bubble: with ``p`` stages and ``m`` micro-batches, ``(p-1)/(m+p-1)`` of
the time each stage idles. Prefill/decode disaggregation moves a prompt's KV cache once.

Link figures are per GPU, per direction, as datasheets give them (with the source); latencies are typical small-
message collective latencies, order of magnitude only. :func:`measure_allreduce` measures the link this machine
actually has (processes on its cores) and fits the same two numbers.

Introduced in lab 18 (Tensor and Pipeline Parallel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .config import ModelConfig, dtype_bytes, load_config
from .kv import kv_bytes_for_context

__all__ = ["Link", "LINKS", "allreduce_time", "tp_comm_per_step", "pp_bubble", "transfer_time",
           "measure_allreduce", "fit_link"]

GB = 1e9


@dataclass(frozen=True)
class Link:
    """A link between devices: bandwidth per device per direction (bytes/s) and per-step latency (s).

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """

    name: str
    bandwidth: float
    latency: float
    source: str = ""
    measured: bool = False


LINKS: dict[str, Link] = {
    "nvlink4": Link("NVLink 4 (H100/H200 SXM)", 450 * GB, 5e-6, "NVIDIA H100 datasheet: 900 GB/s bidirectional"),
    "nvlink5": Link("NVLink 5 (B200)", 900 * GB, 5e-6, "NVIDIA B200 datasheet: 1.8 TB/s bidirectional"),
    "nvlink3": Link("NVLink 3 (A100 SXM)", 300 * GB, 5e-6, "NVIDIA A100 datasheet: 600 GB/s bidirectional"),
    "pcie4": Link("PCIe 4.0 x16", 32 * GB, 10e-6, "PCI-SIG: 16 GT/s x16 ~ 32 GB/s per direction"),
    "pcie5": Link("PCIe 5.0 x16", 64 * GB, 10e-6, "PCI-SIG: 32 GT/s x16 ~ 64 GB/s per direction"),
    "ib_ndr": Link("InfiniBand NDR (400 Gb/s)", 50 * GB, 5e-6, "one 400 Gb/s NIC per GPU"),
    "ethernet_100g": Link("Ethernet 100 Gb/s", 12.5 * GB, 20e-6, "one 100 Gb/s NIC"),
    # Tiers below the KV cache (lab 21): where a GPU's evicted KV can live, and what reading it back costs.
    "nvme_gen4": Link("local NVMe SSD (PCIe 4)", 7 * GB, 100e-6, "Samsung 990 PRO datasheet: 7,450 MB/s sequential read"),
    "object_store": Link("object storage (25 Gb/s NIC)", 3.1 * GB, 30e-3,
                         "a 25 GbE NIC; S3-class first-byte latency is typically tens of ms"),
}


def allreduce_time(nbytes: float, ranks: int, link: Link) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``ranks`` ranks on ``link`` (0 for one rank).

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    if ranks < 1 or nbytes < 0:
        raise ValueError("ranks must be >= 1 and nbytes >= 0")
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / link.bandwidth + 2 * (ranks - 1) * link.latency


def tp_comm_per_step(cfg: "ModelConfig | Mapping[str, Any] | str", tokens: int, tp: int, link: Link,
                     dtype: str | None = None) -> float:
    """Seconds of all-reduce per forward step of ``tokens`` tokens (a decode batch, or a prefill's length) at
    tensor-parallel size ``tp``: two all-reduces of ``tokens x hidden`` activations per layer.

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    cfg = load_config(cfg) if not isinstance(cfg, ModelConfig) else cfg
    size = tokens * cfg.hidden * dtype_bytes(dtype or cfg.dtype)
    return 2 * cfg.layers * allreduce_time(size, tp, link)


def pp_bubble(stages: int, microbatches: int) -> float:
    """The share of time a pipeline stage idles: ``(p - 1) / (m + p - 1)``.

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    if stages < 1 or microbatches < 1:
        raise ValueError("stages and microbatches must be >= 1")
    return (stages - 1) / (microbatches + stages - 1)


def transfer_time(cfg: "ModelConfig | Mapping[str, Any] | str", tokens: int, link: Link,
                  kv_dtype: str = "auto") -> float:
    """Seconds to move the KV cache of a ``tokens``-token prompt over ``link`` (one transfer, plus its latency).

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    return kv_bytes_for_context(cfg, tokens, kv_dtype) / link.bandwidth + link.latency


_WORKER = r"""
import json, os, sys, time
import torch, torch.distributed as dist
rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sizes = json.loads(sys.argv[5]); reps = int(sys.argv[6]); cores = json.loads(sys.argv[7])
if cores:
    os.sched_setaffinity(0, cores[rank])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
xs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in sizes]
for x in xs:
    for _ in range(3):
        dist.all_reduce(x)
best = [float("inf")] * len(xs)
for _ in range(reps):  # sizes interleaved: a slow spell of the machine hits every size alike
    for i, x in enumerate(xs):
        dist.barrier()
        t0 = time.perf_counter(); dist.all_reduce(x); best[i] = min(best[i], time.perf_counter() - t0)
rows = [{"bytes": x.numel() * 4, "seconds": b} for x, b in zip(xs, best)]
if rank == 0:
    open(out, "w").write(json.dumps(rows))
dist.destroy_process_group()
"""


def measure_allreduce(sizes: Sequence[int] = (4096, 65536, 1 << 20, 4 << 20), ranks: int = 2, reps: int = 200,
                      bind_cores: bool = True, timeout: float = 120.0) -> list[dict[str, float]]:
    """Time a float32 all-reduce of each size (bytes) between ``ranks`` processes on this machine (torch's gloo
    backend over loopback, each process on its own core when ``bind_cores``): the fastest of ``reps`` rounds, each
    round timing every size once after a barrier, so that a slow spell of the machine cannot take one size's every
    sample. On this 2-core VM the same 4 KiB all-reduce's fastest of 20 back-to-back samples ranged from 0.2 to 5 ms
    between runs (waking the other vCPU through loopback TCP); the fastest of 200 interleaved rounds stayed within
    0.20-0.26 ms over six runs, and the whole measurement takes a few seconds.

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    from .. import procs

    cpus = sorted(os.sched_getaffinity(0))
    if ranks > len(cpus):
        raise ValueError(f"{ranks} ranks need {ranks} cores; this process may use {len(cpus)}")
    cores = [[cpus[i]] for i in range(ranks)] if bind_cores else []
    port = procs.free_port()
    with tempfile.TemporaryDirectory(prefix="allreduce-") as d:
        out = os.path.join(d, "out.json")
        args = [str(port), out, json.dumps(list(sizes)), str(reps), json.dumps(cores)]
        workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), str(ranks), *args],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for r in range(ranks)]
        try:
            logs = [w.communicate(timeout=timeout)[0] for w in workers]
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
        if any(w.returncode for w in workers) or not os.path.exists(out):
            raise RuntimeError("the all-reduce benchmark failed:\n" + "\n".join(l[-800:] for l in logs))
        with open(out) as f:
            return json.load(f)


def fit_link(rows: Sequence[Mapping[str, float]], ranks: int = 2, name: str = "this machine (measured)") -> Link:
    """The :class:`Link` whose alpha-beta all-reduce time best fits measured ``rows`` (``bytes``, ``seconds``).

    Least squares on the *relative* error: the sizes span decades, and a plain fit lets the largest message carry
    the line and misses the small ones by half (measured here: 4 KiB at 309 µs fitted at 136 µs, because a 4 MiB
    all-reduce took 6x a 1 MiB one); decode's all-reduces are the small ones.

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    import numpy as np

    if len(rows) < 2:
        raise ValueError("fit_link needs at least two sizes")
    x = np.array([2 * (ranks - 1) / ranks * r["bytes"] for r in rows], dtype=float)
    y = np.array([r["seconds"] for r in rows], dtype=float)
    if (y <= 0).any():
        raise ValueError(f"fit_link needs positive times; got {y.tolist()}")
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    bandwidth = 1.0 / slope if slope > 0 else float("inf")
    latency = max(intercept, 0.0) / (2 * (ranks - 1))
    return Link(name, bandwidth, latency, "measured: torch.distributed gloo all-reduce", measured=True)
