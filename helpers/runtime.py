"""Which machine a lab runs on, and the profile it runs with.

A *profile* fixes what differs between a CPU-only CI runner, a Colab T4 and an H200: the model,
its dtype, the context length, the memory knobs and how much load a lab may generate. Every lab
reads one in its parameters cell::

    PROFILE = runtime.profile()          # detected; LABS_PROFILE=h100 overrides

so the same notebook runs in CI on CPU and on a learner's GPU.
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

__all__ = [
    "GPU",
    "Machine",
    "Profile",
    "PROFILES",
    "detect",
    "profile",
    "quick",
    "choose_profile",
]


@dataclass(frozen=True)
class GPU:
    """One NVIDIA GPU as ``nvidia-smi`` reports it."""

    name: str
    memory_gib: float
    compute_capability: tuple[int, int]

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

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def describe(self) -> str:
        where = "Colab" if self.is_colab else platform.node() or "this machine"
        if self.gpus:
            g = self.gpus[0]
            cc = ".".join(map(str, g.compute_capability))
            gpu = f"{len(self.gpus)} x {g.name} ({g.memory_gib:.0f} GiB, compute capability {cc})"
        else:
            gpu = "no NVIDIA GPU"
        return f"{where}: {gpu}, {self.cpu_count} CPU cores, {self.memory_gib:.0f} GiB RAM"


def _nvidia_gpus() -> tuple[GPU, ...]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    return tuple(parse_nvidia_smi(out))


def parse_nvidia_smi(csv_text: str) -> list[GPU]:
    """Parse ``nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits``."""
    gpus = []
    for line in csv_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        name, mem_mib, cc = parts[0], parts[1], parts[2]
        major, _, minor = cc.partition(".")
        gpus.append(GPU(name=name, memory_gib=float(mem_mib) / 1024,
                        compute_capability=(int(major), int(minor or 0))))
    return gpus


def _memory_gib() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except Exception:  # pragma: no cover - psutil is a dependency
        return float("nan")


def detect() -> Machine:
    """Detect Colab, the NVIDIA GPUs (name, memory, compute capability) and the CPU.

    Introduced in lab 01 (One GPU, One Model).
    """
    return Machine(
        is_colab="google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
        gpus=_nvidia_gpus(),
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        memory_gib=_memory_gib(),
    )


@dataclass(frozen=True)
class Profile:
    """Everything that differs between machines, in one place.

    ``model`` is ``"default"`` (the embedded SmolLM2-135M-Instruct, see :mod:`helpers.models`), a local
    path, or a Hugging Face id. ``engine_args`` are vLLM engine arguments (``max_model_len=2048`` becomes
    ``--max-model-len 2048``); ``env`` is set in the server's environment. ``why`` says, for a lab to
    print, why each choice was made.

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
    # How much load a lab may generate: a multiplier on request counts and rates (CPU = 1).
    load_scale: float = 1.0
    # Long-context sizing (the Sizing Sheet): the context a GPU profile sizes for.
    sizing_context: int = 8192

    def server_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Arguments for :func:`helpers.server.start`: model, name, dtype, max_model_len, knobs and env."""
        args = {"dtype": self.dtype, "max_model_len": self.max_model_len, **self.engine_args}
        env = dict(self.env)
        env.update(overrides.pop("env", {}) or {})
        args.update(overrides)
        return {"model": self.model, "served_model_name": self.served_model_name, "engine_args": args, "env": env}

    def replace(self, **changes: Any) -> "Profile":
        return dataclasses.replace(self, **changes)


_CPU_WHY = (
    "CPU: the embedded SmolLM2-135M-Instruct in bf16. `optimization_level=0` skips torch.compile: measured "
    "here, a compiled start takes ~80 s every time (its cache never loads) against ~30 s, for ~10-20% faster "
    "decode; labs restart servers often, so start-up wins. VLLM_CPU_NUM_OF_RESERVED_CPU=0 lets the engine use "
    "every core (by default it leaves one to the API server). The KV cache gets a fixed 1 GiB "
    "(--kv-cache-memory-bytes), the CPU's stand-in for --gpu-memory-utilization; max_model_len is the model's "
    "full 8,192 tokens, so one server serves every lab up to the Sizing Sheet."
)
_GPU_WHY = (
    "{gpu}: {model} in {dtype}. CUDA graphs and torch.compile stay on (the default): on a GPU the compile "
    "cache loads on the second start and decode is markedly faster. --gpu-memory-utilization {util} leaves "
    "the rest of the card to the notebook's own tensors."
)

LLAMA_8B = "NousResearch/Meta-Llama-3.1-8B-Instruct"  # ungated copy of meta-llama/Llama-3.1-8B-Instruct


def _llama_8b(name: str, gpu: str, max_model_len: int, load_scale: float, util: float = 0.90) -> Profile:
    """A data-centre GPU profile: Llama-3.1-8B-Instruct in bf16; the Sizing Sheet runs at max_model_len."""
    return Profile(
        name=name, device="cuda", model=LLAMA_8B, served_model_name="llama-3.1-8b", dtype="bfloat16",
        max_model_len=max_model_len, engine_args={"gpu_memory_utilization": util}, env={},
        why=_GPU_WHY.format(gpu=gpu, model="Llama-3.1-8B-Instruct", dtype="bf16", util=util),
        load_scale=load_scale, sizing_context=max_model_len,
    )


PROFILES: dict[str, Profile] = {
    "cpu": Profile(
        name="cpu", device="cpu", model="default", served_model_name="smollm2", dtype="bfloat16",
        max_model_len=8192,
        engine_args={"optimization_level": 0, "kv_cache_memory_bytes": 2**30},
        env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        why=_CPU_WHY, load_scale=1.0, sizing_context=8192,
    ),
    "colab-t4": Profile(
        name="colab-t4", device="cuda", model="Qwen/Qwen2.5-1.5B-Instruct", served_model_name="qwen2.5-1.5b",
        dtype="float16", max_model_len=8192, engine_args={"gpu_memory_utilization": 0.85}, env={},
        why=_GPU_WHY.format(gpu="T4 (16 GB, compute capability 7.5, no bf16)", model="Qwen2.5-1.5B-Instruct",
                            dtype="fp16", util=0.85),
        load_scale=4.0, sizing_context=32768,
    ),
    "l4": _llama_8b("l4", "L4 (24 GB)", max_model_len=16384, load_scale=8.0),
    "a100": _llama_8b("a100", "A100 80GB", max_model_len=131072, load_scale=32.0),
    "h100": _llama_8b("h100", "H100 80GB", max_model_len=131072, load_scale=48.0),
    "h200": _llama_8b("h200", "H200 141GB", max_model_len=131072, load_scale=64.0),
    "b200": _llama_8b("b200", "B200 180GB", max_model_len=131072, load_scale=96.0),
}


def choose_profile(machine: Machine) -> str:
    """Map a machine to a profile name: the GPU's name decides, its memory breaks ties.

    Introduced in lab 01 (One GPU, One Model).
    """
    if not machine.gpus:
        return "cpu"
    g = machine.gpus[0]
    name = g.name.upper()
    for key, prof in (("B200", "b200"), ("B100", "b200"), ("H200", "h200"), ("H100", "h100"), ("H800", "h100"),
                      ("A100", "a100"), ("A800", "a100"), ("L4", "l4"), ("T4", "colab-t4")):
        if key in name:
            return prof
    # An unlisted GPU: pick by memory and capability, conservatively.
    if not g.supports_bf16 or g.memory_gib < 20:
        return "colab-t4"
    if g.memory_gib < 40:
        return "l4"
    return "a100"


def profile(name: str | None = None, machine: Machine | None = None) -> Profile:
    """The profile a lab runs with: ``name``, else ``$LABS_PROFILE``, else the detected machine's.

    A named GPU profile on a machine without a GPU is refused with a message (it would fail later,
    inside vLLM, with a worse one).

    Introduced in lab 01 (One GPU, One Model).
    """
    name = name or os.environ.get("LABS_PROFILE") or None
    machine = machine or detect()
    if name is None:
        name = choose_profile(machine)
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)} (or unset LABS_PROFILE)")
    prof = PROFILES[name]
    if prof.device == "cuda" and not machine.has_gpu:
        raise RuntimeError(
            f"profile {name!r} needs an NVIDIA GPU and this machine has none ({machine.describe()}). "
            "Use profile 'cpu' (unset LABS_PROFILE), or run on a GPU runtime (Colab: Runtime > Change runtime type)."
        )
    return prof


def quick() -> bool:
    """True when CI asks for CI-sized loads (``LABS_QUICK=1``, set by ``make test``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return os.environ.get("LABS_QUICK", "").lower() in {"1", "true", "yes"}


# ------------------------------------------------------------------------------------------ paths
COLAB_CLONE = "/content/llm-serving-labs"


def repo_root() -> "Path":
    """The labs' repository: ``$LABS_HOME``, else the checkout this package is installed from, else the
    working directory or one above it (a notebook runs in labs/), else the Colab clone.

    Introduced in lab 01 (One GPU, One Model).
    """
    from pathlib import Path

    if os.environ.get("LABS_HOME"):
        return Path(os.environ["LABS_HOME"])
    here = Path(__file__).resolve().parent.parent
    candidates = [here, Path.cwd(), Path.cwd().parent, Path(COLAB_CLONE)]
    for c in candidates:
        if (c / "labs").is_dir() and (c / "data").is_dir():
            return c
    raise FileNotFoundError(
        "cannot find the labs repository (a folder with labs/ and data/). Run from the repository, "
        "or set LABS_HOME to it."
    )


def data_dir() -> "Path":
    """``data/`` in the repository: prompts, configs and eval sets that the labs ship.

    Introduced in lab 01 (One GPU, One Model).
    """
    return repo_root() / "data"


def reports_dir() -> "Path":
    """Where phase artifacts go: ``$LABS_REPORTS``, else ``reports/`` in the repository (created).

    Introduced in lab 05 (Where the Time Goes).
    """
    from pathlib import Path

    d = Path(os.environ["LABS_REPORTS"]) if os.environ.get("LABS_REPORTS") else repo_root() / "reports"
    d.mkdir(parents=True, exist_ok=True)
    return d
