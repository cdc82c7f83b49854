"""Checkpoints cached by what went into them: a content hash, a lock, and a folder that appears whole or not at all.

A checkpoint lives in ``settings.cache_dir() / "quantized" / <name>-<hash>``. The hash covers every input that
changes the output: the source model's files (their bytes, hashed once and remembered by size and mtime), the
recipe, the calibration data's bytes, how it is sampled, and the tool's version. So a second request for the same
thing finds the folder (milliseconds), and a change to any input builds a new one.

Building happens in a temporary sibling folder under an exclusive file lock; only a finished build is renamed
into place, with its metadata (``labs_quant.json``) written last inside it. A build that dies — killed, out of
memory, an exception — leaves no folder under the final name, and the next build clears its leftovers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import settings
from .tensors import data_regions

__all__ = ["Checkpoint", "METADATA", "quantized_dir", "file_digest", "model_digest", "digest", "cached", "build_once",
           "discard",
           "dir_bytes"]

#: The file that marks a finished checkpoint and records how it was made.
METADATA = "labs_quant.json"
_HASH_MEMO = ".file-hashes.json"


@dataclass
class Checkpoint:
    """A checkpoint on disk and how it was made.

    ``path`` is the folder vLLM loads. ``kind`` is ``"compressed-tensors"`` (llm-compressor's output) or
    ``"fake-quantized"`` (bf16 weights rounded through a format). ``recipe`` is the recipe (or format and options)
    as a dict; ``seconds`` how long the build took when it ran (a cache hit keeps the original build's time);
    ``bytes_on_disk`` every file in the folder but the metadata, ``weight_bytes`` the safetensors files alone. ``cache_hit`` says
    whether this call found it ready. ``details`` holds the rest (calibration, versions, the worker's timings).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """

    path: Path
    name: str
    kind: str
    key: str
    source_model: str
    recipe: dict[str, Any]
    seconds: float
    bytes_on_disk: int
    weight_bytes: int
    cache_hit: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def gib(self) -> float:
        return self.weight_bytes / 2**30

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d.pop("cache_hit")
        return d

    @classmethod
    def load(cls, path: Path, cache_hit: bool = True) -> "Checkpoint":
        """Read a finished checkpoint's metadata."""
        d = json.loads((Path(path) / METADATA).read_text())
        d["path"] = Path(path)
        return cls(**d, cache_hit=cache_hit)


def quantized_dir() -> Path:
    """``settings.cache_dir() / "quantized"`` (created).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    d = settings.cache_dir() / "quantized"
    d.mkdir(parents=True, exist_ok=True)
    return d


def dir_bytes(path: Path) -> tuple[int, int]:
    """(every file's bytes, the safetensors files' bytes) in a folder.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(p.stat().st_size for p in files if p.suffix == ".safetensors")




def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, remembered by (real path, size, mtime) so a 270 MB model is read once.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    real = Path(path).resolve()
    st = real.stat()
    memo_path = quantized_dir() / _HASH_MEMO
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    memo: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError, ValueError):
        memo = json.loads(memo_path.read_text())
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    # The bytes in order; a hole of a sparse file (none in an ordinary one, whose digest is plain SHA-256) enters as
    # its length instead of as zeros: a rehearsal's 16 GB stand-in download hashes in milliseconds.
    pos = 0
    with open(real, "rb") as fh:
        for start, end in data_regions(real, 0, st.st_size):
            if start > pos:
                h.update(f"<hole {start - pos}>".encode())
            fh.seek(start)
            left = end - start
            while left > 0:
                chunk = fh.read(min(left, 1 << 22))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            pos = end
    if pos < st.st_size:
        h.update(f"<hole {st.st_size - pos}>".encode())
    with settings.file_lock(memo_path.with_suffix(".lock")):
        with contextlib.suppress(FileNotFoundError, ValueError):
            memo = json.loads(memo_path.read_text())
        memo[key] = h.hexdigest()
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_path)
    return memo[key]


def model_digest(model_dir: Path) -> str:
    """One hash over a model folder: every file's name and content (weights, config, tokenizer), ours excluded.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    h = hashlib.sha256()
    for p in sorted(Path(model_dir).iterdir()):
        if p.is_file() and p.name != METADATA and not p.name.startswith("."):
            h.update(p.name.encode() + b"\0" + file_digest(p).encode() + b"\0")
    return h.hexdigest()


def digest(*parts: Any) -> str:
    """A short (16 hex) hash of JSON-able parts, for a cache key.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached(name: str, key: str) -> Path:
    """The folder a checkpoint named ``name`` with cache key ``key`` lives in (whether built or not).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return quantized_dir() / f"{name}-{key}"


def build_once(name: str, key: str, make: Callable[[Path], dict[str, Any]], *, kind: str, source_model: str,
               recipe: dict[str, Any]) -> Checkpoint:
    """Return the cached checkpoint for ``key``, or build it once: ``make(tmp_folder)`` writes the files and returns
    details; the folder is renamed into place with its metadata. Concurrent callers wait on a lock and then find it.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    final = cached(name, key)
    if (final / METADATA).is_file():
        return Checkpoint.load(final)
    for other in final.parent.glob(f"*-{key}"):  # the same inputs under another name (a model named by its path)
        if (other / METADATA).is_file():
            return Checkpoint.load(other)
    with settings.file_lock(final.parent / f".{final.name}.lock"):
        if (final / METADATA).is_file():
            return Checkpoint.load(final)
        for stale in final.parent.glob(f".tmp-{final.name}-*"):  # a build that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # a folder without metadata: not ours to trust
            shutil.rmtree(final)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        try:
            t0 = time.perf_counter()
            details = make(tmp)
            seconds = time.perf_counter() - t0
            total, weights = dir_bytes(tmp)
            ckpt = Checkpoint(path=final, name=name, kind=kind, key=key, source_model=source_model, recipe=recipe,
                              seconds=round(seconds, 2), bytes_on_disk=total, weight_bytes=weights, details=details)
            (tmp / METADATA).write_text(json.dumps(ckpt.to_json(), indent=2))
            tmp.rename(final)
            return ckpt
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def discard(*ckpts: "Checkpoint | None", keep: bool = False, builds: bool = False) -> int:
    """Delete checkpoints a lab made and no later lab needs, at its end; returns the bytes freed.

    Fake-quantized and dequantized copies go (seconds to make again on a CPU, a minute or two for an 8B model on a
    GPU, and a dequantized 8B copy is 32 GB of float32); llm-compressor's builds go only with ``builds=True`` (their
    GPTQ and AWQ passes are what takes minutes). ``keep=True`` (a lab's ``KEEP_BUILDS`` knob) keeps everything.
    ``helpers.plan`` lists, per lab and profile, what it writes and what stays (``disk_bytes``).

    Introduced in lab 12 (FP8 as the Default).
    """
    if keep:
        return 0
    freed = 0
    for ck in {str(c.path): c for c in ckpts if c is not None}.values():
        if ck.kind == "compressed-tensors" and not builds:
            continue
        path = Path(ck.path)
        if not (path / METADATA).is_file():
            continue
        with settings.file_lock(path.parent / f".{path.name}.lock"):
            total, _ = dir_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
        freed += total
    return freed
