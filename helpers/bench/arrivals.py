"""Arrivals: when each request is sent.

Closed loop (``Synchronous``, ``Concurrent``): a fixed number of requests in flight; a new one is sent
as soon as one finishes, so the server's speed sets the arrival rate. Open loop (``ConstantRate``,
``Poisson``, ``Ramp``, and a trace's arrivals, :class:`helpers.bench.traces.TraceArrivals`): requests are
sent at scheduled times whatever the server does, as real users arrive. Open-loop arrivals have no hidden
semaphore; its optional ``max_in_flight`` cap is explicit, and the time a request waits for it is recorded
as client queue time.

Every open-loop process also says how many requests it sends in a given duration (:meth:`Arrivals.count_for`),
so a run can be sized in seconds (``bench.run(..., duration_s=60)``) rather than in requests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

__all__ = ["Arrivals", "Synchronous", "Concurrent", "ConstantRate", "Poisson", "Ramp", "Steps", "make_arrivals"]


class Arrivals:
    """Base class of the arrival processes: closed loop unless ``open_loop``.

    Subclasses are frozen dataclasses whose fields are ``concurrency`` (closed loop) or ``rate`` and
    ``max_in_flight`` (open loop).

    Introduced in lab 02 (Prefill and Decode).
    """

    open_loop: ClassVar[bool] = False
    name: ClassVar[str] = "arrivals"

    def offsets(self, n: int) -> list[float] | None:
        """Scheduled send times (seconds after the start) of ``n`` requests; ``None`` for closed loop."""
        return None

    def count_for(self, duration_s: float) -> int | None:
        """How many requests this open-loop process sends in ``duration_s`` (rate x duration, at least 1);
        ``None`` for closed loop, whose count the server's speed sets."""
        return None

    def send_times(self, duration_s: float) -> list[float] | None:
        """The send times (seconds after the start) of a run sized ``duration_s`` (``bench.run(...,
        duration_s=...)``): ``offsets(count_for(duration_s))``, known before the run since the process is seeded;
        ``None`` for closed loop.

        Introduced in lab 23 (Observability and the Postmortem).
        """
        n = self.count_for(duration_s)
        return None if n is None else self.offsets(n)

    @property
    def peak_rate(self) -> float | None:
        """The highest arrival rate (requests/s) of an open-loop process; ``None`` for closed loop."""
        return None

    def as_dict(self) -> dict:
        return {"arrivals": self.name, **asdict(self)}  # type: ignore[call-overload]

    def cli_args(self) -> list[str] | None:
        """The ``python -m helpers.bench run`` flags that select these arrivals (``None``: no CLI form)."""
        args = ["--arrivals", self.name]
        if getattr(self, "rate", None) is not None:
            args += ["--rate", f"{self.rate:g}"]  # type: ignore[attr-defined]
        if isinstance(self, Concurrent):
            args += ["--concurrency", str(self.concurrency)]
        if getattr(self, "max_in_flight", None) is not None:
            args += ["--max-in-flight", str(self.max_in_flight)]  # type: ignore[attr-defined]
        if isinstance(self, Ramp):
            args += ["--rate", f"{self.start_rate:g}", "--end-rate", f"{self.end_rate:g}",
                     "--ramp-duration", f"{self.duration_s:g}"]
        if isinstance(self, (Poisson, Ramp)):
            args += ["--arrival-seed", str(self.seed)]
        return args

    def describe(self) -> str:
        return self.name

    def _cap(self) -> str:
        cap = getattr(self, "max_in_flight", None)
        return f", at most {cap} in flight" if cap else ""


class _OpenLoop(Arrivals):
    """What the open-loop processes share: the count a duration sends, from the expected cumulative count."""

    open_loop: ClassVar[bool] = True

    def cumulative(self, t: float) -> float:
        """Expected requests sent by time ``t`` (the integral of the rate)."""
        raise NotImplementedError

    def count_for(self, duration_s: float) -> int:
        return max(1, int(round(self.cumulative(duration_s))))


class _SteadyRate(_OpenLoop):
    """An open loop at one ``rate`` (requests/s) throughout; subclasses declare the ``rate`` field."""

    def __post_init__(self) -> None:
        if not self.rate > 0:  # type: ignore[attr-defined]
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")  # type: ignore[attr-defined]

    def cumulative(self, t: float) -> float:
        return self.rate * t  # type: ignore[attr-defined]

    @property
    def peak_rate(self) -> float:
        return self.rate  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Synchronous(Arrivals):
    """One request at a time: the next is sent when the previous one ends (latency without contention).

    Introduced in lab 02 (Prefill and Decode).
    """

    name: ClassVar[str] = "synchronous"
    concurrency: ClassVar[int] = 1

    def describe(self) -> str:
        return "synchronous (1 in flight)"


@dataclass(frozen=True)
class Concurrent(Arrivals):
    """Closed loop: ``concurrency`` requests always in flight.

    Introduced in lab 07 (Continuous Batching).
    """

    concurrency: int = 8
    name: ClassVar[str] = "concurrent"

    def __post_init__(self) -> None:
        if int(self.concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    def describe(self) -> str:
        return f"concurrent ({self.concurrency} in flight)"


@dataclass(frozen=True)
class ConstantRate(_SteadyRate):
    """Open loop: one request every ``1 / rate`` seconds, whatever the server does.

    ``max_in_flight`` (optional) caps requests in flight; the wait for it is recorded as client queue time.

    Introduced in lab 10 (Load Testing Honestly).
    """

    rate: float = 1.0
    max_in_flight: int | None = None
    name: ClassVar[str] = "constant"

    def offsets(self, n: int) -> list[float]:
        return [i / self.rate for i in range(n)]

    def describe(self) -> str:
        return f"constant {self.rate:g} req/s{self._cap()}"


@dataclass(frozen=True)
class Poisson(_SteadyRate):
    """Open loop with exponential gaps of mean ``1 / rate`` (a Poisson process), seeded.

    The first request goes at 0; the schedule depends only on ``rate``, ``seed`` and ``n``.
    ``max_in_flight`` (optional) caps requests in flight; the wait is recorded as client queue time.

    Introduced in lab 10 (Load Testing Honestly).
    """

    rate: float = 1.0
    seed: int = 0
    max_in_flight: int | None = None
    name: ClassVar[str] = "poisson"

    def offsets(self, n: int) -> list[float]:
        if n <= 0:
            return []
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, size=n - 1)
        return [0.0] + np.cumsum(gaps).tolist()

    def describe(self) -> str:
        return f"poisson {self.rate:g} req/s (seed {self.seed}){self._cap()}"


@dataclass(frozen=True)
class Ramp(_OpenLoop):
    """Open loop, a Poisson process whose rate rises linearly from ``start_rate`` to ``end_rate`` over
    ``duration_s`` seconds (and stays at ``end_rate`` after, if more requests are asked for), seeded.

    Drawn by time rescaling: unit-rate exponential gaps mapped through the inverse of the cumulative rate
    ``L(t) = start_rate t + (end_rate - start_rate) t^2 / (2 duration_s)``. The first request goes at 0.
    It finds where latency turns up in one run, where a sweep needs several.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    start_rate: float = 1.0
    end_rate: float = 10.0
    duration_s: float = 60.0
    seed: int = 0
    max_in_flight: int | None = None
    name: ClassVar[str] = "ramp"

    def __post_init__(self) -> None:
        if self.start_rate < 0 or not self.end_rate > 0:
            raise ValueError(f"a ramp needs start_rate >= 0 and end_rate > 0 requests/s, got {self.start_rate} and "
                             f"{self.end_rate}")
        if not self.duration_s > 0:
            raise ValueError(f"a ramp needs duration_s > 0, got {self.duration_s}")

    def cumulative(self, t: float) -> float:
        """Expected requests sent by time ``t`` (the integral of the rate)."""
        d = self.duration_s
        if t <= d:
            return self.start_rate * t + (self.end_rate - self.start_rate) * t * t / (2 * d)
        return self.cumulative(d) + self.end_rate * (t - d)

    def rate_at(self, t: float) -> float:
        """The arrival rate (requests/s) at ``t`` seconds."""
        return self.start_rate + (self.end_rate - self.start_rate) * min(t, self.duration_s) / self.duration_s

    def _inverse(self, u: np.ndarray) -> np.ndarray:
        d, r0, r1 = self.duration_s, self.start_rate, self.end_rate
        a = (r1 - r0) / d
        total = self.cumulative(d)
        inside = u <= total
        t = np.empty_like(u)
        if a == 0:
            t[inside] = u[inside] / r0
        else:
            t[inside] = (-r0 + np.sqrt(np.maximum(r0 * r0 + 2 * a * u[inside], 0.0))) / a
        t[~inside] = d + (u[~inside] - total) / r1
        return t

    def offsets(self, n: int) -> list[float]:
        if n <= 0:
            return []
        unit = np.cumsum(np.random.default_rng(self.seed).exponential(1.0, size=n - 1))
        return [0.0] + self._inverse(unit).tolist()

    @property
    def peak_rate(self) -> float:
        return max(self.start_rate, self.end_rate)

    def describe(self) -> str:
        return (f"ramp {self.start_rate:g} -> {self.end_rate:g} req/s over {self.duration_s:g} s "
                f"(seed {self.seed}){self._cap()}")


@dataclass(frozen=True)
class Steps(_OpenLoop):
    """Open loop, Poisson within each phase: ``phases`` is ``((duration_s, rate), ...)`` — calm, overload, recovery
    — seeded. After the last phase it stays at the last rate if more requests are asked for.

    Drawn like :class:`Ramp`, by time rescaling through the cumulative rate, so a phase boundary is exact.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    phases: tuple[tuple[float, float], ...] = ((30.0, 1.0), (30.0, 4.0), (30.0, 1.0))
    seed: int = 0
    max_in_flight: int | None = None
    name: ClassVar[str] = "steps"

    def __post_init__(self) -> None:
        phases = tuple((float(d), float(r)) for d, r in self.phases)
        object.__setattr__(self, "phases", phases)
        if not phases or any(not d > 0 or r < 0 for d, r in phases) or not phases[-1][1] > 0:
            raise ValueError(f"steps need phases of (duration_s > 0, rate >= 0) and a last rate > 0, got {self.phases}")

    @property
    def duration_s(self) -> float:
        return sum(d for d, _ in self.phases)

    def boundaries(self) -> list[float]:
        """When each phase starts (seconds after the start)."""
        return [sum(d for d, _ in self.phases[:i]) for i in range(len(self.phases))]

    def cumulative(self, t: float) -> float:
        """Expected requests sent by time ``t``."""
        total, start = 0.0, 0.0
        for d, r in self.phases:
            if t <= start + d:
                return total + r * (t - start)
            total, start = total + r * d, start + d
        return total + self.phases[-1][1] * (t - start)

    def rate_at(self, t: float) -> float:
        for start, (d, r) in zip(self.boundaries(), self.phases):
            if t < start + d:
                return r
        return self.phases[-1][1]

    def _inverse(self, u: float) -> float:
        total, start = 0.0, 0.0
        for d, r in self.phases:
            if r > 0 and u <= total + r * d:
                return start + (u - total) / r
            total, start = total + r * d, start + d
        return start + (u - total) / self.phases[-1][1]

    def offsets(self, n: int) -> list[float]:
        if n <= 0:
            return []
        unit = np.cumsum(np.random.default_rng(self.seed).exponential(1.0, size=n))
        return [self._inverse(float(u)) for u in unit]

    @property
    def peak_rate(self) -> float:
        return max(r for _, r in self.phases)

    def as_dict(self) -> dict:
        return {"arrivals": self.name, "phases": [list(p) for p in self.phases], "seed": self.seed,
                "max_in_flight": self.max_in_flight}

    def cli_args(self) -> list[str] | None:
        return None  # no CLI form: the run's config records the phases

    def describe(self) -> str:
        return "steps " + ", ".join(f"{r:g} req/s for {d:g} s" for d, r in self.phases) + f" (seed {self.seed})"


def make_arrivals(name: str, rate: float | None = None, concurrency: int | None = None, seed: int = 0,
                  max_in_flight: int | None = None, end_rate: float | None = None,
                  ramp_duration_s: float | None = None) -> Arrivals:
    """Arrivals from their CLI name: ``synchronous``, ``concurrent`` (needs ``concurrency``),
    ``constant`` or ``poisson`` (need ``rate``), ``ramp`` (``rate`` to ``end_rate`` over ``ramp_duration_s``).

    Introduced in lab 10 (Load Testing Honestly).
    """
    name = name.lower()
    if name == "ramp":
        if rate is None or not end_rate or not ramp_duration_s:
            raise ValueError("arrivals 'ramp' need a start rate, an end rate and a duration "
                             "(--rate R0 --end-rate R1 --ramp-duration S)")
        return Ramp(rate, end_rate, ramp_duration_s, seed=seed, max_in_flight=max_in_flight)
    if name == "synchronous":
        return Synchronous()
    if name == "concurrent":
        if not concurrency:
            raise ValueError("arrivals 'concurrent' need a concurrency (--concurrency C)")
        return Concurrent(concurrency)
    if name in ("constant", "poisson"):
        if not rate:
            raise ValueError(f"arrivals {name!r} need a rate in requests/s (--rate R)")
        if name == "constant":
            return ConstantRate(rate, max_in_flight=max_in_flight)
        return Poisson(rate, seed=seed, max_in_flight=max_in_flight)
    raise ValueError(f"unknown arrivals {name!r}; choose synchronous, concurrent, constant, poisson or ramp")
