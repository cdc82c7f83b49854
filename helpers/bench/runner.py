"""Running a benchmark: send a workload under an arrival process, record every request, summarize.

``run(...)`` works the same from a notebook cell (where an event loop is already running) and from the CLI: the
harness always runs its own asyncio loop in a dedicated thread, while the calling thread shows a progress bar.
With an output folder (:class:`~helpers.bench.store.RunFolder`), every finished request is appended to
``requests.jsonl`` at once (a crash loses nothing finished), ``config.json`` is written first and
``summary.json`` last. Warmup requests go to ``warmup.jsonl`` and count nowhere.

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
import shlex
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from .. import metrics as _metrics
from .. import provenance, settings
from ..metrics import ServerView
from .arrivals import Arrivals, Synchronous
from .client import ClientConfig, make_session, send
from .records import Request, RequestResult, Timings
from .stats import SLO, metric_values, summarize
from .store import RunFolder, RunResult
from .workloads import Workload, WorkloadSpec

__all__ = ["run", "reconcile", "Target", "target_of", "in_notebook"]

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


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
class Target:
    """Where a benchmark sends: the OpenAI base URL, the served model, its key, and what the server loaded.

    ``model_path`` is the folder or hub id the server loaded (``/v1/models``' ``root``): the tokenizer that
    counts this server's tokens. ``max_model_len`` bounds prompt + output.

    Introduced in lab 02 (Prefill and Decode).
    """

    base_url: str
    model: str
    api_key: str | None = None
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
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{url}/models", headers=headers, timeout=10.0)
        r.raise_for_status()
        cards = r.json().get("data", [])
    except (httpx.HTTPError, ValueError) as e:
        raise RuntimeError(f"could not ask {url}/models which model it serves ({e}). Is the server up at that "
                           "address?") from e
    if not cards:
        raise RuntimeError(f"{url}/models lists no model")
    card = next((c for c in cards if model in (None, c.get("id"))), None)
    if card is None:
        raise RuntimeError(f"{url} does not serve {model!r}; it serves {', '.join(c['id'] for c in cards)}")
    path = getattr(server, "model_path", None) or card.get("root") or card.get("id")
    return Target(base_url=url, model=card["id"], api_key=api_key, model_path=path,
                  max_model_len=card.get("max_model_len"))


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


# ------------------------------------------------------------------------------------- harness
class _Harness:
    """The asyncio side of a run, living in its own thread and loop."""

    def __init__(self, requests: list[Request], warmup: list[Request], arrivals: Arrivals, cfg: ClientConfig,
                 folder: RunFolder | None, server_metrics: bool, sample_interval_s: float):
        self.requests, self.warmup, self.arrivals, self.cfg = requests, warmup, arrivals, cfg
        self.folder = folder
        self.server_metrics, self.sample_interval_s = server_metrics, sample_interval_s
        self.records: list[RequestResult] = []
        self.warmup_records: list[RequestResult] = []
        self.done = 0
        self.failed = 0
        self.in_flight = 0
        self.phase = "starting"
        self.lags: list[float] = []
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.before: _metrics.Snapshot | None = None
        self.after: _metrics.Snapshot | None = None
        self.metrics_note: str | None = None
        self.gauges: list[dict[str, float]] = []
        self.server_version: str | None = None
        self.perf_anchor = time.perf_counter()
        self.wall_anchor = time.time()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None

    # -- thread plumbing -----------------------------------------------------------------------
    def start(self) -> threading.Thread:
        th = threading.Thread(target=self._thread_main, name="bench-harness", daemon=True)
        th.start()
        return th

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            self.error = e

    def cancel(self) -> None:
        if self._loop is not None and self._main is not None:
            self._loop.call_soon_threadsafe(self._main.cancel)

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        try:
            async with make_session() as session:
                await self._version(session)
                if self.warmup:
                    self.phase = "warmup"
                    await self._closed(session, self.warmup, max(1, min(len(self.warmup), self._concurrency())),
                                       warm=True)
                await self._scrape_before()
                sampler = None
                if self.before is not None:
                    gauges = [g for g in GAUGES if self.before.has(g)] or list(GAUGES)
                    if not self.before.has("vllm:kv_cache_usage_perc") and self.before.has("vllm:gpu_cache_usage_perc"):
                        gauges.append("vllm:gpu_cache_usage_perc")  # older vLLM
                    sampler = _metrics.Sampler(self.cfg.base_url, gauges, self.sample_interval_s,
                                               self.cfg.api_key).start()
                self.phase = "measuring"
                lag_task = asyncio.create_task(self._lag_monitor())
                cpu0, wall0 = time.thread_time(), time.perf_counter()
                try:
                    if self.arrivals.open_loop:
                        await self._open(session, self.requests, getattr(self.arrivals, "max_in_flight", None))
                    else:
                        await self._closed(session, self.requests, self._concurrency())
                finally:
                    self.cpu_s, self.wall_s = time.thread_time() - cpu0, time.perf_counter() - wall0
                    lag_task.cancel()
                    if sampler is not None:
                        await asyncio.to_thread(sampler.stop)
                        self.gauges = list(sampler.rows)
                self.phase = "finishing"
                if self.before is not None:
                    try:
                        self.after = await asyncio.to_thread(_metrics.scrape, self.cfg.base_url, 10.0, self.cfg.api_key)
                    except _metrics.MetricsUnavailable as e:
                        self.metrics_note = f"/metrics failed after the run: {e}"
        finally:
            if self.folder is not None:
                self.folder.close()

    def _concurrency(self) -> int:
        return int(getattr(self.arrivals, "concurrency", None) or 8)

    async def _version(self, session) -> None:
        import aiohttp

        root = _metrics.server_root(self.cfg.base_url)
        with contextlib.suppress(Exception):
            async with session.get(f"{root}/version", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    self.server_version = (await resp.json(content_type=None)).get("version")

    async def _scrape_before(self) -> None:
        if not self.server_metrics:
            self.metrics_note = "server metrics not requested (server_metrics=False)"
            return
        try:
            self.before = await asyncio.to_thread(_metrics.scrape, self.cfg.base_url, 10.0, self.cfg.api_key)
        except _metrics.MetricsUnavailable as e:
            self.metrics_note = f"no server metrics ({e}); the run went on without them"

    async def _lag_monitor(self, interval: float = 0.01) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(interval)
            self.lags.append(time.perf_counter() - t - interval)

    # -- dispatch ------------------------------------------------------------------------------
    async def _one(self, session, req: Request, t_sched: float, sem: asyncio.Semaphore | None = None,
                   warm: bool = False) -> None:
        self.in_flight += 1
        try:
            if sem is not None:
                async with sem:
                    res = await self._send(session, req, t_sched)
            else:
                res = await self._send(session, req, t_sched)
        finally:
            self.in_flight -= 1
        self._finish(res, warm)

    async def _send(self, session, req: Request, t_sched: float) -> RequestResult:
        try:
            return await send(session, req, self.cfg, t_sched, self.perf_anchor, self.wall_anchor)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a client bug must not make a request vanish
            now = time.perf_counter()
            return RequestResult(id=req.id, timings=Timings(t_scheduled=t_sched, t_dispatched=now, t_end=now,
                                                            perf_anchor=self.perf_anchor,
                                                            wall_anchor=self.wall_anchor),
                                 endpoint=req.endpoint, error=f"client error: {type(e).__name__}: {e}",
                                 expected_input_tokens=req.expected_input_tokens,
                                 max_output_tokens=req.max_output_tokens, min_output_tokens=req.min_output_tokens,
                                 warmup=req.warmup)

    def _finish(self, res: RequestResult, warm: bool) -> None:
        if self.folder is not None:
            self.folder.record(res, warmup=warm)
        if warm:
            self.warmup_records.append(res)
            return
        self.records.append(res)
        self.done += 1
        if not res.ok:
            self.failed += 1

    async def _closed(self, session, reqs: list[Request], concurrency: int, warm: bool = False) -> None:
        it = iter(reqs)

        async def worker() -> None:
            for req in it:
                await self._one(session, req, time.perf_counter(), warm=warm)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(reqs)))))

    async def _open(self, session, reqs: list[Request], cap: int | None) -> None:
        sem = asyncio.Semaphore(cap) if cap else None
        t0 = time.perf_counter()
        tasks = []
        try:
            for req in reqs:
                t_sched = t0 + float(req.send_offset_s or 0.0)
                delay = t_sched - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._one(session, req, t_sched, sem)))
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise


# ------------------------------------------------------------------------------------------ run
def _materialize(workload: Workload | WorkloadSpec, num_requests: int | None, seed: int, warmup: int | None,
                 tokenizer: str | None) -> Workload:
    if isinstance(workload, WorkloadSpec):
        if not num_requests:
            raise ValueError("give num_requests= to build the workload from its spec")
        return workload.build(num_requests, seed=seed, warmup=warmup or 0, tokenizer=tokenizer)
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a Workload or a WorkloadSpec (FixedLength, SharedPrefix, FromJsonl), "
                        f"got {type(workload).__name__}")
    wl = workload.head(num_requests) if num_requests else workload
    if warmup is not None:
        if warmup > len(wl.warmup):
            raise ValueError(f"warmup={warmup} but the workload holds {len(wl.warmup)} warmup requests; build it "
                             f"with spec.build(n, warmup={warmup})")
        wl = Workload(wl.endpoint, wl.requests, wl.warmup[:warmup], wl.spec)
    return wl


def _default_out(arrivals: Arrivals) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return settings.runs_dir() / "bench" / f"{stamp}-{arrivals.name}-{uuid.uuid4().hex[:4]}"


def _command(cfg: dict[str, Any], spec: Any, arrivals: Arrivals) -> str | None:
    wl_args = spec.cli_args() if isinstance(spec, WorkloadSpec) else None
    if wl_args is None:
        return None
    args = ["python", "-m", "helpers.bench", "run", "--base-url", cfg["base_url"], "--model", str(cfg["model"]),
            *wl_args, *arrivals.cli_args(), "--num-requests", str(cfg["num_requests"]),
            "--warmup", str(cfg["warmup"]), "--seed", str(cfg["seed"])]
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
    def __init__(self, enabled: bool, total: int, desc: str, leave: bool):
        self.bar = None
        if enabled:
            with contextlib.suppress(ImportError):
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="req", leave=leave)

    def update(self, h: _Harness) -> None:
        if self.bar is None:
            return
        if h.done > self.bar.n:
            self.bar.update(h.done - self.bar.n)
        self.bar.set_postfix_str(f"{h.phase}, in flight {h.in_flight}, failed {h.failed}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(
    workload: Workload | WorkloadSpec,
    arrivals: Arrivals | None = None,
    *,
    base_url: Any,
    model: str | None = None,
    num_requests: int | None = None,
    warmup: int | None = None,
    seed: int = 0,
    out: str | Path | None | bool = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    temperature: float = 0.0,
    vllm_extras: bool = True,
    extra_body: dict[str, Any] | None = None,
    slo: SLO | None = None,
    server_metrics: bool = True,
    sample_interval_s: float = 0.5,
    progress: bool | None = None,
    label: str | None = None,
    command: str | None = None,
) -> RunResult:
    """Benchmark a server: send ``workload`` under ``arrivals`` (default synchronous) and summarize.

    ``base_url`` is a :class:`helpers.server.Server` or the OpenAI base URL ending in ``/v1``; ``model`` the
    served name (default: what the server lists). A :class:`WorkloadSpec` is built with ``num_requests``,
    ``seed`` and ``warmup`` — and, unless it names its own, with *the served model's tokenizer*, so prompt lengths
    are exact for that model. A built :class:`Workload` is sent as it is. Warmup requests (prompts disjoint from
    the measured ones) run first, closed-loop, and count nowhere. ``slo`` adds goodput to the summary.

    ``out``: the results folder; ``True`` for a new one under ``runs/bench/``; ``False`` to write nothing. The
    default is nothing in a notebook (the result is in memory) and a new folder from a script. ``progress``
    defaults to a bar in a notebook (it disappears when the run ends). Works in a notebook cell and in a script
    alike; Ctrl-C / interrupting the kernel stops the run, keeps what finished on disk, and re-raises.

    Introduced in lab 02 (Prefill and Decode).
    """
    arrivals = arrivals or Synchronous()
    notebook = in_notebook()
    target = target_of(base_url, model=model, api_key=api_key)
    wl = _materialize(workload, num_requests, seed, warmup, target.model_path)
    longest = max((r.expected_input_tokens or 0) + r.max_output_tokens for r in [*wl.requests, *wl.warmup]) \
        if wl.requests else 0
    if target.max_model_len and longest > target.max_model_len:
        raise ValueError(f"the workload's longest request needs {longest:,} tokens (prompt + output) but the server's "
                         f"max_model_len is {target.max_model_len:,}: shorten it, or serve a longer context")
    offsets = arrivals.offsets(len(wl.requests)) if arrivals.open_loop else None
    reqs = [r.with_offset(o) for r, o in zip(wl.requests, offsets)] if offsets is not None else list(wl.requests)
    if out is None:
        out = not notebook
    out_dir = None if out is False else (_default_out(arrivals) if out is True else Path(out))
    folder = RunFolder(out_dir) if out_dir is not None else None
    cfg = ClientConfig(base_url=target.base_url, model=target.model, api_key=target.api_key,
                       temperature=temperature, timeout_s=timeout_s, vllm_extras=vllm_extras,
                       extra_body=dict(extra_body or {}))
    spec = workload if isinstance(workload, WorkloadSpec) else None
    config: dict[str, Any] = {
        "tool": "helpers.bench", "status": "running", "label": label,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "base_url": target.base_url, "model": target.model, "model_path": target.model_path,
        "endpoint": wl.endpoint, "arrivals": arrivals.as_dict(), "arrivals_description": arrivals.describe(),
        "workload": wl.spec or (spec.as_dict() if spec else {}),
        "num_requests": len(wl.requests), "warmup": len(wl.warmup), "seed": seed,
        "out": str(out_dir) if out_dir else None, "timeout_s": timeout_s, "temperature": temperature,
        "vllm_extras": vllm_extras, "extra_body": extra_body or {}, "slo": slo.as_dict() if slo else None,
        "server_metrics": server_metrics, "sample_interval_s": sample_interval_s,
        "api_key_set": bool(target.api_key), "argv": command,
    }
    h = _Harness(reqs, list(wl.warmup), arrivals, cfg, folder, server_metrics, sample_interval_s)
    config["anchor"] = {"perf_counter": h.perf_anchor, "wall": h.wall_anchor}
    config["versions"] = provenance.versions()
    config["command"] = command or _command(config, spec, arrivals)
    if folder is not None:
        folder.config(config)

    bar = _Progress(notebook if progress is None else progress, len(reqs), label or arrivals.describe(),
                    leave=not notebook)
    # A full garbage collection of a big heap (a notebook with torch and transformers loaded holds millions of
    # objects) stops every thread for ~100 ms: freeze what exists, so only the run's own objects are ever scanned.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    th = h.start()
    interrupted = False
    try:
        while th.is_alive():
            th.join(timeout=0.2)
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

    config["versions"]["server"] = h.server_version
    config["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    config["status"] = "interrupted" if interrupted else "complete"
    if config["command"] is None:
        config["command_note"] = ("the workload was a Workload built in Python, which the CLI cannot express: "
                                  "rebuild it and call bench.run with the parameters above")
    order = {r.id: i for i, r in enumerate(reqs)}
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
        if server_metrics:
            summary.warnings.append(f"server metrics: {note}")
    summary.client = _client_report(h, len(records))
    if summary.client.get("warning"):
        summary.warnings.append(summary.client["warning"])
    if interrupted:
        summary.warnings.append(f"interrupted: {len(records)} of {len(reqs)} requests finished")
    result = RunResult(records=records, summary=summary, config=config, warmup_records=h.warmup_records,
                       gauges=gauges, out_dir=out_dir)
    if folder is not None:
        folder.finish(summary, config, gauges)
    if interrupted:
        raise KeyboardInterrupt(f"benchmark interrupted; {len(records)} finished requests are in {out_dir}")
    return result


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


def _client_report(h: _Harness, n: int) -> dict[str, Any]:
    import numpy as np

    lags = np.asarray(h.lags) * 1000.0 if h.lags else np.zeros(0)
    rep: dict[str, Any] = {
        "cpu_s": h.cpu_s, "wall_s": h.wall_s,
        "cpu_per_request_ms": h.cpu_s / n * 1000.0 if n else None,
        "cpu_utilization": h.cpu_s / h.wall_s if h.wall_s else None,
        "loop_lag_p50_ms": float(np.percentile(lags, 50)) if lags.size else None,
        "loop_lag_p99_ms": float(np.percentile(lags, 99)) if lags.size else None,
        "loop_lag_max_ms": float(lags.max()) if lags.size else None,
    }
    if lags.size and rep["loop_lag_p99_ms"] > 10.0:
        cpu = rep["cpu_utilization"] or 0.0
        why = (f"the client itself was busy ({cpu:.0%} of a core): lower the load or use more client processes"
               if cpu > 0.5 else
               f"the client used only {cpu:.0%} of a core, so the machine was busy with something else (a server "
               "on the same cores?)")
        rep["warning"] = (f"the client's event loop lagged (p99 {rep['loop_lag_p99_ms']:.1f} ms): latencies include "
                          f"client delay; {why}")
    return rep
