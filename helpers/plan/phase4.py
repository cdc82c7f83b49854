"""Plans of phase 4 (labs 18-23): parallelism, disaggregation, KV tiers, routing, autoscaling, observability."""

from __future__ import annotations

from typing import Any

from .. import runtime, sizing
from . import resources as res
from .core import (TINY_MOE, TINY_TP, fits_context, fleet_model, gpu, gpu_fit, kv_per_token, long_enough, register,
                   shared_gpu_fit)

def _model_download(p: runtime.Profile, model: str) -> list[dict[str, Any]]:
    """The disk item for a fleet lab's smaller model (two copies of the profile's do not fit one card), if it is one."""
    if model == p.model:
        return []
    return [res.item(f"{model}: the fleet's model in the Hugging Face hub cache", res.checkpoint_bytes(p, "plain", model),
                     "the hub cache: labs 20-23 serve it", key=f"model:{model}")]


@register("18")
def _lab18(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    model = TINY_TP if not gpu(p) else p.model
    inp, out = 128, (32 if quick else 64)
    batches = ([1, 8] if quick else [1, 4, 16]) if not gpu(p) else ([1, 32] if quick else [1, 16, 64])
    max_len = 2048 if not gpu(p) else min(p.max_model_len, 8192)
    kv_bytes = 256 * 2**20 if not gpu(p) else 4 * 2**30
    per_token = kv_per_token(p, model)
    return {"max_model_len": max_len, "max_request_tokens": inp + out,
            "min_gpu_memory_utilization": p.utilization if gpu(p) else None, "min_run_s": 0.0, "model": model,
            "formats": res.formats(p, ("parallel", "tp=1"), ("parallel", "tp=2")),
            "tools": res.tools("PyYAML"),
            "values": {"tp_model": model, "tp_sizes": [1, 2], "input_len": inp, "output_len": out, "batches": batches,
                       "kv_cache_memory_bytes": kv_bytes, "repeats": 2 if quick else 3,
                       "allreduce_sizes": [4096, 65536, 1 << 20, 4 << 20],
                       "big_models": ["llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3"],
                       "card": p.hardware if gpu(p) else "h100", "links": ["nvlink4", "pcie5", "ib_ndr"],
                       "pp": {"stages": 2, "microbatches": [1, 4, 16]}},
            "rehearsal": {"output_len": 8, "repeats": 1},
            "checks": [fits_context(inp + out, max_len, "each request"),
                       {"claim": f"the KV pool ({kv_bytes / 2**20:.0f} MiB per rank) holds max_model_len "
                                 f"({max_len:,}) at TP=1", "ok": kv_bytes >= per_token * max_len},
                       gpu_fit(p, p.utilization, max_len)]}


@register("19")
def _lab19(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    # The served MoE is the random-weight tiny-moe on every device (loads in seconds, no download): the lab measures
    # its router, not its answers; real MoEs enter as catalog configs and as the EP deployment.
    inp, out = 128, (16 if quick else 64)
    return {"max_model_len": 2048, "max_request_tokens": inp + out,
            "min_gpu_memory_utilization": 0.5 if gpu(p) else None, "min_run_s": 0.0, "model": TINY_MOE,
            "values": {"moe_model": TINY_MOE, "input_len": inp, "output_len": out,
                       "batches": [1, 8] if quick else [1, 4, 16], "repeats": 2 if quick else 4,
                       "kv_cache_memory_bytes": 256 << 20,
                       "routing_texts": 8 if quick else 40, "routing_max_tokens": 256,
                       # texts (their first 300 characters) on which vLLM and transformers rank next tokens
                       "compare_texts": 4, "ep_sizes": [2, 4, 8],
                       "catalog": ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3"],
                       "ep_model": "Qwen/Qwen3-30B-A3B", "ep_gpus": 8},
            "rehearsal": {"output_len": 8, "repeats": 1, "routing_texts": 4},
            "tools": res.tools("PyYAML", "kubernetes-validate"),
            "checks": [fits_context(inp + out, 2048, "each request")]}


@register("20")
def _lab20(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    lengths = ([256, 1024] if quick else [256, 512, 1024, 2048]) if not gpu(p) else \
        ([2048, 8192] if quick else [1024, 4096, 16384, 32768])
    model = fleet_model(p)
    # the served model's own limit: on a 40 GB card the fleet's model is a 1.5B with 32,768 positions, not the 8B's
    limit = min(p.max_model_len, sizing.load_config(model, dtype=p.dtype).max_position_embeddings or p.max_model_len)
    lengths = [n for n in lengths if n + 64 <= limit]
    repeats, out = (2 if quick else 3), 16
    # Each server's context and KV pool fixed to what the lab sends: two servers share one card, and vLLM's memory
    # profiler counts the card's free memory, so each would see the other's weights (loading beside it) as its own,
    # leaving an H100 ~4 GiB of KV where max_model_len 131,072 needs 16 GiB. Fixed KV bytes skip the profiler.
    max_len = min(limit, -(-(lengths[-1] + 64) // 256) * 256)
    per_token = kv_per_token(p, model)
    kv_bytes = 2 * max_len * per_token
    util = round(p.utilization / 2, 3) if gpu(p) else None
    servers = [res.server(name, p, max_len, utilization=util, kv_bytes=kv_bytes, model=model)
               for name in ("prefill (kv_producer)", "decode (kv_consumer)")]
    # section 5, decode isolation: steady streams while long prompts arrive, on one server and through P/D. A long
    # prompt as long as one step's token budget holds beside the streams (the profile's budget here; the lab reads
    # the live server's), so on one server its prefill is a single step every stream waits for
    decoders = 2 if quick else 4
    budget = int(p.engine_args.get("max_num_batched_tokens", 2048))
    stall_prompt = min(lengths[-1], budget - decoders) // 16 * 16
    stall = {"decoders": decoders, "long_prompts": 3 if quick else 4, "lead_s": 0.2 if gpu(p) else 0.5,
             "spacing": 1.5, "min_output": 64 if quick else 128, "max_output": min(max_len - 64 - 8, 1024)}
    # every prompt's KV at one length, through P/D and on one server (a producer): the lab empties the store after
    # each length (kvstore.empty), and before section 5, whose streams and long prompts are the last it writes
    stores = [res.item(f"the KV store at {n:,} tokens: {2 * repeats} prompts' blocks", 2 * repeats * n * per_token)
              for n in lengths]
    stall_store = 2 * (decoders * 64 + stall["long_prompts"] * stall_prompt) * per_token   # section 5, both paths
    return {"max_model_len": max_len, "max_request_tokens": lengths[-1] + out,
            "min_gpu_memory_utilization": util, "min_run_s": 0.0, "model": model,
            "values": {"prompt_lengths": lengths, "output_len": out, "repeats": repeats,
                       "stall": stall, "kv_cache_memory_bytes": kv_bytes,
                       "links": ["nvlink4", "pcie5", "ib_ndr", "ethernet_100g"]},
            "rehearsal": {"repeats": 1, "stall": dict(stall, long_prompts=2, min_output=16)},
            "servers": servers, "together": True,
            "formats": res.formats(p, ("connector", "ExampleConnector")),
            "disk_bytes": res.disk(*stores, res.item("the KV store: section 5's streams and long prompts", stall_store),
                                   *_model_download(p, model)),
            "tools": res.tools("PyYAML", "vllm-router"),
            "checks": [fits_context(lengths[-1] + out, max_len, "the longest prompt"),
                       shared_gpu_fit(p, 2, max_len, model),
                       {"claim": f"section 5's long prompt ({stall_prompt:,} tokens) fits one step's token budget "
                                 f"({budget:,}) beside {decoders} streams, and is within the lengths section 3 measures "
                                 "its prefill at: on one server it stalls them for a whole step, of a predicted length",
                        "ok": lengths[0] // 2 <= stall_prompt <= min(lengths[-1], budget - decoders)},
                       fits_context(64 + stall["max_output"], max_len, "a decode stream of section 5")]}


@register("21")
def _lab21(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    prompt = 1024 if not gpu(p) else min(8192, p.max_model_len // 2)
    model = fleet_model(p)  # two servers share the card: a smaller model where two copies of the profile's do not fit
    per_token = kv_per_token(p, model)
    prompts_in_cache = 3
    cache_tokens = prompts_in_cache * (prompt + 256)
    # max_model_len well inside the pool: vLLM needs one whole request's blocks free (measured: a 3,840-token pool
    # held 3,712 tokens of requests, so max_model_len = the pool failed to start)
    repeats, flush = (2 if quick else 4), prompts_in_cache + 2
    max_len = min(p.max_model_len, prompt + 256)
    util = round(p.utilization / 2, 3) if gpu(p) else None  # two servers, each on half the card
    servers = [res.server(name, p, max_len, utilization=util, kv_bytes=cache_tokens * per_token, model=model)
               for name in ("no tier", "disk tier (kv_both)")]
    return {"max_model_len": max_len, "max_request_tokens": prompt + 16,
            "min_gpu_memory_utilization": util, "min_run_s": 0.0, "model": model,
            "values": {"prompt": prompt, "output": 8, "flush_prompts": flush,
                       "kv_cache_memory_bytes": cache_tokens * per_token, "cache_tokens": cache_tokens,
                       "kv_bytes_per_token": per_token, "repeats": repeats,
                       "tiers": ["pcie5", "nvme_gen4", "object_store"]},
            "rehearsal": {"repeats": 1},
            "servers": servers, "together": True,
            "formats": res.formats(p, ("connector", "ExampleConnector")),
            "disk_bytes": res.disk(res.item(f"the disk tier: {repeats + flush} prompts' blocks",
                                            (repeats + flush) * prompt * per_token), *_model_download(p, model),
                                   one_at_a_time=False),
            "tools": res.tools("PyYAML"),
            "checks": [fits_context(prompt + 16, min(p.max_model_len, prompt + 256), "the reused prompt"),
                       {"claim": f"{prompts_in_cache + 2} flush prompts of {prompt:,} tokens overflow a cache of "
                                 f"{cache_tokens:,} tokens, so the reused prompt is evicted",
                        "ok": (prompts_in_cache + 2) * prompt > cache_tokens}]}


@register("22")
def _lab22(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    model = fleet_model(p)
    if gpu(p):
        prefix, suffix, out, prefixes, per = 2048, 64, 16, 8, (4 if quick else 6)
        scale = {"max_num_seqs": 8, "input_len": 1024, "output_len": 128, "capacity_s": 20.0, "overload": 1.6,
                 "after_join_s": 10.0 if quick else 30.0, "max_duration_s": 600.0}
    else:
        prefix, suffix, out, prefixes, per = 384, 32, 8, 6, 4
        scale = {"max_num_seqs": 4, "input_len": 128, "output_len": 16, "capacity_s": 10.0 if quick else 20.0,
                 "overload": 1.6, "after_join_s": 8.0 if quick else 30.0, "max_duration_s": 400.0}
    request = prefix + suffix + out
    cache_tokens = int((prefixes / 2 + 1.5) * request)   # holds half the prefixes (cache-aware), not all (round-robin)
    per_token = kv_per_token(p, model)
    kv_bytes = cache_tokens * per_token
    max_len = min(p.max_model_len, 2 * request, cache_tokens)
    util = round(p.utilization / 2, 3) if gpu(p) else None
    return {"max_model_len": max_len, "max_request_tokens": request,
            "min_gpu_memory_utilization": util,
            "min_run_s": scale["capacity_s"], "model": model,
            "servers": [res.server(f"replica {i}", p, max_len, utilization=util, kv_bytes=kv_bytes, model=model)
                        for i in (0, 1)], "together": True, "disk_bytes": res.disk(*_model_download(p, model)),
            "tools": res.tools("PyYAML", "vllm-router", "prometheus", "kubernetes-validate", "jsonschema",
                               "crd-schemas"),
            "values": {"replicas": 2, "prefix_len": prefix, "suffix_len": suffix, "output_len": out,
                       "num_prefixes": prefixes, "per_prefix": per, "concurrency": 2,
                       "cache_tokens": cache_tokens, "kv_bytes_per_token": per_token,
                       # each replica's engine arguments; lab 23 runs the same two replicas (one start for both,
                       # with reuse on)
                       "replica": {"max_num_seqs": scale["max_num_seqs"], "max_model_len": max_len,
                                   "kv_cache_memory_bytes": kv_bytes},
                       "queue_threshold": 4, "hold_s": 3.0, "scale": scale,
                       "slo": {"ttft_p99_ms": 1000.0, "tpot_p99_ms": 60.0} if gpu(p) else
                       {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 250.0}},
            "rehearsal": {"per_prefix": 2, "hold_s": 1.0,
                          "scale": dict(scale, capacity_s=1.5, after_join_s=1.0, max_duration_s=30.0, input_len=256,
                                        output_len=16)},
            "checks": [fits_context(request, max_len, "each routed request"),
                       shared_gpu_fit(p, 2, cache_tokens, model),
                       {"claim": f"a replica's cache ({cache_tokens:,} tokens) holds the {prefixes // 2} prefixes "
                                 f"cache-aware routing gives it plus one request, but not all {prefixes}",
                        "ok": (prefixes // 2 + 1) * request <= cache_tokens < prefixes * prefix},
                       long_enough(p, scale["capacity_s"], scale["input_len"], scale["output_len"],
                                    batch=scale["max_num_seqs"], what="one replica's capacity run", model=model)]}


@register("23")
def _lab23(p: runtime.Profile, quick: bool) -> dict[str, Any]:
    fleet_ = _lab22(p, quick)   # lab 22's replicas, as they are: parked there, adopted here with reuse on
    model, replica = fleet_["model"], fleet_["values"]["replica"]
    # every request opens with one of a few system prompts, as a fleet's traffic does: the cache-aware router has
    # something to route on, and the dashboard's hit-rate panel something to show. The prefix is whole blocks of the
    # device's default size (16 on a GPU, 128 on a CPU: a prefix of 96 tokens there measured a hit rate of 0), so it
    # can hit at all
    block = 16 if gpu(p) else 128
    if gpu(p):
        load = {"max_num_seqs": replica["max_num_seqs"], "input_len": 1024, "output_len": 128, "prefix_len": 512}
        slo = {"ttft_p99_ms": 1000.0, "tpot_p99_ms": 60.0}
    else:
        load = {"max_num_seqs": replica["max_num_seqs"], "input_len": 160, "output_len": 16, "prefix_len": 128}
        # on one of vLLM's TTFT histogram boundaries (2.5 s): Prometheus counts a request as late against the largest
        # boundary at or below the target, so 2,000 ms became 1 s there and the burn alerts fired in the calm phase
        slo = {"ttft_p99_ms": 2500.0, "tpot_p99_ms": 250.0}
    phases = {"capacity_s": 10.0 if quick else 20.0, "calm_s": 15.0 if quick else 40.0,
              "overload_s": 30.0 if quick else 60.0, "recovery_s": 15.0 if quick else 40.0}
    if gpu(p):
        phases = {k: 2 * v for k, v in phases.items()}
    # 1.5 x one replica: an overload whose Poisson draw cannot hide it (at 1.3 x, seed 0's overload phase sent 10-11%
    # fewer requests than the mean in three runs, an effective 1.16 x, and in one p99 TTFT met the SLO), with headroom
    # left for the two-replica fix even on a 2-core machine, where the router, Prometheus and the client share the
    # replicas' cores (measured: at 1.6 x, two replicas still queued 5)
    calm, overload, fixed_replicas, prefixes = 0.5, 1.5, 2, 4
    request = load["input_len"] + load["output_len"]
    # the autoscaler's way back in (Kubernetes' HPA rule on a requests/s metric): the fleet's completions have fitted
    # one replica fewer at scale_in_share of its measured capacity for a stabilization window, a third of the recovery
    # phase, so the replica leaves while the calm load still runs. Requests in flight were the first load tried: two
    # replicas at 1.5 x held 4 or fewer (one batch) for 5 s, and the replica left mid-overload in CI
    cooldown, scale_in_share = round(phases["recovery_s"] / 3, 1), 0.75
    return {"max_model_len": replica["max_model_len"], "max_request_tokens": request,
            "min_gpu_memory_utilization": round(p.utilization / 2, 3) if gpu(p) else None,
            "min_run_s": phases["capacity_s"], "model": model,
            "servers": fleet_["servers"], "together": True,
            "tools": res.tools("PyYAML", "vllm-router", "prometheus", "promtool", "grafana-foundation-sdk"),
            "values": {**load, **phases, **slo, "replica": replica, "calm": calm, "overload": overload,
                       "fixed_replicas": fixed_replicas, "num_prefixes": prefixes,
                       # vllm-router's cache-aware policy balances by load only past an imbalance of 64 requests (its
                       # default): a replica that joins with an empty cache then gets nothing (measured: 217 to 0).
                       # One batch of imbalance is the limit here
                       "balance_abs_threshold": replica["max_num_seqs"],
                       "hold_s": fleet_["values"]["hold_s"], "cooldown_s": cooldown,
                       "scale_in_share": scale_in_share, "scale_in_window": "5s",
                       # a quarter of the batch waiting: crossed within seconds of the overload starting (measured on
                       # CPU: more than 2 waiting took 11 s at 1.6x), so the queue alert fires inside the overload
                       "queue_threshold": max(1, load["max_num_seqs"] // 4), "window": "30s",
                       "rate_window": "30s", "slo_window_s": 5.0,
                       # production's pairs shortened to fit a lab; the page waits 15 s to be sure, as SRE burn
                       # alerts do (without it, one late request in a 15 s window fired it)
                       "burn_windows": [["1m", "15s", 14.4, "page", "15s"], ["2m", "30s", 6.0, "ticket", "20s"]],
                       "alert_for": {"queue_for": "5s", "kv_for": "10s", "preemption_for": "10s", "tpot_for": "15s"}},
            "rehearsal": {"capacity_s": 1.5, "calm_s": 2.0, "overload_s": 3.0, "recovery_s": 3.0, "cooldown_s": 1.0,
                          "hold_s": 1.0, "input_len": load["prefix_len"] + 64, "output_len": 16},
            "checks": [fits_context(request, replica["max_model_len"], "a request on lab 22's replicas"),
                       {"claim": f"a full batch ({load['max_num_seqs']} x {request:,} tokens) fits in lab 22's "
                                 f"{fleet_['values']['cache_tokens']:,}-token cache per replica with a tenth to spare: "
                                 "no preemption, no KV-cache alert",
                        "ok": load["max_num_seqs"] * request <= 0.9 * fleet_["values"]["cache_tokens"]},
                       shared_gpu_fit(p, 2, fleet_["values"]["cache_tokens"], model),
                       long_enough(p, phases["capacity_s"], load["input_len"], load["output_len"],
                                    batch=load["max_num_seqs"], what="the capacity run", model=model),
                       {"claim": f"the overload ({overload} x one replica) exceeds one replica and fits in "
                                 f"{fixed_replicas}, so the fix can hold it", "ok": 1 < overload < fixed_replicas},
                       {"claim": f"the {prefixes} shared prefixes ({load['prefix_len']:,} tokens each) and a full batch "
                                 "fit in a replica's cache together, so a prefix routed home stays cached",
                        "ok": prefixes * load["prefix_len"] + load["max_num_seqs"] * request
                              <= fleet_["values"]["cache_tokens"] and load["prefix_len"] < load["input_len"]},
                       {"claim": f"the shared prefix ({load['prefix_len']:,} tokens) is whole blocks of the device's "
                                 f"default size ({block}), so the prefix cache can hit it",
                        "ok": load["prefix_len"] % block == 0 and load["prefix_len"] >= block},
                       {"claim": f"the calm load ({calm} x one replica) fits one replica at the scale-in share "
                                 f"({scale_in_share}) and the overload ({overload} x) does not: the replica can leave "
                                 "only after it", "ok": calm < scale_in_share < overload},
                       {"claim": f"the scale-in's stabilization window ({cooldown:g} s) is under half the recovery "
                                 f"phase ({phases['recovery_s']:g} s): the replica can leave while the calm load runs",
                        "ok": 0 < cooldown <= phases["recovery_s"] / 2}]}


