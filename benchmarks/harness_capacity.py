"""How much load can the benchmark client itself generate, and how exact is it while doing so?

Poisson load against the calibration server (a separate process with a known schedule: TTFT 100 ms,
5 ms per output token, 16 output tokens, chat streams with the role-only first chunk). For each rate it
reports the achieved dispatch rate, the throughput over the steady-state window, the client's own
queue time (p99) and event-loop lag, the client CPU per request, and the TTFT error against the
server's configured truth (and against what the server actually did, from its own record).

Exits non-zero unless, at a nominal 100 req/s (the first rate), the client
  - kept its schedule: achieved dispatch rate within 1% of the schedule's own rate, client queue p99 < 10 ms;
  - sustained the load: window request throughput >= 97% of 100 req/s (a Poisson count over the window
    varies by a few percent), no failed request;
  - measured TTFT within 2% of the configured 100 ms (mean).

::

    python benchmarks/harness_capacity.py                  # 100 and 200 req/s, 20 s each
    python benchmarks/harness_capacity.py --rates 100 200 400 --duration 15
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from helpers import bench
from helpers.bench import CalibrationServer, Poisson, Request, Workload

TTFT_S, TPOT_S, N_OUT = 0.100, 0.005, 16


def workload(n: int, tag: str) -> Workload:
    reqs = [Request(id=str(i), messages=[{"role": "user", "content": f"{tag} request {i}: say something"}],
                    max_output_tokens=N_OUT, min_output_tokens=N_OUT) for i in range(n)]
    warm = [Request(id=f"warmup-{i}", messages=[{"role": "user", "content": f"warmup {i}"}], max_output_tokens=4,
                    warmup=True) for i in range(32)]
    return Workload("chat", reqs, warm)


def measure(cal: CalibrationServer, rate: float, duration_s: float, seed: int, out: Path | None) -> dict:
    n = int(rate * duration_s)
    profile = Poisson(rate=rate, seed=seed)
    offsets = profile.offsets(n)
    scheduled_rate = (n - 1) / offsets[-1]
    cal.reset()
    res = bench.run(workload(n, f"r{rate:g}"), profile, base_url=cal.base_url, model=cal.model,
                    out=(out / f"rate-{rate:g}") if out else False, progress=False, sample_interval_s=1.0,
                    label=f"poisson {rate:g}")
    truth = {r["id"]: r for r in cal.stats()["requests"]}
    s = res.summary
    ok = [r for r in res.records if r.ok]
    client_ttft = np.array([r.ttft_ms for r in ok])
    server_ttft = np.array([truth[r.id]["ttft_s"] * 1000 for r in ok if r.id in truth])
    row = {
        "rate": rate, "requests": n, "completed": s.completed, "failed": s.failed,
        "scheduled_rate": scheduled_rate, "achieved_rate": s.achieved_rate,
        "window_request_throughput": s.request_throughput, "window_s": s.duration_s,
        "client_queue_p99_ms": s.client_queue_ms.p99, "client_queue_max_ms": s.client_queue_ms.max,
        "ttft_configured_ms": TTFT_S * 1000, "ttft_client_mean_ms": float(client_ttft.mean()),
        "ttft_client_p50_ms": s.ttft_ms.p50, "ttft_client_p99_ms": s.ttft_ms.p99,
        "ttft_server_actual_mean_ms": float(server_ttft.mean()),
        "ttft_error_vs_configured": float(client_ttft.mean() / (TTFT_S * 1000) - 1),
        "ttft_error_vs_server_actual": float(client_ttft.mean() / server_ttft.mean() - 1),
        "tpot_client_mean_ms": s.tpot_ms.mean, "tpot_configured_ms": TPOT_S * 1000,
        "client_cpu_per_request_ms": s.client["cpu_per_request_ms"],
        "client_cpu_utilization": s.client["cpu_utilization"],
        "loop_lag_p99_ms": s.client["loop_lag_p99_ms"],
        "warnings": s.warnings,
    }
    return row


def verdict(row: dict) -> list[str]:
    problems = []
    if abs(row["achieved_rate"] / row["scheduled_rate"] - 1) > 0.01:
        problems.append(f"dispatch rate {row['achieved_rate']:.1f}/s vs scheduled {row['scheduled_rate']:.1f}/s")
    if row["client_queue_p99_ms"] >= 10.0:
        problems.append(f"client queue p99 {row['client_queue_p99_ms']:.1f} ms >= 10 ms")
    if (row["window_request_throughput"] or 0) < 0.97 * row["rate"]:
        problems.append(f"window throughput {row['window_request_throughput']:.1f} req/s < 97% of {row['rate']:g}")
    if row["failed"]:
        problems.append(f"{row['failed']} failed requests")
    if abs(row["ttft_error_vs_configured"]) >= 0.02:
        problems.append(f"TTFT error {row['ttft_error_vs_configured']:+.2%} (>= 2%)")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[100.0, 200.0],
                   help="nominal req/s; the first one is judged, the others show the headroom")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="keep the runs in this folder (JSONL, summaries) and a report.json")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else None
    rows = []
    with CalibrationServer(ttft_s=TTFT_S, tpot_s=TPOT_S, default_max_tokens=N_OUT, role_chunk=True) as cal:
        for i, rate in enumerate(a.rates):
            t0 = time.perf_counter()
            row = measure(cal, rate, a.duration, a.seed + i, out)
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"rate {rate:g}/s: achieved {row['achieved_rate']:.1f}/s (schedule {row['scheduled_rate']:.1f}/s), "
                  f"window throughput {row['window_request_throughput']:.1f} req/s, "
                  f"{row['completed']}/{row['requests']} ok; client queue p99 {row['client_queue_p99_ms']:.2f} ms; "
                  f"TTFT mean {row['ttft_client_mean_ms']:.2f} ms vs configured {TTFT_S * 1000:.0f} ms "
                  f"({row['ttft_error_vs_configured']:+.2%}; vs server actual {row['ttft_server_actual_mean_ms']:.2f} "
                  f"ms: {row['ttft_error_vs_server_actual']:+.2%}); TPOT {row['tpot_client_mean_ms']:.3f} ms; "
                  f"client CPU {row['client_cpu_per_request_ms']:.2f} ms/req "
                  f"({row['client_cpu_utilization']:.0%} of a core), loop lag p99 {row['loop_lag_p99_ms']:.2f} ms",
                  flush=True)
            for w in row["warnings"]:
                print(f"  warning: {w}")
    problems = verdict(rows[0])
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps({"rows": rows, "problems": problems}, indent=2))
    if problems:
        print(f"FAIL at {rows[0]['rate']:g} req/s: " + "; ".join(problems))
        return 1
    r = rows[0]
    band = 3 / np.sqrt(r["requests"])
    print(f"PASS: the client sustains a nominal {r['rate']:g} req/s Poisson load (its schedule ran at "
          f"{r['scheduled_rate']:.1f}/s, a {r['requests']}-arrival Poisson schedule varies by about +-{band:.0%} at 3 "
          f"sigma; dispatched at {r['achieved_rate']:.1f}/s) with TTFT error {r['ttft_error_vs_configured']:+.2%} "
          "against the configured truth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
