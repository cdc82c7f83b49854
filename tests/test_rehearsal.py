"""The GPU rehearsal finds what the CPU run cannot: an error on a path only a GPU plan takes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from ci.rehearse import cards
from ci.rehearse.__main__ import rehearse

ROOT = Path(__file__).resolve().parent.parent


def _planted(tmp_path: Path, source: str) -> Path:
    """Lab 03 with one more cell after its plan cell."""
    nb = json.loads((ROOT / "labs" / "03_sizing_the_kv_cache.ipynb").read_text())
    at = next(i for i, c in enumerate(nb["cells"]) if "PLAN = plan.lab" in "".join(c["source"])) + 1
    nb["cells"].insert(at, {"cell_type": "code", "id": uuid.uuid4().hex[:8], "metadata": {}, "execution_count": None,
                            "outputs": [], "source": source.splitlines(keepends=True)})
    path = tmp_path / "03_sizing_the_kv_cache.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.heavy  # ~15-25 s: a lab executed against the stand-in (Makefile test-unit)
def test_a_planted_error_on_a_gpu_only_path_fails_the_rehearsal(tmp_path):
    """A list index the GPU plan does not hold, on a path the CPU profile never takes (so `make test`'s CPU run of the
    lab passes it): the rehearsal on an H100 fails the lab at that cell, with the error, and runs the rest of the lab
    as written when nothing is planted."""
    planted = _planted(tmp_path, 'if PROFILE.device == "cuda":\n    PLAN["no_such_key_on_a_gpu"]\n')
    report = rehearse(cards.machine("h100"), [planted], tmp_path / "out")
    row = report["labs"][0]
    assert not report["passed"] and row["status"] == "failed", report
    assert "KeyError" in row["error"] and "no_such_key_on_a_gpu" in row["error"], row["error"]
    (tmp_path / "clean").mkdir()
    clean = _planted(tmp_path / "clean", "x = 1\n")
    report = rehearse(cards.machine("h100"), [clean], tmp_path / "out-clean")
    assert report["passed"], report["labs"][0]
