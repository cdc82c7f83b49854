"""Arrivals: when each request is sent.

Closed loop (``Synchronous``, ``Concurrent``): a fixed number of requests in flight; a new one is sent
as soon as one finishes, so the server's speed sets the arrival rate. Open loop (``ConstantRate``,
``Poisson``): requests are sent at scheduled times whatever the server does, as real users arrive.
Open-loop arrivals have no hidden semaphore; its optional ``max_in_flight`` cap is explicit, and the
time a request waits for it is recorded as client queue time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

__all__ = ["Arrivals", "Synchronous", "Concurrent", "ConstantRate", "Poisson", "make_arrivals"]


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

    def as_dict(self) -> dict:
        return {"arrivals": self.name, **asdict(self)}  # type: ignore[call-overload]

    def cli_args(self) -> list[str]:
        """The ``python -m helpers.bench run`` flags that select these arrivals."""
        args = ["--arrivals", self.name]
        if getattr(self, "rate", None) is not None:
            args += ["--rate", f"{self.rate:g}"]  # type: ignore[attr-defined]
        if isinstance(self, Concurrent):
            args += ["--concurrency", str(self.concurrency)]
        if getattr(self, "max_in_flight", None) is not None:
            args += ["--max-in-flight", str(self.max_in_flight)]  # type: ignore[attr-defined]
        if isinstance(self, Poisson):
            args += ["--arrival-seed", str(self.seed)]
        return args

    def describe(self) -> str:
        return self.name


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
class ConstantRate(Arrivals):
    """Open loop: one request every ``1 / rate`` seconds, whatever the server does.

    ``max_in_flight`` (optional) caps requests in flight; the wait for it is recorded as client queue time.

    Introduced in lab 10 (Load Testing Honestly).
    """

    rate: float = 1.0
    max_in_flight: int | None = None
    name: ClassVar[str] = "constant"
    open_loop: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")

    def offsets(self, n: int) -> list[float]:
        return [i / self.rate for i in range(n)]

    def describe(self) -> str:
        cap = f", at most {self.max_in_flight} in flight" if self.max_in_flight else ""
        return f"constant {self.rate:g} req/s{cap}"


@dataclass(frozen=True)
class Poisson(Arrivals):
    """Open loop with exponential gaps of mean ``1 / rate`` (a Poisson process), seeded.

    The first request goes at 0; the schedule depends only on ``rate``, ``seed`` and ``n``.
    ``max_in_flight`` (optional) caps requests in flight; the wait is recorded as client queue time.

    Introduced in lab 10 (Load Testing Honestly).
    """

    rate: float = 1.0
    seed: int = 0
    max_in_flight: int | None = None
    name: ClassVar[str] = "poisson"
    open_loop: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")

    def offsets(self, n: int) -> list[float]:
        if n <= 0:
            return []
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, size=n - 1)
        return [0.0] + np.cumsum(gaps).tolist()

    def describe(self) -> str:
        cap = f", at most {self.max_in_flight} in flight" if self.max_in_flight else ""
        return f"poisson {self.rate:g} req/s (seed {self.seed}){cap}"


def make_arrivals(name: str, rate: float | None = None, concurrency: int | None = None, seed: int = 0,
                  max_in_flight: int | None = None) -> Arrivals:
    """Arrivals from their CLI name: ``synchronous``, ``concurrent`` (needs ``concurrency``),
    ``constant`` or ``poisson`` (need ``rate``).

    Introduced in lab 10 (Load Testing Honestly).
    """
    name = name.lower()
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
    raise ValueError(f"unknown arrivals {name!r}; choose synchronous, concurrent, constant or poisson")
