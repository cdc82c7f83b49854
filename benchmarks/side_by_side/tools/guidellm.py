"""GuideLLM 0.8.1, ``guidellm run --scenario``, from its own virtual environment (``.venv-guidellm``).

Its pins differ from vLLM's, so it never goes into ``.venv``: ``python3 -m venv .venv-guidellm`` and
``pip install guidellm==0.8.1 "torch==2.13.0+cpu"`` (it pulls torch), done on first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from helpers import settings

from ..process import run_tool, window_cpu
from ..records import Load, Req, Target, ToolRun
from . import venvs

__all__ = ["PINS", "venv", "ensure", "version", "scenario", "parse", "run"]

PINS = ("guidellm==0.8.1", "torch==2.13.0+cpu")
RESULT = "benchmarks.json"


def venv() -> Path:
    """Where GuideLLM's own environment lives: ``.venv-guidellm`` in the repository."""
    return settings.repo_root() / ".venv-guidellm"


def ensure(log: Callable[[str], None] = print) -> tuple[Path | None, str]:
    """The ``guidellm`` executable, installing it on first use; (None, why) if it cannot be had."""
    return venvs.ensure(venv(), PINS, "guidellm", log)


def version() -> str | None:
    return venvs.installed_version(venv(), "guidellm")


def scenario(target: Target, load: Load, out: Path, seed: int) -> dict[str, Any]:
    """A GuideLLM scenario for ``load``: constant rate, synthetic prompts of ``input_len`` tokens, fixed output."""
    return {
        "metadata": {"name": "side-by-side", "description": load.describe()},
        "spec": {
            "backend": {"kind": "openai_http", "target": target.endpoint.root, "model": target.model,
                        "request_format": "/v1/chat/completions" if load.endpoint == "chat" else "/v1/completions",
                        "extras": {"body": {"temperature": 0}}},
            "profile": {"kind": "constant", "rate": load.rate},
            "constraints": [{"kind": "max_requests", "count": load.num_requests}],
            "tokenizer": {"kind": "huggingface_auto", "model": target.model_path},
            "data": [{"kind": "synthetic_text", "prompt_tokens": load.input_len, "output_tokens": load.output_len}],
            "seed": {"kind": "static", "value": seed},
            "outputs": [{"kind": "json", "path": str(out / RESULT)}],
        },
    }


def parse(path: Path) -> tuple[list[Req], dict[str, Any], dict[str, Any]]:
    """``benchmarks.json`` -> (per-request records, the numbers as it reports them, extras).

    GuideLLM's timings are ``time.time()`` seconds; ``request_start`` is when httpx wrote the first header.
    """
    b = json.loads(path.read_text())["benchmarks"][0]
    reqs = []
    for status in ("successful", "errored", "incomplete"):
        for r in b["requests"].get(status) or []:
            t = r["info"]["timings"]
            start, first, last = t.get("request_start"), t.get("first_token_iteration"), t.get("last_token_iteration")
            ok = status == "successful" and None not in (start, first, last)
            reqs.append(Req(ok=ok, ttft_ms=(first - start) * 1000.0 if ok else None,
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
    reported = {
        "ttft_mean": dist("time_to_first_token_ms", "mean"), "ttft_p50": dist("time_to_first_token_ms", "median"),
        "ttft_p99": dist("time_to_first_token_ms", "p99"),
        "tpot_mean": dist("time_per_output_token_ms", "mean"), "tpot_p50": dist("time_per_output_token_ms", "median"),
        "itl_mean": dist("inter_token_latency_ms", "mean"), "itl_p50": dist("inter_token_latency_ms", "median"),
        "itl_p99": dist("inter_token_latency_ms", "p99"),
        "e2e_mean": dist("request_latency", "mean", 1000.0), "e2e_p50": dist("request_latency", "median", 1000.0),
        "output_throughput": dist("output_tokens_per_second", "mean"),
        "completed": totals.get("successful"), "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
    }
    extra = {"duration_s": b.get("duration"), "worker_processes": b["scheduler_state"].get("num_processes"),
             "output_tokens": sum(r.n_out or 0 for r in reqs if r.ok)}
    return reqs, reported, extra


def run(target: Target, load: Load, out: Path, round_: int, exe: Path) -> ToolRun:
    """One run of GuideLLM at ``load``, from its own virtual environment."""
    path = out / "scenario.json"
    path.write_text(json.dumps(scenario(target, load, out, load.seed + round_), indent=2))
    cmd = [str(exe), "run", "--scenario", str(path), "--disable-console-interactive"]
    run = ToolRun("guidellm", round_, str(out), f"guidellm run --scenario {path}")
    cpu = run_tool(run, target, cmd, out, load.timeout_s + 120, out, RESULT)
    if cpu is not None:
        run.reqs, run.reported, run.extra = parse(out / RESULT)
        window_cpu(run, cpu)
    return run
