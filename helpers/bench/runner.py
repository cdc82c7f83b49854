"""Running a benchmark: send a workload under an arrival process, record every request, summarize, judge.

``run(...)`` works the same from a notebook cell (where an event loop is already running) and from the CLI: the
harness (:class:`~helpers.bench.harness.Harness`) runs its own event loop in a dedicated thread, while the calling
thread shows a progress bar, keeps a closed loop fed and watches the server's process. With an output folder
(:class:`~helpers.bench.store.RunFolder`), every finished request is appended to ``requests.jsonl`` at once (a crash
loses nothing finished), ``config.json`` is written first and ``summary.json`` last. Warmup requests go to
``warmup.jsonl`` and count nowhere.

A run is sized in requests (``num_requests``) or in seconds (``duration_s``: open loop, rate x duration requests;
closed loop, ``C`` in flight until the time is up, then the drain). It is sent from this process (``workers=1``) or
from several (:mod:`helpers.bench.workers`; ``workers="auto"`` sizes them from the expected chunk rate, see
:func:`choose_workers`). The client's own health decides whether the run is **valid** (:mod:`helpers.bench.health`),
and a server that stops answering ends the run, saying when and why.

Server metrics: ``/metrics`` is scraped after warmup and after the run, its gauges are sampled during it, and the
summary gets the server's view (:class:`helpers.metrics.ServerView`) and its reconciliation with the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import gc
import math
import os
import shlex
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from .. import provenance, settings
from ..endpoint import Endpoint, SendsTo
from ..metrics import ServerView
from ..progress import Bar as ProgressBar
from .arrivals import Arrivals, Concurrent, ConstantRate, Synchronous
from .client import ClientConfig
from .harness import Harness, Supply
from .health import ClientLimits, client_report, judge
from .options import Recording, Sending, Size, resolve_options
from .records import Request, RequestResult
from .stats import SLO, metric_values, summarize
from .store import RunFolder, RunResult
from .workloads import FixedLength, Workload, WorkloadSpec

__all__ = ["run", "together", "stall_load", "stall_pacing", "reconcile", "Target", "target_of", "in_notebook",
           "choose_workers", "WORKER_CHUNKS_PER_S",
           "STREAM_CHUNKS_PER_S"]

#: Token-carrying chunks per second planned per sending process: about half of what one core parses.
#: benchmarks/harness_capacity.py measured the sending loop at 90-270 ms of CPU per 1,000 chunks (16-token streams,
#: uvloop, per-request costs included; fewer at higher rates, where reads batch), i.e. 4,000-8,000 chunks per
#: CPU-second; planning half of ~5,000 leaves the loop idle enough to stay punctual.
WORKER_CHUNKS_PER_S = 2500.0
#: The stated rule for a closed loop, whose rate the server sets: each stream is assumed to deliver up to this many
#: chunks per second (a fast GPU decodes about 100 tokens/s per sequence, one chunk each).
STREAM_CHUNKS_PER_S = 100.0


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where runs default to writing nothing and showing a notebook progress bar).

    Introduced in lab 02 (Prefill and Decode).
    """
    if "ipykernel" not in sys.modules:
        return False
    with contextlib.suppress(Exception):
        from IPython import get_ipython

        return get_ipython() is not None
    return False


# ---------------------------------------------------------------------------------------- target
@dataclasses.dataclass
class Target(SendsTo):
    """Where a benchmark sends (an :class:`~helpers.endpoint.Endpoint`: the OpenAI base URL, its key and the served
    model) and what the server loaded.

    ``model_path`` is the folder or hub id the server loaded (``/v1/models``' ``root``): the tokenizer that
    counts this server's tokens. ``max_model_len`` bounds prompt + output.

    Introduced in lab 02 (Prefill and Decode).
    """

    endpoint: Endpoint
    model_path: str | None = None
    max_model_len: int | None = None


def target_of(server: Any, model: str | None = None, api_key: str | None = None) -> Target:
    """A :class:`Target` from a :class:`helpers.server.Server` (or anything with ``base_url``) or a URL.

    A URL is asked ``GET /v1/models`` for the served name, what it loaded, and its ``max_model_len``.

    Introduced in lab 02 (Prefill and Decode).
    """
    if isinstance(server, Target):
        return server
    url = server if isinstance(server, str) else getattr(server, "base_url", None)
    if not url:
        raise TypeError(f"base_url must be a URL or a server (with .base_url), got {type(server).__name__}")
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        raise ValueError(f"base_url {url!r} does not end in /v1: it should be the OpenAI base URL "
                         "(e.g. http://127.0.0.1:8000/v1), or pass the server itself")
    api_key = api_key or getattr(server, "api_key", None)
    try:
        cards = Endpoint(url, api_key).models()
    except (httpx.HTTPError, ValueError) as e:
        raise RuntimeError(f"could not ask {url}/models which model it serves ({e}). Is the server up at that "
                           "address?") from e
    if not cards:
        raise RuntimeError(f"{url}/models lists no model")
    card = next((c for c in cards if model in (None, c.get("id"))), None)
    if card is None:
        raise RuntimeError(f"{url} does not serve {model!r}; it serves {', '.join(c['id'] for c in cards)}")
    path = getattr(server, "model_path", None) or card.get("root") or card.get("id")
    return Target(Endpoint(url, api_key, card["id"]), model_path=path, max_model_len=card.get("max_model_len"))


# ------------------------------------------------------------------------------ reconciliation
def reconcile(view: ServerView, records: list[RequestResult]) -> dict[str, Any]:
    """The client's view of a run next to the server's: means of TTFT, E2E, TPOT and ITL, and token totals.

    The client's TTFT includes the network and HTTP on both ends, so it is a little above the server's; the
    server's counts include failed requests, the client's token totals do not.

    Introduced in lab 10 (Load Testing Honestly).
    """
    rs = [r for r in records if not r.warmup]
    done = [r for r in rs if r.ok]

    def mean(metric: str) -> float | None:
        v = metric_values(rs, metric)
        return sum(v) / len(v) if v else None

    out: dict[str, Any] = {"client_requests": len(rs), "server_requests": view.requests}
    for m in ("ttft", "e2e", "tpot", "itl"):
        c, s = mean(m), getattr(view, f"{m}_mean_ms")
        out[f"client_{m}_mean_ms"], out[f"server_{m}_mean_ms"] = c, s
        out[f"{m}_gap_ms"] = (c - s) if c is not None and s is not None else None
    out.update(client_input_tokens=sum(r.input_tokens or 0 for r in done), server_prompt_tokens=view.prompt_tokens,
               client_output_tokens=sum(r.streamed_tokens for r in done),
               server_generation_tokens=view.generation_tokens)
    return out


# ------------------------------------------------------------------------------------ how many workers
def _cores() -> int:
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_workers(workers: int | str, arrivals: Arrivals, requests: list[Request], concurrency: int,
                   cores: int | None = None) -> tuple[int, dict[str, Any]]:
    """How many processes send, and why: ``workers`` as given, or for ``"auto"`` what the client needs.

    ``auto`` estimates the chunk rate the client must parse: open loop, the arrivals' peak rate x the mean output
    tokens asked for (one chunk per token at most); closed loop, the stated rule ``concurrency x``
    :data:`STREAM_CHUNKS_PER_S`. Then ``ceil(rate /`` :data:`WORKER_CHUNKS_PER_S` ``)``, at least 1, at most the
    cores this process may use. Returns the number and a record of the choice (it goes into the run's config).

    Introduced in lab 10 (Load Testing Honestly).
    """
    cores = cores or _cores()
    if workers != "auto":
        n = int(workers)
        if n < 1:
            raise ValueError(f"workers must be >= 1 or 'auto', got {workers!r}")
        why = f"{n} as asked" + (f" (more than the {cores} cores this process may use)" if n > cores else "")
        return n, {"requested": n, "used": n, "cores": cores, "why": why}
    out_mean = sum(r.max_output_tokens for r in requests) / len(requests) if requests else 0.0
    if arrivals.open_loop:
        rate = arrivals.peak_rate or 0.0
        chunks = rate * out_mean
        basis = f"{arrivals.describe()}: peak {rate:g} req/s x {out_mean:.0f} output tokens"
    else:
        chunks = concurrency * STREAM_CHUNKS_PER_S
        basis = f"closed loop of {concurrency}: {concurrency} streams x {STREAM_CHUNKS_PER_S:g} chunks/s each (rule)"
    need = max(1, math.ceil(chunks / WORKER_CHUNKS_PER_S))
    n = min(need, cores)
    why = (f"{basis} = {chunks:,.0f} chunks/s; {WORKER_CHUNKS_PER_S:,.0f} chunks/s per worker -> {need}"
           + (f", capped at {cores} cores" if n < need else ""))
    return n, {"requested": "auto", "used": n, "needed": need, "cores": cores, "expected_chunks_per_s": chunks,
               "why": why}


# ------------------------------------------------------------------------------------------ run
def _materialize(workload: Workload | WorkloadSpec, num_requests: int | None, seed: int, warmup: int | None,
                 tokenizer: str | None) -> Workload:
    if isinstance(workload, WorkloadSpec):
        if not num_requests:
            raise ValueError("give num_requests= or duration_s= to build the workload from its spec")
        return workload.build(num_requests, seed=seed, warmup=warmup or 0, tokenizer=tokenizer)
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload or a WorkloadSpec (FixedLength, VariableLength, SharedPrefix, "
                        f"FromJsonl, Conversations, Trace), got {type(workload).__name__}")
    wl = workload.head(num_requests) if num_requests else workload
    if warmup is not None:
        if warmup > len(wl.warmup):
            raise ValueError(f"warmup={warmup} but the workload holds {len(wl.warmup)} warmup requests; build it "
                             f"with spec.build(n, warmup={warmup})")
        wl = Workload(wl.endpoint, wl.requests, wl.warmup[:warmup], wl.spec)
    return wl


def _more_from(spec: WorkloadSpec, seed: int, tokenizer: str | None, start: int):
    """A closed loop's further requests, for a duration-sized run: chunk ``j`` is built with its own seed (fresh
    prompts), ids continue the count."""
    state = {"next": start, "chunk": 0}

    def more(k: int) -> list[Request]:
        state["chunk"] += 1
        built = spec.build(max(k, 16), seed=seed + 104_729 * state["chunk"], warmup=0, tokenizer=tokenizer).requests
        out = [dataclasses.replace(r, id=str(state["next"] + i)) for i, r in enumerate(built)]
        state["next"] += len(out)
        return out

    return more


def _default_out(arrivals: Arrivals) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return settings.runs_dir() / "bench" / f"{stamp}-{arrivals.name}-{uuid.uuid4().hex[:4]}"


def _command(cfg: dict[str, Any], spec: Any, arrivals: Arrivals) -> str | None:
    wl_args = spec.cli_args() if isinstance(spec, WorkloadSpec) else None
    arr_args = arrivals.cli_args()
    if wl_args is None or arr_args is None:
        return None
    size = (["--duration", f"{cfg['duration_s']:g}"] if cfg.get("duration_s") is not None
            else ["--num-requests", str(cfg["num_requests"])])
    args = ["python", "-m", "helpers.bench", "run", "--base-url", cfg["base_url"], "--model", str(cfg["model"]),
            *wl_args, *arr_args, *size, "--warmup", str(cfg["warmup"]), "--seed", str(cfg["seed"])]
    if cfg.get("workers", {}).get("requested", 1) != 1:
        args += ["--workers", str(cfg["workers"]["requested"])]
    if cfg.get("out"):
        args += ["--out", str(cfg["out"])]
    if cfg.get("temperature"):
        args += ["--temperature", f"{cfg['temperature']:g}"]
    if cfg.get("timeout_s") != 600.0:
        args += ["--timeout", f"{cfg['timeout_s']:g}"]
    if not cfg.get("vllm_extras", True):
        args.append("--no-vllm-extras")
    for k, v in (cfg.get("slo") or {}).items():
        if v is not None:
            args += [f"--slo-{k.removesuffix('_ms')}-ms", f"{v:g}"]
    cmd = " ".join(shlex.quote(a) for a in args)
    return ("VLLM_API_KEY=$VLLM_API_KEY " + cmd) if cfg.get("api_key_set") else cmd


class _Progress:
    """The run's bar: requests done, phase, in flight, failed (redrawn at ``progress.Bar``'s bounded rate)."""

    def __init__(self, enabled: bool, total: int | None, desc: str, leave: bool):
        self.bar = ProgressBar(total=total, desc=desc, unit="req", leave=leave, enabled=enabled)

    def update(self, h: Harness) -> None:
        self.bar.show(h.done, f"{h.phase}, in flight {h.in_flight}, failed {h.failed}")

    def close(self) -> None:
        self.bar.close()


def run(
    workload: Workload | WorkloadSpec,
    arrivals: Arrivals | None = None,
    *,
    base_url: Any,
    model: str | None = None,
    api_key: str | None = None,
    size: Size | None = None,
    sending: Sending | None = None,
    recording: Recording | None = None,
    slo: SLO | None = None,
    stop_when: Callable[[], bool] | None = None,
    **options: Any,
) -> RunResult:
    """Benchmark a server: send ``workload`` under ``arrivals`` (default synchronous) and summarize.

    ``base_url`` is a :class:`helpers.server.Server`, a :class:`Target` or the OpenAI base URL ending in ``/v1``;
    ``model`` the served name (default: what the server lists). The rest comes in three typed groups
    (:mod:`helpers.bench.options`): ``size`` (:class:`Size`: ``num_requests`` or ``duration_s``, ``warmup``,
    ``seed``), ``sending`` (:class:`Sending`: ``temperature``, ``timeout_s``, ``vllm_extras``, ``extra_body``,
    ``workers``, ``client_limits``) and ``recording`` (:class:`Recording`: ``out``, ``label``, ``command``,
    ``progress``, ``server_metrics``, ``sample_interval_s``); any of their fields may be passed by name in
    ``options`` and wins over the group's. A :class:`WorkloadSpec` is built with ``num_requests``,
    ``seed`` and ``warmup`` — and, unless it names its own, with *the served model's tokenizer*, so prompt lengths
    are exact for that model. A built :class:`Workload` is sent as it is. Warmup requests (prompts disjoint from
    the measured ones) run first, closed-loop, and count nowhere. ``slo`` adds goodput to the summary. A trace
    (:class:`~helpers.bench.traces.Trace`) brings its own arrivals.

    ``duration_s`` sizes the run in seconds instead of ``num_requests``: open loop, the requests the arrivals send in
    that time (rate x duration); closed loop, ``C`` requests in flight until it is up, then the drain.
    ``workers``: 1 sends from this process; N from N worker processes on one clock; ``"auto"`` as many as the
    expected chunk rate needs (:func:`choose_workers`; the choice is in ``config["workers"]``). A run whose client
    was the bottleneck is marked invalid (``summary.valid``; limits in ``client_limits``). A server that stops
    answering ends the run within seconds: ``config["status"]`` and ``summary.warnings`` say when and why.
    ``stop_when()``, asked a few times a second, ends the sending early when it returns true (an experiment that
    waits for an event, such as a replica joining): requests already sent finish; ``config["stopped_early"]``.

    ``out``: the results folder; ``True`` for a new one under ``runs/bench/``; ``False`` to write nothing. The
    default is nothing in a notebook (the result is in memory) and a new folder from a script. ``progress``
    defaults to a bar in a notebook (it disappears when the run ends). Works in a notebook cell and in a script
    alike; Ctrl-C / interrupting the kernel stops the run, keeps what finished on disk, and re-raises.

    Introduced in lab 02 (Prefill and Decode).
    """
    size, sending, recording = resolve_options(size, sending, recording, **options)
    duration_s, seed, out = size.duration_s, size.seed, recording.out
    if arrivals is None and isinstance(workload, WorkloadSpec):
        arrivals = workload.default_arrivals()
    arrivals = arrivals or Synchronous()
    notebook = in_notebook()
    target = target_of(base_url, model=model, api_key=api_key)
    concurrency = int(getattr(arrivals, "concurrency", None) or 8)
    closed_duration = duration_s is not None and not arrivals.open_loop
    n = size.num_requests
    if duration_s is not None:
        n = arrivals.count_for(duration_s) if arrivals.open_loop else max(4 * concurrency, 64)
        if isinstance(workload, Workload):  # a built workload is sent as far as it goes
            n = min(n, len(workload.requests)) if arrivals.open_loop else None
    wl = _materialize(workload, n, seed, size.warmup, target.model_path)
    longest = max((r.expected_input_tokens or 0) + r.max_output_tokens for r in [*wl.requests, *wl.warmup]) \
        if wl.requests else 0
    if target.max_model_len and longest > target.max_model_len:
        raise ValueError(f"the workload's longest request needs {longest:,} tokens (prompt + output) but the server's "
                         f"max_model_len is {target.max_model_len:,}: shorten it, or serve a longer context")
    offsets = arrivals.offsets(len(wl.requests)) if arrivals.open_loop else None
    reqs = [r.with_offset(o) for r, o in zip(wl.requests, offsets)] if offsets is not None else list(wl.requests)
    supply = None
    if not arrivals.open_loop:
        more = (_more_from(workload, seed, target.model_path, len(reqs))
                if closed_duration and isinstance(workload, WorkloadSpec) else None)
        supply = Supply(reqs, more)
    n_workers, workers_info = choose_workers(sending.workers, arrivals, reqs, concurrency)
    if n_workers > 1 and not arrivals.open_loop and n_workers > concurrency:
        n_workers = concurrency
        workers_info.update(used=n_workers, why=workers_info["why"] + f"; at most one per slot ({concurrency})")
    if out is None:
        out = not notebook
    out_dir = None if out is False else (_default_out(arrivals) if out is True else Path(out))
    folder = RunFolder(out_dir) if out_dir is not None else None
    cfg = ClientConfig(target.endpoint, temperature=sending.temperature, timeout_s=sending.timeout_s,
                       vllm_extras=sending.vllm_extras, extra_body=dict(sending.extra_body or {}))
    spec = workload if isinstance(workload, WorkloadSpec) else None
    config: dict[str, Any] = {
        "tool": "helpers.bench", "status": "running", "label": recording.label,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "base_url": target.base_url, "model": target.model, "model_path": target.model_path,
        "endpoint": wl.endpoint, "arrivals": arrivals.as_dict(), "arrivals_description": arrivals.describe(),
        "workload": wl.spec or (spec.as_dict() if spec else {}),
        "num_requests": None if closed_duration else len(reqs), "duration_s": duration_s,
        "warmup": len(wl.warmup), "seed": seed, "workers": workers_info,
        "out": str(out_dir) if out_dir else None, "timeout_s": sending.timeout_s,
        "temperature": sending.temperature, "vllm_extras": sending.vllm_extras,
        "extra_body": dict(sending.extra_body or {}), "slo": slo.as_dict() if slo else None,
        "server_metrics": recording.server_metrics, "sample_interval_s": recording.sample_interval_s,
        "api_key_set": bool(target.api_key), "argv": recording.command,
    }
    h = Harness(requests=reqs if arrivals.open_loop else [], supply=supply, warmup=list(wl.warmup),
                arrivals=arrivals, cfg=cfg, folder=folder, server_metrics=recording.server_metrics,
                sample_interval_s=recording.sample_interval_s, concurrency=concurrency, workers=n_workers,
                duration_s=duration_s)
    config["anchor"] = {"perf_counter": h.perf_anchor, "wall": h.wall_anchor}
    config["versions"] = provenance.versions()
    config["command"] = recording.command or _command(config, spec, arrivals)
    if folder is not None:
        folder.config(config)

    bar = _Progress(notebook if recording.progress is None else recording.progress,
                    None if closed_duration else len(reqs), recording.label or arrivals.describe(), leave=not notebook)
    watched = base_url if hasattr(base_url, "running") and not isinstance(base_url, str) else None
    # A full garbage collection of a big heap (a notebook with torch and transformers loaded holds millions of
    # objects) stops every thread for ~100 ms: freeze what exists, so only the run's own objects are ever scanned.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    th = h.start()
    interrupted = False
    try:
        while th.is_alive():
            th.join(timeout=0.1)
            h.tick(watched)
            if stop_when is not None and h.stopped_early is None and h.t0 is not None and stop_when():
                h.stop_sending("stop_when() returned true")
            bar.update(h)
    except KeyboardInterrupt:
        interrupted = True
        h.cancel()
        th.join(timeout=30)
    finally:
        if freeze:
            gc.unfreeze()
        bar.update(h)
        bar.close()
    if h.error is not None and not isinstance(h.error, asyncio.CancelledError):
        config["status"] = f"failed: {type(h.error).__name__}: {h.error}"
        if folder is not None:
            folder.config(config)
        raise h.error
    return _finish(h, config, reqs if arrivals.open_loop else (supply.given if supply else []), slo, seed, folder,
                   out_dir, interrupted, sending.client_limits)


def _finish(h: Harness, config: dict[str, Any], planned: list[Request], slo: SLO | None, seed: int,
            folder: RunFolder | None, out_dir: Path | None, interrupted: bool,
            limits: ClientLimits | None) -> RunResult:
    """The run's records in workload order, its summary, the verdict on the client and on the server's fate."""
    config["versions"]["server"] = h.server_version
    config["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    config["status"] = "interrupted" if interrupted else "complete"
    if h.stopped_early is not None:
        config["stopped_early"] = h.stopped_early
    config["start_perf_counter"] = h.t0  # the schedule's time 0 (every worker's, on the one monotonic clock)
    if config["command"] is None:
        config["command_note"] = ("the workload was a Workload built in Python, which the CLI cannot express: "
                                  "rebuild it and call bench.run with the parameters above")
    order = {r.id: i for i, r in enumerate(planned)}
    records = sorted(h.records, key=lambda r: order.get(r.id, len(order)))
    summary = summarize(records, slo=slo, seed=seed)
    origin = min((r.timings.t_dispatched for r in records if r.timings.t_dispatched is not None), default=None)
    gauges = _gauges_relative(h.gauges, h.perf_anchor, h.wall_anchor, origin)
    if h.before is not None and h.after is not None:
        summary.server = ServerView.between(h.before, h.after, h.gauges)
        summary.reconciliation = reconcile(summary.server, records)
    else:
        note = h.metrics_note or ("the run was interrupted before the closing /metrics scrape"
                                  if interrupted else "no server metrics")
        summary.server = ServerView.unavailable(note)
        if h.server_metrics:
            summary.warnings.append(f"server metrics: {note}")
    summary.client = client_report(h.health, len(records), config.get("workers"))
    if not interrupted:
        # The limits scale with the TTFT: the server's own (from /metrics) when it gives one, since a saturated
        # client inflates the TTFT it measures; else the client's median.
        view = summary.server
        reference = getattr(view, "ttft_mean_ms", None) if getattr(view, "available", False) else None
        reason = judge(h.health, reference or summary.ttft_ms.p50, limits)
        if reason is not None:
            summary.mark_invalid(f"the client was the bottleneck: {reason}")
        elif (summary.client.get("loop_lag_p99_ms") or 0.0) > 10.0:
            summary.warnings.append(f"the client's event loop lagged (p99 {summary.client['loop_lag_p99_ms']:.1f} ms), "
                                    "within the run's limits but visible in its shortest latencies")
    if h.death is not None:
        _server_death(h, summary, config, records, planned, origin)
    if h.ran_out_at is not None and h.death is None:
        summary.warnings.append(f"the workload's {len(planned)} requests ran out before duration_s: build a bigger "
                                "one (or pass a WorkloadSpec, which makes more as needed)")
    if interrupted:
        summary.warnings.append(f"interrupted: {len(records)} requests finished")
    result = RunResult(records=records, summary=summary, config=config, warmup_records=h.warmup_records,
                       gauges=gauges, out_dir=out_dir)
    if folder is not None:
        folder.finish(summary, config, gauges)
    if interrupted:
        raise KeyboardInterrupt(f"benchmark interrupted; {len(records)} finished requests are in {out_dir}")
    return result


def _server_death(h: Harness, summary: Any, config: dict[str, Any], records: list[RequestResult],
                  planned: list[Request], origin: float | None) -> None:
    t_dead, why = h.death  # type: ignore[misc]
    # Dated at the first connection failure after the last completed request, when that came before the verdict
    # (a process seen gone, or /health refused): that is when it stopped answering.
    last_ok = max((r.timings.t_end for r in records if r.ok and r.timings.t_end is not None
                   and r.timings.t_end <= t_dead), default=-math.inf)
    streak = [r.timings.t_end for r in records if not r.ok and r.connection_error and r.timings.t_end is not None
              and last_ok < r.timings.t_end <= t_dead]
    t_dead = min([t_dead, *streak])
    zero = origin if origin is not None else (h.t0 or h.perf_anchor)
    before = sum(1 for r in records if not r.ok and (r.timings.t_end or t_dead) < t_dead)
    after = sum(1 for r in records if not r.ok and (r.timings.t_end or t_dead) >= t_dead)
    last = max((r.timings.t_dispatched for r in records if r.timings.t_dispatched is not None), default=t_dead)
    not_sent = max(len(planned) - len(records), 0) if config.get("num_requests") is not None else None
    status = f"server died at t={t_dead - zero:.1f} s: {why}"
    death = {"t_s": t_dead - zero, "reason": why, "failed_before": before, "failed_with_it": after,
             "not_sent": not_sent, "last_dispatch_after_s": last - t_dead}
    config["status"] = status
    config["server_death"] = summary.server_death = death
    unsent = f"; {not_sent} never sent" if not_sent is not None else ""
    summary.warnings.append(f"{status}. Sending stopped; {after} requests failed with it (not the server's answers "
                            f"to the load), {before} failed before it{unsent}. Every record sent is kept.")


def _gauges_relative(rows: list[dict[str, float]], perf_anchor: float, wall_anchor: float,
                     origin: float | None) -> list[dict[str, float]]:
    out = []
    for row in rows:
        g = dict(row)
        perf = perf_anchor + (row["t"] - wall_anchor)
        g["t"] = perf - origin if origin is not None else perf - perf_anchor
        g["wall"] = row["t"]
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in g.items()})
    return out


def together(*runs: Callable[[], Any], delays_s: Sequence[float] = ()) -> list[Any]:
    """Several loads on the same server at once: each callable (a :func:`run` call) in its own thread, the ``i``-th
    started ``delays_s[i]`` seconds after the first; their results in order. If one raises, the others still finish
    and the first error is raised then (nothing is left sending).

    ::

        decode, prompts = bench.together(lambda: bench.run(decoders, bench.Concurrent(4), base_url=srv, ...),
                                         lambda: bench.run(long_prompts, bench.ConstantRate(0.5), base_url=srv, ...),
                                         delays_s=(0, 1.0))

    Introduced in lab 08 (Chunked Prefill).
    """
    delays = list(delays_s) + [0.0] * (len(runs) - len(delays_s))
    if len(delays) != len(runs) or any(d < 0 for d in delays):
        raise ValueError(f"{len(runs)} runs need at most {len(runs)} delays, none negative; got {list(delays_s)}")
    results: list[Any] = [None] * len(runs)
    errors: list[BaseException | None] = [None] * len(runs)
    start = time.monotonic()

    def go(i: int) -> None:
        time.sleep(max(0.0, start + delays[i] - time.monotonic()))
        try:
            results[i] = runs[i]()
        except BaseException as e:  # re-raised in the caller's thread below
            errors[i] = e

    threads = [threading.Thread(target=go, args=(i,), name=f"bench.together-{i}") for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def stall_load(target: Any, *, decoders: int, decode_output: int, long_prompt: int, long_prompts: int,
               every_s: float, lead_s: float, seed: int, decode_input: int = 64, **run_kwargs: Any) -> dict[str, Any]:
    """The traffic that makes streams stall: ``decoders`` steady streams of ``decode_output`` tokens, joined after
    ``lead_s`` by ``long_prompts`` prompts of ``long_prompt`` tokens, one every ``every_s`` seconds. Returns both
    runs, ``{"decode": ..., "prompts": ...}``: the decoders' gaps between tokens show each long prefill.

    Introduced in lab 08 (Chunked Prefill).
    """
    decode, prompts = together(
        lambda: run(FixedLength(input_len=decode_input, output_len=decode_output, endpoint="completions"),
                    Concurrent(decoders), base_url=target, num_requests=decoders, seed=seed, **run_kwargs),
        lambda: run(FixedLength(input_len=long_prompt, output_len=8, endpoint="completions"),
                    ConstantRate(1 / every_s), base_url=target, num_requests=long_prompts, seed=seed + 1, **run_kwargs),
        delays_s=(0, lead_s))
    return {"decode": decode, "prompts": prompts}


def stall_pacing(t_prefill_ms: float, t_step_ms: float, *, long_prompts: int, lead_s: float, spacing: float = 2.0,
                 max_output: int, min_every_s: float = 0.0, min_output: int = 0) -> tuple[float, int]:
    """How far apart :func:`stall_load`'s long prompts come, and how long its decoders run, from two measurements:
    a long prompt's prefill alone (``t_prefill_ms``) and a decode step of the decoders (``t_step_ms``). The prompts
    come ``spacing`` prefills apart (each is prefilled before the next arrives, so no queue between them adds to
    their TTFT); the decoders outlast the last one. Returns ``(every_s, decode_output)``, at least the floors given.

    Introduced in lab 08 (Chunked Prefill).
    """
    if t_prefill_ms <= 0 or t_step_ms <= 0:
        raise ValueError(f"a prefill ({t_prefill_ms} ms) and a decode step ({t_step_ms} ms) must be measured (> 0)")
    every_s = max(min_every_s, spacing * t_prefill_ms / 1000)
    output = max(min_output, min(max_output, math.ceil((lead_s + long_prompts * every_s) * 1000 / t_step_ms)))
    return every_s, int(output)
