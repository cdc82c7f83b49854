"""Run the whole lab sequence with papermill, the way an instructor's GPU runner does.

    python ci/run_sequence.py --profile h100                 # every lab, GPU-sized loads
    python ci/run_sequence.py --profile cpu --quick --labs 01-05
    python ci/run_sequence.py --profile h200 -p NUM_REQUESTS 400

Each executed notebook (charts embedded as images, so it reads offline), the phase reports (LABS_REPORTS points into
the run folder) and a ``summary.json`` / ``summary.md`` (lab, status, minutes, error) land in
``runs/<timestamp>-<profile>/``. A failing lab is recorded and the sequence goes on; the exit code is non-zero if any
lab failed. Servers left by a failed lab are stopped before the next one starts; with ``LABS_REUSE_SERVER=1`` a lab
that passed parks its server for the next (``make test`` runs lab 01 this way, then the rest under nbval), and the
sequence stops its session's servers at the end unless ``--keep-servers``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def select(labs: list[Path], spec: str | None) -> list[Path]:
    """``01-05,09`` -> those notebooks (by their NN prefix)."""
    if not spec:
        return labs
    wanted: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        wanted.update(range(int(lo), int(hi or lo) + 1))
    return [p for p in labs if int(p.name[:2]) in wanted]


def parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="cpu, colab-t4, l4, a100, h100, h200, b200 (default: detect)")
    ap.add_argument("--labs", default=None, help="e.g. 01-11 or 02,05 (default: all)")
    ap.add_argument("--quick", action="store_true", help="CI-sized loads (LABS_QUICK=1)")
    ap.add_argument("--out", default=None, help="run folder (default runs/<timestamp>-<profile>)")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="override a parameters-cell variable in every lab (JSON values)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    ap.add_argument("--keep-servers", action="store_true",
                    help="leave this session's parked servers running at the end (make test hands them to nbval)")
    args = ap.parse_args(argv)

    import papermill as pm

    from helpers import server

    profile = args.profile or "detected"
    out = Path(args.out or ROOT / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile}")
    (out / "reports").mkdir(parents=True, exist_ok=True)
    os.environ["LABS_REPORTS"] = str(out / "reports")
    os.environ["LABS_HOME"] = str(ROOT)
    os.environ["LABS_HEADLESS"] = "1"  # widgets show their default view as a static chart
    session = os.environ.setdefault("LABS_SESSION", f"run-sequence-{os.getpid()}")
    if args.profile:
        os.environ["LABS_PROFILE"] = args.profile
    if args.quick:
        os.environ["LABS_QUICK"] = "1"
    params = {name: parse_value(value) for name, value in args.parameter}

    labs = select(sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb")), args.labs)
    rows = []
    for nb in labs:
        t0 = time.time()
        status, error = "ok", ""
        print(f"== {nb.name}", flush=True)
        try:
            pm.execute_notebook(str(nb), str(out / nb.name), parameters=params, cwd=str(ROOT / "labs"),
                                kernel_name="python3", execution_timeout=args.timeout, progress_bar=False)
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's traceback
            status, error = "failed", f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
        if status != "ok" or os.environ.get("LABS_REUSE_SERVER", "") not in ("1", "true", "yes"):
            server.stop_all(verbose=True, session=session)  # a failed lab must not leave its server behind
        rows.append({"lab": nb.name, "status": status, "minutes": round((time.time() - t0) / 60, 1),
                     "error": error})
        print(f"   {status} in {rows[-1]['minutes']} min {error}", flush=True)

    if not args.keep_servers:
        server.stop_all(verbose=True, session=session)
    (out / "summary.json").write_text(json.dumps({"profile": profile, "labs": rows}, indent=2))
    lines = [f"# Lab run: profile {profile}", "", "| lab | status | minutes | error |", "|---|---|---|---|"]
    lines += [f"| {r['lab']} | {r['status']} | {r['minutes']} | {r['error']} |" for r in rows]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"executed notebooks and reports in {out}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
