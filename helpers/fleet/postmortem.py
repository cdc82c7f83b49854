"""An overloaded run, reconstructed: what the queue should have done, what the alerts did, what users saw.

::

    model = fleet.postmortem.fluid_queue(arrivals, capacity_rps=cap, replicas=1)   # predicted queue over time
    fired = fleet.postmortem.alert_timeline(prom, t_start, t_end)                # when each alert went firing
    users = fleet.postmortem.slo_windows(run.records, target_ms=2000, width_s=5)   # p99 TTFT by send time
    md = fleet.postmortem.write(timeline, ...)                                    # postmortem.md

The queue model is the fluid approximation of a single queue: the backlog grows at (arrival rate − capacity) while
that is positive and drains at (capacity − arrival rate) after; a request waits about backlog / capacity. It is
deliberately simple — one number measured (the capacity), one assumption (service at that rate whenever there is
a backlog) — so where the recorded queue departs from it is worth explaining.

Introduced in lab 23 (Observability and the Postmortem).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["fluid_queue", "alert_timeline", "slo_windows", "first_breach", "Timeline", "write"]


def fluid_queue(arrivals: Any, capacity_rps: float, replicas: int = 1, step_s: float = 0.5,
                horizon_s: float | None = None, seeded: bool = False) -> "Any":
    """The fluid model's backlog (requests waiting) and wait (s) over time for ``arrivals`` (anything with
    ``rate_at(t)`` and ``duration_s``, e.g. :class:`helpers.bench.Steps`) served at ``replicas × capacity_rps``.

    The backlog grows by what arrives in each ``step_s`` less what the replicas serve in it, and never goes below
    zero. What arrives is the mean rate × ``step_s``, or, with ``seeded``, the requests the seeded process will
    actually send then (``arrivals.send_times(arrivals.duration_s)``, the schedule ``bench.run(...,
    duration_s=arrivals.duration_s)`` uses): a Poisson phase of N requests varies by about √N, which against an
    overload just above capacity is a large part of the backlog.

    Returns a DataFrame: ``t_s``, ``rate`` (the mean rate), ``arrived`` (requests counted in the step), ``backlog``,
    ``wait_s``.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import bisect

    import pandas as pd

    if not capacity_rps > 0 or replicas < 1:
        raise ValueError("capacity_rps must be > 0 and replicas >= 1")
    sends = None
    if seeded:
        sends = arrivals.send_times(arrivals.duration_s) if getattr(arrivals, "open_loop", False) else None
        if not sends:
            raise ValueError(f"seeded=True needs an open-loop process that sends requests, got {arrivals!r}")
        sends = sorted(sends)
    mu = capacity_rps * replicas
    end = horizon_s if horizon_s is not None else arrivals.duration_s
    rows, backlog, t = [], 0.0, 0.0
    while t <= end + 1e-9:
        lam = arrivals.rate_at(t) if t < arrivals.duration_s else 0.0
        arrived = lam * step_s if sends is None else \
            float(bisect.bisect_left(sends, t + step_s) - bisect.bisect_left(sends, t))
        rows.append({"t_s": t, "rate": lam, "arrived": arrived, "backlog": backlog, "wait_s": backlog / mu})
        backlog = max(0.0, backlog + arrived - mu * step_s)
        t += step_s
    return pd.DataFrame(rows)


def alert_timeline(prom: Any, start: float, end: float, step: float = 1.0) -> dict[str, dict[str, float | None]]:
    """For every alert Prometheus evaluated between ``start`` and ``end`` (wall-clock seconds): when it first went
    pending and firing (seconds after ``start``; ``None`` if it never did), from the ``ALERTS`` series. A state the
    alert was already in when the window opened is not a transition of this run: it is marked ``<state>_at_start``
    and its time left ``None``.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    frame = prom.query_range_frame("ALERTS", start, end, step)
    out: dict[str, dict[str, float | None]] = {}
    if frame.empty:
        return out
    frame = frame[frame["value"] > 0]
    for (name, state), rows in frame.groupby(["alertname", "alertstate"]):
        first = rows["time"].min().timestamp() - start
        entry = out.setdefault(name, {"pending_s": None, "firing_s": None})
        if first < step:  # already in this state when the window opened: it did not go there during the run
            entry[f"{state}_at_start"] = True
            continue
        entry[f"{state}_s"] = first
    return out


def slo_windows(records: Sequence[Any], target_ms: float, width_s: float = 5.0) -> "Any":
    """Requests grouped by when they were sent (``width_s`` windows from the run's start): count, p99 TTFT, and
    the share that met ``target_ms`` (failures count as misses).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import numpy as np
    import pandas as pd

    rows = []
    t0 = min(r.timings.t_scheduled for r in records) if records else 0.0
    for r in records:
        ttft = r.ttft_ms if r.ok else None
        rows.append({"sent_s": r.timings.t_scheduled - t0, "ttft_ms": ttft,
                     "met": ttft is not None and ttft <= target_ms})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["window_s", "requests", "ttft_p99_ms", "attainment"])
    frame["window_s"] = (frame["sent_s"] // width_s) * width_s
    return (frame.groupby("window_s")
            .agg(requests=("met", "size"), ttft_p99_ms=("ttft_ms", lambda s: float(np.nanpercentile(s.dropna(), 99))
                                                         if s.notna().any() else math.nan),
                 attainment=("met", "mean")).reset_index())


def first_breach(records: Sequence[Any], target_ms: float) -> float | None:
    """Send time (s after the run's first request) of the first request that missed ``target_ms`` or failed.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    if not records:
        return None
    t0 = min(r.timings.t_scheduled for r in records)
    late = [r.timings.t_scheduled - t0 for r in records if not r.ok or (r.ttft_ms or 0.0) > target_ms]
    return min(late) if late else None


@dataclass
class Timeline:
    """The overloaded run's key instants, in seconds after its first request, and what the fix changed.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    overload_start_s: float
    overload_end_s: float
    capacity_rps: float
    offered_peak_rps: float
    first_breach_s: float | None
    alerts: dict[str, dict[str, float | None]] = field(default_factory=dict)
    queue_peak: float | None = None
    queue_peak_predicted: float | None = None
    recovered_s: float | None = None
    before_fix: dict[str, Any] = field(default_factory=dict)
    after_fix: dict[str, Any] = field(default_factory=dict)
    #: the recorded queue, (seconds, requests waiting), so the report can say what the backlog held at any instant
    queue: list[tuple[float, float]] = field(default_factory=list)

    def waiting_at(self, t_s: float | None) -> float | None:
        """Requests waiting at ``t_s`` (the last sample at or before it), from the recorded queue."""
        if t_s is None or not self.queue:
            return None
        before = [v for s, v in self.queue if s <= t_s]
        return before[-1] if before else None

    def fired(self, alert: str) -> float | None:
        return (self.alerts.get(alert) or {}).get("firing_s")

    def detection_delay_s(self, alert: str) -> float | None:
        """From the first request that missed the SLO to ``alert`` firing (negative: it fired before users felt it)."""
        f = self.fired(alert)
        return None if f is None or self.first_breach_s is None else f - self.first_breach_s


def _s(v: float | None, unit: str = "s") -> str:
    return "never" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f} {unit}"


def write(t: Timeline, *, slo_ms: float, queue_alert: str, burn_alerts: Sequence[str], fix: str,
          commands: Sequence[str] = ()) -> str:
    """The postmortem as Markdown, every figure taken from ``t`` (measured in this run).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    burn = [(a, t.fired(a)) for a in burn_alerts]
    first_burn = min((f for _, f in burn if f is not None), default=None)
    q_fired, breach = t.fired(queue_alert), t.first_breach_s
    fired = sorted([(f, a) for a, f in [(queue_alert, q_fired), *burn] if f is not None])
    # every sentence below is chosen by what was measured: which alert fired first, on which side of the first
    # late request, and what the backlog held then — a run that disagrees with the lesson is reported as it was
    if q_fired is None:
        queue_line = f"- {queue_alert} never fired: its threshold or its `for:` was not reached in this run."
    elif breach is None:
        queue_line = f"- {queue_alert} fired at t = {_s(q_fired)}; no request missed the target."
    else:
        lead = q_fired - breach
        queue_line = (f"- {queue_alert} fired {-lead:.1f} s *before* the first request missed the target: here the queue "
                      "was the leading signal." if lead < 0 else
                      f"- {queue_alert} fired {lead:.1f} s *after* the first request missed the target: in this run it "
                      "did not lead (its threshold or its `for:` was too slow for this overload).")
    if first_burn is None:
        burn_line = "- No burn-rate alert fired: the incident was shorter than their windows."
    elif breach is None:
        burn_line = f"- The first burn-rate alert fired at t = {_s(first_burn)}, with no request over the target."
    else:
        burn_line = (f"- The first burn-rate alert fired {first_burn - breach:.1f} s after the first late request: burn "
                     "rates confirm damage already done; they page, they do not predict." if first_burn >= breach else
                     f"- The first burn-rate alert fired {breach - first_burn:.1f} s *before* the first late request "
                     "(by send time): unusual, and worth reading the rule's windows against this run's records.")
    held = t.waiting_at(first_burn)
    if not fired:
        page = "No alert fired in this run: none could have paged; the thresholds need another look."
    else:
        first_at, first = fired[0]
        page = f"{first} fired first (t = {_s(first_at)})."
        if first == queue_alert:
            page += (" The queue alert should page and trigger scale-out (lab 22's autoscaler, KEDA's ScaledObject "
                     "on the same metric)")
            page += (f": when the first burn-rate alert fired, {held:.0f} requests were already waiting, "
                     f"{held / t.capacity_rps:.1f} s of work at capacity." if held is not None and first_burn is not None
                     else ", since no burn-rate alert fired at all.")
        else:
            page += (f" In this run a burn-rate alert beat {queue_alert}: the queue threshold was too high or its `for:`"
                     " too long for this overload; lower them before trusting it to page.")
    lines = [
        "# Postmortem: one replica, deliberately overloaded", "",
        "## Summary", "",
        f"Offered load rose to {t.offered_peak_rps:.2f} requests/s against a measured capacity of "
        f"{t.capacity_rps:.2f} requests/s. Requests queued inside vLLM, the first request missed the "
        f"{slo_ms:g} ms TTFT target at t = {_s(t.first_breach_s)}, and the queue peaked at "
        f"{_s(t.queue_peak, 'requests')} (the fluid model predicted {_s(t.queue_peak_predicted, 'requests')}).", "",
        "## Timeline (seconds after the first request)", "",
        "| t | event |", "|---|---|",
        f"| {t.overload_start_s:.1f} | overload begins ({t.offered_peak_rps:.2f} req/s offered) |",
        f"| {_s(q_fired)} | alert {queue_alert} firing |",
        f"| {_s(t.first_breach_s)} | first request over the TTFT target (by send time) |",
        *[f"| {_s(f)} | alert {a} firing |" for a, f in burn],
        f"| {t.overload_end_s:.1f} | overload ends |",
        f"| {_s(t.recovered_s)} | queue empty again |", "",
        "## Detection", "",
        queue_line, burn_line, "",
        "## Root cause", "",
        f"Arrivals above capacity: the backlog grows at offered − capacity = "
        f"{t.offered_peak_rps - t.capacity_rps:.2f} requests/s, and every queued request adds "
        f"1 / capacity = {1 / t.capacity_rps:.2f} s to the TTFT of those behind it. Nothing in the stack sheds load: "
        "vLLM queues every request it accepts, and the router had one replica to send to.", "",
        "## The alert that should have paged", "",
        page, "",
        "## Fix and its measured effect", "",
        f"{fix}", "",
        "| run | p99 TTFT in the overload (ms) | requests within target | queue peak |", "|---|---|---|---|",
        f"| before | {t.before_fix.get('ttft_p99_ms', float('nan')):.0f} | {t.before_fix.get('attainment', float('nan')):.1%} "
        f"| {t.before_fix.get('queue_peak', float('nan')):.0f} |",
        f"| after | {t.after_fix.get('ttft_p99_ms', float('nan')):.0f} | {t.after_fix.get('attainment', float('nan')):.1%} "
        f"| {t.after_fix.get('queue_peak', float('nan')):.0f} |",
    ]
    if commands:
        lines += ["", "## Reproduce", "", "```", *commands, "```"]
    return "\n".join(lines) + "\n"
