"""Two checks that show where the tools' definitions part: a chat probe that times vLLM's role-only first chunk,
and every tool against helpers.bench's calibration server, whose answers are known."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import tools as _tools
from .records import Load, Target, mean, server_under_test

__all__ = ["role_chunk_probe", "CALIBRATION", "calibration_check"]


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
                        for ch in json.loads(line[5:]).get("choices") or []:
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
    return {"n": len(rows), "role_ttft_mean": mean(r["role_ms"] for r in rows),
            "content_ttft_mean": mean(r["first_content_ms"] for r in rows), "gap_mean": mean(gap),
            "gap_max": max(gap), "same_read": int(sum(r["same_read"] for r in rows))}


CALIBRATION = {"ttft_s": 0.100, "tpot_s": 0.010, "tokens_per_chunk": 4, "first_chunk_tokens": 1, "role_chunk": True}


def calibration_check(tokenizer: str, out: Path, tools: Sequence[str] = ("ours", "vllm"),
                      exes: dict[str, Path] | None = None, num_requests: int = 12, output_len: int = 33,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every tool in ``tools`` against helpers.bench's calibration server, whose answers are known.

    It streams like vLLM but on a fixed schedule: first token 100 ms after receipt, then one token every
    10 ms, sent 4 tokens per chunk, and on chat a role-only chunk at once. So the true TTFT is 100 ms,
    the true TPOT and per-token ITL 10 ms, and the gap between chunks 40 ms: where a tool's definition
    departs from ours, the numbers show by how much.
    """
    from helpers.bench import CalibrationServer

    rows = []
    # No tokenizer for the server: with one, helpers' calibration server renders the chat template and answers 500
    # to chat messages whose content is a list of parts, which `vllm bench serve` and GuideLLM send. Prompt lengths
    # do not matter here (no prefill time per token).
    with CalibrationServer(**CALIBRATION) as cal:
        target = server_under_test(cal.base_url, cal.model, tokenizer)
        for endpoint in ("completions", "chat"):
            load = Load(rate=4.0, num_requests=num_requests, input_len=32, output_len=output_len, seed=500,
                        endpoint=endpoint)
            for tool in tools:
                d = out / "calibration" / f"{endpoint}-{tool}"
                if d.exists():
                    shutil.rmtree(d)
                d.mkdir(parents=True)
                log(f"calibration server, {endpoint}: {_tools.LABELS[tool]} ...")
                run = _tools.run(tool, target, load, d, 0, exes or {})
                rep = run.reported
                rows.append({"endpoint": endpoint, "tool": tool, "ok": run.ok, "error": run.error,
                             "ttft_mean": rep.get("ttft_mean"), "tpot_mean": rep.get("tpot_mean"),
                             "itl_mean": rep.get("itl_mean"), "itl_p50": rep.get("itl_p50"),
                             "itl_p99": rep.get("itl_p99"), "completed": rep.get("completed"),
                             "matched_ttft_mean": run.matched["ttft_mean"],
                             "matched_tpot_mean": run.matched["tpot_mean"],
                             "chunks_per_request": mean(r.chunks for r in run.reqs if r.ok)})
        stats = cal.stats()
    late = [r.get("lateness_max_s") for r in stats.get("requests", []) if r.get("lateness_max_s") is not None]
    return {"config": CALIBRATION, "output_len": output_len, "num_requests": num_requests, "rows": rows,
            "server_lateness_max_ms": max(late) * 1000.0 if late else None,
            "truth": {"ttft_ms": CALIBRATION["ttft_s"] * 1000, "tpot_ms": CALIBRATION["tpot_s"] * 1000,
                      "itl_per_token_ms": CALIBRATION["tpot_s"] * 1000,
                      "chunk_gap_ms": CALIBRATION["tpot_s"] * 1000 * CALIBRATION["tokens_per_chunk"]}}
