"""Typed records of one benchmark request: what was sent, when things happened, what came back.

Every latency metric is derived here, in one place, from timestamps taken with ``time.perf_counter``
on one clock (``Timings.perf_anchor``/``wall_anchor`` pair that clock with the wall clock)::

    TTFT          = t_first_token - t_dispatched     first chunk that carries a token (never the role chunk)
    E2E           = t_end - t_dispatched             t_end: arrival of the last token-carrying chunk
    TPOT          = (E2E - TTFT) / (n - 1)           n = output tokens; None when n < 2 (vLLM's definition)
    ITL           one value per token after the first: a chunk carrying k tokens after a gap g
                  contributes k values g/k; tokens of the first chunk beyond the first contribute 0.
                  So sum(ITL) = E2E - TTFT and mean(ITL) = TPOT, whatever the chunking.
    ITL per chunk one value per token-carrying chunk after the first: the gap since the previous chunk,
                  whatever it carried (what ``vllm bench serve`` reports as ITL; k times the per-token
                  ITL when every chunk carries k tokens)
    client queue  = t_dispatched - t_scheduled       time the request waited inside the client (kept apart)

Times are ``perf_counter`` seconds; the derived metrics are in milliseconds (``ttft_ms`` ...).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable

__all__ = ["Request", "Timings", "RequestResult", "itl_values", "chunk_gaps"]


@dataclass(frozen=True)
class Request:
    """One request of a workload: a prompt (completions) or chat messages, and its token budget.

    ``expected_input_tokens`` is what the server should count as ``usage.prompt_tokens`` (computed with
    the served model's tokenizer, chat template included); ``max_output_tokens == min_output_tokens``
    fixes the output length (sent with ``ignore_eos`` to vLLM). ``send_offset_s`` is the scheduled send
    time in seconds after the run's start (set by open-loop profiles; ``None`` for closed-loop ones).

    Introduced in lab 02 (Prefill and Decode).
    """

    id: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    expected_input_tokens: int | None = None
    max_output_tokens: int = 128
    min_output_tokens: int | None = None
    send_offset_s: float | None = None
    warmup: bool = False
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"request {self.id!r}: give exactly one of prompt= (completions) or messages= (chat)")
        if self.messages is not None and not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))
        if self.max_output_tokens < 1:
            raise ValueError(f"request {self.id!r}: max_output_tokens must be >= 1, got {self.max_output_tokens}")

    @property
    def endpoint(self) -> str:
        """``"chat"`` for messages, ``"completions"`` for a prompt."""
        return "chat" if self.messages is not None else "completions"

    @property
    def expected_output_tokens(self) -> int | None:
        """The output length when it is fixed (min == max), else ``None``."""
        return self.max_output_tokens if self.min_output_tokens == self.max_output_tokens else None

    def with_offset(self, offset_s: float | None) -> "Request":
        return replace(self, send_offset_s=offset_s)


@dataclass
class Timings:
    """When things happened to one request, in ``time.perf_counter()`` seconds (one clock).

    ``chunk_times[i]`` is the arrival of the i-th stream chunk that carried tokens and ``chunk_tokens[i]``
    how many it carried (the role-only chunk, empty chunks and the final usage chunk are not listed).
    ``t_end`` is the last such chunk's arrival for a completed request, or when a failure was seen;
    ``t_done`` is when the stream closed (``[DONE]``). ``perf_anchor`` and ``wall_anchor`` were read
    together at the run's start, so ``wall = wall_anchor + (t - perf_anchor)``.

    Introduced in lab 02 (Prefill and Decode).
    """

    t_scheduled: float
    t_dispatched: float | None = None
    t_first_token: float | None = None
    t_end: float | None = None
    t_done: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    perf_anchor: float = 0.0
    wall_anchor: float = 0.0

    def wall(self, t: float) -> float:
        """A ``perf_counter`` time of this run as wall-clock seconds (``time.time()`` scale)."""
        return self.wall_anchor + (t - self.perf_anchor)


def itl_values(chunk_times: Iterable[float], chunk_tokens: Iterable[int]) -> list[float]:
    """Inter-token latencies (seconds), one per token after the first, from chunk arrivals.

    A chunk carrying ``k`` tokens after a gap ``g`` contributes ``k`` values of ``g / k``; the tokens
    of the first chunk beyond the first contribute 0. Their sum is ``last arrival - first arrival``.

    Introduced in lab 02 (Prefill and Decode).
    """
    times, tokens = list(chunk_times), list(chunk_tokens)
    if len(times) != len(tokens):
        raise ValueError(f"{len(times)} chunk times but {len(tokens)} token counts")
    if not times:
        return []
    out = [0.0] * max(tokens[0] - 1, 0)
    for i in range(1, len(times)):
        k = tokens[i]
        if k <= 0:
            continue
        gap = times[i] - times[i - 1]
        out.extend([gap / k] * k)
    return out


def chunk_gaps(chunk_times: Iterable[float]) -> list[float]:
    """Gaps (seconds) between consecutive token-carrying chunks: one value per chunk after the first.

    This is ITL as ``vllm bench serve`` counts it (per stream chunk, whatever the chunk carried); compare
    :func:`itl_values`, one value per token.

    Introduced in lab 10 (Load Testing Honestly).
    """
    times = list(chunk_times)
    return [b - a for a, b in zip(times, times[1:])]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


@dataclass
class RequestResult:
    """What happened to one request, and every metric derived from it (in one place).

    ``ok`` is True only for a stream that finished with ``[DONE]`` and no error. ``input_tokens`` and
    ``output_tokens`` are the server's ``usage`` counts (``output_tokens`` falls back to the tokens
    counted in the stream); ``tokens_exact`` is False when the server sent no per-chunk usage and
    each non-empty chunk was counted as one token. Failures keep ``http_status`` and ``error``;
    ``connection_error`` is True when the failure was at the connection level (refused, reset, cut
    mid-stream), the kind of failure that a dead server causes.

    Introduced in lab 02 (Prefill and Decode).
    """

    id: str
    timings: Timings
    endpoint: str = "chat"
    ok: bool = False
    http_status: int | None = None
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    expected_input_tokens: int | None = None
    max_output_tokens: int | None = None
    min_output_tokens: int | None = None
    tokens_exact: bool = True
    finish_reason: str | None = None
    scheduled_offset_s: float | None = None
    warmup: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    connection_error: bool = False

    # -- derived metrics (seconds internally, milliseconds exposed) -----------------------------
    @property
    def streamed_tokens(self) -> int:
        """Tokens counted in the stream (sum of ``chunk_tokens``)."""
        return int(sum(self.timings.chunk_tokens))

    @property
    def expected_output_tokens(self) -> int | None:
        if self.max_output_tokens is not None and self.min_output_tokens == self.max_output_tokens:
            return self.max_output_tokens
        return None

    @property
    def n_output(self) -> int:
        """n in TPOT: the server's count when it gave one, else the streamed count."""
        return self.output_tokens if self.output_tokens is not None else self.streamed_tokens

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token: first token-carrying chunk minus dispatch (also known for some failures)."""
        t = self.timings
        if t.t_first_token is None or t.t_dispatched is None:
            return None
        return _ms(t.t_first_token - t.t_dispatched)

    @property
    def e2e_ms(self) -> float | None:
        """End-to-end latency: last token-carrying chunk minus dispatch (completed requests only)."""
        t = self.timings
        if not self.ok or t.t_end is None or t.t_dispatched is None:
            return None
        return _ms(t.t_end - t.t_dispatched)

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (n - 1) for n >= 2 output tokens, else None (completed requests only)."""
        e2e, ttft, n = self.e2e_ms, self.ttft_ms, self.n_output
        if e2e is None or ttft is None or n < 2:
            return None
        return (e2e - ttft) / (n - 1)

    @property
    def itl_ms(self) -> list[float]:
        """Inter-token latencies, one per token after the first (see :func:`itl_values`); [] unless ok."""
        if not self.ok:
            return []
        return [v * 1000.0 for v in itl_values(self.timings.chunk_times, self.timings.chunk_tokens)]

    @property
    def itl_per_chunk_ms(self) -> list[float]:
        """Gaps between token-carrying chunks, one per chunk after the first (see :func:`chunk_gaps`); [] unless ok."""
        if not self.ok:
            return []
        return [v * 1000.0 for v in chunk_gaps(self.timings.chunk_times)]

    @property
    def client_queue_ms(self) -> float | None:
        """Time between the scheduled send and the actual dispatch (the client's own queue)."""
        t = self.timings
        if t.t_dispatched is None:
            return None
        return _ms(t.t_dispatched - t.t_scheduled)

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the raw record plus the derived metrics (ignored when loading back)."""
        d = asdict(self)
        d["timings"] = asdict(self.timings)
        d["derived"] = {
            "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms,
            "client_queue_ms": self.client_queue_ms, "streamed_tokens": self.streamed_tokens,
            "itl_mean_ms": _mean_or_none(self.itl_ms), "itl_per_chunk_mean_ms": _mean_or_none(self.itl_per_chunk_ms),
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RequestResult":
        d = dict(d)
        d.pop("derived", None)
        timings = Timings(**d.pop("timings"))
        known = {f for f in cls.__dataclass_fields__}
        return cls(timings=timings, **{k: v for k, v in d.items() if k in known})


def _mean_or_none(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None
