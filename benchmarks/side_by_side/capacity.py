"""Client capacity: the highest chunk rate each tool sustains against the calibration server, with its TTFT error.

A load generator that cannot keep up with its own schedule, or whose event loop delays the chunks it reads,
reports latencies that belong to itself, not to the server. helpers.bench's calibration server answers on a
known schedule (first token :data:`CALIBRATION` ``ttft_s`` after receipt, then one token per chunk every
``tpot_s``) and records what it really did for every request (``stats()``: the truth). Each tool sends short
outputs at a constant request rate, stepped up (:data:`RATES`) until one of these fails:

- its mean TTFT is within :data:`TTFT_TOLERANCE` (2%) of the server's own mean TTFT for the same requests;
- it dispatched at the offered rate (within :data:`RATE_TOLERANCE`) and every request completed.

A failing step is measured once more before it counts (another process on these cores can stall the
calibration server or the client for a moment); both attempts are in the report. The highest passing step, as
output chunks per second (request rate x chunks per request), is the tool's capacity here; its TTFT error at
that step is reported next to it. A benchmark, not a unit test: the numbers belong to this machine and to
whatever else ran on it.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from helpers import artifacts

from . import tools as _tools
from .records import Load, ToolRun, mean, pct, server_under_test

__all__ = ["CALIBRATION", "RATES", "Step", "judge", "measure", "capacity", "render_markdown", "write_report"]

CALIBRATION = {"ttft_s": 0.250, "tpot_s": 0.005, "tokens_per_chunk": 1, "first_chunk_tokens": 1}
INPUT_LEN, OUTPUT_LEN = 32, 16
RATES = (10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TTFT_TOLERANCE, RATE_TOLERANCE = 0.02, 0.03
STEM = "capacity"
#: How each field of the capacity report is known (see :func:`helpers.artifacts.check_basis`).
BASIS = {"date": "no numbers", "calibration": "input", "input_len": "input", "output_len": "input", "rates": "input",
         "duration_s": "input", "ttft_tolerance": "input", "rate_tolerance": "input", "retries": "input",
         "tools": "no numbers", "versions": "no numbers", "notes": "no numbers", "elapsed_s": "measured",
         "steps": "measured: each tool's records against the calibration server's own", "capacity": "measured"}


@dataclass
class Step:
    """One tool at one offered request rate against the calibration server: what it measured and the truth."""

    tool: str
    rate: float
    requests: int
    attempt: int = 1
    completed: int = 0
    failed: int = 0
    chunks_per_request: float | None = None
    achieved_rate: float | None = None
    ttft_client_mean_ms: float | None = None
    ttft_truth_mean_ms: float | None = None
    ttft_error: float | None = None
    ttft_error_vs_configured: float | None = None
    tpot_client_mean_ms: float | None = None
    server_records: int = 0
    server_lateness_p99_ms: float | None = None
    client_cores: float | None = None
    wall_s: float | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def chunk_rate(self) -> float:
        """The offered output chunks per second: request rate x chunks per request (one token per chunk)."""
        return self.rate * (self.chunks_per_request or OUTPUT_LEN)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "chunk_rate": self.chunk_rate, "passed": self.passed}


def judge(step: Step) -> list[str]:
    """Why ``step`` does not count as sustained (empty when it does)."""
    if step.error:
        return [f"the run failed: {step.error.splitlines()[0]}"]
    problems = []
    if step.failed or step.completed < step.requests:
        problems.append(f"{step.completed} of {step.requests} requests completed")
    if step.achieved_rate is None or step.achieved_rate < (1 - RATE_TOLERANCE) * step.rate:
        problems.append(f"dispatched at {step.achieved_rate or 0:.1f} req/s, behind the offered {step.rate:g}")
    if step.ttft_error is None or abs(step.ttft_error) > TTFT_TOLERANCE:
        err = "unknown" if step.ttft_error is None else f"{step.ttft_error:+.2%}"
        problems.append(f"TTFT error {err} against the server's record (limit {TTFT_TOLERANCE:.0%})")
    return problems


def _fill(step: Step, run: ToolRun, truth: list[dict[str, Any]]) -> None:
    """The step's numbers from the tool's records and the server's (the tool's last ``requests`` ones: a request
    a tool sends before its measured ones, such as a readiness probe, is not compared)."""
    ok = [r for r in run.reqs if r.ok]
    step.completed, step.failed = len(ok), len(run.reqs) - len(ok)
    sends = sorted(r.t0_wall for r in run.reqs if r.t0_wall is not None)
    if len(sends) > 1 and sends[-1] > sends[0]:
        step.achieved_rate = (len(sends) - 1) / (sends[-1] - sends[0])
    step.chunks_per_request = mean(r.chunks for r in ok)
    step.ttft_client_mean_ms = mean(r.ttft_ms for r in ok)
    step.tpot_client_mean_ms = mean(r.tpot_ms for r in ok)
    served = [t for t in truth if t.get("status") == "ok" and t.get("ttft_s") is not None][-step.requests:]
    step.server_records = len(served)
    step.ttft_truth_mean_ms = mean(t["ttft_s"] * 1000.0 for t in served)
    step.server_lateness_p99_ms = pct([(t.get("lateness_max_s") or 0.0) * 1000.0 for t in served], 99)
    if step.ttft_client_mean_ms is not None and step.ttft_truth_mean_ms:
        step.ttft_error = step.ttft_client_mean_ms / step.ttft_truth_mean_ms - 1.0
        step.ttft_error_vs_configured = step.ttft_client_mean_ms / (CALIBRATION["ttft_s"] * 1000.0) - 1.0
    if run.cpu_in_window_s is not None and run.window_s:
        step.client_cores = run.cpu_in_window_s / run.window_s


def measure(cal: Any, tool: str, rate: float, duration_s: float, out: Path, exes: dict[str, Path],
            seed: int = 0, attempt: int = 1) -> Step:
    """``tool`` at a constant ``rate`` for ``duration_s`` seconds against the running calibration server ``cal``."""
    n = max(int(rate * duration_s), 10)
    load = Load(rate=rate, num_requests=n, input_len=INPUT_LEN, output_len=OUTPUT_LEN, seed=seed)
    target = server_under_test(cal.base_url, cal.model, cal.config.tokenizer)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cal.reset()
    run = _tools.run(tool, target, load, out, 0, exes)
    step = Step(tool=tool, rate=rate, requests=n, attempt=attempt, wall_s=run.wall_s, error=run.error)
    if run.ok:
        _fill(step, run, cal.stats().get("requests", []))
    step.problems = judge(step)
    return step


def capacity(tools: Sequence[str], out: Path, rates: Sequence[float] = RATES, duration_s: float = 8.0,
             tokenizer: str | None = None, retries: int = 1, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Step each tool's request rate through ``rates`` until it fails (:func:`judge`) ``1 + retries`` times in a
    row; write the report into ``out`` and return it. A tool's capacity is its highest passing chunk rate."""
    from helpers import models, provenance
    from helpers.bench import CalibrationServer

    out = Path(out).resolve()
    tok = tokenizer or str(models.default_model(quiet=True))
    runnable, exes, notes = _tools.prepare(tools, log)
    steps: list[Step] = []
    t0 = time.time()
    with CalibrationServer(tokenizer=tok, **CALIBRATION) as cal:
        for tool in runnable:
            for i, rate in enumerate(sorted(rates)):
                for attempt in range(1, retries + 2):
                    log(f"{_tools.LABELS[tool]} at {rate:g} req/s" + (f" (attempt {attempt})" if attempt > 1 else "")
                        + " ...")
                    s = measure(cal, tool, rate, duration_s, out / "runs" / f"{tool}-{rate:g}-{attempt}", exes,
                                seed=1000 * i + attempt, attempt=attempt)
                    steps.append(s)
                    log(f"  {'ok' if s.passed else 'FAIL'}: {s.chunk_rate:.0f} chunks/s offered, TTFT error "
                        f"{_pc(s.ttft_error)} (server {_num(s.ttft_truth_mean_ms)} ms), dispatched "
                        f"{_num(s.achieved_rate)} req/s, {s.completed}/{s.requests} done, client "
                        f"{_num(s.client_cores, '.2f')} cores" + ("" if s.passed else f": {'; '.join(s.problems)}"))
                    if s.passed:
                        break
                if not s.passed:
                    break
    best = {t: _best(steps, t) for t in runnable}
    rep = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "calibration": CALIBRATION,
           "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "rates": list(rates), "duration_s": duration_s,
           "ttft_tolerance": TTFT_TOLERANCE, "rate_tolerance": RATE_TOLERANCE, "retries": retries,
           "tools": runnable,
           "versions": _tools.versions(runnable), "notes": notes, "elapsed_s": time.time() - t0,
           "steps": [s.as_dict() for s in steps], "capacity": best}
    write_report(out, rep, provenance.provenance(model=tok))
    return rep


def _best(steps: Sequence[Step], tool: str) -> dict[str, Any]:
    mine = [s for s in steps if s.tool == tool]
    ok = [s for s in mine if s.passed]
    top = max(ok, key=lambda s: s.rate) if ok else None
    limit = mine[-1] if mine and not mine[-1].passed else None  # the step that failed every attempt
    return {"chunk_rate": top.chunk_rate if top else None, "rate": top.rate if top else None,
            "ttft_error": top.ttft_error if top else None, "client_cores": top.client_cores if top else None,
            "limited_by": "; ".join(limit.problems) if limit else "the highest rate tried passed",
            "at_least": limit is None}


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2%}"


def _num(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def render_markdown(rep: dict[str, Any]) -> str:
    """The capacity report: one line per tool (its capacity and TTFT error there), then every step."""
    cal = rep["calibration"]
    L = ["# Client capacity against the calibration server\n",
         f"{rep['date']}; calibration server: first token {cal['ttft_s'] * 1000:g} ms after receipt, then one token "
         f"every {cal['tpot_s'] * 1000:g} ms, {cal['tokens_per_chunk']} token per chunk; each request "
         f"{rep['input_len']} prompt tokens, {rep['output_len']} output tokens on /v1/completions, at a constant "
         f"rate for {rep['duration_s']:g} s per step. A step passes when the tool's mean TTFT is within "
         f"{rep['ttft_tolerance']:.0%} of the server's own record for the same requests, it dispatched within "
         f"{rep['rate_tolerance']:.0%} of the offered rate, and every request completed; a failing step is measured "
         f"{rep['retries']} more time(s) before it counts. Versions: "
         + ", ".join(f"{k} {v}" for k, v in rep["versions"].items() if v) + ".\n"]
    L += [f"> **Note**: {n}\n" for n in rep["notes"]]
    L += ["## Capacity per tool\n", "| tool | highest chunk rate sustained (chunks/s) | request rate (req/s) | "
          "TTFT error there | client CPU there (cores) | what stopped it |", "|---|---|---|---|---|---|"]
    for t in rep["tools"]:
        b = rep["capacity"][t]
        cr = "none of the rates tried" if b["chunk_rate"] is None else \
            f"{'at least ' if b['at_least'] else ''}{b['chunk_rate']:.0f}"
        L.append(f"| {_tools.LABELS[t]} | {cr} | {_num(b['rate'], 'g')} | {_pc(b['ttft_error'])} | "
                 f"{_num(b['client_cores'], '.2f')} | {b['limited_by']} |")
    L += ["", "## Every step\n", "| tool | req/s | attempt | chunks/s | dispatched (req/s) | completed | "
          "client TTFT (ms) | server TTFT (ms) | TTFT error | vs configured | server lateness p99 (ms) | client cores "
          "| wall (s) | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in rep["steps"]:
        L.append(f"| {_tools.LABELS[s['tool']]} | {s['rate']:g} | {s['attempt']} | {s['chunk_rate']:.0f} | "
                 f"{_num(s['achieved_rate'])} | "
                 f"{s['completed']}/{s['requests']} | {_num(s['ttft_client_mean_ms'], '.2f')} | "
                 f"{_num(s['ttft_truth_mean_ms'], '.2f')} | {_pc(s['ttft_error'])} | "
                 f"{_pc(s['ttft_error_vs_configured'])} | {_num(s['server_lateness_p99_ms'])} | "
                 f"{_num(s['client_cores'], '.2f')} | {_num(s['wall_s'], '.0f')} | "
                 + ("pass" if s["passed"] else "FAIL: " + "; ".join(s["problems"])) + " |")
    L += ["", "The server's lateness is how far behind its own schedule the calibration server sent its chunks; "
          "when it grows, the server (a Python process on the same cores) is the limit, not the client. "
          "Reproduce: `python -m benchmarks.side_by_side capacity --tools " + " ".join(rep["tools"])
          + " --rates " + " ".join(f"{r:g}" for r in rep["rates"]) + f" --duration {rep['duration_s']:g}`."]
    return "\n".join(L) + "\n"


def _chart(rep: dict[str, Any]) -> Any:
    import altair as alt
    import pandas as pd

    df = pd.DataFrame([{"tool": _tools.LABELS[s["tool"]], "chunks/s offered": s["chunk_rate"],
                        "TTFT error (%)": 100.0 * s["ttft_error"]} for s in rep["steps"]
                       if s["ttft_error"] is not None])
    if df.empty:
        return None
    band = pd.DataFrame({"y": [-100 * rep["ttft_tolerance"], 100 * rep["ttft_tolerance"]]})
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("chunks/s offered:Q", scale=alt.Scale(type="log")), y="TTFT error (%):Q", color="tool:N")
    return (lines + alt.Chart(band).mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q")).properties(width=520)


def write_report(out: Path, rep: dict[str, Any], prov: dict[str, Any] | None) -> dict[str, Any]:
    """``capacity.md``, ``.json``, ``.html`` and the chart's PNG in ``out``."""
    chart = _chart(rep)
    return artifacts.write(out, STEM, title="Client capacity against the calibration server",
                           markdown=render_markdown(rep), data=rep, basis=BASIS,
                           charts={"TTFT error against offered chunk rate": chart} if chart is not None else {},
                           provenance=prov)
