"""Trace replay: arrival times and exact lengths from a recorded (or written) request trace.

A trace is a JSONL file of ``{"t": seconds, "input_len": tokens, "output_len": tokens}`` per request, ``t`` counted
from any origin and non-decreasing. :class:`Trace` builds its requests (prompts of exactly ``input_len`` tokens,
outputs of exactly ``output_len``) and brings its own arrivals (:class:`TraceArrivals`), so::

    trace = bench.Trace(bench.EXAMPLE_TRACE)
    res = bench.run(trace, base_url=srv)                      # the trace's own timing
    res = bench.run(trace, trace.arrivals(time_scale=0.5), base_url=srv)   # twice as fast

``time_scale`` multiplies the trace's gaps (0.5 replays it twice as fast). ``duration_s`` in :func:`bench.run`
keeps the requests that arrive within that many (scaled) seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import settings
from .arrivals import Arrivals
from .workloads import _WARMUP_PREFIX, _WARMUP_SEED_SALT, Workload, WorkloadSpec, exact_request

__all__ = ["Trace", "TraceArrivals", "EXAMPLE_TRACE", "read_trace"]

#: A 30-second example trace written for the labs: a quiet start, a burst, then a steady rate.
EXAMPLE_TRACE = settings.data_dir() / "traces" / "example.jsonl"


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a trace, checked: ``t`` (seconds, non-decreasing), ``input_len`` and ``output_len`` (>= 1).

    Introduced in lab 10 (Load Testing Honestly).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"trace {p} not found (the labs ship {EXAMPLE_TRACE})")
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            t, a, b = float(row["t"]), int(row["input_len"]), int(row["output_len"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f'{p}:{lineno} needs {{"t": seconds, "input_len": N, "output_len": N}}: {e}') from e
        if a < 1 or b < 1:
            raise ValueError(f"{p}:{lineno}: input_len and output_len must be >= 1, got {a} and {b}")
        if rows and t < rows[-1]["t"]:
            raise ValueError(f"{p}:{lineno}: t={t} comes before the previous line's t={rows[-1]['t']}: sort the trace "
                             "by time")
        rows.append({"t": t, "input_len": a, "output_len": b})
    if not rows:
        raise ValueError(f"{p} holds no requests")
    return rows


@dataclass(frozen=True)
class TraceArrivals(Arrivals):
    """Open loop at a trace's timestamps: request ``i`` goes ``(t_i - t_0) x time_scale`` seconds after the start.

    Introduced in lab 10 (Load Testing Honestly).
    """

    path: str = str(EXAMPLE_TRACE)
    time_scale: float = 1.0
    max_in_flight: int | None = None
    name: ClassVar[str] = "trace"
    open_loop: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(self.path))
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")

    def _times(self) -> np.ndarray:
        t = np.array([r["t"] for r in read_trace(self.path)])
        return (t - t[0]) * self.time_scale

    def offsets(self, n: int) -> list[float]:
        t = self._times()
        if n > len(t):
            raise ValueError(f"the trace {self.path} holds {len(t)} requests, {n} were asked for")
        return t[:n].tolist()

    def count_for(self, duration_s: float) -> int:
        return max(1, int(np.sum(self._times() < duration_s)))

    @property
    def peak_rate(self) -> float:
        """The most requests that arrive within any one second of the (scaled) trace."""
        t = self._times()
        ends = np.searchsorted(t, t + 1.0, side="left")
        return float((ends - np.arange(len(t))).max())

    def cli_args(self) -> list[str]:
        """``--arrivals trace`` (the path comes with the workload's ``--trace``) and the time scale."""
        args = ["--arrivals", "trace", "--time-scale", f"{self.time_scale:g}"]
        if self.max_in_flight is not None:
            args += ["--max-in-flight", str(self.max_in_flight)]
        return args

    def describe(self) -> str:
        scale = f" x{self.time_scale:g}" if self.time_scale != 1 else ""
        return f"trace {Path(self.path).name}{scale}"


@dataclass
class Trace(WorkloadSpec):
    """The requests of a trace, with exact lengths, in its order; its arrivals come with it.

    ``build(n)`` takes the first ``n`` rows. Warmup requests take the trace's median lengths, with their own
    prefix. ``arrivals(time_scale=...)`` gives :class:`TraceArrivals`; :func:`helpers.bench.run` uses them when it is
    given no arrivals.

    Introduced in lab 10 (Load Testing Honestly).
    """

    path: str | Path = EXAMPLE_TRACE
    endpoint: str = "completions"
    time_scale: float = 1.0
    tokenizer: str | None = None

    def rows(self) -> list[dict[str, Any]]:
        return read_trace(self.path)

    def arrivals(self, time_scale: float | None = None, max_in_flight: int | None = None) -> TraceArrivals:
        """The trace's timing (``time_scale`` defaults to the spec's)."""
        return TraceArrivals(str(self.path), self.time_scale if time_scale is None else time_scale, max_in_flight)

    def default_arrivals(self) -> TraceArrivals:
        return self.arrivals()

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        rows = self.rows()
        if num_requests > len(rows):
            raise ValueError(f"the trace {self.path} holds {len(rows)} requests, {num_requests} were asked for")
        tc = self._counter(tokenizer)
        rng = np.random.default_rng(seed)
        reqs = []
        for i, row in enumerate(rows[:num_requests]):
            req = exact_request(tc, str(i), rng, "", row["input_len"], row["output_len"], self.endpoint)
            req.meta.update(trace_t=row["t"], input_len=row["input_len"], output_len=row["output_len"])
            reqs.append(req)
        wrng = np.random.default_rng([seed, _WARMUP_SEED_SALT])
        mid_in = int(np.median([r["input_len"] for r in rows]))
        mid_out = int(np.median([r["output_len"] for r in rows]))
        warm = [exact_request(tc, f"warmup-{i}", wrng, _WARMUP_PREFIX, max(mid_in, 32), mid_out, self.endpoint, True)
                for i in range(warmup)]
        return Workload(self.endpoint, reqs, warm, {**self.as_dict(), "seed": seed, "tokenizer": tc.name})

    def as_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "path": str(self.path), "endpoint": self.endpoint,
                "time_scale": self.time_scale, "tokenizer": self.tokenizer}

    def cli_args(self) -> list[str]:
        args = ["--endpoint", self.endpoint, "--trace", str(self.path)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        return args
