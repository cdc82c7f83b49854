"""vLLM's Prometheus metrics as typed snapshots.

``/metrics`` is parsed with ``prometheus_client``'s own parser (not by hand). A :class:`Snapshot` holds
every sample; ``after.delta(before)`` gives what a run added to counters and histograms, so a lab can
say "this run hit the prefix cache 412 times in 520 queries" without the server's history leaking in.
Names are vLLM's (``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``,
``vllm:prefix_cache_hits_total`` ...).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .endpoint import Endpoint, auth_headers, http

__all__ = ["Sample", "Snapshot", "scrape", "parse", "Sampler", "MetricsUnavailable", "ServerView", "server_root"]


class MetricsUnavailable(RuntimeError):
    """The server has no usable ``/metrics`` endpoint.

    Introduced in lab 02 (Prefill and Decode).
    """


@dataclass(frozen=True)
class Sample:
    """One sample of a scrape: metric name, labels, value.

    Introduced in lab 02 (Prefill and Decode).
    """

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass
class Snapshot:
    """All samples of one scrape, at wall-clock time ``t`` (``time.time()``).

    Introduced in lab 02 (Prefill and Decode).
    """

    t: float
    samples: list[Sample] = field(default_factory=list)

    def _match(self, name: str, labels: Mapping[str, str] | None) -> Iterable[Sample]:
        for s in self.samples:
            if s.name != name:
                continue
            if labels and any(s.label_dict.get(k) != v for k, v in labels.items()):
                continue
            yield s

    def value(self, name: str, default: float = math.nan, **labels: str) -> float:
        """Sum of the samples called ``name`` (across engines/models) that carry ``labels``."""
        found = list(self._match(name, labels))
        return sum(s.value for s in found) if found else default

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def labels_of(self, name: str) -> dict[str, str]:
        """The labels of the first sample called ``name`` (for info metrics such as ``vllm:cache_config_info``)."""
        for s in self.samples:
            if s.name == name:
                return s.label_dict
        return {}

    def histogram(self, name: str, **labels: str) -> dict[float, float]:
        """Cumulative bucket counts ``{upper_bound: count}`` of histogram ``name``."""
        out: dict[float, float] = {}
        for s in self._match(f"{name}_bucket", labels):
            le = float(s.label_dict["le"])
            out[le] = out.get(le, 0.0) + s.value
        return dict(sorted(out.items()))

    def delta(self, before: "Snapshot") -> "Snapshot":
        """Counters and histogram parts minus ``before``; gauges keep this snapshot's value."""
        prev = {(s.name, s.labels): s.value for s in before.samples}
        out = []
        for s in self.samples:
            cumulative = s.name.endswith(("_total", "_count", "_sum", "_bucket"))
            if cumulative and (s.name, s.labels) in prev:
                out.append(Sample(s.name, s.labels, s.value - prev[(s.name, s.labels)]))
            else:
                out.append(s)
        return Snapshot(t=self.t, samples=out)

    def histogram_mean(self, name: str, **labels: str) -> float:
        """Mean of a histogram (its ``_sum`` over its ``_count``): NaN when it saw nothing."""
        count = self.value(f"{name}_count", 0.0, **labels)
        return self.value(f"{name}_sum", 0.0, **labels) / count if count else math.nan

    def top_bucket(self, name: str, **labels: str) -> tuple[float, float | None] | None:
        """The highest bucket of histogram ``name`` that holds an observation, as ``(above, at_most)``
        (``at_most`` is ``None`` for the ``+Inf`` bucket); ``None`` when it holds none."""
        buckets = self.histogram(name, **labels)
        total, lower = max(buckets.values(), default=0.0), 0.0
        for le, count in buckets.items():
            if total > 0 and count >= total:  # all at or below le; some above the bound before it
                return lower, None if math.isinf(le) else le
            lower = le
        return None

    def histogram_quantile(self, q: float, name: str, **labels: str) -> float:
        """Prometheus-style quantile from the buckets (linear within a bucket)."""
        buckets = self.histogram(name, **labels)
        if not buckets:
            return math.nan
        total = buckets.get(math.inf, max(buckets.values()))
        if total <= 0:
            return math.nan
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for le, count in buckets.items():
            if count >= rank:
                if math.isinf(le):
                    return lower_bound
                span = count - lower_count
                return lower_bound + (le - lower_bound) * ((rank - lower_count) / span if span else 0.0)
            lower_bound, lower_count = le, count
        return lower_bound


def parse(text: str, t: float | None = None) -> Snapshot:
    """Parse Prometheus exposition text into a :class:`Snapshot`.

    Introduced in lab 02 (Prefill and Decode).
    """
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return Snapshot(t=time.time() if t is None else t, samples=samples)


def server_root(url: str) -> str:
    """``http://host:port`` from a server's URL, whether or not it ends in ``/v1`` (the OpenAI base URL).

    Introduced in lab 02 (Prefill and Decode).
    """
    return Endpoint(url).root


def scrape(base_url: str, timeout: float = 10.0, api_key: str | None = None) -> Snapshot:
    """GET ``/metrics`` from a vLLM server (``base_url`` may end in ``/v1``).

    Introduced in lab 02 (Prefill and Decode).
    """
    root = server_root(base_url)
    try:
        r = http().get(f"{root}/metrics", timeout=timeout, headers=auth_headers(api_key))
    except httpx.HTTPError as e:
        raise MetricsUnavailable(f"could not reach {root}/metrics: {e}") from e
    if r.status_code != 200:
        raise MetricsUnavailable(f"{root}/metrics answered HTTP {r.status_code}")
    snap = parse(r.text)
    if not any(s.name.startswith("vllm:") for s in snap.samples):
        raise MetricsUnavailable(f"{root}/metrics has no vllm:* metrics (is this a vLLM server?)")
    return snap


class Sampler:
    """Scrape a few gauges every ``interval`` seconds in a background thread, for charts over time.

    ``with Sampler(url, ["vllm:num_requests_running", "vllm:num_requests_waiting"]) as s: ...`` then
    ``s.rows`` is a list of ``{"t": ..., name: value}``. A scrape that fails is recorded once in ``error``
    and sampling goes on.

    It stays cheap next to a load generator: vLLM's page is ~1,500 lines of histograms and parsing all of
    it takes ~20 ms of Python holding the GIL, which would delay the client's own timestamps. So each
    sample keeps only the lines of the wanted metrics (a string filter) and parses those with
    :func:`parse`.

    Introduced in lab 03 (Sizing the KV Cache).
    """

    def __init__(self, base_url: str, names: Iterable[str], interval: float = 0.25, api_key: str | None = None):
        root = server_root(base_url)
        self.url, self.names, self.interval = f"{root}/metrics", tuple(names), interval
        self.headers = auth_headers(api_key)
        self.rows: list[dict[str, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        client = http()
        while not self._stop.is_set():
            try:
                text = client.get(self.url, headers=self.headers, timeout=5.0).text
                t = time.time()
                keep = "\n".join(line for line in text.splitlines() if line.startswith(self.names)) + "\n"
                snap = parse(keep, t=t)
                row = {"t": t}
                row.update({n: snap.value(n) for n in self.names})
                self.rows.append(row)
            except Exception as e:  # noqa: BLE001 - a failed sample is recorded once, sampling goes on
                self.error = self.error or f"{type(e).__name__}: {e}"
            self._stop.wait(self.interval)

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------- the server's view
def _num(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, and vLLM < 0.10's


@dataclass
class ServerView:
    """What a vLLM server's ``/metrics`` says happened during a run: deltas between two scrapes, gauge maxima
    from samples taken during it.

    Latencies are means in milliseconds from histogram deltas (``_sum / _count``). Gauge maxima come from the
    samples and both scrapes, so a spike shorter than the sampling interval can be missed. Counters include
    requests that failed. Speculative decoding fields are set when the server drafts (``vllm:spec_decode_*``):
    ``spec_acceptance_rate`` = accepted / drafted tokens, ``spec_mean_acceptance_length`` = 1 + accepted / drafts
    (tokens per step, the verified token included).

    Introduced in lab 07 (Continuous Batching).
    """

    available: bool = True
    note: str = ""
    requests: float | None = None
    ttft_mean_ms: float | None = None
    e2e_mean_ms: float | None = None
    tpot_mean_ms: float | None = None
    itl_mean_ms: float | None = None
    queue_mean_ms: float | None = None
    prefill_mean_ms: float | None = None
    decode_mean_ms: float | None = None
    kv_cache_usage_max: float | None = None
    num_requests_running_max: float | None = None
    num_requests_waiting_max: float | None = None
    gauge_samples: int = 0
    preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prompt_tokens: float | None = None
    #: Where the longest prompt lies in vLLM's prompt-length histogram (``vllm:request_prompt_tokens``): more than
    #: the first bound, at most the second (``None``: past the last finite bucket).
    longest_prompt_bucket: tuple[float, float | None] | None = None
    generation_tokens: float | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_accepted_per_position: list[float] = field(default_factory=list)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        q, h = self.prefix_cache_queries, self.prefix_cache_hits
        return h / q if q and h is not None else None

    @property
    def spec_acceptance_rate(self) -> float | None:
        d, a = self.spec_draft_tokens, self.spec_accepted_tokens
        return a / d if d and a is not None else None

    @property
    def spec_mean_acceptance_length(self) -> float | None:
        n, a = self.spec_drafts, self.spec_accepted_tokens
        return 1.0 + a / n if n and a is not None else None

    @classmethod
    def unavailable(cls, note: str) -> "ServerView":
        return cls(available=False, note=note)

    @classmethod
    def between(cls, before: Snapshot | None, after: Snapshot | None,
                gauges: Iterable[Mapping[str, float]] = ()) -> "ServerView":
        """The view of everything between scrapes ``before`` and ``after``, with gauge ``samples`` taken between."""
        if before is None or after is None:
            return cls.unavailable("no /metrics scrape before or after the run")
        d = after.delta(before)
        rows = list(gauges)

        def ms(name: str) -> float | None:
            v = _num(d.histogram_mean(name))
            return None if v is None else v * 1000.0

        def gmax(*names: str) -> float | None:
            for name in names:
                vals = [float(g[name]) for g in rows if g.get(name) is not None and not math.isnan(g[name])]
                vals += [v for v in (before.value(name), after.value(name)) if not math.isnan(v)]
                if vals:
                    return max(vals)
            return None

        per_pos = sorted(((int(s.label_dict.get("position", -1)), s.value) for s in d.samples
                          if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"))
        return cls(
            requests=_num(d.value("vllm:time_to_first_token_seconds_count")),
            ttft_mean_ms=ms("vllm:time_to_first_token_seconds"),
            e2e_mean_ms=ms("vllm:e2e_request_latency_seconds"),
            tpot_mean_ms=ms("vllm:request_time_per_output_token_seconds"),
            itl_mean_ms=ms("vllm:inter_token_latency_seconds"),
            queue_mean_ms=ms("vllm:request_queue_time_seconds"),
            prefill_mean_ms=ms("vllm:request_prefill_time_seconds"),
            decode_mean_ms=ms("vllm:request_decode_time_seconds"),
            kv_cache_usage_max=gmax(*_KV_USAGE),
            num_requests_running_max=gmax("vllm:num_requests_running"),
            num_requests_waiting_max=gmax("vllm:num_requests_waiting"),
            gauge_samples=len(rows),
            preemptions=_num(d.value("vllm:num_preemptions_total")),
            prefix_cache_queries=_num(d.value("vllm:prefix_cache_queries_total")),
            prefix_cache_hits=_num(d.value("vllm:prefix_cache_hits_total")),
            prompt_tokens=_num(d.value("vllm:prompt_tokens_total")),
            longest_prompt_bucket=d.top_bucket("vllm:request_prompt_tokens"),
            generation_tokens=_num(d.value("vllm:generation_tokens_total")),
            spec_drafts=_num(d.value("vllm:spec_decode_num_drafts_total")),
            spec_draft_tokens=_num(d.value("vllm:spec_decode_num_draft_tokens_total")),
            spec_accepted_tokens=_num(d.value("vllm:spec_decode_num_accepted_tokens_total")),
            spec_accepted_per_position=[v for _, v in per_pos],
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(prefix_cache_hit_rate=self.prefix_cache_hit_rate, spec_acceptance_rate=self.spec_acceptance_rate,
                 spec_mean_acceptance_length=self.spec_mean_acceptance_length)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ServerView | None":
        if d is None:
            return None
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
