"""helpers.fleet.observability: rules checked by promtool (syntax and behaviour), the dashboard's queries held to the
metrics vLLM 0.32 and vllm-router really export, and query_range JSON drawn offline.

The promtool tests need Prometheus's tools (`apt-get install -y prometheus`); without them they fail with that
instruction (PromtoolMissing) rather than skip.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from helpers.fleet import observability as obs

FIXTURES = Path(__file__).parent / "fixtures" / "prometheus"
SLO = obs.FleetSLO(ttft_p99_ms=500, tpot_p99_ms=50, queue_threshold=4)


# ---------------------------------------------------------------------------------- metric names
def test_exported_names_come_from_vllms_source_with_prometheus_suffixes():
    names = obs.exported_metric_names()
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
            "vllm:request_time_per_output_token_seconds_bucket", "vllm:cache_config_info"} <= names
    assert "vllm:prefix_cache_hits" not in names  # a counter is exported only with _total
    assert "vllm:num_requests_waiting_total" not in names and "vllm:time_to_first_token_seconds" not in names
    assert obs.ROUTER_METRICS <= names


@pytest.mark.parametrize("expr, expected", [
    ("sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[30s]))", {"vllm:time_to_first_token_seconds_bucket"}),
    ('max by (instance) (vllm:kv_cache_usage_perc{model_name="x"}) > 0.95', {"vllm:kv_cache_usage_perc"}),
    ("a / on(instance) group_left(pod) b offset 5m", {"a", "b"}),
    ("sum without (engine) (rate(x_total[1m])) * 1e3 > bool 2", {"x_total"}),
    ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
    ("histogram_quantile(0.99, sum(rate(h_bucket[5m])) by (le))", {"h_bucket"}),
])
def test_metric_names_parses_promql(expr, expected):
    assert obs.metric_names(expr) == expected


def test_every_panel_has_queries_that_read_only_exported_metrics():
    names = obs.exported_metric_names()
    specs = obs.panels(SLO)
    assert len(specs) == 8
    for p in specs:
        assert p.queries, p.title
        for q in p.queries:
            used = obs.metric_names(q.expr)
            assert used and used <= names, f"{p.title}: {sorted(used - names)} not exported by vLLM 0.32/vllm-router"


def test_the_panel_check_catches_a_name_vllm_does_not_export():
    wrong = obs.metric_names("sum(rate(vllm:prefix_cache_hits[1m]))")  # the counter without _total
    assert not wrong <= obs.exported_metric_names()


# ---------------------------------------------------------------------------------- the TTFT SLO
def test_slo_bucket_is_the_largest_boundary_at_or_below_the_target():
    buckets = obs.vllm_buckets("TIME_TO_FIRST_TOKEN_BUCKETS")
    assert buckets[:3] == (0.001, 0.005, 0.01) and 0.5 in buckets
    assert obs.slo_bucket(0.5, buckets) == 0.5
    assert obs.slo_bucket(0.3, buckets) == 0.25
    with pytest.raises(ValueError, match="below vLLM's smallest bucket"):
        obs.slo_bucket(0.0005, buckets)


def test_le_label_matches_what_prometheus_client_writes():
    reg = CollectorRegistry()
    h = Histogram("ttft", "t", buckets=obs.vllm_buckets("TIME_TO_FIRST_TOKEN_BUCKETS"), registry=reg)
    h.observe(0.3)
    text = generate_latest(reg).decode()
    for bound in (0.5, 1.0, 10.0, 2560.0, 0.001):
        assert f'ttft_bucket{{le="{obs.le_label(bound)}"}}' in text


def test_rule_structure():
    groups = obs.rule_groups(SLO)
    assert [g["name"] for g in groups] == ["vllm-fleet-recording", "vllm-fleet-slo-alerts"]
    records = {r["record"]: r["expr"] for r in groups[0]["rules"]}
    alerts = {r["alert"]: r for r in groups[1]["rules"]}
    assert records["fleet:num_requests_waiting:sum"] == "sum(vllm:num_requests_waiting)"
    assert records["fleet:ttft_seconds:p99_30s"].startswith("histogram_quantile(0.99, sum by (le) (rate(vllm:time_")
    assert "vllm:request_time_per_output_token_seconds_bucket[30s]" in records["fleet:tpot_seconds:p99_30s"]
    burn = records["fleet:ttft_slo_burn_rate:5m"]
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.5"}[5m]' in burn and burn.endswith("/ 0.01")
    for w in obs.SRE_WINDOWS:  # each burn alert pairs its long and short window at its factor
        expr = alerts[f"VllmTTFTBudgetBurn{w.long}"]["expr"]
        assert expr == (f"fleet:ttft_slo_burn_rate:{w.long} > {w.factor:g} and "
                        f"fleet:ttft_slo_burn_rate:{w.short} > {w.factor:g}")
        assert alerts[f"VllmTTFTBudgetBurn{w.long}"]["labels"]["severity"] == w.severity
    assert alerts["VllmQueueBuilding"]["expr"].endswith("(vllm:num_requests_waiting) > 4")
    assert "vllm:kv_cache_usage_perc" in alerts["VllmKVCacheFull"]["expr"]
    assert "vllm:num_preemptions_total" in alerts["VllmPreempting"]["expr"]
    names = obs.exported_metric_names()
    for rule in groups[0]["rules"] + groups[1]["rules"]:
        used = obs.metric_names(rule["expr"])
        assert {u for u in used if not u.startswith("fleet:")} <= names, rule
        assert {u for u in used if u.startswith("fleet:")} <= set(records), rule  # alerts read recorded series


def test_a_target_between_buckets_uses_the_boundary_below():
    rules = obs.recording_rules(obs.FleetSLO(ttft_p99_ms=300, tpot_p99_ms=50))
    assert 'le="0.25"' in next(r["expr"] for r in rules if r["record"] == "fleet:ttft_slo_burn_rate:5m")


@pytest.mark.parametrize("kwargs, needle", [
    (dict(ttft_p99_ms=-1, tpot_p99_ms=50), "positive number of milliseconds"),
    (dict(ttft_p99_ms=500, tpot_p99_ms=50, queue_threshold=0), "at least 1"),
    (dict(ttft_p99_ms=500, tpot_p99_ms=50, objective=1.0), "share of good requests"),
])
def test_bad_slos_are_refused(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        obs.FleetSLO(**kwargs)


# -------------------------------------------------------------------------------------- promtool
def test_prometheus_config_scrapes_replicas_and_the_router_every_second():
    cfg = obs.prometheus_config(["127.0.0.1:8201", "127.0.0.1:8202"], router="127.0.0.1:29001")
    assert cfg["global"]["scrape_interval"] == "1s"
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in cfg["scrape_configs"]}
    assert jobs == {"vllm": ["127.0.0.1:8201", "127.0.0.1:8202"], "vllm-router": ["127.0.0.1:29001"]}
    with pytest.raises(ValueError, match="host:port"):
        obs.prometheus_config(["http://127.0.0.1:8201/metrics"])


def test_promtool_accepts_the_config_and_rules(tmp_path):
    files = obs.write_prometheus(tmp_path, ["127.0.0.1:8201", "127.0.0.1:8202"], "127.0.0.1:29001", SLO)
    results = obs.check_prometheus(files)
    assert all(r.ok for r in results), [r.output for r in results]
    assert "SUCCESS: 19 rules found" in results[1].output


def test_promtool_rejects_a_broken_rule(tmp_path):
    files = obs.write_prometheus(tmp_path, ["127.0.0.1:8201"], None, SLO)
    doc = yaml.safe_load(files.rules.read_text())
    doc["groups"][1]["rules"][0]["expr"] = "sum(vllm:num_requests_waiting"
    files.rules.write_text(yaml.safe_dump(doc))
    result = obs.promtool("check", "rules", str(files.rules))
    assert not result.ok and "unclosed left parenthesis" in result.output


def _alert(rule, instance=None):
    ann = {k: v.replace("{{ $labels.instance }}", instance or "") for k, v in rule["annotations"].items()}
    return {"exp_labels": {**rule["labels"], **({"instance": instance} if instance else {})}, "exp_annotations": ann}


def test_alerts_fire_when_they_should_and_not_before(tmp_path):
    """promtool's rule unit tests on synthetic series: 10% slow requests burn a 1% budget 10x (< 14.4, quiet);
    25% burn it 25x (pages). A queue of 6 on one replica fires after its `for`, not before."""
    windows = (obs.BurnWindow("5m", "1m", 14.4, "page", "0s"),)
    files = obs.write_prometheus(tmp_path, ["127.0.0.1:8201"], None, SLO, burn_windows=windows, queue_for="2m")
    rules = {r.get("alert"): r for g in yaml.safe_load(files.rules.read_text())["groups"] for r in g["rules"]}
    burn, queue = rules["VllmTTFTBudgetBurn5m"], rules["VllmQueueBuilding"]
    good = 'vllm:time_to_first_token_seconds_bucket{le="0.5",instance="a"}'
    count = 'vllm:time_to_first_token_seconds_count{instance="a"}'
    tests = {"rule_files": [files.rules.name], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [{"series": good, "values": "0+90x10"},
                                            {"series": count, "values": "0+100x10"}],
         "alert_rule_test": [{"eval_time": "10m", "alertname": "VllmTTFTBudgetBurn5m", "exp_alerts": []}]},
        {"interval": "1m", "input_series": [{"series": good, "values": "0+75x10"},
                                            {"series": count, "values": "0+100x10"}],
         "alert_rule_test": [{"eval_time": "10m", "alertname": "VllmTTFTBudgetBurn5m", "exp_alerts": [_alert(burn)]}]},
        {"interval": "1m", "input_series": [
            {"series": 'vllm:num_requests_waiting{instance="a"}', "values": "0 6 6 6 6"},
            {"series": 'vllm:num_requests_waiting{instance="b"}', "values": "0 1 1 1 1"}],
         "alert_rule_test": [{"eval_time": "2m", "alertname": "VllmQueueBuilding", "exp_alerts": []},
                             {"eval_time": "4m", "alertname": "VllmQueueBuilding",
                              "exp_alerts": [_alert(queue, "a")]}]},
    ]}
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = obs.promtool("test", "rules", str(test_file))
    assert result.ok, result.output
    # ... and the same harness fails when the expectation is wrong (the queue alert already firing at 2m)
    tests["tests"][2]["alert_rule_test"][0]["exp_alerts"] = [_alert(queue, "a")]
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert not obs.promtool("test", "rules", str(test_file)).ok


def test_missing_promtool_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(obs.shutil, "which", lambda name: None)
    with pytest.raises(obs.PromtoolMissing, match=r"apt-get install -y prometheus"):
        obs.promtool("--version")


# ------------------------------------------------------------------------------------- dashboard
def test_dashboard_round_trips_through_the_sdks_typed_model():
    board = obs.dashboard(SLO)
    data = obs.dashboard_json(board)
    again = obs.load_dashboard(json.dumps(data))
    assert type(again).__name__ == "Dashboard" and obs.dashboard_json(again) == data
    assert [p["title"] for p in data["panels"]] == [p.title for p in obs.panels(SLO)]
    names = obs.exported_metric_names()
    for panel in data["panels"]:
        assert panel["type"] == "timeseries" and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["expr"] and obs.metric_names(t["expr"]) <= names
    ttft = data["panels"][0]
    assert ttft["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.5
    assert ttft["fieldConfig"]["defaults"]["unit"] == "s"


# ------------------------------------------------------------------------------- offline charts
def test_query_range_frame_reads_prometheus_matrix_json():
    df = obs.query_range_frame(FIXTURES / "query_range_waiting.json")
    assert len(df) == 9 and set(df["instance"]) == {"127.0.0.1:8201", "127.0.0.1:8202"}
    assert str(df["time"].dt.tz) == "UTC" and df["time"].min() == pd.Timestamp(1764580000, unit="s", tz="UTC")
    a = df[df["instance"] == "127.0.0.1:8201"]
    assert a["value"].tolist() == [0, 2, 6, 17, 12, 4] and df["series"].iloc[0] == "instance=127.0.0.1:8201"
    ttft = obs.query_range_frame((FIXTURES / "query_range_ttft_p99.json").read_text())
    assert ttft["value"].isna().sum() == 1 and ttft["value"].iloc[4] == float("inf")
    assert set(ttft["series"]) == {"value"}


@pytest.mark.parametrize("payload, needle", [
    ({"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}, "bad_data parse error"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "use /api/v1/query_range"),
])
def test_query_range_frame_refuses_errors_and_instant_queries(payload, needle):
    with pytest.raises(ValueError, match=needle):
        obs.query_range_frame(payload)


def test_panels_draw_offline_from_query_range_results():
    specs = {p.title: p for p in obs.panels(SLO)}
    waiting, ttft = specs["Requests waiting per replica"], specs["TTFT p50 / p99 vs target"]
    results = {waiting.queries[0].expr: json.loads((FIXTURES / "query_range_waiting.json").read_text()),
               ttft.queries[1].expr: json.loads((FIXTURES / "query_range_ttft_p99.json").read_text())}
    frame = obs.panel_frame(waiting, results)
    assert set(frame["legend"]) == {"127.0.0.1:8201", "127.0.0.1:8202"}
    chart = obs.panel_chart(waiting, frame).to_dict()
    assert chart["title"] == "Requests waiting per replica" and len(chart["layer"]) == 2
    rule_data = chart["datasets"][chart["layer"][1]["data"]["name"]]
    assert rule_data == [{"target": 4.0}]
    with pytest.raises(KeyError, match="no query_range result"):
        obs.panel_frame(ttft, results)  # its p50 query has no result
    grid = obs.dashboard_charts(obs.panels(SLO), results).to_dict()
    assert [c["title"] for c in grid["concat"]] == ["Requests waiting per replica"]


def test_panel_summary_quotes_each_line_of_the_panels_with_data():
    specs = {p.title: p for p in obs.panels(SLO)}
    waiting = specs["Requests waiting per replica"]
    payload = json.loads((FIXTURES / "query_range_waiting.json").read_text())
    table = obs.panel_summary(obs.panels(SLO), {waiting.queries[0].expr: payload}).set_index("line")
    assert list(table["panel"].unique()) == ["Requests waiting per replica"]   # the panels without data are left out
    a = obs.query_range_frame(payload)
    a = a[a["instance"] == "127.0.0.1:8201"]["value"]
    row = table.loc["127.0.0.1:8201"]
    assert (row["peak"], row["last"], row["samples"]) == (a.max(), a.iloc[-1], len(a))
    assert row["mean"] == pytest.approx(a.mean()) and row["target"] == 4.0
