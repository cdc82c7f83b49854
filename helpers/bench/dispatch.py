"""Sending from one event loop: an open-loop schedule or a closed loop, each request timed, the loop's own health
measured, and a dead server noticed.

A :class:`Dispatcher` runs inside the in-process harness thread (``workers=1``) and inside each worker process
(:mod:`helpers.bench.workers`), so both paths send, time and judge the same way:

- **open loop**: each request leaves at ``t0 + send_offset_s``; how late it left (the schedule slip) is kept.
  An explicit ``max_in_flight`` cap is a semaphore whose wait is recorded as client queue time, not as slip;
- **closed loop**: ``concurrency`` slots, each sending its next request when its previous one ends, until the
  requests run out or ``deadline`` passes (then the slots drain);
- **health**: the event loop's lag (a 10 ms sleep, sampled all along), the CPU used, the chunks parsed;
- **a dead server**: a failure at the connection level makes it ask the server's ``/health`` (a few tries); when
  nothing answers, it stops sending new requests, waits ``grace_s`` for the ones in flight, then records those
  still open as abandoned. ``dead`` holds when (the first failure of the streak) and why.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Iterable

import aiohttp

from .client import ClientConfig, send, server_alive
from .health import LoopHealth
from .records import Request, RequestResult, Timings

__all__ = ["Dispatcher", "list_source", "run_loop", "GRACE_S"]

#: After the server died, how long requests still in flight may take before they are recorded as abandoned.
GRACE_S = 5.0
_LAG_INTERVAL_S = 0.01
_SLEEP_SLICE_S = 0.25  # a long wait for the schedule is cut into slices, so that a stop is noticed within one


def run_loop(coro: Any) -> Any:
    """Run ``coro`` to completion on a new event loop: uvloop's when it is installed (faster parsing and timers,
    so more load per process), else asyncio's.

    Introduced in lab 10 (Load Testing Honestly).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def list_source(requests: Iterable[Request]) -> Callable[[], Awaitable[Request | None]]:
    """A closed loop's request source over a list: the next request, then ``None`` when they are used up.

    Introduced in lab 10 (Load Testing Honestly).
    """
    it = iter(requests)

    async def next_request() -> Request | None:
        return next(it, None)

    return next_request


class Dispatcher:
    """Sends requests from the running event loop and hands each finished record to ``on_record``.

    ``worker`` names the loop in its health report; ``process`` is ``"thread"`` (CPU read with ``thread_time``) or
    ``"process"`` (``process_time``). ``on_dead(t, reason)`` is told once when the server is found dead.
    ``stop(reason)`` (from this loop) ends sending early; records of requests that were sent are never dropped,
    except those in flight when the whole run is cancelled (interrupted).

    Introduced in lab 10 (Load Testing Honestly).
    """

    def __init__(self, cfg: ClientConfig, on_record: Callable[[RequestResult], None], *, worker: int = 0,
                 process: str = "thread", perf_anchor: float = 0.0, wall_anchor: float = 0.0,
                 on_dead: Callable[[float, str], None] | None = None, grace_s: float = GRACE_S):
        self.cfg, self.on_record, self.on_dead = cfg, on_record, on_dead
        self.worker, self.process = worker, process
        self.perf_anchor, self.wall_anchor = perf_anchor, wall_anchor
        self.grace_s = grace_s
        self.in_flight = 0
        self.finished = 0
        self.chunks = 0
        self.lags: list[float] = []
        self.slips: list[float] = []
        self.stopping: str | None = None
        self.dead: tuple[float, str] | None = None
        self._suspect_since: float | None = None
        self._check: asyncio.Task | None = None
        self._abandon = False
        self._tasks: set[asyncio.Task] = set()

    # -- control -------------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """Send nothing new from now on (the first reason given is kept)."""
        if self.stopping is None:
            self.stopping = reason

    def declare_dead(self, t: float, reason: str) -> None:
        """The server is gone since ``t`` (``perf_counter``), because ``reason``: stop sending, tell ``on_dead``."""
        if self.dead is not None:
            return
        self.dead = (min(t, self._suspect_since or t), reason)
        self.stop(f"the server died: {reason}")
        if self.on_dead is not None:
            self.on_dead(*self.dead)

    # -- phases --------------------------------------------------------------------------------
    async def measure(self, phase: Awaitable[None]) -> LoopHealth:
        """Run ``phase`` (an :meth:`open_loop` or :meth:`closed_loop`) while measuring lag and CPU."""
        clock = time.thread_time if self.process == "thread" else time.process_time
        lag_task = asyncio.create_task(self._lag_monitor())
        cpu0, wall0, done0 = clock(), time.perf_counter(), self.finished
        try:
            await phase
        finally:
            cpu, wall = clock() - cpu0, time.perf_counter() - wall0
            lag_task.cancel()
        return LoopHealth.measure(self.worker, self.finished - done0, self.chunks, cpu, wall, self.lags, self.slips,
                                  process=self.process)

    async def open_loop(self, session: aiohttp.ClientSession, requests: Iterable[Request], t0: float,
                        cap: int | None = None) -> None:
        """Send each request at ``t0 + send_offset_s`` (``perf_counter`` seconds), at most ``cap`` in flight."""
        sem = asyncio.Semaphore(cap) if cap else None
        try:
            for req in requests:
                t_sched = t0 + float(req.send_offset_s or 0.0)
                if not await self._sleep_until(t_sched):
                    break
                self.slips.append(max(time.perf_counter() - t_sched, 0.0))
                task = asyncio.create_task(self._one(session, req, t_sched, sem))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await self._drain(set(self._tasks))
        except asyncio.CancelledError:
            await self._cancel(set(self._tasks))
            raise

    async def closed_loop(self, session: aiohttp.ClientSession, next_request: Callable[[], Awaitable[Request | None]],
                          concurrency: int, t0: float | None = None, deadline: float | None = None) -> None:
        """Keep ``concurrency`` requests in flight from ``t0`` until the source says ``None`` or ``deadline``
        (``perf_counter`` seconds) passes; then wait for those in flight (the drain)."""
        if t0 is not None and not await self._sleep_until(t0):
            return

        async def slot() -> None:
            while self.stopping is None:
                t_free = time.perf_counter()
                if deadline is not None and t_free >= deadline:
                    return
                req = await next_request()
                if req is None or self.stopping is not None:
                    return
                if deadline is not None and time.perf_counter() >= deadline:
                    return  # the time ran out while it waited for a request: it is not sent
                await self._one(session, req, t_free)

        slots = {asyncio.create_task(slot()) for _ in range(max(1, concurrency))}
        try:
            await self._drain(slots)
        except asyncio.CancelledError:
            await self._cancel(slots)
            raise

    # -- one request ---------------------------------------------------------------------------
    async def _one(self, session: aiohttp.ClientSession, req: Request, t_sched: float,
                   sem: asyncio.Semaphore | None = None) -> None:
        self.in_flight += 1
        started: float | None = None
        try:
            if sem is not None:
                await sem.acquire()
            try:
                if self.stopping is not None:
                    return  # stopped while it waited for the cap: never sent, so no record
                started = time.perf_counter()
                res = await self._send(session, req, t_sched)
            finally:
                if sem is not None:
                    sem.release()
        except asyncio.CancelledError:
            if not self._abandon or started is None:
                raise
            res = self._abandoned(req, t_sched, started)
        finally:
            self.in_flight -= 1
        self._finish(res)

    async def _send(self, session: aiohttp.ClientSession, req: Request, t_sched: float) -> RequestResult:
        try:
            return await send(session, req, self.cfg, t_sched, self.perf_anchor, self.wall_anchor)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a client bug must not make a request vanish
            now = time.perf_counter()
            return RequestResult(id=req.id, timings=self._timings(t_sched, now, now), endpoint=req.endpoint,
                                 error=f"client error: {type(e).__name__}: {e}",
                                 expected_input_tokens=req.expected_input_tokens,
                                 max_output_tokens=req.max_output_tokens, min_output_tokens=req.min_output_tokens,
                                 scheduled_offset_s=req.send_offset_s, warmup=req.warmup, meta=dict(req.meta))

    def _abandoned(self, req: Request, t_sched: float, started: float) -> RequestResult:
        reason = self.dead[1] if self.dead else "stopped"
        return RequestResult(id=req.id, timings=self._timings(t_sched, started, time.perf_counter()),
                             endpoint=req.endpoint, connection_error=True,
                             error=f"abandoned: the server died ({reason}) and this request had no answer "
                                   f"{self.grace_s:g} s later",
                             expected_input_tokens=req.expected_input_tokens, max_output_tokens=req.max_output_tokens,
                             min_output_tokens=req.min_output_tokens, scheduled_offset_s=req.send_offset_s,
                             warmup=req.warmup, meta=dict(req.meta))

    def _timings(self, t_sched: float, t_disp: float, t_end: float) -> Timings:
        return Timings(t_scheduled=t_sched, t_dispatched=t_disp, t_end=t_end, perf_anchor=self.perf_anchor,
                       wall_anchor=self.wall_anchor)

    def _finish(self, res: RequestResult) -> None:
        res.meta["worker"] = self.worker  # which loop sent it (0 in-process)
        self.finished += 1
        self.chunks += len(res.timings.chunk_times)
        self.on_record(res)
        if res.ok:
            self._suspect_since = None
        elif res.connection_error and self.dead is None:
            if self._suspect_since is None:
                self._suspect_since = res.timings.t_end or time.perf_counter()
            if self._check is None or self._check.done():
                self._check = asyncio.create_task(self._check_server())

    async def _check_server(self) -> None:
        async with aiohttp.ClientSession() as probe:  # fresh connections: a pooled one may be a dead server's
            alive, reason = await server_alive(probe, self.cfg.base_url)
        if alive:
            self._suspect_since = None  # a dropped connection, not a dead server
        elif self.dead is None:
            self.declare_dead(self._suspect_since or time.perf_counter(), reason)

    # -- waiting -------------------------------------------------------------------------------
    async def _sleep_until(self, t: float) -> bool:
        """Sleep until ``perf_counter() >= t``; False if told to stop first."""
        while self.stopping is None:
            delay = t - time.perf_counter()
            if delay <= 0:
                return True
            await asyncio.sleep(min(delay, _SLEEP_SLICE_S))
        return False

    async def _drain(self, tasks: set[asyncio.Task]) -> None:
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=_SLEEP_SLICE_S)
            if pending and self.dead is not None and time.perf_counter() - self.dead[0] > self.grace_s:
                self._abandon = True
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return
        if self._check is not None and not self._check.done():
            await self._check  # a last failure's verdict belongs to this run

    async def _cancel(self, tasks: set[asyncio.Task]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _lag_monitor(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(_LAG_INTERVAL_S)
            self.lags.append(time.perf_counter() - t - _LAG_INTERVAL_S)
