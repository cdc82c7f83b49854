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
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Sample", "Snapshot", "scrape", "parse", "Sampler", "MetricsUnavailable"]


class MetricsUnavailable(RuntimeError):
    """The server has no usable ``/metrics`` endpoint."""


@dataclass(frozen=True)
class Sample:
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
    """Parse Prometheus exposition text into a :class:`Snapshot`."""
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return Snapshot(t=time.time() if t is None else t, samples=samples)


def scrape(base_url: str, timeout: float = 10.0, api_key: str | None = None) -> Snapshot:
    """GET ``/metrics`` from a vLLM server (``base_url`` may end in ``/v1``).

    Introduced in lab 02 (Prefill and Decode).
    """
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{root}/metrics", timeout=timeout, headers=headers)
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
        root = base_url.rstrip("/")
        root = root[:-3] if root.endswith("/v1") else root
        self.url, self.names, self.interval = f"{root}/metrics", tuple(names), interval
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.rows: list[dict[str, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        with httpx.Client(timeout=5.0, headers=self.headers) as client:
            while not self._stop.is_set():
                try:
                    text = client.get(self.url).text
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
