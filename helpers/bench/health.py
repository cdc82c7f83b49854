"""The load generator's own health, and the verdict on it: was the client the bottleneck?

Every event loop that sends requests (the in-process harness thread, or each worker process) measures itself
while it sends:

- **event-loop lag**: how much later than asked a 10 ms sleep wakes up, sampled all run long. Every timestamp the
  loop takes (dispatch, each chunk's arrival) can be late by that much;
- **CPU**: the CPU seconds the loop's thread (in-process) or process (a worker) used over the measured phase's
  wall seconds. Near one core it could not have done more;
- **schedule slip**: for open-loop arrivals, how late each request left against its scheduled instant (before any
  explicit ``max_in_flight`` wait, which is recorded apart as client queue time). A slipping client does not
  offer the load it claims.

:func:`judge` turns these into a verdict: a run whose client was saturated is **invalid** (``summary.valid`` False,
``summary.invalid_reason`` says which limit of :class:`ClientLimits` it crossed, by how much, and what to do).
The limits scale with what is measured: 10 ms of lag is noise next to a 2 s TTFT and a 20% error next to 50 ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["LoopHealth", "ClientLimits", "judge", "client_report"]


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


@dataclass
class LoopHealth:
    """One sending event loop's measurements of itself over the measured phase (times in ms).

    ``worker`` is its index (0 for the in-process path); ``chunks`` the token-carrying chunks it received, so
    ``chunk_rate`` is what it parsed per second.

    Introduced in lab 10 (Load Testing Honestly).
    """

    worker: int
    requests: int
    chunks: int
    cpu_s: float
    wall_s: float
    lag_samples: int = 0
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    slip_samples: int = 0
    slip_p50_ms: float | None = None
    slip_p99_ms: float | None = None
    slip_max_ms: float | None = None
    process: str = "thread"  # "thread" (in-process) or "process" (a worker)

    @classmethod
    def measure(cls, worker: int, requests: int, chunks: int, cpu_s: float, wall_s: float,
                lags_s: Sequence[float], slips_s: Sequence[float], process: str = "thread") -> "LoopHealth":
        lag = np.asarray(lags_s, dtype=float) * 1000.0
        slip = np.asarray(slips_s, dtype=float) * 1000.0
        return cls(worker=worker, requests=requests, chunks=chunks, cpu_s=cpu_s, wall_s=wall_s,
                   lag_samples=int(lag.size), lag_p50_ms=_pct(lag, 50), lag_p99_ms=_pct(lag, 99),
                   lag_max_ms=float(lag.max()) if lag.size else None,
                   slip_samples=int(slip.size), slip_p50_ms=_pct(slip, 50), slip_p99_ms=_pct(slip, 99),
                   slip_max_ms=float(slip.max()) if slip.size else None, process=process)

    @property
    def cpu_share(self) -> float | None:
        """CPU seconds per wall second: 1.0 is one core fully busy."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None

    @property
    def chunk_rate(self) -> float | None:
        return self.chunks / self.wall_s if self.wall_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu_share"], d["chunk_rate"] = self.cpu_share, self.chunk_rate
        return d


@dataclass(frozen=True)
class ClientLimits:
    """When the client counts as the bottleneck. A loop crosses a limit when

    - its event-loop lag p99 exceeds ``max(lag_p99_ms, lag_share_of_ttft x TTFT p50)``, or
    - its schedule slip p99 exceeds ``max(slip_p99_ms, slip_share_of_ttft x TTFT p50)``, or
    - it used more than ``cpu_share`` of a core.

    The shares make the limit follow what is measured: the run's TTFT as the server reports it (``/metrics``), or
    the client's TTFT p50 when the server reports none.

    Introduced in lab 10 (Load Testing Honestly).
    """

    lag_p99_ms: float = 10.0
    lag_share_of_ttft: float = 0.05
    slip_p99_ms: float = 10.0
    slip_share_of_ttft: float = 0.05
    cpu_share: float = 0.9

    def lag_limit_ms(self, ttft_p50_ms: float | None) -> float:
        return max(self.lag_p99_ms, self.lag_share_of_ttft * (ttft_p50_ms or 0.0))

    def slip_limit_ms(self, ttft_p50_ms: float | None) -> float:
        return max(self.slip_p99_ms, self.slip_share_of_ttft * (ttft_p50_ms or 0.0))


def judge(loops: Iterable[LoopHealth], ttft_p50_ms: float | None,
          limits: ClientLimits | None = None) -> str | None:
    """Why the client was the bottleneck (``None`` when it was not): each crossed limit, per loop, with what to do.

    Introduced in lab 10 (Load Testing Honestly).
    """
    limits = limits or ClientLimits()
    loops = list(loops)
    problems: list[str] = []
    busy = [h for h in loops if (h.cpu_share or 0.0) > limits.cpu_share]
    for h in loops:
        who = "the client" if len(loops) == 1 else f"worker {h.worker}"
        lag_limit, slip_limit = limits.lag_limit_ms(ttft_p50_ms), limits.slip_limit_ms(ttft_p50_ms)
        if h.lag_p99_ms is not None and h.lag_p99_ms > lag_limit:
            problems.append(f"{who}'s event loop lagged (p99 {h.lag_p99_ms:.1f} ms > {lag_limit:.1f} ms), so its "
                            "timestamps are late by as much")
        if h.slip_p99_ms is not None and h.slip_p99_ms > slip_limit:
            problems.append(f"{who} sent late against the schedule (slip p99 {h.slip_p99_ms:.1f} ms > "
                            f"{slip_limit:.1f} ms), so the offered load was not the one asked for")
        if h in busy:
            problems.append(f"{who} used {h.cpu_share:.0%} of a core (> {limits.cpu_share:.0%}): it could not have "
                            "done more")
    if not problems:
        return None
    cpu = max((h.cpu_share or 0.0) for h in loops) if loops else 0.0
    if busy or cpu > 0.5:
        advice = ("the client was saturated: use more client processes (workers='auto' or a number), or lower "
                  "the load")
    else:
        advice = (f"the client used at most {cpu:.0%} of a core, so the machine was busy with something else (a "
                  "server on the same cores?): give the client its own cores, or rerun when the machine is quiet")
    return "; ".join(problems) + f" ({advice})"


def client_report(loops: Sequence[LoopHealth], requests: int, workers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The client section of a summary: totals and the worst loop's lag, slip and CPU, then each loop.

    Introduced in lab 10 (Load Testing Honestly).
    """
    def worst(attr: str) -> float | None:
        vals = [getattr(h, attr) for h in loops if getattr(h, attr) is not None]
        return max(vals) if vals else None

    cpu = sum(h.cpu_s for h in loops)
    wall = max((h.wall_s for h in loops), default=0.0)
    chunks = sum(h.chunks for h in loops)
    rep: dict[str, Any] = {
        "workers": len(loops), "cpu_s": cpu, "wall_s": wall,
        "cpu_per_request_ms": cpu / requests * 1000.0 if requests else None,
        "cpu_utilization": worst("cpu_share"),
        "chunks": chunks, "chunk_rate": chunks / wall if wall > 0 else None,
        "loop_lag_p50_ms": worst("lag_p50_ms"), "loop_lag_p99_ms": worst("lag_p99_ms"),
        "loop_lag_max_ms": worst("lag_max_ms"),
        "slip_p50_ms": worst("slip_p50_ms"), "slip_p99_ms": worst("slip_p99_ms"), "slip_max_ms": worst("slip_max_ms"),
        "per_worker": [h.as_dict() for h in loops],
    }
    if workers:
        rep["workers_choice"] = workers
    return rep
