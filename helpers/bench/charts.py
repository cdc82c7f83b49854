"""Charts of benchmark runs (altair), each built from a small, aggregated dataset.

Altair refuses datasets over 5,000 rows unless told otherwise; these charts never need that: CDFs are
drawn from at most ``max_points`` quantiles per run, timelines from at most ``max_requests`` requests
(evenly spaced in dispatch order, and the title says so), and latency-throughput curves from one
row per run and quantile.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .stats import metric_values

__all__ = ["latency_throughput", "cdf", "timeline"]

_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "client_queue": "client queue"}


def _alt():
    import altair as alt

    return alt


def _runs(runs: Any) -> list[tuple[str, Any]]:
    """``(label, run)`` pairs from a run, a list of runs, a ``{label: run}`` dict or a sweep."""
    if hasattr(runs, "runs") and hasattr(runs, "values"):  # SweepResult
        return [(f"{runs.parameter} {v:g}", r) for v, r in zip(runs.values, runs.runs)]
    if isinstance(runs, Mapping):
        return [(str(k), v) for k, v in runs.items()]
    if hasattr(runs, "records"):
        return [(runs.label, runs)]
    out = []
    for i, r in enumerate(runs):
        label = getattr(r, "label", None) or f"run {i}"
        if any(label == x for x, _ in out):
            label = f"{label} ({i})"
        out.append((label, r))
    return out


def latency_throughput(runs: Any, metrics: Sequence[str] = ("ttft", "tpot"), quantiles: Sequence[int] = (50, 99),
                       x: str = "output_throughput", width: int = 280, height: int = 220):
    """Latency against achieved throughput over a sweep: one panel per metric, one line per quantile.

    ``runs`` is a :class:`~helpers.bench.runner.SweepResult` (or runs / ``{label: run}``); ``x`` is a
    summary field (``output_throughput`` tok/s by default, or ``request_throughput``). Points carry the
    sweep's parameter in their tooltip; the knee is where the lines turn up.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    alt = _alt()
    import pandas as pd

    rows = []
    for i, (label, r) in enumerate(_runs(runs)):
        s = r.summary
        xv = getattr(s, x)
        for m in metrics:
            dist = getattr(s, f"{m}_ms")
            for q in quantiles:
                rows.append({"run": label, "step": i, "x": xv, "metric": _LABELS.get(m, m), "quantile": f"p{q}",
                             "latency_ms": getattr(dist, f"p{q}"), "failed": s.failed})
    df = pd.DataFrame(rows)
    x_title = "achieved output throughput (tok/s)" if x == "output_throughput" else x.replace("_", " ")
    base = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("x:Q", title=x_title),
        y=alt.Y("latency_ms:Q", title="latency (ms)"),
        color=alt.Color("quantile:N", title="quantile"),
        order="step:Q",  # in sweep order: past the knee, throughput can fall back while latency climbs
        tooltip=["run:N", "metric:N", "quantile:N", alt.Tooltip("latency_ms:Q", format=".1f"),
                 alt.Tooltip("x:Q", format=".1f", title=x), "failed:Q"],
    ).properties(width=width, height=height)
    return base.facet(column=alt.Column("metric:N", title=None, sort=[_LABELS.get(m, m) for m in metrics])
                      ).resolve_scale(y="independent").properties(title="Latency vs throughput")


def cdf(runs: Any, metric: str | Sequence[str] = "ttft", max_points: int = 400, width: int = 320,
        height: int = 220):
    """Empirical CDF of a metric (ms) for one run or several, overlaid; a list of metrics gives one panel each.

    Each run contributes at most ``max_points`` points (its quantiles at evenly spaced probabilities),
    so token-level ITL of a long run stays small.

    Introduced in lab 10 (Load Testing Honestly).
    """
    alt = _alt()
    import pandas as pd

    metrics = [metric] if isinstance(metric, str) else list(metric)
    labelled = _runs(runs)
    charts = []
    for m in metrics:
        key = m.removesuffix("_ms")
        rows = []
        for label, r in labelled:
            vals = np.asarray(metric_values(r.records, key), dtype=float)
            if vals.size == 0:
                continue
            probs = np.linspace(0.0, 1.0, min(max_points, vals.size))
            qs = np.quantile(vals, probs)
            rows += [{"run": label, "ms": float(v), "fraction": float(p)} for v, p in zip(qs, probs)]
        df = pd.DataFrame(rows, columns=["run", "ms", "fraction"])
        charts.append(alt.Chart(df).mark_line(interpolate="step-after").encode(
            x=alt.X("ms:Q", title=f"{_LABELS.get(key, key)} (ms)"),
            y=alt.Y("fraction:Q", title="fraction of " + ("tokens" if key == "itl" else "requests"),
                    scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("run:N", title="run", sort=[label for label, _ in labelled]),
            tooltip=["run:N", alt.Tooltip("ms:Q", format=".1f"), alt.Tooltip("fraction:Q", format=".3f")],
        ).properties(width=width, height=height, title=f"{_LABELS.get(key, key)} CDF"))
    return charts[0] if len(charts) == 1 else alt.hconcat(*charts)


def timeline(run: Any, max_requests: int = 300, gauges: bool | Iterable[str] = True, width: int = 640,
             height: int | None = None):
    """Each request as a bar from dispatch to end, a tick at its first token, client queue time in grey.

    With ``gauges`` (and gauge samples in the run), the server's running / waiting requests are drawn
    below on the same time axis. At most ``max_requests`` bars (evenly spaced in dispatch order).

    Introduced in lab 07 (Continuous Batching).
    """
    alt = _alt()
    import pandas as pd

    df = run.df
    df = df[df["dispatched_s"].notna()].sort_values("dispatched_s").reset_index(drop=True)
    total = len(df)
    if total > max_requests:
        idx = np.unique(np.linspace(0, total - 1, max_requests).round().astype(int))
        df = df.iloc[idx]
        title = f"Request timeline ({len(df)} of {total} requests shown)"
    else:
        title = "Request timeline"
    df = df.assign(order=np.arange(len(df)), status=np.where(df["ok"], "completed", "failed"))
    df = df[["id", "order", "status", "scheduled_s", "dispatched_s", "first_token_s", "end_s", "ttft_ms", "e2e_ms",
             "output_tokens", "client_queue_ms"]]
    h = height or max(120, min(600, 3 * len(df)))
    y = alt.Y("order:O", axis=None, title="requests (by dispatch)")
    x = alt.X("dispatched_s:Q", title="seconds since first dispatch")
    tip = ["id:N", "status:N", alt.Tooltip("ttft_ms:Q", format=".1f"), alt.Tooltip("e2e_ms:Q", format=".1f"),
           "output_tokens:Q", alt.Tooltip("client_queue_ms:Q", format=".2f")]
    bars = alt.Chart(df).mark_bar(height=max(1, min(8, h // max(len(df), 1) - 1))).encode(
        x=x, x2="end_s:Q", y=y,
        color=alt.Color("status:N", scale=alt.Scale(domain=["completed", "failed"], range=["#4c78a8", "#e45756"])),
        tooltip=tip)
    queue = alt.Chart(df).mark_rule(color="#bbbbbb").encode(x="scheduled_s:Q", x2="dispatched_s:Q", y=y)
    first = alt.Chart(df).mark_tick(color="#f58518", thickness=2).encode(
        x=alt.X("first_token_s:Q"), y=y, tooltip=tip)
    chart = (queue + bars + first).properties(width=width, height=h, title=title)
    names = ["vllm:num_requests_running", "vllm:num_requests_waiting"] if gauges is True else list(gauges or [])
    rows = [{"t": g["t"], "gauge": n.removeprefix("vllm:"), "value": g.get(n)}
            for g in (run.gauges or []) for n in names if g.get(n) is not None]
    if names and rows:
        gdf = pd.DataFrame(rows)
        lines = alt.Chart(gdf).mark_line(interpolate="step-after").encode(
            x=alt.X("t:Q", title="seconds since first dispatch"), y=alt.Y("value:Q", title="server gauge"),
            color=alt.Color("gauge:N"), tooltip=["gauge:N", "t:Q", "value:Q"],
        ).properties(width=width, height=120)
        return alt.vconcat(chart, lines).resolve_scale(x="shared", color="independent")
    return chart
