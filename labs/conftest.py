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

OUTPUT_TIMEOUT_S = 60


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's IPyNbCell
            item.output_timeout = OUTPUT_TIMEOUT_S


#: Seconds each notebook's cells took (setup, call and teardown), for the summary that ends the run: what each lab
#: costs of `make test`'s budget (ci/README.md).
_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    notebook = report.nodeid.split("::")[0]
    _SECONDS[notebook] = _SECONDS.get(notebook, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    terminalreporter.section("minutes per notebook")
    for notebook, seconds in _SECONDS.items():
        terminalreporter.write_line(f"{seconds / 60:6.1f}  {notebook}")
    terminalreporter.write_line(f"{sum(_SECONDS.values()) / 60:6.1f}  all {len(_SECONDS)} notebooks")
