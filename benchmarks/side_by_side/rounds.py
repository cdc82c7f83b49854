"""The side-by-side run: every tool at one load in interleaved rounds, then the checks, then the report."""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from . import checks, compare, explain, render
from . import tools as _tools
from .records import Load, Target, ToolRun, server_under_test, target_record

__all__ = ["side_by_side", "build_report", "order"]


def order(tools: Sequence[str], round_: int) -> list[str]:
    """The tools in round ``round_``: rotated by one each round, so no tool always goes first."""
    k = round_ % len(tools)
    return list(tools[k:]) + list(tools[:k])


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def side_by_side(target: Target, load: Load, out: Path, rounds: int = 3, tools: Sequence[str] = _tools.TOOLS,
                 log: Callable[[str], None] = print, probe_role_chunk: bool = True, calibration: bool = True,
                 extra_rounds: int = 0, server: Any = None) -> dict[str, Any]:
    """Run every tool ``rounds`` times at ``load`` against ``target`` (rotating the order each round), run the
    checks, compare, and write the report (``report.md``, ``.json``, ``.html`` and its charts) into ``out``.
    Returns the report as a dict (``report["runs"]`` holds every :class:`ToolRun`).

    ``extra_rounds``: when the verdict misses the tolerance, run up to this many more rounds (same rotation) and
    judge all rounds together. ``server``: the :class:`helpers.server.Server` (for the provenance), if started here.
    """
    out = Path(out).resolve()  # the tools run in other working directories
    out.mkdir(parents=True, exist_ok=True)
    tools, exes, notes = _tools.prepare(tools, log)
    runs: list[ToolRun] = []
    t_start = time.time()

    def one_round(rnd: int, total: int) -> None:
        for tool in order(tools, rnd):
            d = out / "runs" / f"round{rnd}-{tool}"
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            log(f"round {rnd + 1}/{total}: {_tools.LABELS[tool]} ...")
            run = _tools.run(tool, target, load, d, rnd, exes)
            m = run.matched
            lost = compare.lost(run, load)
            log(f"  {'ok' if run.ok else 'FAILED'}: {m['n']} completed, {m['failed']} failed"
                + (f", {lost} lost (no record)" if lost else "") + ", TTFT mean "
                f"{_fmt(m['ttft_mean'])} ms, TPOT mean {_fmt(m['tpot_mean'])} ms (server: "
                f"{_fmt(run.server_mean('ttft'))}, {_fmt(run.server_mean('tpot'))}), {run.wall_s or 0:.0f} s"
                + (f"\n  {run.error}" if run.error else ""))
            runs.append(run)

    for rnd in range(rounds):
        one_round(rnd, rounds)
    done = rounds
    while done < rounds + extra_rounds and not compare.verdict(runs, tools):
        notes.append(f"round {done + 1} was added: after {done} rounds the comparison missed the "
                     f"{compare.TOLERANCE:.0%} tolerance (machine noise is the usual cause; all rounds are judged "
                     "together)")
        log(notes[-1])
        one_round(done, rounds + extra_rounds)
        done += 1
    probe = checks.role_chunk_probe(target) if probe_role_chunk else None
    cal = None
    if calibration:
        try:
            cal = checks.calibration_check(target.model_path, out, tools=tools, exes=exes, log=log)
        except Exception as e:  # noqa: BLE001 - the main comparison stands without it
            notes.append(f"the calibration cross-check failed: {type(e).__name__}: {e}")
            log(notes[-1])
    report = build_report(target, load, runs, tools, done, probe, notes, time.time() - t_start, cal)
    render.write_report(out, report, render.provenance_of(server, target))
    return report


def build_report(target: Target, load: Load, runs: list[ToolRun], tools: Sequence[str], rounds: int,
                 probe: dict[str, Any] | None, notes: list[str], elapsed_s: float,
                 calibration: dict[str, Any] | None = None, date: str | None = None) -> dict[str, Any]:
    """The report as a dict: the setting, every number (:func:`compare.summarize_runs`) and every run."""
    report: dict[str, Any] = {
        "date": date or _dt.datetime.now().isoformat(timespec="seconds"), "target": target_record(target),
        "load": asdict(load), "load_description": load.describe(), "rounds": rounds, "elapsed_s": elapsed_s,
        "versions": _tools.versions(tools), "sources": explain.source_paths(), "notes": list(notes),
        "role_chunk": probe, "calibration": calibration,
    }
    report.update(compare.summarize_runs(runs, load, tools))
    report["runs"] = runs
    return report


def rerender(out: Path) -> dict[str, Any]:
    """Rebuild the report from the runs saved in ``out/report.json`` (no server needed; provenance kept)."""
    old = json.loads((Path(out) / f"{render.STEM}.json").read_text())
    runs = [ToolRun.from_dict(d) for d in old["runs"]]
    rep = build_report(server_under_test(**old["target"]), Load(**old["load"]), runs, old["tools"], old["rounds"],
                       old.get("role_chunk"), old.get("notes", []), old.get("elapsed_s", 0.0),
                       old.get("calibration"), date=old.get("date"))
    rep["versions"], rep["sources"] = old.get("versions", rep["versions"]), old.get("sources", rep["sources"])
    render.write_report(Path(out), rep, old.get("provenance"))
    return rep
