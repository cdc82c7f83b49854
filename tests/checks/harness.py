"""Every lab's check cell can fail: for each claim, a doctored measurement that makes it fail.

The project rule: a check cell must be able to fail, and for each one we must know which doctored measurement makes
it fail. The files beside this one show it, one per phase (``test_phase1.py`` ... ``test_capstone.py``, as
``helpers.plan`` is split), lab by lab, on the check cells *as committed*; this one holds what they share:

1. The source of the one code cell tagged ``check`` is read straight from ``labs/NN_*.ipynb`` (never copied here),
   and so are the cells tagged ``derive``: the lab's own derivations from its raw measurements (gates from saved
   qualities, tables from records). They run, in the notebook's order, before the check cell, so a doctored raw
   measurement travels through the lab's own code, not a copy of it.
2. A namespace builder (``lab_NN`` below, registered with ``@lab("NN", ...)``) makes the objects those cells read,
   shaped like a real run's: the real ``helpers`` types where they are cheap (``StartupInfo`` parsed from vLLM log
   lines, ``bench`` summaries, records and run folders, ``ServerView``, ``sizing`` capacities and Sizing Sheets,
   ``fleet`` routing predictions, scale-out events and the autoscaler's rule), DataFrames with the columns the lab
   builds, and ``SimpleNamespace`` stand-ins with exactly the attributes the cell reads where the object is live
   (a server, an openai reply). Values are a real run's where the project has one (labs 01-06 and 22 on the cpu
   profile), else numbers of the same shape and plan; a GPU profile's where the claim only holds there (lab 06).
   Each builder says which. Values the lab derives are derived the lab's way. ``test_check_passes`` executes the
   cell on it: it must pass, which proves the claim is satisfiable and the builder faithful.
3. Each :class:`Doctor` changes one measurement of that namespace (a raw one where the lab tags its derivations),
   named after the claim it breaks, and
   ``test_doctored_measurement_fails`` asserts the cell then raises ``AssertionError`` *at the assert that states
   that claim* (``fails_at``, a fragment of that assert statement), not at some other line.
4. ``test_doctors_cover_every_assert`` requires every ``assert`` statement of every check cell to be made to fail by
   at least one doctor, and every doctor's ``fails_at`` to name exactly one assert: a new assert in a lab needs a
   doctor here, and a doctor whose assert was rewritten is noticed.

Adding a lab means adding one ``@lab("NN", Doctor(...), ...)`` builder to its phase's file (and its number to
:data:`PHASES`). A lab notebook with a check cell but no
builder fails ``test_check_passes`` (so nobody forgets). Where a doctored measurement reveals that the check
mishandles it (an exception other than ``AssertionError``), the doctor is a strict ``xfail`` naming the problem:
when the lab is fixed it starts passing and the strict mark says to remove it.

Nothing here starts a server or touches the network; every file runs in a few seconds.
"""

from __future__ import annotations

import ast
import json
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from helpers.bench.records import RequestResult, Timings
from helpers.bench.stats import Distribution, Summary
from helpers.bench.store import RunResult
from helpers.server.startup import parse_startup_log

ROOT = Path(__file__).resolve().parents[2]
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

    derive: tuple[str, ...] = ()

    def run(self, ns: dict[str, Any], derive: bool = True) -> None:
        """The lab's derivation cells (tagged ``derive``; ``derive=False``: already run), then the check cell."""
        if derive:
            self.run_derive(ns)
        exec(compile(self.source, self.filename, "exec"), ns)  # noqa: S102 - the lab's own committed cell

    def run_derive(self, ns: dict[str, Any]) -> None:
        for i, source in enumerate(self.derive):
            exec(compile(source, f"<derive cell {i} of {self.path.name}>", "exec"), ns)  # noqa: S102


def _tagged(nb: dict, tag: str) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]
            if c["cell_type"] == "code" and tag in c.get("metadata", {}).get("tags", [])]


def check_cell(number: str) -> CheckCell:
    path = NOTEBOOKS[number]
    nb = json.loads(path.read_text())
    cells = _tagged(nb, "check")
    assert len(cells) == 1, f"{path.name} has {len(cells)} cells tagged 'check'; a lab has exactly one"
    return CheckCell(number, path, cells[0], tuple(_tagged(nb, "derive")))


# ------------------------------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class Doctor:
    """One doctored measurement: ``apply`` changes the passing namespace; the cell must then fail at the assert
    containing ``fails_at``. ``xfail``: the check mishandles this measurement (raises something else): reported."""

    claim: str
    apply: Callable[[dict[str, Any]], None]
    fails_at: str
    xfail: str | None = None
    #: the lab's derive cells run first and ``apply`` edits what they made: for a claim about what the lab wrote (a
    #: deliverable edited by hand afterwards) or about a library's arithmetic, which no raw measurement can break
    after_derive: bool = False


@dataclass(frozen=True)
class LabSpec:
    build: Callable[[Path], dict[str, Any]]
    doctors: tuple[Doctor, ...]
    #: why each noise-facing bound of the check is where it is (from the run's own spread or N recorded runs);
    #: ci/CHECKS.md prints them under the lab's doctors
    bounds: tuple[str, ...] = ()


LABS: dict[str, LabSpec] = {}


def lab(number: str, *doctors: Doctor, bounds: tuple[str, ...] = ()):
    """Register ``build(tmp_path) -> namespace`` for lab ``number`` with its doctored measurements, and the reasons
    for its bounds that face noise (``bounds``, printed in ci/CHECKS.md)."""
    def register(build: Callable[[Path], dict[str, Any]]):
        assert number not in LABS, f"two builders for lab {number}"
        claims = [d.claim for d in doctors]
        assert len(set(claims)) == len(claims), f"lab {number}: two doctors with the same claim"
        LABS[number] = LabSpec(build, doctors, tuple(bounds))
        return build
    return register


# ------------------------------------------------------------------------------------------ shared makers
SMOLLM2 = "smollm2-135m-instruct"   # the cpu profile's model (served in float32 on a CPU without native bf16)
CPU_DESCRIPTION = "vm: no NVIDIA GPU; CPU AMD EPYC (avx2), 2 CPU cores, 24 GiB RAM"


def make_startup(*lines: str, block_size: int, num_blocks: int):
    """A StartupInfo as ``Server.startup`` builds it: the log parsed, block size and count from cache_config_info."""
    info = parse_startup_log("\n".join(lines))
    info.block_size, info.num_blocks = block_size, num_blocks
    return info


def make_cpu_log(kv_gib: float, tokens: int, concurrency: str, max_model_len: int = 8192) -> list[str]:
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


def make_dist(count: int = 20, **values: float) -> Distribution:
    return Distribution(count=count, **values)


def make_summary(completed: int = 20, failed: int = 0, **fields: Any) -> Summary:
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


def make_run(**summary_fields: Any) -> RunResult:
    return RunResult(records=[], summary=make_summary(**summary_fields))


def make_records(n: int, *, rate: float, ttft_ms: float, tpot_ms: float, output_tokens: int, input_tokens: int = 128,
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


def set_value(df: pd.DataFrame, row: int, column: str, value: Any) -> None:
    df.loc[df.index[row], column] = value


# ================================================================================================== the tests
#: Which check tests file holds each lab's builder (one file per phase, as helpers.plan is split).
PHASES = {"phase1": ["01", "02", "03", "04", "05"], "phase2": ["06", "07", "08", "09", "10", "11"],
          "phase3": ["12", "13", "14", "15", "16", "17"], "phase4": ["18", "19", "20", "21", "22", "23"],
          "capstone": ["24"]}


def _doctor_params(numbers: list[str]):
    params = []
    for number in numbers:
        spec = LABS.get(number)
        for d in spec.doctors if spec else ():
            marks = [pytest.mark.xfail(strict=True, raises=TypeError, reason=d.xfail)] if d.xfail else []
            params.append(pytest.param(number, d, id=f"{number}-{d.claim}", marks=marks))
    return params


def checks_for(phase: str):
    """The three tests, parametrized over ``phase``'s labs: call it at the end of that phase's file, after its
    builders are registered (``test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert =
    checks_for("phase1")``)."""
    numbers = [n for n in PHASES[phase] if n in NOTEBOOKS]

    @pytest.mark.parametrize("number", numbers)
    def test_check_passes(number, tmp_path):
        """The check cell passes on a faithful run's namespace (and every lab with a check cell has a builder)."""
        cell = check_cell(number)
        if number not in LABS:
            pytest.fail(f"{cell.path.name} has a check cell but tests/checks/test_{phase}.py has no namespace builder "
                        f"for it: add @lab({number!r}, Doctor(...), ...) def lab_{number}(tmp): ...", pytrace=False)
        ns = LABS[number].build(tmp_path)
        cell.run(ns)

    @pytest.mark.parametrize("number,doctor", _doctor_params(numbers))
    def test_doctored_measurement_fails(number, doctor, tmp_path):
        """One doctored measurement makes the check fail, at the assert that states the claim it breaks."""
        cell = check_cell(number)
        ns = LABS[number].build(tmp_path)
        if doctor.after_derive:
            cell.run_derive(ns)
        doctor.apply(ns)
        with pytest.raises(AssertionError) as excinfo:
            cell.run(ns, derive=not doctor.after_derive)
        lines = [f.lineno for f in traceback.extract_tb(excinfo.tb) if f.filename == cell.filename]
        assert lines, "the AssertionError came from outside the check cell"
        failed = cell.assert_at(lines[-1])
        assert failed is not None and doctor.fails_at in failed, (
            f"doctoring {doctor.claim!r} failed another assert than intended:\n{failed}\n(intended: {doctor.fails_at!r})")

    @pytest.mark.parametrize("number", [n for n in numbers if n in LABS])
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

    return test_check_passes, test_doctored_measurement_fails, test_doctors_cover_every_assert
