"""The asyncio side of a run, in its own thread and event loop: warmup, the server's metrics, the measured phase.

:func:`helpers.bench.run` starts a :class:`Harness` and shows a progress bar while it runs. The harness thread:

1. asks the server's version, sends the warmup requests (closed loop; they count nowhere);
2. scrapes ``/metrics`` and starts sampling its gauges;
3. runs the measured phase: from this loop (one :class:`~helpers.bench.dispatch.Dispatcher`), or from worker
   processes (:class:`~helpers.bench.workers.WorkerPool`), whose records it collects;
4. stops the sampler and scrapes ``/metrics`` again.

Every finished record is written to the run's folder at once. A closed loop draws from a feed that the calling
thread keeps filled (:meth:`Harness.tick`): a duration-sized run does not know how many requests it will need.
The calling thread also watches the server's process, when it has one: a server that exits ends the run.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import time
from typing import Any, Callable

from .. import metrics as _metrics
from .arrivals import Arrivals
from .client import ClientConfig, make_session
from .dispatch import Dispatcher, list_source, run_loop
from .health import LoopHealth
from .records import Request, RequestResult
from .store import RunFolder
from .workers import WorkerPlan, WorkerPool, deal, split_evenly

__all__ = ["Harness", "Supply", "GAUGES"]

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


class Supply:
    """A closed loop's requests: a first list, then (for a duration-sized run) more built as they are needed.

    ``more(k)`` returns ``k`` new requests (fresh prompts). ``given`` lists every request handed out, in order.

    Introduced in lab 10 (Load Testing Honestly).
    """

    def __init__(self, first: list[Request], more: Callable[[int], list[Request]] | None = None):
        self._first = list(first)
        self._more = more
        self.given: list[Request] = []

    @property
    def exhausted(self) -> bool:
        return not self._first and self._more is None

    @property
    def finite(self) -> bool:
        return self._more is None

    @property
    def remaining(self) -> int:
        return len(self._first)

    def take(self, k: int) -> list[Request]:
        out = self._first[:k]
        self._first = self._first[k:]
        if len(out) < k and self._more is not None:
            out += self._more(k - len(out))
        self.given += out
        return out


class Harness:
    """One run's sending side. Open loop: ``requests`` carry their ``send_offset_s``. Closed loop: ``supply`` feeds
    ``concurrency`` slots until it is used up or ``duration_s`` passes. ``workers`` > 1 sends from that many
    processes.

    Introduced in lab 10 (Load Testing Honestly).
    """

    def __init__(self, *, requests: list[Request], supply: Supply | None, warmup: list[Request], arrivals: Arrivals,
                 cfg: ClientConfig, folder: RunFolder | None, server_metrics: bool, sample_interval_s: float,
                 concurrency: int, workers: int = 1, duration_s: float | None = None):
        self.requests, self.supply, self.warmup, self.arrivals, self.cfg = requests, supply, warmup, arrivals, cfg
        self._offsets = sorted(float(r.send_offset_s or 0.0) for r in requests)
        self.folder = folder
        self.server_metrics, self.sample_interval_s = server_metrics, sample_interval_s
        self.concurrency, self.workers, self.duration_s = concurrency, workers, duration_s
        self.records: list[RequestResult] = []
        self.warmup_records: list[RequestResult] = []
        self.done = self.failed = self.in_flight_local = 0
        self.phase = "starting"
        self.health: list[LoopHealth] = []
        self.death: tuple[float, str] | None = None
        self.ran_out_at: float | None = None
        self.stopped_early: str | None = None
        self.before: _metrics.Snapshot | None = None
        self.after: _metrics.Snapshot | None = None
        self.metrics_note: str | None = None
        self.gauges: list[dict[str, float]] = []
        self.server_version: str | None = None
        self.perf_anchor = time.perf_counter()
        self.wall_anchor = time.time()
        self.t0: float | None = None
        self.error: BaseException | None = None
        self.pool: WorkerPool | None = None
        self._disp: Dispatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._local_feed: asyncio.Queue | None = None
        self._fed = 0
        self._feeding = False  # from just before the measured phase (workers may take a while to start)
        self._feed_closed = supply is None
        self._lock = threading.RLock()  # the calling thread and the harness thread both feed

    @property
    def deadline(self) -> float | None:
        return self.t0 + self.duration_s if self.t0 is not None and self.duration_s is not None else None

    @property
    def in_flight(self) -> int:
        if self.pool is not None:
            return max(self._sent_estimate() - self.done, 0)
        return self._disp.in_flight if self._disp is not None else 0

    def _sent_estimate(self) -> int:
        if self.supply is not None:
            return self._fed
        if self.t0 is None:
            return 0
        return bisect.bisect_right(self._offsets, time.perf_counter() - self.t0)

    # -- thread plumbing -----------------------------------------------------------------------
    def start(self) -> threading.Thread:
        if self.workers > 1:
            self.pool = WorkerPool(self._plans(), self._record, self._on_dead).start()
        th = threading.Thread(target=self._thread_main, name="bench-harness", daemon=True)
        th.start()
        return th

    def _plans(self) -> list[WorkerPlan]:
        n = self.workers
        common = dict(cfg=self.cfg, perf_anchor=self.perf_anchor, wall_anchor=self.wall_anchor)
        if self.arrivals.open_loop:
            cap = getattr(self.arrivals, "max_in_flight", None)
            caps = split_evenly(cap, n) if cap else [None] * n
            return [WorkerPlan(index=k, open_loop=True, requests=part, cap=caps[k], **common)
                    for k, part in enumerate(deal(self.requests, n))]
        return [WorkerPlan(index=k, open_loop=False, concurrency=c, deadline_s=self.duration_s, **common)
                for k, c in enumerate(split_evenly(self.concurrency, n))]

    def _thread_main(self) -> None:
        try:
            run_loop(self._amain())
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            self.error = e
        finally:
            if self.pool is not None:
                self.pool.close()
                self.health = list(self.pool.health)

    def cancel(self) -> None:
        """Interrupt the run (Ctrl-C): stop at once; what finished is kept."""
        if self.pool is not None:
            self.pool.kill()
        if self._loop is not None and self._main is not None:
            self._in_loop(self._main.cancel)

    # -- called from the calling thread, a few times a second ----------------------------------
    def tick(self, server: Any = None) -> None:
        """Keep a closed loop's feed filled; end the run if ``server`` (anything with ``running``) has exited."""
        if server is not None and self.t0 is not None and self.death is None:
            with contextlib.suppress(Exception):
                if not server.running:
                    self.server_gone("its process exited")
        self._feed_more()

    def stop_sending(self, reason: str) -> None:
        """Send nothing new from now on (requests in flight finish and are recorded); ``reason`` is kept."""
        with self._lock:
            if self.stopped_early is not None:
                return
            self.stopped_early = reason
        if self.pool is not None:
            self.pool.stop(reason)
        if self._disp is not None and self._loop is not None:
            self._in_loop(self._disp.stop, reason)
        self._close_feed()

    def server_gone(self, reason: str) -> None:
        t = time.perf_counter()
        if self._disp is not None and self._loop is not None:
            self._in_loop(self._disp.declare_dead, t, reason)
        else:
            self._on_dead(t, reason)

    def _on_dead(self, t: float, reason: str) -> None:
        with self._lock:
            if self.death is not None:
                return
            self.death = (t, reason)
        if self.pool is not None:
            self.pool.stop(f"the server died: {reason}")
        self._close_feed()

    def _feed_more(self) -> None:
        with self._lock:
            if self._feed_closed or self.supply is None or not self._feeding:
                return
            deadline = self.deadline
            if self.death is not None or (deadline is not None and time.perf_counter() >= deadline):
                self._close_feed()
                return
            # A finite list goes in at once; built-as-needed requests keep a backlog of a few rounds of slots.
            if self.supply.finite:
                want = self.supply.remaining
            else:
                want = 4 * self.concurrency + 64 - (self._fed - self.done)
            if want > 0:
                self._put(self.supply.take(want))
            if self.supply.exhausted:
                if deadline is not None and self.ran_out_at is None:
                    self.ran_out_at = time.perf_counter()
                self._close_feed()

    def _put(self, items: list[Request | None]) -> None:
        self._fed += sum(1 for r in items if r is not None)
        if self.pool is not None:
            self.pool.feed(items)
        elif self._loop is not None and self._local_feed is not None:
            feed = self._local_feed
            self._in_loop(lambda: [feed.put_nowait(r) for r in items])

    def _in_loop(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the run's event loop, unless the loop has already finished: the calling thread's tick
        can come after the measuring phase ended and before the thread exits (a GPU rehearsal caught it as "Event loop
        is closed" in a closed-loop capacity run)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _close_feed(self) -> None:
        with self._lock:
            if self._feed_closed:
                return
            self._feed_closed = True
        if self.pool is not None:
            self.pool.end_feed()
        else:
            self._put([None] * self.concurrency)

    # -- the loop ------------------------------------------------------------------------------
    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        try:
            async with make_session() as session:
                await self._version(session)
                if self.warmup:
                    self.phase = "warmup"
                    warm = Dispatcher(self.cfg, self._warm_record, perf_anchor=self.perf_anchor,
                                      wall_anchor=self.wall_anchor)
                    await warm.closed_loop(session, list_source(self.warmup),
                                           max(1, min(len(self.warmup), self.concurrency)))
                await self._scrape_before()
                sampler = None
                if self.before is not None:
                    gauges = [g for g in GAUGES if self.before.has(g)] or list(GAUGES)
                    if not self.before.has("vllm:kv_cache_usage_perc") and self.before.has("vllm:gpu_cache_usage_perc"):
                        gauges.append("vllm:gpu_cache_usage_perc")  # older vLLM
                    sampler = _metrics.Sampler(self.cfg.base_url, gauges, self.sample_interval_s,
                                               self.cfg.api_key).start()
                self.phase = "measuring"
                try:
                    if self.pool is not None:
                        await self._measure_workers()
                    else:
                        await self._measure_here(session)
                finally:
                    if sampler is not None:
                        await asyncio.to_thread(sampler.stop)
                        self.gauges = list(sampler.rows)
                self.phase = "finishing"
                if self.before is not None:
                    try:
                        self.after = await asyncio.to_thread(_metrics.scrape, self.cfg.base_url, 10.0, self.cfg.api_key)
                    except _metrics.MetricsUnavailable as e:
                        self.metrics_note = f"/metrics failed after the run: {e}"
        finally:
            if self.folder is not None:
                self.folder.close()

    async def _measure_here(self, session: Any) -> None:
        self._disp = disp = Dispatcher(self.cfg, self._record, perf_anchor=self.perf_anchor,
                                       wall_anchor=self.wall_anchor, on_dead=self._on_dead)
        self.t0 = time.perf_counter()
        if self.arrivals.open_loop:
            phase = disp.open_loop(session, self.requests, self.t0, getattr(self.arrivals, "max_in_flight", None))
        else:
            self._local_feed = asyncio.Queue()
            self._feeding = True
            self._feed_more()
            phase = disp.closed_loop(session, self._local_feed.get, self.concurrency, self.t0, self.deadline)
        self.health = [await disp.measure(phase)]

    async def _measure_workers(self) -> None:
        pool = self.pool
        assert pool is not None
        if not pool.open_loop:
            self._feeding = True  # the first requests wait in the queue while the workers start
            self._feed_more()
        self.t0 = await asyncio.to_thread(pool.begin)
        await asyncio.to_thread(pool.collect)

    async def _version(self, session: Any) -> None:
        import aiohttp

        root = _metrics.server_root(self.cfg.base_url)
        with contextlib.suppress(Exception):
            async with session.get(f"{root}/version", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    self.server_version = (await resp.json(content_type=None)).get("version")

    async def _scrape_before(self) -> None:
        if not self.server_metrics:
            self.metrics_note = "server metrics not requested (server_metrics=False)"
            return
        try:
            self.before = await asyncio.to_thread(_metrics.scrape, self.cfg.base_url, 10.0, self.cfg.api_key)
        except _metrics.MetricsUnavailable as e:
            self.metrics_note = f"no server metrics ({e}); the run went on without them"

    # -- records -------------------------------------------------------------------------------
    def _record(self, res: RequestResult) -> None:
        if self.folder is not None:
            self.folder.record(res)
        self.records.append(res)
        self.done += 1
        if not res.ok:
            self.failed += 1

    def _warm_record(self, res: RequestResult) -> None:
        if self.folder is not None:
            self.folder.record(res, warmup=True)
        self.warmup_records.append(res)
