"""The harness at scale, against calibration servers: several client processes on one schedule and one record file,
a calibration server on several processes, closed loops sized in seconds, a client that cannot keep up marked
invalid, and a server that dies mid-run ending the run.

Nothing here depends on this machine's speed except where the behaviour under test is about time itself (a dead
server must end the run within seconds); those bounds are generous.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest

from helpers import bench
from helpers.bench import CalibrationServer, ClientLimits, Concurrent, FromJsonl, Poisson, Request, Workload
from helpers.bench.__main__ import main


def prompts(tmp_path, n=600, out=4):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"prompt {i} of the scale tests", "output_len": out}) + "\n"
                            for i in range(n)))
    return path


def workload(n, tag, out=8):
    reqs = [Request(id=str(i), prompt=f"{tag} request {i}", max_output_tokens=out, min_output_tokens=out)
            for i in range(n)]
    return Workload("completions", reqs, [])


def max_in_flight(records) -> int:
    events = sorted([(r.timings.t_dispatched, 1) for r in records] + [(r.timings.t_end, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_two_client_processes_share_one_schedule_and_one_file(tmp_path, capsys):
    """CLI, open loop, 2 worker processes, against a 2-process calibration server; sized by duration."""
    out = tmp_path / "run"
    with CalibrationServer(ttft_s=0.03, tpot_s=0.004, processes=2) as cal:
        rc = main(["run", "--base-url", cal.base_url, "--endpoint", "completions", "--prompts",
                   str(prompts(tmp_path)), "--tokenizer", "none", "--arrivals", "poisson", "--rate", "30",
                   "--duration", "2", "--workers", "2", "--seed", "5", "--out", str(out), "--no-progress"])
        truth = {t["id"]: t for t in cal.stats()["requests"]}
        pids = {httpx.get(f"{cal.url}/calibration/stats", headers={"Connection": "close"}).json()["pid"]
                for _ in range(20)}
        cal.reset()
        assert cal.stats()["requests"] == []  # reset clears every process's truth
    capsys.readouterr()
    assert rc == 0
    res = bench.load_run(out)
    res.records.sort(key=lambda r: int(r.id))  # the file is in the order requests finished
    config = json.loads((out / "config.json").read_text())
    n = Poisson(30, seed=5).count_for(2)
    assert config["duration_s"] == 2 and config["num_requests"] == n == 60
    assert config["workers"] == {"requested": 2, "used": 2, "cores": config["workers"]["cores"], "why": "2 as asked"}
    assert "--duration 2" in config["command"] and "--workers 2" in config["command"]
    # one file, every request once, dealt round-robin: request i went from worker i mod 2
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == n and sorted(int(r.id) for r in res.records) == list(range(n))
    assert all(r.meta["worker"] == int(r.id) % 2 for r in res.records)
    # one clock, one schedule: every scheduled instant is the start + the schedule's offset, in both processes
    t0 = config["start_perf_counter"]
    offsets = Poisson(30, seed=5).offsets(n)
    assert [r.timings.t_scheduled - t0 for r in res.records] == pytest.approx(offsets, abs=1e-9)
    # the server's truth, merged over its two processes, knows every request; the client's TTFT spans it
    assert len(pids) == 2 and set(truth) >= {r.id for r in res.records}
    assert all(r.ttft_ms >= truth[r.id]["ttft_s"] * 1000 for r in res.records)  # dispatch <= receipt, send <= arrival
    saved = json.loads((out / "summary.json").read_text())
    assert saved["server"]["requests"] == n  # /metrics merged over the server's processes
    assert [w["requests"] for w in saved["client"]["per_worker"]] == [30, 30]
    assert all(w["process"] == "process" and w["lag_samples"] > 0 for w in saved["client"]["per_worker"])
    assert isinstance(saved["valid"], bool) and ("invalid_reason" in saved)


def test_a_closed_loop_sized_in_seconds_keeps_c_in_flight_across_workers_then_drains(tmp_path):
    spec = FromJsonl(prompts(tmp_path, out=4), endpoint="completions", tokenizer=False, shuffle=True)
    with CalibrationServer(ttft_s=0.02, tpot_s=0.004) as cal:
        res = bench.run(spec, Concurrent(16), base_url=cal, duration_s=1.5, workers=2, out=tmp_path / "c",
                        progress=False)
    recs = res.records
    t0 = res.config["start_perf_counter"]
    assert res.config["num_requests"] is None and res.config["duration_s"] == 1.5
    assert len(recs) > 64  # more than the first chunk of the supply: requests were built as the loop went
    assert len({r.id for r in recs}) == len(recs)
    assert max(r.timings.t_dispatched for r in recs) <= t0 + 1.5 + 0.05  # nothing sent after the time was up
    assert max_in_flight(recs) <= 16
    for k in (0, 1):  # 8 slots per worker
        assert 1 <= max_in_flight([r for r in recs if r.meta["worker"] == k]) <= 8
    assert res.summary.completed == len(recs)


def slow_client(monkeypatch, busy_s: float) -> None:
    """A client that spends ``busy_s`` of CPU before each send, holding its event loop (as a saturated one does)."""
    from helpers.bench import dispatch

    real = dispatch.send

    async def send(*args, **kwargs):
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        return await real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "send", send)


def test_a_client_that_cannot_keep_up_makes_the_run_invalid(tmp_path, monkeypatch):
    with CalibrationServer(ttft_s=0.05, tpot_s=0.005) as cal:
        gentle = bench.run(workload(20, "gentle"), Poisson(10, seed=1), base_url=cal, out=False, progress=False,
                           workers="auto", client_limits=ClientLimits(lag_p99_ms=250, slip_p99_ms=250))
        slow_client(monkeypatch, busy_s=0.03)  # 30 ms of CPU per request at 60 req/s: 1.8 cores' worth
        out = tmp_path / "invalid"
        swamped = bench.run(workload(60, "swamped"), Poisson(60, seed=2), base_url=cal, out=out, progress=False)
    assert gentle.config["workers"]["requested"] == "auto" and gentle.config["workers"]["used"] == 1
    assert gentle.summary.valid, gentle.summary.invalid_reason
    s = swamped.summary
    assert not s.valid and not swamped.valid
    assert s.invalid_reason.startswith("the client was the bottleneck") and "sent late" in s.invalid_reason
    assert s.client["slip_p99_ms"] > 100  # 1.8 s of work per second of schedule: a backlog on any machine
    assert str(swamped).splitlines()[1].startswith("INVALID RUN")
    saved = json.loads((out / "summary.json").read_text())
    assert saved["valid"] is False and saved["invalid_reason"] == s.invalid_reason
    assert bench.load_run(out).summary.valid is False  # the verdict survives a reload


def kill_after(cal: CalibrationServer, folder, records: int, when: dict) -> threading.Thread:
    """Kill the server (SIGKILL) once ``records`` requests are in the run's file; note when."""
    def watch() -> None:
        path = folder / "requests.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and len(path.read_text().splitlines()) >= records:
                when["t"] = time.perf_counter()
                cal.kill()
                return
            time.sleep(0.02)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


@pytest.mark.parametrize("workers", [1, 2])
def test_a_dead_server_ends_the_run_and_every_record_is_kept(tmp_path, workers):
    """120 requests at 20 req/s (6 s) planned; the server is killed after 10 have finished. With workers=1 the
    harness is given a bare URL, so only failed connections and /health can tell it the server died; with 2
    workers it is given the server, whose process it also watches."""
    out = tmp_path / "run"
    when: dict = {}
    with CalibrationServer(ttft_s=0.02, tpot_s=0.005) as cal:
        target = cal.base_url if workers == 1 else cal
        watcher = kill_after(cal, out, 10, when)
        res = bench.run(workload(120, f"dead{workers}"), Poisson(20, seed=workers), base_url=target, out=out,
                        progress=False, workers=workers, server_metrics=False)
        ended = time.perf_counter()
        watcher.join(timeout=5)
    assert "t" in when, "the server was never killed"
    print(f"\nworkers={workers}: the run ended {ended - when['t']:.2f} s after the kill; "
          f"{res.summary.server_death}")
    assert ended - when["t"] < 8.0, f"the run went on {ended - when['t']:.1f} s after the server died"
    config = json.loads((out / "config.json").read_text())
    death = res.summary.server_death
    assert config["status"].startswith("server died at t=") and config["server_death"] == death
    if workers == 1:
        assert death["reason"] == "connection refused" and config["status"].endswith(": connection refused")
    origin = min(r.timings.t_dispatched for r in res.records)
    assert abs(origin + death["t_s"] - when["t"]) < 1.0  # dated at the death, not at its discovery
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == len(res.records) >= 10  # every record sent is kept
    failed = [r for r in res.records if not r.ok]
    assert death["failed_before"] == 0 and death["failed_with_it"] == len(failed)
    assert all(r.ok for r in res.records if r.timings.t_end < when["t"] - 0.05)
    assert death["not_sent"] == 120 - len(res.records) > 60  # it stopped sending
    assert any(w.startswith("server died at t=") and "Every record sent is kept" in w for w in res.summary.warnings)
    assert json.loads((out / "summary.json").read_text())["server_death"] == death
    assert np.isfinite(res.summary.ttft_ms.p50)  # the requests before the death are summarized as usual
