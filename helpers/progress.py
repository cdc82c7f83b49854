"""Progress bars that redraw at a bounded rate, so a long cell cannot flood its notebook's output channel.

A Jupyter kernel sends every redraw of a progress bar to its frontend as messages on one ZeroMQ socket (a notebook
bar: about three widget updates a redraw). JupyterLab and papermill read them as they come; nbval (``make test``)
reads a cell's messages only once the cell has finished, and ZeroMQ drops what overflows its queues, the last
message too: the "idle" status that tells nbval the cell is done. Measured here: a cell that redrew a bar 5,000
times failed under nbval with "Timeout ... exceeded waiting for output" (500 times passed), and so did lab 17's
search cell in CI, whose load generator redrew its bar every 0.1 s for nine minutes. ``Bar`` redraws at most once
per ``interval_s``: half a second for a person watching, ten seconds in a headless run (``LABS_HEADLESS=1``),
where nobody is.

    bar = progress.Bar(total=100, desc="requests", unit="req")
    for i in range(100):
        bar.show(i + 1, postfix="in flight 3")   # redraws only when the interval has passed
    bar.close()                                 # always redraws the final state
"""

from __future__ import annotations

import math
import time
from typing import Callable

from . import settings

__all__ = ["Bar", "INTERVAL_S", "HEADLESS_INTERVAL_S", "redraw_interval_s"]

#: Seconds between two redraws for a person watching, and in a headless run (``make test``, papermill).
INTERVAL_S = 0.5
HEADLESS_INTERVAL_S = 10.0


def redraw_interval_s() -> float:
    """The seconds between two redraws of a bar here: ``HEADLESS_INTERVAL_S`` when headless, else ``INTERVAL_S``.

    Introduced in lab 01 (One GPU, One Model).
    """
    return HEADLESS_INTERVAL_S if settings.headless() else INTERVAL_S


class Bar:
    """A tqdm bar (a notebook widget in Jupyter) that redraws at most once per ``interval_s``.

    ``enabled=False``, or tqdm missing, gives a bar that shows nothing; ``redraws`` counts what was drawn.
    ``clock`` is for tests. Introduced in lab 01 (One GPU, One Model).
    """

    def __init__(self, *, total: int | None = None, desc: str = "", unit: str = "it", leave: bool = True,
                 bar_format: str | None = None, enabled: bool = True, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = redraw_interval_s() if interval_s is None else interval_s
        self.redraws = 0
        self._clock, self._last, self._bar = clock, -math.inf, None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return
        kw = {"bar_format": bar_format} if bar_format else {}
        self._bar = tqdm(total=total, desc=desc, unit=unit, leave=leave, **kw)

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def show(self, n: int | None = None, postfix: str | None = None, *, force: bool = False) -> None:
        """Set the count to ``n`` (never backwards) and the text after the bar; redraw if the interval has passed."""
        if self._bar is None:
            return
        if n is not None and n > self._bar.n:
            self._bar.n = n  # not update(), which redraws by itself: the rate shown is then the run's average
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
        now = self._clock()
        if force or now - self._last >= self.interval_s:
            self._last = now
            self.redraws += 1
            self._bar.refresh()

    def close(self) -> None:
        """Draw the final state and close the bar."""
        if self._bar is not None:
            self.show(force=True)
            self._bar.close()
            self._bar = None
