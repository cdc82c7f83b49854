"""``python -m helpers.doctor --base-url URL [--run DIR] [--window S] [--json]``: the checklist from a shell.

A server that needs an API key for ``/metrics`` gets it from an environment variable (``VLLM_API_KEY``, or the one
``--api-key-env`` names), never from the command line, where ``ps`` and shell history would show it.

Exit status: 0 with no finding, 1 with findings, 2 on bad arguments.

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..bench.stats import SLO
from . import diagnose


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labs-doctor",
                                 description="Diagnose a vLLM deployment with the expert's checklist.",
                                 allow_abbrev=False)  # else "--api-key SECRET" would pass as --api-key-env
    ap.add_argument("--base-url", help="the server (http://host:port, with or without /v1)")
    ap.add_argument("--run", help="a benchmark run folder (helpers.bench's requests.jsonl + summary.json)")
    ap.add_argument("--window", type=float, default=0.0,
                    help="seconds of live traffic to watch (default: the run's own window, else since start-up)")
    ap.add_argument("--slo-ttft-ms", type=float, help="p99 TTFT target (default: the run's SLO)")
    ap.add_argument("--slo-tpot-ms", type=float, help="p99 TPOT target (default: the run's SLO)")
    ap.add_argument("--log", help="the server's log, when the process registry does not know it")
    ap.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="VAR",
                    help="the environment variable holding the server's API key, if /metrics needs one "
                         "(default VLLM_API_KEY; the key itself never goes on the command line)")
    ap.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    a = ap.parse_args(argv)
    if not a.base_url and not a.run:
        ap.error("give --base-url, --run, or both")
    try:  # a bad input is one line and exit 2; exit 1 means findings
        if a.run and not (Path(a.run) / "requests.jsonl").is_file():
            raise ValueError(f"--run {a.run} is not a benchmark run folder (no requests.jsonl): pass the folder "
                             "`python -m helpers.bench run` printed")
        if a.log and not Path(a.log).is_file():
            raise ValueError(f"--log {a.log}: no such file")
        if a.window < 0:
            raise ValueError(f"--window must be 0 or more seconds, got {a.window:g}")
        given = a.slo_ttft_ms is not None or a.slo_tpot_ms is not None  # 0 is refused by SLO, not read as "none"
        slo = SLO(ttft_ms=a.slo_ttft_ms, tpot_ms=a.slo_tpot_ms) if given else None
        d = diagnose(a.base_url, run=a.run, window_s=a.window, slo=slo, log=a.log,
                     api_key=os.environ.get(a.api_key_env) or None)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(d.to_json() if a.json else d)
    return 1 if d.findings else 0


if __name__ == "__main__":
    sys.exit(main())
