"""A run's folder: what a benchmark writes as it goes, and reading it back.

::

    OUT/config.json      every parameter, versions, the command that reproduces the run (written first, then
                         completed at the end)
    OUT/requests.jsonl   one record per measured request, appended the moment it finishes (a crash loses
                         nothing that finished)
    OUT/warmup.jsonl     the warmup requests (they count nowhere)
    OUT/gauges.jsonl     the server's gauges sampled during the run
    OUT/summary.json     the summary (written last)

:class:`RunResult` is a run in memory; :func:`load_run` rebuilds one from a folder and recomputes its summary
from the saved records, so a run can be judged against a new SLO without running it again (:func:`goodput`).

Introduced in lab 02 (Prefill and Decode).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..metrics import ServerView
from .records import RequestResult
from .stats import SLO, Comparison, Goodput, Summary, metric_values, summarize
from .stats import compare as _compare
from .stats import goodput as _goodput

__all__ = ["RunResult", "RunFolder", "load_run", "records_of", "goodput", "compare", "write_json", "slo_from"]

FILES = ("config.json", "requests.jsonl", "warmup.jsonl", "gauges.jsonl", "summary.json")


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o):
        return o.as_dict() if hasattr(o, "as_dict") else dataclasses.asdict(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically (a temporary file renamed over ``path``).

    Introduced in lab 02 (Prefill and Decode).
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def slo_from(d: Any) -> SLO | None:
    """An :class:`SLO` from an SLO or its dict (``None`` when nothing is bounded).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    if isinstance(d, SLO):
        return d
    if isinstance(d, dict) and any(v is not None for v in d.values()):
        return SLO(**{k: d.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")})
    return None


class RunFolder:
    """Writes a run's folder as the run goes: the config first, each record as it finishes, the summary last.

    Introduced in lab 02 (Prefill and Decode).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            (self.path / name).unlink(missing_ok=True)
        self._fh = {name: open(self.path / name, "a", encoding="utf-8") for name in ("requests.jsonl", "warmup.jsonl")}

    def config(self, config: dict[str, Any]) -> None:
        write_json(self.path / "config.json", config)

    def record(self, res: RequestResult, warmup: bool = False) -> None:
        fh = self._fh["warmup.jsonl" if warmup else "requests.jsonl"]
        if not fh.closed:
            fh.write(json.dumps(res.to_dict(), separators=(",", ":")) + "\n")
            fh.flush()

    def finish(self, summary: Summary, config: dict[str, Any], gauges: Iterable[dict[str, Any]]) -> None:
        self.close()
        write_json(self.path / "summary.json", summary.as_dict())
        write_json(self.path / "config.json", config)
        with open(self.path / "gauges.jsonl", "w", encoding="utf-8") as fh:
            for g in gauges:
                fh.write(json.dumps(g) + "\n")

    def close(self) -> None:
        for fh in self._fh.values():
            fh.close()


@dataclass
class RunResult:
    """One run: its request records (warmup apart), summary, configuration, gauges and output folder.

    ``records`` are in workload order; ``df`` is one row per request; ``gauges`` are the server's gauges sampled
    during the run (``t`` in seconds after the first dispatch). ``valid`` is False when the load generator was the
    bottleneck (see ``summary.invalid_reason``).

    Introduced in lab 02 (Prefill and Decode).
    """

    records: list[RequestResult]
    summary: Summary
    config: dict[str, Any] = field(default_factory=dict)
    warmup_records: list[RequestResult] = field(default_factory=list)
    gauges: list[dict[str, float]] = field(default_factory=list)
    out_dir: Path | None = None

    @property
    def origin(self) -> float | None:
        """The first dispatch (``perf_counter`` seconds): time 0 of charts and of ``df``."""
        disp = [r.timings.t_dispatched for r in self.records if r.timings.t_dispatched is not None]
        return min(disp) if disp else None

    @property
    def label(self) -> str:
        return str(self.config.get("label") or self.config.get("arrivals", {}).get("arrivals", "run"))

    @property
    def valid(self) -> bool:
        """False when the client was the bottleneck: its numbers describe the client, not the server."""
        return self.summary.valid

    def reproduce_command(self, base_url: str = "http://127.0.0.1:8000/v1", out: str | None = None) -> str | None:
        """The client command that made this run, aimed at ``base_url`` and writing to ``out`` (no ``--out``:
        a rerun's records go where the CLI puts them) instead of the run's own port and folder, which a report's
        reader does not have and must not overwrite. None when the workload was built in Python (the recorded
        ``command`` is None then, and ``config["command_note"]`` says why).

        Introduced in lab 11 (Latency, Throughput, Goodput).
        """
        cmd = self.config.get("command")
        if not cmd:
            return None
        env = "VLLM_API_KEY=$VLLM_API_KEY "
        prefix, cmd = (env, cmd[len(env):]) if cmd.startswith(env) else ("", cmd)
        args, i, kept = shlex.split(cmd), 0, []
        while i < len(args):
            if args[i] in ("--base-url", "--out"):
                i += 2
                continue
            kept.append(args[i])
            i += 1
        at = kept.index("run") + 1 if "run" in kept else len(kept)
        kept[at:at] = ["--base-url", base_url] + (["--out", str(out)] if out else [])
        return prefix + " ".join(shlex.quote(a) for a in kept)

    @property
    def server(self) -> ServerView | None:
        """What the server's ``/metrics`` said about this run."""
        return self.summary.server

    @property
    def df(self):
        """A pandas DataFrame, one row per measured request (times in seconds after the first dispatch)."""
        import pandas as pd

        t0 = self.origin or 0.0
        win = self.summary.window
        slo = slo_from(self.config.get("slo"))

        def rel(t: float | None) -> float | None:
            return None if t is None else t - t0

        rows = []
        for r in self.records:
            t = r.timings
            itl = r.itl_ms
            row = {
                "id": r.id, "ok": r.ok, "http_status": r.http_status, "error": r.error,
                "input_tokens": r.input_tokens, "expected_input_tokens": r.expected_input_tokens,
                "output_tokens": r.output_tokens, "expected_output_tokens": r.expected_output_tokens,
                "ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "e2e_ms": r.e2e_ms,
                "itl_mean_ms": sum(itl) / len(itl) if itl else None,
                "itl_per_chunk_mean_ms": (sum(gaps) / len(gaps)) if (gaps := r.itl_per_chunk_ms) else None,
                "client_queue_ms": r.client_queue_ms,
                "scheduled_s": rel(t.t_scheduled), "dispatched_s": rel(t.t_dispatched),
                "first_token_s": rel(t.t_first_token), "end_s": rel(t.t_end), "chunks": len(t.chunk_times),
                "in_window": bool(win is not None and win.contains(t.t_end) and r.ok),
                "in_latency_window": bool(win is None or win.method != "steady-state"
                                          or win.contains(t.t_dispatched)),
                "tokens_exact": r.tokens_exact, "finish_reason": r.finish_reason,
            }
            if slo is not None:
                row["meets_slo"] = slo.met(r)
            rows.append(row)
        return pd.DataFrame(rows)

    def goodput(self, slo: SLO) -> Goodput:
        """Goodput of this run under ``slo`` (see :func:`helpers.bench.stats.goodput`)."""
        return _goodput(self.records, slo)

    def values(self, metric: str) -> list[float]:
        return metric_values(self.records, metric)

    def __repr__(self) -> str:
        where = f" in {self.out_dir}" if self.out_dir else ""
        return f"<RunResult {self.label}: {self.summary.completed} completed, {self.summary.failed} failed{where}>"

    def __str__(self) -> str:
        head = f"{self.config.get('arrivals_description', self.label)} against {self.config.get('base_url', '?')}"
        return head + "\n" + self.summary.table()


def _read_jsonl(path: Path) -> list[RequestResult]:
    out = []
    if not path.is_file():
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(RequestResult.from_dict(json.loads(line)))
            except (ValueError, TypeError):
                continue  # a line cut by a crash
    return out


def load_run(path: str | Path, slo: SLO | None = None, seed: int | None = None) -> RunResult:
    """Reload a run's folder and recompute its summary from the saved records.

    ``slo`` (default: the run's own) sets goodput; the server and client reports are kept as saved (they came
    from scrapes, not from the records). Works on a run that crashed or is still running.

    Introduced in lab 02 (Prefill and Decode).
    """
    d = Path(path)
    if not (d / "requests.jsonl").is_file():
        raise FileNotFoundError(f"{d} holds no requests.jsonl: not a benchmark run folder")
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    saved = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    records = _read_jsonl(d / "requests.jsonl")
    slo = slo if slo is not None else slo_from(config.get("slo"))
    summary = summarize(records, slo=slo, seed=config.get("seed", 0) if seed is None else seed)
    summary.server = ServerView.from_dict(saved.get("server"))
    summary.client = saved.get("client")
    summary.reconciliation = saved.get("reconciliation")
    # Judged when the run ended, from the client's health and the server's fate, which the records do not hold.
    if saved.get("valid") is False:
        summary.mark_invalid(saved.get("invalid_reason") or "marked invalid when it ran")
    summary.server_death = saved.get("server_death") or config.get("server_death")
    summary.warnings += [w for w in saved.get("warnings", []) if w not in summary.warnings]
    gauges = []
    if (d / "gauges.jsonl").is_file():
        gauges = [json.loads(x) for x in (d / "gauges.jsonl").read_text().splitlines() if x.strip()]
    if slo is not None:
        config = {**config, "slo": slo.as_dict()}
    return RunResult(records=records, summary=summary, config=config, warmup_records=_read_jsonl(d / "warmup.jsonl"),
                     gauges=gauges, out_dir=d)


def records_of(run: Any) -> list[RequestResult]:
    """The records of a :class:`RunResult`, a run's folder, or a list of records.

    Introduced in lab 10 (Load Testing Honestly).
    """
    if isinstance(run, (str, Path)):
        return load_run(run).records
    if hasattr(run, "records"):
        return list(run.records)
    return list(run)


def goodput(run: Any, slo: SLO) -> Goodput:
    """Goodput under ``slo`` of a run, a run's folder, or a list of records: requests meeting every set bound that
    end in the steady-state window, per second. A saved run is judged against a new SLO without running it again.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    return _goodput(records_of(run), slo)


def compare(run_a: Any, run_b: Any, metric: str = "ttft", q: float = 0.99, n_boot: int = 10000,
            seed: int = 0, whole_run: bool = False) -> Comparison:
    """Do two runs (runs, run folders or record lists) really differ in the ``q`` quantile of ``metric``? See
    :func:`helpers.bench.stats.compare` (steady-state windows by default, ``whole_run=True`` for every request).

    Introduced in lab 10 (Load Testing Honestly).
    """
    return _compare(records_of(run_a), records_of(run_b), metric, q, n_boot, seed, whole_run)
