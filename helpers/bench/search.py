"""Sweeps and searches over runs: the same workload at several loads, and the highest rate that meets an SLO.

A search is not the runner: :func:`helpers.bench.run` runs one load; this module decides which loads to run
(vLLM's own benchmarks split ``serve.py`` from ``sweep/serve_sla.py`` the same way).

Introduced in lab 11 (Latency, Throughput, Goodput).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import settings
from .arrivals import Arrivals, Concurrent, Poisson
from .charts import latency_throughput
from .runner import run
from .stats import (METRICS, SLO, metric_values, quantile_with_ci, requests_to_show, steady_state_window,
                    wilson_interval, window_records)
from .store import RunResult
from .workloads import WorkloadSpec

__all__ = ["sweep", "SweepResult", "capacity", "Capacity", "find_max_rate", "MaxRateResult", "Probe", "Remeasure"]


def _parent(out: str | Path | None | bool, kind: str) -> Path | None:
    if out is False:
        return None
    if out in (None, True):
        return settings.runs_dir() / "bench" / f"{kind}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    return Path(out)


# -------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepResult:
    """Runs of a sweep, in order, with one summary row per run in ``df`` (``valid`` first: an invalid run measured
    the client, not the server).

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
            row = {self.parameter: v, "valid": s.valid, "completed": s.completed, "failed": s.failed,
                   "request_throughput": s.request_throughput, "output_throughput": s.output_throughput,
                   "achieved_rate": s.achieved_rate}
            for m in METRICS:
                dist = getattr(s, f"{m}_ms")
                row[f"{m}_p50_ms"], row[f"{m}_p99_ms"] = dist.p50, dist.p99
            if s.goodput_at_load is not None:
                row["goodput"] = row["goodput_at_load"] = s.goodput_at_load.goodput_rps
                row["attainment"] = s.goodput_at_load.attainment
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


# ------------------------------------------------------------------------------ capacity
@dataclass
class Capacity:
    """What a server completes per second with ``concurrency`` requests of one shape always in flight.

    ``requests_per_s`` is the steady-state output token rate divided by the tokens a completed request streamed:
    counted by token, not by completion, because a closed loop of same-length requests runs in lockstep waves (they
    start together, finish together, and their replacements start together), so the completions inside a window of
    a few waves jump by a whole wave with where the window falls: measured 6.26-7.03 req/s in four 10 s runs of one
    server where the token count read 6.26-6.64 and a 40 s run 6.39.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    requests_per_s: float
    output_tokens_per_s: float
    tokens_per_request: float
    concurrency: int
    run: RunResult = field(repr=False)


def capacity(workload: WorkloadSpec, base_url: Any, *, concurrency: int, duration_s: float, seed: int = 0,
             **run_kwargs: Any) -> Capacity:
    """Measure a server's capacity for ``workload``'s shape: ``concurrency`` requests in flight (its
    ``max_num_seqs``, to fill its batch) for ``duration_s``; see :class:`Capacity` for how it is counted. Other
    keywords go to :func:`run`.

    Introduced in lab 17 (Cost per Million Tokens).
    """
    r = run(workload, Concurrent(int(concurrency)), base_url=base_url, duration_s=duration_s, seed=seed, **run_kwargs)
    done = [x for x in r.records if x.ok and not x.warmup and x.streamed_tokens]
    tokens_per_s = r.summary.output_throughput
    if not done or not tokens_per_s:
        raise RuntimeError(f"the capacity run completed no request in {duration_s:g} s at {concurrency} in flight "
                           f"({r.summary.failed} failed{': ' + str(r.summary.errors) if r.summary.errors else ''}): "
                           "is the server up, and the run long enough for one request?")
    per_request = sum(x.streamed_tokens for x in done) / len(done)
    return Capacity(requests_per_s=tokens_per_s / per_request, output_tokens_per_s=tokens_per_s,
                    tokens_per_request=per_request, concurrency=int(concurrency), run=r)


# ------------------------------------------------------------------------------ max rate at an SLO
@dataclass
class Probe:
    """One run of :func:`find_max_rate`: its rate, its statistic with a 95% interval, and the decision.

    ``statistic`` names what was measured: ``"ttft p99 (ms)"`` (quantile mode; ``value_ms`` holds it too) or
    ``"attainment"`` (the share of requests meeting the SLO). ``decision`` is ``"pass"`` (the interval lies on the
    good side of the target), ``"fail"`` (on the bad side, or requests failed, or the client fell behind) or
    ``"undecided"`` (the interval straddles the target even at the longest duration tried, or the run was invalid
    because the client was the bottleneck); ``passed`` is ``decision == "pass"``. ``attempt`` counts reruns at the
    same rate (each twice as long); ``kind`` is ``"search"`` or ``"confirm"``.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float
    value_ms: float | None
    passed: bool
    reason: str
    run: RunResult | None = None
    ci: tuple[float, float] | None = None
    decision: str = "pass"
    statistic: str = ""
    value: float | None = None
    attempt: int = 0
    duration_s: float = 0.0
    kind: str = "search"

    def describe(self) -> str:
        ci = f"[{self.ci[0]:.4g}, {self.ci[1]:.4g}]" if self.ci else "[-]"
        value = "-" if self.value is None else f"{self.value:.4g}"
        extra = "" if self.decision == "pass" else f" ({self.reason})"
        again = f", rerun {self.attempt}" if self.attempt else ""
        kind = " confirm" if self.kind == "confirm" else ""
        return (f"{self.rate:.4g} req/s{kind}{again}, {self.duration_s:g} s: {self.statistic} {value}, 95% CI {ci} -> "
                f"{self.decision}{extra}")


@dataclass
class MaxRateResult:
    """The highest Poisson rate found that met the target, with every probe and what the search could not settle.

    ``mode`` is ``"quantile"`` (the ``q`` quantile of ``metric`` within ``target_ms``) or ``"attainment"`` (at least
    ``attainment`` of requests meeting every bound of ``slo``: DistServe's goodput, :attr:`max_rate_at_slo`).
    ``bracket`` is (the highest rate that passed, the lowest that did not). ``non_monotonic`` lists (passing rate,
    failing rate) pairs where a rate passed at or above one that failed: kept, never dropped, and said in ``str``.
    ``confirmed`` is the verdict of the ``confirm`` re-measurement (``None`` without one).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float | None
    metric: str
    q: float
    target_ms: float
    probes: list[Probe]
    bracket: tuple[float | None, float | None]
    mode: str = "quantile"
    attainment: float | None = None
    slo: SLO | None = None
    non_monotonic: list[tuple[float, float]] = field(default_factory=list)
    confirmed: bool | None = None

    @property
    def max_rate_at_slo(self) -> float | None:
        """DistServe's goodput: the found rate in attainment mode (``None`` in quantile mode, which is another
        question)."""
        return self.rate if self.mode == "attainment" else None

    @property
    def undecided(self) -> list[float]:
        """Rates the search could not decide on (their interval straddled the target, or the run was invalid)."""
        return [p.rate for p in self.probes if p.decision == "undecided" and _final(self.probes, p)]

    @property
    def df(self):
        import pandas as pd

        return pd.DataFrame([{"rate": p.rate, "kind": p.kind, "attempt": p.attempt, "duration_s": p.duration_s,
                              "statistic": p.statistic, "value": p.value,
                              "ci_low": p.ci[0] if p.ci else None, "ci_high": p.ci[1] if p.ci else None,
                              f"{self.metric}_p{self.q * 100:g}_ms": p.value_ms, "decision": p.decision,
                              "passed": p.passed, "reason": p.reason} for p in self.probes])

    def table(self) -> str:
        """One line per probe: rate, statistic, interval, decision."""
        return "\n".join(p.describe() for p in self.probes)

    def __str__(self) -> str:
        lo, hi = self.bracket
        fmt = lambda r: "none" if r is None else f"{r:.3g}"  # noqa: E731
        best = f"{self.rate:.3g} req/s" if self.rate is not None else "none (no rate passed)"
        if self.mode == "attainment":
            what = f"max rate with >= {self.attainment:.0%} of requests meeting {self.slo}"
        else:
            what = f"max rate with {self.metric} p{self.q * 100:g} <= {self.target_ms:g} ms"
        out = f"{what}: {best} (passes at {fmt(lo)}, not at {fmt(hi)}; {len(self.probes)} runs)"
        if self.undecided:
            out += f"; undecided at {', '.join(f'{r:.3g}' for r in self.undecided)} req/s"
        if self.non_monotonic:
            out += ("; NOT MONOTONIC: passed at " + ", ".join(f"{p:.3g} after failing at {f:.3g}"
                                                           for p, f in self.non_monotonic) + " req/s")
        if self.confirmed is not None:
            out += "; confirmed on a fresh measurement" if self.confirmed else "; NOT confirmed on a fresh measurement"
        return out


def _final(probes: list[Probe], p: Probe) -> bool:
    """Is ``p`` the last search probe at its rate (the one whose decision counts)?"""
    same = [x for x in probes if x.rate == p.rate and x.kind == p.kind]
    return same[-1] is p


class Remeasure:
    """What ``confirm`` is given: call it (``remeasure(base_url=...)``) to re-measure the found rate, e.g. against a
    freshly started server; it runs one more probe at that rate with fresh prompts and returns its run.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    def __init__(self, rate: float, duration_s: float, probe: Callable[..., Probe]):
        self.rate, self.duration_s = rate, duration_s
        self._probe = probe
        self.probe: Probe | None = None

    def __call__(self, base_url: Any = None) -> RunResult | None:
        self.probe = self._probe(base_url)
        return self.probe.run


def _judge(r: Any, mode: str, metric: str, q: float, target: float, slo: SLO, max_failure_rate: float,
           seed: int) -> tuple[str, float | None, tuple[float, float] | None, list[str], bool]:
    """A probe's decision from its run: (decision, value, ci, reasons, worth repeating).

    The quantile's interval is the bootstrap one the summary reports (``p99_ci``). For a high quantile it cannot
    reach above the largest value measured, so with few requests a pass says that (nearly) every request met the
    target; more requests per probe make it say more."""
    s = r.summary
    capped = bool((getattr(r, "config", None) or {}).get("arrivals", {}).get("max_in_flight"))
    window = steady_state_window(r.records)

    def statistic(judged: list) -> tuple[float | None, tuple[float, float] | None, bool, bool]:
        if mode == "attainment":
            met = sum(1 for x in judged if slo.met(x))
            value, ci = (met / len(judged) if judged else None), wilson_interval(met, len(judged))
            return value, ci, ci is not None and ci[0] >= target, ci is not None and ci[1] < target
        value, ci = quantile_with_ci(metric_values(judged, metric, None), q, seed=seed)
        return value, ci, ci is not None and ci[1] <= target, ci is not None and ci[0] > target

    def describe(value: float | None, ci: tuple[float, float] | None) -> str:
        if value is None or ci is None:
            return "no requests in the window" if mode == "attainment" else "no completed requests"
        if mode == "attainment":
            return f"attainment {value:.1%} with 95% CI [{ci[0]:.1%}, {ci[1]:.1%}] against {target:.0%}"
        return f"p{q * 100:g} {value:.1f} ms with 95% CI [{ci[0]:.1f}, {ci[1]:.1f}] against {target:g} ms"

    value, ci, good_side, bad_side = statistic(window_records(r.records, window))
    where = describe(value, ci)
    reasons: list[str] = []
    if value is None or ci is None:
        reasons.append(where)
        return "fail", value, ci, reasons, False
    # The window keeps the requests dispatched after the ramp-up, up to the last dispatch; in a probe not many E2Es
    # long, the last of them decode while the server drains (measured, lab 17: at 7 req/s against 5 served, the
    # window's 39 requests all met TPOT 200 ms, the whole run's 84 only 68%, its failures mid-run). A run that
    # fails as a whole is not passed on its window.
    if window is not None and window.method == "steady-state" and good_side:
        all_value, all_ci, _, all_bad = statistic(window_records(r.records, None))
        if all_bad:
            return "fail", value, ci, [where, f"but over the whole run {describe(all_value, all_ci)}: the window "
                                              "missed requests that queued or slowed before the drain"], False
    if s.failure_rate > max_failure_rate:
        reasons.append(f"{s.failure_rate:.1%} of requests failed")
    cq = s.client_queue_ms.p99
    if mode == "quantile" and capped and cq is not None and cq > 0.1 * target:
        reasons.append(f"requests waited for the max_in_flight cap (client queue p99 {cq:.1f} ms)")
    if reasons:
        return "fail", value, ci, [where, *reasons], False
    if not getattr(s, "valid", True):  # the client, not the server, set these numbers: they decide nothing
        return "undecided", value, ci, [where, f"invalid run: {s.invalid_reason}"], False
    if good_side:
        return "pass", value, ci, [where], False
    if bad_side:
        return "fail", value, ci, [where], False
    return "undecided", value, ci, [where + ": the interval straddles the target"], True


def find_max_rate(
    workload: WorkloadSpec,
    slo: SLO,
    *,
    attainment: float | None = None,
    metric: str | None = None,
    q: float = 0.99,
    start_rate: float = 1.0,
    max_rate: float | None = None,
    min_rate: float | None = None,
    rel_tol: float = 0.1,
    max_runs: int = 8,
    max_repeats: int = 1,
    duration_s: float = 20.0,
    min_requests: int | None = None,
    max_failure_rate: float = 0.01,
    confirm: Callable[[Remeasure], Any] | None = None,
    seed: int = 0,
    out: str | Path | None | bool = None,
    runner: Callable[..., RunResult] | None = None,
    **run_kwargs: Any,
) -> MaxRateResult:
    """Search the highest Poisson rate that meets a target, deciding each probe with its uncertainty.

    Two targets. ``attainment=P`` (DistServe's goodput, ``max_rate_at_slo``): at least ``P`` of the requests meet
    every bound of ``slo`` (TTFT *and* TPOT); the share's 95% interval is Wilson's. Without it (or with
    ``metric="ttft", q=0.99``, the default, which lab 11's report uses): the ``q`` quantile of ``metric`` stays
    within ``slo``'s bound for it; its 95% interval is a bootstrap. Both are over the requests dispatched in each
    run's steady-state window.

    A probe **passes** when its whole interval is on the good side of the target, **fails** when it is wholly on
    the bad side (or more than ``max_failure_rate`` of requests failed, or requests waited for an explicit
    ``max_in_flight`` cap for over 10% of the target), and is otherwise **rerun** with twice the duration, up to
    ``max_repeats`` times, then recorded ``undecided``. An invalid run (the client was the bottleneck, e.g. it fell
    behind its schedule) is ``undecided`` and not rerun. Only passes count as passing.

    Bracketing then bisection: from ``start_rate`` double while probes pass (halve while they do not) until a pass
    and a non-pass bracket the answer, then bisect until the bracket is within ``rel_tol`` of the passing rate, or
    ``max_runs`` runs (reruns included) were made. ``max_rate`` caps the doubling; ``min_rate`` floors the halving
    (a failure there ends the search, bracket ``(None, min_rate)``): a probe of ``min_requests`` at half the rate
    takes twice as long, and below some rate the answer no longer matters (lab 17: on the same machine, a
    configuration that misses the target at the baseline's rate costs more per token than the baseline). Each run lasts about
    ``duration_s`` (at least ``min_requests`` requests: by default 30, and with ``attainment`` a quarter more than
    :func:`requests_to_show`, below which no probe could pass) with fresh prompts. A pass at or above a failed
    rate is kept and flagged (``non_monotonic``).
    ``confirm(remeasure)``, if given, is called with a :class:`Remeasure` of the found rate (it may start a fresh
    server and call ``remeasure(base_url=that_server)``); its verdict is ``confirmed``. ``runner`` replaces
    :func:`run` (for tests).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    if attainment is not None and metric is not None:
        raise ValueError("give attainment=P (share of requests meeting the whole SLO) or metric=... with q=... "
                         "(a quantile within its bound), not both")
    mode = "attainment" if attainment is not None else "quantile"
    m = (metric or "ttft").removesuffix("_ms")
    if mode == "attainment":
        if not 0 < attainment < 1:  # type: ignore[operator]
            raise ValueError(f"attainment is a share of requests, between 0 and 1 (e.g. 0.9), got {attainment}")
        if not slo.is_set():
            raise ValueError("attainment needs an SLO with bounds, e.g. SLO(ttft_ms=500, tpot_ms=50)")
        target = float(attainment)  # type: ignore[arg-type]
        statistic = "attainment"
        need = requests_to_show(target)
        if min_requests is None:  # a quarter more than the judged minimum: the warm-up before the window is not judged
            min_requests = max(30, int(math.ceil(1.25 * need)))
        if min_requests < need:  # a probe of fewer requests can never pass: the search would find nothing
            raise ValueError(f"min_requests={min_requests} cannot show {target:.0%} attainment: even with every request "
                             f"meeting the SLO, Wilson's 95% lower bound stays below it until {need} requests are "
                             f"judged. Pass min_requests >= {need} (more, since the warm-up before the steady-state "
                             "window is not judged), or a lower attainment")
    else:
        bound = getattr(slo, f"{m}_ms", None)
        if bound is None:
            raise ValueError(f"slo sets no bound for {m!r}: e.g. SLO({m}_ms=500)")
        target = float(bound)
        statistic = f"{m} p{q * 100:g} (ms)"
        min_requests = 30 if min_requests is None else min_requests
    runner = runner or run
    parent = _parent(out, "maxrate")
    probes: list[Probe] = []
    counter = {"runs": 0}

    def measure(rate: float, dur: float, attempt: int, kind: str = "search",
                base_url: Any = None) -> tuple[Probe, bool]:
        i = counter["runs"]
        counter["runs"] += 1
        n = max(min_requests, int(math.ceil(rate * dur)))
        name = f"probe-{i}-rate-{rate:.4g}" + (f"-rerun-{attempt}" if attempt else "") + ("-confirm" if kind ==
                                                                                           "confirm" else "")
        kwargs = dict(run_kwargs)
        if base_url is not None:
            kwargs["base_url"] = base_url
        r = runner(workload, Poisson(rate, seed=seed + i), num_requests=n, seed=seed + i,
                   out=False if parent is None else parent / name, slo=slo, label=f"rate {rate:.4g}", **kwargs)
        decision, value, ci, reasons, worth_repeating = _judge(r, mode, m, q, target, slo, max_failure_rate, seed + i)
        p = Probe(rate=rate, value_ms=value if mode == "quantile" else None, passed=decision == "pass",
                  reason="; ".join(reasons), run=r, ci=ci, decision=decision, statistic=statistic, value=value,
                  attempt=attempt, duration_s=dur, kind=kind)
        probes.append(p)
        return p, worth_repeating

    lo: float | None = None
    hi: float | None = None
    rate = float(start_rate)
    lo_duration = duration_s
    while counter["runs"] < max_runs:
        dur, attempt = duration_s, 0
        p, again = measure(rate, dur, attempt)
        while again and attempt < max_repeats and counter["runs"] < max_runs:
            attempt, dur = attempt + 1, dur * 2
            p, again = measure(rate, dur, attempt)
        if p.passed:
            if lo is None or rate > lo:
                lo, lo_duration = rate, dur
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            if hi <= lo or (hi - lo) / lo <= rel_tol:
                break
            rate = (lo + hi) / 2
        elif lo is not None:
            if max_rate is not None and lo >= max_rate:
                break
            rate = rate * 2 if max_rate is None else min(rate * 2, max_rate)
        else:
            if min_rate is not None and rate <= min_rate:
                break  # failed at the lowest rate worth knowing: the answer is "below min_rate"
            rate = rate / 2 if min_rate is None else max(rate / 2, min_rate)
    confirmed = None
    if confirm is not None and lo is not None:
        found, found_s = lo, lo_duration
        remeasure = Remeasure(found, found_s, lambda base_url=None: measure(found, found_s, 0, "confirm", base_url)[0])
        confirm(remeasure)
        if remeasure.probe is None:
            raise RuntimeError("confirm(remeasure) must call remeasure(...) (optionally with base_url=a fresh server)")
        confirmed = remeasure.probe.passed
    return MaxRateResult(rate=lo, metric=m, q=q, target_ms=target if mode == "quantile" else float("nan"),
                         probes=probes, bracket=(lo, hi), mode=mode, attainment=attainment, slo=slo,
                         non_monotonic=_non_monotonic(probes), confirmed=confirmed)


def _non_monotonic(probes: list[Probe]) -> list[tuple[float, float]]:
    """(passing rate, failing rate) pairs where a rate passed at or above one that failed (final decisions)."""
    final = [p for p in probes if _final(probes, p)]
    passes = sorted({p.rate for p in final if p.decision == "pass"})
    fails = sorted({p.rate for p in final if p.decision == "fail"})
    return [(a, b) for a in passes for b in fails if a >= b]
