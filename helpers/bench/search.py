"""Sweeps and searches over runs: the same workload at several loads, and the highest rate that meets an SLO.

A search is not the runner: :func:`helpers.bench.run` runs one load; this module decides which loads to run
(vLLM's own benchmarks split ``serve.py`` from ``sweep/serve_sla.py`` the same way).

Introduced in lab 11 (Latency, Throughput, Goodput).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import settings
from .arrivals import Arrivals, Concurrent, Poisson
from .charts import latency_throughput
from .records import RequestResult
from .runner import run
from .stats import SLO, metric_values
from .store import RunResult
from .workloads import WorkloadSpec

__all__ = ["sweep", "SweepResult", "find_max_rate", "MaxRateResult", "Probe"]


def _parent(out: str | Path | None | bool, kind: str) -> Path | None:
    if out is False:
        return None
    if out in (None, True):
        return settings.runs_dir() / "bench" / f"{kind}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    return Path(out)


# -------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepResult:
    """Runs of a sweep, in order, with one summary row per run in ``df``.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    runs: list[RunResult]
    parameter: str
    values: list[float]

    @property
    def df(self):
        import pandas as pd

        rows = []
        for v, r in zip(self.values, self.runs):
            s = r.summary
            row = {self.parameter: v, "completed": s.completed, "failed": s.failed,
                   "request_throughput": s.request_throughput, "output_throughput": s.output_throughput,
                   "achieved_rate": s.achieved_rate}
            for m in ("ttft", "tpot", "itl", "e2e", "client_queue"):
                dist = getattr(s, f"{m}_ms")
                row[f"{m}_p50_ms"], row[f"{m}_p99_ms"] = dist.p50, dist.p99
            if s.goodput is not None:
                row["goodput"] = s.goodput.goodput_rps
            rows.append(row)
        return pd.DataFrame(rows)

    def chart(self, **kwargs: Any):
        return latency_throughput(self, **kwargs)


def sweep(
    workload: WorkloadSpec,
    *,
    rates: Sequence[float] | None = None,
    concurrencies: Sequence[int] | None = None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    min_requests: int = 20,
    seed: int = 0,
    warmup: int = 0,
    out: str | Path | None | bool = None,
    **run_kwargs: Any,
) -> SweepResult:
    """Run the same workload at several Poisson ``rates`` or closed-loop ``concurrencies``.

    Each run gets fresh prompts (seed + i), so no run warms the prefix cache for the next. Per run:
    ``num_requests``, or for rates ``max(min_requests, rate * duration_s)``. ``out`` is a parent folder
    (one subfolder per run). Other keywords go to :func:`run`.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    if not isinstance(workload, WorkloadSpec):
        raise TypeError("sweep needs a WorkloadSpec (FixedLength, SharedPrefix, FromJsonl) so each run gets fresh "
                        "prompts; a built Workload would repeat them and hit the prefix cache")
    if (rates is None) == (concurrencies is None):
        raise ValueError("give exactly one of rates=[...] (Poisson) or concurrencies=[...] (closed loop)")
    parent = _parent(out, "sweep")
    runs: list[RunResult] = []
    values = list(rates if rates is not None else concurrencies)  # type: ignore[arg-type]
    for i, v in enumerate(values):
        if rates is not None:
            arrivals: Arrivals = Poisson(float(v), seed=seed + i)
            n = num_requests or max(min_requests, int(math.ceil(float(v) * (duration_s or 30.0))))
            name = f"rate-{v:g}"
        else:
            arrivals = Concurrent(int(v))
            n = num_requests or max(min_requests, int(v) * 4)
            name = f"concurrency-{int(v)}"
        r = run(workload, arrivals, num_requests=n, seed=seed + i, warmup=warmup,
                out=False if parent is None else parent / name, label=name, **run_kwargs)
        runs.append(r)
    return SweepResult(runs=runs, parameter="rate" if rates is not None else "concurrency", values=values)


@dataclass
class Probe:
    """One run of :func:`find_max_rate`: its rate, the measured quantile, and whether it passed (and why not).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float
    value_ms: float | None
    passed: bool
    reason: str
    run: RunResult | None = None


@dataclass
class MaxRateResult:
    """The highest Poisson rate found that kept ``q`` quantile of ``metric`` within the SLO.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float | None
    metric: str
    q: float
    target_ms: float
    probes: list[Probe]
    bracket: tuple[float | None, float | None]

    @property
    def df(self):
        import pandas as pd

        return pd.DataFrame([{"rate": p.rate, f"{self.metric}_p{self.q * 100:g}_ms": p.value_ms, "passed": p.passed,
                              "reason": p.reason} for p in self.probes])

    def __str__(self) -> str:
        lo, hi = self.bracket
        best = f"{self.rate:.3g} req/s" if self.rate is not None else "none (even the lowest rate failed)"
        fmt = lambda r: "none" if r is None else f"{r:.3g}"  # noqa: E731
        return (f"max rate with {self.metric} p{self.q * 100:g} <= {self.target_ms:g} ms: {best} "
                f"(passes at {fmt(lo)}, fails at {fmt(hi)}; {len(self.probes)} runs)")


def find_max_rate(
    workload: WorkloadSpec,
    slo: SLO,
    *,
    metric: str = "ttft",
    q: float = 0.99,
    start_rate: float = 1.0,
    max_rate: float | None = None,
    rel_tol: float = 0.1,
    max_runs: int = 8,
    duration_s: float = 20.0,
    min_requests: int = 30,
    max_failure_rate: float = 0.01,
    seed: int = 0,
    out: str | Path | None | bool = None,
    runner: Callable[..., RunResult] | None = None,
    **run_kwargs: Any,
) -> MaxRateResult:
    """Search the highest Poisson rate whose ``q`` quantile of ``metric`` stays within ``slo``.

    Bracketing then bisection: from ``start_rate`` double while runs pass (halve while they fail)
    until a pass and a fail bracket the answer, then bisect until the bracket is within ``rel_tol``
    of the passing rate, or ``max_runs`` runs were made. A run passes when the quantile is within the
    SLO's bound for ``metric``, at most ``max_failure_rate`` of requests failed, and the client kept
    its schedule (client queue p99 under 10% of the bound). Each run lasts about ``duration_s``
    (at least ``min_requests`` requests) with fresh prompts. ``runner`` replaces :func:`run` (for tests).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    m = metric.removesuffix("_ms")
    target = getattr(slo, f"{m}_ms", None)
    if target is None:
        raise ValueError(f"slo sets no bound for {m!r}: e.g. SLO({m}_ms=500)")
    runner = runner or run
    parent = _parent(out, "maxrate")
    probes: list[Probe] = []
    lo: float | None = None
    hi: float | None = None
    rate = float(start_rate)
    for i in range(max_runs):
        n = max(min_requests, int(math.ceil(rate * duration_s)))
        r = runner(workload, Poisson(rate, seed=seed + i), num_requests=n, seed=seed + i,
                   out=False if parent is None else parent / f"probe-{i}-rate-{rate:.4g}", slo=slo,
                   label=f"rate {rate:.4g}", **run_kwargs)
        s = r.summary
        dist = getattr(s, f"{m}_ms")
        value = dist.p99 if q == 0.99 else _quantile(r.records, m, q)
        reasons = []
        if value is None:
            reasons.append("no completed requests")
        elif value > target:
            reasons.append(f"p{q * 100:g} {value:.1f} ms > {target:g} ms")
        if s.failure_rate > max_failure_rate:
            reasons.append(f"{s.failure_rate:.1%} failed")
        cq = s.client_queue_ms.p99
        if cq is not None and cq > 0.1 * target:
            reasons.append(f"client fell behind its schedule (client queue p99 {cq:.1f} ms)")
        passed = not reasons
        probes.append(Probe(rate, value, passed, "; ".join(reasons) or "ok", r))
        if passed:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            if (hi - lo) / lo <= rel_tol:
                break
            rate = (lo + hi) / 2
        elif lo is not None:
            if max_rate is not None and lo >= max_rate:
                break
            rate = rate * 2 if max_rate is None else min(rate * 2, max_rate)
        else:
            rate = rate / 2
    return MaxRateResult(rate=lo, metric=m, q=q, target_ms=float(target), probes=probes, bracket=(lo, hi))


def _quantile(records: list[RequestResult], metric: str, q: float) -> float | None:

    vals = metric_values(records, metric)
    return float(np.percentile(vals, q * 100)) if vals else None
