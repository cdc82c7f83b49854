"""What vLLM 0.32 serves on which device: one table, for the plans and for the checks before a server starts.

Every format a lab asks a server for — a quantized checkpoint's weights, ``--quantization fp8``, a model dtype, a
KV-cache dtype, a speculative method, a KV connector, a tensor-parallel size — is looked up here, for a
:class:`Device`: a profile's nominal one (so ``python -m helpers.plan PROFILE`` answers for a T4 or a B200 on a
machine without a GPU) or this machine's::

    support.lookup("kv_cache", "fp8", support.Device.of(PROFILE))
    # Support(name='fp8 KV cache', supported=False, native=False, why='T4 ... Triton ... requires SM89+ ...')

``supported``: vLLM serves it here. ``native``: it also computes in the format (FP8 weights on an A100 are served,
weight-only: supported, not native). ``why`` says which kernel or backend, or what fails and how. ``sources`` are
the lines of vLLM 0.32.0's Python source the answer rests on (:class:`Citation`): ``tests/test_support.py`` reads
each one from the installed package (vllm-cpu ships the same Python sources, the CUDA-only files included) and fails
when a cited line no longer says what the row relies on, so the table cannot drift from the pinned vLLM. Decisions
made inside compiled kernels (CUTLASS's SM100 int8, FlashAttention's FP8 stores) and the ``humming`` package's own
activation fallback are not in that source: a row that rests on them says so.

Also from: PyPI ``vllm`` 0.32.0's requirements (``humming-kernels[cu13]==0.1.17``, ``flashinfer-python==0.7.0.post1``;
no ``lmcache``, no ``nixl``), and what was measured on this project's CPUs (``../shared/notes/vllm-cpu-findings.md``).

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["Device", "Support", "Citation", "lookup", "serves", "first_served", "attention_backend", "compute_dtype",
           "KINDS", "every_citation"]


@dataclass(frozen=True)
class Citation:
    """One line of vLLM 0.32.0's source: its path under the installed package, its line number, and text the line
    contains (what the table relies on it saying).

    Introduced in lab 12 (FP8 as the Default).
    """

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"vllm/{self.path}:{self.line}"


def _c(where: str, text: str) -> Citation:
    path, _, line = where.rpartition(":")
    return Citation(path, int(line), text)


#: Every citation the table makes, by a short name (the rows below name them).
C = {
    # weights: which linear kernel
    "humming_sm90": _c("model_executor/layers/quantization/utils/humming/priority.py:11",
                       "_HUMMING_PREFERRED_CAPABILITIES = frozenset({90})"),
    "prioritize": _c("model_executor/kernels/linear/__init__.py:411",
                     "kernels = prioritize_humming(kernels, compute_capability)"),
    "int8_list": _c("model_executor/kernels/linear/__init__.py:434", "CutlassInt8ScaledMMLinearKernel,"),
    "int8_min": _c("model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:37",
                   "return 75"),
    "cutlass_any_cuda": _c("model_executor/kernels/linear/scaled_mm/cutlass.py:40", 'return False, "requires CUDA."'),
    "triton_int8": _c("model_executor/kernels/linear/__init__.py:328", "TritonInt8ScaledMMLinearKernel,"),
    "disabled_kernels": _c("model_executor/kernels/linear/__init__.py:633",
                           "if kernel.__name__ in envs.VLLM_DISABLED_KERNELS:"),
    "profile_run": _c("v1/worker/gpu_model_runner.py:6133",
                      "def profile_run(self, randomize_inputs: bool = False) -> None:"),
    "fp8_list": _c("model_executor/kernels/linear/__init__.py:443", "_POSSIBLE_FP8_KERNELS: dict"),
    "fp8_min": _c("model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py:85",
                  "return 89"),
    "fp8_below_89": _c("model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:909",
                       "return CompressedTensorsW8A16Fp8("),
    "wfp8a16_list": _c("model_executor/kernels/linear/__init__.py:506", "_POSSIBLE_WFP8A16_KERNELS: dict"),
    "wfp8a16_humming": _c("model_executor/kernels/linear/__init__.py:508", "HummingFP8ScaledMMLinearKernel,"),
    "online_fp8": _c("model_executor/layers/quantization/fp8.py:347", "self.fp8_linear = init_fp8_linear_kernel("),
    "fp8_supported": _c("platforms/cuda.py:586", "return cls.has_device_capability(89)"),
    "wna16_list": _c("model_executor/kernels/linear/__init__.py:523", "_POSSIBLE_KERNELS: dict"),
    "machete_sm90": _c("model_executor/kernels/linear/mixed_precision/machete.py:33",
                       "if not current_platform.is_device_capability(90):"),
    "machete_shape": _c("model_executor/layers/quantization/utils/machete_utils.py:9",
                        "MACHETE_PREPACKED_BLOCK_SHAPE = [64, 128]"),
    "nvfp4_list": _c("model_executor/kernels/linear/__init__.py:574", "_POSSIBLE_NVFP4_KERNELS: dict"),
    "marlin_fp4_min": _c("model_executor/layers/quantization/utils/marlin_utils_fp4.py:34",
                         "return current_platform.is_cuda() and current_platform.has_device_capability(75)"),
    "nvfp4_humming": _c("model_executor/kernels/linear/nvfp4/humming.py:69", "input_quant_key = kNvfp4Dynamic"),
    "nvfp4a16": _c("model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:797",
                   "return CompressedTensorsW4A4Fp4(use_a16=True)"),
    "nvfp4a16_b200": _c("model_executor/kernels/linear/__init__.py:1182",
                        "if compute_capability in (100, 103) and cutedsl_ok:"),
    "nvfp4a16_marlin": _c("model_executor/kernels/linear/__init__.py:1184",
                          "elif not prefers_humming(compute_capability):"),
    "mxfp4_min": _c("model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_mxfp4.py:47",
                    "return 80"),
    "mxfp4_one_scheme": _c("model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:811",
                           "if self._is_mxfp4(weight_quant):"),
    "mxfp4_act": _c("model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_mxfp4.py:39",
                    "def __init__(self, activation_quant_key: QuantKey = kMxfp4Dynamic):"),
    "mxfp4_humming": _c("model_executor/kernels/linear/mxfp4/humming.py:60",
                        "input_schema = quant_key_to_input_schema(act_key)"),
    "humming_fp4_act": _c("model_executor/layers/quantization/utils/humming/schema.py:292",
                          "humming_dtypes.float4e2m1: ("),
    "cpu_fp8_list": _c("model_executor/kernels/linear/__init__.py:463", "CPUFP8W8A8ScaledMMLinearKernel,"),
    "cpu_fp8_amx": _c("model_executor/kernels/linear/scaled_mm/cpu.py:345",
                      '"""FP8 W8A16 per-tensor-scaled GEMM via AMX BRGEMM on CPU.'),
    "cpu_fp8_w8a8": _c("model_executor/kernels/linear/scaled_mm/cpu.py:614",
                       '"requires native AMX-FP8 hardware (Diamond Rapids); falls back "'),
    # dtype
    "bf16_refused": _c("platforms/cuda.py:649", '"Bfloat16 is only supported on GPUs "'),
    "bf16_checked": _c("v1/worker/gpu_worker.py:503",
                       "current_platform.check_if_supports_dtype(self.model_config.dtype)"),
    "no_bf16_dtypes": _c("platforms/cuda.py:261", "return [torch.float16, torch.float32]"),
    "auto_fallback": _c("config/model.py:2420", "preferred_dtype = supported_dtypes[0]"),
    # attention backends
    "fa_order": _c("platforms/cuda.py:174", "AttentionBackendEnum.FLASH_ATTN,"),
    "b200_order": _c("platforms/cuda.py:158", "if device_capability.major == 10 and not use_non_causal:"),
    "fa_min": _c("v1/attention/backends/flash_attn.py:454", "return capability >= DeviceCapability(8, 0)"),
    "fa_fp8": _c("v1/attention/backends/fa_utils.py:307", "sm90_fp8_kv_supported = fa_version == 3 or ("),
    "fa_e5m2": _c("v1/attention/backends/fa_utils.py:293", 'if kv_cache_dtype == "fp8_e5m2":'),
    "flashinfer_heads": _c("v1/attention/backends/flashinfer.py:568", "return [64, 128, 256, 512]"),
    "triton_heads": _c("v1/attention/backends/triton_attn.py:356", "return head_size >= 32"),
    "triton_fp8": _c("v1/attention/backends/triton_attn.py:497",
                     'f"FP8 KV cache is not supported by the Triton attention backend "'),
    "triton_per_token": _c("v1/attention/backends/triton_attn.py:310", '"int8_per_token_head",'),
    "cpu_fp8_kv": _c("v1/attention/backends/cpu_attn.py:542", '"FP8 KV cache on CPU requires x86 with AVX-512 or AMX."'),
    "mla_order": _c("platforms/cuda.py:148", "AttentionBackendEnum.FLASH_ATTN_MLA,"),
    # connectors
    "hma_off": _c("config/vllm.py:2177", "if not KVConnectorFactory.supports_hma_config(self.kv_transfer_config):"),
    "window_left": _c("v1/attention/backends/flashinfer.py:1474", '"Window left is not the same for all layers. "'),
    "offload_cuda": _c("v1/kv_offload/cpu/spec.py:201", '"CPU Offloading is currently only supported on CUDA-alike "'),
    "offload_layout": _c("distributed/kv_transfer/kv_connector/v1/offloading_connector.py:239", 'return "LBHNC"'),
    "lmcache_import": _c("distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py:11",
                         "from lmcache.integration.vllm.utils import mla_enabled"),
    "nixl_missing": _c("distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:514",
                       'raise RuntimeError("NIXL is not available")'),
    # parallel, drafting
    "world_size": _c("config/parallel.py:1053", 'f"World size ({self.world_size}) is larger than the number of "'),
    "draft_methods": _c("config/speculative.py:77", '"draft_model",'),
}


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
    """One format on one device: served or not, computed natively or not, why, and the vLLM source lines it rests on.

    Introduced in lab 12 (FP8 as the Default).
    """

    name: str
    kind: str
    supported: bool
    native: bool
    why: str
    sources: tuple[Citation, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = [str(c) for c in self.sources]
        return d

    def __str__(self) -> str:
        return f"{self.name}: {'served' if self.supported else 'NOT served'} here: {self.why}"


def _yes(name: str, kind: str, why: str, native: bool = True, cite: Sequence[str] = ()) -> Support:
    return Support(name, kind, True, native, why, tuple(C[k] for k in cite))


def _no(name: str, kind: str, why: str, cite: Sequence[str] = ()) -> Support:
    return Support(name, kind, False, False, why, tuple(C[k] for k in cite))


_AVX512 = {"avx512f", "amx_bf16", "amx_tile"}
#: Names of the weight formats (compressed-tensors checkpoints; ``fp8-online`` is ``--quantization fp8`` on the
#: model's own checkpoint), as :func:`helpers.quant.checkpoint_format` and the recipes name them.
_WEIGHT_NAMES = {"fp8": "FP8 W8A8", "fp8-online": "FP8 weights quantized at load (--quantization fp8)",
                 "int8": "INT8 W8A8", "int4": "INT4 W4A16", "nvfp4": "NVFP4 W4A4",
                 "nvfp4a16": "NVFP4 weights (W4A16)", "mxfp4": "MXFP4 W4A4", "mxfp4a16": "MXFP4 weights (W4A16)",
                 "plain": "plain weights (fake-quantized or dequantized)"}


def _cpu_weights(fmt: str, name: str, d: Device) -> Support:
    k = "weights"
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
    if fmt in ("fp8", "fp8-online"):
        amx = "amx_tile" in d.cpu_flags
        return _no(name, k, "no usable FP8 compute for this project's FP8 checkpoints on a CPU: FP8_DYNAMIC (per-channel "
                            "weight scales) takes torch._scaled_mm, which decoded at ~0.1 tokens/s (measured on AVX2 "
                            "and AVX-512 CPUs). vllm-cpu 0.32's AMX kernels take per-tensor or block-scaled FP8 only "
                            "(weight-only on Sapphire Rapids and later" + (", which this CPU is" if amx else "") +
                   "), and W8A8 needs AMX-FP8 (Diamond Rapids); fake quantization shows the format's accuracy",
                   cite=("cpu_fp8_list", "cpu_fp8_amx", "cpu_fp8_w8a8"))
    return _no(name, k, f"vllm-cpu has no {name} kernel; fake quantization shows the format's accuracy")


def _weights(fmt: str, d: Device) -> Support:
    name, k = _WEIGHT_NAMES.get(fmt, fmt), "weights"
    if fmt not in _WEIGHT_NAMES:
        raise KeyError(f"no weight format {fmt!r}; known: {', '.join(_WEIGHT_NAMES)}")
    if fmt == "plain":
        return _yes(name, k, "the model's own dtype: every device")
    if d.kind == "cpu":
        return _cpu_weights(fmt, name, d)
    cc = d.cc
    if fmt == "int8":
        if cc >= (10, 0):  # CUTLASS is picked on every CUDA cc and its SM100 build has no int8 GEMM
            return _no(name, k, "vLLM 0.32 picks its CUTLASS int8 kernel on every GPU, and CUTLASS has none for "
                                "Blackwell (SM100): the engine dies in the forward pass it profiles memory with at "
                                "start-up ('Int8 not supported on SM100. Use FP8 quantization instead', from vLLM's "
                                "compiled kernels). Served instead with --linear-backend triton (or "
                                "VLLM_DISABLED_KERNELS=CutlassInt8ScaledMMLinearKernel): Triton's int8 GEMM; "
                                "quant.servable serves the weights dequantized",
                       cite=("int8_list", "cutlass_any_cuda", "profile_run", "triton_int8", "disabled_kernels"))
        return _yes(name, k, "CUTLASS int8 scaled_mm (compute capability 7.5 to 9.x)",
                    cite=("int8_list", "int8_min", "cutlass_any_cuda"))
    if fmt == "int4":
        if cc < (7, 5):
            return _no(name, k, "Marlin, the oldest W4A16 kernel, needs compute capability 7.5")
        if cc == (9, 0):
            return _yes(name, k, "Machete on Hopper when the layer's shapes divide by 64/128 and the group is -1, 64 "
                                 "or 128 (Llama's do, group 64); else Humming, which vLLM ranks ahead of Marlin on "
                                 "SM90 only", cite=("wna16_list", "machete_sm90", "machete_shape", "humming_sm90",
                                                    "prioritize"))
        return _yes(name, k, "Marlin (W4A16, group 64" + ("; fp16 activations only" if cc < (8, 0) else "") + ")",
                    cite=("wna16_list", "humming_sm90"))
    if fmt == "fp8-online":  # --quantization fp8: the W8A8 list, no reordering off SM90
        if cc >= (8, 9):
            return _yes(name, k, "CUTLASS FP8 on FP8 tensor cores (per-tensor activation scales; FlashInfer FP8 on "
                                 "Blackwell)", cite=("online_fp8", "fp8_list", "fp8_supported"))
        if cc >= (7, 5):
            return _yes(name, k, "served weight-only: below 8.9 no FP8 GEMM qualifies and vLLM takes FP8 Marlin "
                                 "(W8A16): the memory of FP8, not its compute", native=False,
                        cite=("online_fp8", "fp8_list", "fp8_supported"))
        return _no(name, k, "FP8 Marlin needs compute capability 7.5")
    if fmt == "fp8":
        if cc >= (8, 9):
            return _yes(name, k, "CUTLASS FP8 W8A8 on FP8 tensor cores (8.9+)", cite=("fp8_min", "fp8_list"))
        if cc >= (7, 5):
            return _yes(name, k, "served weight-only: below 8.9 vLLM builds the W8A16 scheme, on Humming's FP8 "
                                 "kernel (first in its W8A16 list on every GPU, and PyPI vllm installs humming-kernels)"
                                 ", not FP8 Marlin (that is --quantization fp8's), with no warning: the memory of "
                                 "FP8, not its compute", native=False,
                        cite=("fp8_min", "fp8_below_89", "wfp8a16_list", "wfp8a16_humming"))
        return _no(name, k, "no FP8 kernel below compute capability 7.5")
    if fmt in ("nvfp4", "nvfp4a16"):
        if cc < (7, 5):
            return _no(name, k, "Marlin FP4 needs compute capability 7.5", cite=("marlin_fp4_min",))
        if cc >= (10, 0):
            if fmt == "nvfp4":
                return _yes(name, k, "FP4 tensor cores (FlashInfer CuTe-DSL NVFP4; vLLM's CUTLASS FP4 where FlashInfer "
                                     "is not usable, SM100)", cite=("nvfp4_list",))
            return _yes(name, k, "FlashInfer's CuTe-DSL W4A16 kernel on Blackwell (Marlin where FlashInfer's CuTe-DSL "
                                 "is not usable)", cite=("nvfp4a16", "nvfp4a16_b200"))
        if cc == (9, 0):
            return _yes(name, k, "Humming (vLLM ranks it ahead of Marlin on SM90), with 16-bit activations" +
                        (": vLLM asks it for NVFP4 activations, and Humming, which needs SM120 for FP4 activations, "
                         "falls back (the humming package's own rule)" if fmt == "nvfp4" else ""),
                        native=fmt == "nvfp4a16", cite=("nvfp4_list", "humming_sm90", "prioritize", "nvfp4_humming")
                        + (("nvfp4a16",) if fmt == "nvfp4a16" else ()))
        return _yes(name, k, "Marlin, weight-only (NVFP4 weights, 16-bit activations)" +
                    ("" if fmt == "nvfp4a16" else ": below SM100 vLLM drops the activation quantization"),
                    native=fmt == "nvfp4a16", cite=("nvfp4_list", "marlin_fp4_min", "nvfp4a16_marlin"))
    # mxfp4 / mxfp4a16: one scheme for both, which always asks for MXFP4 activations
    if cc < (8, 0):
        return _no(name, k, "vLLM 0.32's MXFP4 scheme needs compute capability 8.0 ('Quantization scheme is not "
                            "supported for the current GPU. Min capability: 80'); fake quantization shows the "
                            "format's accuracy", cite=("mxfp4_min",))
    if cc >= (10, 0):
        return _yes(name, k, "FlashInfer CuTe-DSL on FP4 tensor cores (SM100)" + (
            "; vLLM's one MXFP4 scheme quantizes this checkpoint's activations to MXFP4 too"
            if fmt == "mxfp4a16" else ""), native=fmt == "mxfp4", cite=("mxfp4_one_scheme", "mxfp4_act"))
    if cc == (9, 0):
        return _yes(name, k, "Humming (ahead of Marlin on SM90) as W4A8: vLLM's one MXFP4 scheme asks for MXFP4 "
                             "activations" + (" even for this weight-only checkpoint" if fmt == "mxfp4a16" else "") +
                    ", and Humming, which needs SM120 for FP4 activations, computes them in FP8 E4M3 per token (the "
                    "humming package's own rule)", native=fmt == "mxfp4a16",
                    cite=("mxfp4_one_scheme", "mxfp4_act", "mxfp4_humming", "humming_fp4_act", "humming_sm90"))
    return _yes(name, k, "Marlin, weight-only (MXFP4 weights, 16-bit activations)" +
                ("" if fmt == "mxfp4a16" else ": below SM100 vLLM ignores the activation quantization, with a warning"),
                native=fmt == "mxfp4a16", cite=("mxfp4_one_scheme", "mxfp4_min"))


def attention_backend(d: Device, kv_dtype: str = "auto", head_size: int = 128) -> tuple[str, str]:
    """(vLLM 0.32's attention backend, its KV layout) for a standard decoder with ``head_size`` on ``d`` with
    ``kv_dtype``: the first valid backend of ``platforms/cuda.py``'s priority list (FlashAttention, FlashInfer, Triton;
    FlashInfer first on Blackwell), each refusing what it cannot take (CPU: ``CPU_ATTN``). Layouts in vLLM's names:
    LBNHC (the old "NHD") or LBHNC (the old "HND").

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    if d.kind == "cpu":
        return "CPU_ATTN", "LBHNC"
    cc, fp8 = d.cc, str(kv_dtype).startswith("fp8")
    flashinfer_ok = head_size in (64, 128, 256, 512) and cc >= (8, 0)
    fa_ok = cc >= (8, 0) and head_size % 8 == 0 and head_size <= 256
    fa_version = 3 if cc[0] == 9 else (4 if cc[0] == 10 else 2)
    fa_fp8 = fa_version in (3, 4) and kv_dtype != "fp8_e5m2"
    if cc >= (10, 0) and flashinfer_ok:
        return "FLASHINFER", "LBHNC"   # flashinfer.py declares LBHNC on SM10x
    if fa_ok and (not fp8 or fa_fp8):
        return f"FLASH_ATTN (FA{fa_version})", "LBNHC"
    if flashinfer_ok:
        return "FLASHINFER", "LBNHC"   # FA2 stores no FP8 KV; FA3 no e5m2
    return "TRITON_ATTN", "LBNHC"      # below 8.0, or a head size FlashInfer refuses


def _kv_cache(dtype: str, d: Device, head_size: int = 128) -> Support:
    name, k = f"{dtype} KV cache", "kv_cache"
    dtype = str(dtype)
    if dtype in ("auto", "bfloat16", "float16", "float32", "half", "float"):
        return _yes(name, k, "the model's own dtype: every device")
    if d.kind == "cpu":
        if not dtype.startswith("fp8"):
            return _no(name, k, f"vllm-cpu's CPU_ATTN stores auto and fp8 KV caches only, not {dtype}")
        if _AVX512 & d.cpu_flags:
            return _yes(name, k, "CPU_ATTN stores FP8 on x86 with AVX-512 or AMX", cite=("cpu_fp8_kv",))
        return _no(name, k, "vllm-cpu stores an FP8 KV cache only on x86 with AVX-512 or AMX: the server sizes the "
                            "cache, then dies ('FP8 KV cache on CPU requires x86 with AVX-512 or AMX', measured here); "
                            "its capacity is still predicted exactly (sizing.vllm_kv_capacity(..., kv_dtype='fp8'))",
                   cite=("cpu_fp8_kv",))
    cc = d.cc
    if dtype in ("int8_per_token_head", "int4_per_token_head", "fp8_per_token_head"):
        if dtype.startswith("fp8") and cc < (8, 9):
            return _no(name, k, "only Triton attention stores per-token-head KV, and it refuses FP8 below SM89",
                       cite=("triton_per_token", "triton_fp8"))
        return _yes(name, k, "Triton attention only (it alone lists the per-token-head dtypes), whatever backend the "
                             "model would get with a 16-bit cache", cite=("triton_per_token",))
    if dtype.startswith("nvfp4"):
        if cc < (8, 0) or head_size == 64:
            return _no(name, k, "no attention backend takes an NVFP4 KV cache here (FlashInfer needs 8.0+ and "
                                "misreads head size 64)")
        return _yes(name, k, "FlashInfer only (8.0-9.x: its FA2 path; Blackwell: only with its TRT-LLM kernels, "
                             "which need flashinfer-cubin)", cite=("flashinfer_heads",))
    if dtype.startswith("turboquant"):
        if cc < (8, 0):
            return _no(name, k, "the TurboQuant backend, the only one that takes it, forces FlashAttention 2, which "
                                "needs compute capability 8.0")
        return _yes(name, k, "the TurboQuant backend only (it forces FlashAttention 2; the first and last two layers "
                             "stay 16-bit)")
    backend, _ = attention_backend(d, dtype, head_size)
    if backend == "TRITON_ATTN" and cc < (8, 9):
        why = "below 8.0 only" if cc < (8, 0) else f"with head size {head_size} (FlashInfer takes 64/128/256/512) only"
        return _no(name, k, f"{why} {backend} runs here, and it refuses FP8 when the engine builds it ('FP8 KV cache "
                            "is not supported by the Triton attention backend ... native FP8 (fp8e4nv) requires SM89+'): "
                            "the server dies at start; its capacity is still predicted exactly "
                            "(sizing.vllm_kv_capacity(..., kv_dtype='fp8'))",
                   cite=("triton_fp8", "flashinfer_heads", "fa_fp8"))
    cite = ("fa_order", "fa_fp8", "fa_e5m2") if backend.startswith("FLASH_ATTN") else ("flashinfer_heads", "fa_fp8")
    return _yes(name, k, f"{backend} stores it (vLLM 0.32 takes the first backend of its list that stores FP8 KV at "
                         f"this head size: FlashAttention 3/4 on Hopper/Blackwell, FlashInfer after FlashAttention 2)",
                cite=cite)


def _dtype(dtype: str, d: Device) -> Support:
    name, k = f"--dtype {dtype}", "dtype"
    if d.kind == "cpu" or dtype in ("float16", "half", "float32", "float"):
        return _yes(name, k, "every device" if d.kind == "cuda" else "vllm-cpu computes float32 and bfloat16")
    if dtype == "bfloat16" and d.cc < (8, 0):
        return _no(name, k, f"bf16 needs compute capability 8.0: vLLM accepts the flag, then the worker refuses it at "
                            f"start ('Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your "
                            f"{d.name or 'GPU'} GPU has compute capability {d.cc[0]}.{d.cc[1]} ... --dtype=half'); "
                            "--dtype auto falls back to float16 with a warning (float32 for Gemma 2/3 and GLM-4)",
                   cite=("bf16_refused", "bf16_checked", "no_bf16_dtypes", "auto_fallback"))
    return _yes(name, k, "compute capability 8.0+: bf16 tensor cores")


def _speculative(method: str, d: Device) -> Support:
    name, k = f"speculative decoding ({method})", "speculative"
    # config/speculative.py and v1/spec_decode/ hold no compute-capability check; CPU drafting is measured here
    if method == "ngram":
        return _yes(name, k, "prompt lookup needs no draft model: every device (measured on CPU)",
                    cite=("draft_methods",))
    if method in ("eagle", "eagle3", "draft_model"):
        why = "a draft model's forward passes: served on every device, worth it on a GPU (on a CPU they cost about " \
              "as much as the target's)"
        return _yes(name, k, why + "; needs a draft head trained for the target (the plan names one per model)",
                    cite=("draft_methods",))
    if method == "mtp":
        return _yes(name, k, "the target's own MTP layers: only models trained with them (DeepSeek-V3/R1, GLM-4.5, "
                             "Qwen3-Next, MiMo)")
    raise KeyError(f"no speculative method {method!r}")


def _connector(name: str, d: Device) -> Support:
    k = "connector"
    backend, layout = attention_backend(d)
    if name == "ExampleConnector":
        # kv_connector/v1/example_connector.py indexes vLLM's standardized [blocks, heads, tokens, K|V] view, whose
        # strides carry the backend's physical layout (v1/kv_cache_interface.py): no layout is assumed
        return _yes(f"{name} on {backend}", k,
                    f"saves and loads whole blocks through vLLM 0.32's standardized per-layer view, whose strides "
                    f"carry the backend's layout ({layout} under {backend}), so it needs no layout of its own; it "
                    "indexes by --block-size, so keep the backend's default block size (measured on CPU, CPU_ATTN). "
                    "It does not support the hybrid KV-cache manager, so vLLM turns that off: a model with "
                    "interleaved sliding windows on FlashInfer then fails ('Window left is not the same for all "
                    "layers')", cite=("hma_off", "window_left"))
    if name == "OffloadingConnector":
        if d.kind != "cuda":
            return _no(name, k, "vLLM's native KV offloading runs on CUDA-alike and XPU GPUs only ('CPU Offloading is "
                                "currently only supported on CUDA-alike and XPU GPUs', measured on vllm-cpu)",
                       cite=("offload_cuda",))
        return _yes(name, k, "vLLM's native CPU-memory tier (--kv-offloading-size); it asks for the LBHNC layout, "
                             "which vLLM drops with a warning where a backend cannot use it",
                    cite=("offload_cuda", "offload_layout"))
    if name in ("LMCacheConnectorV1", "LMCacheMPConnector"):
        return _no(name, k, "LMCache is not a vLLM 0.32 dependency: the connector imports it at start and fails "
                            "unless `pip install lmcache` put it there (on a CPU it runs degraded: measured)",
                   cite=("lmcache_import",))
    if name == "NixlConnector":
        return _no(name, k, "NIXL is not a vLLM 0.32 dependency: the worker raises 'NIXL is not available' unless "
                            "`pip install nixl` put it there", cite=("nixl_missing",))
    raise KeyError(f"no KV connector {name!r} in the table")


def _parallel(spec: str, d: Device) -> Support:
    tp = int(spec.split("=", 1)[1])
    name, k = f"tensor parallel {tp}", "parallel"
    if tp <= d.count:
        how = "one core per rank, bound by VLLM_CPU_OMP_THREADS_BIND (measured here)" if d.kind == "cpu" else \
            "one GPU per rank"
        return _yes(name, k, how)
    what = "cores" if d.kind == "cpu" else "GPUs"
    return _no(name, k, f"not measured on this machine: needs {tp} {what}, this device has {d.count} (vLLM refuses it: "
                        f"'World size ({tp}) is larger than the number of available GPUs ({d.count}) in this node')",
               cite=("world_size",))


#: Every kind the table answers, and its lookup.
KINDS = {"weights": _weights, "kv_cache": _kv_cache, "dtype": _dtype, "speculative": _speculative,
         "connector": _connector, "parallel": _parallel}


def lookup(kind: str, name: str, device: Device, head_size: int = 128) -> Support:
    """Whether vLLM 0.32 serves ``name`` of ``kind`` (one of :data:`KINDS`) on ``device``, and why.

    ``weights``: ``int8``, ``int4``, ``fp8``, ``fp8-online`` (``--quantization fp8``), ``nvfp4``, ``nvfp4a16``,
    ``mxfp4``, ``mxfp4a16``, ``plain``; ``kv_cache``: a ``--kv-cache-dtype`` (``head_size``: the model's, which
    decides the attention backend); ``dtype``: a ``--dtype``; ``speculative``: a method; ``connector``:
    ``ExampleConnector``, ``OffloadingConnector``, ``LMCacheConnectorV1``, ``NixlConnector``; ``parallel``: ``tp=N``.

    Introduced in lab 12 (FP8 as the Default).
    """
    if kind not in KINDS:
        raise KeyError(f"no kind {kind!r}; the table knows {', '.join(KINDS)}")
    if kind == "kv_cache":
        return _kv_cache(name, device, head_size)
    return KINDS[kind](name, device)


def every_citation() -> list[Citation]:
    """Every line of vLLM's source the table cites (what ``tests/test_support.py`` checks against the installed
    package).

    Introduced in lab 12 (FP8 as the Default).
    """
    return list(C.values())


def serves(engine: Mapping[str, Any], device: Device, head_size: int = 128) -> Support:
    """Whether ``device`` serves a set of engine arguments: its ``dtype``, ``quantization``, ``kv_cache_dtype`` and
    its ``speculative_config``'s method, each looked up in the table (the first it refuses is returned, else a yes
    naming them).

    Introduced in lab 24 (Putting It All Together).
    """
    asked = ([("dtype", str(engine["dtype"]))] if engine.get("dtype") not in (None, "auto") else []) + \
        ([("weights", "fp8-online")] if str(engine.get("quantization") or "") == "fp8" else []) + \
        ([("kv_cache", str(engine["kv_cache_dtype"]))] if "kv_cache_dtype" in engine else []) + \
        ([("speculative", str(engine["speculative_config"]["method"]))] if "speculative_config" in engine else [])
    answers = [lookup(kind, name, device, head_size) for kind, name in asked]
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
