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
streams cut mid-way (``abort_rate``).

::

    with CalibrationServer(ttft_s=0.05, tpot_s=0.01, tokens_per_chunk=3) as cal:
        result = bench.run(workload, base_url=cal.base_url, model=cal.model)
        truth = cal.stats()

    python -m helpers.bench.calibration --port 8100 --ttft-ms 50 --tpot-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .. import procs

__all__ = ["CalibrationConfig", "CalibrationServer", "serve", "build_app"]

_READY = "CALIBRATION READY port="
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
class _State:
    def __init__(self, cfg: CalibrationConfig):
        self.cfg = cfg
        self.counter = _Counter(cfg.tokenizer)
        self.records: list[dict[str, Any]] = []
        self.arrivals = 0
        self.running = 0
        self.waiting = 0
        self.sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        self.metrics = _Metrics(cfg.model) if cfg.metrics else None


class _Metrics:
    def __init__(self, model: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.model = model
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
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", lab, registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", lab, registry=self.registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens", lab, registry=self.registry)
        self.gen_tokens = Counter("vllm:generation_tokens", "generation tokens", lab, registry=self.registry)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", lab, registry=self.registry)
        self.pc_queries = Counter("vllm:prefix_cache_queries", "prefix cache queries", lab, registry=self.registry)
        self.pc_hits = Counter("vllm:prefix_cache_hits", "prefix cache hits", lab, registry=self.registry)
        for m in (self.preemptions, self.pc_queries, self.pc_hits):
            m.labels(model).inc(0)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _chunk_sizes(n: int, first: int, k: int) -> list[int]:
    sizes = [min(max(first, 1), n)]
    rest = n - sizes[0]
    while rest > 0:
        sizes.append(min(max(k, 1), rest))
        rest -= sizes[-1]
    return sizes


def build_app(cfg: CalibrationConfig):
    """The aiohttp application of the calibration server (for embedding; usually run via :func:`serve`).

    Introduced in lab 10 (Load Testing Honestly).
    """
    from aiohttp import web

    state = _State(cfg)
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
        m = state.metrics
        m.running.labels(m.model).set(state.running)
        m.waiting.labels(m.model).set(state.waiting)
        m.kv.labels(m.model).set(state.running / cfg.max_concurrency if cfg.max_concurrency else 0.0)
        return web.Response(body=m.text(), content_type="text/plain")

    async def stats(_request):
        return web.json_response({"config": asdict(cfg), "requests": state.records, "arrivals": state.arrivals})

    async def reset(_request):
        state.records.clear()
        return web.json_response({"ok": True})

    async def chat(request):
        return await _generate(request, "chat")

    async def completions(request):
        return await _generate(request, "completions")

    async def _generate(request, endpoint: str):
        body = await request.json()
        t_recv = time.perf_counter()
        state.arrivals += 1
        rid = request.headers.get("X-Bench-Request-Id") or f"arrival-{state.arrivals}"
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
            state.records.append(rec)
            return web.json_response({"error": {"message": "injected error (calibration server)",
                                                "type": "InternalServerError", "code": 500}}, status=500)
        queue_s = 0.0
        if state.sem is not None:
            t_q = time.perf_counter()
            state.waiting += 1
            await state.sem.acquire()
            state.waiting -= 1
            queue_s = time.perf_counter() - t_q
        # Only the queue delays the schedule: time spent counting prompt tokens above is not added to it.
        t_start = t_recv + queue_s
        rec["queue_s"] = queue_s
        state.running += 1
        try:
            return await _stream(request, endpoint, body, rec, n, prompt_tokens, stream, want_usage, continuous,
                                 abort_at, t_recv, t_start)
        finally:
            state.running -= 1
            if state.sem is not None:
                state.sem.release()
            state.records.append(rec)

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
            await asyncio.sleep(max(base + (n - 1) * cfg.tpot_s - clock(), 0))
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
                delay = due - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
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


async def _serve_async(cfg: CalibrationConfig, host: str, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(build_app(cfg), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    actual = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"{_READY}{actual}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve(cfg: CalibrationConfig, host: str = "127.0.0.1", port: int = 0, use_uvloop: bool = True) -> None:
    """Run the calibration server in this process until interrupted (port 0: a free one, printed).

    Introduced in lab 10 (Load Testing Honestly).
    """
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    logging.getLogger("aiohttp.web").setLevel(logging.CRITICAL)
    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.run(_serve_async(cfg, host, port))
            return
    asyncio.run(_serve_async(cfg, host, port))


# ------------------------------------------------------------------------- context manager
class CalibrationServer:
    """The calibration server in a subprocess on a free 127.0.0.1 port, stopped on exit.

    ``CalibrationServer(ttft_s=0.05, tpot_s=0.01)`` takes :class:`CalibrationConfig` fields (or
    ``config=``). ``base_url`` ends in ``/v1``; ``stats()`` returns the server's own record of every
    request (the truth); ``reset()`` clears it. The process is a :class:`helpers.procs.Proc`: registered,
    logged, and stopped with its whole tree on exit, on a failing cell and at interpreter exit.

    Introduced in lab 10 (Load Testing Honestly).
    """

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

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> "CalibrationServer":
        self.port = procs.free_port()
        # -c rather than -m: helpers.bench imports this module, and running it again as __main__ would load it twice.
        cmd = [sys.executable, "-c", "import sys; from helpers.bench.calibration import _main; sys.exit(_main(sys.argv[1:]))",
               "--port", str(self.port), *self.config.cli_args()]
        if not self.use_uvloop:
            cmd.append("--no-uvloop")
        self.proc = procs.Proc(cmd, kind="calibration", name=self.config.model, host="127.0.0.1",
                               port=self.port).start()

        def ready() -> bool:
            import httpx

            try:
                return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        self.proc.wait_ready(ready, self.startup_timeout_s, what="the calibration server", interval=0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.running

    def stats(self) -> dict[str, Any]:
        """The server's truth: its configuration and one record per request it handled."""
        import httpx

        return httpx.get(f"{self.url}/calibration/stats", timeout=30).json()

    def reset(self) -> None:
        import httpx

        httpx.post(f"{self.url}/calibration/reset", timeout=30)

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
    p.add_argument("--no-uvloop", action="store_true")
    a = p.parse_args(argv)
    cfg = CalibrationConfig(
        ttft_s=a.ttft_ms / 1000, tpot_s=a.tpot_ms / 1000, prefill_s_per_token=a.prefill_ms_per_token / 1000,
        tokens_per_chunk=a.tokens_per_chunk, first_chunk_tokens=a.first_chunk_tokens, role_chunk=not a.no_role_chunk,
        usage=not a.no_usage, continuous_usage=not a.no_continuous_usage, error_rate=a.error_rate,
        abort_rate=a.abort_rate, max_concurrency=a.max_concurrency, default_max_tokens=a.default_max_tokens,
        seed=a.seed, metrics=not a.no_metrics, model=a.model, tokenizer=a.tokenizer,
    )
    with contextlib.suppress(KeyboardInterrupt):
        serve(cfg, a.host, a.port, use_uvloop=not a.no_uvloop)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
