"""The stand-in's HTTP surface: vLLM 0.32's OpenAI-compatible routes and its own, with their shapes and errors.

Routes as vLLM's API server mounts them (its startup log lists them): ``/health``, ``/version``, ``/load``,
``/ping``, ``/metrics``, ``/tokenize``, ``/detokenize``, ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, ``/invocations``; ``/v1/completions/render`` only with ``--enable-scale-out`` (403 and a log
line otherwise, as vllm-router's cache-aware policy found); ``/collective_rpc`` and ``/reset_prefix_cache`` only with
``VLLM_SERVER_DEV_MODE=1``. ``VLLM_API_KEY`` guards the ``/v1`` routes only.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from . import engine as _engine


def _error(status: int, message: str, typ: str = "BadRequestError", param: str | None = None):
    return JSONResponse({"error": {"message": message, "type": typ, "param": param, "code": status}},
                        status_code=status)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def build_app(state: Any):
    """The FastAPI app over ``state`` (a :class:`~.server.State`: engine, tokenizer, served name, flags)."""
    app = FastAPI()
    key = os.environ.get("VLLM_API_KEY")
    dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if key and request.url.path.startswith("/v1") and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": state.version}

    @app.get("/load")
    async def load():
        return {"server_load": len(state.engine.running) + len(state.engine.waiting)}

    @app.get("/ping")
    @app.post("/ping")
    async def ping():
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.stats.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.served, "object": "model", "created": int(state.started), "owned_by": "vllm",
            "root": state.model_arg, "parent": None, "max_model_len": state.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": int(state.started), "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}]}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        if "messages" in body:
            ids = state.chat_ids(body["messages"], body.get("add_generation_prompt", True))
        else:
            ids = state.tok.encode(body.get("prompt", ""), body.get("add_special_tokens", True))
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        return {"prompt": state.tok.decode(list(body.get("tokens", [])))}

    @app.post("/v1/completions/render")
    async def render(request: Request):
        if not state.scale_out:
            state.log("WARNING", "factories.py:97", "Scale-out endpoints are disabled. Restart vllm serve with "
                      "--enable-scale-out to enable them.")
            return _error(403, "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
                          "enable them.", "ForbiddenError")
        body = await request.json()
        prompts = body.get("prompt")
        prompts = prompts if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int) else [prompts]
        out = []
        for p in prompts:
            ids = p if isinstance(p, list) else state.tok.encode(p or "")
            out.append({"prompt_token_ids": ids, "prompt": p if isinstance(p, str) else None})
        return out

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        if not dev:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        body = await request.json()
        if body.get("method") == "reload_weights":
            path = (body.get("kwargs") or {}).get("weights_path")
            state.reload_weights(path)
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        if not dev:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        state.engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            return await _completion(state, body, chat=False, request=request)
        except BadRequest as e:
            return _error(400, str(e), param=e.param)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
            return await _completion(state, body, chat=True, request=request)
        except BadRequest as e:
            return _error(400, str(e), param=e.param)

    @app.post("/invocations")
    async def invocations(request: Request):
        body = await request.json()
        try:
            return await _completion(state, body, chat="messages" in body, request=request)
        except BadRequest as e:
            return _error(400, str(e), param=e.param)

    return app


def _sampling(state: Any, body: dict[str, Any], prompt_len: int, chat: bool) -> _engine.Sampling:
    mx = body.get("max_completion_tokens") if chat else None
    mx = mx if mx is not None else body.get("max_tokens")
    room = state.max_model_len - prompt_len
    if prompt_len > state.max_model_len:
        raise BadRequest(f"This model's maximum context length is {state.max_model_len} tokens. However, your prompt "
                         f"contains {prompt_len} input tokens, which exceeds this limit even without any output "
                         "tokens. Please reduce the length of the input prompt.", "input_tokens")
    if mx is not None and int(mx) > state.max_model_len:
        raise BadRequest(f"max_tokens={mx} cannot be greater than max_total_tokens={state.max_model_len}. Please "
                         "request fewer output tokens.", "max_tokens")
    default = 16 if not chat else room
    max_tokens = min(int(mx) if mx is not None else default, room)
    lp = body.get("logprobs")
    top = body.get("top_logprobs") if chat else None
    n_lp = (int(top or 0) if lp else None) if chat else (int(lp) if lp is not None else None)
    plp = body.get("prompt_logprobs")
    for v, name in ((n_lp, "logprobs"), (plp, "prompt_logprobs")):
        if v is not None and int(v) > state.max_logprobs:
            raise BadRequest(f"Requested sample logprobs of {v}, which is greater than max allowed: "
                             f"{state.max_logprobs}", name)
    stop = body.get("stop") or []
    return _engine.Sampling(max_tokens=max_tokens, min_tokens=int(body.get("min_tokens") or 0),
                            ignore_eos=bool(body.get("ignore_eos")), temperature=float(body.get("temperature", 1.0)
                                                                                        if body.get("temperature")
                                                                                        is not None else 1.0),
                            seed=body.get("seed"), stop=[stop] if isinstance(stop, str) else list(stop),
                            include_stop=bool(body.get("include_stop_str_in_output")), logprobs=n_lp,
                            prompt_logprobs=int(plp) if plp is not None else None)


def _prompt_ids(state: Any, body: dict[str, Any], chat: bool) -> list[list[int]]:
    if chat:
        return [state.chat_ids(body.get("messages") or [], body.get("add_generation_prompt", True))]
    p = body.get("prompt")
    if p is None:
        raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(p, str):
        return [state.tok.encode(p)]
    if isinstance(p, list) and p and isinstance(p[0], int):
        return [list(p)]
    if isinstance(p, list):
        return [list(x) if isinstance(x, list) else state.tok.encode(x) for x in p]
    raise BadRequest("prompt must be a string, a list of strings or a list of token ids", "prompt")


async def _completion(state: Any, body: dict[str, Any], *, chat: bool, request: Any):
    if body.get("model") not in (None, state.served):
        return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError",
                             "param": "model", "code": 404}}, status_code=404)
    prompts = _prompt_ids(state, body, chat)
    n = int(body.get("n") or 1)
    arrival = time.time()
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    salt = body.get("cache_salt")
    reqs: list[tuple[int, _engine.Request]] = []
    for pi, ids in enumerate(prompts):
        sp = _sampling(state, body, len(ids), chat)
        for j in range(n):
            s = _engine.Sampling(**{**sp.__dict__, "seed": (sp.seed + j) if sp.seed is not None else None})
            r = _engine.Request(f"{rid}-{pi}-{j}", ids, s, arrival=arrival, cache_salt=salt,
                                kv_transfer=body.get("kv_transfer_params"))
            r.n = n
            r.as_token_ids = bool(body.get("return_tokens_as_token_ids"))
            reqs.append((len(reqs), r))
    for _, r in reqs:
        state.engine.add(r)
    stream = bool(body.get("stream"))
    opts = body.get("stream_options") or {}
    if stream:
        return StreamingResponse(_stream(state, rid, reqs, chat=chat, include_usage=bool(opts.get("include_usage")),
                                         continuous=bool(opts.get("continuous_usage_stats")), request=request,
                                         echo=bool(body.get("echo"))),
                                 media_type="text/event-stream")
    choices = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    try:
        for idx, r in reqs:
            text, lp = await _collect(state, r)
            choices.append(_choice(state, r, idx, text, lp, chat=chat, echo=bool(body.get("echo"))))
            usage["completion_tokens"] += r.generated
        usage["prompt_tokens"] = sum(len(p) for p in prompts)
    finally:
        for _, r in reqs:
            if r.status != _engine.FINISHED:
                state.engine.abort(r)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = None
    usage["completion_tokens_details"] = None  # vLLM's UsageInfo (serve/engine/protocol.py): None without reasoning
    return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                         "created": int(arrival), "model": state.served, "choices": choices, "usage": usage,
                         "system_fingerprint": None, "kv_transfer_params": _kv_params(state, reqs)})


def _kv_params(state: Any, reqs: list) -> Any:
    return None


async def _collect(state: Any, r: _engine.Request) -> tuple[str, list[dict[str, Any]]]:
    out_ids: list[int] = []
    logprobs: list[dict[str, Any]] = []
    text = ""
    while True:
        kind, new, done = await r.events.get()
        for t in new:
            if r.sampling.logprobs is not None:
                logprobs.append(state.token_logprobs(r, len(r.prompt) + len(out_ids), t, r.sampling.logprobs))
            out_ids.append(t)
        text = state.detok(out_ids, r)
        hit = _stop_hit(text, r.sampling.stop)
        if hit is not None:
            s, cut = hit
            text = text[:cut + (len(s) if r.sampling.include_stop else 0)]
            state.engine.stop_string(r, s)
            return text, logprobs
        if done:
            return text, logprobs


def _stop_hit(text: str, stops: list[str]) -> tuple[str, int] | None:
    best = None
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i < best[1]):
            best = (s, i)
    return best


def _choice(state: Any, r: _engine.Request, idx: int, text: str, lps: list[dict[str, Any]], *, chat: bool,
            echo: bool) -> dict[str, Any]:
    finish = r.finish_reason or "length"
    if chat:
        msg = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "tool_calls": [], "reasoning": None}
        lp = {"content": [_chat_lp(x) for x in lps]} if r.sampling.logprobs is not None else None
        return {"index": idx, "message": msg, "logprobs": lp, "finish_reason": finish, "stop_reason": r.stop_reason,
                "token_ids": None}
    lp = None
    if r.sampling.logprobs is not None:
        toks = [x["token"] for x in lps]
        vals = [x["logprob"] for x in lps]
        tops = [x["top"] for x in lps]
        offsets, pos = [], 0
        for t in toks:
            offsets.append(pos)
            pos += len(t)
        if echo:
            ptoks = [state.token_str(t, r) for t in r.prompt]
            pv = [None] + [state.position_logprob(r, i, r.prompt[i]) for i in range(1, len(r.prompt))]
            ptops = [None] + [state.top_logprobs(r, i, r.sampling.logprobs, r.prompt[i]) for i in
                              range(1, len(r.prompt))]
            toks, vals, tops = ptoks + toks, pv + vals, ptops + tops
            offsets = list(range(len(toks)))
        lp = {"text_offset": offsets, "token_logprobs": vals, "tokens": toks, "top_logprobs": tops}
    out = {"index": idx, "text": (state.tok.decode(r.prompt) if echo else "") + text, "logprobs": lp,
           "finish_reason": finish, "stop_reason": r.stop_reason, "token_ids": None, "prompt_logprobs": None,
           "prompt_token_ids": None}
    if r.sampling.prompt_logprobs is not None:
        out["prompt_logprobs"] = state.prompt_logprobs(r, r.sampling.prompt_logprobs)
    return out


def _chat_lp(x: dict[str, Any]) -> dict[str, Any]:
    return {"token": x["token"], "logprob": x["logprob"], "bytes": list(x["token"].encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in x["top"].items()]}


async def _stream(state: Any, rid: str, reqs: list, *, chat: bool, include_usage: bool, continuous: bool,
                  request: Any, echo: bool) -> AsyncIterator[bytes]:
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    prompt_tokens = sum(len(r.prompt) for _, r in reqs)
    texts = {idx: "" for idx, _ in reqs}
    ids: dict[int, list[int]] = {idx: [] for idx, _ in reqs}
    done_count = 0

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        d = {"id": rid, "object": obj, "created": created, "model": state.served, "choices": choices}
        if usage is not None:
            d["usage"] = usage
        return f"data: {json.dumps(d)}\n\n".encode()

    def usage_now() -> dict[str, Any]:
        c = sum(r.generated for _, r in reqs)
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + c, "completion_tokens": c}

    try:
        if chat:
            for idx, _ in reqs:
                yield chunk([{"index": idx, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}], {**usage_now(), "completion_tokens": 0,
                                                        "total_tokens": prompt_tokens} if continuous else None)
        queues = {idx: r for idx, r in reqs}
        pending = {asyncio.ensure_future(r.events.get()): idx for idx, r in queues.items()}
        while pending:
            finished, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
            for fut in finished:
                idx = pending.pop(fut)
                r = queues[idx]
                kind, new, done = fut.result()
                lps = []
                for t in new:
                    if r.sampling.logprobs is not None:
                        lps.append(state.token_logprobs(r, len(r.prompt) + len(ids[idx]), t, r.sampling.logprobs))
                    ids[idx].append(t)
                full = state.detok(ids[idx], r)
                hit = _stop_hit(full, r.sampling.stop)
                if hit is not None:
                    s, cut = hit
                    full = full[:cut + (len(s) if r.sampling.include_stop else 0)]
                    state.engine.stop_string(r, s)
                    done = True
                delta, texts[idx] = full[len(texts[idx]):], full
                finish = (r.finish_reason or "length") if done else None
                if chat:
                    ch = {"index": idx, "delta": {"content": delta}, "logprobs": {"content": [_chat_lp(x) for x in lps]}
                          if r.sampling.logprobs is not None else None, "finish_reason": finish}
                    if done:
                        ch["stop_reason"] = r.stop_reason
                else:
                    lp = None
                    if r.sampling.logprobs is not None:
                        lp = {"text_offset": [0] * len(lps), "token_logprobs": [x["logprob"] for x in lps],
                              "tokens": [x["token"] for x in lps], "top_logprobs": [x["top"] for x in lps]}
                    ch = {"index": idx, "text": delta, "logprobs": lp, "finish_reason": finish,
                          "stop_reason": r.stop_reason if done else None}
                yield chunk([ch], usage_now() if continuous else None)
                if done:
                    done_count += 1
                else:
                    pending[asyncio.ensure_future(r.events.get())] = idx
        if include_usage:
            yield chunk([], usage_now())
        yield b"data: [DONE]\n\n"
    finally:
        for _, r in reqs:
            if r.status != _engine.FINISHED:
                state.engine.abort(r)
