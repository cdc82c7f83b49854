"""pytest settings for running the labs with nbval (``make test-labs``).

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
