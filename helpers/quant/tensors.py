"""A safetensors checkpoint as named tensors, read and written one at a time.

A copy of a model that changes some tensors (fake quantization, dequantization) used to load each shard whole — five
gigabytes of RAM at a time for an 8B model, and a module whose weight and scale landed in two shards could not be
put together. Here every tensor is found by name across the shards (``Folder``), read alone, and written back into a
shard laid out like its source (:func:`write_shard`).

A region of a file that holds no data (a hole of a sparse file) reads as zeros, so it is never read: ``data_rows``
says which rows of a tensor hold any data, and a copy writes holes where the output is zero. On an ordinary checkpoint
every row holds data and nothing changes; on a sparse one (a rehearsal's stand-in download) a copy of 16 GB of zeros
costs what its few data rows cost.

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Folder", "TensorInfo", "write_shard", "data_regions", "DTYPES"]

#: safetensors dtype -> (torch dtype name, bytes per element)
DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
          "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
          "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1)}
_TORCH_TO_ST = {v[0]: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: its file, safetensors dtype, shape and absolute byte range.

    Introduced in lab 12 (FP8 as the Default).
    """

    name: str
    file: Path
    dtype: str          # safetensors' name (BF16, I8, ...)
    shape: tuple[int, ...]
    start: int          # absolute byte offsets in the file
    end: int

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return (self.end - self.start) // max(self.rows, 1)


def _header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return json.loads(fh.read(n)), 8 + n


def data_regions(path: Path, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) of ``path`` that hold data (all of it where the file system cannot tell holes).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if end <= start:
        return []
    out: list[tuple[int, int]] = []
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return [(start, end)]
    try:
        pos = start
        while pos < end:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            if data >= end:
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            out.append((data, min(hole, end)))
            pos = hole
    except (AttributeError, OSError):
        return [(start, end)]
    finally:
        os.close(fd)
    return out


class Folder:
    """The tensors of a checkpoint folder's ``*.safetensors`` files, by name, from their headers alone.

    Introduced in lab 12 (FP8 as the Default).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.info: dict[str, TensorInfo] = {}
        self.files: dict[Path, list[str]] = {}
        self.metadata: dict[Path, dict[str, str]] = {}
        for f in sorted(self.path.glob("*.safetensors")):
            header, base = _header(f)
            self.metadata[f] = header.pop("__metadata__", None) or {}
            names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
            self.files[f] = names
            for k in names:
                s, e = header[k]["data_offsets"]
                self.info[k] = TensorInfo(k, f, header[k]["dtype"], tuple(header[k]["shape"]), base + s, base + e)

    def __contains__(self, name: str) -> bool:
        return name in self.info

    def shards(self) -> Iterator[tuple[Path, list[str]]]:
        yield from self.files.items()

    def data_rows(self, name: str) -> list[tuple[int, int]]:
        """The row ranges ``[(r0, r1), ...]`` of tensor ``name`` that may hold data; every other row is zeros because
        its bytes are a hole (``[]``: nothing but holes). An ordinary file: ``[(0, rows)]``. File systems keep holes in
        whole blocks, so a range can take in rows of zeros next to the data (and the first rows of a tensor whose
        neighbour's data shares a block): those are read, which is never wrong, only not free."""
        t = self.info[name]
        rb = max(t.row_bytes, 1)
        out: list[tuple[int, int]] = []
        for a, b in data_regions(t.file, t.start, t.end):
            r0, r1 = (a - t.start) // rb, min(-(-(b - t.start) // rb), t.rows)
            if out and r0 <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], r1))
            elif r1 > r0:
                out.append((int(r0), int(r1)))
        return out

    def get_rows(self, name: str, ranges: list[tuple[int, int]]) -> Any:
        """The rows of ``ranges`` of tensor ``name``, one after another (torch)."""
        import torch

        parts = [self.get(name, r) for r in ranges]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def get(self, name: str, rows: tuple[int, int] | None = None) -> Any:
        """Tensor ``name`` as torch (only ``rows`` of it, when given)."""
        import torch

        t = self.info[name]
        r0, r1 = rows if rows is not None else (0, t.rows)
        dt, size = DTYPES[t.dtype]
        per_row = math.prod(t.shape[1:]) if len(t.shape) > 1 else 1
        count = (r1 - r0) * per_row if t.shape else 1
        with open(t.file, "rb") as fh:
            fh.seek(t.start + r0 * per_row * size)
            raw = bytearray(fh.read(count * size))
        out = torch.frombuffer(raw, dtype=getattr(torch, dt)) if count else torch.empty(0, dtype=getattr(torch, dt))
        return out.reshape((r1 - r0, *t.shape[1:]) if t.shape else ())

    def raw(self, name: str, rows: tuple[int, int] | None = None) -> bytes:
        """Tensor ``name``'s bytes as stored (only ``rows`` of it, when given)."""
        t = self.info[name]
        r0, r1 = rows if rows is not None else (0, t.rows)
        with open(t.file, "rb") as fh:
            fh.seek(t.start + r0 * t.row_bytes)
            return fh.read((r1 - r0) * t.row_bytes)

    def copied(self, name: str) -> Any:
        """What :func:`write_shard` needs to copy tensor ``name`` unchanged: the row ranges that may hold data (a hole
        stays a hole), or ``None`` when it is all holes."""
        ranges = self.data_rows(name)
        return [(r0, self.raw(name, (r0, r1))) for r0, r1 in ranges] or None


def write_shard(path: str | os.PathLike, tensors: list[tuple[str, str, tuple[int, ...], Any]],
                metadata: dict[str, str] | None = None) -> int:
    """Write a safetensors file of ``(name, dtype, shape, content)`` in that order, and return its size. ``content``
    is a torch tensor (the whole tensor), raw ``bytes``, a list of ``(first_row, tensor or bytes)`` (those rows; the
    rest zeros), or ``None`` (all zeros). Zeros are written as holes.

    Introduced in lab 12 (FP8 as the Default).
    """
    header: dict[str, Any] = {}
    off = 0
    for name, dtype, shape, _ in tensors:
        n = DTYPES[dtype][1] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = metadata or {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    base = 8 + len(raw)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, dtype, shape, content in tensors:
            start = base + header[name]["data_offsets"][0]
            if content is None:
                continue
            row = DTYPES[dtype][1] * (math.prod(shape[1:]) if len(shape) > 1 else 1)
            for first, part in (content if isinstance(content, list) else [(0, content)]):
                fh.seek(start + first * row)
                fh.write(part if isinstance(part, (bytes, bytearray)) else _bytes(part))
        fh.truncate(base + off)
    return base + off


def _bytes(t: Any) -> bytes:
    import torch

    t = t.contiguous().cpu()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def st_dtype(t: Any) -> str:
    """The safetensors name of a torch tensor's dtype."""
    return _TORCH_TO_ST[str(t.dtype).replace("torch.", "")]
