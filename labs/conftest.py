"""pytest settings for running the labs with nbval (``make test-labs``), and the minutes each notebook took.

nbval gives a cell's output messages 5 seconds to arrive after the kernel has replied that the cell finished, and
fails the cell (and skips the rest of its notebook) when they are late. On a busy 2-core machine they were late
once: lab 17's search cell had finished its two searches in 274 s and was failed with "Timeout of 5 seconds
exceeded waiting for output"; the same notebook passed when run again. A minute is still far below a cell's own
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
