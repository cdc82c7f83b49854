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

import dataclasses
from typing import Any, Callable, Sequence

from .arrivals import Concurrent
from .runner import run
from .stats import summarize
from .store import RunResult
from .workloads import Workload

__all__ = ["static_batches", "with_output_lengths", "decode_steps_ms", "interpolate", "joined_and_left"]


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


def with_output_lengths(workload: Workload, lengths: Sequence[int]) -> Workload:
    """``workload`` with request ``i``'s output fixed at ``lengths[i % len(lengths)]`` tokens: the same prompts,
    replies that differ only in how long they run (``[128, 16, 16, 16]``: one long reply in four, as chat traffic has).

    Introduced in lab 07 (Continuous Batching).
    """
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"output lengths must be >= 1 tokens, got {list(lengths)}")
    reqs = [dataclasses.replace(r, max_output_tokens=int(lengths[i % len(lengths)]),
                                min_output_tokens=int(lengths[i % len(lengths)])) for i, r in enumerate(workload.requests)]
    return Workload(workload.endpoint, reqs, list(workload.warmup), {**workload.spec, "output_lengths": list(lengths)})


def decode_steps_ms(outputs: Sequence[int], batch: int, step_ms: Callable[[int], float], *,
                    continuous: bool = True) -> float:
    """Milliseconds of decode steps to produce ``outputs`` (output tokens per request, in arrival order) with
    ``batch`` slots, a step with ``k`` requests in flight costing ``step_ms(k)`` and giving each of them one token.

    ``continuous``: a finished request's slot goes to the next request at once (vLLM); otherwise static batching:
    ``batch`` requests at a time, the next batch only after the slowest of them ends. Prefill is left out (the same
    prompts cost the same either way), and with it each request's first token: a request of ``n`` output tokens
    needs ``n - 1`` decode steps. With a step cost that does not depend on ``k`` (a GPU, weights dominating
    the bytes read), static pays for ``batch`` slots through each batch's longest request and uses only the share
    its requests need; continuous stays within one longest request of perfect packing (Graham's bound).

    Introduced in lab 07 (Continuous Batching).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    waiting, running, total = [int(n) - 1 for n in outputs if int(n) > 1], [], 0.0
    while waiting or running:
        if continuous or not running:  # fill the free slots
            while waiting and len(running) < batch:
                running.append(waiting.pop(0))
        total += step_ms(len(running))
        running = [n - 1 for n in running if n > 1]
    return total


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


def joined_and_left(intervals: Sequence[tuple[float, float]]) -> int:
    """How many (long, short) pairs of requests have the short one dispatched after the long one and finished before
    it: requests that joined a batch already in flight and left it early, which static batching cannot do.

    ``intervals`` are (dispatched, ended) per request. A sweep in dispatch order with the earlier requests' ends kept
    sorted: O(n log n), where comparing every pair took minutes at a GPU's few thousand requests.

    Introduced in lab 07 (Continuous Batching).
    """
    import bisect

    ends: list[float] = []
    pairs = 0
    ordered = sorted(intervals)
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:  # equal dispatch times: none joined the other
            j += 1
        for _, e in ordered[i:j]:
            pairs += len(ends) - bisect.bisect_right(ends, e)  # started earlier, still running after it ended
        for _, e in ordered[i:j]:
            bisect.insort(ends, e)
        i = j
    return pairs
