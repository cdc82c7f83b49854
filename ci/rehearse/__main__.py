"""Rehearse the labs on a GPU machine this machine is not: ``python -m ci.rehearse --profile h100 [--labs 04,24]
[--card "NVIDIA A100-SXM4-40GB"] [--gpus 2]``.

Each lab's notebook is executed, in order, with its profile's plan at rehearsal size (the full plan's structure,
counts and durations cut: ``LABS_REHEARSAL=1``), against the vLLM stand-in (:mod:`ci.rehearse.standin`) on the
rehearsed card (:mod:`ci.rehearse.cards`), in a world of its own (:mod:`ci.rehearse.home`). It exits 0 only when
every cell of every lab ran; a check cell's ``AssertionError`` is recorded as not judged (a stand-in's numbers prove
nothing), any other exception fails the lab. It writes ``report.json`` and ``report.md`` in its output folder: per
lab, the cells run, the servers started and the share of the card each asked for, the disk the lab writes at full
size (its plan's), the checks not judged; nothing under ``reports/`` (a rehearsal's numbers are never a deliverable).

``--machine`` names one of :data:`ci.rehearse.cards.MACHINES`; ``--all`` rehearses every lab on each of them (``make
rehearse``), ``--all --sample`` every lab once, on the machines :data:`ci.rehearse.cards.SAMPLE` gives (``make test``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cards, home

ROOT = home.ROOT


def select(spec: str | None) -> list[Path]:
    labs = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    if not spec:
        return labs
    wanted: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        wanted.update(range(int(lo), int(hi or lo) + 1))
    return [p for p in labs if int(p.name[:2]) in wanted]


def _reports_snapshot() -> dict[str, float]:
    folder = ROOT / "reports"
    return {str(p): p.stat().st_mtime for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def rehearse(machine: cards.Machine, labs: list[Path], out: Path, keep: bool = False) -> dict:
    """Run ``labs`` on ``machine``; returns the report (also written to ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    world = Path(tempfile.mkdtemp(prefix=f"rehearsal-{machine.key}-"))
    before = _reports_snapshot()
    t0 = time.time()
    try:
        env = {**os.environ, **home.build(world, machine), "LABS_SESSION": f"rehearsal-{os.getpid()}"}
        cmd = [sys.executable, "-m", "ci.rehearse.executor", "--out", str(out / "labs"), *map(str, labs)]
        print(f"== rehearsal on {machine.key}: {machine.count} x {machine.card.name} "
              f"({machine.card.memory_mib} MiB, compute capability {'.'.join(map(str, machine.card.compute_capability))})"
              f", profile {machine.profile or '(detected)'}", flush=True)
        rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
        report = summarize(machine, labs, out, world, time.time() - t0)
        report["exit_code"] = rc
    finally:
        if not keep:
            shutil.rmtree(world, ignore_errors=True)
    after = _reports_snapshot()
    touched = sorted(p for p, m in after.items() if before.get(p) != m)
    if touched:
        report["wrote_reports"] = touched
        report["exit_code"] = report["exit_code"] or 3
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))
    return report


def summarize(machine: cards.Machine, labs: list[Path], out: Path, world: Path, seconds: float) -> dict:
    servers: dict[str, list[dict]] = {}
    log = world / "servers.jsonl"
    for line in log.read_text().splitlines() if log.exists() else []:
        d = json.loads(line)
        servers.setdefault(d.get("lab", "?"), []).append(d)
    rows = []
    for nb in labs:
        f = out / "labs" / f"{nb.stem}.json"
        r = json.loads(f.read_text()) if f.exists() else {"lab": nb.name, "status": "not run", "cells": []}
        rows.append({"lab": nb.name, "status": r["status"], "seconds": round(r.get("seconds", 0.0), 1),
                     "cells_run": sum(c["status"] != "failed" for c in r.get("cells", [])),
                     "failed_cell": r.get("failed_cell"), "error": (r.get("cells") or [{}])[-1].get("error", "")
                     if r["status"] == "failed" else "", "not_judged": r.get("not_judged", []),
                     "servers": servers.get(nb.name[:2], []), **_plan_facts(nb.name[:2], machine)})
    return {"machine": cards.describe(machine), "profile": machine.profile, "seconds": round(seconds, 1),
            "labs": rows, "passed": all(r["status"] == "ok" for r in rows)}


def _plan_facts(lab: str, machine: cards.Machine) -> dict:
    """The lab's plan at full size for the profile the lab picks on the rehearsed card (its own memory, capability
    and count): the disk it writes (and keeps), and the time it is predicted to take."""
    try:
        from helpers import plan, runtime

        gpus = tuple(runtime.GPU(machine.card.name, machine.card.memory_mib / 1024, machine.card.compute_capability)
                     for _ in range(machine.count))
        here = runtime.Machine(is_colab=False, gpus=gpus, cpu_count=16, memory_gib=128.0)
        p = plan.lab(lab, runtime.profile(machine.profile, machine=here), quick=False)
        d = p.disk_bytes or {}
        return {"disk_peak_gb": round(d.get("peak", 0) / 1e9, 1), "disk_kept_gb": round(d.get("kept", 0) / 1e9, 1),
                "time_s": p.time_s}
    except Exception as e:  # noqa: BLE001 - the report says why, the rehearsal's verdict does not depend on it
        return {"plan_error": f"{type(e).__name__}: {e}"[:300]}


def _minutes(t: dict | None) -> str:
    """A lab's predicted full-size minutes and its longest cell, from its plan's ``time_s``."""
    if not t:
        return "?"
    big = max(t["cells"], key=lambda c: c["s"])
    return f"{t['total'] / 60:.1f} ({big['cell'].split(':')[0]} {big['s'] / 60:.1f})"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Rehearsal on {m['count']} x {m['card']} ({m['memory_mib']} MiB, cc {m['compute_capability']}, driver "
             f"{m['driver']}), profile {report['profile'] or 'detected'}", "",
             f"{'passed' if report['passed'] else 'FAILED'} in {report['seconds']:.0f} s. Numbers below come from the "
             "plan or a stand-in: none is a measurement.", "",
             "| lab | status | s | cells | servers (share of the card each asked for) | disk at full size (GB, kept) "
             "| predicted at full size: min (longest cell) | checks not judged |", "|---|---|---|---|---|---|---|---|"]
    for r in report["labs"]:
        srv = ", ".join(f"{s.get('model_name', '?')}@{s.get('share', '?')}" for s in r["servers"]) or "-"
        lines.append(f"| {r['lab']} | {r['status']}{' at cell ' + str(r['failed_cell']) if r['failed_cell'] is not None else ''}"
                     f" | {r['seconds']} | {r['cells_run']} | {srv} | {r.get('disk_peak_gb', '?')} "
                     f"({r.get('disk_kept_gb', '?')}) | {_minutes(r.get('time_s'))} | {len(r['not_judged'])} |")
    for r in report["labs"]:
        if r["status"] == "failed":
            lines += ["", f"## {r['lab']}: failed at cell {r['failed_cell']}", "", "```", r["error"], "```"]
    return "\n".join(lines) + "\n"


def rehearse_all(labs: str | None, jobs: int, out: Path, sample: bool = False) -> int:
    """Every machine of :data:`ci.rehearse.cards.MACHINES`, ``jobs`` at a time (each its own world and process: a
    rehearsal waits on its stand-ins' clocks most of the time, so two share a core well); a summary of all of them
    in ``out/report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    shares = {k: cards.SAMPLE[k] for k in cards.SAMPLE} if sample else {k: labs for k in cards.MACHINES}
    pending, running, done = list(shares), {}, {}
    t0 = time.time()
    while pending or running:
        while pending and len(running) < max(1, jobs):
            key = pending.pop(0)
            log = open(out / f"{key}.log", "w")
            cmd = [sys.executable, "-m", "ci.rehearse", "--machine", key, "--out", str(out / key),
                   *(["--labs", shares[key]] if shares[key] else [])]
            running[key] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log, time.time())
        time.sleep(0.5)
        for key, (proc, log, started) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                done[key] = (proc.returncode, time.time() - started)
                del running[key]
                tail = (out / f"{key}.log").read_text().strip().splitlines()[-1:] or [""]
                print(f"   {key}: {'passed' if proc.returncode == 0 else 'FAILED'} in {done[key][1]:.0f} s "
                      f"({tail[0].strip()[:120]})", flush=True)
    lines = ["# Rehearsals", "", f"{len(done)} machines, {jobs} at a time, in {time.time() - t0:.0f} s. Each row is "
             "the machine's own report; every number in them comes from a plan or a stand-in, none is a "
             "measurement.", "", "| machine | labs | result | s | report |", "|---|---|---|---|---|"]
    for key in shares:
        rc, secs = done[key]
        lines.append(f"| {key} | {shares[key] or 'all'} | {'passed' if rc == 0 else 'FAILED'} | {secs:.0f} | "
                     f"[{key}/report.md]({key}/report.md) |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    failed = [k for k, (rc, _) in done.items() if rc != 0]
    print(f"== rehearsals: {len(done) - len(failed)} of {len(done)} machines passed in {time.time() - t0:.0f} s"
          + (f"; failed: {', '.join(failed)} (see {out}/<machine>.log)" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ci.rehearse", description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every machine make test rehearses (with --jobs)")
    ap.add_argument("--jobs", type=int, default=2, help="with --all: machines at a time (default 2)")
    ap.add_argument("--sample", action="store_true", help="with --all: every lab once, on the machine cards.SAMPLE "
                                                          "gives it (make test's share)")
    ap.add_argument("--profile", help="a GPU profile (colab-t4, l4, a100, h100, h200, b200)")
    ap.add_argument("--machine", help=f"a rehearsal machine: {', '.join(cards.MACHINES)}")
    ap.add_argument("--card", help="another card for the profile, by nvidia-smi name (e.g. 'NVIDIA A100-SXM4-40GB')")
    ap.add_argument("--gpus", type=int, help="how many cards (default 1)")
    ap.add_argument("--labs", help="e.g. 04,24 or 01-11 (default: all)")
    ap.add_argument("--out", help="output folder (default runs/rehearsal-<machine>)")
    ap.add_argument("--keep", action="store_true", help="keep the rehearsal's world (its temporary folder)")
    a = ap.parse_args(argv)
    if a.all:
        return rehearse_all(a.labs, a.jobs, Path(a.out or ROOT / "runs" / "rehearsal").resolve(), sample=a.sample)
    if not (a.profile or a.machine):
        ap.error("name a --profile, a --machine or --all")
    key = a.machine or a.profile
    try:
        m = cards.machine(key, a.card, a.gpus)
    except KeyError as e:
        ap.error(str(e.args[0]))
    if a.profile and not m.profile:
        m = cards.Machine(m.key, m.card, m.count, m.driver, a.profile, m.why)
    # absolute: the executor runs each lab in the lab's own folder
    out = Path(a.out or ROOT / "runs" / f"rehearsal-{m.key.replace('@', '-').replace(' ', '_')}").resolve()
    report = rehearse(m, select(a.labs), out, keep=a.keep)
    print(f"== {'passed' if report['passed'] and not report['exit_code'] else 'FAILED'}: {out / 'report.md'}")
    if report.get("wrote_reports"):
        print(f"error: the rehearsal wrote under reports/: {report['wrote_reports']}", file=sys.stderr)
    return 0 if report["passed"] and not report["exit_code"] else 1


if __name__ == "__main__":
    sys.exit(main())
