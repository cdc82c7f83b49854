"""Every lab follows the skeleton (ci/notebooks.py check), and the checker itself catches what it should."""

import json
from pathlib import Path

import pytest

from tests.scripts import load

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


notebooks = load("ci/notebooks.py")
run_sequence = load("ci/run_sequence.py")


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name)
def test_lab_follows_the_skeleton(path):
    assert notebooks.check(path) == []


# The syllabus' sessions in order (4 phases of 6, 5, 6 and 6 sessions) and the capstone: a lab's number is its place here.
SYLLABUS = ["one_gpu_one_model", "prefill_and_decode", "sizing_the_kv_cache", "gqa_mla_sliding_windows",
            "where_the_time_goes", "inside_pagedattention", "continuous_batching", "chunked_prefill",
            "prefix_caching_measured", "load_testing_honestly", "latency_throughput_goodput", "fp8_as_the_default",
            "fp4_on_blackwell", "awq_gptq_and_what_died", "proving_quantization_safe", "speculative_decoding",
            "cost_per_million_tokens", "tensor_and_pipeline_parallel", "expert_parallelism_for_moe",
            "disaggregating_prefill_and_decode", "kv_offload_and_tiers", "routing_and_autoscaling",
            "observability_and_the_postmortem", "putting_it_all_together"]


def test_labs_are_numbered_in_syllabus_order():
    """Each lab's number is its session's place in the syllabus (a lab still to come leaves its number free)."""
    for p in LABS:
        number, slug = int(p.name[:2]), p.stem[3:]
        assert 1 <= number <= len(SYLLABUS) and SYLLABUS[number - 1] == slug, (
            f"{p.name}: lab {number} is {SYLLABUS[number - 1] if 1 <= number <= len(SYLLABUS) else 'not a session'}")
    phase_one_and_two = [int(p.name[:2]) for p in LABS if int(p.name[:2]) <= 11]
    assert phase_one_and_two == list(range(1, 12))


def test_checker_catches_outputs_missing_tags_and_sys_path(tmp_path):
    good = json.loads(LABS[0].read_text())
    bad = json.loads(json.dumps(good))
    for cell in bad["cells"]:
        cell["metadata"] = {}
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x"}]
    bad["cells"][2]["source"] = "import sys; sys.path.append('..')"
    bad["cells"][3]["source"] = "x = 1\n" * 41
    path = tmp_path / "01_bad.ipynb"
    path.write_text(json.dumps(bad))
    problems = "\n".join(notebooks.check(path))
    del bad["cells"][1]["id"]
    path.write_text(json.dumps(bad))
    problems = "\n".join(notebooks.check(path))
    for expected in ("outputs are committed", "tagged 'parameters'", "tagged 'check'", "patches sys.path", "has no id",
                     "has 41 lines (at most 40)"):
        assert expected in problems


def test_checker_refuses_device_branching_and_a_lab_without_a_widget(tmp_path):
    nb = json.loads(LABS[1].read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "parameters" not in c["metadata"].get("tags", [])]
    code[2]["source"] = 'if PROFILE.device == "cpu":\n    BATCH = 8\n'
    for c in code:
        c["source"] = "".join(c["source"]).replace("widgets.explore(", "show(")
    path = tmp_path / "02_bad.ipynb"
    path.write_text(json.dumps(nb))
    problems = "\n".join(notebooks.check(path))
    assert "branches on the device or profile" in problems and "no widget" in problems
    # the same decision inside the parameters cell is allowed (papermill overrides it)
    nb2 = json.loads(LABS[1].read_text())
    params = next(c for c in nb2["cells"] if "parameters" in c["metadata"].get("tags", []))
    params["source"] = "".join(params["source"]) + '\nX = 1 if PROFILE_NAME == "cpu" else 2\n'
    ok = tmp_path / LABS[1].name
    ok.write_text(json.dumps(nb2))
    assert notebooks.check(ok) == []


def test_strip_removes_outputs_and_keeps_tags(tmp_path):
    nb = json.loads(LABS[0].read_text())
    code = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x"}]
    code["execution_count"] = 3
    code["metadata"]["collapsed"] = True
    del nb["cells"][0]["id"]
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps(nb))
    assert notebooks.strip(path)
    again = json.loads(path.read_text())
    cell = next(c for c in again["cells"] if "parameters" in c["metadata"].get("tags", []))
    assert cell["outputs"] == [] and cell["execution_count"] is None and cell["metadata"] == {"tags": ["parameters"]}
    assert all(c.get("id") for c in again["cells"]) and len({c["id"] for c in again["cells"]}) == len(again["cells"])
    assert not notebooks.strip(path)  # idempotent


def test_checker_wants_the_self_test_collapsed_under_its_heading_and_a_parameters_cell_in_lesson_words(tmp_path):
    nb = json.loads(LABS[1].read_text())
    head = next(c for c in nb["cells"] if "".join(c["source"]).startswith(notebooks.SELF_TEST))
    head["metadata"] = {}
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    params["source"] = "# papermill and CI override them\n" + "".join(params["source"])
    path = tmp_path / LABS[1].name
    path.write_text(json.dumps(nb))
    problems = "\n".join(notebooks.check(path))
    assert "must be collapsed" in problems and "speaks of the test runner" in problems
    head["source"] = "## Check: asserted"  # no self-test heading at all
    path.write_text(json.dumps(nb))
    assert "must sit under one '## Self-test' heading" in "\n".join(notebooks.check(path))
    kept = tmp_path / "kept.ipynb"
    kept.write_text(LABS[1].read_text())
    assert not notebooks.strip(kept), "strip keeps the self-test heading's collapse"


def test_run_sequence_selects_labs_by_number():
    labs = [Path(f"{n:02d}_x.ipynb") for n in range(1, 12)]
    assert [p.name[:2] for p in run_sequence.select(labs, "01-03,09")] == ["01", "02", "03", "09"]
    assert run_sequence.select(labs, None) == labs


def _code(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def test_a_bandwidth_called_measured_is_measured_on_this_device():
    """Lab 24 called the catalog's bandwidth "this device's measured": its ceiling now comes from sizing.measure."""
    code = _code(next(p for p in LABS if p.name.startswith("24_")))
    assert "bw_ceiling = measured_hw.memory_bandwidth" in code and "measured_hw = sizing.measure(" in code
    assert "bw_ceiling = sizing.HARDWARE" not in code


@pytest.mark.parametrize("path", [p for p in LABS if int(p.name[:2]) >= 12], ids=lambda p: p.name)
def test_labs_that_need_outside_tools_check_them_before_they_start(path):
    """A lab whose plan names tools calls tools.require(PLAN.tools) before any fleet import (which needs PyYAML) and
    before its first server: a missing tool stops it at once, saying how to install it on this route."""
    from helpers import plan

    code = _code(path)
    if not plan.lab(path.name[:2], "cpu", quick=True).tools:
        return
    at = code.index("tools.require(PLAN.tools)")
    for later in ("from helpers.fleet", "from helpers import fleet", "server.start(", "start_replica"):
        assert later not in code or code.index(later) > at, (path.name, later)


def _fills(path: Path) -> tuple[set[str], list[str]]:
    """The knobs a lab's parameters cell sets, and the names its ``PLAN.fill(globals(), ...)`` calls fill."""
    import ast

    nb = json.loads(path.read_text())
    params, filled = set(), []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        tree = ast.parse("".join(c["source"]))
        if "parameters" in c.get("metadata", {}).get("tags", []):
            params |= {t.id for st in tree.body if isinstance(st, ast.Assign) for t in st.targets
                       if isinstance(t, ast.Name)}
        filled += [a.value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "fill"
                   for a in n.args[1:] if isinstance(a, ast.Constant)]
    return params, filled


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name[:2])
def test_knobs_are_filled_from_the_plan_in_one_call_for_every_profile(path):
    """Each lab fills its unset knobs with one ``PLAN.fill(globals(), ...)`` (an override of 0 or False stays, which
    ``X or PLAN["x"]`` dropped): every name it fills is a knob of its parameters cell and a value of its plan on
    every profile, quick or not, so a GPU learner never meets a knob the CPU plan alone defines."""
    from helpers import plan, runtime

    text = path.read_text()
    assert ' or PLAN[\\"' not in text and 'else PLAN[\\"' not in text, f"{path.name}: a knob filled by hand"
    params, filled = _fills(path)
    assert filled and len(filled) == len(set(filled)), (path.name, filled)
    assert set(filled) <= params, f"{path.name} fills names its parameters cell does not set: {set(filled) - params}"
    for name in runtime.PROFILES:
        for quick in (True, False):
            values = plan.lab(path.name[:2], name, quick=quick).values
            missing = [k for k in filled if k.lower() not in values]
            assert not missing, f"{path.name} on {name} (quick={quick}): the plan has no {missing}"


def test_fill_keeps_an_override_of_zero_and_refuses_an_unknown_knob():
    from helpers import plan

    p = plan.lab("15", "cpu", quick=True)
    ns = {"LIMIT": 0, "GATE": None, "LENGTHS": [256]}
    p.fill(ns, "LIMIT", "GATE", "LENGTHS")
    assert ns["LIMIT"] == 0 and ns["GATE"] == p["gate"] and ns["LENGTHS"] == [256]
    ns["GATE"]["max_kl"] = 1.0  # a copy: the plan keeps its own
    assert p["gate"]["max_kl"] == 0.05
    with pytest.raises(KeyError, match="no value for NOPE"):
        p.fill({"NOPE": None}, "NOPE")
    with pytest.raises(NameError, match="run the parameters cell"):
        p.fill({}, "LIMIT")


def test_every_setup_cell_is_the_same_and_every_defined_in_tag_names_its_labs_title():
    """The setup cell is copied into 24 notebooks and the "Introduced in lab NN (Title)" tags into hundreds of
    docstrings: the copies must agree (a fix made in one setup cell, or a lab renamed, is made everywhere)."""
    import re

    setups, titles = set(), {}
    for path in LABS:
        nb = json.loads(path.read_text())
        setups.add("".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"]))
        head = "".join(nb["cells"][0]["source"]).splitlines()[0]
        titles[path.name[:2]] = re.sub(r"^# Lab \d\d — ", "", head)
    assert len(setups) == 1, f"{len(setups)} different setup cells: copy one into the others"
    tag = re.compile(r"Introduced in lab (\d+)\s+\(([^)]*)\)")
    wrong = []
    for f in [*(ROOT / "helpers").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for m in tag.finditer(f.read_text()):
            number, title = m.group(1).zfill(2), " ".join(m.group(2).split())
            if titles.get(number) != title:
                wrong.append(f"{f.relative_to(ROOT)}: lab {number} ({title}) is {titles.get(number)!r}")
    assert not wrong, "\n".join(wrong)
