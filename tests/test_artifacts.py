"""Every deliverable says how each of its numbers is known (helpers.artifacts.write's ``basis``)."""

from __future__ import annotations

import json

import pytest

from helpers import artifacts, bench


def test_a_deliverable_carries_how_each_number_is_known(tmp_path):
    basis = {"rate": "measured: the search's last passing probe", "price": "catalog", "gate": "earlier lab 15",
             "rows": "predicted + measured: each row carries both", "slo": "input", "model": "no numbers"}
    data = {"rate": 1.2, "price": 2.5, "gate": {"verdict": "SAFE"}, "rows": [], "slo": {"ttft_ms": 500},
            "model": "m"}
    paths = artifacts.write(tmp_path, "x", title="x", markdown="# x", data=data, basis=basis)
    assert json.loads(paths["json"].read_text())["basis"] == basis
    md = paths["md"].read_text()
    assert "## What each number is" in md and "| `gate` | earlier lab 15 |" in md
    assert "earlier lab 15" in paths["html"].read_text()
    # one basis for all the keys
    assert set(json.loads(artifacts.write(tmp_path, "y", title="y", markdown="# y", data=data,
                                          basis="measured")["json"].read_text())["basis"]) == set(data)


@pytest.mark.parametrize("basis,message", [
    ({"rate": "measured"}, "no basis for ['price']"),
    ({"rate": "measured", "price": "guessed"}, "price: 'guessed' names no known basis"),
    ({"rate": "measured", "price": "earlier lab"}, None),
    ({"rate": "measured", "price": "earlier lab 5"}, "names no known basis"),  # a lab is two digits
    ({"rate": "measured", "price": "catalog", "cost": "predicted"}, "a basis for ['cost'], which the data does not"),
])
def test_a_basis_that_misses_a_field_or_names_no_known_kind_stops_before_anything_is_written(tmp_path, basis, message):
    data = {"rate": 1.2, "price": 2.5}
    if message is None:
        artifacts.write(tmp_path, "ok", title="ok", markdown="# ok", data=data, basis=basis)
        return
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        artifacts.write(tmp_path / "out", "bad", title="bad", markdown="# bad", data=data, basis=basis)
    assert not (tmp_path / "out").exists()


def test_the_phase2_report_says_its_configurations_were_measured_and_its_target_set(tmp_path):
    report = bench.BenchmarkReport("t", 100, {"ttft_ms": 100}, {}, "hw", {}, [])
    data = json.loads(report.write(tmp_path)["json"].read_text())
    assert data["basis"]["configs"].startswith("measured") and data["basis"]["p99_ttft_target_ms"] == "input"
