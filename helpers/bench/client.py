"""The streaming client: one request to an OpenAI-compatible server, timed chunk by chunk.

Requests ask for ``stream_options = {"include_usage": true, "continuous_usage_stats": true}``, so vLLM
puts its cumulative ``usage.completion_tokens`` on every chunk: the tokens a chunk carries are that
count minus the previous chunk's. This is exact when one chunk carries several tokens (speculative
decoding, detokenizer batching) and it skips the role-only first chunk of a chat stream
(``{"delta": {"role": "assistant", "content": ""}}``, ``completion_tokens: 0``), which a naive client
mistakes for the first token. A server that sends no per-chunk usage gets one token per non-empty
chunk, and the record says so (``tokens_exact=False``).

A failure at the connection level (refused, reset, a stream cut) is flagged ``connection_error``; then
:func:`server_alive` tells a dead server from a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..endpoint import Endpoint, SendsTo, auth_headers
from .records import Request, RequestResult, Timings

__all__ = ["ClientConfig", "StreamParser", "build_payload", "send", "make_session", "list_models", "server_alive",
           "connection_reason"]


@dataclass
class ClientConfig(SendsTo):
    """How requests are sent: where (an :class:`~helpers.endpoint.Endpoint`: the OpenAI base URL ending in ``/v1``,
    its key, the model), sampling, timeouts and vLLM's extra parameters.

    ``vllm_extras`` sends ``ignore_eos`` and ``min_tokens`` to fix output lengths (vLLM accepts them; other servers
    may refuse them). ``timeout_s`` bounds a whole request.

    Introduced in lab 02 (Prefill and Decode).
    """

    endpoint: Endpoint
    temperature: float = 0.0
    timeout_s: float = 600.0
    vllm_extras: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    request_id_header: str = "X-Bench-Request-Id"

    def url(self, endpoint: str) -> str:
        return f"{self.base_url}/chat/completions" if endpoint == "chat" else f"{self.base_url}/completions"

    def headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", **self.endpoint.headers}


def build_payload(req: Request, cfg: ClientConfig) -> dict[str, Any]:
    """The JSON body for ``req``: streamed, with per-chunk usage, greedy by default.

    Introduced in lab 02 (Prefill and Decode).
    """
    body: dict[str, Any] = {
        "model": cfg.model,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": req.max_output_tokens,
        "temperature": cfg.temperature,
    }
    if req.messages is not None:
        body["messages"] = [dict(m) for m in req.messages]
    else:
        body["prompt"] = req.prompt
    if cfg.vllm_extras and req.min_output_tokens:
        body["min_tokens"] = req.min_output_tokens
        if req.min_output_tokens >= req.max_output_tokens:
            body["ignore_eos"] = True
    body.update(cfg.extra_body)
    return body


def _has_content(choice: dict[str, Any]) -> bool:
    if "text" in choice:
        return bool(choice.get("text"))
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                or delta.get("tool_calls"))


class StreamParser:
    """Server-sent events in, token-carrying chunks out, with their arrival times.

    ``feed(data, t)`` takes raw bytes as they arrive at ``perf_counter`` time ``t`` (events completed by
    one read share its time). Token counting: the difference of cumulative ``usage.completion_tokens``
    when chunks carry usage, else one token per chunk with non-empty text (``exact`` becomes False).
    A chunk with ``choices: []`` is the final usage chunk: it sets the totals, and adds tokens at its
    time only if per-chunk usage was on and its count moved.

    Introduced in lab 02 (Prefill and Decode).
    """

    def __init__(self) -> None:
        self.chunk_times: list[float] = []
        self.chunk_tokens: list[int] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        self.exact = True
        self.events = 0
        self._continuous = False
        self._prev_completion = 0
        self._buf = b""
        self._data: list[str] = []

    # -- SSE framing ---------------------------------------------------------------------------
    def feed(self, data: bytes, t: float) -> None:
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"), t)

    def close(self, t: float) -> None:
        """End of the byte stream: flush a last event that had no trailing blank line."""
        if self._buf:
            self._line(self._buf.decode("utf-8", errors="replace").rstrip("\r"), t)
            self._buf = b""
        self._line("", t)

    def _line(self, line: str, t: float) -> None:
        if not line:
            if self._data:
                payload = "\n".join(self._data)
                self._data = []
                self._event(payload, t)
            return
        if line.startswith(":"):
            return  # comment / keep-alive
        if line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        # "event:", "id:", "retry:" lines carry nothing we need

    # -- one event -----------------------------------------------------------------------------
    def _event(self, payload: str, t: float) -> None:
        self.events += 1
        if payload.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = self.error or f"unparseable stream event: {payload[:120]!r}"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            self.error = self.error or (err.get("message") if isinstance(err, dict) else str(err)) or "stream error"
            return
        usage = obj.get("usage") or None
        choices = obj.get("choices") or []
        if usage:
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
        if not choices:
            if usage and usage.get("completion_tokens") is not None:
                total = int(usage["completion_tokens"])
                if self._continuous and total > self._prev_completion:
                    self._add(t, total - self._prev_completion)
                    self._prev_completion = total
                self.completion_tokens = total
            return
        for ch in choices:
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
        if usage and usage.get("completion_tokens") is not None:
            self._continuous = True
            total = int(usage["completion_tokens"])
            k = total - self._prev_completion
            self._prev_completion = max(total, self._prev_completion)
            self.completion_tokens = total
            if k > 0:
                self._add(t, k)
        elif any(_has_content(ch) for ch in choices):
            self.exact = False
            self._add(t, 1)

    def _add(self, t: float, k: int) -> None:
        self.chunk_times.append(t)
        self.chunk_tokens.append(k)

    @property
    def tokens(self) -> int:
        return sum(self.chunk_tokens)


def _error_message(status: int, body: str) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or json.dumps(err)[:300]
        else:
            msg = str(err)
    except ValueError:
        msg = body.strip()[:300] or "(empty body)"
    return str(msg)


#: Failures that a server's death causes (and a dropped connection, which :func:`server_alive` tells apart).
_CONNECTION_ERRORS = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, OSError)


def connection_reason(e: BaseException) -> str:
    """A connection-level failure in a few words: ``connection refused``, ``connection reset``, ...

    Introduced in lab 10 (Load Testing Honestly).
    """
    inner = getattr(e, "os_error", None) or e.__cause__ or e
    for cls, words in ((ConnectionRefusedError, "connection refused"), (ConnectionResetError, "connection reset"),
                       (aiohttp.ServerDisconnectedError, "server disconnected"),
                       (aiohttp.ClientPayloadError, "stream cut"), (BrokenPipeError, "broken pipe")):
        if isinstance(inner, cls) or isinstance(e, cls):
            return words
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def send(session: aiohttp.ClientSession, req: Request, cfg: ClientConfig, t_scheduled: float,
               perf_anchor: float = 0.0, wall_anchor: float = 0.0, tag: str = "") -> RequestResult:
    """Send one streaming request and time it; never raises for a failed request (it is recorded).

    ``t_scheduled`` is when the profile wanted it sent; dispatch is now. The result carries every
    chunk arrival, the server's usage counts, and for failures the HTTP status and error text.

    Introduced in lab 02 (Prefill and Decode).
    """
    timings = Timings(t_scheduled=t_scheduled, perf_anchor=perf_anchor, wall_anchor=wall_anchor)
    result = RequestResult(
        id=req.id, timings=timings, endpoint=req.endpoint, expected_input_tokens=req.expected_input_tokens,
        max_output_tokens=req.max_output_tokens, min_output_tokens=req.min_output_tokens,
        scheduled_offset_s=req.send_offset_s, warmup=req.warmup, meta=dict(req.meta),
    )
    body = build_payload(req, cfg)
    headers = cfg.headers()
    headers[cfg.request_id_header] = f"{tag}{req.id}"
    parser = StreamParser()
    data = json.dumps(body)
    timings.t_dispatched = time.perf_counter()
    try:
        async with session.post(cfg.url(req.endpoint), data=data, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as resp:
            result.http_status = resp.status
            if resp.status != 200:
                text = await resp.text(errors="replace")
                timings.t_end = time.perf_counter()
                result.error = _error_message(resp.status, text)
                return result
            if resp.content_type != "text/event-stream":
                text = await resp.text(errors="replace")
                timings.t_end = time.perf_counter()
                result.error = (f"expected a server-sent event stream, got {resp.content_type or 'no content type'}: "
                                f"{text.strip()[:200]}")
                return result
            async for chunk in resp.content.iter_any():
                parser.feed(chunk, time.perf_counter())
            parser.close(time.perf_counter())
            timings.t_done = time.perf_counter()
    except asyncio.TimeoutError:
        result.error = f"timeout: no complete response within {cfg.timeout_s:g} s"
    except _CONNECTION_ERRORS as e:
        result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        result.connection_error = True
    except aiohttp.ClientError as e:
        result.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    now = time.perf_counter()
    timings.chunk_times, timings.chunk_tokens = parser.chunk_times, parser.chunk_tokens
    timings.t_first_token = parser.chunk_times[0] if parser.chunk_times else None
    result.input_tokens = parser.prompt_tokens
    result.output_tokens = parser.completion_tokens if parser.completion_tokens is not None else (
        parser.tokens if parser.chunk_times else None)
    result.tokens_exact = parser.exact
    result.finish_reason = parser.finish_reason
    if result.error is None and parser.error:
        result.error = parser.error
    if result.error is None and not parser.done:
        result.error = "stream ended before [DONE]"
    if result.error is None:
        result.ok = True
        timings.t_end = parser.chunk_times[-1] if parser.chunk_times else timings.t_done
    else:
        timings.t_end = now
    return result


async def server_alive(session: aiohttp.ClientSession, base_url: str, attempts: int = 3, interval_s: float = 0.3,
                       timeout_s: float = 2.0) -> tuple[bool, str]:
    """Does anything still answer at the server's address? ``(True, "")`` as soon as any HTTP answer comes back
    (whatever its status), ``(False, reason)`` when every attempt failed at the connection level. A slow
    answer (timeout) counts as alive: a busy server is not a dead one.

    Introduced in lab 10 (Load Testing Honestly).
    """
    url = Endpoint(base_url).root + "/health"
    reason = ""
    for i in range(max(1, attempts)):
        if i:
            await asyncio.sleep(interval_s)
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                   headers={"Connection": "close"}) as resp:
                await resp.read()
                return True, ""
        except asyncio.TimeoutError:
            return True, ""
        except _CONNECTION_ERRORS as e:
            reason = connection_reason(e)
        except aiohttp.ClientError:
            return True, ""
    return False, reason


def make_session(limit: int = 0) -> aiohttp.ClientSession:
    """An aiohttp session with no connection cap (``limit=0``): aiohttp's default of 100 connections
    would be a hidden semaphore that delays open-loop requests without recording it.

    Introduced in lab 02 (Prefill and Decode).
    """
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 auto_decompress=False)


async def list_models(session: aiohttp.ClientSession, base_url: str, api_key: str | None = None,
                      timeout_s: float = 10.0) -> list[str]:
    """The model ids ``GET {base_url}/models`` lists (the served model names).

    Introduced in lab 02 (Prefill and Decode).
    """
    async with session.get(base_url.rstrip("/") + "/models", headers=auth_headers(api_key),
                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {base_url}/models answered HTTP {resp.status}: {(await resp.text())[:200]}")
        obj = await resp.json()
    return [m["id"] for m in obj.get("data", [])]
