"""Execute lab notebooks in this process, one after another, each in a fresh namespace of one IPython shell.

A kernel per lab (papermill, nbval) costs seconds of start-up and imports each time; a rehearsal runs every lab under
nine machines, so it keeps one interpreter and resets the namespace between labs. Cells run as a kernel runs them
(IPython's ``run_cell``: magics, ``??``, ``display``, post-run hooks); their output goes to the lab's log.

A cell tagged ``check`` that raises ``AssertionError`` is recorded as *not judged on a stand-in* and the lab goes on
(a stand-in's numbers prove nothing about a claim); any other exception ends the lab as failed, with the cell and
its traceback. The lab's servers are stopped after it, whatever happened.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CellResult:
    index: int
    tags: list[str]
    seconds: float
    status: str                    # ok, not-judged, failed
    error: str = ""


@dataclass
class LabResult:
    lab: str
    status: str = "ok"
    seconds: float = 0.0
    cpu_s: float = 0.0             # CPU of this process and of the processes the lab started and stopped
    cells: list[CellResult] = field(default_factory=list)
    failed_cell: int | None = None
    traceback: str = ""
    not_judged: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CellTimeout(Exception):
    pass


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.colors = "nocolor" if hasattr(shell, "colors") else None
    return shell


def run_lab(path: Path, log_path: Path, cell_timeout: float = 600.0) -> LabResult:
    nb = json.loads(path.read_text())
    shell = _shell()
    shell.reset(new_session=False)
    shell.user_ns["__name__"] = "__main__"
    result = LabResult(lab=path.name)
    t_lab, cpu0 = time.perf_counter(), _cpu()
    os.chdir(path.parent)
    with open(log_path, "w") as log:
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            tags = list(cell.get("metadata", {}).get("tags", []))
            buf = io.StringIO()
            t0 = time.perf_counter()

            def on_alarm(signum, frame):
                raise CellTimeout(f"cell {i} ran over {cell_timeout:.0f} s")

            old = signal.signal(signal.SIGALRM, on_alarm)
            signal.alarm(int(cell_timeout))
            try:
                with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                    res = shell.run_cell(src, store_history=False, silent=False)
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)
            dt = time.perf_counter() - t0
            log.write(f"=== cell {i} {tags} ({dt:.2f} s)\n{src}\n--- output\n{buf.getvalue()}\n")
            err = res.error_in_exec or res.error_before_exec
            if err is None:
                result.cells.append(CellResult(i, tags, dt, "ok"))
                continue
            tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
            log.write(f"--- error\n{tb}\n")
            if isinstance(err, AssertionError) and "check" in tags:
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else "assert"
                result.cells.append(CellResult(i, tags, dt, "not-judged", first))
                result.not_judged.append(f"cell {i}: {first}")
                continue
            result.cells.append(CellResult(i, tags, dt, "failed", f"{type(err).__name__}: {err}"[:500]))
            result.status, result.failed_cell, result.traceback = "failed", i, tb[-6000:]
            break
    _stop_everything()
    result.seconds, result.cpu_s = time.perf_counter() - t_lab, _cpu() - cpu0
    return result


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _stop_everything() -> None:
    """Stop what the lab started (servers, routers, gateways), parked or not: a rehearsal shares nothing between
    labs but the files they save."""
    with contextlib.suppress(Exception):
        from helpers import procs

        procs.stop_all(session=os.environ.get("LABS_SESSION") or None, verbose=False)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cell-timeout", type=float, default=600.0)
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()  # each lab runs in its own folder (os.chdir): a relative path would move with it
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for nb in a.notebooks:
        p = Path(nb).resolve()
        lab = p.name[:2]
        os.environ["REHEARSAL_LAB"] = lab
        r = run_lab(p, out / f"{p.stem}.log", a.cell_timeout)
        (out / f"{p.stem}.json").write_text(json.dumps(r.as_dict(), indent=1))
        mark = {"ok": "ok", "failed": "FAILED"}[r.status]
        extra = f" ({len(r.not_judged)} check cell(s) not judged)" if r.not_judged else ""
        where = f" at cell {r.failed_cell}: {r.cells[-1].error[:300]}" if r.status == "failed" else ""
        print(f"   {p.name}: {mark} in {r.seconds:.1f} s ({r.cpu_s:.1f} s CPU){extra}{where}", flush=True)
        failed += r.status != "ok"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
