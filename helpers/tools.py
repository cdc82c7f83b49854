"""The tools a lab needs beyond its own Python packages: is each one here, and how to install it on this route.

A lab's plan names them (``PLAN.tools``: vllm-router, Prometheus, promtool, the npm CRD schemas, llm-compressor,
lm-eval ...); the lab calls :func:`require` before its first cell that uses one, so a missing tool stops it at once
with what to run, instead of failing halfway::

    tools.require(PLAN.tools)        # ToolsMissing: "promtool: not on PATH. On Colab: ..., locally: make setup"
    tools.status("vllm-router")      # (True, "/work/.venv/bin/vllm-router")

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import settings
from .plan.resources import TOOLS

__all__ = ["ToolsMissing", "status", "missing", "require", "route"]


class ToolsMissing(RuntimeError):
    """Tools a lab needs are not installed; the message says, for each, how to install it on this route.

    Introduced in lab 12 (FP8 as the Default).
    """


def route() -> str:
    """``"colab"`` in a Colab runtime (no ``make`` there), else ``"make setup"``.

    Introduced in lab 12 (FP8 as the Default).
    """
    return "colab" if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ else "make setup"


def _exe(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # a virtual environment's console scripts, when it is not activated
    if beside.is_file():
        return str(beside)
    # a daemon's binary (nginx) lives in sbin, which a user's PATH may leave out
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def _quant_has(module: str) -> tuple[bool, str]:
    from .quant.env import QuantEnvMissing, quant_python

    try:
        python = quant_python()
    except QuantEnvMissing as e:
        return False, str(e).split(":")[0]
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    ok = subprocess.run([str(python), "-c", code], capture_output=True, timeout=120).returncode == 0
    return ok, f"{python}" if ok else f"{python} cannot import {module}"


def status(tool: str | Mapping[str, Any]) -> tuple[bool, str]:
    """(installed, where it is or what is missing) for a tool of :data:`helpers.plan.resources.TOOLS` (its name,
    or a ``PLAN.tools`` entry).

    Introduced in lab 12 (FP8 as the Default).
    """
    entry = TOOLS[tool] if isinstance(tool, str) else tool
    kind, _, name = entry["check"].partition(":")
    if kind == "module":
        spec = importlib.util.find_spec(name)
        return (spec is not None, spec.origin or name) if spec else (False, f"Python cannot import {name}")
    if kind == "exe":
        found = _exe(name)
        return (True, found) if found else (False, f"{name} is not on PATH")
    if kind == "quant":
        return _quant_has(name)
    if kind == "npm":
        if not shutil.which("node"):
            return False, "node is not on PATH (Node.js 20+)"
        try:
            from .fleet import validate

            return True, str(validate.npm_modules())
        except Exception as e:  # noqa: BLE001 - ValidatorMissing, or PyYAML missing for the fleet package itself
            return False, str(e)
    raise ValueError(f"unknown check {entry['check']!r}")


def missing(tools: Iterable[str | Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, what is missing) for each tool of ``tools`` that is not installed.

    Introduced in lab 12 (FP8 as the Default).
    """
    out = []
    for t in tools:
        name = t if isinstance(t, str) else t["name"]
        ok, detail = status(t)
        if not ok:
            out.append((name, detail))
    return out


def require(tools: Iterable[str | Mapping[str, Any]]) -> None:
    """Raise :class:`ToolsMissing`, saying how to install each on this route, unless every tool is here.

    Introduced in lab 12 (FP8 as the Default).
    """
    gone = missing(tools)
    if not gone:
        return
    where = route()
    root = settings.repo_root()
    lines = [f"- {name}: {detail}. Installed by {TOOLS[name][where]} ({TOOLS[name]['for']})." for name, detail in gone]
    how = (f"On Colab, run `!python {root}/scripts/colab_setup.py` again (it installs them, apt and npm as root) "
           "and restart the runtime if it says so." if where == "colab" else
           "Run `make setup` in the repository (scripts/install_tools.sh needs root or sudo for apt-get, and npm; "
           "it says what it could not install).")
    raise ToolsMissing("this lab needs tools that are not installed:\n" + "\n".join(lines) + "\n" + how)
