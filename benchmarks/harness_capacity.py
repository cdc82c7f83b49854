"""How much load can the benchmark client generate, and how exact is it while doing so?

Poisson load against the calibration server (its own processes, ``--server-processes`` of them on one port, with a
known schedule: TTFT 250 ms (``--ttft-ms``), 5 ms per output token, 16 output tokens sent one per chunk, chat
streams with the role-only first chunk). The load is counted in stream chunks per second (requests/s x 16), what
the client parses.

For ``workers=1`` (the in-process path) and ``workers="auto"`` (as many processes as the expected chunk rate needs,
capped at the cores), it searches the highest chunk rate the client **sustains**: a valid run (the client's own
lag, CPU and schedule slip within :class:`helpers.bench.ClientLimits`) that passes the side-by-side's criterion
(``benchmarks.side_by_side.capacity.judge``, the one definition of "sustained": every request completed, dispatched
within 3% of the schedule's rate, mean TTFT within 2% of what the server actually did, its own record per request). Rates
double from ``--start-rate`` until a run is not sustained, then bisect. From the CPU the sending loop spent per
chunk it also derives what one core could parse at most; then it runs ``workers=1`` at ``--past-factor`` times that
ceiling and shows that run marked invalid.

Exits non-zero when the past-capacity run is not marked invalid (the harness failed to see its own limit), or when
not even the start rate was sustained.

::

    python -m benchmarks.harness_capacity                       # ~3 minutes
    python -m benchmarks.harness_capacity --duration 10 --server-processes 4 --out runs/capacity
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from helpers import bench
from helpers.bench import CalibrationServer, Poisson, Request, Workload

from .side_by_side import capacity as sbs_capacity

TPOT_S, N_OUT = 0.005, 16
# 2% of 250 ms is 5 ms: above the 1-3 ms that scheduling noise adds on a busy shared machine, so the search finds
# the client's limit rather than the machine's (--ttft-ms 100, as in lab 10, leaves a 2 ms budget).
TTFT_S = 0.250


def workload(n: int, tag: str) -> Workload:
    reqs = [Request(id=str(i), messages=[{"role": "user", "content": f"{tag} request {i}: say something"}],
                    max_output_tokens=N_OUT, min_output_tokens=N_OUT) for i in range(n)]
    warm = [Request(id=f"warmup-{i}", messages=[{"role": "user", "content": f"warmup {i}"}], max_output_tokens=4,
                    warmup=True) for i in range(16)]
    return Workload("chat", reqs, warm)


def measure(cal: CalibrationServer, rate: float, duration_s: float, workers: int | str, seed: int,
            out: Path | None) -> dict:
    profile = Poisson(rate=rate, seed=seed)
    n = profile.count_for(duration_s)
    offsets = profile.offsets(n)
    scheduled_rate = (n - 1) / offsets[-1]
    cal.reset()
    label = f"poisson {rate:g} workers {workers}"
    res = bench.run(workload(n, f"r{rate:g}w{workers}s{seed}"), profile, base_url=cal.base_url, model=cal.model,
                    out=(out / label.replace(" ", "-")) if out else False, progress=False, sample_interval_s=1.0,
                    label=label, workers=workers)
    truth = {r["id"]: r for r in cal.stats()["requests"]}
    s = res.summary
    ok = [r for r in res.records if r.ok and r.id in truth]
    client_ttft = np.array([r.ttft_ms for r in ok]) if ok else np.array([np.nan])
    server_ttft = np.array([truth[r.id]["ttft_s"] * 1000 for r in ok]) if ok else np.array([np.nan])
    c = s.client
    row = {
        "rate": rate, "chunk_rate_offered": rate * N_OUT, "requests": n, "completed": s.completed, "failed": s.failed,
        "workers": res.config["workers"]["used"], "workers_why": res.config["workers"]["why"],
        "scheduled_rate": scheduled_rate, "achieved_rate": s.achieved_rate,
        "chunk_rate_parsed": c.get("chunk_rate"),
        "ttft_client_mean_ms": float(client_ttft.mean()), "ttft_server_actual_mean_ms": float(server_ttft.mean()),
        "ttft_error_vs_server_actual": float(client_ttft.mean() / server_ttft.mean() - 1),
        "ttft_error_vs_configured": float(client_ttft.mean() / (cal.config.ttft_s * 1000) - 1),
        "ttft_gap_median_ms": float(np.median(client_ttft - server_ttft)),
        "ttft_p99_ms": s.ttft_ms.p99, "tpot_mean_ms": s.tpot_ms.mean,
        "valid": s.valid, "invalid_reason": s.invalid_reason,
        "loop_lag_p99_ms": c.get("loop_lag_p99_ms"), "slip_p99_ms": c.get("slip_p99_ms"),
        "cpu_utilization": c.get("cpu_utilization"), "cpu_per_request_ms": c.get("cpu_per_request_ms"),
        # CPU-seconds the sending loops spent per 1,000 chunks: what one core can parse, whatever else runs
        "cpu_ms_per_1000_chunks": c["cpu_s"] / c["chunks"] * 1e6 if c.get("chunks") else None,
    }
    row["problems"] = problems(row)
    row["sustained"] = not row["problems"]
    return row


def problems(row: dict) -> list[str]:
    """Why the run does not count as sustained: the side-by-side's criterion (``capacity.judge``: every request
    completed, dispatched at the schedule's rate, mean TTFT within 2% of the server's record), judged against the
    seeded schedule's own rate, plus the client's verdict on itself (lag, slip, CPU)."""
    step = sbs_capacity.Step(tool="ours", rate=row["scheduled_rate"], requests=row["requests"],
                         completed=row["completed"], failed=row["failed"], achieved_rate=row["achieved_rate"],
                         ttft_error=row["ttft_error_vs_server_actual"])
    return ([] if row["valid"] else ["invalid: " + (row["invalid_reason"] or "")]) + sbs_capacity.judge(step)


def line(row: dict) -> str:
    verdict = "sustained" if row["sustained"] else "NOT sustained: " + "; ".join(row["problems"])
    return (f"  {row['rate']:7.1f} req/s = {row['chunk_rate_offered']:7.0f} chunks/s offered, "
            f"{row['workers']} worker(s): parsed {row['chunk_rate_parsed'] or 0:7.0f} chunks/s; TTFT "
            f"{row['ttft_client_mean_ms']:.2f} ms vs server {row['ttft_server_actual_mean_ms']:.2f} ms "
            f"({row['ttft_error_vs_server_actual']:+.2%}, median gap {row['ttft_gap_median_ms']:.2f} ms; vs "
            f"configured {row['ttft_error_vs_configured']:+.2%}); "
            f"lag p99 {row['loop_lag_p99_ms'] or 0:.1f} ms, slip p99 {row['slip_p99_ms'] or 0:.1f} ms, "
            f"CPU {row['cpu_utilization'] or 0:.0%} of a core ({row['cpu_ms_per_1000_chunks'] or 0:.0f} ms per "
            f"1,000 chunks) -> {verdict}")


def capacity(cal: CalibrationServer, workers: int | str, start: float, duration_s: float, max_runs: int,
             rel_tol: float, seed: int, out: Path | None) -> tuple[dict | None, list[dict]]:
    """The highest sustained rate: double from ``start`` while sustained, then bisect."""
    rows: list[dict] = []
    best: dict | None = None
    lo, hi, rate = None, None, start
    for i in range(max_runs):
        row = measure(cal, rate, duration_s, workers, seed + i, out)
        rows.append(row)
        print(line(row), flush=True)
        if row["sustained"]:
            lo, best = rate, row if best is None or rate >= best["rate"] else best
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            if (hi - lo) / lo <= rel_tol:
                break
            rate = (lo + hi) / 2
        elif lo is not None:
            rate *= 2
        else:
            rate /= 2
    return best, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start-rate", type=float, default=50.0, help="req/s of the first probe (x16 chunks/s)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per probe")
    p.add_argument("--max-runs", type=int, default=6, help="probes per search")
    p.add_argument("--rel-tol", type=float, default=0.15, help="stop bisecting within this share of the rate")
    p.add_argument("--server-processes", type=int, default=2, help="calibration server processes on the port")
    p.add_argument("--past-factor", type=float, default=1.5,
                   help="the invalid demonstration runs at this x one core's ceiling (from CPU per chunk)")
    p.add_argument("--ttft-ms", type=float, default=TTFT_S * 1000, help="the server's TTFT (the error budget is 2%% "
                   "of it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="keep the runs in this folder (JSONL, summaries) and a report.json")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else None
    report: dict = {"ttft_ms": a.ttft_ms, "tpot_ms": TPOT_S * 1000, "output_tokens": N_OUT,
                    "server_processes": a.server_processes, "duration_s": a.duration, "searches": {}}
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    with CalibrationServer(ttft_s=a.ttft_ms / 1000, tpot_s=TPOT_S, default_max_tokens=N_OUT, role_chunk=True,
                           processes=a.server_processes) as cal:
        for workers in (1, "auto"):
            print(f"workers={workers}:", flush=True)
            best, rows = capacity(cal, workers, a.start_rate, a.duration, a.max_runs, a.rel_tol, a.seed, out)
            report["searches"][str(workers)] = {"best": best, "rows": rows}
        per_chunk = [r["cpu_ms_per_1000_chunks"] for r in report["searches"]["1"]["rows"]
                     if r["cpu_ms_per_1000_chunks"]]
        ceiling = 1e6 / float(np.median(per_chunk)) if per_chunk else a.start_rate * N_OUT * 4
        report["one_core_chunks_per_s"] = ceiling
        past_rate = round(a.past_factor * ceiling / N_OUT, 1)
        print(f"one core parses at most ~{ceiling:,.0f} chunks/s (median CPU per chunk of the workers=1 runs); "
              f"past that, {a.past_factor:g} x, with workers=1:", flush=True)
        past = measure(cal, past_rate, a.duration, 1, a.seed + 100, out)
        print(line(past), flush=True)
        report["past_capacity"] = past
    report["wall_s"] = time.perf_counter() - t0
    report["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(f"\nthis machine: {os.cpu_count()} cores, load average {load_before[0]:.1f} before and "
          f"{report['load_average']['after'][0]:.1f} after (other processes share these cores)")
    for workers in ("1", "auto"):
        best = report["searches"][workers]["best"]
        if best is None:
            print(f"workers={workers}: not even {a.start_rate:g} req/s ({a.start_rate * N_OUT:.0f} chunks/s) was "
                  "sustained")
            continue
        print(f"workers={workers}: sustained {best['chunk_rate_offered']:.0f} chunks/s ({best['rate']:.1f} req/s, "
              f"{best['workers']} worker(s)) with TTFT error {best['ttft_error_vs_server_actual']:+.2%} against the "
              f"server's own record ({best['ttft_error_vs_configured']:+.2%} against the configured "
              f"{a.ttft_ms:g} ms; median gap {best['ttft_gap_median_ms']:.2f} ms)")
    verdict = ("marked INVALID: " + past["invalid_reason"]) if not past["valid"] else "NOT marked invalid"
    print(f"at {past_rate:.1f} req/s ({past_rate * N_OUT:.0f} chunks/s) with workers=1 the run was {verdict}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    if past["valid"] or report["searches"]["1"]["best"] is None:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
