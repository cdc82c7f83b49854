"""The plans' predicted wall time (:mod:`helpers.plan.timing`): every lab modelled, the model following the plan's
own values, no cell past the instructor runner's per-cell limit on any profile, and the full H100 sequence inside
three hours (issue 38: a sequence an instructor can afford)."""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest

from helpers import plan, runtime
from helpers.plan import timing
from helpers.plan.core import predicted_e2e_s


@functools.cache
def _plans(profile: str, quick: bool) -> dict[str, plan.LabPlan]:
    return {n: plan.lab(n, profile, quick) for n in sorted(plan.LABS)}


def test_every_lab_has_a_time_model():
    assert set(timing.TIMES) == set(plan.LABS)


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("profile", list(runtime.PROFILES))
def test_every_cell_fits_the_runners_limit(profile, quick):
    over = [(n, c["cell"], c["s"]) for n, p in _plans(profile, quick).items() for c in p.time_s["cells"]
            if not 0 <= c["s"] < timing.CELL_LIMIT_S]
    assert not over, f"cells predicted past {timing.CELL_LIMIT_S:.0f} s (or negative) on {profile}: {over}"
    for n, p in _plans(profile, quick).items():  # the total is the cells' sum, every lab has a working cell
        assert math.isclose(p.time_s["total"], sum(c["s"] for c in p.time_s["cells"]), abs_tol=0.5)
        assert len(p.time_s["cells"]) >= 2, f"lab {n} has no working cell on {profile}"


def test_the_full_h100_sequence_fits_three_hours():
    t = plan.sequence_time("h100")
    assert t["total"] <= 3 * 3600, (f"the full h100 sequence is predicted at {t['total'] / 3600:.2f} h: "
                                    f"{sorted(t['labs'].items(), key=lambda kv: -kv[1])[:5]}")
    assert t["downloads"], "the GPU sequence downloads its models: their time is counted"


def test_quick_is_never_slower_than_full():
    for profile in ("cpu", "h100"):
        full, quick = plan.sequence_time(profile, False), plan.sequence_time(profile, True)
        assert quick["total"] <= full["total"], (profile, quick["total"], full["total"])


def test_the_parts_follow_their_inputs():
    """Each part against a second formula: waves of requests at the batched E2E, a start that grows with the
    weights, downloads only where the model does not ship, a calibrated build slower than round-to-nearest."""
    h100, cpu = runtime.PROFILES["h100"], runtime.PROFILES["cpu"]
    expected = predicted_e2e_s(h100, 512, 128, 4, efficiency=timing.EXPECTED_EFFICIENCY)
    assert expected == pytest.approx(predicted_e2e_s(h100, 512, 128, 4) * 0.5 / timing.EXPECTED_EFFICIENCY, rel=0.01)
    assert timing.requests(h100, 10, 512, 128, 4) == pytest.approx(3 * expected)
    assert timing.requests(h100, 0, 512, 128, 4) == 0
    assert timing.run(h100, 60, 512, 128, 8) == pytest.approx(60 + timing.e2e(h100, 512, 128, 8))
    big = timing.start(h100, "Qwen/Qwen2.5-1.5B-Instruct")
    assert timing.start(h100) - big == pytest.approx(
        (timing._weights(h100, None) - timing._weights(h100, "Qwen/Qwen2.5-1.5B-Instruct")) / timing.DISK_BPS)
    assert timing.start(h100, tp=2) < timing.start(h100)
    assert timing.download(cpu) == 0 and timing.download(h100) > 30
    assert timing.build(h100, True, 512 * 2048) > timing.build(h100, False) > 0


def test_a_longer_plan_predicts_a_longer_lab():
    """The time model reads the plan's values, not constants of its own: doubling lab 10's run doubles its runs."""
    h100 = runtime.PROFILES["h100"]
    v = dict(plan.lab("10", h100).values)
    base = timing.lab_time("10", h100, v)["total"]
    v["duration_s"] = 2 * v["duration_s"]
    assert timing.lab_time("10", h100, v)["total"] > base + v["duration_s"] / 2


def test_the_measured_table_names_each_lab(tmp_path):
    f = tmp_path / "seconds.json"
    f.write_text('{"10": {"total": 120.0, "cells": {"3": 30.0}}, "xx": {"total": 1, "cells": {}}}')
    assert plan.main(["cpu", "--quick", "--measured", str(f)]) == 0
    assert plan.main(["cpu", "--measured", str(tmp_path / "none.json")]) == 2


def test_the_readme_states_the_predicted_time():
    assert plan.time_table() in (Path(__file__).parents[1] / "README.md").read_text(), \
        "README's time table is stale: paste `python -m helpers.plan --time`"


#: What a cell that does work calls: a server, the load generator, a build, an evaluation, a request, a search.
WORK = re.compile(r"server\.|bench\.|quant\.|evals\.|fleet\.|serve|start|run\(|measure|probe|requests|build|"
                  r"tokeniz|search|settle|completions|sweep|subprocess")


def test_each_named_cell_is_a_working_code_cell_of_its_notebook():
    """The time model names cells by their index in the notebook: a notebook edited under it (a cell split or moved)
    must move the names too, or the predictions and the measured seconds stop meeting."""
    labs = Path(__file__).parents[1] / "labs"
    for n in sorted(plan.LABS):
        cells = json.loads(next(labs.glob(f"{n}_*.ipynb")).read_text())["cells"]
        for c in plan.lab(n, "h100").time_s["cells"][:-1]:
            i = int(c["cell"].split(":")[0].removeprefix("cell "))
            assert i < len(cells) and cells[i]["cell_type"] == "code", f"lab {n}: {c['cell']!r} is no code cell"
            assert WORK.search("".join(cells[i]["source"])), f"lab {n}: {c['cell']!r} names a cell that does no work"
