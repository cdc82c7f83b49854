"""Static batching, for comparison: wait for a full batch, run it until its longest request ends, then the next.

Continuous batching (what vLLM does) refills a slot the moment a request ends; static batching — what servers did
before Orca and vLLM — holds every slot of a batch until its longest request is done. On the same server and the
same requests, the difference is measured::

    static = bench.static_batches(workload, batch=4, base_url=srv)           # batch after batch
    continuous = bench.run(workload, bench.Concurrent(4), base_url=srv)       # slots refilled at once

Both see the same built workload (same prompts, same fixed output lengths), so they do the same work.

Introduced in lab 07 (Continuous Batching).
"""

from __future__ import annotations

from typing import Any

from .arrivals import Concurrent
from .runner import run
from .stats import summarize
from .store import RunResult
from .workloads import Workload

__all__ = ["static_batches", "interpolate"]


def static_batches(workload: Workload, batch: int, *, base_url: Any, **run_kwargs: Any) -> RunResult:
    """Send ``workload`` in consecutive batches of ``batch`` requests, each batch only after the previous one
    finished entirely; returns one :class:`RunResult` over all of them (the server's view left out: each batch
    scraped its own).

    Introduced in lab 07 (Continuous Batching).
    """
    if not isinstance(workload, Workload):
        raise TypeError("static_batches needs a built Workload (spec.build(n, ...)), so that continuous batching can "
                        "be measured on the very same requests")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    records, warnings = [], []
    for start in range(0, len(workload.requests), batch):
        part = Workload(workload.endpoint, workload.requests[start:start + batch], [], dict(workload.spec))
        r = run(part, Concurrent(batch), base_url=base_url, label=f"static batch {start // batch}", **run_kwargs)
        records += r.records
        warnings += r.summary.warnings
    summary = summarize(records)
    summary.warnings += sorted(set(warnings))
    return RunResult(records=records, summary=summary,
                     config={"label": f"static batches of {batch}", "batch": batch, "num_requests": len(records)})


def interpolate(xs: list[float], ys: list[float], x: float, log_x: bool = True) -> float:
    """``y`` at ``x`` on the piecewise-linear curve through the measured ``(xs, ys)`` (in log ``x`` by default, as a
    concurrency sweep is spaced); clamped to the ends. At a measured ``x`` it returns the measurement.

    Introduced in lab 07 (Continuous Batching).
    """
    import numpy as np

    order = np.argsort(xs)
    xv, yv = np.asarray(xs, dtype=float)[order], np.asarray(ys, dtype=float)[order]
    if log_x:
        return float(np.interp(np.log(x), np.log(xv), yv))
    return float(np.interp(x, xv, yv))
