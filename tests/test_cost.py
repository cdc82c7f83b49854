"""helpers.cost: the arithmetic, checked against a second formula and against hand-worked numbers."""

import dataclasses

import pytest

from helpers import cost, sizing


def test_cost_per_million_by_hand_and_by_a_second_formula():
    # $2.50 per hour at 1,000 tokens/s: 3.6 M tokens an hour -> $0.694 per million.
    assert cost.cost_per_million(2.50, 1000.0) == pytest.approx(2.50 / 3.6)
    # Second formula: seconds to make a million tokens, times the price per second.
    assert cost.cost_per_million(3.5, 777.0, devices=2) == pytest.approx(1e6 / 777.0 * 2 * 3.5 / 3600)
    # Idle hours are paid for: at 50% utilization every token costs twice as much.
    assert cost.cost_per_million(2.5, 1000.0, utilization=0.5) == pytest.approx(2 * cost.cost_per_million(2.5, 1000.0))


def test_bad_rates_and_utilization_say_what_is_wrong():
    with pytest.raises(ValueError, match="cannot serve the workload"):
        cost.cost_per_million(2.5, 0.0)
    with pytest.raises(ValueError, match="utilization"):
        cost.cost_per_million(2.5, 100.0, utilization=1.5)
    with pytest.raises(KeyError, match="known devices"):
        cost.price("tpu-v9")


def test_cost_at_slo_charges_one_bill_for_input_and_output():
    row = cost.cost_at_slo("h100", output_tokens_per_s=2000.0, input_tokens_per_s=8000.0, name="bf16")
    assert row.usd_per_hour == cost.PRICES["h100"].usd_per_hour and row.price_source
    assert row.per_million_input == pytest.approx(row.per_million_output / 4)  # 4x the tokens in the same hours
    cheaper = cost.cost_at_slo("h100", output_tokens_per_s=3000.0, name="fp8")
    table = cost.compare([row, cheaper])
    assert table[0]["vs baseline"] == 1.0 and table[1]["vs baseline"] == pytest.approx(2 / 3)


def test_every_catalog_device_has_a_dated_sourced_price():
    assert set(cost.PRICES) >= set(sizing.HARDWARE)
    for p in cost.PRICES.values():
        assert p.usd_per_hour > 0 and p.source and p.as_of
    assert cost.price("h200").with_price(2.0).usd_per_hour == 2.0


def test_roofline_rate_is_the_largest_batch_that_meets_the_target():
    r = cost.roofline_rate_at_tpot("llama-3.1-8b", "h200", tpot_ms=40.0, context=2048)
    cfg, hw = sizing.load_config("llama-3.1-8b"), sizing.HARDWARE["h200"]
    step = lambda b: sizing.decode_step_time(cfg, hw, b, 2048, efficiency=0.5).time * 1e3  # noqa: E731
    assert step(r.batch) <= 40.0 < step(r.batch + 1)        # the boundary, found by a second search
    assert r.output_tokens_per_s == pytest.approx(r.batch / (step(r.batch) / 1e3))
    assert "TPOT" in r.limited_by
    # A card with more bandwidth holds a larger batch within the same target; fp8 weights read fewer bytes.
    assert cost.roofline_rate_at_tpot("llama-3.1-8b", "b200", 40.0, 2048).output_tokens_per_s > r.output_tokens_per_s
    assert cost.roofline_rate_at_tpot("llama-3.1-8b", "h200", 40.0, 2048, weight_dtype="fp8").batch > r.batch


def test_roofline_rate_stops_at_memory_and_refuses_an_impossible_target():
    long = cost.roofline_rate_at_tpot("llama-3.1-8b", "h200", tpot_ms=1000.0, context=131072)
    cfg = sizing.load_config("llama-3.1-8b")
    kv = sizing.kv_bytes_for_context(cfg, 131072)
    budget = 0.9 * sizing.HARDWARE["h200"].memory_gib * 2**30 - sizing.weight_bytes(cfg, strict=False).total
    assert long.batch * kv <= budget < (long.batch + 1) * kv and "memory" in long.limited_by
    with pytest.raises(ValueError, match="even at batch 1"):
        cost.roofline_rate_at_tpot("llama-3.1-8b", "l4", tpot_ms=5.0, context=2048)


def test_roofline_rate_across_tp_cards_adds_the_all_reduce_and_fits_what_one_card_cannot():
    # 70B in BF16 (~131 GiB) does not fit one 80 GiB H100 beside any KV cache; two hold it and a batch.
    with pytest.raises(ValueError, match="even at batch 1"):
        cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 40.0, 3700)
    two = cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 40.0, 3700, weight_dtype="fp8", kv_dtype="fp8", tp=2)
    assert two.device == "2 x h100" and two.batch >= 16
    # the step is the roofline's on twice the card plus the ring all-reduces of lab 18, computed independently here
    cfg, one = sizing.load_config("llama-3.1-70b"), sizing.HARDWARE["h100"]
    pair = dataclasses.replace(one, memory_gib=2 * one.memory_gib, memory_bandwidth=2 * one.memory_bandwidth,
                               bf16_flops=2 * one.bf16_flops, fp16_flops=2 * one.fp16_flops, fp8_flops=2 * one.fp8_flops)
    comm = 2 * cfg.layers * sizing.allreduce_time(two.batch * cfg.hidden * 2, 2, sizing.LINKS["nvlink4"])
    roof = sizing.decode_step_time(cfg, pair, two.batch, 3700, weight_dtype="fp8", kv_dtype="fp8", efficiency=0.5).time
    assert two.step_ms == pytest.approx((roof + comm) * 1e3) and two.step_ms <= 40.0
    # FP8 KV holds twice the sequences: with the TPOT target out of the way, memory binds at about twice the batch
    loose = dict(weight_dtype="fp8", tp=2, efficiency=0.5)
    a = cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 10_000.0, 3700, kv_dtype="auto", **loose)
    b = cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 10_000.0, 3700, kv_dtype="fp8", **loose)
    assert "memory" in a.limited_by and b.batch == pytest.approx(2 * a.batch, rel=0.02)
    with pytest.raises(ValueError, match="tp"):
        cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 40.0, 3700, tp=0)


def test_a_deployment_states_its_gates_verdict():
    offer = cost.Offer(name="base", checkpoint="ck", speculative=None, max_rate_at_slo=1.0, bracket=(1.0, None),
                       output_tokens_per_s_at_slo=32.0, price_per_hour=0.1, cost_per_million_output_tokens=1.0)
    kw = dict(model="m", profile="cpu", baseline_checkpoint="ck", slo={}, workload={}, device="cpu", price={},
              offers=[offer], baseline="base", gated_checkpoint="ck-int8", drafting=None, min_greedy_agreement=0.9)
    assert cost.Deployment(gate=None, **kw).gate_verdict is None
    assert cost.Deployment(gate={"safe": False}, **kw).gate_verdict == "NOT SAFE"   # saved before verdicts
    assert cost.Deployment(gate={"safe": False, "verdict": "INCONCLUSIVE"}, **kw).gate_verdict == "INCONCLUSIVE"


def test_a_card_too_slow_for_the_slo_chooses_nothing_and_says_what_each_missed(tmp_path):
    """An A10G's rehearsal: the 8B baseline and its INT8 checkpoint met the SLO at no rate searched, and lab 17 stopped
    with 'nothing to choose'. The deployment now chooses nothing, and its report says so, with each one's lowest miss."""
    slo = {"attainment": 0.9, "ttft_ms": 500, "tpot_ms": 40}
    missed = [cost.Offer(name=n, checkpoint=ck, speculative=None, max_rate_at_slo=None, bracket=(None, r),
                         output_tokens_per_s_at_slo=None, price_per_hour=1.0, cost_per_million_output_tokens=None)
              for n, ck, r in (("base", "ck", 2.68), ("int8", "ck-int8", 9.68))]
    dep = cost.Deployment(model="m", profile="l4", baseline_checkpoint="ck", slo=slo, device="a10g",
                          workload={"input tokens": 512, "output tokens": 128}, price={"usd_per_hour": 1.0,
                          "source": "s", "as_of": "2026"}, offers=missed, baseline="base", gate=None,
                          gated_checkpoint="ck-int8", drafting=None, min_greedy_agreement=0.9)
    assert dep.chosen is None
    why = dep.reasons()
    assert "2.68 req/s" in why["base"] and "9.68 req/s" in why["int8"], why
    md = dep.to_markdown()
    assert "**Chosen: nothing**" in md and "no configuration met the SLO" in md, md[:400]
    assert cost.Deployment.from_dict(dep.as_dict()).chosen is None  # saved and read back, still nothing
