"""The Phase 2 artifact: engine configurations compared at one fixed p99 TTFT target.

For each configuration, :func:`~helpers.bench.search.find_max_rate` finds the highest Poisson rate whose
p99 TTFT stays under the target (each probe decided with its 95% interval); :class:`ConfigResult` keeps that
rate, the bracket that bounds it (the lowest rate that did not pass), the passing run's p99 TTFT with its
bootstrap interval, goodput at that load under the SLO, TPOT/ITL and failures, every probe's statistic,
interval and decision, and the exact commands to reproduce it. :class:`BenchmarkReport` writes
``phase2_benchmark_report.md``, ``.html`` (charts rendered offline to SVG) and ``.json``.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import artifacts
from .search import MaxRateResult
from .stats import SLO, goodput

__all__ = ["ConfigResult", "BenchmarkReport"]


def _round(x: Any, nd: int = 2) -> Any:
    return round(x, nd) if isinstance(x, float) else x


@dataclass
class ConfigResult:
    """One engine configuration's result at the fixed p99 TTFT target.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    name: str
    engine_args: dict[str, Any]
    p99_ttft_target_ms: float
    max_rate_within_slo: float | None
    first_failing_rate: float | None
    p99_ttft_ms_at_that_rate: float | None
    p99_ttft_ci_ms: tuple[float, float] | None
    goodput: float | None                 # requests/s meeting every SLO, over the steady window
    goodput_fraction: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    completed: int
    failed: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    server_command: str = ""
    bench_command: str = ""

    @classmethod
    def from_search(cls, name: str, engine_args: Mapping[str, Any], result: MaxRateResult, slo: SLO,
                    server_command: str = "", bench_command: str = "") -> "ConfigResult":
        """Build from a :class:`MaxRateResult`: the numbers come from its passing run at the found rate."""
        passing = [p for p in result.probes if p.passed and p.run is not None and p.rate == result.rate]
        run = passing[-1].run if passing else None
        s = run.summary if run else None
        gp = goodput(run, slo) if run else None
        failing = [p.rate for p in result.probes if not p.passed and (result.rate is None or p.rate > result.rate)]
        return cls(
            name=name, engine_args=dict(engine_args), p99_ttft_target_ms=result.target_ms,
            max_rate_within_slo=result.rate, first_failing_rate=min(failing) if failing else None,
            p99_ttft_ms_at_that_rate=s.ttft_ms.p99 if s else None,
            p99_ttft_ci_ms=tuple(s.ttft_ms.p99_ci) if s and s.ttft_ms.p99_ci else None,
            goodput=gp.goodput_rps if gp else None, goodput_fraction=gp.fraction_good if gp else None,
            tpot_p50_ms=s.tpot_ms.p50 if s else None, tpot_p99_ms=s.tpot_ms.p99 if s else None,
            itl_p50_ms=s.itl_ms.p50 if s else None, itl_p99_ms=s.itl_ms.p99 if s else None,
            completed=sum(p.run.summary.completed for p in result.probes if p.run),
            failed=sum(p.run.summary.failed for p in result.probes if p.run),
            probes=[{"rate": p.rate, "p99_ttft_ms": p.value_ms, "statistic": p.statistic, "value": p.value,
                     "ci": list(p.ci) if p.ci else None, "decision": p.decision, "passed": p.passed,
                     "reason": p.reason, "attempt": p.attempt, "kind": p.kind} for p in result.probes],
            server_command=server_command, bench_command=bench_command,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _verdict(configs: list[ConfigResult]) -> str:
    ranked = sorted((c for c in configs if c.max_rate_within_slo), key=lambda c: -c.max_rate_within_slo)
    if not ranked:
        return "No configuration met the p99 TTFT target even at the lowest rate tried."
    best = ranked[0]
    lines = [f"**{best.name}** sustains the highest rate within the target: {best.max_rate_within_slo:.3g} req/s "
             f"(p99 TTFT {best.p99_ttft_ms_at_that_rate:,.0f} ms, 95% CI {_ci(best.p99_ttft_ci_ms)})."]
    for other in ranked[1:] + [c for c in configs if not c.max_rate_within_slo]:
        if other.max_rate_within_slo is None:
            lines.append(f"{other.name} failed the target at every rate tried.")
            continue
        # The search brackets each answer: it passed at max_rate and failed at first_failing_rate. Two
        # configurations really differ when one passed at a rate where the other had already failed.
        separated = other.first_failing_rate is not None and best.max_rate_within_slo >= other.first_failing_rate
        lines.append(
            f"{other.name}: {other.max_rate_within_slo:.3g} req/s (failed at "
            f"{format(other.first_failing_rate, '.3g') if other.first_failing_rate else 'no rate tried'}) — "
            + ("a real difference: the winner passed at a rate where this one had already failed."
               if separated else "the search brackets overlap, so this run cannot separate the two; "
                                 "more requests per probe (or a finer search) would."))
    # The target holds p99 TTFT only. A configuration that admits every request keeps TTFT low by slowing
    # everyone's decode, so the rate it "sustains" can carry less goodput (requests meeting every SLO).
    most = max((c for c in ranked if c.goodput is not None), key=lambda c: c.goodput, default=None)
    if most is not None and best.goodput is not None and most is not best and most.goodput > best.goodput:
        lines.append(
            f"But goodput disagrees: at its rate only {best.goodput_fraction:.0%} of **{best.name}**'s requests met "
            f"every SLO ({best.goodput:.2f} req/s), while **{most.name}** delivered {most.goodput:.2f} req/s "
            f"({most.goodput_fraction:.0%}). A p99 TTFT target alone rewards admitting everything and slowing decode; "
            "add the TPOT SLO to the target if users feel the decode speed.")
    return "\n".join(f"- {ln}" for ln in lines)


def _probe_line(p: dict[str, Any], f: Any) -> str:
    decision = p.get("decision") or ("pass" if p["passed"] else "fail")
    ci = p.get("ci")
    interval = f" [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else ""
    verdict = "pass" if decision == "pass" else decision.upper()
    line = f"{p['rate']:.3g} req/s -> p99 {f(p['p99_ttft_ms'])} ms{interval} {verdict}"
    return line + (f" ({p['reason']})" if decision != "pass" and p.get("reason") else "")


def _ci(ci: tuple[float, float] | None) -> str:
    return f"[{ci[0]:,.0f}, {ci[1]:,.0f}] ms" if ci else "n/a"


#: How each field of the Phase 2 benchmark report is known (see :func:`helpers.artifacts.check_basis`).
REPORT_BASIS = {
    "title": "no numbers", "p99_ttft_target_ms": "input", "slo": "input", "workload": "input",
    "hardware": "no numbers", "versions": "no numbers", "python": "no numbers", "notes": "no numbers",
    "verdict": "measured: read from the configurations' searches", "configs": "measured: each configuration's "
    "rate search in this run (its probes' records are in the run folder)",
}

@dataclass
class BenchmarkReport:
    """Several :class:`ConfigResult` at one target, with the hardware, versions and workload.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    title: str
    p99_ttft_target_ms: float
    slo: dict[str, Any]
    workload: dict[str, Any]
    hardware: str
    versions: dict[str, str]
    configs: list[ConfigResult]
    notes: str = ""

    @property
    def verdict(self) -> str:
        return _verdict(self.configs)

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "p99_ttft_target_ms": self.p99_ttft_target_ms, "slo": self.slo,
                "workload": self.workload, "hardware": self.hardware, "versions": self.versions,
                "python": platform.python_version(), "notes": self.notes, "verdict": self.verdict,
                "configs": [c.as_dict() for c in self.configs]}

    def to_markdown(self) -> str:
        head = [f"# {self.title}", "",
                f"- p99 TTFT target: **{self.p99_ttft_target_ms:,.0f} ms**; goodput SLO: "
                + ", ".join(f"{k} {v:,.0f} ms" for k, v in self.slo.items() if v is not None),
                f"- workload: " + ", ".join(f"{k} {v}" for k, v in self.workload.items()),
                f"- hardware: {self.hardware}",
                f"- versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items())]
        if self.notes:
            head.append(f"- notes: {self.notes}")
        table = ["", "| configuration | max rate within target (req/s) | failed at | p99 TTFT there (ms) | 95% CI | "
                 "goodput (req/s) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | completed / failed |",
                 "|---|---:|---:|---:|---|---:|---|---|---|"]
        f = lambda x, spec=",.0f": "n/a" if x is None else format(x, spec)  # noqa: E731
        for c in self.configs:
            table.append(
                f"| {c.name} | {f(c.max_rate_within_slo, '.3g')} | {f(c.first_failing_rate, '.3g')} | "
                f"{f(c.p99_ttft_ms_at_that_rate)} | {_ci(c.p99_ttft_ci_ms)} | {f(c.goodput, '.2f')} | "
                f"{f(c.tpot_p50_ms, '.1f')} / {f(c.tpot_p99_ms, '.1f')} | {f(c.itl_p50_ms, '.1f')} / "
                f"{f(c.itl_p99_ms, '.1f')} | {c.completed} / {c.failed} |")
        verdict = ["", "## Verdict", "", self.verdict]
        repro = ["", "## Reproduce", ""]
        for c in self.configs:
            repro += [f"**{c.name}** (`{json.dumps(c.engine_args)}`)", "", "```bash", c.server_command,
                      c.bench_command, "```", ""]
        probes = ["## Search, run by run", ""]
        for c in self.configs:
            probes.append(f"- {c.name}: " + "; ".join(_probe_line(p, f) for p in c.probes))
        return "\n".join(head + table + verdict + repro + probes) + "\n"

    def write(self, directory: str | Path, charts: Mapping[str, Any] | None = None,
              stem: str = "phase2_benchmark_report", provenance: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write ``<stem>.md``, ``.json`` and ``.html`` (charts as PNGs, no network needed); returns the paths
        (see :func:`helpers.artifacts.write`)."""
        return artifacts.write(directory, stem, title=self.title, markdown=self.to_markdown(), data=self.as_dict(),
                               basis=REPORT_BASIS,
                               charts=charts, provenance=provenance)
