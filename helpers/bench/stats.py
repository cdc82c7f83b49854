"""From request records to a run's numbers: distributions with confidence intervals, the steady-state
window, throughput, the two goodputs under an SLO, and the comparison of two runs.

Warmup records are never counted. Percentiles are over completed requests and every summary carries
the failures next to them. The steady-state window excludes ramp-up and drain from the latencies (the
requests dispatched in it count) as from the throughputs; whole-run latencies stay in ``whole_run``.
Confidence intervals are bootstrap intervals, seeded, so the same records always give the same numbers.

Two goodputs, named apart:

- ``goodput_at_load`` (vLLM's ``--goodput``): requests per second, at the load this run offered, that met
  every set SLO; one number per run (:func:`goodput`).
- ``max_rate_at_slo`` (DistServe): the highest rate at which at least P% of requests meet TTFT *and* TPOT;
  a search over runs (:func:`helpers.bench.search.find_max_rate` with ``attainment=P``). Each run's share
  is its ``attainment``, with a 95% interval (:attr:`Goodput.attainment_ci`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from .records import RequestResult

__all__ = [
    "bootstrap_ci",
    "Distribution",
    "Latencies",
    "Window",
    "SLO",
    "Goodput",
    "Summary",
    "Comparison",
    "summarize",
    "steady_state_window",
    "goodput",
    "compare",
    "metric_values",
    "bootstrap_quantile",
    "quantile_with_ci",
    "requests_to_show",
    "wilson_interval",
    "window_records",
    "METRICS",
]

#: The latency metrics a summary describes, each in milliseconds. ``itl`` is per token (ours), ``itl_per_chunk``
#: one value per stream chunk after the first (``vllm bench serve``'s ITL).
METRICS = ("ttft", "tpot", "itl", "itl_per_chunk", "e2e", "client_queue")
_PCTS = (50, 90, 95, 99)
_N_BOOT = 2000


# ----------------------------------------------------------------------------------- bootstrap
def bootstrap_quantile(values: Sequence[float] | np.ndarray, q: float, n_boot: int = _N_BOOT,
                       seed: int = 0) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the ``q`` quantile of ``values`` (numpy's linear method).

    Resampling n values with replacement and taking a quantile only ever needs two order statistics
    of the resample. Their indices are drawn directly: the k-th smallest of n uniform indices is
    ``floor(n * U)`` with ``U ~ Beta(k, n - k + 1)`` and the next one is ``U + (1 - U) * Beta(1, n - k)``.
    This is the ordinary bootstrap, exactly, in O(n_boot) time even for 10^5 token latencies.

    Introduced in lab 10 (Load Testing Honestly).
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return np.full(n_boot, np.nan)
    if n == 1:
        return np.full(n_boot, x[0])
    rng = np.random.default_rng(seed)
    h = (n - 1) * q
    lo = int(math.floor(h))
    frac = h - lo
    k = lo + 1  # 1-based rank of the lower order statistic
    u = rng.beta(k, n - k + 1, size=n_boot)
    v = x[np.minimum((u * n).astype(np.int64), n - 1)]
    if frac > 0 and k < n:
        u2 = u + (1.0 - u) * rng.beta(1, n - k, size=n_boot)
        v = v + frac * (x[np.minimum((u2 * n).astype(np.int64), n - 1)] - v)
    return v


def bootstrap_ci(samples: Sequence[Sequence[Any]], statistic: Any, *, n_boot: int = _N_BOOT,
                 seed: int = 0) -> tuple[float, float] | None:
    """95% percentile interval of ``statistic`` under the bootstrap: the project's one resampler.

    ``samples`` are independent samples, each resampled with replacement on its own (two tools' requests; the
    questions of each task, so that a task keeps its size). A sample's units are numbers, or arrays when the values
    within a unit are not independent (a request's tokens, a text's positions: a cluster bootstrap, which keeps
    their correlation). ``statistic`` takes one array per sample, its resampled units concatenated. ``None`` when a
    sample has fewer than two units. For a quantile of many values, :func:`bootstrap_quantile` draws the same
    bootstrap in O(n_boot).

    Introduced in lab 05 (Where the Time Goes).
    """
    units = [list(x) for x in samples]
    if not units or any(len(u) < 2 for u in units):
        return None
    scalar = [np.ndim(u[0]) == 0 for u in units]
    arrays = [np.asarray(u, dtype=float) if sc else [np.asarray(v, dtype=float) for v in u]
              for u, sc in zip(units, scalar)]
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, len(u), size=(n_boot, len(u))) for u in units]
    boot = np.empty(n_boot)
    for i in range(n_boot):
        drawn = [a[p[i]] if sc else np.concatenate([a[j] for j in p[i]]) for a, p, sc in zip(arrays, picks, scalar)]
        boot[i] = statistic(*drawn)
    return _ci(boot)


def _ci(boot: np.ndarray) -> tuple[float, float] | None:
    if boot.size == 0 or np.isnan(boot).all():
        return None
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return (float(lo), float(hi))


def quantile_with_ci(values: Sequence[float], q: float, n_boot: int = _N_BOOT,
                     seed: int = 0) -> tuple[float | None, tuple[float, float] | None]:
    """The ``q`` quantile of ``values`` and its bootstrap 95% interval (``(None, None)`` without values).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size == 0:
        return None, None
    return float(np.percentile(x, q * 100)), _ci(bootstrap_quantile(x, q, n_boot, seed))


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """The Wilson score 95% interval of a proportion ``successes / n`` (``None`` when ``n == 0``).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 or ``n`` successes.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)  # exact at the ends, where rounding would miss them
    return (lo, hi)


def requests_to_show(attainment: float, z: float = 1.959964) -> int:
    """The fewest requests that can show ``attainment`` at all: with every one of ``n`` meeting the SLO, Wilson's
    lower bound is ``n / (n + z²)``, so ``n >= z² · a / (1 - a)`` (90%: 35 requests; 8 requests, all meeting it, show
    only 68%). A probe needs this many *in its steady-state window*, so dispatch more.

    Introduced in lab 17 (Cost per Million Tokens).
    """
    if not 0 < attainment < 1:
        raise ValueError(f"attainment is a share between 0 and 1 (e.g. 0.9), got {attainment}")
    return int(math.ceil(z * z * attainment / (1 - attainment) - 1e-9))


def pooled_itl_median(records: Iterable[RequestResult], n_boot: int = _N_BOOT,
                      seed: int = 0) -> tuple[float, tuple[float, float] | None]:
    """The median ITL (ms) pooled over the tokens of ``records``, with a 95% CI from resampling whole requests.

    A request's tokens share its moment on the machine (a slow spell slows all of them), so they are
    not independent samples: resampling tokens would give a CI far too narrow. Resampling requests
    (a cluster bootstrap) keeps that correlation. The CI is ``None`` with fewer than two requests.

    Introduced in lab 05 (Where the Time Goes).
    """
    per_request = [np.asarray(r.itl_ms, dtype=float) for r in _measured(records) if r.itl_ms]
    if not per_request:
        raise ValueError("no inter-token latencies in these records: they need at least two output tokens each")
    median = float(np.median(np.concatenate(per_request)))
    return median, bootstrap_ci([per_request], np.median, n_boot=n_boot, seed=seed)


@dataclass
class Distribution:
    """Mean, spread and percentiles of one metric, with bootstrap 95% CIs for p50 and p99.

    Introduced in lab 10 (Load Testing Honestly).
    """

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p50_ci: tuple[float, float] | None = None
    p99_ci: tuple[float, float] | None = None

    @classmethod
    def of(cls, values: Iterable[float], seed: int = 0, n_boot: int = _N_BOOT) -> "Distribution":
        x = np.asarray([v for v in values if v is not None], dtype=float)
        if x.size == 0:
            return cls()
        p = np.percentile(x, _PCTS)
        return cls(
            count=int(x.size), mean=float(x.mean()), std=float(x.std(ddof=1)) if x.size > 1 else 0.0,
            min=float(x.min()), max=float(x.max()),
            p50=float(p[0]), p90=float(p[1]), p95=float(p[2]), p99=float(p[3]),
            p50_ci=_ci(bootstrap_quantile(x, 0.50, n_boot, seed)),
            p99_ci=_ci(bootstrap_quantile(x, 0.99, n_boot, seed + 1)),
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("p50_ci", "p99_ci"):
            d[key] = list(d[key]) if d[key] is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Distribution":
        d = dict(d)
        for key in ("p50_ci", "p99_ci"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


# -------------------------------------------------------------------------------------- values
def _measured(records: Iterable[RequestResult]) -> list[RequestResult]:
    return [r for r in records if not r.warmup]


def metric_values(records: Iterable[RequestResult], metric: str, window: "Window | None" = None) -> list[float]:
    """The values (ms) of ``metric`` over the completed, non-warmup requests (those of ``window``, if given).

    ``metric`` is ``ttft``, ``tpot``, ``itl``, ``itl_per_chunk``, ``e2e`` or ``client_queue`` (a ``_ms``
    suffix is accepted). ITL is pooled: one value per output token after the first (``itl_per_chunk``: per
    chunk after the first), across all requests. Client queue time covers failed requests too (they waited
    as well). With ``window`` only the requests :func:`window_records` selects count.

    Introduced in lab 10 (Load Testing Honestly).
    """
    m = metric.removesuffix("_ms")
    if m not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    rs = window_records(records, window) if window is not None else _measured(records)
    if m == "itl":
        return [v for r in rs if r.ok for v in r.itl_ms]
    if m == "itl_per_chunk":
        return [v for r in rs if r.ok for v in r.itl_per_chunk_ms]
    if m == "client_queue":
        return [r.client_queue_ms for r in rs if r.client_queue_ms is not None]
    return [v for r in rs if r.ok and (v := getattr(r, f"{m}_ms")) is not None]


# -------------------------------------------------------------------------------------- window
@dataclass
class Window:
    """The steady-state span of a run, in ``perf_counter`` seconds: throughput is divided by it, and the
    latencies are those of the requests dispatched in it.

    ``method`` is ``"steady-state"`` or ``"whole-span"`` (the fallback, explained in ``note``).
    ``start_offset_s`` and ``end_offset_s`` (in :meth:`as_dict`) are relative to the first dispatch.

    Introduced in lab 10 (Load Testing Honestly).
    """

    start: float
    end: float
    method: str
    note: str = ""
    origin: float = 0.0  # first dispatch

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 0.0)

    def contains(self, t: float | None) -> bool:
        return t is not None and self.start <= t <= self.end

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "start_offset_s": self.start - self.origin,
                "end_offset_s": self.end - self.origin, "duration_s": self.duration_s, "note": self.note}


#: A steady-state window must hold at least this many completions, and this share of them.
MIN_WINDOW_COMPLETIONS = 10
MIN_WINDOW_SHARE = 0.2


def steady_state_window(records: Iterable[RequestResult]) -> Window | None:
    """The steady-state window of a run: ``[first dispatch + median E2E, last dispatch]``.

    Let ``d0``/``d1`` be the first and last dispatch of the measured requests (completed or failed) and
    ``m`` the median E2E of the completed ones. Before ``d0 + m`` the server is still filling up (the
    first requests have not yet been replaced by later ones); after ``d1`` nothing new arrives and the
    server drains. Inside the window a request counts when it *ends* in it (request throughput,
    goodput), a token counts when its chunk *arrives* in it (output throughput) and a prompt counts
    when its first token arrives in it (input throughput): rates, not totals divided by a longer span.
    Latency percentiles are over the requests *dispatched* in it (they met the steady load; see
    :func:`window_records`).

    When that window holds fewer than ``MIN_WINDOW_COMPLETIONS`` completions (or dispatches) or fewer than
    ``MIN_WINDOW_SHARE`` of them (short runs, closed-loop runs of about ``concurrency`` requests, or a
    saturated server whose E2E outgrows the run), or is shorter than one median E2E (then its
    completions are one wave bunched at its start, and counting them per second of it would inflate the
    rate: a closed loop of 2 x concurrency requests does exactly this), the whole span ``[d0, last end]``
    is used and ``note`` says why. ``None`` when nothing was dispatched.

    Introduced in lab 10 (Load Testing Honestly).
    """
    rs = [r for r in _measured(records) if r.timings.t_dispatched is not None]
    if not rs:
        return None
    d0 = min(r.timings.t_dispatched for r in rs)
    d1 = max(r.timings.t_dispatched for r in rs)
    ends = [r.timings.t_end for r in rs if r.timings.t_end is not None]
    last_end = max(ends) if ends else d1
    done = [r for r in rs if r.ok and r.e2e_ms is not None]
    whole = Window(start=d0, end=max(last_end, d0), method="whole-span", origin=d0)
    if not done:
        whole.note = "no request completed: the whole span is used"
        return whole
    m = float(np.median([r.e2e_ms for r in done])) / 1000.0
    w = Window(start=d0 + m, end=d1, method="steady-state", origin=d0,
               note=f"first dispatch + median E2E ({m * 1000:.0f} ms) to last dispatch")
    inside = sum(1 for r in done if w.contains(r.timings.t_end))
    started = sum(1 for r in rs if w.contains(r.timings.t_dispatched))
    need = max(MIN_WINDOW_COMPLETIONS, math.ceil(MIN_WINDOW_SHARE * len(done)))
    if w.duration_s <= 0 or inside < need:
        whole.note = (f"steady-state window [first dispatch + median E2E, last dispatch] holds {inside} of "
                      f"{len(done)} completions (< {need}): too short, so the whole span "
                      "(first dispatch to last end, ramp-up and drain included) is used")
        return whole
    if started < need:
        whole.note = (f"steady-state window [first dispatch + median E2E, last dispatch] holds {started} of "
                      f"{len(rs)} dispatches (< {need}): too short, so the whole span "
                      "(first dispatch to last end, ramp-up and drain included) is used")
        return whole
    if w.duration_s < m:
        whole.note = (f"steady-state window [first dispatch + median E2E, last dispatch] lasts {w.duration_s:.2f} s, "
                      f"less than one median E2E ({m:.2f} s): its completions are one bunched wave, so the whole span "
                      "(first dispatch to last end, ramp-up and drain included) is used")
        return whole
    return w


def window_records(records: Iterable[RequestResult], window: Window | None) -> list[RequestResult]:
    """The measured requests whose latencies count: those *dispatched* in a steady-state ``window``; all of
    them when the window fell back to the whole span (or is ``None``).

    Introduced in lab 10 (Load Testing Honestly).
    """
    rs = _measured(records)
    if window is None or window.method != "steady-state":
        return rs
    return [r for r in rs if window.contains(r.timings.t_dispatched)]


# --------------------------------------------------------------------------------- SLO, goodput
@dataclass(frozen=True)
class SLO:
    """Service-level objectives per request, in milliseconds; ``None`` means not constrained.

    A request meets the SLO when it completed and every set bound holds. A request with fewer than
    two output tokens has no TPOT and meets any TPOT bound.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            bound = getattr(self, name)
            if bound is not None and not bound > 0:
                raise ValueError(f"an SLO bound is a time above 0 ms: {name}={bound} (leave it unset for no bound)")

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            bound = getattr(self, name)
            if bound is None:
                continue
            value = getattr(r, name)
            if value is None:
                if name == "tpot_ms":
                    continue
                return False
            if value > bound:
                return False
        return True

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)

    def __str__(self) -> str:
        parts = [f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in asdict(self).items() if v is not None]
        return " and ".join(parts) if parts else "no SLO"


@dataclass
class Goodput:
    """Goodput at this run's load: requests that met the SLO per second of the steady-state window
    (``goodput_rps``, vLLM's ``--goodput``), their share of all requests (``fraction_good``), and the SLO
    attainment of the requests dispatched in the window with its Wilson 95% interval (``attainment``,
    ``attainment_ci``: the share DistServe's ``max_rate_at_slo`` holds at or above P%; failures count as
    missing the SLO).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    slo: SLO
    good: int
    good_in_window: int
    completed: int
    failed: int
    window_s: float
    goodput_rps: float | None
    fraction_good: float | None
    attainment: float | None = None
    attainment_ci: tuple[float, float] | None = None
    attainment_n: int = 0

    @property
    def goodput_at_load(self) -> float | None:
        """Requests/s meeting the SLO at this load (the same number as ``goodput_rps``)."""
        return self.goodput_rps

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo"] = self.slo.as_dict()
        d["attainment_ci"] = list(self.attainment_ci) if self.attainment_ci else None
        d["goodput_at_load"] = self.goodput_rps
        return d


def _records_of(records_or_run: Any) -> list[RequestResult]:
    return list(records_or_run.records) if hasattr(records_or_run, "records") else list(records_or_run)


def goodput(records_or_run: Any, slo: SLO) -> Goodput:
    """Goodput at this load under ``slo``: requests meeting every set bound that end in the window, per second;
    and the SLO attainment of the requests dispatched in the window, with its interval.

    Accepts a run or a list of records (``helpers.bench.goodput`` also takes a run's folder).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    rs = _measured(_records_of(records_or_run))
    win = steady_state_window(rs)
    good = [r for r in rs if slo.met(r)]
    in_win = [r for r in good if win is not None and win.contains(r.timings.t_end)]
    completed = sum(1 for r in rs if r.ok)
    failed = len(rs) - completed
    dur = win.duration_s if win else 0.0
    judged = window_records(rs, win)
    met = sum(1 for r in judged if slo.met(r))
    return Goodput(slo=slo, good=len(good), good_in_window=len(in_win), completed=completed, failed=failed,
                   window_s=dur, goodput_rps=(len(in_win) / dur) if dur > 0 else None,
                   fraction_good=(len(good) / len(rs)) if rs else None,
                   attainment=met / len(judged) if judged else None, attainment_ci=wilson_interval(met, len(judged)),
                   attainment_n=len(judged))


def tracking(records_or_run: Any) -> float | None:
    """How much of the offered load a run's server kept up with: 1 while it does, below 1 past its capacity.

    In a steady-state window a request that arrives at ``t`` ends about one median E2E ``m`` later, so the
    requests ending in ``[start, end]`` are compared with those *arriving* in ``[start - m, end - m]``: the same
    requests when the server keeps up, whatever the random arrivals did, and fewer when a queue grows. (Dividing the
    window's throughput by the whole run's arrival rate mixes two spans: a 20-request Poisson run at 1 req/s once
    read 0.70 for a server that kept up.) When the window fell back to the whole span (a saturated run whose E2E
    outgrows it), it is requests completed per second of the whole span over the realized arrival rate.
    ``None`` when nothing was dispatched or completed.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    rs = [r for r in _measured(_records_of(records_or_run)) if r.timings.t_dispatched is not None]
    done = [r for r in rs if r.ok and r.e2e_ms is not None]
    win = steady_state_window(rs)
    if win is None or not done:
        return None
    if win.method == "steady-state":
        m = float(np.median([r.e2e_ms for r in done])) / 1000.0
        came_back = sum(1 for r in done if win.contains(r.timings.t_end))
        offered = sum(1 for r in rs if win.start - m <= r.timings.t_dispatched <= win.end - m)
        return came_back / offered if offered else None
    disp = sorted(r.timings.t_dispatched for r in rs)
    if len(disp) < 2 or disp[-1] <= disp[0] or win.duration_s <= 0:
        return None
    return (len(done) / win.duration_s) / ((len(disp) - 1) / (disp[-1] - disp[0]))


# ------------------------------------------------------------------------------------- summary
@dataclass
class Latencies:
    """The latency distributions of a set of requests, one per metric of :data:`METRICS` (ms).

    Introduced in lab 10 (Load Testing Honestly).
    """

    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    itl_per_chunk_ms: Distribution
    e2e_ms: Distribution
    client_queue_ms: Distribution

    @staticmethod
    def of(records: Iterable[RequestResult], seed: int = 0) -> "Latencies":
        """The distributions of ``records``, as a :class:`Latencies` (also when called on :class:`Summary`)."""
        rs = list(records)
        return Latencies(**{f"{m}_ms": Distribution.of(metric_values(rs, m), seed) for m in METRICS})

    def as_dict(self) -> dict[str, Any]:
        return {f"{m}_ms": getattr(self, f"{m}_ms").as_dict() for m in METRICS}


@dataclass
class Summary(Latencies):
    """A run in numbers. Warmup excluded; percentiles over completed requests, failures beside them.

    ``duration_s`` is the steady-state window that the throughputs are divided by (see
    :func:`steady_state_window`); ``total_duration_s`` runs from the first dispatch to the last end.
    ``total_output_throughput`` is output tokens over the whole span: the number a naive tool prints.
    The latency distributions (``ttft_ms`` ...) are over the requests dispatched in that window
    (``latency_scope`` says which and how many; all requests when the window fell back to the whole span);
    ``whole_run`` holds the same distributions over every request, ramp-up and drain included (a summary is the
    steady window's :class:`Latencies`, with the counts, throughputs and checks beside them).
    ``itl_ms`` is per token; ``itl_per_chunk_ms`` per stream chunk (``vllm bench serve``'s ITL).
    ``goodput_at_load`` is vLLM's goodput (``goodput`` is the same object, by its older name).
    ``valid`` is False when the load generator itself was the bottleneck (``invalid_reason`` says how);
    ``server_death`` says when the server stopped answering, if it did.

    Introduced in lab 02 (Prefill and Decode).
    """

    completed: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    total_duration_s: float
    window: Window | None
    request_throughput: float | None
    output_throughput: float | None
    input_throughput: float | None
    total_output_throughput: float | None
    achieved_rate: float | None
    input_tokens: dict[str, Any]
    output_tokens: dict[str, Any]
    goodput_at_load: Goodput | None = None
    warnings: list[str] = field(default_factory=list)
    latency_scope: str = ""
    whole_run: Latencies | None = None
    valid: bool = True
    invalid_reason: str | None = None
    server_death: dict[str, Any] | None = None
    server: Any = None                    # helpers.metrics.ServerView: what /metrics said
    client: dict[str, Any] | None = None  # the load generator's own health (CPU, event-loop lag, schedule slip)
    reconciliation: dict[str, Any] | None = None  # the client's means next to the server's

    @property
    def goodput(self) -> Goodput | None:
        """The goodput at this run's load (alias of ``goodput_at_load``)."""
        return self.goodput_at_load

    @property
    def failure_rate(self) -> float:
        n = self.completed + self.failed
        return self.failed / n if n else 0.0

    def mark_invalid(self, reason: str) -> None:
        """Declare the run invalid (the client was the bottleneck, say): ``valid`` False, the reason kept."""
        self.valid = False
        self.invalid_reason = reason if self.invalid_reason is None else f"{self.invalid_reason}; {reason}"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "valid": self.valid, "invalid_reason": self.invalid_reason,
            "completed": self.completed, "failed": self.failed, "failure_rate": self.failure_rate,
            "errors": self.errors,
            "duration_s": self.duration_s, "total_duration_s": self.total_duration_s,
            "window": self.window.as_dict() if self.window else None,
            "request_throughput": self.request_throughput, "output_throughput": self.output_throughput,
            "input_throughput": self.input_throughput, "total_output_throughput": self.total_output_throughput,
            "achieved_rate": self.achieved_rate, "latency_scope": self.latency_scope,
        }
        d.update(Latencies.as_dict(self))
        d["whole_run"] = self.whole_run.as_dict() if self.whole_run else None
        d["input_tokens"], d["output_tokens"] = self.input_tokens, self.output_tokens
        d["goodput_at_load"] = self.goodput_at_load.as_dict() if self.goodput_at_load else None
        d["goodput"] = d["goodput_at_load"]  # the older name, kept for saved-run readers
        d["warnings"] = list(self.warnings)
        d["server_death"] = self.server_death
        d["server"] = self.server.as_dict() if hasattr(self.server, "as_dict") else self.server
        d["client"] = self.client
        d["reconciliation"] = self.reconciliation
        return d

    def table(self) -> str:
        """A plain-text report: validity, counts, window, throughput, then one line per latency metric."""
        n = self.completed + self.failed
        lines = [] if self.valid else [f"INVALID RUN: {self.invalid_reason}"]
        lines.append(f"requests: {self.completed} completed, {self.failed} failed ({self.failure_rate:.1%}) of {n}")
        for msg, count in sorted(self.errors.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {count} x {msg}")
        if self.window is not None:
            lines.append(f"window: {self.duration_s:.2f} s {self.window.method} ({self.window.note}); "
                         f"whole run {self.total_duration_s:.2f} s")
        lines.append(f"throughput: {_f(self.request_throughput, '.2f')} req/s, "
                     f"{_f(self.output_throughput, '.1f')} output tok/s, {_f(self.input_throughput, '.1f')} input "
                     f"tok/s (whole span: {_f(self.total_output_throughput, '.1f')} output tok/s)")
        if self.goodput_at_load is not None:
            g = self.goodput_at_load
            att = (f"; attainment {g.attainment:.1%} [{g.attainment_ci[0]:.1%}, {g.attainment_ci[1]:.1%}] of "
                   f"{g.attainment_n} in the window" if g.attainment is not None and g.attainment_ci else "")
            lines.append(f"goodput at this load ({g.slo}): {_f(g.goodput_rps, '.2f')} req/s; {g.good} of "
                         f"{g.completed + g.failed} requests met it ({_f(g.fraction_good, '.1%')}){att}")
        if self.latency_scope:
            lines.append(f"latencies: {self.latency_scope}")
        lines.append(f"{'ms':<14}{'mean':>9}{'p50':>9}{'p90':>9}{'p95':>9}{'p99':>9}   {'p99 95% CI':<19}{'n':>7}")
        for m in METRICS:
            dist: Distribution = getattr(self, f"{m}_ms")
            ci = f"[{dist.p99_ci[0]:.1f}, {dist.p99_ci[1]:.1f}]" if dist.p99_ci else "-"
            lines.append(f"{m:<14}{_f(dist.mean)}{_f(dist.p50)}{_f(dist.p90)}{_f(dist.p95)}{_f(dist.p99)}   "
                         f"{ci:<19}{dist.count:>7}")
        if self.failed:
            lines.append(f"percentiles are over the completed requests; the {self.failed} failed ones are not in "
                         "them (see goodput).")
        if self.client:
            c = self.client
            lag, slip = _f(c.get("loop_lag_p99_ms"), ".1f"), _f(c.get("slip_p99_ms"), ".1f")
            cpu = _f((c.get("cpu_utilization") or 0) * 100, ".0f")
            lines.append(f"client: {c.get('workers', 1)} sending loop(s); event-loop lag p99 {lag} ms, schedule slip "
                         f"p99 {slip} ms, CPU {cpu}% of a core (the busiest loop)")
        for w in self.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _f(v: float | None, spec: str = "9.1f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        width = int(spec.split(".")[0]) if spec[0].isdigit() else 0
        return "-".rjust(width)
    return format(v, spec)


def _token_report(rs: list[RequestResult], kind: str) -> tuple[dict[str, Any], str | None]:
    done = [r for r in rs if r.ok]
    if kind == "input":
        pairs = [(r.id, r.expected_input_tokens, r.input_tokens) for r in done]
    else:
        pairs = [(r.id, r.expected_output_tokens, r.output_tokens) for r in done]
    actual = [a for _, _, a in pairs if a is not None]
    expected = [e for _, e, _ in pairs if e is not None]
    both = [(i, e, a) for i, e, a in pairs if e is not None and a is not None]
    mismatched = [(i, e, a) for i, e, a in both if e != a]
    report = {
        "total": int(sum(actual)), "mean": float(np.mean(actual)) if actual else None,
        "expected_mean": float(np.mean(expected)) if expected else None,
        "checked": len(both), "mismatched": len(mismatched),
    }
    warning = None
    if mismatched:
        i, e, a = mismatched[0]
        common = Counter((e, a) for _, e, a in mismatched).most_common(1)[0]
        warning = (f"{kind} tokens: the server's count differs from the expected one for {len(mismatched)} of "
                   f"{len(both)} completed requests (e.g. request {i}: expected {e}, server counted {a}; most "
                   f"common: expected {common[0][0]}, server {common[0][1]}, {common[1]} times)")
    return report, warning


def summarize(records: Iterable[RequestResult], slo: SLO | None = None, seed: int = 0) -> Summary:
    """Summarize request records (warmup ones are ignored): see :class:`Summary` for each number.

    Introduced in lab 02 (Prefill and Decode).
    """
    rs = _measured(records)
    done = [r for r in rs if r.ok]
    failed = [r for r in rs if not r.ok]
    errors = Counter(_error_key(r) for r in failed)
    win = steady_state_window(rs)
    warnings: list[str] = []
    dur = win.duration_s if win else 0.0
    if win is not None and win.method == "whole-span" and rs:
        warnings.append(f"throughput window: {win.note}")
    total = (win.end - win.origin) if win else 0.0
    if win is not None:
        last_end = max((r.timings.t_end for r in rs if r.timings.t_end is not None), default=win.origin)
        total = max(last_end - win.origin, 0.0)
    req_in = sum(1 for r in done if win is not None and win.contains(r.timings.t_end))
    tok_in = sum(k for r in done for t, k in zip(r.timings.chunk_times, r.timings.chunk_tokens)
                 if win is not None and win.contains(t))
    inp_in = sum(r.input_tokens or 0 for r in done if win is not None and win.contains(r.timings.t_first_token))
    out_total = sum(r.streamed_tokens for r in done)
    disp = sorted(r.timings.t_dispatched for r in rs if r.timings.t_dispatched is not None)
    achieved = (len(disp) - 1) / (disp[-1] - disp[0]) if len(disp) > 1 and disp[-1] > disp[0] else None
    in_rep, in_warn = _token_report(rs, "input")
    out_rep, out_warn = _token_report(rs, "output")
    warnings += [w for w in (in_warn, out_warn) if w]
    estimated = [r for r in done if not r.tokens_exact]
    if estimated:
        warnings.append(f"{len(estimated)} completed requests came without per-chunk usage "
                        "(continuous_usage_stats): each non-empty chunk was counted as one token, so ITL and "
                        "token timestamps are estimates (TPOT still uses the server's final count)")
    streamed_off = [r for r in done if r.tokens_exact and r.output_tokens is not None
                    and r.output_tokens != r.streamed_tokens]
    if streamed_off:
        r = streamed_off[0]
        warnings.append(f"{len(streamed_off)} requests streamed a different number of tokens than their final usage "
                        f"(e.g. {r.id}: {r.streamed_tokens} streamed, usage {r.output_tokens})")
    timed = window_records(rs, win)
    if win is not None and win.method == "steady-state":
        scope = (f"the {len(timed)} of {len(rs)} requests dispatched in the steady-state window "
                 f"[{win.start - win.origin:.2f}, {win.end - win.origin:.2f}] s (ramp-up and drain excluded; "
                 "whole_run has them all)")
    else:
        scope = f"all {len(rs)} requests (the window fell back to the whole span, ramp-up and drain included)"
    steady = Latencies.of(timed, seed)
    s = Summary(
        completed=len(done), failed=len(failed), errors=dict(errors),
        duration_s=dur, total_duration_s=total, window=win,
        request_throughput=req_in / dur if dur > 0 else None,
        output_throughput=tok_in / dur if dur > 0 else None,
        input_throughput=inp_in / dur if dur > 0 else None,
        total_output_throughput=out_total / total if total > 0 else None,
        achieved_rate=achieved, **vars(steady),
        input_tokens=in_rep, output_tokens=out_rep,
        goodput_at_load=goodput(rs, slo) if slo is not None and slo.is_set() else None,
        warnings=warnings, latency_scope=scope,
        whole_run=Latencies.of(rs, seed) if len(timed) != len(rs) else steady,
    )
    return s


def _latency_values(records: list[RequestResult], metric: str, whole_run: bool) -> list[float]:
    return metric_values(records, metric, None if whole_run else steady_state_window(records))


def _error_key(r: RequestResult) -> str:
    msg = (r.error or "unknown error").strip().splitlines()[0][:200]
    return f"HTTP {r.http_status}: {msg}" if r.http_status and r.http_status != 200 else msg


# ------------------------------------------------------------------------------------- compare
@dataclass
class Comparison:
    """The difference ``b - a`` of a quantile of one metric between two runs, with a bootstrap 95% CI.

    ``differ`` is True when the interval excludes zero.

    Introduced in lab 10 (Load Testing Honestly).
    """

    metric: str
    q: float
    a: float
    b: float
    diff: float
    ci: tuple[float, float]
    differ: bool
    n_a: int
    n_b: int

    @property
    def relative(self) -> float | None:
        return self.diff / self.a if self.a else None

    def __str__(self) -> str:
        verdict = "they differ" if self.differ else "no clear difference"
        rel = f" ({self.relative:+.1%})" if self.relative is not None else ""
        return (f"{self.metric} p{self.q * 100:g}: {self.a:.1f} -> {self.b:.1f} ms, difference {self.diff:+.1f} ms"
                f"{rel}, 95% CI [{self.ci[0]:+.1f}, {self.ci[1]:+.1f}]: {verdict}")


def compare(run_a: Any, run_b: Any, metric: str = "ttft", q: float = 0.99, n_boot: int = 10000,
            seed: int = 0, whole_run: bool = False) -> Comparison:
    """Do two runs really differ in the ``q`` quantile of ``metric``? Bootstrap both, difference ``b - a``.

    ``run_a``/``run_b`` are runs or record lists (``helpers.bench.compare`` also takes run folders). The runs
    are resampled independently. Each run's values are those its summary shows: the requests dispatched in its
    steady-state window (``whole_run=True``: every request).

    Introduced in lab 10 (Load Testing Honestly).
    """
    xa, xb = (_latency_values(_records_of(r), metric, whole_run) for r in (run_a, run_b))
    if not xa or not xb:
        raise ValueError(f"cannot compare {metric}: run a has {len(xa)} values, run b has {len(xb)}; "
                         "each needs completed requests")
    a, b = float(np.percentile(xa, q * 100)), float(np.percentile(xb, q * 100))
    boot = bootstrap_quantile(xb, q, n_boot, seed + 1) - bootstrap_quantile(xa, q, n_boot, seed)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Comparison(metric=metric.removesuffix("_ms"), q=q, a=a, b=b, diff=b - a, ci=(float(lo), float(hi)),
                      differ=bool(lo > 0 or hi < 0), n_a=len(xa), n_b=len(xb))
