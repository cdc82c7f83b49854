"""NVIDIA AIPerf 0.13.0, ``aiperf profile``, from its own virtual environment (``.venv-aiperf``).

Its pins clash with vLLM's (pandas, psutil, prometheus-client, huggingface-hub, pyzmq, rich would change), so it
never goes into ``.venv``: ``python3 -m venv .venv-aiperf`` and ``pip install aiperf==0.13.0``, done on first use.

Offline, AIPerf 0.13.0 cannot load a tokenizer from a folder: with ``HF_HUB_OFFLINE=1`` it hands the path to
``huggingface_hub.snapshot_download``, which refuses it (``HFValidationError: Repo id must be in the form
'repo_name' or 'namespace/repo_name'``). A tokenizer that sits in the Hugging Face cache (this project's
SmolLM2 does) is therefore passed by its hub id, which AIPerf resolves from the cache without the network.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from helpers import settings

from ..process import run_tool, window_cpu
from ..records import Load, Req, Target, ToolRun
from . import venvs

__all__ = ["PINS", "venv", "ensure", "version", "hub_id", "args", "parse", "run"]

PINS = ("aiperf==0.13.0",)
RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"


def venv() -> Path:
    """Where AIPerf's own environment lives: ``.venv-aiperf`` in the repository."""
    return settings.repo_root() / ".venv-aiperf"


def ensure(log: Callable[[str], None] = print) -> tuple[Path | None, str]:
    """The ``aiperf`` executable, installing it on first use; (None, why) if it cannot be had."""
    return venvs.ensure(venv(), PINS, "aiperf", log)


def version() -> str | None:
    return venvs.installed_version(venv(), "aiperf")


def hub_id(tokenizer: str) -> str:
    """``org/name`` for a snapshot folder of the Hugging Face cache (``.../models--org--name/snapshots/REV``),
    else ``tokenizer`` unchanged."""
    m = re.search(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$", str(tokenizer))
    return f"{m.group(1)}/{m.group(2)}" if m else str(tokenizer)


def args(target: Target, load: Load, out: Path, seed: int) -> list[str]:
    """``aiperf profile`` arguments for ``load``: constant arrivals, synthetic prompts of exactly ``input_len``
    tokens, ``output_len`` tokens forced with ``ignore_eos``/``min_tokens``, the server's token counts; AIPerf's
    own /metrics and GPU collectors off (they would add their own scrapes to the server being measured)."""
    n = str(load.output_len)
    return ["--model", target.model, "--url", target.endpoint.root,
            "--endpoint-type", "chat" if load.endpoint == "chat" else "completions", "--streaming",
            "--request-rate", f"{load.rate:g}", "--arrival-pattern", "constant",
            "--request-count", str(load.num_requests),
            "--prompt-input-tokens-mean", str(load.input_len), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", n, "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{n}",
            "--extra-inputs", "temperature:0", "--use-server-token-count",
            "--tokenizer", hub_id(target.model_path), "--random-seed", str(seed),
            "--output-artifact-dir", str(out), "--ui-type", "none",
            "--no-server-metrics", "--no-gpu-telemetry"]


def _val(metrics: dict[str, Any], name: str) -> Any:
    m = metrics.get(name)
    return m.get("value") if isinstance(m, dict) else None


def parse(out: Path) -> tuple[list[Req], dict[str, Any], dict[str, Any]]:
    """``profile_export.jsonl`` (one record per request) and ``profile_export_aiperf.json`` (its summary) ->
    (per-request records, the numbers as it reports them, extras).

    AIPerf times with ``perf_counter_ns``; ``request_start_ns`` is the same instant on the wall clock. Its TTFT
    ends at the first response with content, its request latency at the last one (usage-only chunks excluded).
    """
    reqs = []
    for line in (out / RECORDS).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, m = rec.get("metadata") or {}, rec.get("metrics") or {}
        ttft, last = _val(m, "time_to_first_token"), _val(m, "request_latency")
        n = _val(m, "output_sequence_length") or _val(m, "usage_completion_tokens")
        ok = not rec.get("error") and not meta.get("was_cancelled") and None not in (ttft, last)
        gaps = _val(m, "inter_chunk_latency")
        start = meta.get("request_start_ns")
        reqs.append(Req(ok=ok, ttft_ms=ttft if ok else None, last_ms=last if ok else None,
                        n_out=int(n) if ok and n is not None else None,
                        chunks=len(gaps) + 1 if ok and gaps is not None else (1 if ok else None),
                        gaps_ms=list(gaps) if ok and gaps is not None else None,
                        t0_wall=start / 1e9 if start else None,
                        input_tokens=_val(m, "usage_prompt_tokens") or _val(m, "input_sequence_length")))
    s = json.loads((out / SUMMARY).read_text())

    def stat(name: str, key: str) -> float | None:
        return (s.get(name) or {}).get(key)

    failed = len(s.get("error_summary") or [])
    reported = {
        "ttft_mean": stat("time_to_first_token", "avg"), "ttft_p50": stat("time_to_first_token", "p50"),
        "ttft_p99": stat("time_to_first_token", "p99"),
        # AIPerf has no "TPOT": its "inter_token_latency" is (request latency - TTFT) / (n - 1) per request,
        # what vLLM and we call TPOT; its per-chunk gaps are "inter_chunk_latency" (kept in extra)
        "tpot_mean": None, "tpot_p50": None,
        "itl_mean": stat("inter_token_latency", "avg"), "itl_p50": stat("inter_token_latency", "p50"),
        "itl_p99": stat("inter_token_latency", "p99"),
        "e2e_mean": stat("request_latency", "avg"), "e2e_p50": stat("request_latency", "p50"),
        "output_throughput": stat("output_token_throughput", "avg"),
        "completed": int(stat("request_count", "avg") or 0),
        "failed": int(sum(e.get("count", 1) for e in s.get("error_summary") or [])) if failed else 0,
    }
    extra = {"duration_s": stat("benchmark_duration", "avg"),
             "inter_chunk_latency": {k: stat("inter_chunk_latency", k) for k in ("avg", "p50", "p99")}}
    return reqs, reported, extra


def run(target: Target, load: Load, out: Path, round_: int, exe: Path) -> ToolRun:
    """One run of AIPerf at ``load``, from its own virtual environment."""
    a = args(target, load, out, load.seed + round_)
    run = ToolRun("aiperf", round_, str(out), "aiperf profile " + " ".join(a))
    cpu = run_tool(run, target, [str(exe), "profile", *a], out, load.timeout_s + 120, out, SUMMARY)
    if cpu is not None:
        run.reqs, run.reported, run.extra = parse(out)
        window_cpu(run, cpu)
    return run
