"""sizing.fit_prefill / fit_decode recover known rates from synthetic measurements and extrapolate."""

import pytest

from helpers import sizing

CFG = sizing.load_config("smollm2-135m-instruct")


def test_prefill_flops_split_matches_the_roofline_total():
    lin, att = sizing.prefill_flops(CFG, 4096)
    hw = sizing.Hardware("x", 24, 1e11, 1e12)
    assert lin + att == pytest.approx(sizing.prefill_time(CFG, hw, 4096).flops)
    # attention is quadratic: doubling the prompt roughly quadruples it, the linear part doubles
    lin2, att2 = sizing.prefill_flops(CFG, 8192)
    assert lin2 / lin == pytest.approx(2, rel=0.01) and att2 / att == pytest.approx(4, rel=0.01)


def test_fit_prefill_recovers_two_rates_and_extrapolates():
    r_lin, r_att, c0 = 3e11, 1.5e11, 0.02
    truth = lambda n: c0 + sizing.prefill_flops(CFG, n)[0] / r_lin + sizing.prefill_flops(CFG, n)[1] / r_att  # noqa
    fit = sizing.fit_prefill(CFG, [(n, truth(n)) for n in (512, 1024, 2048, 4096)])
    assert fit.linear_flops_per_s == pytest.approx(r_lin, rel=1e-6)
    assert fit.attention_flops_per_s == pytest.approx(r_att, rel=1e-6)
    assert fit.overhead_s == pytest.approx(c0, rel=1e-6)
    assert fit.predict(8000) == pytest.approx(truth(8000), rel=1e-6)
    assert max(abs(r) for r in fit.residuals()) < 1e-9


def test_fit_prefill_needs_three_lengths():
    with pytest.raises(ValueError, match="three or more"):
        sizing.fit_prefill(CFG, [(512, 0.4), (1024, 0.9), (1024, 0.95)])


def test_fit_prefill_never_returns_negative_rates():
    # noisy points where an unconstrained fit would make the overhead negative
    fit = sizing.fit_prefill(CFG, [(512, 0.40), (1024, 0.70), (2048, 1.60), (4096, 4.5)])
    assert fit.overhead_s >= 0 and (fit.linear_flops_per_s or 1) > 0 and (fit.attention_flops_per_s or 1) > 0


def test_fit_decode_through_origin_and_with_overhead():
    bw, c0 = 10e9, 0.015
    hw = sizing.Hardware("x", 24, 30e9, 1e12)
    step = lambda b, c: sizing.decode_step_time(CFG, hw, b, c).bytes  # noqa: E731
    pts = [(1, c, c0 + step(1, c) / bw) for c in (512, 1024, 2048, 4096)]
    fit = sizing.fit_decode(CFG, pts, hw, overhead=True)
    assert fit.bandwidth == pytest.approx(bw, rel=1e-6) and fit.overhead_s == pytest.approx(c0, rel=1e-6)
    assert fit.predict(1, 8000) == pytest.approx(c0 + step(1, 8000) / bw, rel=1e-6)
    assert fit.fraction_of_peak == pytest.approx(bw / 30e9)
    one = sizing.fit_decode(CFG, [(1, 64, step(1, 64) / bw)], hw)  # one point, no overhead: bandwidth alone
    assert one.bandwidth == pytest.approx(bw, rel=1e-9) and one.overhead_s == 0
    with pytest.raises(ValueError, match="different numbers of bytes"):
        sizing.fit_decode(CFG, [(1, 64, 0.02), (1, 64, 0.021)], overhead=True)
    with pytest.raises(ValueError, match="positive seconds per step"):
        sizing.fit_decode(CFG, [(1, 64, 0.02), (1, 4096, 0.0)], overhead=True)


def test_plan_sheet_budgets_kv_after_weights_and_refuses_what_does_not_fit():
    h100 = sizing.HARDWARE["h100"]
    sheet = sizing.plan_sheet("llama-3.1-8b", h100, 131072, batch=4)
    weights = sizing.weight_bytes(sizing.load_config("llama-3.1-8b"), "bf16").total
    kv = int(0.9 * h100.memory_gib * 2**30 - weights - 2 * 2**30)
    expected = sizing.vllm_kv_capacity("llama-3.1-8b", kv, 16, 131072)
    assert sheet["kv_cache_tokens"].predicted == expected.kv_cache_tokens
    assert sheet["weight_bytes"].predicted == weights
    with pytest.raises(ValueError, match="quantize"):
        sizing.plan_sheet("llama-3.1-70b", sizing.HARDWARE["l4"], 8192)
    # fp8 weights leave more room: more tokens of cache
    fp8 = sizing.plan_sheet("llama-3.1-8b", h100, 131072, weight_dtype="fp8")
    assert fp8["kv_cache_tokens"].predicted > sheet["kv_cache_tokens"].predicted


def test_fit_decode_falls_back_to_the_origin_when_noise_hides_the_kv_term():
    fit = sizing.fit_decode(CFG, [(1, 512, 0.040), (1, 4096, 0.030)], overhead=True)
    assert fit.overhead_s == 0 and fit.bandwidth > 0 and "origin" in fit.note
