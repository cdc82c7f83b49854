"""The expert's diagnostic checklist ("it's slow / broken"), as rules over :class:`~helpers.doctor.evidence.Evidence`.

Each rule answers one question of the checklist, in its order: TTFT (queue wait? a shared prefix recomputed? long
prefills?), TPOT (bandwidth? a batch too large? prefills stalling decode? drafting that does not pay?),
throughput (one request at a time? a client that was the bottleneck? failures? the KV cache full?), quality, and
start-up. A rule reports a :class:`Finding` — the symptom, the cause the numbers point to, those numbers, the fix as
engine arguments or a fleet change, and the lab that teaches it — or says why it found nothing, or that it could not
look (what it would need).

A latency counts as "too high" against an SLO (given, or the run's own); without one, only what is wrong at any
target is reported (requests waiting longer than they compute, a shared prefix prefilled again, preemptions, an
invalid or one-at-a-time benchmark, failures, a server that does not answer). A healthy server gets no finding.

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..procs import root_cause
from ..server.startup import failure_hint
from ..sizing.kv import prefix_hit_rate
from .evidence import Evidence

__all__ = ["Finding", "Check", "Diagnosis", "examine", "CHECKLIST", "LAB_TITLES"]

#: The labs a fix points to.
LAB_TITLES = {
    "01": "One GPU, One Model", "02": "Prefill and Decode", "05": "Where the Time Goes",
    "06": "Inside PagedAttention", "07": "Continuous Batching", "08": "Chunked Prefill",
    "09": "Prefix Caching, Measured", "10": "Load Testing Honestly", "11": "Latency, Throughput, Goodput",
    "12": "FP8 as the Default", "14": "AWQ, GPTQ, and What Died", "15": "Proving Quantization Safe",
    "16": "Speculative Decoding", "18": "Tensor and Pipeline Parallel", "22": "Routing and Autoscaling",
    "23": "Observability and the Postmortem",
}

#: Queue wait counts as the cause of TTFT when it is at least this share of the mean TTFT.
QUEUE_SHARE = 0.5
#: Without an SLO, queue wait counts only from this many milliseconds (a scheduler's own latency is below it).
QUEUE_MIN_MS = 50.0
#: Prefill counts as the cause of TTFT when it is at least this share of the mean TTFT.
PREFILL_SHARE = 0.5
#: A decode batch at or above this many sequences is "batched"; below it, TPOT is the hardware's bandwidth.
BATCHED = 4
#: A stall: the p99 gap between tokens at least this many times the median gap.
STALL_RATIO = 3.0
#: A measured prefix-cache hit rate under this share of the predicted one means the prefix is not reused.
REUSE_SHARE = 0.5
#: Speculative decoding "does not pay" below this acceptance rate once this many sequences decode together.
SPEC_MIN_ACCEPTANCE, SPEC_BUSY = 0.3, 8
#: The KV cache counts as full at this usage.
KV_FULL = 0.95


def _lab(*numbers: str) -> str:
    return ", ".join(f"{n} ({LAB_TITLES[n]})" for n in numbers)


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


@dataclass
class Finding:
    """One diagnosed fault: ``symptom`` (what a user sees), ``cause`` (what the numbers point to), ``evidence`` (the
    numbers that triggered it), ``fix`` (engine arguments or a fleet change), ``lab`` (where it is taught).

    Introduced in lab 24 (Putting It All Together).
    """

    check: str
    symptom: str
    cause: str
    evidence: dict[str, Any]
    fix: list[str]
    lab: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        ev = ", ".join(f"{k} {v}" for k, v in self.evidence.items() if v is not None)
        fixes = "".join(f"\n    fix: {f}" for f in self.fix)
        return f"[{self.check}] {self.symptom}\n    cause: {self.cause}\n    evidence: {ev}{fixes}\n    lab: {self.lab}"


@dataclass
class Check:
    """One question of the checklist and what came of it: ``"finding"``, ``"ok"`` or ``"not checked"``.

    Introduced in lab 24 (Putting It All Together).
    """

    id: str
    section: str
    question: str
    status: str
    note: str = ""


class _Ok(str):
    pass


class _Skip(str):
    pass


def _needs_run(check: Callable[[Evidence, Any], Finding | str]) -> Callable[[Evidence], Finding | str]:
    """A check that reads the run folder: it is skipped, saying so, when the evidence has none."""
    def wrapped(ev: Evidence) -> Finding | str:
        return _Skip("needs a run folder (--run)") if ev.run is None else check(ev, ev.run)
    wrapped.__name__, wrapped.__doc__ = check.__name__, check.__doc__
    return wrapped


# ------------------------------------------------------------------------------------- KV
def _kv_room_at_peak(ev: Evidence) -> float | None:
    """Tokens the KV cache had free at its fullest (usage maximum x its size), ``None`` if unknown."""
    v, tokens = ev.view, ev.kv_cache_tokens
    if v is None or v.kv_cache_usage_max is None or not tokens:
        return None
    return (1.0 - v.kv_cache_usage_max) * tokens


def _kv_bound(ev: Evidence) -> bool:
    """True when the KV cache decided how many requests ran: vLLM preempted, or requests waited while the batch
    was under ``max_num_seqs`` and the cache, even at its fullest, had no room for one more prompt (a waiting request
    is admitted only when blocks for its whole prompt are free, so the cache binds below 100% usage)."""
    v = ev.view
    if v is None:
        return False
    if (v.preemptions or 0) > 0:
        return True
    waiting, kv = v.num_requests_waiting_max or 0, v.kv_cache_usage_max
    if waiting < 1 or kv is None:
        return False
    if kv >= KV_FULL:
        return True
    room, prompt, cap = _kv_room_at_peak(ev), ev.prompt_tokens_per_request, ev.max_num_seqs
    under_cap = cap is None or v.num_requests_running_max is None or v.num_requests_running_max < cap
    return room is not None and prompt is not None and under_cap and room < prompt


# ------------------------------------------------------------------------------------- TTFT
def _ttft_too_high(ev: Evidence) -> bool | None:
    p99 = ev.latency.get("ttft_p99_ms")
    if ev.slo is None or ev.slo.ttft_ms is None or p99 is None:
        return None
    return p99 > ev.slo.ttft_ms


def check_queue(ev: Evidence) -> Finding | str:
    v = ev.view
    if v is None or not v.requests or v.queue_mean_ms is None or v.ttft_mean_ms is None:
        return _Skip("no requests in the window")
    high = _ttft_too_high(ev)
    waiting = v.num_requests_waiting_max or 0
    share = v.queue_mean_ms / v.ttft_mean_ms if v.ttft_mean_ms else 0.0
    if high is False:
        return _Ok(f"p99 TTFT {ev.latency['ttft_p99_ms']:.0f} ms within {ev.slo.ttft_ms:g} ms")
    queued = share >= QUEUE_SHARE if high else \
        (v.queue_mean_ms >= QUEUE_MIN_MS and v.queue_mean_ms > (v.prefill_mean_ms or 0.0))
    if not queued:
        return _Ok(f"queue wait {v.queue_mean_ms:.0f} ms is {share:.0%} of TTFT")
    running, cap = v.num_requests_running_max, ev.max_num_seqs
    kv = v.kv_cache_usage_max
    evidence = {"window": ev.window, "ttft_p99_ms": _r(ev.latency.get("ttft_p99_ms")),
                "ttft_slo_ms": ev.slo.ttft_ms if ev.slo else None, "ttft_mean_ms": _r(v.ttft_mean_ms),
                "queue_mean_ms": _r(v.queue_mean_ms), "prefill_mean_ms": _r(v.prefill_mean_ms),
                "waiting_max": waiting, "running_max": running, "max_num_seqs": cap, "kv_cache_usage_max": _r(kv, 3),
                "preemptions": v.preemptions}
    tpot, tpot_slo = ev.latency.get("tpot_p99_ms"), ev.slo.tpot_ms if ev.slo else None
    tpot_room = tpot is None or tpot_slo is None or tpot < 0.7 * tpot_slo
    if _kv_bound(ev):
        cause = (f"capacity-limited by the KV cache: {kv:.0%} used at its fullest" if kv is not None else
                 "the KV cache is full") + f", {v.preemptions or 0:g} preemptions — requests wait for blocks to free up"
        fix = ["more KV memory per replica: --kv-cache-dtype fp8, raise --gpu-memory-utilization, or quantize "
               "the weights (see the KV finding)", "scale out: add replicas behind the router"]
    elif not v.gauge_samples:
        cause = (f"capacity-limited: requests waited {v.queue_mean_ms:.0f} ms on average before their prefill "
                 "(gauges were not sampled: watch a window, --window S, to see whether the max_num_seqs cap, the KV "
                 "cache or compute binds)")
        fix = ["scale out: add replicas behind the router (autoscale on vllm:num_requests_waiting)",
               "or raise --max-num-seqs if the cap binds while the KV cache has room"]
    elif cap is not None and running is not None and running >= cap:
        cause = (f"capacity-limited by the max_num_seqs cap: {running:g} of {cap} sequences running, "
                 f"{waiting:g} waiting for a slot, while the KV cache is {kv:.0%} used" if kv is not None else
                 f"capacity-limited by the max_num_seqs cap: {running:g} of {cap} running, {waiting:g} waiting")
        if tpot_room and (kv is None or kv < 0.8):
            fix = [f"raise --max-num-seqs above {cap} (the KV cache has room; watch TPOT)",
                   "or scale out: add replicas behind the router"]
        else:
            fix = ["scale out: add replicas behind the router (autoscale on vllm:num_requests_waiting)",
                   f"raising --max-num-seqs above {cap} would cost TPOT (p99 {_r(tpot)} ms, SLO {tpot_slo} ms)"]
    else:
        cause = (f"capacity-limited by compute: {running:g} sequences share every step and requests still "
                 "queue — the engine serves as fast as it can")
        fix = ["scale out: add replicas behind the router (autoscale on vllm:num_requests_waiting)",
               "or a faster device / TP for more compute per replica"]
    symptom = "TTFT is too high: requests wait in the queue" if high else \
        "requests wait in the queue longer than they take to prefill"
    return Finding("ttft.queue", symptom, cause, evidence, fix, _lab("07", "22"))


def check_prefix_reuse(ev: Evidence) -> Finding | str:
    run = ev.run
    if run is None:
        if ev.prefix_caching is False:
            return _Skip("prefix caching is off; whether the prompts share a prefix needs a run folder (--run)")
        return _Skip("whether the prompts share a prefix needs a run folder (--run)")
    shared, prompt = run.shared_prefix_tokens, run.prompt_tokens
    if not shared or not prompt:
        return _Ok("the run's prompts share no prefix")
    block = ev.block_size or 16
    groups = int(run.workload.get("num_prefixes") or 1)
    # Requests sent together miss together (a block is cached once computed): under a closed loop of C, count waves.
    together = run.concurrency if run.arrivals == "concurrent" and run.concurrency else 1
    expected = prefix_hit_rate(shared, prompt, block, max(run.completed // groups // together, 1))
    v = ev.view
    measured = v.prefix_cache_hit_rate if v is not None else None
    evidence = {"window": ev.window, "shared_prefix_tokens": shared, "prompt_tokens": prompt, "block_size": block,
                "prefix_caching": ev.prefix_caching, "hit_rate_predicted": _r(expected, 3),
                "hit_rate_measured": _r(measured, 3), "ttft_p99_ms": _r(ev.latency.get("ttft_p99_ms"))}
    symptom = f"TTFT is higher than it needs to be: a {shared:,}-token shared prefix is prefilled again for every request"
    if ev.prefix_caching is False:
        return Finding("ttft.prefix_cache", symptom, "prefix caching is off (--no-enable-prefix-caching)", evidence,
                       ["--enable-prefix-caching (vLLM's default; drop --no-enable-prefix-caching)"], _lab("09"))
    if expected > 0.1 and measured is not None and measured < REUSE_SHARE * expected:
        return Finding("ttft.prefix_cache", symptom,
                       f"the prefix is not reused: hit rate {measured:.0%} where {expected:.0%} is possible — the "
                       "shared part differs between requests (a timestamp or id before it, a per-request cache_salt) "
                       "or its blocks are evicted before the next request (KV cache "
                       f"{(v.kv_cache_usage_max or 0):.0%} used)", evidence,
                       ["put the shared text first, byte-identical in every request; no per-request cache_salt",
                        "more KV memory, or cache-aware routing across replicas (lab 22)"], _lab("09", "22"))
    return _Ok(f"prefix-cache hit rate {measured if measured is not None else float('nan'):.0%} "
               f"(predicted {expected:.0%})")


def check_prefill(ev: Evidence) -> Finding | str:
    v = ev.view
    high = _ttft_too_high(ev)
    if high is None:
        return _Skip("no TTFT target (give an SLO)")
    if not high:
        return _Ok("TTFT within its target")
    if v is None or not v.ttft_mean_ms or v.prefill_mean_ms is None:
        return _Skip("no server view of prefill time")
    share = v.prefill_mean_ms / v.ttft_mean_ms
    if share < PREFILL_SHARE:
        return _Ok(f"prefill is {share:.0%} of TTFT")
    tokens = ev.prompt_tokens_per_request
    hit = v.prefix_cache_hit_rate
    evidence = {"window": ev.window, "ttft_p99_ms": _r(ev.latency.get("ttft_p99_ms")), "ttft_slo_ms": ev.slo.ttft_ms,
                "prefill_mean_ms": _r(v.prefill_mean_ms), "ttft_mean_ms": _r(v.ttft_mean_ms),
                "prompt_tokens_per_request": _r(tokens, 0), "prefix_cache_hit_rate": _r(hit, 3)}
    return Finding("ttft.prefill", "TTFT is too high: prefill takes most of it",
                   f"long prompts ({tokens or 0:,.0f} tokens per request) are compute-bound to prefill",
                   evidence, ["reuse what repeats: shared prefixes first, prefix caching on (lab 09)",
                              "more compute per replica: a faster device or --tensor-parallel-size (lab 18)",
                              "chunked prefill keeps other streams moving meanwhile (--max-num-batched-tokens, lab 08)"],
                   _lab("02", "09"))


# ------------------------------------------------------------------------------------- TPOT
def _tpot_too_high(ev: Evidence) -> bool | None:
    p99 = ev.latency.get("tpot_p99_ms")
    if ev.slo is None or ev.slo.tpot_ms is None or p99 is None:
        return None
    return p99 > ev.slo.tpot_ms


def _tpot_evidence(ev: Evidence) -> dict[str, Any]:
    v = ev.view
    return {"window": ev.window, "tpot_p99_ms": _r(ev.latency.get("tpot_p99_ms")), "tpot_slo_ms": ev.slo.tpot_ms,
            "running_max": v.num_requests_running_max if v else None, "max_num_seqs": ev.max_num_seqs}


def check_bandwidth(ev: Evidence) -> Finding | str:
    high = _tpot_too_high(ev)
    if high is None:
        return _Skip("no TPOT target (give an SLO)")
    running = ev.view.num_requests_running_max if ev.view else None
    if not high or running is None or running >= BATCHED:
        return _Ok("TPOT within its target" if not high else f"{running} sequences decode together (see batch)")
    return Finding("tpot.bandwidth", "TPOT is too high even with few sequences decoding",
                   f"memory-bound decode: at {running:g} sequence(s) every step reads all the weights, so TPOT is the "
                   "hardware's bandwidth over the bytes per step", _tpot_evidence(ev),
                   ["fewer bytes per step: quantized weights (FP8 / INT8 / INT4, labs 12 and 14) and "
                    "--kv-cache-dtype fp8", "more bandwidth: --tensor-parallel-size N within a node (lab 18), or a "
                    "device with more HBM bandwidth"], _lab("05", "12"))


def check_batch(ev: Evidence) -> Finding | str:
    high = _tpot_too_high(ev)
    if high is None:
        return _Skip("no TPOT target (give an SLO)")
    running = ev.view.num_requests_running_max if ev.view else None
    if not high or running is None or running < BATCHED:
        return _Ok("TPOT within its target" if not high else "few sequences decode together (see bandwidth)")
    tpot = ev.latency["tpot_p99_ms"]
    target = max(1, int(running * ev.slo.tpot_ms / tpot))
    return Finding("tpot.batch", "TPOT is too high: output streams slowly",
                   f"the batch is too large for the latency target: {running:g} sequences share each decode step",
                   _tpot_evidence(ev),
                   [f"--max-num-seqs {target} (the batch scaled by SLO/TPOT; confirm the knee with a sweep, lab 11)",
                    "then scale out for the throughput the smaller batch gives up (lab 22)"], _lab("07", "11"))


def check_stalls(ev: Evidence) -> Finding | str:
    if ev.slo is None or ev.slo.tpot_ms is None:
        return _Skip("no TPOT target (give an SLO)")
    p50, p99 = ev.latency.get("itl_p50_ms"), ev.latency.get("itl_p99_ms")
    mean, longest, budget = ev.prompt_tokens_per_request, ev.longest_prompt_tokens, ev.max_num_batched_tokens
    if p50 is None or p99 is None or (mean is None and longest is None):
        return _Skip("no inter-token latencies or prompt lengths")
    if not (p99 > ev.slo.tpot_ms and p99 > STALL_RATIO * p50):
        return _Ok(f"ITL p99 {p99:.0f} ms vs median {p50:.0f} ms")
    # The stall comes from the longest prompts, not the mean one (a few long prompts among many short ones):
    # judged by the bucket of vLLM's prompt-length histogram that holds the longest, when there is one. A prompt
    # is prefilled in pieces of at most the step's budget, or of the long-prompt threshold when one is set.
    threshold = int(float(ev.engine_args.get("long_prefill_token_threshold") or 0)) or None
    caps = [c for c in (budget, threshold) if c is not None]
    piece = min(caps) if caps else None
    tokens = longest[0] if longest else mean
    said = (f"prompts of more than {longest[0]:,.0f} tokens" + (f" (at most {longest[1]:,.0f})" if longest[1] else "")
            if longest else f"prompts of {mean:,.0f} tokens on average")
    if piece is not None and (piece <= tokens if longest else piece < tokens):
        how = f"budget {budget:,}" if piece == budget else f"long-prompt threshold {threshold:,}"
        return _Ok(f"{said} are already chunked ({how})")
    evidence = {"window": ev.window, "itl_p50_ms": _r(p50), "itl_p99_ms": _r(p99), "itl_max_ms":
                _r(ev.latency.get("itl_max_ms")), "tpot_slo_ms": ev.slo.tpot_ms,
                "prompt_tokens_per_request": _r(mean, 0), "longest_prompt_tokens": list(longest) if longest else None,
                "max_num_batched_tokens": budget, "long_prefill_token_threshold": threshold}
    chunk = max(64, int(tokens // 4) // 64 * 64)
    whole = "can be" if longest and piece is not None and (longest[1] is None or piece < longest[1]) else "are"
    return Finding("tpot.stalls", "TPOT is too high in bursts: streams stall when a long prompt arrives",
                   f"long-prompt prefills stall decode: {said} {whole} prefilled whole in one step "
                   f"(budget {budget if budget is not None else 'default'}), and every decoding stream waits for it",
                   evidence, [f"--max-num-batched-tokens {chunk} (chunked prefill: a prompt is split across steps "
                              "that decode alongside)"], _lab("08"))


def check_speculative(ev: Evidence) -> Finding | str:
    v = ev.view
    if v is None or not v.spec_drafts:
        return _Ok("no speculative decoding")
    rate, running = v.spec_acceptance_rate, v.num_requests_running_max or 0
    if rate is None or rate >= SPEC_MIN_ACCEPTANCE or running < SPEC_BUSY:
        return _Ok(f"acceptance {rate:.0%} at {running:g} sequences" if rate is not None else "no drafts")
    return Finding("tpot.speculative", "speculative decoding costs more than it saves",
                   f"drafts are mostly rejected ({rate:.0%} accepted) while {running:g} sequences already fill each "
                   "step: verifying drafts takes compute the batch needs",
                   {"window": ev.window, "acceptance_rate": _r(rate, 3),
                    "mean_acceptance_length": _r(v.spec_mean_acceptance_length, 2), "running_max": running},
                   ["drop --speculative-config at this concurrency, or enable it only below a few sequences",
                    "a better draft for this text (acceptance decides the win)"], _lab("16"))


# ------------------------------------------------------------------------------- throughput
@_needs_run
def check_single_request(ev: Evidence, run: Any) -> Finding | str:
    if not run.one_at_a_time:
        return _Ok(f"{run.arrivals} load, up to {run.running_max} running")
    return Finding("throughput.single_request", "throughput measured low: the benchmark sent one request at a time",
                   "benchmarking a single request: one stream leaves the batch empty, so its latency says nothing "
                   "about capacity", {"run": run.path, "arrivals": run.arrivals, "concurrency": run.concurrency,
                                      "running_max": run.running_max, "completed": run.completed},
                   ["benchmark under concurrency: bench.sweep over Poisson rates, or bench.Concurrent(N) for "
                    "N = 1, 4, 16 ..., and read the knee (lab 11)"], _lab("10", "11"))


@_needs_run
def check_client(ev: Evidence, run: Any) -> Finding | str:
    if run.valid:
        return _Ok("the client kept up")
    return Finding("throughput.client_bound", "the benchmark's numbers describe the client, not the server",
                   f"the load generator was the bottleneck: {run.invalid_reason}",
                   {"run": run.path, "valid": run.valid, "invalid_reason": run.invalid_reason},
                   ["more sending processes (bench.run(..., workers='auto')), a quieter client machine, or a lower "
                    "rate; then measure again"], _lab("10"))


@_needs_run
def check_failures(ev: Evidence, run: Any) -> Finding | str:
    if not run.failed:
        return _Ok(f"all {run.completed} requests completed")
    top = max(run.errors.items(), key=lambda kv: kv[1])[0] if run.errors else "unknown error"
    return Finding("throughput.failures", f"{run.failed} of {run.failed + run.completed} requests failed",
                   f"the server refused or dropped them: {top}",
                   {"run": run.path, "failed": run.failed, "completed": run.completed, "errors": run.errors},
                   ["read the error: a context over max_model_len needs a larger --max-model-len or shorter prompts; "
                    "timeouts under load need capacity (scale out)"], _lab("10"))


def check_kv(ev: Evidence) -> Finding | str:
    v = ev.view
    if v is None:
        return _Skip("no server view")
    kv, pre, waiting = v.kv_cache_usage_max, v.preemptions or 0, v.num_requests_waiting_max or 0
    if not _kv_bound(ev):
        return _Ok(f"KV cache at most {kv:.0%} used, no preemptions" if kv is not None else "no preemptions")
    room, prompt = _kv_room_at_peak(ev), ev.prompt_tokens_per_request
    tokens, mml = ev.kv_cache_tokens, ev.max_model_len
    per_req = (v.prompt_tokens + v.generation_tokens) / v.requests if v.requests and v.prompt_tokens is not None \
        and v.generation_tokens is not None else None
    fits = int(tokens // per_req) if tokens and per_req else None
    evidence = {"window": ev.window, "preemptions": pre, "kv_cache_usage_max": _r(kv, 3), "waiting_max": waiting,
                "running_max": v.num_requests_running_max, "kv_cache_tokens": tokens,
                "kv_free_tokens_at_peak": _r(room, 0), "prompt_tokens_per_request": _r(prompt, 0), "max_model_len": mml,
                "tokens_per_request": _r(per_req, 0), "requests_the_cache_holds": fits}
    fix = ["--kv-cache-dtype fp8 (about twice the tokens; validate quality, lab 12)",
           "more memory for the cache: raise --gpu-memory-utilization (or --kv-cache-memory-bytes), or quantize the "
           "weights to free it (lab 14)"]
    if fits:
        fix.append(f"--max-num-seqs {max(fits, 1)} (what the cache holds at these lengths: the rest wait instead "
                   "of being preempted and recomputed)")
    fix += ["lower --max-model-len if no request needs it (more requests of the real length fit)",
            "more GPUs per replica (--tensor-parallel-size splits the KV heads, lab 18)"]
    if pre > 0:
        cause = (f"the KV cache ran out: vLLM preempted running requests {pre:g} times, recomputing them later "
                 f"(usage peaked at {kv:.0%} where it was sampled)" if kv is not None else
                 f"the KV cache ran out: vLLM preempted running requests {pre:g} times")
    elif kv is not None and kv >= KV_FULL:
        cause = (f"the KV cache is full ({kv:.0%} used) with {waiting:g} requests waiting for blocks: the cache, not "
                 "the batch limit, decides how many run")
    else:
        cause = (f"the KV cache admits too few requests: at its fullest ({kv:.0%} used) it had {room:,.0f} tokens free, "
                 f"less than one {prompt:,.0f}-token prompt, so {waiting:g} requests waited with only "
                 f"{v.num_requests_running_max:g} running (a request is admitted only when blocks for its whole "
                 "prompt are free)")
    return Finding("memory.kv", "throughput is low: the KV cache is the limit", cause, evidence, fix, _lab("06"))


# ------------------------------------------------------------------------------- quality, start
def check_quality(ev: Evidence) -> Finding | str:
    return _Skip("/metrics says nothing about output quality: gate a change with helpers.evals (lab 15) and canary "
                 "it (lab 23)")


def check_start(ev: Evidence) -> Finding | str:
    if ev.reachable:
        return _Ok(f"{ev.url} answers /metrics")
    if ev.url is None:
        return _Skip("no server given")
    text = ev.log_text or ""
    hint, cause_line = failure_hint(text), root_cause(text)
    tail = [line for line in text.splitlines() if line.strip()][-3:]
    evidence = {"url": ev.url, "error": ev.unreachable_reason, "log": ev.log_path, "root_cause": cause_line or None,
                "log_tail": tail or None}
    if hint or cause_line:
        cause = f"it failed at start-up: {cause_line}" if cause_line else f"its log matches a known failure: {hint}"
        fix = [hint] if hint else ["read the root cause in the log, change that setting, start again"]
    elif text:
        cause = "the server stopped (its log ends without an error: stopped on purpose, or killed)"
        fix = ["start it again (helpers.server.start), or `python -m helpers.server list` to see what runs"]
    elif "answered HTTP" in (ev.unreachable_reason or ""):
        cause = (f"something answers at this address, but not vLLM's /metrics ({ev.unreachable_reason}): another "
                 "server on this port, a path prefix in the URL, or a gateway that does not pass /metrics")
        fix = ["pass the vLLM server's own URL (http://host:port, as `python -m helpers.server list` prints it), or "
               "the gateway's with a key allowed to read /metrics"]
    else:
        cause = "nothing answers at this address and no log of a server there was found"
        fix = ["start the server (helpers.server.start) and pass its URL; with a GPU, check `nvidia-smi` against "
               "the CUDA build of vLLM first — a driver/CUDA/library mismatch is the #1 cause of a start that fails"]
    return Finding("start", "the server does not answer (won't start, or died)", cause, evidence, fix,
                   _lab("01", "06"))


#: The checklist in its order: (id, section, question, rule).
CHECKLIST: list[tuple[str, str, str, Callable[[Evidence], "Finding | str"]]] = [
    ("ttft.queue", "TTFT is too high", "Queue wait? (capacity-limited)", check_queue),
    ("ttft.prefix_cache", "TTFT is too high", "Shared prefix reused? (prefix caching)", check_prefix_reuse),
    ("ttft.prefill", "TTFT is too high", "Long prompts compute-bound to prefill?", check_prefill),
    ("tpot.bandwidth", "TPOT is too high", "Memory-bound decode at the hardware's bandwidth?", check_bandwidth),
    ("tpot.batch", "TPOT is too high", "Batch too large for the latency target?", check_batch),
    ("tpot.stalls", "TPOT is too high", "Long-prompt prefills stalling decode?", check_stalls),
    ("tpot.speculative", "TPOT is too high", "Speculative decoding without spare compute?", check_speculative),
    ("throughput.single_request", "Throughput is low", "Benchmarking a single request?", check_single_request),
    ("throughput.client_bound", "Throughput is low", "The client the bottleneck?", check_client),
    ("throughput.failures", "Throughput is low", "Requests failing?", check_failures),
    ("memory.kv", "Throughput is low / out of memory", "KV memory the limit?", check_kv),
    ("quality", "Quality regressed after a change", "Over-aggressive quantization, a new model?", check_quality),
    ("start", "Won't start", "Does it answer? (driver/CUDA/library mismatch, memory)", check_start),
]


@dataclass
class Diagnosis:
    """The checklist run over one deployment: every check with its status, and the findings in checklist order.

    ``str(d)`` is the report a person reads; ``d.to_json()`` the list of findings a program reads.

    Introduced in lab 24 (Putting It All Together).
    """

    evidence: Evidence
    checks: list[Check] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def has(self, check: str) -> bool:
        return any(f.check == check for f in self.findings)

    def finding(self, check: str) -> Finding | None:
        return next((f for f in self.findings if f.check == check), None)

    @property
    def healthy(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.evidence.url, "window": self.evidence.window,
                "slo": self.evidence.slo.as_dict() if self.evidence.slo else None,
                "findings": [f.as_dict() for f in self.findings], "checks": [asdict(c) for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps([f.as_dict() for f in self.findings], indent=2, default=str)

    def table(self):
        """Every check as a DataFrame row (section, question, status, note)."""
        import pandas as pd

        return pd.DataFrame([asdict(c) for c in self.checks])

    def __str__(self) -> str:
        ev = self.evidence
        head = [f"doctor: {ev.url or 'no server'} | window: {ev.window or '-'} | SLO: {ev.slo or 'none given'}"]
        if ev.run:
            head.append(f"run: {ev.run.path} ({ev.run.arrivals}, {ev.run.completed} completed)")
        body = [str(f) for f in self.findings] or ["no finding: every check that could run passed"]
        skipped = [f"  - {c.question} {c.note}" for c in self.checks if c.status == "not checked"]
        tail = ["not checked:", *skipped] if skipped else []
        return "\n".join(head + body + tail)


def examine(ev: Evidence) -> Diagnosis:
    """Run every rule of :data:`CHECKLIST` over ``ev``; findings come out in the checklist's order.

    Introduced in lab 24 (Putting It All Together).
    """
    d = Diagnosis(evidence=ev)
    for cid, section, question, rule in CHECKLIST:
        out = rule(ev)
        if isinstance(out, Finding):
            d.findings.append(out)
            d.checks.append(Check(cid, section, question, "finding", out.cause))
        else:
            d.checks.append(Check(cid, section, question, "not checked" if isinstance(out, _Skip) else "ok", str(out)))
    return d
