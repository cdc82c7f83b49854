"""The tools whose pins clash with vLLM's get their own virtual environments (``.venv-guidellm``,
``.venv-aiperf``; git ignores ``.venv-*/``), created on first use."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["ensure", "installed_version", "site_packages"]


def ensure(venv: Path, pins: Sequence[str], exe: str, log: Callable[[str], None] = print,
           timeout_s: float = 1800) -> tuple[Path | None, str]:
    """The executable ``exe`` of ``venv``, creating the environment with ``pins`` if needed; (None, why) if not."""
    path = venv / "bin" / exe
    if path.exists():
        return path, ""
    log(f"creating {venv} ({' '.join(pins)}); this takes a few minutes")
    python3 = shutil.which("python3") or sys.executable
    venv.mkdir(parents=True, exist_ok=True)
    logf = venv / "install.log"  # inside the environment, which git ignores (.venv-*/)
    try:
        with open(logf, "w") as fh:
            subprocess.run([python3, "-m", "venv", str(venv)], check=True, stdout=fh, stderr=subprocess.STDOUT)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pins], check=True, stdout=fh,
                           stderr=subprocess.STDOUT, timeout=timeout_s)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"could not install {' '.join(pins)} into {venv} ({type(e).__name__}; log: {logf})"
    return (path, "") if path.exists() else (None, f"no {path} after installing (log: {logf})")


def site_packages(venv: Path) -> Path | None:
    found = sorted((venv / "lib").glob("python*/site-packages"))
    return found[0] if found else None


def installed_version(venv: Path, dist: str) -> str | None:
    """``dist``'s version in ``venv``, read from its ``.dist-info`` folder (nothing is imported)."""
    sp = site_packages(venv)
    if sp is None:
        return None
    meta = sorted(sp.glob(f"{dist.replace('-', '_')}-*.dist-info")) or sorted(sp.glob(f"{dist}-*.dist-info"))
    return meta[0].name.removesuffix(".dist-info").split("-", 1)[1] if meta else None
