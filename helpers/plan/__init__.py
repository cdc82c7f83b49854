"""Each lab's device-dependent sizes, from one place per lab, checked for every profile without a GPU.

A lab takes what the device decides (block size, KV blocks, max_model_len) from its live server, and everything
else that must differ between a 2-core CPU and an H200 — prompt lengths, batch sizes, loads, memory settings, how
long a measured run lasts — from its plan::

    PLAN = plan.lab("02", PROFILE, quick=QUICK)
    PROMPT_LENGTHS = PROMPT_LENGTHS or PLAN["prompt_lengths"]

Every plan carries the arithmetic that says it fits: the longest prompt + output within ``max_model_len``; on a
GPU, the weights plus one request of that length within the card at the lowest ``gpu_memory_utilization`` the
lab starts a server with; every measured run long enough for several requests to finish at the speed the
roofline (``helpers.sizing``, at a conservative fraction of the hardware's peak) predicts. ``python -m helpers.plan
PROFILE --json`` prints them; the unit tests evaluate every lab's plan for every profile.

Branching on the device belongs here, never in a lab.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import runtime
from . import capstone, phase1, phase2, phase3, phase4  # noqa: F401 - each registers its labs' planners
from . import lab_times, resources, timing  # noqa: F401 - lab_times registers each lab's cells
from .core import (EFFICIENCY, GPU_OVERHEAD_GIB, LABS, TINY_MOE, TINY_TP, LabPlan, PlanError, fits_context,
                   predicted_e2e_s)

__all__ = ["LabPlan", "PlanError", "lab", "plans", "disk_table", "sequence_time", "time_table", "time_against", "LABS",
           "predicted_e2e_s", "EFFICIENCY",
           "GPU_OVERHEAD_GIB", "TINY_TP", "TINY_MOE"]


def lab(number: str, profile: runtime.Profile | str, quick: bool | None = None) -> LabPlan:
    """Lab ``number``'s plan for ``profile`` (a Profile or a profile name); raises :class:`PlanError` when it does
    not fit.

    Introduced in lab 01 (One GPU, One Model).
    """
    from ..settings import quick as _quick

    prof = runtime.PROFILES[profile] if isinstance(profile, str) else profile
    number = f"{int(number):02d}"
    if number not in LABS:
        raise KeyError(f"no plan for lab {number}; plans exist for {', '.join(sorted(LABS))}")
    from ..settings import rehearsal as _rehearsal

    rehearse = _rehearsal()
    q = False if rehearse else (_quick() if quick is None else quick)
    raw = LABS[number](prof, q)
    cuts = raw.pop("rehearsal", {})
    if rehearse:  # the full plan's structure (every list's members, every toggle), its counts and durations cut
        raw["values"] = {**raw["values"], **cuts}
    servers, together = raw.pop("servers", None), raw.pop("together", False)
    p = LabPlan(lab=number, profile=prof.name, model=raw.pop("model", prof.model), **raw)
    p.checks.insert(0, fits_context(p.max_request_tokens, p.max_model_len, "the longest request"))
    if servers is None:  # one server at a time, at the plan's lowest utilization: the plan's fit check covers it
        servers = [resources.server("the lab's server", prof, p.max_model_len, model=p.model,
                                    utilization=p.min_gpu_memory_utilization)]
        p.servers_on_card, _ = resources.servers_on_card(prof, servers)
    else:
        p.servers_on_card, fits = resources.servers_on_card(prof, servers, together)
        p.checks.extend(fits)
    p.checks.extend(resources.context_check(s, prof) for s in servers)
    if p.calibration is not None:
        p.checks.append(resources.calibration_check(p.calibration))
    p.disk_bytes = p.disk_bytes or resources.disk()
    p.time_s = timing.lab_time(number, prof, p.values, q)
    if not p.ok:
        failed = "\n  ".join(c["claim"] for c in p.checks if not c["ok"])
        raise PlanError(f"lab {number}'s plan does not fit profile {prof.name}:\n  {failed}")
    return p


def plans(profile: runtime.Profile | str, quick: bool = False) -> dict[str, Any]:
    """Every lab's plan for ``profile`` in the shape ``python -m helpers.plan PROFILE --json`` prints.

    Introduced in lab 01 (One GPU, One Model).
    """
    prof = runtime.PROFILES[profile] if isinstance(profile, str) else profile
    return {"profile": {"name": prof.name, "model": prof.model, "max_model_len": prof.max_model_len,
                        "gpu_memory_gib": prof.gpu_memory_gib},
            "quick": quick,
            "labs": {n: lab(n, prof, quick).as_dict() for n in sorted(LABS)}}


def disk_table() -> str:
    """The disk each profile's full sequence needs, as the README's Markdown table: what stays (models in the hub
    cache, the checkpoints later labs reuse) and the largest thing one lab writes and deletes again.

    Introduced in lab 12 (FP8 as the Default).
    """
    rows = ["| profile | stays after the labs | largest written and deleted by one lab | disk to have free |",
            "|---|---|---|---|"]
    for name in runtime.PROFILES:
        plans_ = [lab(n, name, quick=False) for n in sorted(LABS)]
        d = resources.disk_total(plans_)
        biggest = max(plans_, key=lambda q: q.disk_bytes["peak"] - q.disk_bytes["kept"])
        rows.append(f"| {name} | {d['kept'] / 1e9:.1f} GB | {d['largest_transient'] / 1e9:.1f} GB (lab {biggest.lab}) | "
                    f"{d['need'] / 1e9:.0f} GB |")
    return "\n".join(rows)


def sequence_time(profile: runtime.Profile | str, quick: bool = False) -> dict[str, Any]:
    """The whole sequence's predicted wall seconds on ``profile``: each lab's ``time_s`` total, plus each model's
    first download (in the first lab whose servers use it), ``{"total", "labs": {lab: s}, "downloads": {model: s},
    "largest_cell": {"lab", "cell", "s"}}``.

    Introduced in lab 01 (One GPU, One Model).
    """
    prof = runtime.PROFILES[profile] if isinstance(profile, str) else profile
    labs, downloads, largest = {}, {}, {"lab": None, "cell": None, "s": 0.0}
    for n in sorted(LABS):
        p = lab(n, prof, quick)
        fetch = 0.0
        for model in dict.fromkeys([p.model] + [s["model"] for s in p.servers_on_card if s.get("model")]):
            if model not in downloads:
                downloads[model] = round(timing.download(prof, model), 1)
                fetch += downloads[model]
        labs[n] = round(p.time_s["total"] + fetch, 1)
        for c in p.time_s["cells"]:
            if c["s"] > largest["s"]:
                largest = {"lab": n, "cell": c["cell"], "s": c["s"]}
    return {"profile": prof.name, "quick": quick, "total": round(sum(labs.values()), 1), "labs": labs,
            "downloads": downloads, "largest_cell": largest}


def time_table() -> str:
    """Every profile's predicted sequence, full and quick, with its price at the catalog's hourly rate, as the
    README's Markdown table.

    Introduced in lab 01 (One GPU, One Model).
    """
    from .. import cost

    rows = ["| profile | full sequence | quick (`LABS_QUICK=1`) | longest cell (full) | at the catalog price |",
            "|---|---|---|---|---|"]
    for name, prof in runtime.PROFILES.items():
        full, quick = sequence_time(prof, False), sequence_time(prof, True)
        try:
            usd = cost.price(prof.hardware).usd_per_hour * full["total"] / 3600  # one card the whole time
            price = f"${usd:,.0f} full"
        except KeyError:
            price = "-"
        big = full["largest_cell"]
        rows.append(f"| {name} | {full['total'] / 3600:.1f} h | {quick['total'] / 3600:.1f} h | "
                    f"{big['s'] / 60:.0f} min (lab {big['lab']}, {big['cell'].split(':')[0]}) | {price} |")
    return "\n".join(rows)


def time_against(profile: runtime.Profile | str, measured: dict[str, Any], quick: bool = True) -> str:
    """Each lab's predicted seconds beside what a run measured (``labs/conftest.py`` writes ``{lab: {"total",
    "cells": {index: s}}}``): the lab's total and its longest predicted cell, as a Markdown table. A run that reuses
    servers parked by an earlier lab (``LABS_REUSE_SERVER=1``) measures fewer starts than the plan counts.

    Introduced in lab 01 (One GPU, One Model).
    """
    rows = ["| lab | predicted s | measured s | measured / predicted | longest predicted cell: predicted, measured s |",
            "|---|---|---|---|---|"]
    pred_sum = meas_sum = 0.0
    for n in sorted(measured):
        if n not in LABS:
            continue
        t, m = lab(n, profile, quick).time_s, measured[n]
        big = max(t["cells"][:-1] or t["cells"], key=lambda c: c["s"])
        idx = big["cell"].split(":")[0].removeprefix("cell ").strip()
        at = m["cells"].get(idx, "-")
        pred_sum, meas_sum = pred_sum + t["total"], meas_sum + m["total"]
        rows.append(f"| {n} | {t['total']:.0f} | {m['total']:.0f} | {m['total'] / max(t['total'], 1e-9):.2f} | "
                    f"{big['cell']}: {big['s']:.0f}, {at} |")
    rows.append(f"| all | {pred_sum:.0f} | {meas_sum:.0f} | {meas_sum / max(pred_sum, 1e-9):.2f} | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labs-plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", choices=sorted(runtime.PROFILES), nargs="?")
    ap.add_argument("--quick", action="store_true", help="the CI-sized plans (LABS_QUICK=1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--disk", action="store_true", help="the disk every profile's labs need (the README's table)")
    ap.add_argument("--time", action="store_true", help="every profile's predicted sequence time (the README's table)")
    ap.add_argument("--measured", metavar="FILE", help="the profile's predicted time per lab beside a run's seconds "
                    "(the JSON make test-labs writes: runs/lab_seconds.json)")
    a = ap.parse_args(argv)
    if a.disk or a.time:
        print(disk_table() if a.disk else time_table())
        return 0
    if a.profile is None:
        ap.error("name a profile (or --disk, --time)")
    if a.measured:
        try:
            measured = json.loads(open(a.measured).read())
        except (OSError, ValueError) as e:
            print(f"error: cannot read {a.measured} ({e}): run make test-labs first, or name the file it wrote",
                  file=sys.stderr)
            return 2
        print(time_against(a.profile, measured, a.quick))
        return 0
    try:
        out = plans(a.profile, a.quick)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        for n, p in out["labs"].items():
            print(f"lab {n}: max_model_len {p['max_model_len']:,}, longest request {p['max_request_tokens']:,}, "
                  f"min utilization {p['min_gpu_memory_utilization']}, shortest run {p['min_run_s']:g} s")
            for c in p["checks"]:
                print(f"    {'ok ' if c['ok'] else 'NO '} {c['claim']}")
    return 0


