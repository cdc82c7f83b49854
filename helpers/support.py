"""What vLLM 0.32 serves on which device: one table, for the plans and for the checks before a server starts.

Every format a lab asks a server for — a quantized checkpoint's weights, a KV-cache dtype, a speculative method, a
KV connector, a tensor-parallel size — is looked up here, for a :class:`Device`: a profile's nominal one (so
``python -m helpers.plan PROFILE`` answers for a T4 or a B200 on a machine without a GPU) or this machine's::

    support.lookup("kv_cache", "fp8", support.Device.of(PROFILE))
    # Support(name='fp8 KV cache', supported=False, native=False, why='T4 ... Triton ... requires SM89+ ...')

``supported``: vLLM serves it here. ``native``: it also computes in the format (FP8 weights on an A100 are served,
weight-only through vLLM's FP8 Marlin kernel: supported, not native). ``why`` says which kernel or backend, or what
fails and how, with where that was read or measured.

Sources: vLLM 0.32.0's Python source (the paths below are under ``vllm/`` of the installed package; its compiled
kernels are upstream vLLM's ``csrc``), PyPI ``vllm`` 0.32.0's requirements (``flashinfer-python==0.7.0.post1``, so a
GPU install has FlashInfer), and what was measured on this project's CPUs (``../shared/notes/vllm-cpu-findings.md``).

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

__all__ = ["Device", "Support", "lookup", "serves", "first_served", "attention_backend", "compute_dtype", "KINDS"]


@dataclass(frozen=True)
class Device:
    """What decides what vLLM serves: CPU or CUDA, a GPU's compute capability, the CPU's instructions, how many
    GPUs (or cores) one server may use.

    Introduced in lab 12 (FP8 as the Default).
    """

    kind: str
    compute_capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = frozenset()
    count: int = 1
    name: str = ""

    @classmethod
    def of(cls, profile: Any) -> "Device":
        """A :class:`helpers.runtime.Profile`'s device (fitted to this machine when it came from ``runtime.profile``)."""
        return cls(kind=profile.device, compute_capability=profile.compute_capability,
                   cpu_flags=frozenset(profile.cpu_flags), count=profile.devices, name=profile.hardware)

    @classmethod
    def of_machine(cls, machine: Any) -> "Device":
        """A :class:`helpers.runtime.Machine` (``runtime.detect()``): its first GPU, else its CPU."""
        if machine.gpus:
            g = machine.gpus[0]
            return cls("cuda", tuple(g.compute_capability), frozenset(machine.cpu_flags), len(machine.gpus), g.name)
        return cls("cpu", None, frozenset(machine.cpu_flags), machine.cpu_count, machine.cpu_name)

    @property
    def cc(self) -> tuple[int, int]:
        return self.compute_capability or (0, 0)

    def describe(self) -> str:
        if self.kind == "cuda":
            return f"{self.name or 'a GPU'} (compute capability {self.cc[0]}.{self.cc[1]})"
        flags = ", ".join(sorted(self.cpu_flags)) or "no AVX-512, no AMX"
        return f"{self.name or 'this CPU'} ({flags})"


@dataclass(frozen=True)
class Support:
    """One format on one device: served or not, computed natively or not, and why.

    Introduced in lab 12 (FP8 as the Default).
    """

    name: str
    kind: str
    supported: bool
    native: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.name}: {'served' if self.supported else 'NOT served'} here: {self.why}"


def _yes(name: str, kind: str, why: str, native: bool = True) -> Support:
    return Support(name, kind, True, native, why)


def _no(name: str, kind: str, why: str) -> Support:
    return Support(name, kind, False, False, why)


_AVX512 = {"avx512f", "amx_bf16", "amx_tile"}
#: Names of the weight formats (compressed-tensors checkpoints, or ``--quantization fp8``), as
#: :func:`helpers.quant.checkpoint_format` and the recipes name them.
_WEIGHT_NAMES = {"fp8": "FP8 W8A8", "int8": "INT8 W8A8", "int4": "INT4 W4A16", "nvfp4": "NVFP4 W4A4",
                 "nvfp4a16": "NVFP4 weights (W4A16)", "mxfp4": "MXFP4 W4A4", "mxfp4a16": "MXFP4 weights (W4A16)",
                 "plain": "plain weights (fake-quantized or dequantized)"}


def _weights(fmt: str, d: Device) -> Support:
    name, k = _WEIGHT_NAMES.get(fmt, fmt), "weights"
    if fmt == "plain":
        return _yes(name, k, "the model's own dtype: every device")
    if d.kind == "cpu":
        if fmt == "int8":  # measured here: CPUInt8ScaledMMLinearKernel, bf16/half activations only
            return _yes(name, k, "vllm-cpu's CPUInt8ScaledMMLinearKernel (bf16 or fp16 activations: a float32 profile "
                                 "serves it in bf16, quant.serving_profile); without int8 dot-product instructions it "
                                 "decodes slower than float (measured on an AVX2 EPYC)")
        if fmt == "int4":
            if _AVX512 & d.cpu_flags:
                return _yes(name, k, "vllm-cpu's CPUWNA16LinearKernel (AVX-512)")
            return _no(name, k, "vllm-cpu 0.32 has no INT4 kernel for a CPU without AVX-512: its AVX2 build lacks "
                                "cpu_gemm_wna16, so the server starts, then dies on the first request (measured here); "
                                "quant.servable serves the weights dequantized instead")
        if fmt == "fp8":
            return _no(name, k, "no FP8 compute on a CPU: an FP8_DYNAMIC checkpoint loads but decodes at ~0.1 "
                                "tokens/s (measured here); fake quantization shows the format's accuracy")
        return _no(name, k, f"vllm-cpu has no {name} kernel; fake quantization shows the format's accuracy")
    cc = d.cc
    if fmt == "int8":
        # model_executor/kernels/linear/scaled_mm/cutlass.py:34-45 picks CUTLASS on every CUDA device; upstream
        # csrc scaled_mm_c3x_sm100.cu has no int8 kernel ("Int8 not supported on SM100"), so a B200 fails at the
        # first forward pass, not at load. Minimum 7.5: schemes/compressed_tensors_w8a8_int8.py:34-37.
        if cc >= (10, 0):
            return _no(name, k, "vLLM 0.32 picks its CUTLASS int8 kernel on every GPU, and CUTLASS has none for "
                                "Blackwell (SM100): the server loads, then fails at the first forward pass ('Int8 not "
                                "supported on SM100. Use FP8 quantization instead'); quant.servable serves the "
                                "weights dequantized instead")
        return _yes(name, k, "CUTLASS int8 scaled_mm (compute capability 7.5 to 9.x)")
    if fmt == "int4":
        # schemes/compressed_tensors_wNa16.py:101-104 (min 7.5); kernels/linear/__init__.py:523-532 (Machete on SM90,
        # else Marlin). Activation ordering 'group' is refused at load on every device (compressed_tensors.py:336-344):
        # the recipes use 'static' or none.
        if cc < (7, 5):
            return _no(name, k, "Marlin, the oldest W4A16 kernel, needs compute capability 7.5")
        kernel = "Machete" if cc == (9, 0) else "Marlin"
        return _yes(name, k, f"{kernel} (W4A16, group 64" + ("; fp16 activations only" if cc < (8, 0) else "") + ")")
    if fmt == "fp8":
        # schemes/compressed_tensors_w8a8_fp8.py:82-85 (min 8.9); below it compressed_tensors.py:878-913 builds the
        # weight-only W8A16 scheme (FP8 Marlin, min 7.5) instead, with a warning; --quantization fp8 does the same.
        if cc >= (8, 9):
            return _yes(name, k, "CUTLASS FP8 W8A8 on FP8 tensor cores (8.9+)")
        if cc >= (7, 5):
            return _yes(name, k, "served weight-only: below 8.9 vLLM swaps in its FP8 Marlin kernel (W8A16), so "
                                 "the memory of FP8, not its compute", native=False)
        return _no(name, k, "FP8 Marlin needs compute capability 7.5")
    if fmt in ("nvfp4", "nvfp4a16"):
        # schemes/compressed_tensors_w4a4_nvfp4.py:34-36 (min 7.5); kernels/linear/__init__.py:1128-1245: FlashInfer or
        # CUTLASS FP4 on SM100, MarlinNvFp4 (weight-only) from 7.5.
        if fmt == "nvfp4" and cc >= (10, 0):
            return _yes(name, k, "FP4 tensor cores (FlashInfer / CUTLASS NVFP4, SM100)")
        if cc >= (7, 5):
            native = fmt == "nvfp4a16"
            return _yes(name, k, "Marlin, weight-only (NVFP4 weights, 16-bit activations)" +
                        ("" if native else ": below SM100 vLLM drops the activation quantization"), native=native)
        return _no(name, k, "Marlin FP4 needs compute capability 7.5")
    if fmt in ("mxfp4", "mxfp4a16"):
        # schemes/compressed_tensors_w4a4_mxfp4.py:45-47: min 8.0, one scheme for both (compressed_tensors.py:811-812);
        # FlashInfer CuTe-DSL W4A4 on SM100, which quantizes an MXFP4A16 checkpoint's activations too; else Marlin.
        if cc < (8, 0):
            return _no(name, k, "vLLM 0.32's MXFP4 scheme needs compute capability 8.0 ('Quantization scheme is not "
                                "supported for the current GPU. Min capability: 80'); fake quantization shows the "
                                "format's accuracy")
        if cc >= (10, 0):
            return _yes(name, k, "FlashInfer CuTe-DSL on FP4 tensor cores (SM100)" + (
                "; note: vLLM's one MXFP4 scheme quantizes this checkpoint's activations to MXFP4 too"
                if fmt == "mxfp4a16" else ""), native=fmt == "mxfp4")
        return _yes(name, k, "Marlin, weight-only (MXFP4 weights, 16-bit activations)" +
                    ("" if fmt == "mxfp4a16" else ": below SM100 vLLM ignores the activation quantization"),
                    native=fmt == "mxfp4a16")
    raise KeyError(f"no weight format {fmt!r}; known: {', '.join(_WEIGHT_NAMES)}")


def attention_backend(d: Device, kv_dtype: str = "auto") -> tuple[str, str]:
    """(vLLM 0.32's attention backend, its KV layout) for a standard decoder on ``d`` with ``kv_dtype``: the first
    valid backend of ``platforms/cuda.py:83-179``'s priority list (CPU: ``platforms/cpu.py:143-179``). Layouts in
    vLLM's names: LBNHC (the old "NHD") or LBHNC (the old "HND").

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    if d.kind == "cpu":
        return "CPU_ATTN", "LBHNC"
    cc, fp8 = d.cc, str(kv_dtype).startswith("fp8")
    if cc >= (10, 0):
        return "FLASHINFER", "LBHNC"   # flashinfer.py:603-610 declares LBHNC on SM10x
    if cc < (8, 0):
        return "TRITON_ATTN", "LBNHC"  # FlashAttention and FlashInfer both need 8.0
    if not fp8 or (cc == (9, 0) and kv_dtype != "fp8_e5m2"):
        return f"FLASH_ATTN (FA{3 if cc == (9, 0) else 2})", "LBNHC"
    return "FLASHINFER", "LBNHC"       # FA2 stores no FP8 KV; FA3 no e5m2 (fa_utils.py:282-312)


def _kv_cache(dtype: str, d: Device) -> Support:
    name, k = f"{dtype} KV cache", "kv_cache"
    if not str(dtype).startswith("fp8"):
        return _yes(name, k, "the model's own dtype: every device")
    if d.kind == "cpu":
        # v1/attention/backends/cpu_attn.py:520-545; measured here on an AVX2-only EPYC
        if _AVX512 & d.cpu_flags:
            return _yes(name, k, "CPU_ATTN stores FP8 on x86 with AVX-512 or AMX")
        return _no(name, k, "vllm-cpu stores an FP8 KV cache only on x86 with AVX-512 or AMX: the server sizes the "
                            "cache, then dies ('FP8 KV cache on CPU requires x86 with AVX-512 or AMX', measured here); "
                            "its capacity is still predicted exactly (sizing.vllm_kv_capacity(..., kv_dtype='fp8'))")
    backend, _ = attention_backend(d, dtype)
    if d.cc < (8, 0):
        # triton_attn.py:486-500: selected, then refused when built
        return _no(name, k, f"only {backend} runs below 8.0, and it refuses FP8 when the engine builds it ('FP8 KV "
                            "cache is not supported by the Triton attention backend ... native FP8 (fp8e4nv) requires "
                            "SM89+'): the server dies at start; its capacity is still predicted exactly "
                            "(sizing.vllm_kv_capacity(..., kv_dtype='fp8'))")
    return _yes(name, k, f"{backend} stores it (vLLM 0.32 picks the first backend that takes FP8 KV: FlashInfer "
                         "ships with PyPI's vllm)")


def _speculative(method: str, d: Device) -> Support:
    name, k = f"speculative decoding ({method})", "speculative"
    # config/speculative.py has no device check; v1/worker/cpu_model_runner.py:23-32 runs drafting on CPU too
    if method == "ngram":
        return _yes(name, k, "prompt lookup needs no draft model: every device (measured on CPU)")
    if method in ("eagle", "eagle3", "draft_model"):
        why = "a draft model's forward passes: served on every device, worth it on a GPU (on a CPU they cost about " \
              "as much as the target's)"
        return _yes(name, k, why + "; needs a draft head trained for the target (the plan names one per model)")
    if method == "mtp":
        return _yes(name, k, "the target's own MTP layers: only models trained with them (DeepSeek-V3/R1, GLM-4.5, "
                             "Qwen3-Next, MiMo)")
    raise KeyError(f"no speculative method {method!r}")


def _connector(name: str, d: Device) -> Support:
    k = "connector"
    if name != "ExampleConnector":
        raise KeyError(f"no KV connector {name!r} in the table")
    backend, layout = attention_backend(d)
    # kv_connector/v1/example_connector.py:131-152 indexes vLLM's standardized [blocks, heads, tokens, K|V] view,
    # whose strides carry the backend's physical layout (v1/kv_cache_interface.py:338-443): no layout is assumed.
    return _yes(f"{name} on {backend}", k,
                f"saves and loads whole blocks through vLLM 0.32's standardized per-layer view, whose strides carry "
                f"the backend's layout ({layout} under {backend}), so it needs no layout of its own; it indexes by "
                f"--block-size, so keep the backend's default block size (measured on CPU, CPU_ATTN)")


def _parallel(spec: str, d: Device) -> Support:
    tp = int(spec.split("=", 1)[1])
    name, k = f"tensor parallel {tp}", "parallel"
    if tp <= d.count:
        how = "one core per rank, bound by VLLM_CPU_OMP_THREADS_BIND (measured here)" if d.kind == "cpu" else \
            "one GPU per rank"
        return _yes(name, k, how)
    what = "cores" if d.kind == "cpu" else "GPUs"
    # config/parallel.py:1035-1058
    return _no(name, k, f"not measured on this machine: needs {tp} {what}, this device has {d.count} (vLLM refuses it: "
                        f"'World size ({tp}) is larger than the number of available GPUs ({d.count})')")


#: Every kind the table answers, and its lookup.
KINDS = {"weights": _weights, "kv_cache": _kv_cache, "speculative": _speculative, "connector": _connector,
         "parallel": _parallel}


def lookup(kind: str, name: str, device: Device) -> Support:
    """Whether vLLM 0.32 serves ``name`` of ``kind`` (one of :data:`KINDS`) on ``device``, and why.

    ``weights``: ``int8``, ``int4``, ``fp8``, ``nvfp4``, ``nvfp4a16``, ``mxfp4``, ``mxfp4a16``, ``plain``;
    ``kv_cache``: a ``--kv-cache-dtype``; ``speculative``: a method; ``connector``: ``ExampleConnector``;
    ``parallel``: ``tp=N``.

    Introduced in lab 12 (FP8 as the Default).
    """
    if kind not in KINDS:
        raise KeyError(f"no kind {kind!r}; the table knows {', '.join(KINDS)}")
    return KINDS[kind](name, device)


def serves(engine: Mapping[str, Any], device: Device) -> Support:
    """Whether ``device`` serves a set of engine arguments: its ``kv_cache_dtype`` and its ``speculative_config``'s
    method, each looked up in the table (the first it refuses is returned, else a yes naming them).

    Introduced in lab 24 (Putting It All Together).
    """
    asked = ([("kv_cache", str(engine["kv_cache_dtype"]))] if "kv_cache_dtype" in engine else []) + \
        ([("speculative", str(engine["speculative_config"]["method"]))] if "speculative_config" in engine else [])
    answers = [lookup(kind, name, device) for kind, name in asked]
    refused = next((a for a in answers if not a.supported), None)
    return refused or _yes(" + ".join(a.name for a in answers) or "the default engine", "engine", "; ".join(
        a.why for a in answers) or "nothing beyond the defaults asked")


def first_served(candidates: Sequence[Mapping[str, Any]], device: Device) -> tuple[dict[str, Any], Support]:
    """The first of ``candidates`` (engine arguments, a plan's order of preference) that ``device`` serves, and why;
    ``ValueError`` naming each refusal when it serves none.

    Introduced in lab 24 (Putting It All Together).
    """
    answers = [(dict(c), serves(c, device)) for c in candidates]
    for engine, answer in answers:
        if answer.supported:
            return engine, answer
    raise ValueError(f"{device} serves none of {len(answers)} candidates: "
                     + "; ".join(f"{a.name}: {a.why}" for _, a in answers))


#: vllm-cpu 0.32's INT8 and INT4 linear kernels take bf16 or fp16 activations only. Measured with the CPU profile in
#: float32 (a CPU without native bf16): the server starts, then dies on the first request with
#: "int8_scaled_mm_with_quant: expect A to be bfloat16 or half" (W8A8) or '"cpu_gemm_wna16" not implemented for
#: 'Float'' (W4A16).
HALF_ONLY_ON_CPU = frozenset({"int8", "int4"})


def compute_dtype(fmt: str | None, dtype: str, device: Device) -> str:
    """The dtype a server computes in when it serves weights of format ``fmt`` (``None`` or ``"plain"``: unquantized)
    for a profile in ``dtype``: ``dtype``, except an INT8 or INT4 checkpoint on its CPU kernel, which needs half
    precision (a float32 profile serves it in bfloat16, emulated where the CPU has no native bf16). A quantized
    checkpoint compared with a baseline in another dtype carries that dtype's drift too: labs 14 and 15 measure it.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if device.kind == "cpu" and dtype == "float32" and fmt in HALF_ONLY_ON_CPU:
        return "bfloat16"
    return dtype
