"""Queue-based autoscaling: watch the fleet's queue in Prometheus, scale out through the router, scale back in, time it.

::

    scaler = fleet.QueueAutoscaler(prom, router, launch=lambda: fleet.start_replicas(PROFILE, 1, ...)[0],
                                   rule=fleet.QueueRule(threshold=4, hold_s=3, scale_in_target=8, cooldown_s=10))
    with scaler:                          # a background thread polls every interval_s
        bench.run(ramp, base_url=router)  # the queue builds, the rule fires, a replica joins; the load falls, it leaves
    scaler.events[0].decision_to_serving_s, scaler.scale_ins[0].removed_s

Out: the rule KEDA's ScaledObject and the fleet's ``VllmQueueBuilding`` alert use: waiting requests per ready
replica at or above ``threshold`` for ``hold_s``. In (only with ``scale_in_target``): Kubernetes' HPA rule for a
scale-down, applied to a load (``load_query``: requests in flight by default, or the fleet's completions per second,
:func:`completion_rate_query`): the count it wants, ``ceil(load / scale_in_target)``, has stayed below the count
serving for a whole stabilization window (``cooldown_s``). Both are
pure functions of samples (:func:`decide`, :func:`decide_in`), so a lab can replay them on the recorded series and a
test can check them without a fleet.

Each scale-out is a :class:`ScaleOut`: when the rule fired, when the new replica answered, when the router took
it, when it first finished a request. On this 2-core machine decision → serving took 51-60 s under load
(``phase4-fleet-findings.md``): the new replica's start-up competes with the saturated one for the cores. Each
scale-in is a :class:`ScaleIn`: the router stops sending to the replica first, the requests it holds finish
there (none is lost), then ``retire`` (if given) stops it.

Introduced in lab 22 (Routing and Autoscaling).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from .. import metrics

__all__ = ["QueueRule", "ScaleOut", "ScaleIn", "QueueAutoscaler", "decide", "decide_in", "WAITING_QUERY",
           "IN_FLIGHT_QUERY", "completion_rate_query"]

#: Requests waiting in every replica's scheduler queue, summed over the fleet (vLLM's own gauge).
WAITING_QUERY = 'sum(vllm:num_requests_waiting{job="vllm"})'
#: Requests in flight (running + waiting), summed over the fleet: the default scale-in load.
IN_FLIGHT_QUERY = 'sum(vllm:num_requests_running{job="vllm"}) + sum(vllm:num_requests_waiting{job="vllm"})'


def completion_rate_query(window: str = "5s") -> str:
    """Requests the fleet finishes per second over ``window``: a scale-in load in the units of a replica's measured
    capacity. (Requests in flight understate an overload a fleet keeps up with: in lab 23 two replicas at 1.5 x one
    replica's capacity held 4 or fewer for 5 s, and a rule on them scaled in mid-overload.)

    Introduced in lab 23 (Observability and the Postmortem).
    """
    return f'sum(rate(vllm:request_success_total{{job="vllm"}}[{window}]))'


@dataclass(frozen=True)
class QueueRule:
    """Scale out by one replica when waiting requests per replica stay at or above ``threshold`` for ``hold_s``;
    scale in by one when the load (the autoscaler's ``load_query``) would have fitted ``scale_in_target`` per replica
    on one replica fewer for ``cooldown_s`` (``scale_in_target=None``: never scale in).

    Introduced in lab 22 (Routing and Autoscaling); scale-in in lab 23 (Observability and the Postmortem).
    """

    threshold: float = 4.0
    hold_s: float = 3.0
    scale_in_target: float | None = None
    cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold={self.threshold!r}: give waiting requests per replica, e.g. 4")
        if not (self.hold_s >= 0 and math.isfinite(self.hold_s)):
            raise ValueError(f"hold_s={self.hold_s!r}: give seconds the queue must stay above threshold, e.g. 3")
        if self.scale_in_target is not None and not (self.scale_in_target > 0 and math.isfinite(self.scale_in_target)):
            raise ValueError(f"scale_in_target={self.scale_in_target!r}: give the load one replica should carry "
                             "(requests in flight, or requests/s), or None to never scale in")
        if not (self.cooldown_s >= 0 and math.isfinite(self.cooldown_s)):
            raise ValueError(f"cooldown_s={self.cooldown_s!r}: give seconds the fleet must have fitted in one replica "
                             "fewer before one leaves, e.g. 30")


def decide(samples: Sequence[tuple[float, float]], rule: QueueRule, replicas: int = 1) -> float | None:
    """The time at which ``rule`` fires on ``samples`` (``(t, waiting summed over the fleet)``, in time order),
    or ``None``: the first t at which waiting/replicas has been >= threshold at every sample since t - hold_s.

    A missing sample (NaN: Prometheus had no value) breaks the hold, as a gap does in an alert's ``for:``.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    since: float | None = None
    for t, waiting in samples:
        if waiting == waiting and waiting / replicas >= rule.threshold:
            since = t if since is None else since
            if t - since >= rule.hold_s:
                return t
        else:
            since = None
    return None


def decide_in(samples: Sequence[tuple[float, float]], rule: QueueRule, replicas: int) -> float | None:
    """The time at which ``rule`` scales in on ``samples`` (``(t, the fleet's load)``, in time order), or ``None``:
    the first t at which ``ceil(load / rule.scale_in_target)`` has been below ``replicas``
    at every sample since t - cooldown_s (HPA's scale-down stabilization window: it takes the largest count wanted
    in the window). Never below one replica; a missing sample breaks the window.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    if rule.scale_in_target is None or replicas <= 1:
        return None
    fits = rule.scale_in_target * (replicas - 1)
    since: float | None = None
    for t, load in samples:
        if load == load and load <= fits:
            since = t if since is None else since
            if t - since >= rule.cooldown_s:
                return t
        else:
            since = None
    return None


@dataclass
class ScaleOut:
    """One scale-out, in seconds since the autoscaler started (``None``: not reached).

    ``decision_to_serving_s`` is what users feel: from the rule firing to the new replica finishing a request.

    Introduced in lab 22 (Routing and Autoscaling).
    """

    decision_s: float
    waiting: float
    replicas_before: int
    healthy_s: float | None = None
    registered_s: float | None = None
    first_served_s: float | None = None
    url: str | None = None
    error: str | None = None

    @property
    def decision_to_healthy_s(self) -> float | None:
        return None if self.healthy_s is None else self.healthy_s - self.decision_s

    @property
    def decision_to_serving_s(self) -> float | None:
        return None if self.first_served_s is None else self.first_served_s - self.decision_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "decision_to_healthy_s": self.decision_to_healthy_s,
                "decision_to_serving_s": self.decision_to_serving_s}


@dataclass
class ScaleIn:
    """One scale-in, in seconds since the autoscaler started (``None``: not reached): when the rule fired, when the
    router stopped sending to the replica, when the requests it held had finished, when ``retire`` stopped it.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    decision_s: float
    load: float
    replicas_before: int
    url: str | None = None
    removed_s: float | None = None
    drained_s: float | None = None
    retired_s: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueueAutoscaler:
    """A background loop that applies a :class:`QueueRule` to Prometheus and scales out (and back in) through a router.

    ``prom`` answers ``value(expr)`` (a :class:`~helpers.fleet.Prometheus`); ``router`` has ``add_worker`` (a
    :class:`~helpers.fleet.Router`); ``launch()`` starts one replica and returns it ready (a server with ``.url``
    and ``.metrics()``). At most ``max_replicas`` in all; ``replicas`` is how many serve at the start, and it never
    scales in below them (only replicas it added leave, the last added first, through the router's
    ``remove_worker``; ``retire(replica)``, if given, then stops it: without it the replica stays up, a warm
    standby the next scale-out can ``launch`` again). Samples (``t``, waiting; ``t``, load; seconds since
    :meth:`start`, which was at wall-clock ``t0_wall``), every :class:`ScaleOut` (``events``) and every
    :class:`ScaleIn` (``scale_ins``) are kept; replicas it started are in ``started`` (the caller stops them, or
    :meth:`stop` with ``stop_started=True``).

    Introduced in lab 22 (Routing and Autoscaling); scale-in in lab 23 (Observability and the Postmortem).
    """

    prom: Any
    router: Any
    launch: Callable[[], Any]
    rule: QueueRule = field(default_factory=QueueRule)
    replicas: int = 1
    max_replicas: int = 2
    interval_s: float = 0.5
    query: str = WAITING_QUERY
    load_query: str = IN_FLIGHT_QUERY
    retire: Callable[[Any], None] | None = None
    served_timeout_s: float = 300.0
    drain_timeout_s: float = 300.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    load: list[tuple[float, float]] = field(default_factory=list)
    events: list[ScaleOut] = field(default_factory=list)
    scale_ins: list[ScaleIn] = field(default_factory=list)
    started: list[Any] = field(default_factory=list)
    t0: float = 0.0
    t0_wall: float = 0.0

    def __post_init__(self) -> None:
        if self.max_replicas < self.replicas:
            raise ValueError(f"max_replicas={self.max_replicas} is below the {self.replicas} already serving")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._added: list[Any] = []      # replicas this autoscaler added and has not removed, in order
        self._serving: list[tuple[ScaleOut, Any, float, float]] = []   # added, not yet seen finishing a request
        self._draining: list[tuple[ScaleIn, Any, float]] = []   # removed, still finishing the requests it holds
        self._retiring: list[threading.Thread] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> "QueueAutoscaler":
        self.t0, self.t0_wall = time.monotonic(), time.time()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="queue-autoscaler", daemon=True)
        self._thread.start()
        return self

    def _sample(self, query: str) -> float:
        try:
            return float(self.prom.value(query))
        except Exception:  # Prometheus briefly unreachable: a gap, which breaks the hold
            return math.nan

    def _loop(self) -> None:
        # Every sample since the last scaling, not the last hold_s of them: when this loop is starved (a busy
        # 2-core machine, measured in lab 22: seconds between samples), a window cut by time loses the start of a
        # hold that had lasted long enough, and the loop acted seconds after the rule (decide) fired.
        window: list[tuple[float, float]] = []
        window_in: list[tuple[float, float]] = []
        scales_in = self.rule.scale_in_target is not None
        while not self._stop.is_set():
            t, waiting = self.now(), self._sample(self.query)
            with self._lock:
                self.samples.append((t, waiting))
            window.append((t, waiting))
            if scales_in:
                load = self._sample(self.load_query)
                with self._lock:
                    self.load.append((t, load))
                window_in.append((t, load))
            if self._serving:
                self._watch_serving()
            if self._draining:
                self._watch_draining()
            if self.replicas < self.max_replicas and decide(window, self.rule, self.replicas) is not None:
                self._scale_out(t, waiting)
                window, window_in = [], []
            elif self._added and decide_in(window_in, self.rule, self.replicas) is not None:
                self._scale_in(t, window_in[-1][1])
                window, window_in = [], []
            self._stop.wait(self.interval_s)

    def _scale_out(self, t: float, waiting: float) -> None:
        event = ScaleOut(decision_s=t, waiting=waiting, replicas_before=self.replicas)
        self.events.append(event)
        try:
            replica = self.launch()
            self.started.append(replica)
            event.url, event.healthy_s = replica.url, self.now()
            done_before = _finished(replica) or 0.0   # a warm standby may have served before: count from here
            self.router.add_worker(replica)
            event.registered_s = self.now()
            self.replicas += 1
            self._added.append(replica)
            # watched from the loop, which goes on deciding meanwhile (a replica the router never uses must not
            # stop the autoscaler from scaling back in)
            self._serving.append((event, replica, done_before, time.monotonic() + self.served_timeout_s))
        except Exception as exc:  # keep the loop alive and the reason on record
            event.error = f"{type(exc).__name__}: {exc}"

    def _watch_serving(self) -> None:
        """Mark each new replica's first finished request (``first_served_s``), or give up after served_timeout_s."""
        waiting = []
        for event, replica, done_before, deadline in self._serving:
            if (_finished(replica) or 0.0) > done_before:
                event.first_served_s = self.now()
            elif time.monotonic() < deadline:
                waiting.append((event, replica, done_before, deadline))
        self._serving = waiting

    def _scale_in(self, t: float, load: float) -> None:
        replica = self._added[-1]
        event = ScaleIn(decision_s=t, load=load, replicas_before=self.replicas, url=replica.url)
        self.scale_ins.append(event)
        try:
            self.router.remove_worker(replica)      # no new requests; those it holds finish there
        except Exception as exc:  # keep the loop alive and the reason on record
            event.error = f"{type(exc).__name__}: {exc}"
            return
        event.removed_s = self.now()
        self._added.pop()
        self._serving = [w for w in self._serving if w[1] is not replica]
        self.replicas -= 1
        # watched from the loop, which goes on sampling and deciding while the replica drains (it used to wait
        # here, up to drain_timeout_s, blind to a load that came back)
        self._draining.append((event, replica, time.monotonic() + self.drain_timeout_s))
        self._watch_draining()

    def _watch_draining(self) -> None:
        """Mark each removed replica drained once it holds no request (``drained_s``), then ``retire`` it in a
        thread of its own (stopping a server takes seconds); an error after drain_timeout_s."""
        still = []
        for event, replica, deadline in self._draining:
            try:
                holding = _holding(replica)
            except Exception as exc:  # noqa: BLE001 - on record, the loop goes on
                event.error = f"{type(exc).__name__}: {exc}"
                continue
            if holding == 0:
                event.drained_s = self.now()
                if self.retire is not None:
                    th = threading.Thread(target=self._retire, args=(event, replica), name="autoscaler-retire",
                                          daemon=True)
                    self._retiring.append(th)
                    th.start()
            elif time.monotonic() < deadline:
                still.append((event, replica, deadline))
            else:
                held = "could not say what it held" if holding is None else f"still held {holding:g} requests"
                event.error = f"{held} after drain_timeout_s={self.drain_timeout_s:g}"
        self._draining = still

    def _retire(self, event: ScaleIn, replica: Any) -> None:
        try:
            self.retire(replica)  # type: ignore[misc]
            event.retired_s = self.now()
        except Exception as exc:  # noqa: BLE001 - on record
            event.error = f"{type(exc).__name__}: {exc}"

    def wait_for_serving(self, timeout: float) -> ScaleOut | None:
        """Block until the last scale-out has served a request (or failed, or ``timeout``); returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.events and (self.events[-1].first_served_s is not None or self.events[-1].error):
                return self.events[-1]
            time.sleep(0.2)
        return self.events[-1] if self.events else None

    def wait_for_scale_in(self, timeout: float) -> ScaleIn | None:
        """Block until a scale-in has drained its replica and, with ``retire``, retired it (or failed, or
        ``timeout``); returns the last one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.scale_ins[-1] if self.scale_ins else None
            done = last is not None and last.drained_s is not None and (self.retire is None or last.retired_s)
            if last is not None and (done or last.error):
                return last
            time.sleep(0.2)
        return self.scale_ins[-1] if self.scale_ins else None

    def stop(self, stop_started: bool = False) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for th in self._retiring:
            th.join(timeout=60)
            self._thread = None
        if stop_started:
            for r in self.started:
                r.stop()  # a replica started with reuse on parks (helpers.fleet.stop_replicas)

    def frame(self):
        """The samples as a DataFrame: ``t_s``, ``waiting``, ``threshold`` (per replica) and, where it scales in,
        ``load`` (the scale-in query's answer)."""
        import pandas as pd

        with self._lock:
            rows, load = list(self.samples), dict(self.load)
        frame = pd.DataFrame(rows, columns=["t_s", "waiting"]).assign(threshold=self.rule.threshold)
        if load:
            frame["load"] = frame["t_s"].map(load)
        return frame

    def __enter__(self) -> "QueueAutoscaler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(stop_started=exc[0] is not None)


def _finished(replica: Any) -> float | None:
    """Requests the replica has finished (vLLM's ``request_success_total``), or ``None`` while it cannot say."""
    try:
        snap = replica.metrics()
    except metrics.MetricsUnavailable:
        return None
    return sum(s.value for s in snap.samples if s.name == "vllm:request_success_total")


def _holding(replica: Any) -> float | None:
    """Requests running or waiting on the replica, or ``None`` while it cannot say."""
    try:
        snap = replica.metrics()
    except metrics.MetricsUnavailable:
        return None
    return sum(s.value for s in snap.samples if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
