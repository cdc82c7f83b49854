"""Each lab's cells that do real work and their predicted wall seconds, from the lab's plan values and the parts
:mod:`helpers.plan.timing` defines (server starts, requests, timed runs, builds, tokenizing). A cell is named by its
index in the notebook (``cell 13: ...``), as ``labs/conftest.py`` names the measured ones, so ``python -m
helpers.plan cpu --quick --measured runs/lab_seconds.json`` sets each prediction beside a run's measurement.

Counted as the notebooks do it: a server started per configuration counts per configuration; a search counts its
most probes; a cell whose work depends on an earlier lab's output (lab 17 reads lab 15's quality figures, lab 24
lab 17's checkpoint) assumes the sequence ran in order. Downloads are added once per model by
:func:`helpers.plan.sequence_time`.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import math

from .. import settings, sizing, support
from .core import LABS, fleet_model, gpu, hardware, kv_per_token, model_config
from .phase3 import CALIBRATED, RECIPE_FORMATS
from .timing import (CPU_START_S, DISK_BPS, EXPECTED_EFFICIENCY, GPU_START_S, build, cell, e2e, requests, run, start,
                     times, tokenize)


@times("01")
def _t01(p, v, quick):
    q = 64  # the question in its chat template: under the plan's 64-token bound
    return [cell("cell 9: start the server", start(p)),
            cell("cell 12: one chat request (openai client)", requests(p, 1, q, v["max_tokens"])),
            cell("cell 14: the same request as raw HTTP", requests(p, 1, q, v["max_tokens"])),
            cell("cell 16: the same request streamed", requests(p, 1, q, v["max_tokens"]))]


@times("02")
def _t02(p, v, quick):
    lens, reps = v["prompt_lengths"], v["repeats"]
    # one warmup request before the first length; one output token each
    prefill = sum(requests(p, reps + (L == lens[0]), L, 1) for L in lens)
    decode = sum(requests(p, B * reps, v["decode_input"], v["decode_output"], B) for B in v["batch_sizes"])
    return [cell("cell 4: start the server", start(p)),
            cell("cell 11: prefill sweep (repeats x each prompt length)", prefill),
            cell("cell 14: decode sweep (repeats waves of each batch size)", decode)]


@times("03")
def _t03(p, v, quick):
    n, out = v["load_requests"], v["load_output"]
    return [cell("cell 4: start the server", start(p)),
            cell("cell 13: the known load, all requests at once",
                 requests(p, n, v["load_tokens"] - out, out, n))]


@times("04")
def _t04(p, v, quick):
    designs = v["designs"]

    def cfg(d):  # the tiny model's config
        return str(settings.data_dir() / "tiny" / f"{d}.json")

    # each design: a server start + one probe request; two designs at a time (ThreadPoolExecutor(2)), so the
    # cell lasts the slower of each pair
    each = [start(p, cfg(d)) + requests(p, 1, v["probe_prompt"], v["probe_output"], model=cfg(d)) for d in designs]
    pairs = sum(max(each[i:i + 2]) for i in range(0, len(each), 2))
    return [cell("cell 12: serve each tiny design (2 at a time) and probe its blocks", pairs)]


@times("05")
def _t05(p, v, quick):
    calib, co, reps = v["calibration_lengths"], v["calibration_output"], v["repeats"]
    ctx, lo = v["context"], v["long_output"]
    prompt = ctx - lo
    sweep = reps * (sum(requests(p, 1, L, co) for L in calib) + requests(p, 1, prompt, lo))
    # decode rounds (decode_rounds of them; up to decode_max_rounds while the CI is wide) resend each length's
    # rep-0 prompt: its prefill is cached, only the decode counts, plus one prefill of a length not swept above
    dlens = sorted({round(ctx * f / 256) * 256 for f in (1 / 4, 1 / 2, 3 / 4)} | {prompt})

    def dec(L):
        return e2e(p, L, co) - e2e(p, L, 0)

    rounds = v["decode_rounds"] * sum(dec(L) for L in dlens) + \
        sum(e2e(p, L, 0) for L in dlens if L not in calib and L != prompt)
    return [cell("cell 6: measure the machine (a subprocess: torch import + ~2 s of probes)", 10.0),
            cell("cell 8: start the server", start(p)),
            cell("cell 12: decode at batch 1 and at the plan's batch",
                 requests(p, 1, 64, 2 * co) + requests(p, v["batch"], 64, 2 * co, v["batch"])),
            cell("cell 18: calibration + target requests, then decode rounds", sweep + rounds)]


def _pacing(t_pre_s, t_step_s, **kw):
    """The long prompts' spacing (s) and the decoders' output, as ``bench.stall_pacing`` sets them in labs 08, 20 and
    24, from a predicted prefill and decode step instead of measured ones."""
    from ..bench import stall_pacing  # imported here: helpers.bench costs half a second to import, plans need it rarely

    return stall_pacing(t_pre_s * 1e3, t_step_s * 1e3, **kw)


def _step_s(p, prompt, batch):
    """One decode step of ``batch`` requests at about ``prompt`` tokens of context (the roofline's)."""
    return e2e(p, prompt, 1, batch) - e2e(p, prompt, 0, batch)


@times("06")
def _t06(p, v, quick):
    inp, out = v["load_input"], v["load_output"]
    block = 16 if gpu(p) else 128  # vLLM's default block size: the lab reads it from the big server
    cfg = sizing.load_config(p.model, dtype=p.dtype)
    small = sizing.vllm_kv_capacity(cfg, v["small_kv_bytes"], block, p.max_model_len).num_blocks
    each = math.ceil((inp + out) / block)
    n = math.ceil(v["overload"] * small / each)
    redo = max(0, n - small // each)  # preempted at full length: recomputed once the others finish
    load = requests(p, n, inp, out, n)
    P, O, k = 4 * block + block // 2, block, v["parallel_n"]
    return [cell("cell 4: start the big server", start(p)),
            # the small server, and (when the card cannot hold both) the big one started again after it
            cell("cell 15: overload the big and the small cache",
                 load + start(p) * (1 if v["small_beside_big"] else 2) + load + requests(p, redo, inp, out, redo)),
            cell("cell 22: fan one prompt out to n samples, primed and not",
                 requests(p, 1, P, 1) + 2 * e2e(p, P, O, k))]


@times("07")
def _t07(p, v, quick):
    inp, out, conc = v["input_len"], v["output_len"], v["concurrencies"]
    b, k, long, short = v["static_batch"], v["static_batches"], v["long_reply"], v["short_reply"]
    avg = (long + (b - 1) * short) / b
    # continuous: the last batch's long reply starts after about (k - 1) batches' worth of average steps
    continuous = e2e(p, inp, math.ceil((k - 1) * avg + long), b)
    rate = 0.7 * max(c / e2e(p, inp, out, c) for c in conc)
    n_mixed = max(8, round(rate * v["timeline_s"]))
    cap, seqs = v["capped_concurrency"], v["max_num_seqs"]
    default = 0.0 if cap in conc else requests(p, 2 * cap, inp, out, cap)
    return [cell("cell 4: start the server", start(p)),
            cell("cell 6: concurrency sweep", sum(requests(p, max(2 * c, 4), inp, out, c) for c in conc)),
            cell("cell 13: static against continuous batching", requests(p, k * b, inp, long, b) + continuous),
            # chat prompts (about 64 tokens with the template), replies up to 160
            cell("cell 17: Poisson timeline", run(p, n_mixed / rate, 64, 160, max(1, round(0.7 * conc[-1])))),
            cell("cell 20: the capped server (max_num_seqs)",
                 default + start(p) + requests(p, 2 * cap, inp, out, seqs))]


@times("08")
def _t08(p, v, quick):
    L, D, K, lead = v["long_prompt"], v["decoders"], v["long_prompts"], v["lead_s"]
    t_pre, t_step = e2e(p, L, 0), _step_s(p, 80, D)
    # cell 7's pacing from the two measurements of cell 6
    every, dec_out = _pacing(t_pre, t_step, long_prompts=K, lead_s=lead, max_output=p.max_model_len - 72,
                             min_every_s=v["prompt_every_s"], min_output=v["decode_output"])

    def load(b):  # the decoders' run, stalled by each long prompt's prefill (one decode step per chunk)
        return max(e2e(p, 64, dec_out, D), lead + K * every) + K * (t_pre + math.ceil(L / b) * t_step)

    hol = v["hol"]
    t_long = e2e(p, hol["long"], 1)
    trace = (hol["pairs"] - 1) * (2.5 * t_long + 1.0) + 2 * t_long  # the pairs' spacing, the last pair, the warmup
    return [cell("cell 6: one long prefill alone, one decode step",
                 start(p) + requests(p, 2, L, 1) + requests(p, D, 64, 32, D)),
            cell("cell 10: decoders plus long prompts, a server per budget",
                 sum(start(p) + load(b) for b in v["budgets"])),
            cell("cell 20: head-of-line trace, cap off and on", 2 * (start(p) + trace))]


@times("09")
def _t09(p, v, quick):
    n, out, suffix = v["requests"], v["output"], v["suffix"]
    L = v["system_prompt"] + suffix
    # shared prefix: the warmup (disjoint) and the first request miss, the rest prefill only the suffix
    shared = requests(p, 2, L, out) + requests(p, n - 1, suffix, out)
    return [cell("cell 4: start the server", start(p)),
            cell("cell 11: three workloads, one at a time", shared + 2 * requests(p, n + 1, L, out))]


@times("10")
def _t10(p, v, quick):
    inp, out, w = v["input_len"], v["output_len"], v["warm_requests"]
    rate = v["load_fraction"] * 8 / e2e(p, inp, out, 8)  # Little's law on cell 4's run
    n = max(12, round(rate * v["duration_s"]))
    in_flight = max(1, round(v["load_fraction"] * 8))
    open_run = run(p, n / rate, inp, out, in_flight)
    return [cell("cell 4: start, a lone request and a capacity run",
                 start(p) + requests(p, 4, inp, out) + requests(p, 16, inp, out, 8)),
            cell("cell 6: constant, Poisson and burst arrivals", 2 * open_run + requests(p, n, inp, out, n)),
            # first pass, the same prompts again (all but the last 1024-token prompt's partial block cached), disjoint
            cell("cell 10: warmup pitfall", requests(p, w, 1024, 16) + requests(p, w, 32, 16)
                 + requests(p, w + 2, 1024, 16)),
            cell("cell 14: free against fixed output lengths", 2 * requests(p, min(w, 52), 64, 128, 4)),
            # the client lets CLIENT_CAP in flight: the rest queue in the client when the server needs longer
            cell("cell 18: client-side cap",
                 max(open_run, requests(p, n, inp, out, v["client_cap"]))),
            # the calibration server: 0.2 s + 48 x 20 ms per request, 6 requests, its start and a tokenizer load
            cell("cell 20: naive client against the calibration server", 6 * (0.2 + 48 * 0.02) + 3.0)]


#: The shipped drift texts (data/evals/drift_texts.jsonl): 50 tokens each on average, their first sentences (lab 12's
#: greedy prompts) 15 (SmolLM2's tokenizer).
DRIFT_TOKENS, GREEDY_PROMPT_TOKENS = 50, 15
#: Weights one fake-quantize (or dequantize) pass rounds per second on the client's CPU, with its error statistics
#: and the write: SmolLM2's 106 M Linear weights went into a fake MXFP4 checkpoint in 3 s and an NVFP4 one in 11 s on
#: the 2-core EPYC (ci/README.md); one `fake_quantize` + `error_stats` of 2**20 weights took 0.1-0.2 s there: about
#: 1e7 a second per core. torch uses every core of the host: a GPU host is assumed to have 16 (the lent H100 and H200
#: machines had 16; cloud H100 VMs give 16-26 per GPU).
QUANT_PER_S_PER_CORE, GPU_HOST_CORES = 1e7, 16


def _quant_per_s(p):
    return QUANT_PER_S_PER_CORE * (GPU_HOST_CORES if gpu(p) else p.devices)


#: helpers.quant.build's defaults: a recipe without "samples" calibrates on 64 rows of 256 tokens.
SAMPLES, SEQ_LEN = 64, 256
#: lm-eval as a subprocess: its imports and task set-up (assumed), and indexing its ~10,000 built-in task files,
#: which only a built-in task (ARC) pays (measured 20-38 s: helpers.evals._LM_EVAL).
LM_EVAL_S, LM_EVAL_INDEX_S = 10.0, 30.0
#: The 7 shipped multiple-choice tasks' questions (4 choices each, about 12 tokens with the choice).
SHIPPED = (40, 40, 40, 30, 40, 30, 30)
#: ARC-Challenge's test split: 1,172 questions, about 40 tokens each with its answer (a shot, or the question asked).
ARC_QUESTIONS, ARC_TOKENS = 1172, 40


def _scored(p, n, prompt, batch):
    """``n`` prompts read for log-probabilities only (max_tokens 1, lm-eval's log-likelihoods), ``batch`` in flight:
    prefill-bound, so each wave is one batched prefill (``requests`` would count one prompt's)."""
    wave = sizing.prefill_time(model_config(p), hardware(p), max(prompt, 1), batch=batch,
                               efficiency=EXPECTED_EFFICIENCY).time
    return math.ceil(n / batch) * wave


def _drift(p, v):  # evals.prompt_logprobs: every drift text (None: all 40), 8 at a time
    return _scored(p, v["drift_texts"] or 40, DRIFT_TOKENS, 8)


def _linear(p):  # Linear weights (what a fake-quantized copy rounds)
    by = sizing.param_count(model_config(p)).by_component
    return by.get("attention", 0) + by.get("mlp", 0)


def _sampled(p, v):  # weights a section-2 cell reads: sample_weights rows' worth of each of a layer's 7 Linear tensors
    return v["sample_layers"] * min(7 * v["sample_weights"], _linear(p) / model_config(p).layers)


def _load(p):  # Server.swap_weights: the weights read into the running server, no start
    return start(p) - (GPU_START_S if gpu(p) else CPU_START_S)


def _copy(p, first_layers=None):  # a fake-quantized or dequantized copy, in this process: read, rounded, written
    share = first_layers / model_config(p).layers if first_layers else 1.0
    return 2 * _load(p) + share * _linear(p) / _quant_per_s(p)


def _build(p, recipe, samples=SAMPLES, first_layers=None):  # llm-compressor's build (samples x 256 tokens)
    cal = recipe in CALIBRATED
    share = first_layers / model_config(p).layers if first_layers else 1.0
    return build(p, cal, samples * SEQ_LEN if cal else 0, share=share)


def _native(p, recipe):  # quant.has_kernel: this device computes in the format (else servable dequantizes it)
    s = support.lookup("weights", RECIPE_FORMATS[recipe], support.Device.of(p))
    return s.supported and s.native


def _prep(p, spec, built=False):
    """Seconds before quant.serve can serve ``spec`` (its checkpoint made), and whether it is plain weights."""
    if "fake" in spec:
        return _copy(p, spec.get("first_layers")), True
    if "recipe" not in spec:  # engine arguments or a dtype: the profile's own checkpoint
        return 0.0, False
    native = _native(p, spec["recipe"]) and not spec.get("dequantize")
    made = 0.0 if built else _build(p, spec["recipe"], spec.get("samples", SAMPLES))
    return made + (0.0 if native else _copy(p)), not native


def _serve(p, prep, plain, up):
    """quant.serve: plain weights swap into the baseline's swappable server while it runs; anything else stops it
    and starts its own. The seconds, and whether the baseline's server is still up."""
    return (prep + _load(p), True) if plain and up else (prep + start(p), False)


@times("11")
def _t11(p, v, quick):
    inp, out, c = v["input_len"], v["output_len"], v["saturation_concurrency"]
    cap = c / e2e(p, inp, out, c)  # req/s by Little's law, as cell 7 measures it
    # each rate sends max(20, rate x SWEEP_S) requests; past capacity they are served at capacity
    sweep = sum(run(p, max(20, f * cap * v["sweep_s"]) / (min(f, 1.0) * cap), inp, out, c)
                for f in v["sweep_fractions"])
    starts = sum(1 for o in v["configs"].values() if o)  # the default configuration searches cell 7's server
    probes = len(v["configs"]) * v["search_runs"] * run(p, v["probe_s"], inp, out, c)  # at most SEARCH_RUNS each
    return [cell("cell 7: start, closed-loop capacity (2 warmup + 2 x C requests)",
                 start(p) + requests(p, 2, inp, out, 2) + requests(p, 2 * c, inp, out, c)),
            cell("cell 8: Poisson rate sweep", sweep),
            cell("cell 15: max-rate search per configuration", starts * start(p) + probes)]


@times("12")
def _t12(p, v, quick):
    measure = _drift(p, v) + requests(p, v["greedy_prompts"], GREEDY_PROMPT_TOKENS, v["greedy_tokens"], 8)
    up, weights = True, 0.0
    for spec in v["weights"].values():
        s, up = _serve(p, *_prep(p, spec), up)
        weights += s + measure
    kv = support.lookup("kv_cache", v["kv_cache_dtype"], support.Device.of(p)).supported
    return [cell("cell 10: sampled weights rounded (3 formats x 2 scales)", 6 * _sampled(p, v) / _quant_per_s(p)),
            cell("cell 13: baseline server, drift logprobs, greedy", start(p) + measure),
            cell("cell 14: each FP8 weight configuration served and measured", weights)] + (
        [cell("cell 17: FP8 KV cache server, drift, greedy", start(p) + measure)] if kv else [])  # else it says why


@times("13")
def _t13(p, v, quick):
    n = _sampled(p, v)
    up, served = True, start(p) + _drift(p, v)
    for spec in v["formats"].values():  # each build discarded with builds=True: made every run
        s, up = _serve(p, *_prep(p, spec), up)
        served += s + _drift(p, v)
    return [cell("cell 10: NVFP4/MXFP4 by hand against the library", 4 * n / _quant_per_s(p)),
            cell("cell 12: block size x scale format sweep",
                 len(v["block_sizes"]) * len(v["scale_formats"]) * n / _quant_per_s(p)),
            cell("cell 16: baseline server, each FP4 format served, drift", served)]


@times("14")
def _t14(p, v, quick):
    configs = list(v["configs"].values()) + ([v["awq"]] if v["awq_builds"] else [])
    # one build per recipe and layer count (the dequantized control reads its twin's); AWQ fails at once on a CPU
    recipes = {(c["recipe"], c.get("first_layers")) for c in configs if "recipe" in c}
    builds = sum(_build(p, r, v["calibration_samples"], first) for r, first in recipes)
    measure = _drift(p, v) + requests(p, v["speed_requests"] + 1, v["speed_input"], v["speed_output"])  # 1 warmup
    up, served = True, 0.0
    for c in sorted(configs, key=lambda c: not _prep(p, c, built=True)[1]):  # plain weights first
        prep, plain = _prep(p, c, built=True)
        if c.get("dequantize"):  # the control computes in its twin's dtype: another dtype needs its own server
            plain = support.compute_dtype(RECIPE_FORMATS[c["recipe"]], p.dtype, support.Device.of(p)) == p.dtype
        s, up = _serve(p, prep, plain, up)
        served += s + measure
    return [cell("cell 9: llm-compressor builds", builds),
            cell("cell 12: baseline server, drift and speed probe", start(p) + measure),
            cell("cell 13: each configuration served and measured", served)]


@times("15")
def _t15(p, v, quick):
    acc = LM_EVAL_S + _scored(p, 4 * sum(min(v["limit"] or n, n) for n in SHIPPED), 12, 64)  # 16 a batch, 4 batches
    # each haystack: the client counts ~L x (1 + log2 paragraphs) tokens, the server 4 x L; one prefill, 3 cache hits
    lc = sum(v["haystacks"] * (tokenize(L * (5 + math.log2(L / DRIFT_TOKENS))) + requests(p, 1, L, 1)
                               + requests(p, 3, 32, 1)) for L in v["lengths"])
    quality = _drift(p, v) + acc + lc
    std = v["standard_task"]
    # ARC: 16 batches of 16 choices in flight (64 questions); a question's other choices hit the prefix cache
    standard = LM_EVAL_S + LM_EVAL_INDEX_S + _scored(
        p, std["limit"] or ARC_QUESTIONS, (std["num_fewshot"] + 1) * ARC_TOKENS, 64) if std else 0.0
    v14 = LABS["14"](p, quick)["values"]  # lab 14 built (and kept) the same recipe: cached by content

    def built(spec):
        return any(c.get("recipe") == spec["recipe"] and not c.get("first_layers") and (
            spec["recipe"] not in CALIBRATED or spec.get("samples", SAMPLES) == v14["calibration_samples"])
            for c in v14["configs"].values())

    up, served = True, 0.0
    for name, spec in sorted(v["candidates"].items(), key=lambda item: "fake" not in item[1]):
        s, up = _serve(p, *_prep(p, spec, built="recipe" in spec and built(spec)), up)
        served += s + quality + (standard if name == v["eight_bit"] else 0.0)
    return [cell("cell 6: baseline server, quality (drift, shipped tasks, long context), ARC",
                 start(p) + quality + standard),
            cell("cell 8: each candidate served and measured", served)]


# Prompt tokens of lab 16's and 17's fixed prompts (helpers.speculative.prompts, evals.drift_texts' first sentence):
# a copy prompt is ~20 tokens of instruction + a ~50-word paragraph; an open prompt is one line.
COPY_IN, OPEN_IN, SENTENCE_IN = 96, 32, 16


@times("16")
def _t16(p, v, quick):
    def measure():  # each measurement twice (passes=2): both workloads one at a time, `copy` at each higher concurrency
        s = 2 * requests(p, 1, COPY_IN, v["output_len"]) if v["concurrency"][0] == 1 else 0.0  # warmup, each kind
        for c in v["concurrency"]:
            for prompt in ((COPY_IN, OPEN_IN) if c == 1 else (COPY_IN,)):
                s += 2 * requests(p, v["requests_at_1"] if c == 1 else c, prompt, v["output_len"], c)
        return s
    return [cell("cell 8: baseline server, every workload measured", start(p) + measure()),
            cell("cell 10: one server per drafter, the same measurements",
                 len(v["speculative"]) * (start(p) + measure()))]


@times("17")
def _t17(p, v, quick):
    inp, out, conc = v["input_len"], v["output_len"], v["capacity_concurrency"]
    q = v["quantized"]
    built = build(p, q.get("recipe") in CALIBRATED, 64 * 256)  # quant.build's default 64 x 256 calibration tokens
    # a probe sends at least 44 requests (1.25 x the 35 that can show 90%): at about the capacity's rate
    capacity_rps = conc / e2e(p, inp, out, conc)
    probe = max(v["probe_s"], 44 / capacity_rps)
    search = v["search_runs"] * run(p, probe, inp, out, conc)
    greedy = requests(p, v["greedy_prompts"], SENTENCE_IN, v["greedy_tokens"], 8)
    served = start(p) + greedy + search   # quality read from lab 15's saved figures (the sequence runs it first)
    opened = requests(p, v["open_requests"], OPEN_IN, out, v["open_requests"])
    return [cell("cell 8: the quantized checkpoint built (cached after lab 12/15)", built),
            cell("cell 11: baseline (capacity + rate search), then the quantized rate search",
                 served + run(p, v["capacity_s"], inp, out, conc) + served),
            cell("cell 14: each drafted configuration's rate search and open prompts",
                 len(v["draft_on"]) * (served + opened))]


@times("18")
def _t18(p, v, quick):
    measured = [tp for tp in v["tp_sizes"] if tp <= p.devices]  # the plan's formats: TP needs that many ranks
    m, inp, out = v["tp_model"], v["input_len"], v["output_len"]
    per_tp = sum(requests(p, 1, inp, out, 1, m) + requests(p, b * v["repeats"], inp, out, b, m)  # warmup=1 each
                 for b in v["batches"])
    return [cell("cell 10: gloo all-reduce timing (2 torch processes, 200 rounds)", 10.0),
            cell("cell 13: one server per TP size, each batch measured",
                 sum(start(p, m, tp=tp) + per_tp for tp in measured))]


@times("19")
def _t19(p, v, quick):
    m, inp, out = v["moe_model"], v["input_len"], v["output_len"]
    runs = sum(requests(p, 1, inp, out, 1, m) + requests(p, b * v["repeats"], inp, out, b, m) for b in v["batches"])
    # transformers on the client's CPU: the tiny MoE loaded twice (~3 s each), one eager forward per text (<=256 tok)
    hf = 6.0 + 0.05 * (v["compare_texts"] + v["routing_texts"])
    logprobs = requests(p, v["compare_texts"], 75, 1, 8, m)   # 300 characters ~ 75 tokens
    return [cell("cell 8: the tiny MoE served, each batch measured", start(p, m) + runs),
            cell("cell 12: vLLM's prompt logprobs, then transformers' next tokens and router choices",
                 logprobs + hf)]


@times("20")
def _t20(p, v, quick):
    m, out, st = fleet_model(p), v["output_len"], v["stall"]
    kv = kv_per_token(p, m) / DISK_BPS       # seconds to write (or read) one token's KV in the store

    def on_m(n, o, c=1):
        return e2e(p, n, o, c, m)

    # per length: P/D (prefill saves the KV, decode loads it) and one server (a producer: it saves too)
    paths = sum(v["repeats"] * (2 * on_m(n, out) + 3 * n * kv) for n in v["prompt_lengths"])
    # section 5: a long prompt every spacing prefills, decoders outlast them (bench.stall_pacing), on both paths
    budget = int(p.engine_args.get("max_num_batched_tokens", 2048))
    long = min(v["prompt_lengths"][-1], budget - st["decoders"]) // 16 * 16
    t_pre, t_step = on_m(long, 1), (on_m(64, 65) - on_m(64, 1)) / 64
    every, dec_out = _pacing(t_pre, t_step, long_prompts=st["long_prompts"], lead_s=st["lead_s"],
                             spacing=st["spacing"], max_output=st["max_output"], min_output=st["min_output"])
    burst = max(on_m(64, dec_out, st["decoders"]) + st["long_prompts"] * t_pre,
                st["lead_s"] + st["long_prompts"] * every + on_m(long, 8)) + st["long_prompts"] * long * 2 * kv
    return [cell("cell 6: prefill and decode servers started together, and the router", start(p, m) + 5.0),
            cell("cell 10: each prompt length through P/D and on one server", paths),
            cell("cell 18: streams stalled by long prompts, one server then P/D", 2 * burst)]


def _drain(p, seconds, prompt, output, concurrency, model):
    """A timed run of ``seconds`` plus one wave of ``concurrency`` requests draining, on ``model`` (run() has no
    model argument: the fleet labs may serve a smaller one than the profile's)."""
    return run(p, seconds) + requests(p, concurrency, prompt, output, concurrency, model=model)


@times("21")
def _t21(p, v, quick):
    m, P, O, R, F = fleet_model(p), v["prompt"], v["output"], v["repeats"], v["flush_prompts"]
    # per server, one at a time: cold, after eviction (R each), flush twice (F each), mixed (2R) in full; the warm
    # visit hits the KV cache (only the output is computed)
    visits = requests(p, 4 * R + 2 * F, P, O, 1, model=m) + requests(p, R, 1, O, 1, model=m)
    return [cell("cell 6: start two replicas (no tier, disk tier)", 2 * start(p, m)),
            cell("cell 8: build and tokenize the reused, flush and fresh prompts", tokenize((2 * R + 2 * F) * P)),
            cell("cell 10: six visits on each of the two servers", 2 * visits)]


@times("22")
def _t22(p, v, quick):
    m, s = fleet_model(p), v["scale"]
    n, prompt = v["num_prefixes"] * v["per_prefix"], v["prefix_len"] + v["suffix_len"]
    c, i, o = s["max_num_seqs"], s["input_len"], s["output_len"]
    cap = c / e2e(p, i, o, c, m)               # one replica's requests/s
    # the queue grows at (overload - 1) x capacity until it reaches the threshold, holds, then a cold start
    joined = v["queue_threshold"] / ((s["overload"] - 1) * cap) + v["hold_s"] + start(p, m)
    sending = min(joined + s["after_join_s"], s["max_duration_s"])
    # the first replica's backlog after sending stops (it drained at (1 - overload / 2) x capacity once B joined)
    backlog_s = max(0.0, (s["overload"] - 1) * joined - (1 - s["overload"] / 2) * s["after_join_s"])
    return [cell("cell 6: start two replicas", 2 * start(p, m)),
            cell("cell 11: the trace through vllm-router, once per policy",
                 2 * requests(p, n, prompt, v["output_len"], v["concurrency"], model=m)),
            cell("cell 19: one replica's capacity run", _drain(p, s["capacity_s"], i, o, c, m)),
            cell("cell 20: load ramp until the autoscaler's cold replica joins and serves",
                 _drain(p, sending + backlog_s, i, o, c, m))]


@times("23")
def _t23(p, v, quick):
    m, c, i, o = fleet_model(p), v["max_num_seqs"], v["input_len"], v["output_len"]
    duration = v["calm_s"] + v["overload_s"] + v["recovery_s"]
    # one replica: the overload's backlog drains at (1 - calm) x capacity in the recovery phase, maybe past its end
    past_end = max(0.0, (v["overload"] - 1) * v["overload_s"] / (1 - v["calm"]) - v["recovery_s"])
    return [cell("cell 6: start lab 22's two replicas", 2 * start(p, m)),
            cell("cell 8: one replica's capacity run", _drain(p, v["capacity_s"], i, o, c, m)),
            cell("cell 14: calm, overload, recovery on one replica, then the drain (+3 s)",
                 _drain(p, duration + past_end, i, o, c, m) + 3.0),
            # the warm standby joins (no start): two replicas keep up, nothing left queued at the end
            cell("cell 24: the same load, autoscaled (+1 warmup, +3 s)",
                 _drain(p, duration, i, o, c, m) + requests(p, 1, i, o, 1, model=m) + 3.0)]


def _stall_burst(p, v):
    """One bench.stall_load as lab 24 paces it (cell 27) from a predicted prefill and step; the decoders outlast the
    last prompt, plus about one prefill they stall for."""
    st, tpot = v["stall"], v["slo"]["tpot_p99_ms"] / 1e3
    L, d = st["long_prompt"], st["decoders"]
    pre = e2e(p, L, 1)
    step = (e2e(p, 64, 32, d) - e2e(p, 64, 0, d)) / 32
    chunk = max(16, int((0.7 * tpot - step) / pre * L) // 16 * 16)
    chunked = math.ceil(L / chunk) * (step + pre * min(chunk, L) / L)
    every, _ = _pacing(pre, step, long_prompts=st["long_prompts"], lead_s=st["lead_s"], spacing=st["spacing"],
                       max_output=st["max_output"], min_every_s=st["spacing"] * chunked)
    return st["lead_s"] + st["long_prompts"] * every + pre


@times("24")
def _t24(p, v, quick):
    P, O, cs, fc = v["shared_prefix"] + v["unique"], v["output"], v["concurrencies"], v["fault_concurrency"]
    fits = max(1, v["small_kv_bytes"] // (kv_per_token(p) * (P + O)))   # the planted pool: the rest wait
    def load(c):
        return requests(p, v["fault_requests"] + 1, P, O, min(c, fc))

    def slot(c):  # + 1 warmup
        return requests(p, v["requests_per_slot"] * c, P, O, c) + requests(p, 1, P, O)

    def tpot(c):
        return (e2e(p, P, O, c) - e2e(p, P, 0, c)) / O

    knee = max([c for c in cs if tpot(c) <= v["slo"]["tpot_p99_ms"] / 1e3] or [cs[0]])
    dev = support.Device.of(p)
    variants = sum(start(p) + sum(slot(1 if at == "one request" else knee) for at in set(x["at"]))
                   for x in v["variants"].values() if support.serves(x.get("engine", {}), dev).supported)
    st, m = v["stall"], v["operate_engine"].get("model")
    gw = requests(p, v["gateway_requests"], P, v["gateway_output"], v["gateway_concurrency"], model=m)
    evals_s = 2 * requests(p, v["canary_drift_texts"], 64, 1, 8, model=m) + \
        3 * requests(p, v["injection_requests"], 128, v["injection_tokens"], 8, model=m)
    return [cell("cell 14: planted faults: start, two waves through a tiny KV pool", start(p) + load(fits)),
            cell("cell 18: both fixes: start, the same load", start(p) + load(fc)),
            cell("cell 22: the design benchmark at each concurrency", sum(slot(c) for c in cs)),
            cell("cell 25: a long prefill alone, a decode step of the streams",
                 requests(p, 2, st["long_prompt"], 1) + requests(p, st["decoders"], 64, 32, st["decoders"])),
            cell("cell 27: the stall burst as designed and on two fixes (a start each)",
                 3 * _stall_burst(p, v) + 2 * start(p)),
            cell("cell 31: the misconceptions' variants this device serves (a start each)", variants),
            cell("cell 44: start the baseline and canary replicas", 2 * start(p, m)),
            cell("cell 45: canary and rollback runs through the gateway, drift, injection", 2 * gw + evals_s)]
