"""Sweeps and the search for the highest rate that meets an SLO."""

from __future__ import annotations

import types

import pytest

from helpers import bench
from helpers.bench import SLO, CalibrationServer, FromJsonl, WorkloadSpec, find_max_rate, sweep


def fake_runner(capacity: float, calls: list):
    """A stand-in for bench.run: p99 TTFT is 50 ms up to `capacity` req/s, then it explodes (queueing)."""

    def runner(workload, arrivals, *, num_requests, seed, out, slo, label, **kw):
        calls.append((arrivals.rate, num_requests, seed))
        p99 = 50.0 if arrivals.rate <= capacity else 50.0 * (1 + 10 * (arrivals.rate - capacity))
        summary = types.SimpleNamespace(ttft_ms=types.SimpleNamespace(p99=p99), failure_rate=0.0,
                                        client_queue_ms=types.SimpleNamespace(p99=0.5))
        return types.SimpleNamespace(summary=summary, records=[])

    return runner


def test_find_max_rate_brackets_then_bisects():
    calls: list = []
    res = find_max_rate(WorkloadSpec(), SLO(ttft_ms=200), start_rate=1.0, rel_tol=0.05, max_runs=12,
                        duration_s=10, runner=fake_runner(13.0, calls), out=False)
    rates = [c[0] for c in calls]
    assert rates[:5] == [1, 2, 4, 8, 16]  # doubling until the first failure
    assert 13.0 * 0.95 <= res.rate <= 13.0
    lo, hi = res.bracket
    assert lo == res.rate and hi > 13.0 and (hi - lo) / lo <= 0.05
    assert len({c[2] for c in calls}) == len(calls)  # each probe has its own prompts
    assert all(n >= 30 for _, n, _ in calls)  # min_requests
    assert "max rate" in str(res) and len(res.df) == len(calls)


def test_find_max_rate_halves_when_the_start_fails_and_needs_a_bound():
    calls: list = []
    res = find_max_rate(WorkloadSpec(), SLO(ttft_ms=200), start_rate=8.0, max_runs=6,
                        runner=fake_runner(1.5, calls), out=False)
    assert [c[0] for c in calls][:3] == [8.0, 4.0, 2.0]
    # p99 = 50 * (1 + 10 * (rate - 1.5)) stays within 200 ms up to 1.8 req/s
    assert res.rate is not None and 1.5 <= res.rate <= 1.8
    with pytest.raises(ValueError, match="no bound for 'tpot'"):
        find_max_rate(WorkloadSpec(), SLO(ttft_ms=200), metric="tpot", runner=fake_runner(1, []))


def test_sweep_against_a_saturating_server(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "prompt number {i}", "output_len": 6}}\n' for i in range(200)))
    spec = FromJsonl(prompts, endpoint="completions", tokenizer=False)
    # 2 requests at a time, 60 ms each: capacity ~33 req/s; beyond it requests queue in the server
    with CalibrationServer(ttft_s=0.02, tpot_s=0.008, max_concurrency=2) as cal:
        sw = sweep(spec, rates=[10, 60], num_requests=30, base_url=cal.base_url, out=tmp_path / "sweep",
                   progress=False, sample_interval_s=0.2)
    low, high = sw.runs
    assert low.summary.completed == high.summary.completed == 30
    assert low.summary.ttft_ms.p50 < 40 < high.summary.ttft_ms.p99  # the knee: queueing shows in TTFT
    assert high.summary.server.num_requests_waiting_max >= 1
    assert high.summary.server.queue_mean_ms > low.summary.server.queue_mean_ms
    assert (tmp_path / "sweep" / "rate-60" / "summary.json").is_file()
    df = sw.df
    assert list(df["rate"]) == [10, 60] and {"ttft_p99_ms", "output_throughput"} <= set(df.columns)
    spec_dict = sw.chart().to_dict()
    assert sum(len(v) for v in spec_dict["datasets"].values()) == 2 * 2 * 2  # runs x metrics x quantiles
    with pytest.raises(TypeError, match="WorkloadSpec"):
        sweep(spec.build(3), rates=[1], base_url=cal.base_url)
    assert bench.charts.timeline(high).to_dict()["vconcat"]  # gauges drawn under the bars
