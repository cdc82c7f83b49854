"""A calibration server: an OpenAI-compatible endpoint whose latencies are known, to test a load generator.

It streams like vLLM 0.32 (``/v1/chat/completions`` with a role-only first chunk, ``/v1/completions``,
per-chunk cumulative ``usage`` when ``continuous_usage_stats`` is asked for, a final ``choices: []``
usage chunk, ``data: [DONE]``), lists ``/v1/models`` and exposes a small vLLM-named ``/metrics``.

Its schedule is exact by construction: token ``i`` of a request is due at
``start + ttft + prefill_per_token * prompt_tokens + i * tpot`` (``start`` = receipt, or leaving the
queue when ``max_concurrency`` is set), and a chunk is sent when its last token is due. The first
chunk carries ``first_chunk_tokens`` tokens (1, as after a prefill), the others ``tokens_per_chunk``
(several, as with speculative decoding). Emissions are scheduled against absolute deadlines, so
lateness does not accumulate; the actual send times are recorded and served at
``/calibration/stats`` next to the configuration (the truth to compare a client with). Errors are
injected per request with a seeded RNG keyed by the request's id: HTTP 500s (``error_rate``) and
streams cut mid-way (``abort_rate``); ``kill_after_s`` makes the server exit abruptly that many seconds after
it started (and :meth:`CalibrationServer.kill` kills it at once), to see what a client does when its server dies.

It scales like the client: ``processes=N`` runs N serving processes on one port (``SO_REUSEPORT``: the kernel
spreads connections over them) under a supervising process. Each one appends its truth to a shared folder and
``/calibration/stats`` merges all of them; ``/metrics`` merges theirs too (prometheus_client's multiprocess
mode). A client's own limit can then be measured without the server being the bottleneck.

::

    with CalibrationServer(ttft_s=0.05, tpot_s=0.01, tokens_per_chunk=3) as cal:
        result = bench.run(workload, base_url=cal.base_url, model=cal.model)
        truth = cal.stats()

    python -m helpers.bench.calibration --port 8100 --ttft-ms 50 --tpot-ms 10 --processes 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .. import procs
from ..endpoint import Listener, http

__all__ = ["CalibrationConfig", "CalibrationServer", "serve", "supervise", "build_app"]

_READY = "CALIBRATION READY port="
# -c rather than -m: helpers.bench imports this module, and running it again as __main__ would load it twice.
_SELF = "import sys; from helpers.bench.calibration import _main; sys.exit(_main(sys.argv[1:]))"
_WORDS = [" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]


@dataclass
class CalibrationConfig:
    """What the calibration server does: its latencies, chunking, usage reporting and injected faults.

    Introduced in lab 10 (Load Testing Honestly).
    """

    ttft_s: float = 0.05
    tpot_s: float = 0.01
    prefill_s_per_token: float = 0.0
    tokens_per_chunk: int = 1
    first_chunk_tokens: int = 1
    role_chunk: bool = True
    usage: bool = True
    continuous_usage: bool = True
    error_rate: float = 0.0
    abort_rate: float = 0.0
    max_concurrency: int | None = None
    default_max_tokens: int = 16
    seed: int = 0
    metrics: bool = True
    model: str = "calibration"
    tokenizer: str | None = None
    processes: int = 1
    kill_after_s: float | None = None

    def cli_args(self) -> list[str]:
        args = ["--ttft-ms", repr(self.ttft_s * 1000), "--tpot-ms", repr(self.tpot_s * 1000),
                "--prefill-ms-per-token", repr(self.prefill_s_per_token * 1000),
                "--tokens-per-chunk", str(self.tokens_per_chunk), "--first-chunk-tokens", str(self.first_chunk_tokens),
                "--error-rate", repr(self.error_rate), "--abort-rate", repr(self.abort_rate),
                "--default-max-tokens", str(self.default_max_tokens), "--seed", str(self.seed), "--model", self.model]
        if not self.role_chunk:
            args.append("--no-role-chunk")
        if not self.usage:
            args.append("--no-usage")
        if not self.continuous_usage:
            args.append("--no-continuous-usage")
        if not self.metrics:
            args.append("--no-metrics")
        if self.max_concurrency:
            args += ["--max-concurrency", str(self.max_concurrency)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        if self.processes != 1:
            args += ["--processes", str(self.processes)]
        if self.kill_after_s is not None:
            args += ["--kill-after-s", repr(self.kill_after_s)]
        return args


# ----------------------------------------------------------------------------- prompt counting
class _Counter:
    """Prompt tokens: with a tokenizer folder, the ``tokenizers`` library (+ its chat template via
    jinja2, as transformers renders it); without one, whitespace-separated words."""

    def __init__(self, path: str | None):
        self.tok = None
        self.template = None
        if not path:
            return
        from tokenizers import Tokenizer

        folder = Path(path)
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = {}
        if (folder / "tokenizer_config.json").is_file():
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
        source = cfg.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            source = (folder / "chat_template.jinja").read_text()
        if source:
            import jinja2

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
            self.template = env.from_string(source)
            self.special = {k: cfg.get(k) for k in ("bos_token", "eos_token")}

    def completion(self, prompt: Any) -> int:
        if isinstance(prompt, list):
            return len(prompt)
        if self.tok is None:
            return len(str(prompt).split())
        return len(self.tok.encode(str(prompt), add_special_tokens=True).ids)

    def chat(self, messages: list[dict[str, Any]]) -> int:
        if self.tok is None or self.template is None:
            return sum(len(str(m.get("content", "")).split()) for m in messages)
        text = self.template.render(messages=messages, add_generation_prompt=True, **self.special)
        return len(self.tok.encode(text, add_special_tokens=False).ids)


# ------------------------------------------------------------------------------------ the app
class _Shared:
    """The truth of one of several serving processes, in a folder they share: each appends its finished requests
    to ``records-K.jsonl`` and one byte per arrival to ``arrivals-K``; any of them reads all the files."""

    def __init__(self, folder: str, index: int):
        self.folder, self.index = Path(folder), index
        self._rec = open(self.folder / f"records-{index}.jsonl", "a", encoding="utf-8")
        self._arr = open(self.folder / f"arrivals-{index}", "ab", buffering=0)

    def arrive(self) -> None:
        self._arr.write(b".")

    def record(self, rec: dict[str, Any]) -> None:
        self._rec.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._rec.flush()

    def read(self) -> tuple[list[dict[str, Any]], int]:
        records = []
        for path in sorted(self.folder.glob("records-*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line being written right now
                    records.append(json.loads(line))
        arrivals = sum(p.stat().st_size for p in self.folder.glob("arrivals-*"))
        return records, arrivals

    def reset(self) -> None:
        for path in [*self.folder.glob("records-*.jsonl"), *self.folder.glob("arrivals-*")]:
            os.truncate(path, 0)  # the writers append (O_APPEND), so they go on at the new end


class _State:
    def __init__(self, cfg: CalibrationConfig, shared: _Shared | None = None):
        self.cfg = cfg
        self.counter = _Counter(cfg.tokenizer)
        self.shared = shared
        self.records: list[dict[str, Any]] = []
        self.arrivals = 0
        self.running = 0
        self.waiting = 0
        self.sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        self.metrics = _Metrics(cfg.model, multiprocess=shared is not None) if cfg.metrics else None

    def arrive(self) -> None:
        self.arrivals += 1
        if self.shared is not None:
            self.shared.arrive()

    def record(self, rec: dict[str, Any]) -> None:
        if self.shared is not None:
            self.shared.record(rec)
        else:
            self.records.append(rec)

    def truth(self) -> tuple[list[dict[str, Any]], int]:
        return self.shared.read() if self.shared is not None else (self.records, self.arrivals)

    def reset(self) -> None:
        if self.shared is not None:
            self.shared.reset()
        self.records.clear()

    def gauges(self) -> None:
        """Publish running/waiting/KV usage (with several processes, each its share: the scrape sums them)."""
        m = self.metrics
        if m is None:
            return
        m.running.labels(m.model).set(self.running)
        m.waiting.labels(m.model).set(self.waiting)
        slots = (self.cfg.max_concurrency or 0) * max(1, self.cfg.processes)
        m.kv.labels(m.model).set(self.running / slots if slots else 0.0)


class _Metrics:
    def __init__(self, model: str, multiprocess: bool = False):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.multiprocess = multiprocess
        lab = ["model_name"]
        self.model = model
        live = {"multiprocess_mode": "livesum"} if multiprocess else {}
        b = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lab, buckets=b, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E", lab, buckets=b, registry=self.registry)
        self.queue = Histogram("vllm:request_queue_time_seconds", "queue", lab, buckets=b, registry=self.registry)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "prefill", lab, buckets=b,
                                 registry=self.registry)
        self.decode = Histogram("vllm:request_decode_time_seconds", "decode", lab, buckets=b, registry=self.registry)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "TPOT", lab, buckets=b,
                              registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", lab, buckets=b, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=self.registry, **live)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", lab, registry=self.registry, **live)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", lab, registry=self.registry, **live)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens", lab, registry=self.registry)
        self.gen_tokens = Counter("vllm:generation_tokens", "generation tokens", lab, registry=self.registry)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", lab, registry=self.registry)
        self.pc_queries = Counter("vllm:prefix_cache_queries", "prefix cache queries", lab, registry=self.registry)
        self.pc_hits = Counter("vllm:prefix_cache_hits", "prefix cache hits", lab, registry=self.registry)
        for m in (self.preemptions, self.pc_queries, self.pc_hits):
            m.labels(model).inc(0)

    def text(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        if not self.multiprocess:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)  # every serving process's values, from the shared folder
        return generate_latest(merged)


async def _sleep_until(due: float, clock) -> None:
    """Sleep until ``clock() >= due``. asyncio may wake a timer up to its clock resolution early, and a token
    sent before it is due would make the server's own schedule (the truth a client is judged against) a lie."""
    while (delay := due - clock()) > 0:
        await asyncio.sleep(delay)


def _chunk_sizes(n: int, first: int, k: int) -> list[int]:
    sizes = [min(max(first, 1), n)]
    rest = n - sizes[0]
    while rest > 0:
        sizes.append(min(max(k, 1), rest))
        rest -= sizes[-1]
    return sizes


def build_app(cfg: CalibrationConfig, shared: _Shared | None = None):
    """The aiohttp application of the calibration server (for embedding; usually run via :func:`serve`).

    Introduced in lab 10 (Load Testing Honestly).
    """
    from aiohttp import web

    state = _State(cfg, shared)
    app = web.Application(client_max_size=64 * 2**20)
    app["state"] = state

    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": cfg.model, "object": "model", "owned_by": "calibration", "max_model_len": 1_000_000,
             "root": cfg.tokenizer or cfg.model}]})

    async def health(_request):
        return web.Response(text="")

    async def metrics(_request):
        if state.metrics is None:
            return web.Response(status=404, text="metrics disabled")
        state.gauges()
        return web.Response(body=state.metrics.text(), content_type="text/plain")

    async def stats(_request):
        records, arrivals = state.truth()
        return web.json_response({"config": asdict(cfg), "requests": records, "arrivals": arrivals,
                                  "pid": os.getpid()})

    async def reset(_request):
        state.reset()
        return web.json_response({"ok": True})

    async def chat(request):
        return await _generate(request, "chat")

    async def completions(request):
        return await _generate(request, "completions")

    async def _generate(request, endpoint: str):
        body = await request.json()
        t_recv = time.perf_counter()
        state.arrive()
        rid = request.headers.get("X-Bench-Request-Id") or f"arrival-{os.getpid()}-{state.arrivals}"
        rng = random.Random(f"{cfg.seed}:{rid}")
        rec: dict[str, Any] = {"id": rid, "endpoint": endpoint, "status": "ok", "queue_s": 0.0}
        if endpoint == "chat":
            prompt_tokens = state.counter.chat(body.get("messages") or [])
        else:
            prompt_tokens = state.counter.completion(body.get("prompt", ""))
        rec["prompt_tokens"] = prompt_tokens
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or cfg.default_max_tokens)
        stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        want_usage = cfg.usage and bool(opts.get("include_usage"))
        continuous = want_usage and cfg.continuous_usage and bool(opts.get("continuous_usage_stats"))
        fail = rng.random() < cfg.error_rate
        abort_at = rng.randint(1, max(n - 1, 1)) if rng.random() < cfg.abort_rate else None
        if fail:
            rec["status"] = "error500"
            state.record(rec)
            return web.json_response({"error": {"message": "injected error (calibration server)",
                                                "type": "InternalServerError", "code": 500}}, status=500)
        queue_s = 0.0
        if state.sem is not None:
            t_q = time.perf_counter()
            state.waiting += 1
            state.gauges()
            await state.sem.acquire()
            state.waiting -= 1
            queue_s = time.perf_counter() - t_q
        # Only the queue delays the schedule: time spent counting prompt tokens above is not added to it.
        t_start = t_recv + queue_s
        rec["queue_s"] = queue_s
        state.running += 1
        state.gauges()
        try:
            return await _stream(request, endpoint, body, rec, n, prompt_tokens, stream, want_usage, continuous,
                                 abort_at, t_recv, t_start)
        finally:
            state.running -= 1
            state.gauges()
            if state.sem is not None:
                state.sem.release()
            state.record(rec)

    async def _stream(request, endpoint, body, rec, n, prompt_tokens, stream, want_usage, continuous, abort_at,
                      t_recv, t_start):
        clock = time.perf_counter
        base = t_start + cfg.ttft_s + cfg.prefill_s_per_token * prompt_tokens
        sizes = _chunk_sizes(n, cfg.first_chunk_tokens, cfg.tokens_per_chunk)
        created = int(time.time())
        cid = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + rec["id"]
        obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"

        def usage(done: int) -> dict[str, int]:
            return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done, "completion_tokens": done}

        def frame(choices: list, done: int | None) -> bytes:
            d: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": cfg.model, "choices": choices}
            if done is not None:
                d["usage"] = usage(done)
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        if not stream:
            await _sleep_until(base + (n - 1) * cfg.tpot_s, clock)
            text = "".join(_WORDS[i % len(_WORDS)] for i in range(n))
            t = clock()
            rec.update(ttft_s=t - t_recv, e2e_s=t - t_recv, n_tokens=n, n_chunks=1, tpot_s=None, lateness_max_s=0.0)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if endpoint == "chat" else {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": cid, "object": obj.replace(".chunk", ""), "created": created,
                                      "model": cfg.model, "choices": [choice], "usage": usage(n)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        m = state.metrics
        if endpoint == "chat" and cfg.role_chunk:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            await resp.write(frame([role], 0 if continuous else None))
        sent, first_t, last_t, lateness, prev_t, chunks = 0, None, None, 0.0, None, 0
        try:
            for size in sizes:
                due = base + (sent + size - 1) * cfg.tpot_s
                await _sleep_until(due, clock)
                t = clock()
                lateness = max(lateness, t - due)
                text = "".join(_WORDS[(sent + j) % len(_WORDS)] for j in range(size))
                sent += size
                finish = "length" if sent >= n else None
                choice = ({"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                          if endpoint == "chat" else
                          {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
                await resp.write(frame([choice], sent if continuous else None))
                chunks += 1
                if first_t is None:
                    first_t = t
                elif m is not None:
                    for _ in range(size):
                        m.itl.labels(m.model).observe((t - prev_t) / size)
                prev_t = last_t = t
                if abort_at is not None and sent >= abort_at and sent < n:
                    rec.update(status="aborted", n_tokens=sent, n_chunks=chunks)
                    request.transport.close()
                    return resp
            if want_usage:
                await resp.write(frame([], n))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError) as e:
            rec.update(status="client_gone", n_tokens=sent, n_chunks=chunks, error=type(e).__name__)
            raise
        finally:
            if first_t is not None:
                rec.update(ttft_s=first_t - t_recv, e2e_s=last_t - t_recv, lateness_max_s=lateness)
                rec.setdefault("n_tokens", sent)
                rec.setdefault("n_chunks", chunks)
                rec["tpot_s"] = (last_t - first_t) / (sent - 1) if sent > 1 else None
        if m is not None:
            lab = m.model
            m.ttft.labels(lab).observe(first_t - t_recv)
            m.e2e.labels(lab).observe(last_t - t_recv)
            m.queue.labels(lab).observe(rec["queue_s"])
            m.prefill.labels(lab).observe(first_t - t_start)
            m.decode.labels(lab).observe(last_t - first_t)
            if n > 1:
                m.tpot.labels(lab).observe((last_t - first_t) / (n - 1))
            m.prompt_tokens.labels(lab).inc(prompt_tokens)
            m.gen_tokens.labels(lab).inc(n)
        return resp

    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/calibration/stats", stats)
    app.router.add_post("/calibration/reset", reset)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    return app


async def _serve_async(cfg: CalibrationConfig, host: str, port: int, shared: _Shared | None) -> None:
    from aiohttp import web

    runner = web.AppRunner(build_app(cfg, shared), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True, reuse_port=shared is not None)
    await site.start()
    actual = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    if shared is not None:
        (shared.folder / f"ready-{shared.index}").touch()
    else:
        print(f"{_READY}{actual}", flush=True)
    if cfg.kill_after_s is not None:  # a crash on purpose: no cleanup, connections dropped
        asyncio.get_running_loop().call_later(cfg.kill_after_s, os._exit, 1)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve(cfg: CalibrationConfig, host: str = "127.0.0.1", port: int = 0, use_uvloop: bool = True,
          shared: _Shared | None = None) -> None:
    """Run the calibration server in this process until interrupted (port 0: a free one, printed).

    With ``shared`` (one of several processes) it binds with ``SO_REUSEPORT`` and keeps its truth in the shared
    folder; :func:`supervise` starts such processes.

    Introduced in lab 10 (Load Testing Honestly).
    """
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    logging.getLogger("aiohttp.web").setLevel(logging.CRITICAL)
    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.run(_serve_async(cfg, host, port, shared))
            return
    asyncio.run(_serve_async(cfg, host, port, shared))


def supervise(cfg: CalibrationConfig, host: str = "127.0.0.1", port: int = 0, use_uvloop: bool = True,
              state_dir: str | None = None, startup_timeout_s: float = 60.0) -> int:
    """Run ``cfg.processes`` serving processes on one port (``SO_REUSEPORT``) and watch them: when one exits, stop
    the others and exit. They are forked from this process (already past its imports, and holding no thread or
    event loop), share ``state_dir`` (a temporary folder if none) for their truth and their metrics, and die with
    it.

    Introduced in lab 10 (Load Testing Honestly).
    """
    own_dir = state_dir is None
    folder = Path(state_dir or tempfile.mkdtemp(prefix="calibration-"))
    (folder / "prometheus").mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder / "prometheus")
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # holds the port (bound, never listening)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, port))
    port = holder.getsockname()[1]
    children: list[int] = []
    for k in range(cfg.processes):
        pid = os.fork()
        if pid == 0:  # a serving process
            code = 1
            try:
                holder.close()
                _child_setup()
                serve(cfg, host, port, use_uvloop=use_uvloop, shared=_Shared(str(folder), k))
                code = 0
            finally:
                os._exit(code)
        children.append(pid)

    def end(*_: Any) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        children.clear()
        holder.close()
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)

    def exited() -> int | None:
        for pid in children:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.remove(pid)
                return os.waitstatus_to_exitcode(status)
        return None

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        deadline = time.monotonic() + startup_timeout_s
        while len(list(folder.glob("ready-*"))) < cfg.processes:
            if exited() is not None or time.monotonic() > deadline:
                print(f"calibration: only {len(list(folder.glob('ready-*')))} of {cfg.processes} processes started",
                      file=sys.stderr, flush=True)
                return 1
            time.sleep(0.02)
        print(f"{_READY}{port} processes={cfg.processes}", flush=True)
        while (code := exited()) is None:
            time.sleep(0.1)
        return code
    except KeyboardInterrupt:
        return 0
    finally:
        end()


def _child_setup() -> None:
    """In a forked serving process: die with the supervisor, default signals, multiprocess metrics."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # imported before PROMETHEUS_MULTIPROC_DIR was set


# ------------------------------------------------------------------------- context manager
class CalibrationServer(Listener):
    """The calibration server in a subprocess on a free 127.0.0.1 port, stopped on exit.

    ``CalibrationServer(ttft_s=0.05, tpot_s=0.01)`` takes :class:`CalibrationConfig` fields (or
    ``config=``); ``processes=N`` serves from N processes on the one port. ``base_url`` ends in ``/v1``;
    ``stats()`` returns the server's own record of every request (the truth, merged over its processes);
    ``reset()`` clears it; ``kill()`` kills it at once, as a crash would. The process is a
    :class:`helpers.procs.Proc`: registered, logged, and stopped with its whole tree on exit, on a failing cell
    and at interpreter exit.

    Introduced in lab 10 (Load Testing Honestly).
    """

    host = "127.0.0.1"  # it binds here only

    def __init__(self, config: CalibrationConfig | None = None, startup_timeout_s: float = 30.0,
                 use_uvloop: bool = True, **overrides: Any):
        cfg = config or CalibrationConfig()
        if overrides:
            names = {f.name for f in fields(CalibrationConfig)}
            unknown = set(overrides) - names
            if unknown:
                raise TypeError(f"unknown calibration settings {sorted(unknown)}; known: {sorted(names)}")
            cfg = CalibrationConfig(**{**asdict(cfg), **overrides})
        self.config = cfg
        self.startup_timeout_s = startup_timeout_s
        self.use_uvloop = use_uvloop
        self.port: int | None = None
        self.proc: procs.Proc | None = None
        self._state_dir: str | None = None

    @property
    def model(self) -> str:
        return self.config.model

    def start(self) -> "CalibrationServer":
        self.port = procs.free_port()
        cmd = [sys.executable, "-c", _SELF, "--port", str(self.port), *self.config.cli_args()]
        if self.config.processes > 1:
            self._state_dir = tempfile.mkdtemp(prefix="calibration-")
            cmd += ["--state-dir", self._state_dir]
        if not self.use_uvloop:
            cmd.append("--no-uvloop")
        self.proc = procs.Proc(cmd, kind="calibration", name=self.config.model, host="127.0.0.1",
                               port=self.port).start()

        def ready() -> bool:
            import httpx

            if self.proc is None or _READY not in self.proc.log_text():  # every process listens
                return False
            try:
                return http().get(f"{self.url}/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        self.proc.wait_ready(ready, self.startup_timeout_s, what="the calibration server", interval=0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self._state_dir is not None:
            shutil.rmtree(self._state_dir, ignore_errors=True)
            self._state_dir = None

    def kill(self) -> None:
        """Kill the server at once with SIGKILL, every process of it, as a crash would (connections are dropped,
        nothing is cleaned up). :meth:`stop` (or leaving the ``with`` block) still tidies up afterwards.

        Introduced in lab 10 (Load Testing Honestly).
        """
        if self.proc is not None and self.proc.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session and process group (procs.Proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.running

    def stats(self) -> dict[str, Any]:
        """The server's truth: its configuration and one record per request it handled."""
        return http().get(f"{self.url}/calibration/stats", timeout=30).json()

    def reset(self) -> None:
        http().post(f"{self.url}/calibration/reset", timeout=30)

    def __enter__(self) -> "CalibrationServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------ CLI
def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.bench.calibration",
                                description="An OpenAI-compatible server with known latencies, to calibrate "
                                            "a load generator.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed on stdout)")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--tpot-ms", type=float, default=10.0)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--first-chunk-tokens", type=int, default=1)
    p.add_argument("--no-role-chunk", action="store_true")
    p.add_argument("--no-usage", action="store_true", help="ignore stream_options.include_usage")
    p.add_argument("--no-continuous-usage", action="store_true", help="ignore continuous_usage_stats")
    p.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered with HTTP 500")
    p.add_argument("--abort-rate", type=float, default=0.0, help="share of streams cut mid-way")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests beyond this wait in a queue")
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-metrics", action="store_true", help="answer /metrics with 404")
    p.add_argument("--model", default="calibration")
    p.add_argument("--tokenizer", default=None, help="folder with tokenizer.json: count prompt tokens exactly")
    p.add_argument("--processes", type=int, default=1, help="serving processes on the one port (SO_REUSEPORT)")
    p.add_argument("--kill-after-s", type=float, default=None,
                   help="exit abruptly this many seconds after starting (a crash, to test a client)")
    p.add_argument("--state-dir", default=None, help=argparse.SUPPRESS)  # shared by the processes
    p.add_argument("--process-index", type=int, default=None, help=argparse.SUPPRESS)  # one of them
    p.add_argument("--no-uvloop", action="store_true")
    a = p.parse_args(argv)
    if a.processes < 1:
        p.error("--processes must be >= 1")
    cfg = CalibrationConfig(
        ttft_s=a.ttft_ms / 1000, tpot_s=a.tpot_ms / 1000, prefill_s_per_token=a.prefill_ms_per_token / 1000,
        tokens_per_chunk=a.tokens_per_chunk, first_chunk_tokens=a.first_chunk_tokens, role_chunk=not a.no_role_chunk,
        usage=not a.no_usage, continuous_usage=not a.no_continuous_usage, error_rate=a.error_rate,
        abort_rate=a.abort_rate, max_concurrency=a.max_concurrency, default_max_tokens=a.default_max_tokens,
        seed=a.seed, metrics=not a.no_metrics, model=a.model, tokenizer=a.tokenizer, processes=a.processes,
        kill_after_s=a.kill_after_s,
    )
    if a.processes > 1 and a.process_index is None:
        return supervise(cfg, a.host, a.port, use_uvloop=not a.no_uvloop, state_dir=a.state_dir)
    shared = _Shared(a.state_dir, a.process_index) if a.process_index is not None else None
    with contextlib.suppress(KeyboardInterrupt):
        serve(cfg, a.host, a.port, use_uvloop=not a.no_uvloop, shared=shared)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
