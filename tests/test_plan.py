"""helpers.plan: every lab's device-dependent sizes fit every profile, and the checks catch a plan that does not."""

import json
import subprocess
import sys

import pytest

from helpers import plan, runtime

PROFILES = sorted(runtime.PROFILES)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("name", PROFILES)
def test_every_lab_plan_fits_every_profile(name, quick):
    out = plan.plans(name, quick=quick)
    assert out["profile"]["name"] == name and out["profile"]["model"] == runtime.PROFILES[name].model
    assert set(out["labs"]) >= {f"{i:02d}" for i in range(1, 12)}
    for number, p in out["labs"].items():
        assert p["max_request_tokens"] <= p["max_model_len"], (number, p)
        assert all(c["ok"] for c in p["checks"]), (number, [c for c in p["checks"] if not c["ok"]])
        if runtime.PROFILES[name].device == "cpu":
            assert p["min_gpu_memory_utilization"] is None and out["profile"]["gpu_memory_gib"] is None
        else:
            assert 0 < p["min_gpu_memory_utilization"] < 1


@pytest.mark.parametrize("name", PROFILES)
def test_cli_prints_the_documented_json(name):
    res = subprocess.run([sys.executable, "-m", "helpers.plan", name, "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data["profile"]) == {"name", "model", "max_model_len", "gpu_memory_gib"}
    for p in data["labs"].values():
        assert {"max_model_len", "max_request_tokens", "min_gpu_memory_utilization", "min_run_s"} <= set(p)


def test_a_plan_that_does_not_fit_is_refused_with_the_failed_check():
    short = runtime.PROFILES["cpu"].replace(max_model_len=1024)
    with pytest.raises(plan.PlanError, match=r"(?s)lab 09.*1,104 tokens <= max_model_len 1,024"):
        plan.lab("09", short, quick=False)
    assert plan.lab("05", short, quick=False)["context"] == 1024  # a plan that can adapt to the context does
    tiny_card = runtime.PROFILES["l4"].replace(gpu_memory_gib=12.0)
    with pytest.raises(plan.PlanError, match="weights"):
        plan.lab("02", tiny_card)


def test_run_length_check_uses_the_roofline():
    p = runtime.PROFILES["h100"]
    fast = plan.predicted_e2e_s(p, 256, 64)
    slow = plan.predicted_e2e_s(runtime.PROFILES["cpu"], 256, 64)
    assert 0 < fast < slow  # an H100 finishes the same request far sooner than a 2-core CPU
    assert plan.predicted_e2e_s(p, 256, 128) > fast


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("name", PROFILES)
def test_lab_23_runs_lab_22s_replicas_unchanged(name, quick):
    """Same engine arguments, so the two replicas lab 22 parks are the ones lab 23 adopts (one start for both under
    make test), and lab 23's full batch fits their deliberately small cache."""
    p22, p23 = plan.lab("22", name, quick=quick), plan.lab("23", name, quick=quick)
    assert p23["replica"] == p22["replica"] and p23.model == p22.model
    assert p22["replica"]["kv_cache_memory_bytes"] == p22["cache_tokens"] * p22["kv_bytes_per_token"]
    assert p23["max_num_seqs"] == p22["replica"]["max_num_seqs"]
    assert p23["max_num_seqs"] * (p23["input_len"] + p23["output_len"]) <= 0.9 * p22["cache_tokens"]


def _same_shape(full, cut, where):
    """A rehearsal value keeps the full value's structure: the same type, every list's length, every dict's keys,
    every toggle and name; only numbers (counts, durations, lengths) may differ."""
    if full is None:  # "all of them" (a count): may be made a number
        assert cut is None or (isinstance(cut, int) and not isinstance(cut, bool)), f"{where}: None became {cut!r}"
    elif isinstance(full, bool) or isinstance(full, str):
        assert cut == full, f"{where}: {full!r} became {cut!r}"
    elif isinstance(full, (int, float)):
        assert isinstance(cut, (int, float)) and not isinstance(cut, bool), (where, cut)
    elif isinstance(full, (list, tuple)):
        assert isinstance(cut, (list, tuple)) and len(cut) == len(full), f"{where}: {full!r} -> {cut!r}"
        for i, (a, b) in enumerate(zip(full, cut)):
            _same_shape(a, b, f"{where}[{i}]")
    elif isinstance(full, dict):
        assert isinstance(cut, dict) and set(cut) == set(full), f"{where}: keys {set(full) ^ set(cut)}"
        for k in full:
            _same_shape(full[k], cut[k], f"{where}.{k}")


@pytest.mark.parametrize("name", [n for n in runtime.PROFILES if n != "cpu"])
def test_a_rehearsal_plan_keeps_the_full_plans_structure(name, monkeypatch):
    """python -m ci.rehearse runs every lab at its rehearsal size: the full plan with counts, durations and lengths
    cut, every list's members, toggle and format kept (so a rehearsal takes the path a full run takes)."""
    full = {n: plan.lab(n, name, quick=False) for n in sorted(plan.LABS)}
    monkeypatch.setenv("LABS_REHEARSAL", "1")
    for n, p in full.items():
        cut = plan.lab(n, name, quick=True)  # a rehearsal ignores quick: the full plan, cut
        _same_shape(p.values, cut.values, f"lab {n}")
        assert p.formats == cut.formats and p.max_model_len == cut.max_model_len, n


@pytest.mark.parametrize("name", [n for n in runtime.PROFILES if n != "cpu"])
def test_lab_05_fits_its_prefill_on_four_or_more_lengths_below_its_target(name):
    """fit_prefill has three coefficients: the GPU plan gave a T4 one calibration length under its 8,192-token target
    and an L4 two (the lab stopped at the fit), and an H100 three, extrapolated 8x."""
    for quick in (False, True):
        p = plan.lab("05", name, quick=quick)
        lengths = p["calibration_lengths"]
        assert len(lengths) >= 4 and all(L < p["context"] for L in lengths), (quick, lengths, p["context"])
        assert max(lengths) >= p["context"] / 2, (quick, lengths)  # extrapolated at most 2x


def test_make_tests_rehearsal_runs_every_lab_once_on_machines_that_exist():
    """make test rehearses a share of the matrix (ci.rehearse.cards.SAMPLE): every lab exactly once, each machine it
    names a real one, so no lab's GPU path goes unexecuted in a CI run."""
    from ci.rehearse import cards
    from ci.rehearse.__main__ import select

    labs = [p.name[:2] for share in cards.SAMPLE.values() for p in select(share)]
    assert sorted(labs) == sorted(p.name[:2] for p in select(None)), labs
    assert set(cards.SAMPLE) <= set(cards.MACHINES)
    assert {cards.MACHINES[k].count for k in cards.SAMPLE} >= {1, 2}  # lab 18's two-GPU path among them


def test_knobs_table_says_where_each_value_came_from():
    p = plan.lab("08", "cpu", quick=True)
    ns = {"BUDGETS": None, "LONG_PROMPT": 512}
    p.fill(ns, "BUDGETS", "LONG_PROMPT")
    t = p.knobs()
    assert list(t.index) == ["BUDGETS", "LONG_PROMPT"]
    assert t.loc["BUDGETS", "from"] == "this device's plan" and t.loc["BUDGETS", "value"] == repr(p["budgets"])
    assert t.loc["LONG_PROMPT", "from"].startswith("you") and t.loc["LONG_PROMPT", "value"] == "512"
    assert "_filled" not in p.as_dict()
