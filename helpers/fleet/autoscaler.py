"""Queue-based scale-out: watch waiting requests in Prometheus, start a replica, add it to the router, time it all.

::

    scaler = fleet.QueueAutoscaler(prom, router, launch=lambda: fleet.start_replicas(PROFILE, 1, ...)[0],
                                   rule=fleet.QueueRule(threshold=4, hold_s=3))
    with scaler:                          # a background thread polls every interval_s
        bench.run(ramp, base_url=router)  # the queue builds, the rule fires, a replica joins
    scaler.events[0].decision_to_serving_s

The rule is the one KEDA's ScaledObject and the fleet's ``VllmQueueBuilding`` alert use: waiting requests per
ready replica at or above ``threshold`` for ``hold_s``. It is a pure function of samples (:func:`decide`), so a lab
can replay it on the recorded series and a test can check it without a fleet.

Each scale-out is a :class:`ScaleOut`: when the rule fired, when the new replica answered, when the router took
it, when it first finished a request. On this 2-core machine decision → serving took 51-60 s under load
(``phase4-fleet-findings.md``): the new replica's start-up competes with the saturated one for the cores.

Introduced in lab 22 (Routing and Autoscaling).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from .. import metrics

__all__ = ["QueueRule", "ScaleOut", "QueueAutoscaler", "decide", "WAITING_QUERY"]

#: Requests waiting in every replica's scheduler queue, summed over the fleet (vLLM's own gauge).
WAITING_QUERY = 'sum(vllm:num_requests_waiting{job="vllm"})'


@dataclass(frozen=True)
class QueueRule:
    """Scale out by one replica when waiting requests per replica stay at or above ``threshold`` for ``hold_s``.

    Introduced in lab 22 (Routing and Autoscaling).
    """

    threshold: float = 4.0
    hold_s: float = 3.0

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold={self.threshold!r}: give waiting requests per replica, e.g. 4")
        if not (self.hold_s >= 0 and math.isfinite(self.hold_s)):
            raise ValueError(f"hold_s={self.hold_s!r}: give seconds the queue must stay above threshold, e.g. 3")


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
class QueueAutoscaler:
    """A background loop that applies a :class:`QueueRule` to Prometheus and scales out through a router.

    ``prom`` answers ``value(expr)`` (a :class:`~helpers.fleet.Prometheus`); ``router`` has ``add_worker`` (a
    :class:`~helpers.fleet.Router`); ``launch()`` starts one replica and returns it ready (a server with ``.url``
    and ``.metrics()``). At most ``max_replicas`` in all; ``replicas`` is how many serve at the start. Samples
    (``t``, waiting; seconds since :meth:`start`, which was at wall-clock ``t0_wall``) and every :class:`ScaleOut` are
    kept; replicas it started are in ``started`` (the caller
    stops them, or :meth:`stop` with ``stop_started=True``).

    Introduced in lab 22 (Routing and Autoscaling).
    """

    prom: Any
    router: Any
    launch: Callable[[], Any]
    rule: QueueRule = field(default_factory=QueueRule)
    replicas: int = 1
    max_replicas: int = 2
    interval_s: float = 0.5
    query: str = WAITING_QUERY
    served_timeout_s: float = 300.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    events: list[ScaleOut] = field(default_factory=list)
    started: list[Any] = field(default_factory=list)
    t0: float = 0.0
    t0_wall: float = 0.0

    def __post_init__(self) -> None:
        if self.max_replicas < self.replicas:
            raise ValueError(f"max_replicas={self.max_replicas} is below the {self.replicas} already serving")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> "QueueAutoscaler":
        self.t0, self.t0_wall = time.monotonic(), time.time()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="queue-autoscaler", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> float:
        try:
            return float(self.prom.value(self.query))
        except Exception:  # Prometheus briefly unreachable: a gap, which breaks the hold
            return math.nan

    def _loop(self) -> None:
        # Every sample since the last scale-out, not the last hold_s of them: when this loop is starved (a busy
        # 2-core machine, measured in lab 22: seconds between samples), a window cut by time loses the start of a
        # hold that had lasted long enough, and the loop acted seconds after the rule (decide) fired.
        window: list[tuple[float, float]] = []
        while not self._stop.is_set():
            t, waiting = self.now(), self._sample()
            with self._lock:
                self.samples.append((t, waiting))
            window.append((t, waiting))
            if self.replicas < self.max_replicas and decide(window, self.rule, self.replicas) is not None:
                self._scale_out(t, waiting)
                window = []
            self._stop.wait(self.interval_s)

    def _scale_out(self, t: float, waiting: float) -> None:
        event = ScaleOut(decision_s=t, waiting=waiting, replicas_before=self.replicas)
        self.events.append(event)
        try:
            replica = self.launch()
            self.started.append(replica)
            event.url, event.healthy_s = replica.url, self.now()
            self.router.add_worker(replica)
            event.registered_s = self.now()
            self.replicas += 1
            deadline = time.monotonic() + self.served_timeout_s
            while not self._stop.is_set() and time.monotonic() < deadline:
                if _served(replica):
                    event.first_served_s = self.now()
                    break
                time.sleep(0.2)
        except Exception as exc:  # keep the loop alive and the reason on record
            event.error = f"{type(exc).__name__}: {exc}"

    def wait_for_serving(self, timeout: float) -> ScaleOut | None:
        """Block until the last scale-out has served a request (or failed, or ``timeout``); returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.events and (self.events[-1].first_served_s is not None or self.events[-1].error):
                return self.events[-1]
            time.sleep(0.2)
        return self.events[-1] if self.events else None

    def stop(self, stop_started: bool = False) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if stop_started:
            for r in self.started:
                r.stop()  # a replica started with reuse on parks (helpers.fleet.stop_replicas)

    def frame(self):
        """The samples as a DataFrame: ``t_s``, ``waiting``, ``per_replica_threshold``."""
        import pandas as pd

        with self._lock:
            rows = list(self.samples)
        return pd.DataFrame(rows, columns=["t_s", "waiting"]).assign(threshold=self.rule.threshold)

    def __enter__(self) -> "QueueAutoscaler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(stop_started=exc[0] is not None)


def _served(replica: Any) -> bool:
    try:
        snap = replica.metrics()
    except metrics.MetricsUnavailable:
        return False
    done = sum(s.value for s in snap.samples if s.name == "vllm:request_success_total")
    return done > 0
