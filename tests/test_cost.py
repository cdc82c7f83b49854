"""helpers.cost: the arithmetic, checked against a second formula and against hand-worked numbers."""

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
