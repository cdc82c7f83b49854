"""Watching a fleet: Prometheus scrape config, recording rules and SLO alerts, the SLO dashboard, offline charts.

One set of PromQL serves four places — the local lab's Prometheus (``rules.yml``), the Kubernetes
``PrometheusRule``, the Grafana dashboard and the lab's altair charts — so what a learner sees offline is what a
cluster would page on::

    slo = observability.FleetSLO(ttft_p99_ms=500, tpot_p99_ms=50, queue_threshold=4)
    files = observability.write_prometheus("prom/", ["127.0.0.1:8201", "127.0.0.1:8202"],
                                           router="127.0.0.1:29001", slo=slo)
    observability.check_prometheus(files)           # promtool check config / check rules
    board = observability.dashboard(slo)            # a typed Grafana dashboard (grafana-foundation-sdk)
    df = observability.query_range_frame(payload)   # /api/v1/query_range JSON -> DataFrame

**The TTFT SLO as a ratio of good requests.** "p99 TTFT <= 500 ms" means at most 1% of requests may take
longer. vLLM exports TTFT as a histogram, so a request is *good* when it lands in the bucket ``le=B``, B being
the largest bucket boundary at or below the target (:func:`slo_bucket`). When the target is itself a boundary
(500 ms is) the count is exact; otherwise requests between B and the target are counted as bad, so the alert can
fire early but never late. The burn rate is the bad share divided by the budget (1 - objective); the alerts
follow the multi-window, multi-burn-rate recipe of Google's SRE workbook (a long window to be sure, a short one
to stop paging soon after recovery).

Metric names are vLLM 0.32's (``vllm/v1/metrics/loggers.py``: counters are exported with ``_total``) and
vllm-router 0.1.17's (measured: ``phase4-fleet-findings.md``); :func:`exported_metric_names` reads vLLM's from the
installed vLLM's source, and a test holds every dashboard query to that list.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

__all__ = [
    "FleetSLO", "BurnWindow", "SRE_WINDOWS", "Query", "PanelSpec", "PrometheusFiles", "PromtoolResult", "PromtoolMissing",
    "TTFT", "TPOT", "ROUTER_METRICS", "vllm_buckets", "slo_bucket", "le_label", "recording_rules", "alert_rules",
    "rule_groups", "prometheus_config", "write_prometheus", "check_prometheus", "promtool", "metric_names",
    "exported_metric_names", "panels", "dashboard", "dashboard_json", "load_dashboard", "query_range_frame",
    "panel_frame", "panel_chart", "dashboard_charts",
]

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"

#: vllm-router 0.1.17's metrics (its ``--prometheus-port``), as scraped on this project's fleet run.
ROUTER_METRICS = frozenset({
    "vllm_router_requests_total", "vllm_router_processed_requests_total", "vllm_router_policy_decisions_total",
    "vllm_router_prefix_routing_decisions_total", "vllm_router_kv_routing_inputs_total",
    "vllm_router_running_requests", "vllm_router_worker_health", "vllm_router_active_workers",
    "vllm_router_cb_state", "vllm_router_generate_duration_seconds_bucket",
    "vllm_router_generate_duration_seconds_sum", "vllm_router_generate_duration_seconds_count",
})


# ------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class FleetSLO:
    """The fleet's service-level objective: p99 TTFT and p99 TPOT targets, and the queue that triggers scaling.

    ``objective`` is the share of requests that must meet the TTFT target (0.99 for a p99 target); its complement
    is the error budget the burn-rate alerts spend. ``queue_threshold`` is requests waiting per replica.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    ttft_p99_ms: float
    tpot_p99_ms: float
    queue_threshold: int = 4
    objective: float = 0.99

    def __post_init__(self) -> None:
        for name in ("ttft_p99_ms", "tpot_p99_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"SLO {name}={value!r}: give a positive number of milliseconds (e.g. 500)")
        if not (isinstance(self.queue_threshold, int) and self.queue_threshold >= 1):
            raise ValueError(f"SLO queue_threshold={self.queue_threshold!r}: give a whole number of waiting "
                             "requests per replica, at least 1")
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO objective={self.objective!r}: give the share of good requests, e.g. 0.99")

    @property
    def budget(self) -> float:
        """The error budget: the share of requests allowed to miss the TTFT target."""
        return 1.0 - self.objective


@dataclass(frozen=True)
class BurnWindow:
    """One burn-rate alert: fire when both windows burn the budget ``factor`` times faster than allowed.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    long: str
    short: str
    factor: float
    severity: str
    for_: str = "0s"


#: Google SRE workbook, for a 30-day budget: 2% of it in 1 h (x14.4) or 5% in 6 h (x6) pages; 10% in 3 days tickets.
SRE_WINDOWS = (BurnWindow("1h", "5m", 14.4, "page", "2m"), BurnWindow("6h", "30m", 6.0, "page", "15m"),
               BurnWindow("3d", "6h", 1.0, "ticket", "1h"))


# ------------------------------------------------------------------------------- vLLM's own names
def _vllm_source(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("vLLM is not installed in this environment: run `make setup`, which installs it")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this helper reads vLLM 0.32's layout; check `pip show vllm`")
    return path


def vllm_buckets(name: str = "TIME_TO_FIRST_TOKEN_BUCKETS") -> tuple[float, ...]:
    """A default histogram bucket list of the installed vLLM (``vllm/v1/metrics/buckets.py``), read from source.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    tree = ast.parse(_vllm_source("v1/metrics/buckets.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return tuple(float(b) for b in ast.literal_eval(node.value))
    raise KeyError(f"vLLM defines no bucket list {name!r} in v1/metrics/buckets.py")


def slo_bucket(target_s: float, buckets: Sequence[float]) -> float:
    """The largest bucket boundary at or below ``target_s``: requests in ``le=B`` surely met the target.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    below = [b for b in buckets if b <= target_s + 1e-12]
    if not below:
        raise ValueError(f"target {target_s * 1000:g} ms is below vLLM's smallest bucket ({min(buckets) * 1000:g} ms): "
                         "no histogram bucket can tell good requests from bad. Raise the target.")
    return max(below)


def le_label(bound: float) -> str:
    """The ``le`` label value prometheus_client writes for a bucket bound (``0.5`` -> ``"0.5"``, 1 -> ``"1.0"``).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)


# ------------------------------------------------------------------------------------------- rules
def _ttft_good_selector(slo: FleetSLO) -> str:
    bound = slo_bucket(slo.ttft_p99_ms / 1000, vllm_buckets("TIME_TO_FIRST_TOKEN_BUCKETS"))
    return f'{TTFT}_bucket{{le="{le_label(bound)}"}}'


def _burn_expr(slo: FleetSLO, window: str) -> str:
    return (f"(1 - sum(rate({_ttft_good_selector(slo)}[{window}])) / sum(rate({TTFT}_count[{window}])))"
            f" / {slo.budget:.6g}")


def _quantile(q: float, metric: str, window: str, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket[{window}])))"


def recording_rules(slo: FleetSLO, window: str = "30s", burn_windows: Sequence[BurnWindow] = SRE_WINDOWS) -> list[dict]:
    """Recording rules: fleet queue and running sums, TTFT p50/p99 and TPOT p99 over ``window``, prefix-cache hit
    rate, KV-cache usage, and the TTFT burn rate over every window the alerts use.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    rules = [
        {"record": "fleet:num_requests_waiting:sum", "expr": "sum(vllm:num_requests_waiting)"},
        {"record": "fleet:num_requests_running:sum", "expr": "sum(vllm:num_requests_running)"},
        {"record": f"fleet:ttft_seconds:p50_{window}", "expr": _quantile(0.5, TTFT, window)},
        {"record": f"fleet:ttft_seconds:p99_{window}", "expr": _quantile(0.99, TTFT, window)},
        {"record": f"fleet:tpot_seconds:p99_{window}", "expr": _quantile(0.99, TPOT, window)},
        {"record": f"fleet:prefix_cache_hit_rate:{window}",
         "expr": f"sum(rate(vllm:prefix_cache_hits_total[{window}])) / sum(rate(vllm:prefix_cache_queries_total[{window}]))"},
        {"record": "fleet:kv_cache_usage_perc:max", "expr": "max(vllm:kv_cache_usage_perc)"},
    ]
    for w in sorted({w for b in burn_windows for w in (b.long, b.short)}, key=_seconds):
        rules.append({"record": f"fleet:ttft_slo_burn_rate:{w}", "expr": _burn_expr(slo, w)})
    return rules


def alert_rules(slo: FleetSLO, window: str = "30s", burn_windows: Sequence[BurnWindow] = SRE_WINDOWS,
                queue_for: str = "1m", kv_full: float = 0.95, kv_for: str = "2m",
                preemption_for: str = "5m", tpot_for: str = "5m") -> list[dict]:
    """SLO alerts: TTFT budget burn (multi-window), a queue building on a replica, a KV cache nearly full,
    preemptions, and p99 TPOT above target. They read the series :func:`recording_rules` records.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    bound = slo_bucket(slo.ttft_p99_ms / 1000, vllm_buckets("TIME_TO_FIRST_TOKEN_BUCKETS"))
    alerts = []
    for b in burn_windows:
        alerts.append({
            "alert": f"VllmTTFTBudgetBurn{b.long}",
            "expr": (f"fleet:ttft_slo_burn_rate:{b.long} > {b.factor:g} and "
                     f"fleet:ttft_slo_burn_rate:{b.short} > {b.factor:g}"),
            "for": b.for_, "labels": {"severity": b.severity},
            "annotations": {"summary": f"TTFT error budget burning {b.factor:g}x too fast over {b.long} and {b.short}",
                            "description": (f"More than {b.factor * slo.budget:.2%} of requests took longer than "
                                            f"{bound * 1000:g} ms to the first token (target p99 "
                                            f"{slo.ttft_p99_ms:g} ms).")}})
    alerts += [
        {"alert": "VllmQueueBuilding", "expr": f"max by (instance) (vllm:num_requests_waiting) > {slo.queue_threshold}",
         "for": queue_for, "labels": {"severity": "warning"},
         "annotations": {"summary": "Requests are queueing on {{ $labels.instance }}",
                         "description": f"More than {slo.queue_threshold} requests waited for {queue_for}: the "
                                        "replica is full (max-num-seqs or KV cache); scale out or shed load."}},
        {"alert": "VllmKVCacheFull", "expr": f"max by (instance) (vllm:kv_cache_usage_perc) > {kv_full:g}",
         "for": kv_for, "labels": {"severity": "warning"},
         "annotations": {"summary": "KV cache above {{ $value | humanizePercentage }} on {{ $labels.instance }}",
                         "description": "New requests will wait or preempt running ones."}},
        {"alert": "VllmPreempting", "expr": "sum by (instance) (rate(vllm:num_preemptions_total[5m])) > 0",
         "for": preemption_for, "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.instance }} is preempting requests",
                         "description": "Preempted requests recompute their prefill: TTFT and TPOT suffer."}},
        {"alert": "VllmTPOTAboveTarget", "expr": f"fleet:tpot_seconds:p99_{window} > {slo.tpot_p99_ms / 1000:g}",
         "for": tpot_for, "labels": {"severity": "warning"},
         "annotations": {"summary": f"p99 TPOT above {slo.tpot_p99_ms:g} ms",
                         "description": "Decode is slowed by batch size or prefill interference."}},
    ]
    return alerts


def rule_groups(slo: FleetSLO, window: str = "30s", burn_windows: Sequence[BurnWindow] = SRE_WINDOWS,
                **alert_kwargs: Any) -> list[dict]:
    """Prometheus rule groups (recording, then alerts): the body of ``rules.yml`` and of a ``PrometheusRule``.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    return [{"name": "vllm-fleet-recording", "rules": recording_rules(slo, window, burn_windows)},
            {"name": "vllm-fleet-slo-alerts", "rules": alert_rules(slo, window, burn_windows, **alert_kwargs)}]


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
    return sum(int(n) * units[u] for n, u in parts)


# ------------------------------------------------------------------------------- prometheus files
@dataclass(frozen=True)
class PrometheusFiles:
    """The two files a local Prometheus runs with.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    config: Path
    rules: Path


def prometheus_config(replicas: Sequence[str], router: str | None = None, interval: str = "1s",
                      rule_files: Sequence[str] = ("rules.yml",)) -> dict:
    """A ``prometheus.yml`` for a local fleet: vLLM replicas (``host:port``) and the router's metrics port.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    _seconds(interval)
    targets = list(replicas)
    bad = [t for t in [*targets, *([router] if router else [])] if not re.fullmatch(r"[^\s:/]+:\d{1,5}", t)]
    if not targets or bad:
        raise ValueError(f"scrape targets must be host:port (no scheme, no path); got {bad or 'no replicas'}")
    jobs = [{"job_name": "vllm", "metrics_path": "/metrics", "static_configs": [{"targets": targets}]}]
    if router:
        jobs.append({"job_name": "vllm-router", "metrics_path": "/metrics", "static_configs": [{"targets": [router]}]})
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": list(rule_files), "scrape_configs": jobs}


def write_prometheus(folder: str | Path, replicas: Sequence[str], router: str | None, slo: FleetSLO,
                     interval: str = "1s", window: str = "30s",
                     burn_windows: Sequence[BurnWindow] = SRE_WINDOWS, **alert_kwargs: Any) -> PrometheusFiles:
    """Write ``prometheus.yml`` and ``rules.yml`` into ``folder``.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config, rules = folder / "prometheus.yml", folder / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(slo, window, burn_windows, **alert_kwargs)},
                                    sort_keys=False))
    config.write_text(yaml.safe_dump(prometheus_config(replicas, router, interval, [rules.name]), sort_keys=False))
    return PrometheusFiles(config=config, rules=rules)


class PromtoolMissing(FileNotFoundError):
    """``promtool`` is not installed (it comes with Prometheus).

    Introduced in lab 23 (Observability and the Postmortem).
    """


@dataclass(frozen=True)
class PromtoolResult:
    """What one ``promtool check`` said.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    command: tuple[str, ...]
    ok: bool
    output: str


def promtool(*args: str, timeout: float = 60) -> PromtoolResult:
    """Run ``promtool`` with ``args``; :class:`PromtoolMissing` says how to install it when it is absent.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    exe = shutil.which("promtool")
    if exe is None:
        raise PromtoolMissing(
            "promtool is not on PATH. Install Prometheus's tools: `apt-get install -y prometheus` on Debian/Ubuntu "
            "(promtool 2.42 in Debian 12; `make setup` runs it on CI), or put the promtool binary of a Prometheus "
            "release on PATH.")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    return PromtoolResult(command=("promtool", *args), ok=proc.returncode == 0,
                          output=(proc.stdout + proc.stderr).strip())


def check_prometheus(files: PrometheusFiles) -> list[PromtoolResult]:
    """``promtool check config`` (which loads the rule files too) and ``promtool check rules``.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    return [promtool("check", "config", str(files.config)), promtool("check", "rules", str(files.rules))]


# --------------------------------------------------------------------------------- metric names
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan", "atan2",
             # aggregation operators, which may be followed by a `by (...)` clause instead of "("
             "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
             "quantile", "limitk", "limit_ratio"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, aggregations, labels and durations left out).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)  # label lists
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, rest = m.group(0), text[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(word)
    return names


def exported_metric_names() -> frozenset[str]:
    """Every series name the installed vLLM exports, from ``vllm/v1/metrics/loggers.py`` (counters with
    ``_total``; histograms as ``_bucket``, ``_sum``, ``_count``), plus vllm-router's :data:`ROUTER_METRICS`.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    tree = ast.parse(_vllm_source("v1/metrics/loggers.py").read_text())
    kinds = {"_gauge_cls": "gauge", "Gauge": "gauge", "_counter_cls": "counter", "Counter": "counter",
             "_histogram_cls": "histogram", "Histogram": "histogram"}
    found: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigned = {t.id: n.value.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                    for t in n.targets if isinstance(t, ast.Name)}
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            func = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            kind = kinds.get(func)
            for kw in call.keywords if kind else ():
                if kw.arg != "name":
                    continue
                name = kw.value.value if isinstance(kw.value, ast.Constant) else assigned.get(getattr(kw.value, "id", ""))
                if isinstance(name, str) and name.startswith("vllm:"):
                    base = name.removesuffix("_total")
                    found |= ({name} if kind == "gauge" else {base + "_total"} if kind == "counter"
                              else {base + s for s in ("_bucket", "_sum", "_count")})
    if not found:
        raise RuntimeError("found no vllm: metrics in vllm/v1/metrics/loggers.py: vLLM's layout changed; "
                           "update exported_metric_names")
    return frozenset(found) | ROUTER_METRICS


# ------------------------------------------------------------------------------------- dashboard
@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel, and how its series are named (Grafana's ``{{label}}`` legend template).

    Introduced in lab 23 (Observability and the Postmortem).
    """

    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    """A dashboard panel, drawn by Grafana (:func:`dashboard`) and offline by altair (:func:`panel_chart`).

    Introduced in lab 23 (Observability and the Postmortem).
    """

    title: str
    unit: str
    queries: tuple[Query, ...]
    target: float | None = None
    description: str = ""


def panels(slo: FleetSLO, window: str = "30s", rate_window: str = "1m",
           burn_windows: Sequence[BurnWindow] = SRE_WINDOWS) -> list[PanelSpec]:
    """The SLO dashboard's panels. Every query reads raw vLLM or vllm-router metrics (no recording rule), so it
    works on any Prometheus that scrapes the fleet.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    fast = burn_windows[0]
    hit = (f"sum by (instance) (rate(vllm:prefix_cache_hits_total[{rate_window}])) / "
           f"sum by (instance) (rate(vllm:prefix_cache_queries_total[{rate_window}]))")
    return [
        PanelSpec("TTFT p50 / p99 vs target", "s",
                  (Query(_quantile(0.5, TTFT, window), "p50"), Query(_quantile(0.99, TTFT, window), "p99")),
                  target=slo.ttft_p99_ms / 1000, description=f"Fleet-wide, over {window}; the line is the p99 target."),
        PanelSpec("TPOT p99 vs target", "s", (Query(_quantile(0.99, TPOT, window), "p99"),),
                  target=slo.tpot_p99_ms / 1000),
        PanelSpec("Requests waiting per replica", "short",
                  (Query("sum by (instance) (vllm:num_requests_waiting)", "{{instance}}"),),
                  target=float(slo.queue_threshold), description="The autoscaler's signal; the line is its threshold."),
        PanelSpec("Requests running per replica", "short",
                  (Query("sum by (instance) (vllm:num_requests_running)", "{{instance}}"),)),
        PanelSpec("KV cache usage per replica", "percentunit",
                  (Query("max by (instance) (vllm:kv_cache_usage_perc)", "{{instance}}"),), target=1.0),
        PanelSpec("Prefix-cache hit rate", "percentunit", (Query(hit, "{{instance}}"),),
                  description="Cached tokens over queried tokens; prefix-aware routing raises it."),
        PanelSpec("TTFT error-budget burn rate", "short",
                  tuple(Query(_burn_expr(slo, w), w) for w in (fast.short, fast.long)), target=fast.factor,
                  description=f"1 = spending the budget exactly; paging above {fast.factor:g} on both windows."),
        PanelSpec("Router requests per worker", "reqps",
                  (Query(f"sum by (worker) (rate(vllm_router_processed_requests_total[{rate_window}]))",
                         "{{worker}}"),)),
    ]


def dashboard(slo: FleetSLO, title: str = "vLLM fleet SLOs", uid: str = "vllm-fleet-slo", refresh: str = "5s",
              **panel_kwargs: Any) -> Any:
    """The SLO dashboard as a typed ``grafana_foundation_sdk`` model (two panels per row, 8 units high).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    from grafana_foundation_sdk.builders import common as gcommon_b, dashboard as gdb, prometheus as gprom, timeseries
    from grafana_foundation_sdk.models import common as gcommon, dashboard as gdm

    ds = gdm.DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (gdb.Dashboard(title).uid(uid).tags(["vllm", "llm-serving-labs"]).refresh(refresh)
             .time("now-30m", "now").timezone("browser")
             .with_variable(gdb.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for p in panels(slo, **panel_kwargs):
        panel = (timeseries.Panel().title(p.title).description(p.description).unit(p.unit).datasource(ds)
                 .height(8).span(12).line_width(1).fill_opacity(10))
        for ref, q in zip("ABCDEFGH", p.queries):
            panel = panel.with_target(gprom.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref).range())
        if p.target is not None:
            panel = (panel.thresholds(gdb.ThresholdsConfig().mode(gdm.ThresholdsMode.ABSOLUTE).steps(
                [gdm.Threshold(value=None, color="green"), gdm.Threshold(value=p.target, color="red")]))
                .thresholds_style(gcommon_b.GraphThresholdsStyleConfig().mode(gcommon.GraphThresholdsStyleMode.DASHED)))
        board = board.with_panel(panel)
    return board.build()


def dashboard_json(board: Any) -> dict:
    """A dashboard model as the JSON Grafana imports.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(board, cls=JSONEncoder))


def load_dashboard(data: Mapping[str, Any] | str | Path) -> Any:
    """Dashboard JSON (a dict, a JSON string or a file) back into the SDK's typed model.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models import dashboard as gdm

    if isinstance(data, Path) or (isinstance(data, str) and not data.lstrip().startswith("{")):
        data = Path(data).read_text()
    if isinstance(data, str):
        data = json.loads(data)
    plugins.register_default_plugins()
    return gdm.Dashboard.from_json(dict(data))


# ------------------------------------------------------------------------------ offline panels
def query_range_frame(payload: Mapping[str, Any] | str | Path) -> "Any":
    """Prometheus ``/api/v1/query_range`` JSON as a long DataFrame: ``time`` (UTC), ``value`` (float; NaN kept),
    ``series`` (the labels as ``k=v, ...``) and one column per label.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import pandas as pd

    if isinstance(payload, Path) or (isinstance(payload, str) and not payload.lstrip().startswith("{")):
        payload = Path(payload).read_text()
    if isinstance(payload, str):
        payload = json.loads(payload)
    if payload.get("status") != "success":
        raise ValueError(f"Prometheus answered {payload.get('status')!r}: {payload.get('errorType', '')} "
                         f"{payload.get('error', '')}".strip())
    data = payload.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ValueError(f"expected a range query's matrix, got resultType {data.get('resultType')!r}: "
                         "use /api/v1/query_range, not /api/v1/query")
    rows = []
    for series in data.get("result", []):
        labels = dict(series.get("metric", {}))
        name = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
        for ts, value in series.get("values", []):
            rows.append({"time": float(ts), "value": float(value), "series": name, **labels})
    frame = pd.DataFrame(rows, columns=None if rows else ["time", "value", "series"])
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    return frame


def _legend(template: str, row: Mapping[str, Any]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(row.get(m.group(1), "")), template)


def panel_frame(panel: PanelSpec, results: Mapping[str, Any]) -> "Any":
    """One panel's data: each query's ``query_range`` result (``results[expr]``) with a ``legend`` column named
    by the query's legend template.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import pandas as pd

    frames = []
    for q in panel.queries:
        if q.expr not in results:
            raise KeyError(f"no query_range result for {panel.title!r} query {q.expr!r}: fetch it from Prometheus "
                           "(/api/v1/query_range) and pass it in results")
        f = query_range_frame(results[q.expr])
        f["legend"] = [_legend(q.legend, r) for r in f.to_dict("records")] if len(f) else []
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def panel_summary(panel_specs: Iterable[PanelSpec], results: Mapping[str, Any]) -> "Any":
    """The dashboard's numbers as a table: for every panel with data in ``results``, each line's mean, peak and last
    value over the range, how many samples it had, and the panel's target (what a report quotes from a dashboard).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import pandas as pd

    rows = []
    for p in panel_specs:
        if not all(q.expr in results for q in p.queries):
            continue
        frame = panel_frame(p, results)
        for legend, f in frame.groupby("legend", sort=True):
            v = f.sort_values("time")["value"].dropna()
            rows.append({"panel": p.title, "line": legend, "unit": p.unit, "mean": v.mean() if len(v) else float("nan"),
                         "peak": v.max() if len(v) else float("nan"), "last": v.iloc[-1] if len(v) else float("nan"),
                         "samples": int(len(v)), "target": p.target})
    return pd.DataFrame(rows, columns=["panel", "line", "unit", "mean", "peak", "last", "samples", "target"])


def panel_chart(panel: PanelSpec, frame: "Any", width: int = 360, height: int = 180) -> "Any":
    """A panel drawn with altair: one line per legend, the target as a dashed rule.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import altair as alt

    fmt = {"percentunit": ".0%", "s": ".3~s", "reqps": ".2~f"}.get(panel.unit, "~s")
    lines = alt.Chart(frame).mark_line(interpolate="step-after").encode(
        x=alt.X("time:T", title=None),
        y=alt.Y("value:Q", title=panel.unit, axis=alt.Axis(format=fmt)),
        color=alt.Color("legend:N", title=None))
    layers = [lines]
    if panel.target is not None:
        import pandas as pd

        layers.append(alt.Chart(pd.DataFrame({"target": [panel.target]})).mark_rule(
            strokeDash=[4, 3], color="firebrick").encode(y="target:Q"))
    return alt.layer(*layers).properties(title=panel.title, width=width, height=height)


def dashboard_charts(panel_specs: Iterable[PanelSpec], results: Mapping[str, Any], columns: int = 2) -> "Any":
    """Every panel with data in ``results``, laid out ``columns`` to a row, as on the Grafana dashboard.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    import altair as alt

    charts = [panel_chart(p, panel_frame(p, results)) for p in panel_specs
              if all(q.expr in results for q in p.queries)]
    if not charts:
        raise ValueError("none of the panels has its query results in `results` (keys are the PromQL expressions)")
    return alt.concat(*charts, columns=columns)
