"""pytest settings for running the labs with nbval (``make test-labs``), and the minutes each notebook took.

nbval reads a cell's output messages only after the kernel has replied that the cell finished, and gives each 5
seconds to arrive; a missing one fails the cell (and skips the rest of its notebook). Lab 17's search cell failed
that way twice: after 274 s of search with the 5 s, and in CI (2026-12-03) after 538 s with a minute. The messages
were not late but dropped: ZeroMQ discards what overflows its queues, the cell's closing "idle" status too, and the
load generator's bar was redrawn every 0.1 s (2,700 and 5,400 redraws; under nbval a cell of 500 redraws passes and
one of 5,000 fails). ``helpers.progress`` now spaces redraws, and ``tests/test_progress.py`` runs both sides under
nbval. The minute, set before the cause was known, stays as margin for a busy machine: it is far below a cell's own
limit (``--nbval-cell-timeout``), so a kernel that really hangs still fails.
"""

import json
import os
from pathlib import Path

OUTPUT_TIMEOUT_S = 60
#: Where the run's seconds per notebook and cell go, for ``python -m helpers.plan cpu --quick --measured FILE`` (the
#: plans' predicted time beside what this run measured).
SECONDS_JSON = Path(os.environ.get("LABS_SECONDS_JSON", "runs/lab_seconds.json"))


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's IPyNbCell
            item.output_timeout = OUTPUT_TIMEOUT_S


#: Seconds each notebook's cells took (setup, call and teardown), for the summary that ends the run: what each lab
#: costs of `make test`'s budget (ci/README.md).
_SECONDS: dict[str, float] = {}
_CELLS: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report):
    notebook, _, cell = report.nodeid.partition("::")
    _SECONDS[notebook] = _SECONDS.get(notebook, 0.0) + report.duration
    cells = _CELLS.setdefault(notebook, {})
    cells[cell] = cells.get(cell, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    terminalreporter.section("minutes per notebook")
    for notebook, seconds in _SECONDS.items():
        terminalreporter.write_line(f"{seconds / 60:6.1f}  {notebook}")
    terminalreporter.write_line(f"{sum(_SECONDS.values()) / 60:6.1f}  all {len(_SECONDS)} notebooks")
    SECONDS_JSON.parent.mkdir(parents=True, exist_ok=True)
    SECONDS_JSON.write_text(json.dumps({Path(n).name[:2]: {"total": round(_SECONDS[n], 1), "cells": _by_index(
        n, _CELLS[n])} for n in _SECONDS}, indent=1))


def _by_index(notebook: str, cells: dict[str, float]) -> dict[str, float]:
    """nbval's "Cell k" counts code cells; the plans' time model names a cell by its index in the notebook."""
    try:
        index = [i for i, c in enumerate(json.loads(Path(notebook).read_text())["cells"]) if c["cell_type"] == "code"]
    except (OSError, ValueError, KeyError):
        return {c: round(t, 1) for c, t in cells.items()}
    out = {}
    for name, t in cells.items():
        k = name.removeprefix("Cell ")
        key = str(index[int(k)]) if k.isdigit() and int(k) < len(index) else name
        out[key] = round(t, 1)
    return out
