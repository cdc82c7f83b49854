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
