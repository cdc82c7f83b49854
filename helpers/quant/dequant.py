"""A compressed-tensors checkpoint turned back into plain float weights: the real quantizer's values, served anywhere.

GPTQ and AWQ choose their integer codes from calibration data, so no rounding rule here can reproduce them; but the
codes and scales they wrote can be multiplied back out. The result holds exactly the weights the quantized kernel
computes with (each ``code x scale`` is exact in float32), so a machine without that kernel still measures the
checkpoint's *quality* — not its speed or memory::

    ckpt = quant.build("default", quant.W4A16_GPTQ)      # int4 codes + scales, as llm-compressor wrote them
    served = quant.servable(ckpt)                        # itself where this machine runs INT4, else dequantized
    served.kind, served.details.get("why")               # "dequantized", and check_servable's reason

Formats read: ``int-quantized`` (INT8), ``pack-quantized`` (INT4/INT8 packed in int32, symmetric or with zero
points, optional ``g_idx``), ``float-quantized`` (FP8), ``nvfp4-pack-quantized`` and ``mxfp4-pack-quantized``.
Quantized Linear weights are written as float32; every other tensor is copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from . import cache
from .recipes import UnservableError, check_servable, checkpoint_format
from .tensors import Folder, write_shard

__all__ = ["dequantize_module", "dequantized_checkpoint", "servable"]

_VERSION = 2  # bump when the output changes: old caches are then rebuilt
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape", "weight_g_idx",
          "input_scale", "input_global_scale", "input_zero_point")


def _unpack_int32(packed: Any, bits: int, cols: int, dim: int = 1) -> Any:
    """compressed-tensors' packing: ``32 // bits`` unsigned codes per int32, lowest bits first, offset by
    ``2**(bits-1)``; returns signed codes (int32) with the padding cut to ``cols`` along ``dim``."""
    import torch

    per = 32 // bits
    x = packed if dim == 1 else packed.t()
    u = x.to(torch.int64) & 0xFFFFFFFF
    parts = [(u >> (bits * k)) & ((1 << bits) - 1) for k in range(per)]
    codes = torch.stack(parts, dim=-1).reshape(x.shape[0], -1)[:, :cols] - (1 << (bits - 1))
    codes = codes.to(torch.int32)
    return codes if dim == 1 else codes.t()


def _unpack_fp4(packed: Any) -> Any:
    """Two E2M1 codes per byte, low nibble first; bit 3 of a code is its sign."""
    import torch

    table = torch.tensor(_E2M1, dtype=torch.float32)
    b = packed.to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(packed.shape[0], -1)
    sign = torch.where(codes & 8 != 0, -1.0, 1.0)
    return table[codes & 7] * sign


def _per_column(scale: Any, cols: int, g_idx: Any = None) -> Any:
    """A ``[rows, groups]`` (or ``[rows, 1]``, or ``[1]``) tensor of scales spread to one per column."""
    import torch

    scale = scale.float()
    if scale.dim() == 0 or scale.numel() == 1:
        return scale.reshape(1, 1)
    if scale.dim() == 1:
        scale = scale.reshape(-1, 1)
    if scale.shape[1] == 1:
        return scale
    if g_idx is not None:
        return scale[:, g_idx.long()]
    return torch.repeat_interleave(scale, cols // scale.shape[1], dim=1)


def dequantize_module(tensors: dict[str, Any], fmt: str, weights: dict[str, Any]) -> Any:
    """One Linear layer's float32 weight from its stored parts (``weight``/``weight_packed``, ``weight_scale``, ...,
    named without the module prefix), given the checkpoint's ``format`` and its ``weights`` quantization args.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    import torch

    bits = int(weights.get("num_bits") or 8)
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        values = _unpack_fp4(tensors["weight_packed"])
        scale = tensors["weight_scale"]
        if fmt == "mxfp4-pack-quantized":  # E8M0: a power of two stored as its biased exponent
            scale = torch.pow(2.0, scale.to(torch.float32) - 127.0)
        else:  # FP8 E4M3 block scales under a per-tensor FP32 factor they were multiplied by
            scale = scale.float() / tensors["weight_global_scale"].float().reshape(1, 1)
        return values * _per_column(scale, values.shape[1])
    if fmt == "pack-quantized":
        rows, cols = (int(v) for v in tensors["weight_shape"].tolist())
        codes = _unpack_int32(tensors["weight_packed"], bits, cols).float()
    elif fmt in ("int-quantized", "float-quantized", "naive-quantized"):
        codes = tensors["weight"].float()
        rows, cols = codes.shape
    else:
        raise ValueError(f"cannot dequantize compressed-tensors format {fmt!r}: this reads int-quantized, "
                         "pack-quantized, float-quantized, nvfp4-pack-quantized and mxfp4-pack-quantized")
    g_idx = tensors.get("weight_g_idx")
    zp = tensors.get("weight_zero_point")
    if zp is not None:
        if fmt == "pack-quantized" and zp.dtype == torch.int32 and bits < 8:
            groups = tensors["weight_scale"].shape[-1]
            zp = _unpack_int32(zp, bits, rows, dim=0)[:rows, :groups]
        codes = codes - _per_column(zp.float(), cols, g_idx)
    return codes * _per_column(tensors["weight_scale"], cols, g_idx)


def _plain_shape(folder: Folder, module: str) -> tuple[int, int]:
    """A quantized module's float weight shape, from its headers: ``weight_shape``'s values when packed (read), else
    its codes' shape (FP4: two codes a byte)."""
    if f"{module}.weight_shape" in folder:
        rows, cols = (int(v) for v in folder.get(f"{module}.weight_shape").tolist())
        if rows and cols:
            return rows, cols
    if f"{module}.weight" in folder:
        return tuple(folder.info[f"{module}.weight"].shape)  # type: ignore[return-value]
    packed = folder.info[f"{module}.weight_packed"]
    per = 2 if packed.dtype == "U8" else 8  # FP4 two a byte; int4 eight an int32
    return packed.shape[0], packed.shape[1] * per


def dequantized_checkpoint(ckpt: "cache.Checkpoint | str | Path") -> cache.Checkpoint:
    """A plain checkpoint holding ``ckpt``'s quantized weights multiplied back out (float32), cached by content.

    ``config.json`` loses its ``quantization_config``, so vLLM loads it as an ordinary model in the profile's
    dtype. ``details["source"]`` names the compressed checkpoint and ``details["layers"]`` how many weights were
    dequantized.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    import torch

    src = Path(getattr(ckpt, "path", ckpt))
    config = json.loads((src / "config.json").read_text())
    qcfg = config.get("quantization_config")
    if not qcfg:
        raise ValueError(f"{src} holds no quantization_config: it is already a plain checkpoint")
    groups = [g for g in (qcfg.get("config_groups") or {}).values() if g.get("weights")]
    if len(groups) != 1:
        raise ValueError(f"{src}: expected one quantization group with weights, found {len(groups)}")
    weights = groups[0]["weights"]
    fmt = groups[0].get("format") or qcfg.get("format")
    key = cache.digest(cache.model_digest(src), torch.__version__, cache.file_digest(Path(__file__)), _VERSION)
    name = f"{src.name.rsplit('-', 1)[0]}-dequantized"

    def make(out: Path) -> dict[str, Any]:
        import torch

        folder = Folder(src)
        for f in sorted(src.iterdir()):
            if f.suffix != ".safetensors" and f.is_file() and f.name not in (cache.METADATA, "config.json",
                                                                              "recipe.yaml"):
                shutil.copy2(f, out / f.name)
        # A module's parts (codes, scales, zero points) are gathered by name, whichever shards they were saved in,
        # and its float weight goes where its codes were.
        modules = sorted({n.rsplit(".", 1)[0] for n in folder.info if n.endswith(("weight_scale", "weight_packed"))})
        parts_of = {m: [f"{m}.{p}" for p in (*_PARTS, "weight") if f"{m}.{p}" in folder] for m in modules}
        owned = {n: m for m, names in parts_of.items() for n in names}
        layers = 0
        for shard, names in folder.shards():
            written = []
            for n in names:
                m = owned.get(n)
                if m is None:
                    info = folder.info[n]
                    written.append((n, info.dtype, info.shape, folder.copied(n)))
                    continue
                codes = f"{m}.weight_packed" if f"{m}.weight_packed" in folder else f"{m}.weight"
                if n != codes:
                    continue
                names_m = parts_of[m]
                stored = [x for x in names_m if x.endswith((".weight", ".weight_packed", ".weight_scale"))]
                if not any(folder.data_rows(x) for x in stored):  # codes and scales all holes: zeros, a hole
                    rows, cols = _plain_shape(folder, m)
                    written.append((f"{m}.weight", "F32", (rows, cols), None))
                else:
                    parts = {x.rsplit(".", 1)[1]: folder.get(x) for x in names_m}
                    w = dequantize_module(parts, fmt, weights).contiguous().to(torch.float32)
                    written.append((f"{m}.weight", "F32", tuple(w.shape), w))
                layers += 1
            write_shard(out / shard.name, written, folder.metadata.get(shard) or {"format": "pt"})
        index = src / "model.safetensors.index.json"
        if index.is_file():
            idx = json.loads(index.read_text())
            wm = {}
            for shard, names in folder.shards():
                for n in names:
                    m = owned.get(n)
                    wm[f"{m}.weight" if m else n] = shard.name
            (out / index.name).write_text(json.dumps({"metadata": idx.get("metadata", {}), "weight_map": wm},
                                                     indent=2))
        plain = {k: v for k, v in config.items() if k != "quantization_config"}
        (out / "config.json").write_text(json.dumps(plain, indent=2))
        return {"source": str(src), "source_format": checkpoint_format(src), "layers": layers}

    meta = getattr(ckpt, "recipe", None) or {"from": src.name}
    return cache.build_once(name, key, make, kind="dequantized", source_model=str(src), recipe=dict(meta))


def servable(ckpt: cache.Checkpoint, machine: Any = None) -> cache.Checkpoint:
    """What this machine serves for ``ckpt``: ``ckpt`` itself when :func:`~helpers.quant.check_servable` accepts
    it, else its :func:`dequantized_checkpoint` with the refusal in ``details["why"]`` — the same weights, so the
    same quality, without the speed or memory of the format.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    try:
        check_servable(ckpt.path, machine)
        return ckpt
    except UnservableError as e:
        plain = dequantized_checkpoint(ckpt)
        plain.details["why"] = str(e)
        return plain
