"""Progress bars redraw at a bounded rate, and that is what lets a long cell pass under nbval.

nbval reads a cell's output messages only after the cell has finished; ZeroMQ drops what overflows its queues, the
cell's closing "idle" status too, and nbval then fails the cell "waiting for output" (lab 17's search cell, in CI).
"""

import json
import os
import subprocess
import sys
from itertools import count

import pytest

from helpers import progress


def _clock(step_s):
    ticks = count()
    return lambda: next(ticks) * step_s


def test_a_bar_redraws_once_per_interval_and_always_at_the_end():
    bar = progress.Bar(total=1000, desc="requests", interval_s=10.0, clock=_clock(0.1))
    for i in range(1000):  # 100 s of a load generator's 0.1 s ticks
        bar.show(i + 1, postfix=f"in flight {i % 7}")
    assert bar.redraws == 10  # at 0, 10, ..., 90 s
    bar.close()
    assert bar.redraws == 11  # the final state is drawn, whatever the interval
    assert not bar.enabled


def test_a_bar_never_counts_backwards_and_a_disabled_one_draws_nothing():
    bar = progress.Bar(total=10, interval_s=0.0, clock=_clock(1.0))
    bar.show(5)
    bar.show(3)
    assert bar._bar.n == 5
    bar.close()
    off = progress.Bar(total=10, enabled=False)
    off.show(5)
    off.close()
    assert off.redraws == 0


def test_headless_runs_redraw_rarely(monkeypatch):
    monkeypatch.setenv("LABS_HEADLESS", "1")
    assert progress.Bar(enabled=False).interval_s == progress.HEADLESS_INTERVAL_S
    monkeypatch.setenv("LABS_HEADLESS", "0")
    assert progress.Bar(enabled=False).interval_s == progress.INTERVAL_S


CELL = """from itertools import count
from helpers import progress
ticks = count()
bar = progress.Bar(total=5000, desc="requests", unit="req", interval_s={interval}, clock=lambda: next(ticks) * 0.1)
for i in range(5000):  # 500 s of a load generator's 0.1 s ticks, drawn as fast as the kernel can
    bar.show(i + 1, postfix=f"in flight {{i % 7}}")
bar.close()
print("redraws", bar.redraws)
"""


def _nbval(tmp_path, interval):
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                     "source": CELL.format(interval=interval)},
                    {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                     "source": "print('the next cell ran')"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / f"bar_{interval:g}.ipynb"
    path.write_text(json.dumps(nb))
    env = dict(os.environ, LABS_HEADLESS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "--rootdir", str(tmp_path), str(path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_under_nbval_a_long_cell_passes_with_spaced_redraws(tmp_path):
    """5,000 ticks drawn at the headless interval pass under nbval, and the next cell runs. The same cell redrawing
    on every tick lost its "idle" status, as lab 17's search cell's was, but only when ZeroMQ's queue overflowed: a
    race, which once (stop 33) did not happen, so that case is not asserted here. What decides it, the number of
    redraws, is asserted exactly above."""
    pytest.importorskip("nbval")
    pytest.importorskip("ipywidgets")
    r = _nbval(tmp_path, progress.HEADLESS_INTERVAL_S)
    assert r.returncode == 0, r.stdout[-3000:]
