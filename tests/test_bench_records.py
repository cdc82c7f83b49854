"""Unit tests of the benchmark's definitions, on hand-built timings and byte streams (no server, fast): metrics,
windows, the two goodputs, the verdict on the client, arrivals, how load is split over workers."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from helpers.bench import (SLO, ClientLimits, Concurrent, ConstantRate, LoopHealth, Poisson, Ramp, Steps, RequestResult,
                           StreamParser, Timings, bootstrap_quantile, chunk_gaps, choose_workers, compare, goodput,
                           itl_values, make_arrivals, pooled_itl_median, quantile_with_ci, steady_state_window,
                           summarize, tracking, wilson_interval)
from helpers.bench.health import client_report, judge
from helpers.bench.records import Request
from helpers.bench.runner import STREAM_CHUNKS_PER_S, WORKER_CHUNKS_PER_S
from helpers.bench.workers import deal, split_evenly


def result(rid="0", dispatch=10.0, chunks=((10.1, 1), (10.2, 1)), ok=True, scheduled=None, warmup=False,
           output_tokens=None, **kw) -> RequestResult:
    times = [t for t, _ in chunks]
    toks = [k for _, k in chunks]
    t = Timings(t_scheduled=dispatch if scheduled is None else scheduled, t_dispatched=dispatch,
                t_first_token=times[0] if times else None, t_end=times[-1] if times and ok else dispatch + 1,
                chunk_times=times, chunk_tokens=toks)
    n = sum(toks) if output_tokens is None else output_tokens
    return RequestResult(id=rid, timings=t, ok=ok, output_tokens=n, input_tokens=kw.pop("input_tokens", 10),
                         http_status=200 if ok else 500, error=None if ok else "boom", warmup=warmup, **kw)


# ------------------------------------------------------------------------------ metric definitions
def test_ttft_e2e_tpot_definitions():
    r = result(dispatch=1.0, chunks=((1.25, 1), (1.35, 1), (1.45, 1), (1.55, 1)))
    assert r.ttft_ms == pytest.approx(250.0)
    assert r.e2e_ms == pytest.approx(550.0)
    assert r.tpot_ms == pytest.approx(100.0)  # (550 - 250) / (4 - 1)
    assert r.itl_ms == pytest.approx([100.0, 100.0, 100.0])


def test_multi_token_chunks_split_the_gap_and_keep_the_identities():
    # first chunk carries 2 tokens, then a chunk of 3 tokens after 90 ms, then 1 token after 30 ms
    r = result(dispatch=0.0, chunks=((0.2, 2), (0.29, 3), (0.32, 1)))
    assert r.n_output == 6
    itl = r.itl_ms
    assert len(itl) == r.n_output - 1
    assert itl == pytest.approx([0.0, 30.0, 30.0, 30.0, 30.0])  # extra first-chunk token: 0; 90/3 three times
    assert sum(itl) == pytest.approx(r.e2e_ms - r.ttft_ms)
    assert np.mean(itl) == pytest.approx(r.tpot_ms)
    # a per-chunk ITL (vLLM bench serve's) would report two gaps of 90 and 30 ms instead
    assert itl_values([0.2, 0.29, 0.32], [2, 3, 1]) == pytest.approx([0.0, 0.03, 0.03, 0.03, 0.03])


def test_single_token_output_has_no_tpot_and_failures_no_e2e():
    one = result(chunks=((10.3, 1),))
    assert one.ttft_ms == pytest.approx(300.0) and one.tpot_ms is None and one.itl_ms == []
    failed = result(ok=False, chunks=((10.3, 1), (10.4, 1)))
    assert failed.ttft_ms == pytest.approx(300.0)  # seen before the failure
    assert failed.e2e_ms is None and failed.tpot_ms is None and failed.itl_ms == []


def test_client_queue_time_is_separate_from_ttft():
    r = result(scheduled=9.5, dispatch=10.0, chunks=((10.1, 1), (10.2, 1)))
    assert r.client_queue_ms == pytest.approx(500.0)
    assert r.ttft_ms == pytest.approx(100.0)


def test_record_roundtrip_through_json():
    r = result(chunks=((10.1, 2), (10.2, 1)), expected_input_tokens=10, max_output_tokens=3, min_output_tokens=3)
    back = RequestResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    assert back.to_dict()["derived"]["tpot_ms"] == pytest.approx(r.tpot_ms)


def test_request_validation_says_what_to_do():
    with pytest.raises(ValueError, match="exactly one of prompt"):
        Request(id="x")
    assert Request(id="x", messages=[{"role": "user", "content": "hi"}]).endpoint == "chat"


# ------------------------------------------------------------------------------------ stream parser
def sse(*objs) -> bytes:
    out = b""
    for o in objs:
        out += b"data: " + (o.encode() if isinstance(o, str) else json.dumps(o).encode()) + b"\n\n"
    return out


def chat_chunk(content=None, role=None, completion=None, prompt=33, finish=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    d = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if completion is not None:
        d["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return d


def test_role_chunk_is_not_the_first_token_and_usage_deltas_count_tokens():
    p = StreamParser()
    p.feed(sse(chat_chunk("", role="assistant", completion=0)), 1.0)  # vLLM's role-only chunk
    p.feed(sse(chat_chunk("I", completion=1)), 1.2)
    p.feed(sse(chat_chunk(" am here", completion=4)), 1.3)  # 3 tokens in one chunk (speculative decoding)
    p.feed(sse(chat_chunk("", completion=4)), 1.35)  # an empty chunk adds nothing
    p.feed(sse(chat_chunk(".", completion=5, finish="length")), 1.4)
    p.feed(sse({"choices": [], "usage": {"prompt_tokens": 33, "completion_tokens": 5, "total_tokens": 38}}), 1.41)
    p.feed(sse("[DONE]"), 1.42)
    assert p.chunk_times == [1.2, 1.3, 1.4]
    assert p.chunk_tokens == [1, 3, 1]
    assert p.exact and p.done and p.finish_reason == "length"
    assert p.prompt_tokens == 33 and p.completion_tokens == 5


def test_events_split_across_reads_and_several_per_read():
    data = sse({"choices": [{"text": "a"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
               {"choices": [{"text": "bc"}], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}, "[DONE]")
    p = StreamParser()
    cut = len(data) // 3
    p.feed(data[:cut], 1.0)
    p.feed(data[cut:], 2.0)
    assert p.chunk_tokens == [1, 2] and p.done
    assert p.chunk_times[-1] == 2.0  # the event completed by the second read has its time


def test_without_continuous_usage_each_nonempty_chunk_counts_one_and_is_flagged():
    p = StreamParser()
    p.feed(sse(chat_chunk("", role="assistant")), 1.0)
    p.feed(sse(chat_chunk("ab")), 1.1)
    p.feed(sse(chat_chunk("cd")), 1.2)
    p.feed(sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}), 1.3)
    p.feed(sse("[DONE]"), 1.3)
    assert p.chunk_tokens == [1, 1] and not p.exact
    assert p.completion_tokens == 4  # the final usage still gives the true count


def test_error_event_and_sse_details():
    p = StreamParser()
    p.feed(b": keep-alive\n\nevent: message\ndata:{\"error\": {\"message\": \"engine dead\"}}\r\n\r\n", 1.0)
    assert p.error == "engine dead" and not p.done
    q = StreamParser()
    q.feed(b'data: {"choices":[{"text":"x"}]}', 1.0)  # no trailing blank line
    q.close(1.5)
    assert q.chunk_tokens == [1]


# ------------------------------------------------------------------------------ window, throughput
def steady_records(n=20, gap=1.0, e2e=2.5, tokens=10):
    """Request i dispatched at i*gap; first token after 0.5 s; `tokens` one-token chunks until e2e."""
    recs = []
    for i in range(n):
        d = i * gap
        times = np.linspace(d + 0.5, d + e2e, tokens)
        recs.append(result(rid=str(i), dispatch=d, chunks=[(float(t), 1) for t in times]))
    return recs


def test_steady_state_window_excludes_ramp_up_and_drain():
    recs = steady_records()
    w = steady_state_window(recs)
    assert w.method == "steady-state"
    assert (w.start, w.end) == pytest.approx((2.5, 19.0))  # first dispatch + median E2E .. last dispatch
    s = summarize(recs)
    assert s.duration_s == pytest.approx(16.5)
    assert s.total_duration_s == pytest.approx(21.5)
    ends_inside = sum(1 for r in recs if 2.5 <= r.timings.t_end <= 19.0)  # requests 0..16
    assert s.request_throughput == pytest.approx(ends_inside / 16.5)
    toks = sum(1 for r in recs for t in r.timings.chunk_times if 2.5 <= t <= 19.0)
    assert s.output_throughput == pytest.approx(toks / 16.5)
    # 1 request/s at 10 tokens each: the window measures the true rates, the whole span does not
    assert s.request_throughput == pytest.approx(1.0, rel=0.07)
    assert s.output_throughput == pytest.approx(10.0, rel=0.07)
    assert s.total_output_throughput < 0.95 * 10.0


def test_tracking_compares_completions_with_the_arrivals_one_e2e_earlier():
    """Random arrivals, a server that keeps up (every request 2.5 s): tracking is 1 however the arrivals clump,
    where the window's throughput over the whole run's arrival rate is not."""
    new, mixed = [], []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        dispatch, e2e = np.cumsum(rng.exponential(1.0, 20)), rng.uniform(2.45, 2.55, 20)
        recs = [result(rid=str(i), dispatch=float(d), chunks=[(float(d) + 0.5, 1), (float(d + e), 1)])
                for i, (d, e) in enumerate(zip(dispatch, e2e))]
        s = summarize(recs)
        assert s.window.method == "steady-state"
        new.append(tracking(recs))
        mixed.append(s.request_throughput / s.achieved_rate)  # the window's throughput over the whole run's rate
    assert max(abs(t - 1.0) for t in new) < 0.07  # within one request of a window's ~15
    assert max(abs(t - 1.0) for t in mixed) > 0.15

    # a FIFO server finishing one request every 2 s against arrivals every 1 s: it keeps up with half the load
    queued, free = [], 0.0
    for i in range(40):
        start = max(float(i), free)
        free = start + 2.0
        queued.append(result(rid=str(i), dispatch=float(i), chunks=[(start + 1.0, 1), (free, 1)]))
    assert 0.4 < tracking(queued) < 0.6
    assert tracking([]) is None


def test_short_runs_fall_back_to_the_whole_span_with_a_note():
    recs = steady_records(n=5)
    w = steady_state_window(recs)
    assert w.method == "whole-span" and "too short" in w.note
    assert (w.start, w.end) == pytest.approx((0.0, 6.5))
    s = summarize(recs)
    assert any("throughput window" in x for x in s.warnings)


def test_closed_loop_wave_is_not_counted_per_second_of_a_short_window():
    """Closed loop, 16 in flight, 32 requests of 6 s: the second wave is dispatched as the first ends, so
    [first dispatch + median E2E, last dispatch] is a sliver holding the whole first wave. Counting those
    16 completions per second of the sliver would report ~30 req/s for a server doing 16 / 6 s = 2.7."""
    recs = []
    for i in range(16):
        d = i * 0.01
        recs.append(result(rid=f"a{i}", dispatch=d, chunks=[(d + 0.5, 1), (d + 6.0, 1)]))
        d2 = d + 6.0
        recs.append(result(rid=f"b{i}", dispatch=d2, chunks=[(d2 + 0.5, 1), (d2 + 6.0, 1)]))
    w = steady_state_window(recs)
    assert w.method == "whole-span" and "one median E2E" in w.note
    s = summarize(recs)
    assert s.request_throughput == pytest.approx(32 / 12.15, rel=0.01)


def test_pooled_itl_median_resamples_whole_requests():
    """Two fast requests (10 ms gaps) and two slow ones (30 ms): the pooled median sits between, and the CI spans
    most of the gap because whole requests, not tokens, are resampled."""
    recs = [result(rid=str(i), dispatch=0.0, chunks=[(0.1 + k * g, 1) for k in range(21)])
            for i, g in enumerate((0.010, 0.010, 0.030, 0.030))]
    med, (lo, hi) = pooled_itl_median(recs)
    assert med == pytest.approx(20.0) and lo == pytest.approx(10.0) and hi == pytest.approx(30.0)
    assert pooled_itl_median(recs[:1]) == (pytest.approx(10.0), None)
    with pytest.raises(ValueError, match="at least two output tokens"):
        pooled_itl_median([result(chunks=[(0.1, 1)])])


def test_warmup_is_excluded_and_failures_sit_next_to_percentiles():
    recs = steady_records(n=12)
    recs[3] = result(rid="3", dispatch=3.0, ok=False, chunks=())
    recs.append(result(rid="w", dispatch=-5.0, warmup=True, chunks=((-4.0, 1), (-3.0, 1))))
    s = summarize(recs)
    assert s.completed == 11 and s.failed == 1 and s.errors == {"HTTP 500: boom": 1}
    assert s.ttft_ms.count == 11
    assert s.client_queue_ms.count == 12  # failed requests waited too
    assert "1 failed" in s.table()
    d = s.as_dict()
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "client_queue_ms"):
        assert {"mean", "p50", "p90", "p95", "p99", "count", "std", "min", "max", "p50_ci", "p99_ci"} <= set(d[m])
    json.dumps(d)


def test_token_count_mismatch_is_a_warning_with_both_counts():
    recs = steady_records(n=12)
    for r in recs:
        r.expected_input_tokens = 12
    s = summarize(recs)
    assert s.input_tokens["mismatched"] == 12
    assert any("expected 12, server counted 10" in w for w in s.warnings)


# ---------------------------------------------------------------------------------------- goodput
def test_goodput_counts_requests_meeting_every_set_slo_in_the_window():
    recs = steady_records()
    for i, r in enumerate(recs):  # make TTFT 100 ms for even requests, 500 ms for odd ones
        shift = 0.1 if i % 2 == 0 else 0.5
        r.timings.chunk_times[0] = r.timings.t_dispatched + shift
        r.timings.t_first_token = r.timings.chunk_times[0]
    g = goodput(recs, SLO(ttft_ms=200))
    inside = [r for r in recs if 2.5 <= r.timings.t_end <= 19.0 and r.ttft_ms <= 200]
    assert g.good == 10 and g.good_in_window == len(inside)
    assert g.goodput_rps == pytest.approx(len(inside) / 16.5)
    assert g.fraction_good == pytest.approx(0.5)
    assert goodput(recs, SLO(ttft_ms=1000, e2e_ms=100)).good == 0  # both bounds must hold
    assert SLO(tpot_ms=1).met(result(chunks=((10.1, 1),)))  # no TPOT with one token: bound not violated


# --------------------------------------------------------------------------------------- bootstrap
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_order_statistic_bootstrap_matches_brute_force_resampling(q):
    x = np.random.default_rng(1).lognormal(3, 0.5, size=300)
    fast = bootstrap_quantile(x, q, n_boot=20000, seed=2)
    rng = np.random.default_rng(3)
    brute = np.quantile(x[rng.integers(0, len(x), size=(4000, len(x)))], q, axis=1)
    assert fast.mean() == pytest.approx(brute.mean(), rel=0.01)
    assert fast.std() == pytest.approx(brute.std(), rel=0.1)
    np.testing.assert_array_equal(fast, bootstrap_quantile(x, q, n_boot=20000, seed=2))  # seeded


def test_compare_tells_a_real_difference_from_noise():
    rng = np.random.default_rng(0)

    def fake_run(values):
        return types.SimpleNamespace(records=[result(rid=str(i), dispatch=0.0, chunks=((v / 1000, 1), (v / 1000 + 0.01, 1)))
                                              for i, v in enumerate(values)])

    a = fake_run(rng.normal(100, 10, 400))
    a2 = fake_run(rng.normal(100, 10, 400))
    b = fake_run(rng.normal(115, 10, 400))
    assert compare(a, b, "ttft", 0.5).differ
    same = compare(a, a2, "ttft", 0.5)
    assert not same.differ and same.ci[0] < 0 < same.ci[1]
    assert "p50" in str(same)


# ----------------------------------------------------------------------------------------- profiles
def test_poisson_is_seeded_with_the_right_rate_and_constant_is_even():
    a, b = Poisson(rate=50, seed=3).offsets(5000), Poisson(rate=50, seed=3).offsets(5000)
    assert a == b and a[0] == 0.0
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() == pytest.approx(1 / 50, rel=0.1)  # exponential: std == mean
    assert Poisson(rate=50, seed=4).offsets(10) != a[:10]
    assert ConstantRate(rate=4).offsets(3) == [0.0, 0.25, 0.5]
    assert Concurrent(4).offsets(3) is None and Concurrent(4).concurrency == 4
    assert make_arrivals("poisson", rate=2, seed=1).cli_args() == ["--arrivals", "poisson", "--rate", "2",
                                                                  "--arrival-seed", "1"]
    with pytest.raises(ValueError, match="need a rate"):
        make_arrivals("constant")
    assert math.isclose(Poisson(rate=2).offsets(2)[1], Poisson(rate=2).offsets(3)[1])


# ------------------------------------------------------------------------- ITL per chunk, windowed latencies
def test_itl_per_chunk_is_one_gap_per_chunk_after_the_first():
    r = result(dispatch=0.0, chunks=((0.2, 2), (0.29, 3), (0.32, 1)))
    assert r.itl_per_chunk_ms == pytest.approx([90.0, 30.0])  # vllm bench serve's ITL: per chunk, whatever it carried
    assert r.itl_ms == pytest.approx([0.0, 30.0, 30.0, 30.0, 30.0])  # ours: per token
    assert chunk_gaps([1.0, 1.5, 1.75]) == pytest.approx([0.5, 0.25])
    assert result(ok=False, chunks=((10.3, 1), (10.4, 1))).itl_per_chunk_ms == []
    s = summarize([r])
    assert s.itl_per_chunk_ms.count == 2 and s.itl_ms.count == 5
    assert s.as_dict()["itl_per_chunk_ms"]["count"] == 2


def ramped_records(n=40, ramp=5):
    """1 request/s of ~6 s each; the first `ramp` requests (while the server fills up, within the first median E2E)
    have TTFT 900 ms, the rest 100 ms."""
    recs = []
    for i in range(n):
        ttft = 0.9 if i < ramp else 0.1
        recs.append(result(rid=str(i), dispatch=float(i), chunks=[(i + ttft, 1), (i + ttft + 6.0, 1)]))
    return recs


def test_latencies_count_the_requests_dispatched_in_the_steady_state_window():
    recs = ramped_records()
    s = summarize(recs)
    w = s.window
    assert w.method == "steady-state"
    inside = [r for r in recs if w.start <= r.timings.t_dispatched <= w.end]
    assert s.ttft_ms.count == len(inside) < len(recs)
    assert s.ttft_ms.max == pytest.approx(100.0)  # ramp-up excluded: none of the 900 ms requests
    assert s.whole_run.ttft_ms.count == len(recs) and s.whole_run.ttft_ms.max == pytest.approx(900.0)
    assert f"the {len(inside)} of {len(recs)} requests dispatched in the steady-state window" in s.latency_scope
    assert "latencies:" in s.table()
    d = s.as_dict()
    assert d["whole_run"]["ttft_ms"]["count"] == len(recs) and d["ttft_ms"]["count"] == len(inside)
    json.dumps(d)
    assert compare(recs, recs).n_a == len(inside)  # compare uses the same requests as the summary
    assert compare(recs, recs, whole_run=True).n_a == len(recs)


def test_short_runs_keep_their_percentiles_over_every_request_and_say_so():
    recs = steady_records(n=5)
    s = summarize(recs)
    assert s.window.method == "whole-span"
    assert s.ttft_ms.count == s.whole_run.ttft_ms.count == 5 and s.ttft_ms.p99 is not None
    assert "the window fell back to the whole span" in s.latency_scope


# ----------------------------------------------------------------------------- the two goodputs
def test_goodput_at_load_and_attainment_with_its_interval():
    recs = ramped_records()
    g = goodput(recs, SLO(ttft_ms=200))
    assert g.goodput_at_load == g.goodput_rps
    judged = [r for r in recs if summarize(recs).window.contains(r.timings.t_dispatched)]
    assert g.attainment == pytest.approx(1.0) and g.attainment_n == len(judged)  # ramp-up excluded
    assert g.fraction_good == pytest.approx(35 / 40)  # over every request
    lo, hi = g.attainment_ci
    assert lo < 1.0 == hi
    s = summarize(recs, slo=SLO(ttft_ms=200))
    assert s.goodput is s.goodput_at_load  # the older name
    d = s.as_dict()
    assert d["goodput"] == d["goodput_at_load"] and d["goodput_at_load"]["attainment"] == pytest.approx(1.0)


def test_wilson_interval_matches_known_values():
    lo, hi = wilson_interval(9, 10)
    assert (lo, hi) == (pytest.approx(0.5958, abs=1e-3), pytest.approx(0.9821, abs=1e-3))
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) is None
    value, ci = quantile_with_ci(list(range(1, 101)), 0.5)
    assert value == pytest.approx(50.5) and ci[0] < 50.5 < ci[1]


# ------------------------------------------------------------------------------ the client's health
def loop(worker=0, lag_p99=1.0, slip_p99=1.0, cpu=0.2, wall=10.0):
    return LoopHealth(worker=worker, requests=100, chunks=1000, cpu_s=cpu * wall, wall_s=wall, lag_samples=100,
                      lag_p99_ms=lag_p99, slip_samples=100, slip_p99_ms=slip_p99)


def test_the_client_is_judged_against_limits_that_follow_the_measured_latency():
    assert judge([loop()], ttft_p50_ms=50.0) is None
    why = judge([loop(lag_p99=25.0)], ttft_p50_ms=50.0)
    assert "event loop lagged (p99 25.0 ms > 10.0 ms)" in why and "busy with something else" in why
    assert judge([loop(lag_p99=25.0)], ttft_p50_ms=2000.0) is None  # 25 ms next to a 2 s TTFT: within 5%
    why = judge([loop(), loop(worker=1, slip_p99=40.0, cpu=0.97)], ttft_p50_ms=50.0)
    assert "worker 1 sent late" in why and "worker 1 used 97% of a core" in why and "more client processes" in why
    assert "worker 0" not in why
    assert judge([loop(lag_p99=5.0)], 50.0, ClientLimits(lag_p99_ms=2.0)) is not None
    rep = client_report([loop(lag_p99=3.0), loop(worker=1, lag_p99=7.0, cpu=0.5)], requests=200)
    assert rep["workers"] == 2 and rep["loop_lag_p99_ms"] == 7.0 and rep["cpu_utilization"] == pytest.approx(0.5)
    assert rep["chunk_rate"] == pytest.approx(200.0) and len(rep["per_worker"]) == 2


def test_an_invalid_summary_says_so_first():
    s = summarize(steady_records())
    assert s.valid and s.invalid_reason is None
    s.mark_invalid("the client was the bottleneck: test")
    assert not s.valid and s.table().startswith("INVALID RUN: the client was the bottleneck: test")
    assert s.as_dict()["valid"] is False and s.as_dict()["invalid_reason"].endswith("test")


# ----------------------------------------------------------------------------------- arrivals, workers
def test_ramp_arrivals_rise_linearly_and_are_seeded():
    ramp = Ramp(start_rate=2.0, end_rate=20.0, duration_s=100.0, seed=1)
    n = ramp.count_for(100.0)
    assert n == 1100  # (2 + 20) / 2 x 100
    t = np.asarray(ramp.offsets(n))
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and t[-1] == pytest.approx(100.0, rel=0.05)
    first, last = np.sum(t < 10), np.sum((t >= 90) & (t < 100))  # expected 29 and 191 arrivals
    assert 15 < first < 45 and 160 < last < 225
    assert ramp.offsets(50) == Ramp(2.0, 20.0, 100.0, seed=1).offsets(50)
    assert ramp.rate_at(50.0) == pytest.approx(11.0) and ramp.peak_rate == 20.0
    assert ramp.cli_args() == ["--arrivals", "ramp", "--rate", "2", "--end-rate", "20", "--ramp-duration", "100",
                               "--arrival-seed", "1"]
    assert make_arrivals("ramp", rate=2, end_rate=20, ramp_duration_s=100, seed=1) == ramp
    assert Poisson(rate=8).count_for(30) == 240 and ConstantRate(rate=2.5).count_for(2) == 5
    with pytest.raises(ValueError, match="--end-rate"):
        make_arrivals("ramp", rate=1)


def test_step_arrivals_keep_each_phase_rate_and_exact_boundaries():
    steps = Steps(((50.0, 2.0), (20.0, 10.0), (50.0, 2.0)), seed=3)
    n = steps.count_for(120.0)
    assert n == 400 and steps.duration_s == 120.0 and steps.boundaries() == [0.0, 50.0, 70.0]
    t = np.asarray(steps.offsets(n))
    assert np.all(np.diff(t) >= 0) and t[-1] == pytest.approx(120.0, abs=35)  # 3 sd of 400 gaps at 2/s
    calm, burst = np.sum(t < 50), np.sum((t >= 50) & (t < 70))      # expected 100 and 200
    assert 70 < calm < 130 and 160 < burst < 240
    assert steps.rate_at(60.0) == 10.0 and steps.rate_at(500.0) == 2.0 and steps.peak_rate == 10.0
    assert steps.offsets(30) == Steps(((50.0, 2.0), (20.0, 10.0), (50.0, 2.0)), seed=3).offsets(30)
    assert Steps(((5.0, 0.0), (5.0, 4.0))).offsets(10)[0] >= 5.0   # a silent phase sends nothing
    assert steps.cli_args() is None
    with pytest.raises(ValueError, match="last rate"):
        Steps(((5.0, 1.0), (5.0, 0.0)))


def test_auto_workers_follow_the_expected_chunk_rate_and_stop_at_the_cores():
    reqs = [Request(id=str(i), prompt="x", max_output_tokens=100) for i in range(10)]
    per = WORKER_CHUNKS_PER_S
    n, why = choose_workers("auto", Poisson(rate=per / 100 * 2.5), reqs, 8, cores=16)
    assert n == 3 and why["needed"] == 3 and why["expected_chunks_per_s"] == pytest.approx(per * 2.5)
    n, why = choose_workers("auto", Poisson(rate=per / 100 * 2.5), reqs, 8, cores=2)
    assert n == 2 and "capped at 2 cores" in why["why"]
    n, why = choose_workers("auto", Concurrent(64), reqs, 64, cores=64)
    assert n == math.ceil(64 * STREAM_CHUNKS_PER_S / per) and "rule" in why["why"]
    assert choose_workers("auto", Poisson(rate=1), reqs, 8, cores=4)[0] == 1
    assert choose_workers(3, Poisson(rate=1), reqs, 8, cores=2) == (3, {"requested": 3, "used": 3, "cores": 2,
                                                                     "why": "3 as asked (more than the 2 cores this "
                                                                            "process may use)"})
    with pytest.raises(ValueError, match="workers must be"):
        choose_workers(0, Poisson(rate=1), reqs, 8)


def test_one_schedule_dealt_round_robin():
    reqs = [Request(id=str(i), prompt="x", send_offset_s=i * 0.1) for i in range(7)]
    parts = deal(reqs, 3)
    assert [[r.id for r in p] for p in parts] == [["0", "3", "6"], ["1", "4"], ["2", "5"]]
    assert split_evenly(10, 3) == [4, 3, 3] and sum(split_evenly(7, 4)) == 7


def test_one_bootstrap_resamples_numbers_clusters_and_independent_samples():
    """bench.stats.bootstrap_ci is the project's one resampler (evals' intervals, the ITL median's, the
    side-by-side's ratio): its interval covers the statistic, a cluster bootstrap is wider than treating a
    cluster's correlated values as independent, and each sample is resampled on its own."""
    from helpers.bench.stats import bootstrap_ci

    rng = np.random.default_rng(3)
    x = rng.normal(10.0, 1.0, 200)
    lo, hi = bootstrap_ci([x], np.mean)
    assert lo < x.mean() < hi and hi - lo < 0.5
    # 20 clusters of 50 values sharing their cluster's offset: the values are not independent
    clusters = [rng.normal(0.0, 1.0) + rng.normal(0.0, 0.1, 50) for _ in range(20)]
    c_lo, c_hi = bootstrap_ci([clusters], np.mean)
    flat_lo, flat_hi = bootstrap_ci([np.concatenate(clusters)], np.mean)
    assert c_hi - c_lo > 4 * (flat_hi - flat_lo)
    # two independent samples: the ratio of their means, each resampled within itself
    a, b = rng.normal(100.0, 5.0, 300), rng.normal(120.0, 5.0, 300)
    r_lo, r_hi = bootstrap_ci([a, b], lambda xa, xb: xb.mean() / xa.mean())
    assert r_lo < b.mean() / a.mean() < r_hi and r_lo > 1.15
    assert bootstrap_ci([[1.0]], np.mean) is None and bootstrap_ci([x, [2.0]], lambda p, q: 0.0) is None
