"""A bf16 checkpoint whose Linear weights went through a number format and back: any format's accuracy, served on CPU.

::

    ckpt = quant.fake_quantized_checkpoint("default", "nvfp4")   # weights rounded to NVFP4, stored as bf16
    server.start(PROFILE, model=str(ckpt.path))                   # vLLM serves it like the original
    ckpt.details["error"]                                         # MSE, max |error|, SQNR over the quantized weights

The model computes in bf16, so this shows what the format does to the *weights* (the accuracy side of a lab),
not its speed or memory. Embeddings and the LM head stay as they are unless ``quantize_embeddings``; norms and
biases (1-D) always do. For NVFP4, layers vLLM fuses into one matmul (q/k/v and gate/up) share one per-tensor
scale, as in llm-compressor's checkpoints. Cached by content hash, like :func:`helpers.quant.build`.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

from . import cache
from .build import _short_name, model_dir
from .formats import FORMATS, error_stats, nvfp4_global_scale, quantize
from .recipes import check_group_size, linear_shapes
from .tensors import Folder, write_shard

__all__ = ["fake_quantized_checkpoint", "FAKE_DEFAULTS"]

#: Scale granularity per format when none is given (as the real checkpoints store them).
FAKE_DEFAULTS: dict[str, dict[str, Any]] = {
    "fp8_e4m3": {"granularity": "channel"},
    "fp8_e5m2": {"granularity": "channel"},
    "int8": {"granularity": "channel"},
    "int4": {"granularity": "group", "group_size": 128},
    "nvfp4": {},
    "mxfp4": {},
}
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_VERSION = 2  # bump when the rounding or the file layout changes: old caches are then rebuilt


def _fused_global_scales(tensors: dict, names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        module, leaf = name[: -len(".weight")].rsplit(".", 1)
        group = next((g for g in _FUSED if leaf in g), (leaf,))
        members = [f"{module}.{m}.weight" for m in group if f"{module}.{m}.weight" in tensors]
        out[name] = min(nvfp4_global_scale(tensors[m]) for m in members)
    return out


def fake_quantized_checkpoint(model: str | os.PathLike | None, fmt: str, *, granularity: str | None = None,
                              group_size: int | None = None, symmetric: bool = True, mx_scale: str = "ocp",
                              quantize_embeddings: bool = False, skip: tuple[str, ...] = ("lm_head",)) -> cache.Checkpoint:
    """A copy of ``model`` with every Linear weight replaced by ``fake_quantize(weight, fmt, ...)``, in the model's
    dtype, servable by vLLM on CPU. Options as :func:`helpers.quant.formats.quantize` (defaults:
    :data:`FAKE_DEFAULTS`); ``skip`` names modules left alone. ``details["error"]`` holds the error statistics
    over all quantized weights, ``details["layers"]`` how many tensors were rounded.

    Introduced in lab 12 (FP8 as the Default).
    """
    import torch

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    src = model_dir(model)
    opts = dict(FAKE_DEFAULTS[fmt])
    if granularity is not None:
        opts["granularity"] = granularity
    if group_size is not None:
        opts["group_size"] = group_size
    if fmt in ("int8", "int4"):
        opts["symmetric"] = symmetric
    if fmt == "mxfp4":
        opts["mx_scale"] = mx_scale
    block = {"nvfp4": 16, "mxfp4": 32}.get(fmt) or (opts.get("group_size") if opts.get("granularity") == "group"
                                                      else None)
    if block:
        check_group_size(src, block, ignore=skip, include_embeddings=quantize_embeddings)
    spec = {"format": fmt, "options": opts, "quantize_embeddings": quantize_embeddings, "skip": list(skip)}
    key = cache.digest(cache.model_digest(src), spec, torch.__version__, cache.file_digest(Path(__file__)),
                       cache.file_digest(Path(__file__).with_name("formats.py")), _VERSION)
    suffix = f"-g{opts['group_size']}" if opts.get("granularity") == "group" else ""
    name = f"{_short_name(model)}-fake-{fmt.replace('_', '-')}{suffix}"

    def make(out: Path) -> dict[str, Any]:
        import torch

        targets = set(linear_shapes(src, skip, include_embeddings=quantize_embeddings))
        folder = Folder(src)
        sq_err = sq_sig = 0.0
        max_abs, count, numel = 0.0, 0, 0
        for f in sorted(src.iterdir()):
            if f.suffix != ".safetensors" and f.is_file() and f.name != cache.METADATA:
                shutil.copy2(f, out / f.name)
        for shard, names in folder.shards():
            # Rows that hold no data are zeros, and stay zeros through every format here (rows are quantized
            # independently, and a tensor's or a fused group's scale comes from its largest value): only the rows
            # with data are read and rounded (all of them, in an ordinary checkpoint).
            rows = {n: folder.data_rows(n) for n in names if n in targets}
            shared = _fused_global_scales({n: folder.get_rows(n, rows[n]) for n in rows if rows[n]},
                                          [n for n in rows if rows[n]]) if fmt == "nvfp4" else {}
            written = []
            for n in names:
                info = folder.info[n]
                if n not in targets:
                    written.append((n, info.dtype, info.shape, folder.copied(n)))
                    continue
                count, numel = count + 1, numel + math.prod(info.shape)
                if not rows[n]:
                    written.append((n, info.dtype, info.shape, None))
                    continue
                w = folder.get_rows(n, rows[n])
                extra = {"global_scale": shared[n]} if n in shared else {}
                w_hat = quantize(w, fmt, **opts, **extra).dequantized.to(w.dtype)
                st = error_stats(w, w_hat)
                sq_err += st.mse * w.numel()
                sq_sig += float(w.double().pow(2).sum())
                max_abs = max(max_abs, st.max_abs)
                parts, at = [], 0
                for r0, r1 in rows[n]:
                    parts.append((r0, w_hat[at:at + r1 - r0].contiguous()))
                    at += r1 - r0
                written.append((n, info.dtype, info.shape, parts))
            write_shard(out / shard.name, written, folder.metadata.get(shard) or {"format": "pt"})
        if not count:
            raise ValueError(f"{src} has no Linear weights to quantize (skip={skip})")
        mse = sq_err / numel
        return {"layers": count, "params": numel, "torch": torch.__version__,
                "error": {"mse": mse, "max_abs": max_abs, "rel_rmse": (sq_err / sq_sig) ** 0.5 if sq_sig else 0.0}}

    return cache.build_once(name, key, make, kind="fake-quantized", source_model=str(model or "default"), recipe=spec)
