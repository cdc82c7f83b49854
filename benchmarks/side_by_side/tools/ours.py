"""Our harness, ``python -m helpers.bench run``, run from its CLI as a user runs it; read back with
:func:`helpers.bench.load_run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from helpers import bench, settings

from ..process import repo_on_path, run_tool, window_cpu
from ..records import Load, Req, Target, ToolRun

__all__ = ["command", "parse", "run"]

RESULT = "summary.json"


def command(target: Target, load: Load, out: Path, seed: int) -> list[str]:
    """The ``python -m helpers.bench run`` command for ``load`` (constant rate, exact prompt lengths)."""
    return [sys.executable, "-m", "helpers.bench", "run", "--base-url", target.base_url, "--model", target.model,
            "--endpoint", load.endpoint, "--tokenizer", target.model_path, "--arrivals", "constant",
            "--rate", f"{load.rate:g}", "--num-requests", str(load.num_requests), "--input-len", str(load.input_len),
            "--output-len", str(load.output_len), "--seed", str(seed), "--warmup", "0", "--temperature", "0",
            "--out", str(out), "--no-server-metrics", "--no-progress", "--json"]


def parse(out: Path) -> tuple[list[Req], dict[str, Any], dict[str, Any]]:
    """A run folder of ours -> (per-request records, the numbers as it reports them, extras)."""
    res = bench.load_run(out)
    reqs = []
    for r in res.records:
        t = r.timings
        gaps = [(b - a) * 1000.0 for a, b in zip(t.chunk_times, t.chunk_times[1:])]
        reqs.append(Req(ok=r.ok, ttft_ms=r.ttft_ms, last_ms=r.e2e_ms, n_out=r.n_output, chunks=len(t.chunk_times),
                        gaps_ms=gaps, chunk_tokens=list(t.chunk_tokens),
                        close_ms=((t.t_done - t.t_dispatched) * 1000.0) if t.t_done and t.t_dispatched else None,
                        t0_wall=t.wall(t.t_dispatched) if t.t_dispatched else None, input_tokens=r.input_tokens))
    s = json.loads((out / RESULT).read_text())
    reported = {
        "ttft_mean": s["ttft_ms"]["mean"], "ttft_p50": s["ttft_ms"]["p50"], "ttft_p99": s["ttft_ms"]["p99"],
        "tpot_mean": s["tpot_ms"]["mean"], "tpot_p50": s["tpot_ms"]["p50"],
        "itl_mean": s["itl_ms"]["mean"], "itl_p50": s["itl_ms"]["p50"], "itl_p99": s["itl_ms"]["p99"],
        "e2e_mean": s["e2e_ms"]["mean"], "e2e_p50": s["e2e_ms"]["p50"],
        "output_throughput": s["output_throughput"], "completed": s["completed"], "failed": s["failed"],
    }
    extra = {"window": s.get("window"), "total_output_throughput": s.get("total_output_throughput"),
             "warnings": s.get("warnings", [])}
    return reqs, reported, extra


def run(target: Target, load: Load, out: Path, round_: int) -> ToolRun:
    """One run of our harness at ``load`` (seed ``load.seed + round_``: no prompt is ever sent twice)."""
    root = settings.repo_root()
    cmd = command(target, load, out, load.seed + round_)
    run = ToolRun("ours", round_, str(out), "python " + " ".join(cmd[1:]))
    cpu = run_tool(run, target, cmd, out, load.timeout_s, root, RESULT, env=repo_on_path())
    if cpu is not None:
        run.reqs, run.reported, run.extra = parse(out)
        window_cpu(run, cpu)
    return run
