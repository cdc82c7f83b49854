"""Which machine a lab runs on, and the profile it runs with.

A *profile* fixes what differs between a CPU-only CI runner, a Colab T4 and an H200: the model, its dtype,
the context length, the memory knob and how much load a lab may generate. Every lab reads one in its
parameters cell::

    PROFILE = runtime.profile()          # detected; LABS_PROFILE=h100 overrides

Everything else a device decides — block size, number of KV blocks, the scheduler's token budget — a lab reads
from the live server, and the device-dependent sizes it uses come from :mod:`helpers.plan`, which a test
evaluates for every profile. So the same notebook runs in CI on CPU and on a learner's GPU.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from . import settings

__all__ = [
    "GPU", "Machine", "Profile", "WorkerMemory", "resolve_engine_args", "PROFILES", "detect", "profile", "choose_profile", "cpu_profile",
    "parse_nvidia_smi", "parse_cpuinfo", "CARDS", "card_kind",
]


@dataclass(frozen=True)
class GPU:
    """One NVIDIA GPU as ``nvidia-smi`` reports it.

    Introduced in lab 01 (One GPU, One Model).
    """

    name: str
    memory_gib: float
    compute_capability: tuple[int, int]
    driver: str | None = None

    @property
    def supports_bf16(self) -> bool:
        """bf16 needs compute capability 8.0 (Ampere) or newer; a T4 is 7.5."""
        return self.compute_capability >= (8, 0)

    @property
    def supports_fp8(self) -> bool:
        """FP8 tensor cores arrive with Ada (8.9) and Hopper (9.0)."""
        return self.compute_capability >= (8, 9)

    @property
    def supports_fp4(self) -> bool:
        """FP4 (NVFP4/MXFP4) tensor cores arrive with Blackwell (10.0)."""
        return self.compute_capability >= (10, 0)


#: The CPU instructions that decide how the CPU profile runs (``/proc/cpuinfo`` flag names).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class Machine:
    """What this lab is running on.

    Introduced in lab 01 (One GPU, One Model).
    """

    is_colab: bool
    gpus: tuple[GPU, ...]
    cpu_count: int
    memory_gib: float
    python: str = field(default_factory=lambda: platform.python_version())
    cpu_name: str = ""
    cpu_flags: frozenset[str] = frozenset()
    node_memory_gib: float | None = None  # NUMA node 0's memory, which vLLM's CPU backend sizes from

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def native_bf16(self) -> bool:
        """True when the CPU computes bf16 in hardware (AMX or AVX512-BF16); elsewhere PyTorch emulates it."""
        return bool({"amx_bf16", "avx512_bf16"} & self.cpu_flags)

    def describe(self) -> str:
        where = "Colab" if self.is_colab else platform.node() or "this machine"
        if self.gpus:
            g = self.gpus[0]
            cc = ".".join(map(str, g.compute_capability))
            gpu = f"{len(self.gpus)} x {g.name} ({g.memory_gib:.0f} GiB, compute capability {cc})"
        else:
            flags = ", ".join(f for f in CPU_FLAGS if f in self.cpu_flags) or "no AVX2"
            gpu = f"no NVIDIA GPU; CPU {self.cpu_name or '?'} ({flags})"
        return f"{where}: {gpu}, {self.cpu_count} CPU cores, {self.memory_gib:.0f} GiB RAM"


def parse_nvidia_smi(csv_text: str) -> list[GPU]:
    """Parse ``nvidia-smi --query-gpu=name,memory.total,compute_cap[,driver_version] --format=csv,noheader,nounits``.

    Introduced in lab 01 (One GPU, One Model).
    """
    gpus = []
    for line in csv_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        name, mem_mib, cc = parts[0], parts[1], parts[2]
        major, _, minor = cc.partition(".")
        gpus.append(GPU(name=name, memory_gib=float(mem_mib) / 1024, compute_capability=(int(major), int(minor or 0)),
                        driver=parts[3] if len(parts) > 3 else None))
    return gpus


def _nvidia_gpus() -> tuple[GPU, ...]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total,compute_cap,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    return tuple(parse_nvidia_smi(out))


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The CPU's model name and which of :data:`CPU_FLAGS` it has, from ``/proc/cpuinfo``.

    Introduced in lab 01 (One GPU, One Model).
    """
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return name, frozenset(f for f in CPU_FLAGS if f in flags)


def _cpu() -> tuple[str, frozenset[str]]:
    try:
        with open("/proc/cpuinfo") as fh:
            return parse_cpuinfo(fh.read())
    except OSError:  # not Linux: no flags known, so the CPU profile stays on the safe float32
        return platform.processor(), frozenset()


def _memory_gib() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except Exception:  # pragma: no cover - psutil is a dependency
        return float("nan")


def _node_memory_gib() -> float | None:
    """NUMA node 0's MemTotal (``/sys/devices/system/node/node0/meminfo``): what vLLM's CPU backend takes as the
    machine's memory. It can be far less than the total (a VM here reports 8.7 of its 23 GiB in node 0)."""
    try:
        with open("/sys/devices/system/node/node0/meminfo") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    return int(parts[3]) * 1024 / 2**30
    except (OSError, ValueError):
        pass
    return None


def detect() -> Machine:
    """Detect Colab, the NVIDIA GPUs (name, memory, compute capability, driver), the CPU's instructions and memory.

    Introduced in lab 01 (One GPU, One Model).
    """
    name, flags = _cpu()
    return Machine(
        is_colab="google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
        gpus=_nvidia_gpus(),
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        memory_gib=_memory_gib(), cpu_name=name, cpu_flags=flags, node_memory_gib=_node_memory_gib(),
    )


@dataclass(frozen=True)
class WorkerMemory:
    """``gpu_memory_utilization`` on CPU, given as the GiB the worker should get rather than a share.

    vLLM's CPU backend reads ``--gpu-memory-utilization`` as a share of NUMA node 0's memory, and on some VMs that
    number moves while the machine runs (measured here: 8.7, then 10.6, then 12.0 GiB of a 23.5 GiB VM as memory was
    used). So the share is computed when a server starts (:meth:`share`), and a server's identity (for reuse) is
    the GiB asked for, not a share that drifts.

    Introduced in lab 01 (One GPU, One Model).
    """

    gib: float

    def share(self, node_gib: float | None = None) -> float:
        node = node_gib or _node_memory_gib() or _memory_gib()
        node = node if node == node else 16.0  # NaN: assume 16 GiB
        return round(min(0.9, self.gib / node), 3)

    def __str__(self) -> str:
        return f"{self.gib:g}GiB-of-node0"


def resolve_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments as vLLM takes them: a :class:`WorkerMemory` becomes today's utilization share.

    Introduced in lab 01 (One GPU, One Model).
    """
    return {k: (v.share() if isinstance(v, WorkerMemory) else v) for k, v in args.items()}


@dataclass(frozen=True)
class Profile:
    """Everything that differs between machines, in one place.

    ``model`` is a Hugging Face id (the CPU's is this project's cached SmolLM2, see :mod:`helpers.models`) or a
    local path. ``engine_args`` are vLLM engine arguments (``max_model_len=2048`` becomes ``--max-model-len
    2048``); ``env`` is set in the server's environment. ``gpu_memory_gib`` is the card's memory (``None`` on
    CPU); ``hardware`` names its entry in ``helpers.sizing.HARDWARE``. ``load_scale`` multiplies the rates a lab
    offers (CPU = 1). ``why`` says, for a lab to print, why each choice was made. What decides which formats vLLM
    serves (:mod:`helpers.support`): ``compute_capability`` (a GPU's), ``cpu_flags`` (of :data:`CPU_FLAGS`) and
    ``devices`` (GPUs, or CPU cores); :func:`profile` fits them to the machine it runs on.

    Introduced in lab 01 (One GPU, One Model).
    """

    name: str
    device: str
    model: str
    served_model_name: str
    dtype: str
    max_model_len: int
    engine_args: dict[str, Any]
    env: dict[str, str]
    why: str
    load_scale: float = 1.0
    sizing_context: int = 8192
    gpu_memory_gib: float | None = None
    hardware: str = "cpu"
    compute_capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = frozenset()
    devices: int = 1

    @property
    def utilization(self) -> float:
        """``gpu_memory_utilization``: of the card on a GPU, of RAM on CPU (vLLM's CPU backend reads it so too)."""
        value = self.engine_args.get("gpu_memory_utilization", 0.9)
        return value.share() if isinstance(value, WorkerMemory) else float(value)

    def replace(self, **changes: Any) -> "Profile":
        return dataclasses.replace(self, **changes)


#: What the CPU worker should get in all (weights, activations and KV cache), as a share of RAM: vLLM's CPU
#: backend gives the KV cache utilization x RAM minus what the worker already holds (~1-1.5 GiB here).
CPU_WORKER_GIB = 2.5

_CPU_WHY = (
    "CPU: SmolLM2-135M-Instruct (this project's offline copy, served by its hub id with HF_HUB_OFFLINE=1, as a GPU "
    "serves Llama) in {dtype}: {dtype_why} `optimization_level=0` skips torch.compile: measured here, a compiled "
    "start takes ~80 s every time (its cache never loads) against ~30-45 s, for ~10-20% faster decode; labs "
    "restart servers often, so start-up wins. VLLM_ENABLE_V1_MULTIPROCESSING=0 lets vLLM's CPU platform keep "
    "the worker in the engine core's process, as on a single GPU (it otherwise forces a third process, which "
    "imports vLLM again: measured on a 2-core EPYC, a start took 38 s against 59 s, decode unchanged); a "
    "tensor-parallel server still gets one worker process per rank, where VLLM_CPU_NUM_OF_RESERVED_CPU=0 lets them "
    "use every core. "
    "--gpu-memory-utilization asks for {worker:.1f} GiB for the worker ({util} of the {ram:.1f} GiB vLLM sees in NUMA "
    "node 0 now; the share is computed at each start, as that figure moves on some VMs): on CPU vLLM reads the flag as "
    "a share of RAM and gives the KV cache what the weights and activations leave, as on a GPU. max_model_len is the model's full 8,192 tokens."
)
_GPU_WHY = (
    "{gpu}: {model} in {dtype}. CUDA graphs and torch.compile stay on (the default): on a GPU the compile "
    "cache loads on the second start and decode is markedly faster. --gpu-memory-utilization {util} leaves "
    "the rest of the card to the notebook's own tensors."
)

LLAMA_8B = "NousResearch/Meta-Llama-3.1-8B-Instruct"  # ungated copy of meta-llama/Llama-3.1-8B-Instruct
QWEN_1_5B = "Qwen/Qwen2.5-1.5B-Instruct"


def _scheduler(budget: int, seqs: int) -> dict[str, int]:
    """The scheduler's token budget and sequence cap, passed explicitly: vLLM's defaults differ by device (CPU
    2048/128; GPUs under 70 GiB 2048/256; H100/H200 8192/1024; B200 16384/1024), and labs predict from them."""
    return {"max_num_batched_tokens": budget, "max_num_seqs": seqs}


def _llama_8b(name: str, gpu: str, memory_gib: float, max_model_len: int, load_scale: float, cc: tuple[int, int],
              util: float = 0.90, budget: int = 8192, seqs: int = 1024) -> Profile:
    """A data-centre GPU profile: Llama-3.1-8B-Instruct in bf16; the Sizing Sheet runs at max_model_len."""
    return Profile(
        name=name, device="cuda", model=LLAMA_8B, served_model_name="llama-3.1-8b", dtype="bfloat16",
        max_model_len=max_model_len, engine_args={"gpu_memory_utilization": util, **_scheduler(budget, seqs)}, env={},
        why=_GPU_WHY.format(gpu=gpu, model="Llama-3.1-8B-Instruct", dtype="bf16", util=util),
        load_scale=load_scale, sizing_context=max_model_len, gpu_memory_gib=memory_gib, hardware=name,
        compute_capability=cc,
    )


def cpu_profile(machine: Machine | None = None) -> Profile:
    """The CPU profile fitted to ``machine``: bf16 where the CPU computes it natively (AMX, AVX512-BF16), else
    float32; the worker's share of RAM set so the KV cache gets about a gibibyte.

    Measured with vLLM 0.32 on a 2-core Xeon with AVX-512 but no native bf16: bf16 decoded 24 tokens/s at
    concurrency 1 and 86 at 16, float32 14.5 and 183 (bf16 halves the bytes read but is emulated in compute); on a
    2-core AMD EPYC with AVX2 only, a 2,048-token prefill took 28 s in bf16 and 8.6 s in float32.

    Introduced in lab 01 (One GPU, One Model).
    """
    machine = machine or detect()
    forced = settings.cpu_dtype()
    if forced:
        dtype, dtype_why = forced, f"forced by LABS_CPU_DTYPE={forced}."
    elif machine.native_bf16:
        dtype, dtype_why = "bfloat16", ("this CPU computes bf16 natively (" + ", ".join(
            sorted({"amx_bf16", "avx512_bf16"} & machine.cpu_flags)) + "), and bf16 halves the bytes read per token.")
    else:
        dtype, dtype_why = "float32", ("this CPU has no native bf16 (no AMX, no AVX512-BF16), so bf16 would be "
                                       "emulated: float32 reads twice the bytes but computes at full speed.")
    ram = machine.node_memory_gib or machine.memory_gib
    ram = ram if ram == ram else 16.0  # NaN: assume 16 GiB
    worker = WorkerMemory(CPU_WORKER_GIB)
    util = worker.share(ram)
    return Profile(
        name="cpu", device="cpu", model="llm-serving-labs/smollm2-135m-instruct", served_model_name="smollm2",
        dtype=dtype, max_model_len=8192,
        engine_args={"optimization_level": 0, "gpu_memory_utilization": worker, **_scheduler(2048, 128)},
        env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        why=_CPU_WHY.format(dtype=dtype, dtype_why=dtype_why, util=util, worker=util * ram, ram=ram),
        load_scale=1.0, sizing_context=8192, gpu_memory_gib=None, hardware="cpu",
        cpu_flags=frozenset(machine.cpu_flags), devices=machine.cpu_count,
    )


_NOMINAL_CPU = Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_name="nominal 2-core x86-64",
                       cpu_flags=frozenset({"avx2"}))

PROFILES: dict[str, Profile] = {
    # The CPU entry is for a nominal 2-core, 24 GiB machine without native bf16; profile() fits it to the real one.
    "cpu": cpu_profile(_NOMINAL_CPU),
    "colab-t4": Profile(
        name="colab-t4", device="cuda", model=QWEN_1_5B, served_model_name="qwen2.5-1.5b",
        dtype="float16", max_model_len=8192, engine_args={"gpu_memory_utilization": 0.85, **_scheduler(2048, 256)},
        env={},
        why=_GPU_WHY.format(gpu="T4 (16 GB, compute capability 7.5, no bf16)", model="Qwen2.5-1.5B-Instruct",
                            dtype="fp16", util=0.85),
        load_scale=4.0, sizing_context=32768, gpu_memory_gib=15.0, hardware="t4", compute_capability=(7, 5),
    ),
    "l4": _llama_8b("l4", "L4 (24 GB)", 22.5, max_model_len=16384, load_scale=8.0, cc=(8, 9), budget=2048, seqs=256),
    "a100": _llama_8b("a100", "A100 80GB", 80.0, max_model_len=131072, load_scale=32.0, cc=(8, 0), budget=2048,
                      seqs=256),
    "h100": _llama_8b("h100", "H100 80GB", 79.6, max_model_len=131072, load_scale=48.0, cc=(9, 0)),
    "h200": _llama_8b("h200", "H200 141GB", 140.4, max_model_len=131072, load_scale=64.0, cc=(9, 0)),
    "b200": _llama_8b("b200", "B200 180GB", 178.4, max_model_len=131072, load_scale=96.0, cc=(10, 0), budget=16384),
}


#: Cards by the words of their name as ``nvidia-smi`` prints it (split at anything but letters and digits), the
#: most specific first: (words that must all appear, the most memory in GiB, their ``helpers.sizing.HARDWARE`` key,
#: the profile they run). A card not listed gets the profile its memory and capability allow, and no catalog entry of
#: its own (the plans then use the profile's card for speeds, its own memory for fits).
CARDS: tuple[tuple[frozenset[str], float, str, str], ...] = tuple((frozenset(w.split()), mem, key, prof) for w, mem, key, prof in (
    ("B200", 1e9, "b200", "b200"), ("B100", 1e9, "b200", "b200"),
    ("H200", 1e9, "h200", "h200"),
    ("H100 PCIE", 1e9, "h100-pcie", "h100"), ("H100", 1e9, "h100", "h100"), ("H800", 1e9, "h100", "h100"),
    ("A100", 60.0, "a100-40gb", "a100"), ("A100", 1e9, "a100", "a100"), ("A800", 1e9, "a100", "a100"),
    ("L40S", 1e9, "l40s", "a100"), ("L4", 1e9, "l4", "l4"), ("A10G", 1e9, "a10g", "l4"),
    ("RTX 4090", 1e9, "rtx4090", "l4"), ("T4", 1e9, "t4", "colab-t4"),
))


def card_kind(name: str, memory_gib: float | None = None) -> tuple[str, str] | None:
    """(``helpers.sizing.HARDWARE`` key, profile) of a card by its ``nvidia-smi`` name (and memory, which tells an
    A100 40GB from an 80GB one), or ``None`` for a card this project has no entry for.

    Introduced in lab 01 (One GPU, One Model).
    """
    import re

    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    for need, most, key, prof in CARDS:
        if not need <= words:
            continue
        if memory_gib is not None and memory_gib > most:
            continue
        if memory_gib is None and most < 1e9 and "40GB" not in words:
            continue  # a memory-bounded row (A100 40GB) needs the memory, or the size in the name
        return key, prof
    return None


def choose_profile(machine: Machine) -> str:
    """Map a machine to a profile name: the GPU's name decides (:data:`CARDS`), its memory breaks ties.

    Introduced in lab 01 (One GPU, One Model).
    """
    if not machine.gpus:
        return "cpu"
    g = machine.gpus[0]
    kind = card_kind(g.name, g.memory_gib)
    if kind:
        return kind[1]
    # An unlisted GPU: pick by memory and capability, conservatively.
    if not g.supports_bf16 or g.memory_gib < 20:
        return "colab-t4"
    if g.memory_gib < 40:
        return "l4"
    return "a100"


def profile(name: str | None = None, machine: Machine | None = None) -> Profile:
    """The profile a lab runs with: ``name``, else ``$LABS_PROFILE``, else the detected machine's.

    The CPU profile is fitted to the machine (:func:`cpu_profile`). A named GPU profile on a machine without a GPU
    is refused with a message (it would fail later, inside vLLM, with a worse one).

    Introduced in lab 01 (One GPU, One Model).
    """
    name = name or settings.profile_name()
    machine = machine or detect()
    if name is None:
        name = choose_profile(machine)
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)} (or unset LABS_PROFILE)")
    prof = PROFILES[name]
    if prof.device == "cuda" and not machine.has_gpu:
        raise RuntimeError(
            f"profile {name!r} needs an NVIDIA GPU and this machine has none ({machine.describe()}). "
            "Use profile 'cpu' (unset LABS_PROFILE), or run on a GPU runtime (Colab: Runtime > Change runtime type).")
    if prof.device == "cpu":
        return cpu_profile(machine)
    # The card's own capability, count and memory (an A100 40GB runs the a100 profile planned on 40 GB, an RTX 3090
    # the l4 profile without the L4's FP8 tensor cores), and its own catalog entry where it has one (speeds, prices).
    g = machine.gpus[0]
    kind = card_kind(g.name, g.memory_gib)
    return prof.replace(compute_capability=g.compute_capability, devices=len(machine.gpus), gpu_memory_gib=g.memory_gib,
                        hardware=kind[0] if kind else prof.hardware)
