"""Load from several processes: one schedule, split across worker processes, their records merged in the parent.

One Python event loop parses a few thousand stream chunks per second; a fast server streams more. Past that, the
client's own delays enter every timestamp. So ``bench.run(..., workers=N)`` sends from N worker processes:

- **one clock**: on Linux ``time.perf_counter`` is ``CLOCK_MONOTONIC``, the same in every process, so the parent
  picks the start instant ``t0`` once the workers are ready and every worker schedules against it;
- **one schedule**: open loop, the parent computes every send time and deals the requests out round-robin (request
  ``i`` to worker ``i mod N``), an explicit ``max_in_flight`` cap split across them; closed loop, the concurrency is
  split across the workers and they all draw from one queue the parent keeps filled, so ``C`` requests stay in
  flight between them;
- **one record file**: each worker sends every finished record back at once; the parent writes it to the one
  ``requests.jsonl`` as it arrives (a crash loses nothing finished);
- **one verdict**: each worker measures its own loop (:class:`~helpers.bench.health.LoopHealth`); a worker that
  finds the server dead tells the parent, which stops them all.

Workers are started with the ``spawn`` method (runs start from notebook kernels that hold threads, where ``fork``
is unsafe), as daemons that also stop when their parent disappears.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from .client import ClientConfig, make_session
from .dispatch import Dispatcher, run_loop
from .health import LoopHealth
from .records import Request, RequestResult

__all__ = ["WorkerPlan", "WorkerPool", "split_evenly", "deal"]


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers that differ by at most one (the first ones larger).

    Introduced in lab 10 (Load Testing Honestly).
    """
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def deal(requests: list[Request], parts: int) -> list[list[Request]]:
    """Requests dealt round-robin: request ``i`` to part ``i mod parts`` (each part keeps schedule order).

    Introduced in lab 10 (Load Testing Honestly).
    """
    return [requests[k::parts] for k in range(parts)]


@dataclass
class WorkerPlan:
    """What one worker does: its share of an open-loop schedule (``requests``, ``cap``) or of a closed loop's slots
    (``concurrency``, until ``deadline_s`` after the start), with the client configuration.

    Introduced in lab 10 (Load Testing Honestly).
    """

    index: int
    cfg: ClientConfig
    open_loop: bool
    requests: list[Request] = field(default_factory=list)
    cap: int | None = None
    concurrency: int = 1
    deadline_s: float | None = None
    perf_anchor: float = 0.0
    wall_anchor: float = 0.0
    use_uvloop: bool = True


# ------------------------------------------------------------------------------------ worker side
def _worker_main(plan: WorkerPlan, results: Any, jobs: Any, go: Any, stop: Any, t0: Any, parent: int) -> None:
    """A worker process's body: send its share, stream each record to the parent, report its health."""
    try:
        coro = _worker_async(plan, results, jobs, go, stop, t0, parent)
        health = run_loop(coro) if plan.use_uvloop else asyncio.run(coro)
        results.put(("health", plan.index, health))
    except BaseException:  # noqa: BLE001 - whatever it was, the parent must hear of it
        results.put(("error", plan.index, traceback.format_exc()))
    finally:
        results.put(("done", plan.index, None))
        results.close()
        if os.getppid() == parent:
            results.join_thread()  # every record is in the pipe before the process ends
        else:
            results.cancel_join_thread()  # nobody is reading any more


async def _worker_async(plan: WorkerPlan, results: Any, jobs: Any, go: Any, stop: Any, t0: Any,
                        parent: int) -> LoopHealth:
    loop = asyncio.get_running_loop()
    disp = Dispatcher(plan.cfg, lambda r: results.put(("rec", plan.index, r)), worker=plan.index, process="process",
                      perf_anchor=plan.perf_anchor, wall_anchor=plan.wall_anchor,
                      on_dead=lambda t, why: results.put(("dead", plan.index, (t, why))))
    async with make_session() as session:
        results.put(("ready", plan.index, None))
        while not go.wait(0.05):
            if stop.is_set() or os.getppid() != parent:
                return LoopHealth.measure(plan.index, 0, 0, 0.0, 0.0, [], [], process="process")
            await asyncio.sleep(0)
        start = t0.value
        watch = asyncio.create_task(_watch(disp, stop, parent))
        try:
            if plan.open_loop:
                phase = disp.open_loop(session, plan.requests, start, plan.cap)
            else:
                source = _queue_source(jobs, loop, prefetch=plan.concurrency + 2)
                deadline = start + plan.deadline_s if plan.deadline_s is not None else None
                phase = disp.closed_loop(session, source, plan.concurrency, start, deadline)
            return await disp.measure(phase)
        finally:
            watch.cancel()


async def _watch(disp: Dispatcher, stop: Any, parent: int) -> None:
    """Stop sending when the parent says so (another worker found the server dead) or when the parent is gone."""
    while True:
        if stop.is_set():
            disp.stop("stopped by the parent")
            return
        if os.getppid() != parent:
            disp.stop("the parent process died")
            return
        await asyncio.sleep(0.05)


def _queue_source(jobs: Any, loop: asyncio.AbstractEventLoop, prefetch: int):
    """A closed loop's source fed by the parent's shared queue; ``None`` (one per worker) ends it."""
    local: asyncio.Queue = asyncio.Queue(maxsize=max(1, prefetch))

    def reader() -> None:
        while True:
            item = jobs.get()
            try:
                asyncio.run_coroutine_threadsafe(local.put(item), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):  # the loop closed: the worker is ending
                return
            if item is None:
                return

    threading.Thread(target=reader, name="bench-jobs", daemon=True).start()

    async def next_request() -> Request | None:
        item = await local.get()
        if item is None:
            local.put_nowait(None)  # the sibling slots of this worker end too
        return item

    return next_request


# ------------------------------------------------------------------------------------ parent side
class WorkerPool:
    """The parent's side: start the workers, give the start instant, feed a closed loop, collect records.

    ``on_record(res)`` is called (from the thread running :meth:`collect`) for each record as it arrives;
    ``on_dead(t, reason)`` when a worker finds the server dead. ``health`` holds each worker's report afterwards.

    Introduced in lab 10 (Load Testing Honestly).
    """

    def __init__(self, plans: list[WorkerPlan], on_record: Callable[[RequestResult], None],
                 on_dead: Callable[[float, str], None] | None = None, startup_timeout_s: float = 60.0):
        self.plans = plans
        self.on_record, self.on_dead = on_record, on_dead
        self.startup_timeout_s = startup_timeout_s
        ctx = mp.get_context("spawn")
        self._ctx = ctx
        self.results = ctx.Queue()
        self.jobs = ctx.Queue()
        self.go = ctx.Event()
        self.stop_event = ctx.Event()
        self.t0 = ctx.Value("d", 0.0)
        self.procs: list[Any] = []
        self.health: list[LoopHealth] = []
        self.errors: list[str] = []
        self.stop_reason: str | None = None
        self.killed = False
        self._ready: set[int] = set()
        self._done: set[int] = set()
        self._fed = 0

    def __len__(self) -> int:
        return len(self.plans)

    @property
    def open_loop(self) -> bool:
        return self.plans[0].open_loop

    def start(self) -> "WorkerPool":
        """Spawn the workers (they import, open a session and say ready; :meth:`begin` waits for that)."""
        for plan in self.plans:
            p = self._ctx.Process(target=_worker_main, name=f"bench-worker-{plan.index}", daemon=True,
                                  args=(plan, self.results, self.jobs, self.go, self.stop_event, self.t0, os.getpid()))
            p.start()
            self.procs.append(p)
        return self

    def begin(self, margin_s: float = 0.05) -> float:
        """Wait until every worker is ready, then set the start instant ``t0`` (``perf_counter``) and go."""
        deadline = time.monotonic() + self.startup_timeout_s
        while len(self._ready) < len(self.plans):
            self._pump(timeout=0.1)
            if self.errors:
                raise RuntimeError("a benchmark worker failed while starting:\n" + self.errors[0])
            dead = [p.name for p in self.procs if p.exitcode is not None]
            if dead:
                raise RuntimeError(
                    f"benchmark workers {', '.join(dead)} exited while starting (exit codes "
                    f"{[p.exitcode for p in self.procs]}; their error is on stderr). Workers start with "
                    "multiprocessing's spawn method, which imports the main script: in a script, call bench.run "
                    "under `if __name__ == \"__main__\":`")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(self._ready)} of {len(self.plans)} benchmark workers were ready within "
                                   f"{self.startup_timeout_s:.0f} s: the machine may be overloaded; use fewer workers")
        self.t0.value = time.perf_counter() + margin_s
        self.go.set()
        return self.t0.value

    def feed(self, requests: list[Request | None]) -> None:
        """Closed loop: add requests (``None`` ends one worker) to the queue the workers draw from."""
        for r in requests:
            self.jobs.put(r)
            if r is not None:
                self._fed += 1

    def end_feed(self) -> None:
        self.feed([None] * len(self.plans))

    def stop(self, reason: str) -> None:
        """Tell every worker to send nothing more (requests in flight finish and are recorded)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_event.set()
        if not self.open_loop:
            self.end_feed()

    def kill(self) -> None:
        """Stop at once (an interrupt): terminate the workers; records already received are kept."""
        self.killed = True
        self.stop_event.set()
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def collect(self) -> None:
        """Receive records until every worker is done (call after :meth:`begin`, from one thread)."""
        while len(self._done) < len(self.plans) and not self.killed:
            self._pump(timeout=0.25)
            for p, plan in zip(self.procs, self.plans):
                if plan.index not in self._done and p.exitcode is not None:
                    self._pump(timeout=1.0)  # its last messages may still be in the pipe
                    if plan.index not in self._done:
                        self._done.add(plan.index)
                        self.errors.append(f"worker {plan.index} exited (code {p.exitcode}) without finishing")
            if self.errors and not self.stop_event.is_set():
                self.stop("a worker failed")
        if self.errors and not self.killed:
            raise RuntimeError("benchmark worker failed:\n" + "\n".join(self.errors))

    def _pump(self, timeout: float) -> None:
        try:
            kind, index, payload = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(kind, index, payload)
            try:
                kind, index, payload = self.results.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, index: int, payload: Any) -> None:
        if kind == "rec":
            self.on_record(payload)
        elif kind == "ready":
            self._ready.add(index)
        elif kind == "health":
            self.health.append(payload)
        elif kind == "dead":
            if self.on_dead is not None:
                self.on_dead(*payload)
        elif kind == "error":
            self.errors.append(f"worker {index}:\n{payload}")
        elif kind == "done":
            self._done.add(index)

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for the workers to exit; terminate any that do not (by their own PIDs)."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.health.sort(key=lambda h: h.worker)
        for q in (self.results, self.jobs):
            q.cancel_join_thread()
            q.close()
