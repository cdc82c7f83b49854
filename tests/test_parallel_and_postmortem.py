"""Lab 18's link arithmetic (checked against a second formula and against this machine's own all-reduce), lab 23's
postmortem pieces (the fluid queue against its closed form), and the random-weight models labs 18-19 serve."""

import json
import math
from types import SimpleNamespace

import pytest

from helpers import bench, models, sizing
from helpers.fleet import postmortem
from helpers.sizing import parallel


def test_allreduce_time_matches_the_ring_written_out_step_by_step():
    # A ring all-reduce is n-1 reduce-scatter steps and n-1 all-gather steps, each moving S/n bytes per rank.
    link = parallel.Link("x", bandwidth=10e9, latency=3e-6)
    for ranks in (2, 4, 8):
        size = 64 << 20
        by_steps = sum(size / ranks / link.bandwidth + link.latency for _ in range(2 * (ranks - 1)))
        assert parallel.allreduce_time(size, ranks, link) == pytest.approx(by_steps)
    assert parallel.allreduce_time(size, 1, link) == 0.0
    with pytest.raises(ValueError):
        parallel.allreduce_time(-1, 2, link)


def test_tp_communication_scales_with_layers_hidden_and_tokens():
    cfg = sizing.load_config("llama-3.1-8b")
    nv, pcie = parallel.LINKS["nvlink4"], parallel.LINKS["pcie4"]
    one = parallel.tp_comm_per_step(cfg, 1, 2, pcie)
    # 2 all-reduces x 32 layers of 1 x 4096 bf16 activations: latency-bound at one token.
    assert one == pytest.approx(2 * 32 * parallel.allreduce_time(4096 * 2, 2, pcie))
    big = parallel.tp_comm_per_step(cfg, 4096, 2, pcie)
    assert big > 30 * one  # a prefill's all-reduce is bandwidth-bound: ~50x one token's on PCIe 4
    assert parallel.tp_comm_per_step(cfg, 4096, 2, nv) < big / 10  # NVLink's 14x bandwidth shows
    assert parallel.tp_comm_per_step(cfg, 4096, 1, pcie) == 0.0


def test_pipeline_bubble_and_kv_transfer():
    assert parallel.pp_bubble(1, 8) == 0.0
    assert parallel.pp_bubble(4, 1) == pytest.approx(0.75)
    assert parallel.pp_bubble(4, 13) == pytest.approx(3 / 16)
    with pytest.raises(ValueError):
        parallel.pp_bubble(0, 1)
    cfg = sizing.load_config("llama-3.1-8b")
    link = parallel.LINKS["ib_ndr"]
    kv = sizing.kv_bytes_for_context(cfg, 8192)
    assert kv == 8192 * 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert parallel.transfer_time(cfg, 8192, link) == pytest.approx(kv / link.bandwidth + link.latency)
    assert parallel.transfer_time(cfg, 8192, link, "fp8") < parallel.transfer_time(cfg, 8192, link)


def test_fit_link_recovers_a_known_link_and_refuses_one_point():
    truth = parallel.Link("t", bandwidth=2e9, latency=4e-4)
    rows = [{"bytes": b, "seconds": parallel.allreduce_time(b, 2, truth)} for b in (4096, 1 << 16, 1 << 20, 4 << 20)]
    fit = parallel.fit_link(rows, ranks=2)
    assert fit.bandwidth == pytest.approx(2e9, rel=1e-6) and fit.latency == pytest.approx(4e-4, rel=1e-6)
    assert fit.measured
    with pytest.raises(ValueError, match="two sizes"):
        parallel.fit_link(rows[:1])


def test_measured_allreduce_grows_with_size_and_fits_its_own_rows():
    rows = parallel.measure_allreduce(sizes=(4096, 1 << 20, 4 << 20), ranks=2, reps=100)
    assert [r["bytes"] for r in rows] == [4096, 1 << 20, 4 << 20]
    assert rows[-1]["seconds"] > rows[0]["seconds"] > 0
    fit = parallel.fit_link(rows)
    assert fit.measured and 0 < fit.bandwidth < float("inf")
    # The fit weighs each size's relative error alike; the largest size, where bandwidth shows, must be on the line
    # (this test runs beside the real-server tests, so the smaller sizes' latency is left free).
    assert parallel.allreduce_time(rows[-1]["bytes"], 2, fit) == pytest.approx(rows[-1]["seconds"], rel=0.5)


def test_fit_link_weighs_each_size_by_its_relative_error():
    """Measured here before the fit was relative: 4 KiB at 309 µs, 4 MiB at 3,978 µs (a slow spell); a plain least
    squares line missed the 4 KiB all-reduce, the size decode sends, by 56%."""
    rows = [{"bytes": b, "seconds": us * 1e-6} for b, us in ((4096, 309.4), (65536, 352.4), (1 << 20, 622.7),
                                                            (4 << 20, 3977.8))]
    fit = parallel.fit_link(rows)
    small = parallel.allreduce_time(4096, 2, fit) / rows[0]["seconds"]
    assert small == pytest.approx(1, abs=0.1)
    with pytest.raises(ValueError, match="positive"):
        parallel.fit_link([{"bytes": 4096, "seconds": 0.0}, {"bytes": 8192, "seconds": 1e-4}])


def test_fluid_queue_matches_the_closed_form_of_an_overload_step():
    steps = bench.Steps(phases=((10, 1.0), (20, 3.0), (30, 1.0)))
    q = postmortem.fluid_queue(steps, capacity_rps=2.0, step_s=0.5)
    peak = q["backlog"].max()
    assert peak == pytest.approx((3.0 - 2.0) * 20, abs=1e-6)           # grows at lambda - mu for the 20 s overload
    at_peak = q.loc[q["backlog"].idxmax(), "t_s"]
    assert at_peak == pytest.approx(30.0, abs=0.5)
    drained = q[(q["t_s"] > 30) & (q["backlog"] == 0)]["t_s"].min()
    assert drained == pytest.approx(30 + peak / (2.0 - 1.0), abs=0.5)  # drains at mu - lambda
    assert q["wait_s"].max() == pytest.approx(peak / 2.0)
    assert postmortem.fluid_queue(steps, capacity_rps=2.0, replicas=2)["backlog"].max() == 0.0
    with pytest.raises(ValueError):
        postmortem.fluid_queue(steps, capacity_rps=0)


def test_seeded_fluid_queue_counts_the_requests_the_run_will_send():
    # 30 s at 6.5 req/s over a capacity of 5: the mean rates say a backlog of 45; this seed's draw sends fewer or more
    steps = bench.Steps(phases=((15, 2.5), (30, 6.5), (15, 2.5)), seed=0)
    sends = steps.send_times(steps.duration_s)
    seeded = postmortem.fluid_queue(steps, capacity_rps=5.0, seeded=True)
    assert seeded["arrived"].sum() == len([t for t in sends if t <= steps.duration_s + 0.5])
    in_overload = sum(15 <= t < 45 for t in sends)
    assert in_overload != 6.5 * 30                                    # the draw differs from the mean...
    # ...and the backlog follows the draw: what the overload sent beyond what one replica serves in it, within the
    # calm phase's leftover and one step's rounding
    assert seeded["backlog"].max() == pytest.approx(in_overload - 5.0 * 30, abs=3.0)
    assert postmortem.fluid_queue(steps, capacity_rps=5.0)["backlog"].max() == pytest.approx(45.0)
    burst = bench.Steps(phases=((1.0, 0.0), (1.0, 1000.0)), seed=1)  # everything arrives in the second second
    q = postmortem.fluid_queue(burst, capacity_rps=1.0, seeded=True)
    assert q.loc[q["t_s"] < 1.0, "arrived"].sum() == 0 and q["backlog"].max() > 900
    with pytest.raises(ValueError, match="open-loop"):
        postmortem.fluid_queue(bench.Concurrent(4), capacity_rps=1.0, seeded=True)


def _record(sent, ttft_ms, ok=True):
    return SimpleNamespace(ok=ok, ttft_ms=ttft_ms, timings=SimpleNamespace(t_scheduled=100.0 + sent))


def test_slo_windows_and_first_breach_count_failures_as_misses():
    recs = [_record(0, 100), _record(1, 200), _record(6, 3000), _record(7, None, ok=False), _record(12, 150)]
    w = postmortem.slo_windows(recs, target_ms=1000, width_s=5)
    assert w["window_s"].tolist() == [0.0, 5.0, 10.0]
    assert w["requests"].tolist() == [2, 2, 1]
    assert w["attainment"].tolist() == [1.0, 0.0, 1.0]
    assert w["ttft_p99_ms"].iloc[1] == pytest.approx(3000)
    assert postmortem.first_breach(recs, 1000) == 6
    assert postmortem.first_breach(recs[:2], 1000) is None
    assert postmortem.slo_windows([], 1000).empty


def test_timeline_detection_delay():
    t = postmortem.Timeline(overload_start_s=30, overload_end_s=60, capacity_rps=1, offered_peak_rps=2,
                            first_breach_s=35.0, alerts={"Q": {"pending_s": 31.0, "firing_s": 33.0},
                                                          "B": {"pending_s": 40.0, "firing_s": None}})
    assert t.detection_delay_s("Q") == pytest.approx(-2.0)  # fired before users felt it
    assert t.detection_delay_s("B") is None and t.fired("nope") is None


def test_random_models_resolve_to_a_built_checkpoint_and_size_from_their_config():
    path = models.resolve("random:tiny-moe")
    cfg = json.loads((models.Path(path) / "config.json").read_text())
    spec = json.loads(models.tiny_config_path("tiny-moe").read_text())
    assert cfg["num_experts_per_tok"] == spec["num_experts_per_tok"] and cfg["hidden_size"] == spec["hidden_size"]
    assert models.resolve("random:tiny-moe") == path  # cached by content
    sized = sizing.load_config("random:tiny-moe")
    assert sized.layers == spec["num_hidden_layers"] and sized.n_routed_experts == spec["num_experts"]
    assert sized.experts_per_token == 2
    with pytest.raises(FileNotFoundError, match="data/tiny holds"):
        models.tiny_config_path("no-such-model")


def test_alert_timeline_counts_transitions_inside_the_window_only():
    import pandas as pd

    t0 = 1_000_000.0
    rows = [("Q", "pending", 5.0), ("Q", "pending", 6.0), ("Q", "firing", 10.0),
            ("B", "firing", 0.0), ("B", "firing", 1.0)]  # B was already firing when the window opened
    frame = pd.DataFrame([{"alertname": a, "alertstate": st, "time": pd.Timestamp(t0 + t, unit="s"), "value": 1.0}
                          for a, st, t in rows])
    prom = SimpleNamespace(query_range_frame=lambda expr, start, end, step: frame)
    out = postmortem.alert_timeline(prom, t0, t0 + 60, 1.0)
    assert out["Q"] == {"pending_s": 5.0, "firing_s": 10.0}
    assert out["B"]["firing_s"] is None and out["B"]["firing_at_start"]


def _timeline(queue_s: float | None, burn_s: float | None, breach_s: float | None = 30.0) -> postmortem.Timeline:
    alerts = {"VLLMQueueBacklog": {"firing_s": queue_s}, "TTFTBudgetBurnFast": {"firing_s": burn_s}}
    return postmortem.Timeline(overload_start_s=20.0, overload_end_s=50.0, capacity_rps=5.0, offered_peak_rps=7.5,
                               first_breach_s=breach_s, alerts=alerts, queue_peak=40.0, queue_peak_predicted=45.0,
                               queue=[(float(s), float(max(0, s - 20))) for s in range(0, 60)])


def _write(t: postmortem.Timeline) -> str:
    return postmortem.write(t, slo_ms=2500, queue_alert="VLLMQueueBacklog", burn_alerts=["TTFTBudgetBurnFast"],
                            fix="a second replica")


def test_the_postmortem_says_what_was_measured_not_the_lesson():
    """It wrote "fired first", "the queue is the leading signal" and "the backlog already holds minutes of work"
    whatever order and sign were measured. Each sentence is now chosen by the run."""
    led = _write(_timeline(queue_s=25.0, burn_s=40.0))
    assert "5.0 s *before* the first request" in led and "leading signal" in led
    assert "VLLMQueueBacklog fired first (t = 25.0 s)" in led
    assert "20 requests were already waiting, 4.0 s of work at capacity" in led  # the recorded queue at t = 40
    lagged = _write(_timeline(queue_s=35.0, burn_s=32.0))
    assert "5.0 s *after*" in lagged and "did not lead" in lagged and "leading signal" not in lagged
    assert "TTFTBudgetBurnFast fired first" in lagged and "a burn-rate alert beat VLLMQueueBacklog" in lagged
    quiet = _write(_timeline(queue_s=25.0, burn_s=None))
    assert "No burn-rate alert fired" in quiet and "since no burn-rate alert fired at all" in quiet
    assert "never fired" in _write(_timeline(queue_s=None, burn_s=None)) and "No alert fired" in _write(
        _timeline(queue_s=None, burn_s=None))
