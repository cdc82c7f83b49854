"""The expert's diagnostic checklist ("it's slow / broken") as code, over what a running deployment exposes.

::

    from helpers import doctor

    d = doctor.diagnose(srv, run=run_folder, slo=bench.SLO(ttft_ms=800, tpot_ms=40))
    print(d)                      # every finding: symptom, cause, evidence, fix, lab; then what could not be checked
    d.has("ttft.queue")           # a finding by its check id
    d.to_json()                   # the findings as a JSON list

From a shell: ``python -m helpers.doctor --base-url http://127.0.0.1:8000 [--run DIR] [--window S] [--json]``.

- :mod:`~helpers.doctor.evidence`: the server's ``/metrics`` over a window, its start-up log and engine arguments,
  ``vllm:cache_config_info``, a benchmark run folder — gathered into one :class:`Evidence`;
- :mod:`~helpers.doctor.checklist`: one rule per question of the checklist, in its order, each returning a
  :class:`Finding` or saying why it found nothing (or could not look).

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..bench.stats import SLO
from ..bench.store import RunResult
from .checklist import CHECKLIST, LAB_TITLES, Check, Diagnosis, Finding, examine
from .evidence import Evidence, RunFacts, engine_args_from_log, find_log, from_snapshots, gather

__all__ = ["diagnose", "examine", "gather", "Diagnosis", "Finding", "Check", "Evidence", "RunFacts", "CHECKLIST",
           "LAB_TITLES", "engine_args_from_log", "find_log", "from_snapshots"]


def diagnose(target: Any = None, *, run: str | Path | RunResult | None = None, window_s: float = 0.0,
             slo: SLO | None = None, log: str | Path | None = None, engine_args: Mapping[str, Any] | None = None,
             api_key: str | None = None) -> Diagnosis:
    """Gather the evidence of ``target`` (a :class:`helpers.server.Server` or a URL) and ``run`` (a run folder or
    result), then run the checklist over it. See :func:`~helpers.doctor.evidence.gather` for the window.

    Introduced in lab 24 (Putting It All Together).
    """
    return examine(gather(target, run=run, window_s=window_s, log=log, engine_args=engine_args, slo=slo,
                          api_key=api_key))
