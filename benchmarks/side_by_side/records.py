"""What every tool is asked to send, and what any tool's run is read back into.

A :class:`Load` is the same for every tool; a :class:`~helpers.bench.Target` (:func:`server_under_test`) is the
server they all send to. Each tool's own
output files are read into :class:`Req` records (one per request, in milliseconds after that tool's own send
time) inside a :class:`ToolRun`, and :func:`matched_metrics` applies one set of definitions (ours) to them, so
the tools can be compared on the same footing whatever each one calls TTFT or TPOT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from helpers.bench import Target
from helpers.endpoint import Endpoint
from helpers.metrics import ServerView

__all__ = ["Load", "Target", "server_under_test", "target_record", "Req", "ToolRun", "matched_metrics", "mean", "pct", "median"]


@dataclass(frozen=True)
class Load:
    """What every tool sends: ``num_requests`` at a constant ``rate``, ``input_len`` prompt tokens on
    ``/v1/completions``, exactly ``output_len`` output tokens, greedy."""

    rate: float = 1.0
    num_requests: int = 30
    input_len: int = 256
    output_len: int = 64
    seed: int = 0
    endpoint: str = "completions"  # or "chat" (the calibration cross-check only)

    def describe(self) -> str:
        path = "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"
        return (f"constant {self.rate:g} req/s, {self.num_requests} requests per run, {self.input_len} prompt tokens "
                f"({path}), {self.output_len} output tokens (ignore_eos), temperature 0")

    @property
    def timeout_s(self) -> float:
        """How long one tool may take for this load, start-up included, before it is stopped."""
        return 180.0 + 4.0 * self.num_requests / self.rate


def server_under_test(base_url: str, model: str, tokenizer: str) -> Target:
    """The server every tool sends to, as the harness's own :class:`helpers.bench.Target`: its OpenAI base URL
    (ending in /v1) and served model in an :class:`~helpers.endpoint.Endpoint`, and the tokenizer that counts its
    tokens (``model_path``)."""
    return Target(Endpoint(base_url.rstrip("/"), None, model), model_path=tokenizer)


def target_record(target: Target) -> dict[str, Any]:
    """How a report stores the server under test (no key: the side-by-side runs keyless, on loopback)."""
    return {"base_url": target.base_url, "model": target.model, "tokenizer": target.model_path}


@dataclass
class Req:
    """One request as any tool saw it, in milliseconds after the tool's own send time.

    ``ttft_ms``: first chunk carrying output; ``last_ms``: last chunk carrying output; ``n_out``: the
    server's output-token count; ``gaps_ms``: the gaps between output-carrying chunks when the tool
    records them; ``chunk_tokens``: tokens per chunk when the tool knows them; ``close_ms``: when the
    tool considered the request over, if later than the last chunk. ``t0_wall``: send time (epoch s).
    """

    ok: bool
    ttft_ms: float | None = None
    last_ms: float | None = None
    n_out: int | None = None
    chunks: int | None = None
    gaps_ms: list[float] | None = None
    chunk_tokens: list[int] | None = None
    close_ms: float | None = None
    t0_wall: float | None = None
    input_tokens: int | None = None

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (n - 1): ours, and vLLM's (vllm/benchmarks/serve.py calculate_metrics)."""
        if not self.ok or self.ttft_ms is None or self.last_ms is None or not self.n_out or self.n_out < 2:
            return None
        return (self.last_ms - self.ttft_ms) / (self.n_out - 1)


def pct(values: Iterable[float | None], q: float) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.percentile(v, q)) if v else None


def mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def median(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def matched_metrics(reqs: Sequence[Req]) -> dict[str, Any]:
    """One set of definitions (ours) applied to any tool's per-request records.

    TTFT = first output-carrying chunk - send; TPOT = (last output chunk - first) / (n - 1);
    E2E = last output chunk - send. Completed requests only.
    """
    done = [r for r in reqs if r.ok]
    ttft = [r.ttft_ms for r in done]
    tpot = [r.tpot_ms for r in done if r.tpot_ms is not None]
    e2e = [r.last_ms for r in done]
    return {
        "n": len(done), "failed": len(reqs) - len(done),
        "ttft_mean": mean(ttft), "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "tpot_mean": mean(tpot), "tpot_p50": pct(tpot, 50),
        "e2e_mean": mean(e2e), "e2e_p50": pct(e2e, 50),
    }


@dataclass
class ToolRun:
    """One run of one tool: what it reported, its per-request records, the server's view, its cost.

    ``server`` is what the server's ``/metrics`` said about exactly this run (scraped before and after it).
    """

    tool: str
    round: int
    out_dir: str
    command: str
    ok: bool = True
    error: str | None = None
    reported: dict[str, Any] = field(default_factory=dict)
    reqs: list[Req] = field(default_factory=list)
    server: ServerView = field(default_factory=lambda: ServerView.unavailable("not scraped"))
    wall_s: float | None = None
    cpu_s: float | None = None
    cpu_in_window_s: float | None = None
    window_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def matched(self) -> dict[str, Any]:
        return matched_metrics(self.reqs)

    def server_mean(self, metric: str) -> float | None:
        """The server's own mean of ``metric`` (``ttft``, ``tpot``, ...) over this run, in ms."""
        return getattr(self.server, f"{metric}_mean_ms", None) if self.server.available else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["server"] = self.server.as_dict()
        d["matched"] = self.matched
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ToolRun":
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["reqs"] = [Req(**r) for r in d.get("reqs", [])]
        d["server"] = ServerView.from_dict(d.get("server")) or ServerView.unavailable("not saved")
        return cls(**d)
