"""Running one tool as a process: between two ``/metrics`` scrapes, with its CPU measured, stopped on time-out.

Each tool runs as a :class:`helpers.procs.Proc` (its own session, registered, logged to ``OUT/tool.log``). This
module waits for it to exit; on a time-out or Ctrl-C it stops the tool's whole session (GuideLLM's worker
processes and AIPerf's services included), and in every case it stops whatever the tool left behind. Around the
run the server's ``/metrics`` is scraped, so :class:`helpers.metrics.ServerView` holds the server's own view of
exactly that tool's requests.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import psutil

from helpers import metrics, procs, settings
from helpers.metrics import ServerView

from .records import Target, ToolRun

__all__ = ["tool_env", "repo_on_path", "TreeCPU", "run_tool", "window_cpu", "tail", "STARTUP_S"]

STARTUP_S = 5.0  # "the first seconds" of a run, when a client may still be starting up


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a tool runs in: offline, no usage reporting, plain unbuffered output, ``extra`` on top."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.pop("FORCE_COLOR", None)
    env.update(extra or {})
    return env


def repo_on_path() -> dict[str, str]:
    """``PYTHONPATH`` with this repository first, for the tools that run this repository's code (ours, and the
    ``vllm bench serve`` runner), whether or not the package is installed."""
    root = settings.repo_root()
    if root is None:
        raise RuntimeError("the side-by-side runs from a checkout of the labs (it runs this repository's code): "
                           "set LABS_HOME to it, or run from inside it")
    return {"PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}


class TreeCPU:
    """Samples the CPU seconds of a process and all its descendants (GuideLLM and AIPerf fork workers)."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []  # (time.time(), cumulative CPU s)
        self._seen: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            tree = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        for p in tree:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                self._seen[(p.pid, p.create_time())] = t.user + t.system
        self.samples.append((time.time(), sum(self._seen.values())))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> "TreeCPU":
        self._th.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._th.join(timeout=5)

    def between(self, t0: float, t1: float) -> float | None:
        """CPU seconds used between two wall-clock times (linear between samples)."""
        if len(self.samples) < 2:
            return None
        ts, cs = np.array([s[0] for s in self.samples]), np.array([s[1] for s in self.samples])
        return float(np.interp(t1, ts, cs) - np.interp(t0, ts, cs))


def _scrape(target: Target) -> metrics.Snapshot | None:
    try:
        return metrics.scrape(target.endpoint.root, timeout=10.0)
    except metrics.MetricsUnavailable:
        return None


def _run(cmd: Sequence[str], name: str, log_path: Path, timeout_s: float, cwd: Path,
         env: Mapping[str, str]) -> tuple[int, float, float, TreeCPU]:
    """Run ``cmd`` as a Proc until it exits; returns (exit code, wall s, CPU s of its process tree, sampler).

    Past ``timeout_s``, or on Ctrl-C, its whole session is stopped (exit code -9 for a time-out; Ctrl-C is
    re-raised). Whatever it left running in its session is stopped in any case.
    """
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = procs.Proc(cmd, kind="tool", name=name, log_path=log_path, env=env, cwd=cwd).start()
    sampler = TreeCPU(proc.pid).start()
    try:
        rc = proc.popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = -9
    finally:
        sampler.stop()
        proc.stop(timeout=10)  # the tool's session: workers it forked, services it started
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rc, wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), sampler


def run_tool(run: ToolRun, target: Target, cmd: Sequence[str], out: Path, timeout_s: float, cwd: Path,
             result: str, env: Mapping[str, str] | None = None) -> TreeCPU | None:
    """Run one tool between two /metrics scrapes; fill ``run``'s wall, CPU and server view.

    Returns the CPU sampler, or None (with ``run.error`` saying why) when the tool left no ``out / result``.
    """
    before = _scrape(target)
    rc, run.wall_s, run.cpu_s, cpu = _run(cmd, f"{run.tool}-round{run.round}", out / "tool.log", timeout_s, cwd,
                                          tool_env(env))
    run.server = ServerView.between(before, _scrape(target))
    if not (out / result).is_file():
        why = "it ran past its time limit and was stopped" if rc == -9 else f"exit code {rc}"
        run.ok, run.error = False, f"{why}, no {result}:\n{tail(out / 'tool.log')}"
        return None
    return cpu


def tail(path: Path, n: int = 15) -> str:
    """The last ``n`` lines of a log, without the noise some tools print at exit (nanobind leak reports)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [x for x in lines if "leaked" not in x and "nanobind" not in x and "skipped remainder" not in x]
    return "\n".join(lines[-n:])


def window_cpu(run: ToolRun, cpu: TreeCPU) -> None:
    """The tool's CPU seconds while its requests were in flight (first send to last end)."""
    t0 = [r.t0_wall for r in run.reqs if r.t0_wall is not None]
    t1 = [r.t0_wall + (max(r.last_ms or 0.0, r.close_ms or 0.0)) / 1000.0 for r in run.reqs
          if r.t0_wall is not None and r.ok]
    if t0 and t1:
        a, b = min(t0), max(t1)
        run.window_s = b - a
        run.cpu_in_window_s = cpu.between(a, b)
        # the first seconds against the rest: a client still starting up competes with its first requests
        k = min(STARTUP_S, run.window_s / 2)
        first, rest = cpu.between(a, a + k), cpu.between(a + k, b)
        run.extra["cores_first_s"] = first / k if first is not None and k > 0 else None
        run.extra["cores_after_first_s"] = rest / (b - a - k) if rest is not None and b - a - k > 0 else None
