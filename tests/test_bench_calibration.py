"""The harness against the calibration server, whose latencies are known: does it report the truth?

Each server runs in its own process (the client's CPU does not disturb its schedule). Loads are moderate
(tens of requests per second) and runs short, so the file stays within ~40 s on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import bench
from helpers.bench import SLO, CalibrationServer, ConstantRate, Poisson, Request, Synchronous, Workload
from helpers.models import default_model

TTFT_S, TPOT_S, K, N_OUT = 0.060, 0.008, 3, 16


def workload(n, endpoint="completions", out=N_OUT, warmup=0, words=20, tag=""):
    def req(i, warm=False):
        text = " ".join(f"w{tag}{i}x{j}" for j in range(words))
        kw = {"prompt": text} if endpoint == "completions" else {"messages": [{"role": "user", "content": text}]}
        return Request(id=f"warmup-{i}" if warm else str(i), expected_input_tokens=None, max_output_tokens=out,
                       min_output_tokens=out, warmup=warm, **kw)
    return Workload(endpoint, [req(i) for i in range(n)], [req(i, True) for i in range(warmup)])


def truth_by_id(cal):
    return {r["id"]: r for r in cal.stats()["requests"]}


@pytest.fixture(scope="module")
def cal():
    """TTFT 60 ms, TPOT 8 ms, 3 tokens per chunk after the first, a role-only chat chunk, exact prompt counts."""
    with CalibrationServer(ttft_s=TTFT_S, tpot_s=TPOT_S, tokens_per_chunk=K, first_chunk_tokens=1, role_chunk=True,
                           tokenizer=str(default_model())) as server:
        yield server


@pytest.fixture(scope="module")
def truth_run(cal, tmp_path_factory):
    """Poisson 30 req/s, 90 chat requests. This machine is shared (vLLM servers may be running): when the
    harness reports that its own event loop lagged, the run is repeated (up to 3 times) and the calmest kept."""
    best = None
    for attempt in range(3):
        cal.reset()
        out = tmp_path_factory.mktemp(f"truth{attempt}")
        res = bench.run(workload(90, "chat", warmup=4), Poisson(rate=30, seed=1), base_url=cal.base_url, out=out,
                        progress=False, slo=SLO(ttft_ms=TTFT_S * 1000 * 1.2), sample_interval_s=0.25)
        lag = res.summary.client["loop_lag_p99_ms"]
        if best is None or lag < best[2]:
            best = (res, truth_by_id(cal), lag)
        if lag < 5.0:
            break
        time.sleep(1.0)
    return best[0], best[1]


def test_reports_the_known_truth(truth_run):
    res, truth = truth_run
    s = res.summary
    assert s.completed == 90 and s.failed == 0
    assert all(r.tokens_exact and r.output_tokens == r.streamed_tokens == N_OUT for r in res.records)
    # TTFT: the role-only chunk (sent at once) is not taken for the first token
    assert s.ttft_ms.p50 == pytest.approx(TTFT_S * 1000, rel=0.04)
    assert s.ttft_ms.min > 0.95 * TTFT_S * 1000
    # TPOT and ITL: 3 tokens per chunk every 24 ms is still 8 ms per token
    assert s.tpot_ms.p50 == pytest.approx(TPOT_S * 1000, rel=0.03)
    assert s.itl_ms.mean == pytest.approx(s.tpot_ms.mean, rel=1e-6)
    assert s.itl_ms.p50 == pytest.approx(TPOT_S * 1000, rel=0.1)
    assert s.whole_run.itl_ms.count == 90 * (N_OUT - 1)  # every token after the first, ramp-up and drain included
    assert s.itl_ms.count == (N_OUT - 1) * s.ttft_ms.count  # the steady-state window's requests only
    # per chunk (vllm bench serve's ITL): one value per chunk after the first, 3 tokens x 8 ms apart
    assert s.whole_run.itl_per_chunk_ms.count == 90 * 5  # 16 tokens: a first chunk of 1, then 5 chunks of 3
    assert s.itl_per_chunk_ms.p50 == pytest.approx(K * TPOT_S * 1000, rel=0.1)
    assert s.e2e_ms.p50 == pytest.approx((TTFT_S + (N_OUT - 1) * TPOT_S) * 1000, rel=0.03)
    # per request, against the server's own record of what it actually did
    gaps = np.array([r.ttft_ms - truth[r.id]["ttft_s"] * 1000 for r in res.records])
    tpot_err = np.array([(r.tpot_ms - truth[r.id]["tpot_s"] * 1000) / (truth[r.id]["tpot_s"] * 1000)
                         for r in res.records])
    e2e_gap = np.array([r.e2e_ms - truth[r.id]["e2e_s"] * 1000 for r in res.records])
    assert np.median(gaps) < 3.0 and np.median(np.abs(tpot_err)) < 0.03 and np.median(e2e_gap) < 3.0
    assert np.mean(gaps) < 0.05 * TTFT_S * 1000
    # token counts: the server's usage matches the tokenizer's (chat template included)
    assert all(r.input_tokens == truth[r.id]["prompt_tokens"] for r in res.records)


def test_client_overhead_is_measured_and_small(truth_run):
    res, truth = truth_run
    gaps = np.array([r.ttft_ms - truth[r.id]["ttft_s"] * 1000 for r in res.records])
    client = res.summary.client
    print(f"\nclient overhead per request: TTFT gap vs server median {np.median(gaps):.2f} ms, "
          f"p99 {np.percentile(gaps, 99):.2f} ms; client CPU {client['cpu_per_request_ms']:.2f} ms/request; "
          f"loop lag p99 {client['loop_lag_p99_ms']:.2f} ms; client queue p99 {res.summary.client_queue_ms.p99:.2f} ms")
    # The client cannot see a first token before the server sent it: a timer started late (after the request was
    # written, say) would read less than the server's own TTFT. 1 ms covers the two processes' clock reads.
    assert gaps.min() > -1.0, np.sort(gaps)[:5]
    # The typical request carries a few ms of client work (median 1.05 ms in a CI run whose p99 read 30.3 ms; 0.79
    # and 2.12 ms alone: the tail is this 2-core machine's scheduling beside the other tests). The tail under load is
    # a speed target, measured by `python -m benchmarks.harness_capacity` (mean TTFT within 2% of the server's).
    assert np.median(gaps) < 5.0
    assert client["cpu_per_request_ms"] < 20.0
    # the harness measures its own lag and queue: figures a reader can compare with the gaps printed above
    assert np.isfinite(client["loop_lag_p99_ms"]) and res.summary.client_queue_ms.count == res.summary.ttft_ms.count


def test_server_metrics_are_reconciled(truth_run):
    res, truth = truth_run
    srv, rec = res.summary.server, res.summary.reconciliation
    assert srv.available
    assert srv.requests == 90  # scraped after warmup: warmup not included
    assert srv.ttft_mean_ms == pytest.approx(np.mean([t["ttft_s"] for t in truth.values()
                                                      if not t["id"].startswith("warmup")]) * 1000, rel=0.01)
    assert 0 <= rec["ttft_gap_ms"] < 5.0
    assert srv.generation_tokens == rec["client_output_tokens"] == 90 * N_OUT
    assert srv.prompt_tokens == rec["client_input_tokens"]
    assert srv.gauge_samples >= 3 and srv.num_requests_running_max >= 1


def test_files_written_and_reloaded(truth_run):
    res, _ = truth_run
    out = res.out_dir
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 90 and len((out / "warmup.jsonl").read_text().splitlines()) == 4
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["completed"] == 90 and config["status"] == "complete"
    assert config["arrivals"] == {"arrivals": "poisson", "rate": 30, "seed": 1, "max_in_flight": None}
    assert config["versions"]["aiohttp"] and config["command"] is None  # a hand-built workload has no CLI form
    back = bench.load_run(out)
    assert back.summary.ttft_ms.p99 == pytest.approx(res.summary.ttft_ms.p99)
    assert back.summary.output_throughput == pytest.approx(res.summary.output_throughput)
    assert back.summary.goodput.good == res.summary.goodput.good
    # goodput under a new SLO, recomputed from the saved records alone
    g = bench.goodput(out, SLO(ttft_ms=TTFT_S * 1000 + 2, tpot_ms=TPOT_S * 1000 + 1))
    assert g.good == sum(1 for r in res.records if r.ttft_ms <= TTFT_S * 1000 + 2 and r.tpot_ms <= TPOT_S * 1000 + 1)
    df = res.df
    assert len(df) == 90 and {"ttft_ms", "tpot_ms", "client_queue_ms", "in_window", "meets_slo"} <= set(df.columns)


def test_charts_stay_small(truth_run):
    res, _ = truth_run
    for chart in (bench.charts.cdf(res, ["ttft", "itl"]), bench.charts.timeline(res, max_requests=50),
                  bench.charts.latency_throughput({"a": res, "b": res})):
        spec = chart.to_dict()
        sizes = [len(v) for v in spec.get("datasets", {}).values()]
        assert sizes and max(sizes) <= 5000


def test_failures_are_counted_with_their_errors():
    with CalibrationServer(ttft_s=0.02, tpot_s=0.004, error_rate=0.2, abort_rate=0.15, metrics=False,
                           seed=3) as cal:
        res = bench.run(workload(60), Poisson(rate=40, seed=2), base_url=cal.base_url, out=False, progress=False)
        truth = cal.stats()["requests"]
    s = res.summary
    http500 = sum(1 for t in truth if t["status"] == "error500")
    aborted = sum(1 for t in truth if t["status"] == "aborted")
    assert http500 > 0 and aborted > 0
    assert s.failed == http500 + aborted and s.completed == 60 - s.failed
    assert s.errors.get("HTTP 500: injected error (calibration server)") == http500
    assert sum(v for k, v in s.errors.items() if not k.startswith("HTTP 500")) == aborted
    assert s.whole_run.ttft_ms.count == s.completed  # percentiles over completed requests, failures beside them
    assert all(r.http_status == 500 for r in res.records if r.error and r.error.startswith("injected"))
    # a server without /metrics: a note, and the run went on
    assert s.server.available is False and "no server metrics" in s.server.note


def test_without_continuous_usage_tokens_are_estimated_and_flagged():
    with CalibrationServer(ttft_s=0.02, tpot_s=0.004, tokens_per_chunk=2, continuous_usage=False,
                           role_chunk=True) as cal:
        res = bench.run(workload(12, "chat", out=9), Synchronous(), base_url=cal.base_url, out=False, progress=False)
    s = res.summary
    r = res.records[0]
    assert not r.tokens_exact and r.streamed_tokens == 5 and r.output_tokens == 9  # 1 + 2 + 2 + 2 + 2 chunks
    # TPOT still uses the server's final count: 4 ms a token, where the 5 streamed chunks would make it 8 (the median
    # of 12 requests, loose enough for the real-server tests running beside this one: one request read 5.1 ms so)
    assert s.tpot_ms.p50 == pytest.approx(4.0, rel=0.4)
    assert any("without per-chunk usage" in w for w in s.warnings)


def test_open_loop_sends_on_schedule_and_a_cap_is_recorded_as_client_queue():
    with CalibrationServer(ttft_s=0.4, tpot_s=0.05, default_max_tokens=4) as cal:
        free = bench.run(workload(30, out=4), ConstantRate(rate=40), base_url=cal.base_url, out=False,
                         progress=False, server_metrics=False)
        capped = bench.run(workload(30, out=4, tag="c"), ConstantRate(rate=40, max_in_flight=4),
                           base_url=cal.base_url, out=False, progress=False, server_metrics=False)
    # ~22 requests in flight at once: none waits for another to finish (no hidden semaphore)
    disp = sorted(r.timings.t_dispatched for r in free.records)
    assert (disp[-1] - disp[0]) == pytest.approx(29 / 40, abs=0.03)
    # on schedule: half within 15 ms, none held anywhere near a request's 550 ms (a hidden cap of 4 would hold them
    # 500 ms and more, as below); the tail is the machine's (29 ms beside the real-server tests once)
    assert free.summary.client_queue_ms.p50 < 15.0 and free.summary.client_queue_ms.max < 150.0
    assert free.summary.ttft_ms.mean == pytest.approx(400, rel=0.15)
    # with a cap of 4, requests wait in the client: recorded as client queue time, not hidden in TTFT. Hidden, the
    # queue (seconds here: 30 requests of 550 ms, 4 at a time) would put the mean TTFT far above 400 ms; 15% is the
    # machine's share when the real-server tests run beside this one (441 ms once, on 2 cores with a pytest besides)
    assert capped.summary.client_queue_ms.mean > 1000
    assert capped.summary.ttft_ms.mean == pytest.approx(400, rel=0.15)


def test_run_works_inside_a_running_event_loop(cal):
    async def notebook_cell():  # Jupyter runs cells while its own loop is running
        return bench.run(workload(5, tag="nb"), Synchronous(), base_url=cal.base_url, out=False, progress=True)

    res = asyncio.run(notebook_cell())
    assert res.summary.completed == 5


def test_results_are_on_disk_as_they_finish_even_if_the_process_dies(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"p{i}", "output_len": 4}) + "\n" for i in range(40)))
    out = tmp_path / "run"
    with CalibrationServer(ttft_s=0.05, tpot_s=0.05) as cal:
        proc = subprocess.Popen([sys.executable, "-m", "helpers.bench", "run", "--base-url", cal.base_url,
                                 "--endpoint", "completions", "--prompts", str(prompts), "--tokenizer", "none",
                                 "--arrivals", "constant", "--rate", "8", "--num-requests", "40", "--out", str(out),
                                 "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            lines: list[str] = []
            while time.monotonic() < deadline:
                path = out / "requests.jsonl"
                lines = path.read_text().splitlines() if path.exists() else []
                if len(lines) >= 5:
                    break
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
            os.kill(proc.pid, signal.SIGKILL)  # a crash, mid-run
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stderr.close()
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert 5 <= len(lines) < 40
    assert all(json.loads(x)["ok"] for x in lines)  # every line written is a whole record
    assert not (out / "summary.json").exists()
    crashed = bench.load_run(out)
    assert crashed.summary.completed == len(lines)
    assert json.loads((out / "config.json").read_text())["status"] == "running"


def test_cli_run_and_summarize(cal, tmp_path, capsys):
    from helpers.bench.__main__ import main

    out = tmp_path / "cli"
    cal.reset()
    rc = main(["run", "--base-url", cal.base_url, "--model", cal.model, "--endpoint", "completions",
               "--tokenizer", str(default_model()), "--arrivals", "poisson", "--rate", "25", "--num-requests", "30",
               "--input-len", "48", "--output-len", "8", "--seed", "3", "--out", str(out), "--warmup", "2",
               "--no-progress", "--slo-ttft-ms", "100"])
    assert rc == 0
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 30 and all(r["output_tokens"] == 8 and r["input_tokens"] == 48 for r in reqs)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("completed", "failed", "duration_s", "request_throughput", "output_throughput"):
        assert summary[key] is not None
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert {"mean", "p50", "p90", "p99"} <= set(summary[m])
    assert summary["input_tokens"]["mismatched"] == 0
    config = json.loads((out / "config.json").read_text())
    assert config["command"].startswith("python -m helpers.bench run --base-url")
    assert "--slo-ttft-ms 100" in config["command"]
    # A report's reproduce command: the same run, aimed at the reader's server and folder, not this run's own
    # (rerunning the recorded command as written would overwrite the records it reproduces).
    again = tmp_path / "again"
    cmd = bench.load_run(out).reproduce_command(base_url=cal.base_url, out=str(again))
    args = shlex.split(cmd)
    assert args[:4] == ["python", "-m", "helpers.bench", "run"] and args.count("--out") == 1
    assert args[args.index("--base-url") + 1] == cal.base_url and args[args.index("--out") + 1] == str(again)
    before = (out / "requests.jsonl").read_text()
    cal.reset()
    assert main(args[3:] + ["--no-progress"]) == 0
    assert (out / "requests.jsonl").read_text() == before
    rerun = [json.loads(x) for x in (again / "requests.jsonl").read_text().splitlines()]
    # the same requests (records are written as they finish: two can swap places under load)
    assert sorted((r["id"], r["input_tokens"]) for r in rerun) == sorted((r["id"], r["input_tokens"]) for r in reqs)
    assert "--out" not in shlex.split(bench.load_run(out).reproduce_command())
    capsys.readouterr()
    assert main(["summarize", str(out), "--slo-ttft-ms", "61"]) == 0
    text = capsys.readouterr().out
    assert "goodput at this load (TTFT <= 61 ms)" in text and "completed" in text


def test_stop_when_ends_the_sending_and_keeps_every_record_sent():
    with CalibrationServer(ttft_s=0.05, tpot_s=0.01, default_max_tokens=4) as cal:
        t0 = time.monotonic()
        res = bench.run(workload(200, out=4, tag="stop"), ConstantRate(rate=20), base_url=cal.base_url, out=False,
                        progress=False, server_metrics=False, stop_when=lambda: time.monotonic() - t0 > 1.5)
        served = len(cal.stats()["requests"])
    n = len(res.records)
    assert 15 <= n <= 60, n                       # ~1.5-2 s of a 10 s schedule was sent, not all 200
    assert n == served and res.summary.failed == 0  # what was sent was answered and recorded
    assert res.config["stopped_early"] == "stop_when() returned true"


def test_a_runs_send_times_are_known_before_it_starts(cal):
    """Lab 23's queue model counts the requests a seeded run will send before it runs: the harness must send
    exactly ``arrivals.send_times(duration_s)``."""
    steps = bench.Steps(((1.0, 8.0), (1.0, 16.0)), seed=5)
    res = bench.run(workload(64, out=2, tag="s"), steps, base_url=cal.base_url, duration_s=steps.duration_s,
                    progress=False, out=False)
    sent = [r.scheduled_offset_s for r in sorted(res.records, key=lambda r: int(r.id))]
    assert len(sent) == steps.count_for(steps.duration_s) == 24
    assert sent == pytest.approx(steps.send_times(steps.duration_s))


def test_capacity_is_what_the_server_completes_per_second_in_lockstep(cal):
    """Four in flight of identical requests (TTFT 60 ms + 15 x TPOT 8 ms = 180 ms each, in lockstep waves): the
    calibration server completes 4 / 0.18 = 22.2 per second, less what the client adds."""
    cal.reset()
    cap = bench.capacity(workload(400, out=N_OUT, tag="c"), cal.base_url, concurrency=4, duration_s=3.0,
                         progress=False, out=False)
    truth = 4 / (TTFT_S + (N_OUT - 1) * TPOT_S)
    assert cap.tokens_per_request == N_OUT and cap.concurrency == 4
    assert cap.requests_per_s == pytest.approx(truth, rel=0.03)   # measured 22.24-22.29 (completions counted: 23.4)
    assert cap.output_tokens_per_s == pytest.approx(cap.requests_per_s * N_OUT)


def test_options_come_in_typed_groups_and_a_named_field_wins():
    size = bench.Size(num_requests=200, warmup=8)
    s, snd, rec = bench.options.resolve_options(size, None, None, seed=3, label="x", workers="auto")
    assert (s.num_requests, s.warmup, s.seed, rec.label, snd.workers) == (200, 8, 3, "x", "auto")
    s, _, _ = bench.options.resolve_options(size, duration_s=30)   # sized in seconds at the call: not also 200
    assert (s.num_requests, s.duration_s, s.warmup) == (None, 30, 8)
    with pytest.raises(TypeError, match="unknown option.*num_request\\b.*it takes num_requests"):
        bench.options.resolve_options(num_request=5)
    with pytest.raises(TypeError, match="size= takes a bench.Size"):
        bench.options.resolve_options(bench.Recording())
    with pytest.raises(ValueError, match="not both"):
        bench.Size(num_requests=5, duration_s=5)


def test_a_run_told_in_groups_is_the_run_told_by_name(cal):
    """The same run, once by named options and once by typed groups: the same requests sent, the same config."""
    by_name = bench.run(workload(6, out=2, tag="g", warmup=2), Synchronous(), base_url=cal.base_url, num_requests=4,
                        warmup=2, seed=7, temperature=0.5, label="g", out=False, progress=False, server_metrics=False)
    grouped = bench.run(workload(6, out=2, tag="g", warmup=2), Synchronous(), base_url=cal.base_url,
                        size=bench.Size(num_requests=4, warmup=2, seed=7), sending=bench.Sending(temperature=0.5),
                        recording=bench.Recording(label="g", out=False, progress=False, server_metrics=False))
    keep = ("num_requests", "warmup", "seed", "temperature", "label", "server_metrics", "out", "timeout_s")
    assert {k: by_name.config[k] for k in keep} == {k: grouped.config[k] for k in keep}
    assert by_name.config["num_requests"] == 4 and by_name.config["warmup"] == 2 and grouped.config["seed"] == 7
    assert [r.id for r in by_name.records] == [r.id for r in grouped.records] == ["0", "1", "2", "3"]


def test_a_tick_after_the_runs_loop_closed_sends_nothing_and_raises_nothing():
    """The calling thread ticks the run (feeding a closed loop) until the harness thread exits: a tick that came after
    the measuring phase ended, before the thread exited, fed a closed event loop ("RuntimeError: Event loop is
    closed", seen in a GPU rehearsal's capacity run). It is now a no-op."""
    from helpers.bench.harness import Harness, Supply

    reqs = [Request(id=f"r{i}", prompt="x", max_output_tokens=1) for i in range(8)]
    h = Harness(requests=[], supply=Supply(reqs[:2], more=lambda k: reqs[:k]), warmup=[], arrivals=Synchronous(),
                cfg=None, folder=None, server_metrics=False, sample_interval_s=1.0, concurrency=2, duration_s=60.0)
    loop = asyncio.new_event_loop()
    h._loop, h._local_feed, h._feeding, h.t0 = loop, asyncio.Queue(), True, time.perf_counter()
    loop.close()
    h.tick()  # feeds more: the loop is closed, so nothing happens
    h.stop_sending("done")
    h.server_gone("test")
