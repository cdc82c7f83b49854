"""What a routing policy does to a fleet's prefix cache, predicted before the run and measured after it.

::

    trace = fleet.routing_trace(num_prefixes=6, per_prefix=4, seed=0)          # prefix ids in a shuffled order
    pred = fleet.predict_routing(trace, "round_robin", replicas=2, prefix_tokens=384, prompt_tokens=416,
                                 output_tokens=8, block_size=srv.startup.block_size,
                                 capacity_blocks=srv.startup.num_blocks)
    pred.hit_rate                                                               # hit tokens / queried tokens

The prediction is a second, independent model of vLLM's prefix cache: each replica holds ``capacity_blocks`` blocks;
a prompt reuses its cached full blocks up to the first miss (never its last token); a finished request's blocks
stay cached, evicted least-recently-used first, a request's tail blocks before its head (vLLM frees them in that
order). Requests are taken one at a time per replica, so a run at low concurrency should land close.

The policies as vllm-router applies them: ``round_robin`` sends request i to replica i mod n; ``cache_aware``
sends a prompt to the replica that already holds its prefix, and a new prefix to the replica holding the fewest
(its balance rule). A shuffled trace matters: with prefixes sent in a fixed rotation, round-robin would pin every
prefix to one replica by accident and look as good as cache-aware routing.

Introduced in lab 22 (Routing and Autoscaling).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

__all__ = ["routing_trace", "assign", "predict_routing", "RoutingPrediction", "in_trace_order", "RoutingRun",
           "measure_routing"]


def routing_trace(num_prefixes: int, per_prefix: int, seed: int = 0) -> list[int]:
    """Every prefix id ``per_prefix`` times, in a seeded shuffled order.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if num_prefixes < 1 or per_prefix < 1:
        raise ValueError("num_prefixes and per_prefix must be at least 1")
    ids = np.repeat(np.arange(num_prefixes), per_prefix)
    np.random.default_rng(seed).shuffle(ids)
    return [int(i) for i in ids]


def in_trace_order(workload, trace: Sequence[int]):
    """``workload`` (a built :class:`helpers.bench.SharedPrefix`) with its requests reordered to follow ``trace``:
    the k-th time a prefix id appears, that prefix's k-th request.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    from ..bench import Workload

    by_prefix: dict[int, list] = {}
    for req in workload.requests:
        by_prefix.setdefault(int(req.meta["prefix_id"]), []).append(req)
    wanted = {pid: trace.count(pid) for pid in set(trace)}
    short = {pid: (n, len(by_prefix.get(pid, []))) for pid, n in wanted.items() if n > len(by_prefix.get(pid, []))}
    if short:
        raise ValueError(f"the trace asks more requests of some prefixes than the workload has (prefix: wanted, "
                         f"built) {short}: build it with num_requests = len(trace) and num_prefixes = the trace's")
    taken = {pid: 0 for pid in by_prefix}
    ordered = []
    for pid in trace:
        ordered.append(by_prefix[pid][taken[pid]])
        taken[pid] += 1
    return Workload(workload.endpoint, ordered, list(workload.warmup), {**workload.spec, "trace": list(trace)})


def assign(policy: str, trace: Sequence[int], replicas: int) -> list[int]:
    """The replica each request of ``trace`` goes to under ``policy`` (``round_robin`` or ``cache_aware``).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    if policy == "round_robin":
        return [i % replicas for i in range(len(trace))]
    if policy == "cache_aware":
        home: dict[int, int] = {}
        held = [0] * replicas
        out = []
        for pid in trace:
            if pid not in home:
                home[pid] = min(range(replicas), key=lambda r: (held[r], r))
                held[home[pid]] += 1
            out.append(home[pid])
        return out
    raise ValueError(f"no prediction for policy {policy!r}: round_robin and cache_aware are modelled")


@dataclass
class RoutingPrediction:
    """Predicted prefix-cache outcome of a routing policy: tokens queried and hit, per replica and fleet-wide.

    Introduced in lab 22 (Routing and Autoscaling).
    """

    policy: str
    replicas: int
    queries: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    misses: int = 0

    @property
    def hit_rate(self) -> float:
        q = sum(self.queries)
        return sum(self.hits) / q if q else float("nan")

    def replica_hit_rate(self, r: int) -> float:
        return self.hits[r] / self.queries[r] if self.queries[r] else float("nan")

    def as_dict(self) -> dict:
        return {"policy": self.policy, "replicas": self.replicas, "hit_rate": self.hit_rate,
                "replica_hit_rates": [self.replica_hit_rate(r) for r in range(self.replicas)],
                "requests_per_replica": self.requests, "prefix_misses": self.misses}


def predict_routing(trace: Sequence[int], policy: str, replicas: int, *, prefix_tokens: int, prompt_tokens: int,
                    output_tokens: int, block_size: int, capacity_blocks: int) -> RoutingPrediction:
    """Simulate each replica's block cache over ``trace`` routed by ``policy`` (see the module docstring).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if min(prefix_tokens, prompt_tokens, block_size, capacity_blocks) < 1 or prefix_tokens > prompt_tokens:
        raise ValueError("tokens, block_size and capacity_blocks must be positive, prefix_tokens <= prompt_tokens")
    need = -(-(prompt_tokens + output_tokens) // block_size)
    if need > capacity_blocks:
        raise ValueError(f"one request needs {need} blocks and a replica holds {capacity_blocks}: vLLM would refuse "
                         "it (max_model_len) — give the cache more blocks or shorten the prompts")
    where = assign(policy, trace, replicas)
    caches: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
    pred = RoutingPrediction(policy, replicas, [0] * replicas, [0] * replicas, [0] * replicas)
    max_hit_blocks = (prompt_tokens - 1) // block_size
    for i, (pid, r) in enumerate(zip(trace, where)):
        cache = caches[r]
        blocks = [(pid, k) if (k + 1) * block_size <= prefix_tokens else ("own", i, k) for k in range(need)]
        hit = 0
        while hit < max_hit_blocks and blocks[hit] in cache:
            hit += 1
        pred.queries[r] += prompt_tokens
        pred.hits[r] += hit * block_size
        pred.requests[r] += 1
        pred.misses += hit * block_size < (prefix_tokens // block_size) * block_size
        for b in blocks[:hit]:                       # in use: not evictable while the request runs
            cache.move_to_end(b)
        for b in blocks[hit:]:                       # new blocks evict the least recently used
            while len(cache) >= capacity_blocks:
                cache.popitem(last=False)
            cache[b] = None
        for b in reversed(blocks):                   # freed: the tail evicts before the head
            cache.move_to_end(b)
    return pred


def _decisions(snap: Any) -> dict[str, float]:
    """The router's prefix-routing outcomes (``vllm_router_prefix_routing_decisions_total`` by ``outcome``)."""
    out: dict[str, float] = {}
    for sample in snap.samples:
        if sample.name == "vllm_router_prefix_routing_decisions_total":
            outcome = sample.label_dict.get("outcome", "?")
            out[outcome] = out.get(outcome, 0.0) + sample.value
    return out


@dataclass
class RoutingRun:
    """One policy's measured run through vllm-router: the client's results, each replica's ``ServerView`` (its own
    ``/metrics`` before and after) and the router's prefix-routing decisions.

    Introduced in lab 22 (Routing and Autoscaling).
    """

    policy: str
    result: Any
    views: list
    decisions: dict[str, float]

    @classmethod
    def between(cls, policy: str, result: Any, before: tuple[list, Any], after: tuple[list, Any]) -> "RoutingRun":
        """What one routed run did, from :func:`mark` before and after it: each replica's prefix cache over the run
        and the router's decisions in it (a router that served before keeps its counts: only the run's are kept).

        Introduced in lab 23 (Observability and the Postmortem).
        """
        from ..metrics import ServerView

        d0, d1 = _decisions(before[1]), _decisions(after[1])
        return cls(policy, result, [ServerView.between(b, a) for b, a in zip(before[0], after[0])],
                   {k: v - d0.get(k, 0.0) for k, v in d1.items()})

    @property
    def hits(self) -> float:
        return sum(v.prefix_cache_hits or 0.0 for v in self.views)

    @property
    def queries(self) -> float:
        return sum(v.prefix_cache_queries or 0.0 for v in self.views)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else float("nan")

    @property
    def requests_per_replica(self) -> list[int]:
        return [int(v.requests or 0) for v in self.views]

    def row(self) -> dict[str, Any]:
        ttft = self.result.summary.ttft_ms
        return {"policy": self.policy, "hit rate": self.hit_rate, "requests per replica": self.requests_per_replica,
                "TTFT p50 (ms)": ttft.p50, "TTFT p99 (ms)": ttft.p99, "failed": self.result.summary.failed,
                **{f"router: {k}": v for k, v in sorted(self.decisions.items())}}


def mark(replicas: Sequence[Any], router: Any) -> tuple[list, Any]:
    """Each replica's ``/metrics`` and the router's, now: the two ends of a routed run (:meth:`RoutingRun.between`).
    The router's are read on its own metrics port, never through its OpenAI port (the router would route those
    scrapes to workers and shift round-robin's turn).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    return [r.metrics() for r in replicas], router.metrics()


def measure_routing(replicas: Sequence[Any], policy: str, workload: Any, concurrency: int = 2,
                    salt: str | None = None, **router_kwargs: Any) -> RoutingRun:
    """Send ``workload`` through a fresh vllm-router with ``policy`` over ``replicas`` and read what each replica's
    prefix cache did. ``salt`` (default: the policy) goes out as vLLM's ``cache_salt``, so blocks cached by an
    earlier run cannot hit.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    from .. import bench
    from .router import Router

    with Router(replicas, policy=policy, **router_kwargs) as router:
        before = mark(replicas, router)
        result = bench.run(workload, bench.Concurrent(concurrency), base_url=router, out=False, progress=False,
                           server_metrics=False, label=policy, extra_body={"cache_salt": salt or policy})
        return RoutingRun.between(policy, result, before, mark(replicas, router))
