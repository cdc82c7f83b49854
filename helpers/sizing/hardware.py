"""Accelerators as roofline inputs: a catalog of datasheet figures, and probes for the machine you are on."""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["Hardware", "HARDWARE", "PRICE_ASSUMPTION", "hardware", "measure", "measure_cpu", "measure_gpu",
           "compute_flops"]

TB = 1e12  # datasheets count decimal terabytes and teraFLOPs

PRICE_ASSUMPTION = (
    "Hourly prices live in helpers.cost.PRICES (editable, dated assumptions, not quotes); a Hardware entry carries a "
    "price only when you give it one (Hardware(..., price_per_hour=...) or .with_price(...))."
)


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as the roofline sees it.

    ``memory_bandwidth`` in bytes/s; FLOP/s are DENSE tensor-core peaks (datasheets often print the
    2:4-sparsity figure, twice as large); ``None`` where the chip has no such format. ``fp16_flops``
    matters where there is no bf16 (T4). ``measured`` says whether the numbers came from a probe on
    this machine rather than a datasheet.

    Introduced in lab 05 (Where the Time Goes).
    """

    name: str
    memory_gib: float
    memory_bandwidth: float
    bf16_flops: float | None
    fp16_flops: float | None = None
    fp8_flops: float | None = None
    fp4_flops: float | None = None
    price_per_hour: float | None = None
    source: str = ""
    measured: bool = False
    fp32_flops: float | None = None

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def flops_for(self, dtype: str = "bf16") -> float:
        """Peak dense FLOP/s for matmuls whose inputs are ``dtype`` ("fp32", "bf16", "fp16", "fp8", "fp4").

        A format the chip lacks falls back to the best 16-bit rate (weights dequantized on the fly)."""
        table = {"bf16": self.bf16_flops, "fp16": self.fp16_flops or self.bf16_flops,
                 "fp8": self.fp8_flops, "fp4": self.fp4_flops, "fp32": self.fp32_flops}
        if dtype not in table:
            raise ValueError(f"compute dtype must be one of {', '.join(table)}, not {dtype!r}")
        value = table[dtype] or self.bf16_flops or self.fp16_flops or self.fp32_flops
        if not value:
            raise ValueError(f"{self.name} has no FLOP/s figure at all; measure it (measure_cpu/measure_gpu)")
        return float(value)

    def ridge_point(self, dtype: str = "bf16") -> float:
        """FLOPs per byte where compute time equals memory time: below it a kernel is memory-bound."""
        return self.flops_for(dtype) / self.memory_bandwidth

    def times(self, n: int) -> "Hardware":
        """``n`` of these cards as the roofline sees a tensor-parallel group: memory, bandwidth and every FLOP/s
        figure times ``n`` (the all-reduce between them is not in it: ``tp_comm_per_step`` adds it).

        Introduced in lab 24 (Putting It All Together).
        """
        if n < 1:
            raise ValueError(f"a group has at least one card, got {n}")
        flops = ("bf16_flops", "fp16_flops", "fp8_flops", "fp4_flops", "fp32_flops")
        return dataclasses.replace(self, name=self.name if n == 1 else f"{n} x {self.name}",
                                   memory_gib=self.memory_gib * n, memory_bandwidth=self.memory_bandwidth * n,
                                   **{k: getattr(self, k) * n for k in flops if getattr(self, k)})

    def with_price(self, price_per_hour: float) -> "Hardware":
        """A copy with another hourly price."""
        return dataclasses.replace(self, price_per_hour=float(price_per_hour))


# Datasheet figures (dense; the sparse figure each sheet prints is twice these). Memory as labelled
# ("80GB" is what CUDA reports as ~79.6 GiB on an H100).
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS* and
    # FP8 3,958 TFLOPS* "with sparsity".
    "h100": Hardware("NVIDIA H100 SXM 80GB", 80, 3.35 * TB, 989.5 * TB, 989.5 * TB, 1979 * TB, None, None,
                     "NVIDIA H100 datasheet (SXM5)"),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM: 141GB HBM3e, 4.8 TB/s; same compute as H100 SXM.
    "h200": Hardware("NVIDIA H200 SXM 141GB", 141, 4.8 * TB, 989.5 * TB, 989.5 * TB, 1979 * TB, None, None,
                     "NVIDIA H200 datasheet (SXM)"),
    # Not a datasheet: what one real H200 did (2026-12-04; ../shared/notes/h200-measured.md; driver 580.159.04, CUDA
    # 13.0, torch 2.11, medians of CUDA-graph replays). Bandwidth: the rate Llama-3.1-8B's decode matmuls read their
    # weights at batch 1 (3.47 TB/s; sizing.measure_gpu's copy benchmark read 4.06-4.13); bf16: measure_gpu's
    # 8192^3 matmul (743/769/775 TFLOP/s, 77% of the datasheet); fp8: torch._scaled_mm W8A8 at batch 1,024 (1,141
    # TFLOP/s, 58%). A prediction that uses it says so (its name and source); use it at efficiency=1.0.
    "h200-measured": Hardware("NVIDIA H200 SXM 141GB (measured rates)", 141, 3.47 * TB, 769 * TB, 769 * TB, 1141 * TB,
                              None, None, "measured on one H200, 2026-12-04: Llama-3.1-8B decode matmuls read at "
                              "3.47 TB/s (batch 1), bf16 matmul 769 TFLOP/s, FP8 W8A8 1,141 TFLOP/s "
                              "(shared/notes/h200-measured.md)", measured=True),
    # NVIDIA DGX/HGX B200 datasheets: 8 GPUs, 1,440GB HBM3e, 64 TB/s; FP8 72 PFLOPS and FP4 144 PFLOPS
    # with sparsity -> per GPU 180GB, 8 TB/s, FP8 4.5 PF, FP4 9 PF, BF16 2.25 PF dense.
    "b200": Hardware("NVIDIA B200 180GB", 180, 8.0 * TB, 2250 * TB, 2250 * TB, 4500 * TB, 9000 * TB, None,
                     "NVIDIA DGX B200 / HGX B200 datasheets (per GPU = 1/8)"),
    # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: HBM2e 2,039 GB/s; BF16 312 TFLOPS (624* sparse).
    "a100": Hardware("NVIDIA A100 SXM 80GB", 80, 2.039 * TB, 312 * TB, 312 * TB, None, None, None,
                     "NVIDIA A100 datasheet (80GB SXM)"),
    # NVIDIA L4 datasheet: 24GB GDDR6, 300 GB/s; BF16 242 TFLOPS*, FP8 485 TFLOPS* with sparsity.
    "l4": Hardware("NVIDIA L4 24GB", 24, 0.300 * TB, 121 * TB, 121 * TB, 242.5 * TB, None, None,
                   "NVIDIA L4 datasheet"),
    # NVIDIA T4 datasheet: 16GB GDDR6, 320 GB/s; mixed-precision FP16 65 TFLOPS (no bf16, no sparsity).
    "t4": Hardware("NVIDIA T4 16GB", 16, 0.320 * TB, None, 65 * TB, None, None, None,
                   "NVIDIA T4 datasheet"),
    # AWS's A10G (G5 instances): 24GB GDDR6, 600 GB/s like the A10, but fewer tensor FLOPs than the A10's
    # 125 TFLOPS; ~70 TFLOPS FP16/BF16 dense as Baseten's A10 vs A10G comparison lists it (AWS publishes none).
    "a10g": Hardware("NVIDIA A10G 24GB", 24, 0.600 * TB, 70 * TB, 70 * TB, None, None, None,
                     "AWS G5 / Baseten 'A10 vs A10G' (tensor figure not on a datasheet)"),
    # NVIDIA A100 datasheet, 40GB (SXM and PCIe): HBM2 1,555 GB/s; the same compute as the 80GB card (Colab's A100).
    "a100-40gb": Hardware("NVIDIA A100 40GB", 40, 1.555 * TB, 312 * TB, 312 * TB, None, None, None,
                          "NVIDIA A100 datasheet (40GB)"),
    # NVIDIA H100 datasheet, PCIe: 80GB HBM2e, 2.0 TB/s; BF16 1,513 TFLOPS* and FP8 3,026 TFLOPS* with sparsity (half dense).
    "h100-pcie": Hardware("NVIDIA H100 PCIe 80GB", 80, 2.0 * TB, 756.5 * TB, 756.5 * TB, 1513 * TB, None, None,
                          "NVIDIA H100 datasheet (PCIe)"),
    # NVIDIA L40S datasheet: 48GB GDDR6, 864 GB/s; BF16 733 TFLOPS* and FP8 1,466 TFLOPS* with sparsity.
    "l40s": Hardware("NVIDIA L40S 48GB", 48, 0.864 * TB, 362 * TB, 362 * TB, 733 * TB, None, None,
                     "NVIDIA L40S datasheet"),
    # NVIDIA Ada Lovelace whitepaper, RTX 4090: 24GB GDDR6X, 1,008 GB/s; FP16/BF16 tensor 82.6 TFLOPS with FP32
    # accumulate (what serving kernels use; 165 with FP16 accumulate), FP8 165.2 (FP32 accumulate).
    "rtx4090": Hardware("NVIDIA GeForce RTX 4090 24GB", 24, 1.008 * TB, 82.6 * TB, 82.6 * TB, 165.2 * TB, None, None,
                        "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090)"),
    # Not a datasheet: what measure_cpu() found on the 2-core CI machines (AMD EPYC, AVX2 only; 2026-12-01:
    # 16.8 GB/s copy bandwidth, 90 GFLOP/s fp32 matmul). helpers.plan sizes the CPU profile's runs with it;
    # every lab that needs this machine's figures measures them.
    "cpu": Hardware("2-core x86-64 CPU (nominal)", 24, 16.8e9, None, None, None, None, None,
                    "measured with measure_cpu() on a 2-core AMD EPYC CI machine", fp32_flops=90e9),
}


def hardware(name: str) -> Hardware:
    """A catalog entry by key (``"h100"``) or by a GPU name as CUDA reports it (``"NVIDIA H100 80GB HBM3"``).

    Introduced in lab 05 (Where the Time Goes).
    """
    key = name.lower().strip()
    if key in HARDWARE:
        return HARDWARE[key]
    from ..runtime import card_kind

    kind = card_kind(name)  # the most specific entry first: an A100-PCIE-40GB is not the 80 GB card
    if kind and kind[0] in HARDWARE:
        return HARDWARE[kind[0]]
    words = set(re.split(r"[^a-z0-9]+", key))  # "NVIDIA A100-SXM4-80GB" -> {"nvidia", "a100", "sxm4", "80gb"}
    for k in HARDWARE:
        if k in words:
            return HARDWARE[k]
    raise KeyError(f"no hardware called {name!r}; known: {', '.join(HARDWARE)} (or measure_cpu()/measure_gpu())")


# ------------------------------------------------------------------------------------ probes
def _best_time(fn: Callable[[], None], budget_s: float, min_reps: int = 2, sync: Callable[[], None] | None = None
               ) -> float:
    """Fastest of several timed runs of ``fn`` within about ``budget_s`` seconds (after one warm-up)."""
    fn()
    if sync:
        sync()
    best, start, reps = float("inf"), time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
        if reps >= 50:
            break
    return best


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def measure_cpu(seconds: float = 2.0, buffer_mib: int = 256, matmul_n: int = 2048,
                dtype: str = "float32") -> Hardware:
    """Measure this CPU's memory bandwidth and matmul FLOP/s in ``dtype``, in about ``seconds`` in all.

    (Plus torch's import, the first time.) ``dtype`` is the one the model is served in ("float32" or
    "bfloat16"): on a CPU without native bf16, bf16 matmuls are emulated and several times slower.

    Bandwidth: copy a ``buffer_mib`` MiB tensor (far larger than any cache) into another; bytes moved
    = 2 x its size (one read, one write; write-allocate traffic is not counted), best of several
    repeats. FLOP/s: ``2 * n**3`` per ``n x n`` matmul, best of several. Uses torch (all cores).

    Introduced in lab 05 (Where the Time Goes).
    """
    import torch

    budget = max(0.2, seconds / 2)
    nbytes = buffer_mib * 2**20
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src), budget)
    del src, dst
    dt = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(matmul_n, matmul_n).to(dt)
    b = torch.randn(matmul_n, matmul_n).to(dt)
    mm_s = _best_time(lambda: torch.mm(a, b), budget)
    flops = 2 * matmul_n**3 / mm_s
    try:
        import psutil

        mem = psutil.virtual_memory().total / 2**30
    except Exception:  # pragma: no cover
        mem = float("nan")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fp32 = dt == torch.float32
    return Hardware(name=f"{_cpu_name()} ({cores} cores)", memory_gib=round(mem, 1),
                    memory_bandwidth=2 * nbytes / copy_s, bf16_flops=None if fp32 else flops, fp16_flops=None,
                    price_per_hour=None, fp32_flops=flops if fp32 else None,
                    source=f"measure_cpu: {buffer_mib} MiB copy, {matmul_n}^3 {str(dt).split('.')[-1]} matmul",
                    measured=True)


def measure_gpu(device: int = 0, seconds: float = 2.0, buffer_mib: int = 1024, matmul_n: int = 8192) -> Hardware:
    """Measure a CUDA GPU's memory bandwidth and 16-bit matmul FLOP/s; its name and memory come from torch.

    Bytes moved per copy = 2 x the buffer (read + write). fp8/fp4 rates are not probed: they come from
    the catalog entry matching the GPU's name (``None`` if unknown); prices are in helpers.cost.

    Introduced in lab 05 (Where the Time Goes).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU is visible to torch: use measure_cpu() here, or run this on a GPU runtime")
    props = torch.cuda.get_device_properties(device)
    dev = torch.device("cuda", device)
    sync = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    budget = max(0.2, seconds / 2)
    nbytes = buffer_mib * 2**20
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=dev).fill_(1)
    dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src), budget, sync=sync)
    del src, dst
    dt = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    a = torch.randn(matmul_n, matmul_n, device=dev, dtype=dt)
    b = torch.randn(matmul_n, matmul_n, device=dev, dtype=dt)
    mm_s = _best_time(lambda: torch.mm(a, b), budget, sync=sync)
    flops = 2 * matmul_n**3 / mm_s
    del a, b
    try:
        ref = hardware(props.name)
    except KeyError:
        ref = None
    return Hardware(
        name=props.name, memory_gib=round(props.total_memory / 2**30, 1), memory_bandwidth=2 * nbytes / copy_s,
        bf16_flops=flops if dt == torch.bfloat16 else None, fp16_flops=flops,
        fp8_flops=ref.fp8_flops if ref else None, fp4_flops=ref.fp4_flops if ref else None,
        source=f"measure_gpu: {buffer_mib} MiB copy, {matmul_n}^3 {str(dt).split('.')[-1]} matmul"
               + (f"; fp8/fp4 from {ref.source}" if ref else ""),
        measured=True,
    )


def compute_flops(hw: Hardware, weight_dtype: str) -> tuple[str, float]:
    """(compute dtype, FLOP/s) a model with ``weight_dtype`` weights multiplies at on ``hw``.

    bf16/fp16 weights compute in 16 bits; fp8 (W8A8) on fp8 tensor cores where they exist; nvfp4/mxfp4
    on fp4 tensor cores where they exist; anything else (int8, int4, or a format the chip lacks) at the
    16-bit rate, as weight-only kernels dequantize to bf16.

    Introduced in lab 05 (Where the Time Goes).
    """
    want = {"fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "nvfp4": "fp4", "mxfp4": "fp4",
            "fp16": "fp16", "fp32": "fp32"}.get(weight_dtype, "bf16")
    if want == "fp32" and not hw.fp32_flops:
        want = "bf16"
    if want == "fp8" and not hw.fp8_flops:
        want = "bf16"
    if want == "fp4" and not hw.fp4_flops:
        want = "bf16"  # e.g. MXFP4 on Hopper: dequantized to bf16 in the kernel (Marlin)
    if want == "bf16" and not hw.bf16_flops:
        want = "fp16" if (hw.fp16_flops or not hw.fp32_flops) else "fp32"
    return want, hw.flops_for(want)


def measure(device: str = "cpu", dtype: str = "float32", seconds: float = 2.0, buffer_mib: int | None = None
            ) -> Hardware:
    """Measure this machine (``measure_cpu`` or ``measure_gpu``) in a separate Python process, so the probe's
    tensors — gigabytes on a GPU — are freed before vLLM starts and claims its share of memory. ``buffer_mib``: the
    copied buffer (each probe's default when ``None``; 256 MiB still dwarfs any cache, and fits beside a running
    server on a 16 GB card).

    Introduced in lab 05 (Where the Time Goes).
    """
    import json
    import subprocess
    import sys

    buf = "" if buffer_mib is None else f", buffer_mib={int(buffer_mib)}"
    code = ("import json, dataclasses; from helpers.sizing.hardware import measure_cpu, measure_gpu; "
            f"hw = measure_gpu(seconds={seconds!r}{buf}) if {device!r} == 'cuda' else "
            f"measure_cpu(seconds={seconds!r}, dtype={dtype!r}{buf}); print(json.dumps(dataclasses.asdict(hw)))")
    from .. import settings

    probe = settings.gpu_probe() if device == "cuda" else None
    cmd = [sys.executable, "-m", probe] if probe else [sys.executable, "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"measuring the {device} failed:\n{out.stderr[-1500:]}")
    return Hardware(**json.loads(out.stdout.strip().splitlines()[-1]))
