"""What vLLM 0.32 refuses on a card, with its own words and where it says them.

The stand-in's own table, read from vLLM 0.32.0's Python source (the paths are under ``vllm/`` of the installed
package; ``ci/rehearse/VLLM_GPU_FACTS.md`` has the reading), not from ``helpers.support``, which the rehearsal checks.
Each rule is (when it applies, the message, the citation); ``at`` says when vLLM raises it: ``start`` (the server
never comes up) or ``first-request`` (it starts, then its engine dies on the first forward pass).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from .checkpoint import Checkpoint


@dataclass(frozen=True)
class Device:
    kind: str                              # "cuda" or "cpu"
    cc: tuple[int, int] = (0, 0)
    count: int = 1
    name: str = ""
    cpu_flags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Refusal:
    message: str
    citation: str
    at: str = "start"
    error: str = "ValueError"              # the exception vLLM raises, as its traceback's last line names it
    who: str = "EngineCore"                # the process that raises it


@dataclass(frozen=True)
class Rule:
    name: str
    applies: Callable[[dict[str, Any], Checkpoint, Device, str], bool]
    message: Callable[[dict[str, Any], Checkpoint, Device, str], str]
    citation: str
    at: str = "start"
    error: str = "ValueError"
    who: str = "EngineCore"


def _kv(args: dict[str, Any]) -> str:
    return str(args.get("kv_cache_dtype") or "auto")


def _fmt(ckpt: Checkpoint) -> str | None:
    return ckpt.quant_format()


def _spec(args: dict[str, Any]) -> dict[str, Any]:
    s = args.get("speculative_config")
    return s if isinstance(s, dict) else {}


# vLLM 0.32.0's SpeculativeMethod, in the order its validation error lists them (vllm/config/speculative.py:38-83:
# the n-gram, Medusa, MLP, draft-model, suffix and custom methods, EagleModelTypes, MTPModelTypes, then ngram_gpu,
# dflash and dspark); fidelity-tested against the real message (tests/test_standin_fidelity.py)
SPECULATIVE_METHODS = (
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp",
    "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp",
    "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp",
    "gemma4_mtp", "inkling_mtp", "glm5_next_mtp", "dflash", "ngram_gpu", "dspark")

RULES: list[Rule] = [
    Rule("bf16 below SM80",
         lambda a, c, d, dt: d.kind == "cuda" and dt == "bfloat16" and d.cc < (8, 0),
         lambda a, c, d, dt: (f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your "
                              f"{d.name} GPU has compute capability {d.cc[0]}.{d.cc[1]}. You can use float16 instead "
                              "by explicitly setting the `dtype` flag in CLI, for example: --dtype=half."),
         "vllm/platforms/cuda.py: check_if_supports_dtype ('Bfloat16 is only supported on GPUs with compute "
         "capability of at least 8.0')"),
    Rule("tensor parallel beyond the GPUs",
         lambda a, c, d, dt: d.kind == "cuda" and int(a.get("tensor_parallel_size") or 1) > d.count,
         lambda a, c, d, dt: (f"World size ({int(a.get('tensor_parallel_size') or 1)}) is larger than the number of "
                              f"available GPUs ({d.count}) in this node. If this is intentional and you are using: "
                              "- ray, set '--distributed-executor-backend ray'. - multiprocessing, set "
                              "'--distributed-executor-backend mp' and '--nnodes' accordingly."),
         "vllm/config/parallel.py: __post_init__ ('is larger than the number of available GPUs')"),
    Rule("FP8 KV cache below SM80 (Triton attention)",
         lambda a, c, d, dt: d.kind == "cuda" and _kv(a).startswith("fp8") and d.cc < (8, 0),
         lambda a, c, d, dt: ("FP8 KV cache is not supported by the Triton attention backend on this GPU: native FP8 "
                              "(fp8e4nv) requires SM89+."),
         "vllm/v1/attention/backends/triton_attn.py: TritonAttentionImpl.__init__ (FP8 KV on pre-SM89)"),
    Rule("MXFP4 below SM80",
         lambda a, c, d, dt: d.kind == "cuda" and _fmt(c) in ("mxfp4", "mxfp4a16") and d.cc < (8, 0),
         lambda a, c, d, dt: (f"Quantization scheme is not supported for the current GPU. Min capability: 80. "
                              f"Current capability: {d.cc[0]}{d.cc[1]}."),
         "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: _check_scheme_supported "
         "(CompressedTensorsW4A4Mxfp4.get_min_capability() == 80)"),
    Rule("INT8 W8A8 on SM100 (CUTLASS has no int8 kernel there; the profiling forward pass at start-up dies)",
         lambda a, c, d, dt: d.kind == "cuda" and _fmt(c) == "int8" and d.cc >= (10, 0)
         and str(a.get("linear_backend") or "") != "triton"
         and "CutlassInt8ScaledMMLinearKernel" not in os.environ.get("VLLM_DISABLED_KERNELS", ""),
         lambda a, c, d, dt: ("Int8 not supported on SM100. Use FP8 quantization instead, or run on older arch "
                              "(SM < 100)."),
         "vllm/model_executor/kernels/linear/__init__.py:434 'CutlassInt8ScaledMMLinearKernel,' (picked on every "
         "CUDA cc); upstream csrc scaled_mm_helper.hpp 'Int8 not supported on SM'; vllm/v1/worker/"
         "gpu_model_runner.py:6133 'def profile_run' (the start-up forward pass)"),
    Rule("FP8 KV cache with a head size FlashInfer refuses, on FlashAttention 2 (8.0-8.6: Triton, which refuses)",
         lambda a, c, d, dt: d.kind == "cuda" and _kv(a).startswith("fp8") and (8, 0) <= d.cc < (8, 9)
         and not c.mla and c.head_dim not in (64, 128, 256, 512),
         lambda a, c, d, dt: (f"FP8 KV cache is not supported by the Triton attention backend on {d.name} (compute "
                              f"capability {d.cc[0]}.{d.cc[1]}); native FP8 (fp8e4nv) requires SM89+. Re-run with "
                              "--kv-cache-dtype bfloat16."),
         "vllm/v1/attention/backends/flashinfer.py:568 'return [64, 128, 256, 512]'; "
         "vllm/v1/attention/backends/triton_attn.py:497 'FP8 KV cache is not supported by the Triton attention "
         "backend'"),
    Rule("FP8 KV cache on a CPU without AVX-512 or AMX",
         lambda a, c, d, dt: d.kind == "cpu" and _kv(a).startswith("fp8")
         and not ({"avx512f", "amx_bf16", "amx_tile"} & d.cpu_flags),
         lambda a, c, d, dt: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
         "vllm/v1/attention/backends/cpu_attn.py (FP8 KV on CPU)"),
    Rule("speculative method unknown",
         lambda a, c, d, dt: bool(_spec(a)) and "method" in _spec(a) and _spec(a)["method"] not in SPECULATIVE_METHODS,
         lambda a, c, d, dt: ("1 validation error for SpeculativeConfig\nmethod\n  Input should be "
                              + ", ".join(f"'{m}'" for m in SPECULATIVE_METHODS[:-1])
                              + f" or '{SPECULATIVE_METHODS[-1]}' [type=literal_error, input_value="
                              f"{_spec(a)['method']!r}, input_type=str]"),
         "vllm/config/speculative.py:73 SpeculativeMethod (a pydantic Literal, checked when "
         "engine/arg_utils.py:2099 builds SpeculativeConfig: the API server exits before the engine starts)",
         error="pydantic_core._pydantic_core.ValidationError", who="APIServer"),
    Rule("KV connector not in vLLM 0.32's registry",
         lambda a, c, d, dt: isinstance(a.get("kv_transfer_config"), dict) and a["kv_transfer_config"].get(
             "kv_connector") not in ("ExampleConnector", "NixlConnector", "OffloadingConnector", "LMCacheConnectorV1",
                                     "MultiConnector", "P2pNcclConnector", "SharedStorageConnector"),
         lambda a, c, d, dt: f"Unsupported connector type: {a['kv_transfer_config'].get('kv_connector')}",
         "vllm/distributed/kv_transfer/kv_connector/factory.py: KVConnectorFactory.create_connector"),
    Rule("native KV offloading on a CPU",
         lambda a, c, d, dt: d.kind == "cpu" and isinstance(a.get("kv_transfer_config"), dict)
         and a["kv_transfer_config"].get("kv_connector") == "OffloadingConnector",
         lambda a, c, d, dt: "CPU offloading is only supported on CUDA-alike and XPU GPUs",
         "vllm/v1/kv_offload/cpu/spec.py: get_worker"),
]


def check(args: dict[str, Any], ckpt: Checkpoint, device: Device, dtype: str, at: str = "start") -> Refusal | None:
    """The first rule that refuses ``args`` for ``ckpt`` on ``device`` at ``at`` (None: vLLM takes them)."""
    for rule in RULES:
        if rule.at == at and rule.applies(args, ckpt, device, dtype):
            return Refusal(rule.message(args, ckpt, device, dtype), rule.citation, rule.at, rule.error, rule.who)
    return None


def linear_kernel(args: dict[str, Any], ckpt: Checkpoint, device: Device) -> tuple[str, str] | None:
    """(kernel class, scheme) vLLM 0.32 selects for the checkpoint's linear layers on ``device``, as its log line
    ``Selected <kernel> for <scheme>`` names them (``ci/rehearse/VLLM_GPU_FACTS.md`` section 3); None when unquantized.
    """
    fmt = _fmt(ckpt) or ("fp8-online" if str(args.get("quantization") or "") == "fp8" else None)
    if fmt is None:
        return None
    cc = device.cc
    if device.kind == "cpu":
        return {"int8": ("CPUInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8"),
                "int4": ("CPUWNA16LinearKernel", "CompressedTensorsWNA16"),
                "fp8": ("ChannelWiseTorchFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8")}.get(
            fmt, ("EmulationNvFp4LinearKernel", "CompressedTensorsW4A4Fp4"))
    if fmt == "fp8-online":
        return ("CutlassFP8ScaledMMLinearKernel" if cc >= (8, 9) else "MarlinFP8ScaledMMLinearKernel", "Fp8LinearMethod")
    if fmt == "fp8":
        return ("CutlassFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8") if cc >= (8, 9) else \
            ("HummingFP8ScaledMMLinearKernel", "CompressedTensorsW8A16Fp8")
    if fmt == "int8":
        return "CutlassInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8"
    if fmt == "int4":
        return ("MacheteLinearKernel" if cc == (9, 0) else "MarlinLinearKernel"), "CompressedTensorsWNA16"
    if fmt in ("nvfp4", "nvfp4a16"):
        kernel = "HummingNvFp4LinearKernel" if cc == (9, 0) else ("FlashInferCuteDslNvFp4LinearKernel" if cc >= (10, 0)
                                                                   else "MarlinNvFp4LinearKernel")
        if fmt == "nvfp4a16" and cc >= (10, 0):
            kernel = "FlashInferCuteDslNvFp4W4A16LinearKernel"
        return kernel, "CompressedTensorsW4A4Fp4"
    if fmt in ("mxfp4", "mxfp4a16"):
        kernel = "HummingMxFp4LinearKernel" if cc == (9, 0) else ("FlashInferMxFp4LinearKernel" if cc >= (10, 0)
                                                                   else "MarlinMxFp4LinearKernel")
        return kernel, "CompressedTensorsW4A4Mxfp4"
    return None
