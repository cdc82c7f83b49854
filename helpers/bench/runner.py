"""Running a benchmark: send a workload under a load profile, record every request, summarize.

``run(...)`` works the same from a notebook cell (where an event loop is already running) and from the
CLI: the harness always runs its own asyncio loop in a dedicated thread, while the calling thread shows
a progress bar. Every finished request is appended to ``OUT/requests.jsonl`` at once (a crash loses
nothing finished); ``OUT/config.json`` (every parameter, versions, the command to reproduce) is written
first and ``OUT/summary.json`` last. Warmup requests go to ``OUT/warmup.jsonl`` and count nowhere.

Server metrics: ``/metrics`` is scraped after warmup and after the run, its gauges are sampled during
it, and the summary gets a reconciliation of the client's view with the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import math
import platform
import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import metrics as _metrics
from .client import ClientConfig, list_models, make_session, send
from .profiles import LoadProfile, Poisson, Synchronous
from .records import Request, RequestResult
from .stats import SLO, Summary, goodput, metric_values, summarize
from .workloads import Workload, WorkloadSpec

__all__ = [
    "RunResult",
    "run",
    "load_run",
    "sweep",
    "SweepResult",
    "find_max_rate",
    "MaxRateResult",
    "Probe",
    "reconcile",
]

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


# ------------------------------------------------------------------------------------- results
@dataclass
class RunResult:
    """One run: its request records (warmup apart), summary, configuration, gauges and output folder.

    ``records`` are in workload order; ``df`` is one row per request; ``gauges`` are the server's
    gauges sampled during the run (``t`` in seconds after the first dispatch).

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
        return str(self.config.get("label") or self.config.get("profile", {}).get("profile", "run"))

    @property
    def df(self):
        """A pandas DataFrame, one row per measured request (times in seconds after the first dispatch)."""
        import pandas as pd

        t0 = self.origin or 0.0
        win = self.summary.window
        slo = _slo_from(self.config.get("slo"))

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
                "itl_mean_ms": sum(itl) / len(itl) if itl else None, "client_queue_ms": r.client_queue_ms,
                "scheduled_s": rel(t.t_scheduled), "dispatched_s": rel(t.t_dispatched),
                "first_token_s": rel(t.t_first_token), "end_s": rel(t.t_end), "chunks": len(t.chunk_times),
                "in_window": bool(win is not None and win.contains(t.t_end) and r.ok),
                "tokens_exact": r.tokens_exact, "finish_reason": r.finish_reason,
            }
            if slo is not None:
                row["meets_slo"] = slo.met(r)
            rows.append(row)
        return pd.DataFrame(rows)

    def goodput(self, slo: SLO):
        """Goodput of this run under ``slo`` (see :func:`helpers.bench.stats.goodput`)."""
        return goodput(self.records, slo)

    def values(self, metric: str) -> list[float]:
        return metric_values(self.records, metric)

    def __repr__(self) -> str:
        where = f" in {self.out_dir}" if self.out_dir else ""
        return f"<RunResult {self.label}: {self.summary.completed} completed, {self.summary.failed} failed{where}>"

    def __str__(self) -> str:
        head = f"{self.config.get('profile_description', self.label)} against {self.config.get('base_url', '?')}"
        return head + "\n" + self.summary.table() + _server_lines(self.summary.server)


def _server_lines(server: dict[str, Any] | None) -> str:
    if not server:
        return ""
    if not server.get("available"):
        return f"\nserver metrics: {server.get('note', 'unavailable')}"

    def f(key: str, spec: str = ".1f") -> str:
        v = server.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    return ("\nserver: TTFT mean {} ms (client {} ms), queue {} ms, prefill {} ms; max KV cache {}, max waiting {}, "
            "preemptions {}, prefix-cache hit rate {}").format(
        f("server_ttft_mean_ms"), f("client_ttft_mean_ms"), f("server_queue_mean_ms"), f("server_prefill_mean_ms"),
        f("kv_cache_usage_max", ".1%"), f("num_requests_waiting_max", ".0f"), f("preemptions", ".0f"),
        f("prefix_cache_hit_rate", ".1%"))


def _slo_from(d: Any) -> SLO | None:
    if isinstance(d, SLO):
        return d
    if isinstance(d, dict) and any(v is not None for v in d.values()):
        return SLO(**{k: d.get(k) for k in ("ttft_ms", "tpot_ms", "e2e_ms")})
    return None


# ------------------------------------------------------------------------------ reconciliation
def _nan_to_none(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def reconcile(before: _metrics.Snapshot, after: _metrics.Snapshot, gauges: Sequence[dict[str, float]],
              records: Sequence[RequestResult]) -> dict[str, Any]:
    """The client's view of a run next to the server's (``/metrics`` before and after, gauges during).

    Server means come from histogram deltas (``_sum / _count`` over the run); gauge maxima from the
    samples (a spike shorter than the sampling interval can be missed). The client's TTFT includes the
    network and HTTP on both ends, so it is a little above the server's.

    Introduced in lab 10 (Load Testing Honestly).
    """
    d = after.delta(before)
    rs = [r for r in records if not r.warmup]
    done = [r for r in rs if r.ok]

    def ms(name: str) -> float | None:
        v = _nan_to_none(d.histogram_mean(name))
        return None if v is None else v * 1000.0

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    kv_name = "vllm:kv_cache_usage_perc" if after.has("vllm:kv_cache_usage_perc") else "vllm:gpu_cache_usage_perc"

    def gmax(name: str) -> float | None:
        vals = [g[name] for g in gauges if name in g and not math.isnan(g[name])]
        vals += [v for v in (before.value(name), after.value(name)) if not math.isnan(v)]
        return max(vals) if vals else None

    queries = _nan_to_none(d.value("vllm:prefix_cache_queries_total"))
    hits = _nan_to_none(d.value("vllm:prefix_cache_hits_total"))
    out = {
        "available": True,
        "server_requests": _nan_to_none(d.value("vllm:time_to_first_token_seconds_count")),
        "client_requests": len(rs),
        "client_ttft_mean_ms": mean(metric_values(rs, "ttft")),
        "server_ttft_mean_ms": ms("vllm:time_to_first_token_seconds"),
        "client_e2e_mean_ms": mean(metric_values(rs, "e2e")),
        "server_e2e_mean_ms": ms("vllm:e2e_request_latency_seconds"),
        "client_tpot_mean_ms": mean(metric_values(rs, "tpot")),
        "server_tpot_mean_ms": ms("vllm:request_time_per_output_token_seconds"),
        "client_itl_mean_ms": mean(metric_values(rs, "itl")),
        "server_itl_mean_ms": ms("vllm:inter_token_latency_seconds"),
        "server_queue_mean_ms": ms("vllm:request_queue_time_seconds"),
        "server_prefill_mean_ms": ms("vllm:request_prefill_time_seconds"),
        "server_decode_mean_ms": ms("vllm:request_decode_time_seconds"),
        "kv_cache_usage_max": gmax(kv_name),
        "num_requests_running_max": gmax("vllm:num_requests_running"),
        "num_requests_waiting_max": gmax("vllm:num_requests_waiting"),
        "gauge_samples": len(gauges),
        "preemptions": _nan_to_none(d.value("vllm:num_preemptions_total")),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": (hits / queries) if queries and hits is not None else None,
        "server_prompt_tokens": _nan_to_none(d.value("vllm:prompt_tokens_total")),
        "client_input_tokens": sum(r.input_tokens or 0 for r in done),
        "server_generation_tokens": _nan_to_none(d.value("vllm:generation_tokens_total")),
        "client_output_tokens": sum(r.streamed_tokens for r in done),
    }
    c, s = out["client_ttft_mean_ms"], out["server_ttft_mean_ms"]
    out["ttft_gap_ms"] = (c - s) if c is not None and s is not None else None
    out["note"] = ("server numbers are deltas of /metrics between the end of warmup and the end of the run; they "
                   "include failed requests, the client's token totals do not")
    return out


# ------------------------------------------------------------------------------------- harness
class _Harness:
    """The asyncio side of a run, living in its own thread and loop."""

    def __init__(self, requests: list[Request], warmup: list[Request], profile: LoadProfile, cfg: ClientConfig,
                 out_dir: Path | None, server_metrics: bool, sample_interval_s: float, resolve_model: bool):
        self.requests, self.warmup, self.profile, self.cfg = requests, warmup, profile, cfg
        self.out_dir = out_dir
        self.server_metrics, self.sample_interval_s = server_metrics, sample_interval_s
        self.resolve_model = resolve_model
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
        self._fh = None
        self._wfh = None

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
        if self.out_dir is not None:
            self._fh = open(self.out_dir / "requests.jsonl", "a", encoding="utf-8")
            if self.warmup:
                self._wfh = open(self.out_dir / "warmup.jsonl", "a", encoding="utf-8")
        try:
            async with make_session() as session:
                await self._prepare(session)
                if self.warmup:
                    self.phase = "warmup"
                    await self._closed(session, self.warmup, max(1, min(len(self.warmup),
                                                                        self.profile_concurrency())), warm=True)
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
                    if self.profile.open_loop:
                        await self._open(session, self.requests, getattr(self.profile, "max_in_flight", None))
                    else:
                        await self._closed(session, self.requests, int(getattr(self.profile, "concurrency", 1)))
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
            for fh in (self._fh, self._wfh):
                if fh is not None:
                    fh.close()

    def profile_concurrency(self) -> int:
        return int(getattr(self.profile, "concurrency", None) or 8)

    async def _prepare(self, session) -> None:
        if self.resolve_model:
            try:
                ids = await list_models(session, self.cfg.base_url, self.cfg.api_key)
            except Exception as e:  # noqa: BLE001
                raise RuntimeError(f"could not ask {self.cfg.base_url}/models which model it serves ({e}). Is the "
                                   "server up at that address? (model=... skips this lookup)") from e
            if not ids:
                raise RuntimeError(f"{self.cfg.base_url}/models lists no model; pass model=...")
            self.cfg.model = ids[0]
        root = self.cfg.base_url.rstrip("/").removesuffix("/v1")
        with contextlib.suppress(Exception):
            import aiohttp

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
            from .records import Timings

            now = time.perf_counter()
            return RequestResult(id=req.id, timings=Timings(t_scheduled=t_sched, t_dispatched=now, t_end=now,
                                                            perf_anchor=self.perf_anchor,
                                                            wall_anchor=self.wall_anchor),
                                 endpoint=req.endpoint, error=f"client error: {type(e).__name__}: {e}",
                                 expected_input_tokens=req.expected_input_tokens,
                                 max_output_tokens=req.max_output_tokens, min_output_tokens=req.min_output_tokens,
                                 warmup=req.warmup)

    def _finish(self, res: RequestResult, warm: bool) -> None:
        line = json.dumps(res.to_dict(), separators=(",", ":")) + "\n"
        if warm:
            self.warmup_records.append(res)
            if self._wfh is not None:
                self._wfh.write(line)
                self._wfh.flush()
            return
        self.records.append(res)
        if self._fh is not None:
            self._fh.write(line)
            self._fh.flush()
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
def _materialize(workload: Workload | WorkloadSpec, num_requests: int | None, seed: int,
                 warmup: int | None) -> Workload:
    if isinstance(workload, WorkloadSpec):
        if not num_requests:
            raise ValueError("give num_requests= to build the workload from its spec")
        return workload.build(num_requests, seed=seed, warmup=warmup or 0)
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


def _versions(server_version: str | None) -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("llm-serving-labs", "aiohttp", "numpy", "pandas", "transformers", "tokenizers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    out["server"] = server_version
    return out


def _default_out(profile: LoadProfile) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / "bench" / f"{stamp}-{profile.name}-{uuid.uuid4().hex[:4]}"


def _command(cfg: dict[str, Any], spec: Any, profile: LoadProfile) -> str | None:
    wl_args = spec.cli_args() if isinstance(spec, WorkloadSpec) else None
    if wl_args is None:
        return None
    args = ["python", "-m", "helpers.bench", "run", "--base-url", cfg["base_url"], "--model", str(cfg["model"]),
            *wl_args, *profile.cli_args(), "--num-requests", str(cfg["num_requests"]),
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
    if cfg.get("api_key_set"):
        args += ["--api-key", "$API_KEY"]
    return " ".join(shlex.quote(a) if a != "$API_KEY" else a for a in args)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


class _Progress:
    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        if enabled:
            with contextlib.suppress(ImportError):
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="req", leave=True)

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
    profile: LoadProfile | None = None,
    *,
    base_url: str,
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
    progress: bool = True,
    label: str | None = None,
    command: str | None = None,
) -> RunResult:
    """Benchmark a server: send ``workload`` under ``profile`` (default synchronous) and summarize.

    ``base_url`` is the OpenAI base URL ending in ``/v1``; ``model`` the served name (default: the
    first one ``/v1/models`` lists). A :class:`WorkloadSpec` is built with ``num_requests``,
    ``seed`` and ``warmup``; a built :class:`Workload` is sent as it is. Warmup requests (prompts
    disjoint from the measured ones) run first, closed-loop, and count nowhere. ``out`` is the
    results folder (default ``runs/bench/<time>-<profile>``; ``False``: write nothing). ``slo`` adds
    goodput to the summary. Works in a notebook cell and in a script alike; Ctrl-C / interrupting the
    kernel stops the run, keeps what finished on disk, and re-raises.

    Introduced in lab 02 (Prefill and Decode).
    """
    profile = profile or Synchronous()
    if not base_url.rstrip("/").endswith("/v1"):
        import warnings

        warnings.warn(f"base_url {base_url!r} does not end in /v1: it should be the OpenAI base URL "
                      "(e.g. http://127.0.0.1:8000/v1), else every request may fail with HTTP 404", stacklevel=2)
    wl = _materialize(workload, num_requests, seed, warmup)
    offsets = profile.offsets(len(wl.requests)) if profile.open_loop else None
    reqs = [r.with_offset(o) for r, o in zip(wl.requests, offsets)] if offsets is not None else list(wl.requests)
    out_dir: Path | None = None
    if out is not False:
        out_dir = Path(out) if out not in (None, True) else _default_out(profile)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in ("requests.jsonl", "warmup.jsonl", "summary.json", "gauges.jsonl"):
            (out_dir / name).unlink(missing_ok=True)
    cfg = ClientConfig(base_url=base_url, model=model or "", api_key=api_key, temperature=temperature,
                       timeout_s=timeout_s, vllm_extras=vllm_extras, extra_body=dict(extra_body or {}))
    spec = workload if isinstance(workload, WorkloadSpec) else None
    config: dict[str, Any] = {
        "tool": "helpers.bench", "status": "running", "label": label,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "base_url": base_url, "model": model, "endpoint": wl.endpoint,
        "profile": profile.as_dict(), "profile_description": profile.describe(),
        "workload": wl.spec or (spec.as_dict() if spec else {}),
        "num_requests": len(wl.requests), "warmup": len(wl.warmup), "seed": seed,
        "out": str(out_dir) if out_dir else None, "timeout_s": timeout_s, "temperature": temperature,
        "vllm_extras": vllm_extras, "extra_body": extra_body or {}, "slo": slo.as_dict() if slo else None,
        "server_metrics": server_metrics, "sample_interval_s": sample_interval_s,
        "api_key_set": bool(api_key), "argv": None,
    }
    h = _Harness(reqs, list(wl.warmup), profile, cfg, out_dir, server_metrics, sample_interval_s,
                 resolve_model=model is None)
    config["anchor"] = {"perf_counter": h.perf_anchor, "wall": h.wall_anchor}
    config["versions"] = _versions(None)
    config["command"] = command or _command(config, spec, profile)
    if command:
        config["argv"] = command
    if out_dir is not None:
        _write_json(out_dir / "config.json", config)

    bar = _Progress(progress, len(reqs), label or profile.describe())
    # A full garbage collection of a big heap (a notebook with torch and transformers loaded holds
    # millions of objects) stops every thread for ~100 ms: freeze what exists, so only the run's own
    # objects are ever scanned, and unfreeze afterwards.
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
    if h.error is not None and not (interrupted and isinstance(h.error, asyncio.CancelledError)):
        if not isinstance(h.error, asyncio.CancelledError):
            config["status"] = f"failed: {type(h.error).__name__}: {h.error}"
            if out_dir is not None:
                _write_json(out_dir / "config.json", config)
            raise h.error

    config["model"] = cfg.model
    config["versions"] = _versions(h.server_version)
    config["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    config["status"] = "interrupted" if interrupted else "complete"
    if not command:
        config["command"] = _command(config, spec, profile)
    if config["command"] is None:
        config["command_note"] = ("the workload was a Workload built in Python, which the CLI cannot express: "
                                  "rebuild it and call bench.run with the parameters above")
    order = {r.id: i for i, r in enumerate(reqs)}
    records = sorted(h.records, key=lambda r: order.get(r.id, len(order)))
    summary = summarize(records, slo=slo, seed=seed)
    origin = min((r.timings.t_dispatched for r in records if r.timings.t_dispatched is not None), default=None)
    gauges = _gauges_relative(h.gauges, h.perf_anchor, h.wall_anchor, origin)
    if h.before is not None and h.after is not None:
        summary.server = reconcile(h.before, h.after, h.gauges, records)
    else:
        note = h.metrics_note or ("the run was interrupted before the closing /metrics scrape"
                                  if interrupted else "no server metrics")
        summary.server = {"available": False, "note": note}
        if server_metrics:
            summary.warnings.append(f"server metrics: {summary.server['note']}")
    summary.client = _client_report(h, len(records))
    if summary.client.get("warning"):
        summary.warnings.append(summary.client["warning"])
    if interrupted:
        summary.warnings.append(f"interrupted: {len(records)} of {len(reqs)} requests finished")
    result = RunResult(records=records, summary=summary, config=config, warmup_records=h.warmup_records,
                       gauges=gauges, out_dir=out_dir)
    if out_dir is not None:
        _write_json(out_dir / "summary.json", summary.as_dict())
        _write_json(out_dir / "config.json", config)
        with open(out_dir / "gauges.jsonl", "w", encoding="utf-8") as fh:
            for g in gauges:
                fh.write(json.dumps(g) + "\n")
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


# ------------------------------------------------------------------------------------- reload
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

    ``slo`` (default: the run's own) sets goodput; server and client reports are kept as saved (they
    came from scrapes, not from the records). Works on a run that crashed or is still running.

    Introduced in lab 02 (Prefill and Decode).
    """
    d = Path(path)
    if not (d / "requests.jsonl").is_file():
        raise FileNotFoundError(f"{d} holds no requests.jsonl: not a benchmark run folder")
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    saved = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    records = _read_jsonl(d / "requests.jsonl")
    slo = slo if slo is not None else _slo_from(config.get("slo"))
    summary = summarize(records, slo=slo, seed=config.get("seed", 0) if seed is None else seed)
    summary.server = saved.get("server")
    summary.client = saved.get("client")
    gauges = []
    if (d / "gauges.jsonl").is_file():
        gauges = [json.loads(x) for x in (d / "gauges.jsonl").read_text().splitlines() if x.strip()]
    if slo is not None:
        config = {**config, "slo": slo.as_dict()}
    return RunResult(records=records, summary=summary, config=config, warmup_records=_read_jsonl(d / "warmup.jsonl"),
                     gauges=gauges, out_dir=d)


# -------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepResult:
    """Runs of a sweep, in order, with one summary row per run in ``df``.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    runs: list[RunResult]
    parameter: str
    values: list[float]

    @property
    def df(self):
        import pandas as pd

        rows = []
        for v, r in zip(self.values, self.runs):
            s = r.summary
            row = {self.parameter: v, "completed": s.completed, "failed": s.failed,
                   "request_throughput": s.request_throughput, "output_throughput": s.output_throughput,
                   "achieved_rate": s.achieved_rate}
            for m in ("ttft", "tpot", "itl", "e2e", "client_queue"):
                dist = getattr(s, f"{m}_ms")
                row[f"{m}_p50_ms"], row[f"{m}_p99_ms"] = dist.p50, dist.p99
            if s.goodput is not None:
                row["goodput"] = s.goodput.goodput_rps
            rows.append(row)
        return pd.DataFrame(rows)

    def chart(self, **kwargs: Any):
        from .charts import latency_throughput

        return latency_throughput(self, **kwargs)


def sweep(
    workload: WorkloadSpec,
    *,
    rates: Sequence[float] | None = None,
    concurrencies: Sequence[int] | None = None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    min_requests: int = 20,
    seed: int = 0,
    warmup: int = 0,
    out: str | Path | None | bool = None,
    **run_kwargs: Any,
) -> SweepResult:
    """Run the same workload at several Poisson ``rates`` or closed-loop ``concurrencies``.

    Each run gets fresh prompts (seed + i), so no run warms the prefix cache for the next. Per run:
    ``num_requests``, or for rates ``max(min_requests, rate * duration_s)``. ``out`` is a parent folder
    (one subfolder per run). Other keywords go to :func:`run`.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    from .profiles import Concurrent

    if not isinstance(workload, WorkloadSpec):
        raise TypeError("sweep needs a WorkloadSpec (FixedLength, SharedPrefix, FromJsonl) so each run gets fresh "
                        "prompts; a built Workload would repeat them and hit the prefix cache")
    if (rates is None) == (concurrencies is None):
        raise ValueError("give exactly one of rates=[...] (Poisson) or concurrencies=[...] (closed loop)")
    parent = None if out is False else (Path(out) if out not in (None, True) else
                                        Path("runs") / "bench" / f"sweep-{_dt.datetime.now():%Y%m%d-%H%M%S}")
    runs: list[RunResult] = []
    values = list(rates if rates is not None else concurrencies)  # type: ignore[arg-type]
    for i, v in enumerate(values):
        if rates is not None:
            profile: LoadProfile = Poisson(float(v), seed=seed + i)
            n = num_requests or max(min_requests, int(math.ceil(float(v) * (duration_s or 30.0))))
            name = f"rate-{v:g}"
        else:
            profile = Concurrent(int(v))
            n = num_requests or max(min_requests, int(v) * 4)
            name = f"concurrency-{int(v)}"
        r = run(workload, profile, num_requests=n, seed=seed + i, warmup=warmup,
                out=False if parent is None else parent / name, label=name, **run_kwargs)
        runs.append(r)
    return SweepResult(runs=runs, parameter="rate" if rates is not None else "concurrency", values=values)


@dataclass
class Probe:
    """One run of :func:`find_max_rate`: its rate, the measured quantile, and whether it passed (and why not).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float
    value_ms: float | None
    passed: bool
    reason: str
    run: RunResult | None = None


@dataclass
class MaxRateResult:
    """The highest Poisson rate found that kept ``q`` quantile of ``metric`` within the SLO.

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """

    rate: float | None
    metric: str
    q: float
    target_ms: float
    probes: list[Probe]
    bracket: tuple[float | None, float | None]

    @property
    def df(self):
        import pandas as pd

        return pd.DataFrame([{"rate": p.rate, f"{self.metric}_p{self.q * 100:g}_ms": p.value_ms, "passed": p.passed,
                              "reason": p.reason} for p in self.probes])

    def __str__(self) -> str:
        lo, hi = self.bracket
        best = f"{self.rate:.3g} req/s" if self.rate is not None else "none (even the lowest rate failed)"
        fmt = lambda r: "none" if r is None else f"{r:.3g}"  # noqa: E731
        return (f"max rate with {self.metric} p{self.q * 100:g} <= {self.target_ms:g} ms: {best} "
                f"(passes at {fmt(lo)}, fails at {fmt(hi)}; {len(self.probes)} runs)")


def find_max_rate(
    workload: WorkloadSpec,
    slo: SLO,
    *,
    metric: str = "ttft",
    q: float = 0.99,
    start_rate: float = 1.0,
    max_rate: float | None = None,
    rel_tol: float = 0.1,
    max_runs: int = 8,
    duration_s: float = 20.0,
    min_requests: int = 30,
    max_failure_rate: float = 0.01,
    seed: int = 0,
    out: str | Path | None | bool = None,
    runner: Callable[..., RunResult] | None = None,
    **run_kwargs: Any,
) -> MaxRateResult:
    """Search the highest Poisson rate whose ``q`` quantile of ``metric`` stays within ``slo``.

    Bracketing then bisection: from ``start_rate`` double while runs pass (halve while they fail)
    until a pass and a fail bracket the answer, then bisect until the bracket is within ``rel_tol``
    of the passing rate, or ``max_runs`` runs were made. A run passes when the quantile is within the
    SLO's bound for ``metric``, at most ``max_failure_rate`` of requests failed, and the client kept
    its schedule (client queue p99 under 10% of the bound). Each run lasts about ``duration_s``
    (at least ``min_requests`` requests) with fresh prompts. ``runner`` replaces :func:`run` (for tests).

    Introduced in lab 11 (Latency, Throughput, Goodput).
    """
    m = metric.removesuffix("_ms")
    target = getattr(slo, f"{m}_ms", None)
    if target is None:
        raise ValueError(f"slo sets no bound for {m!r}: e.g. SLO({m}_ms=500)")
    runner = runner or run
    parent = None if out is False else (Path(out) if out not in (None, True) else
                                        Path("runs") / "bench" / f"maxrate-{_dt.datetime.now():%Y%m%d-%H%M%S}")
    probes: list[Probe] = []
    lo: float | None = None
    hi: float | None = None
    rate = float(start_rate)
    for i in range(max_runs):
        n = max(min_requests, int(math.ceil(rate * duration_s)))
        r = runner(workload, Poisson(rate, seed=seed + i), num_requests=n, seed=seed + i,
                   out=False if parent is None else parent / f"probe-{i}-rate-{rate:.4g}", slo=slo,
                   label=f"rate {rate:.4g}", **run_kwargs)
        s = r.summary
        dist = getattr(s, f"{m}_ms")
        value = dist.p99 if q == 0.99 else _quantile(r.records, m, q)
        reasons = []
        if value is None:
            reasons.append("no completed requests")
        elif value > target:
            reasons.append(f"p{q * 100:g} {value:.1f} ms > {target:g} ms")
        if s.failure_rate > max_failure_rate:
            reasons.append(f"{s.failure_rate:.1%} failed")
        cq = s.client_queue_ms.p99
        if cq is not None and cq > 0.1 * target:
            reasons.append(f"client fell behind its schedule (client queue p99 {cq:.1f} ms)")
        passed = not reasons
        probes.append(Probe(rate, value, passed, "; ".join(reasons) or "ok", r))
        if passed:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            if (hi - lo) / lo <= rel_tol:
                break
            rate = (lo + hi) / 2
        elif lo is not None:
            if max_rate is not None and lo >= max_rate:
                break
            rate = rate * 2 if max_rate is None else min(rate * 2, max_rate)
        else:
            rate = rate / 2
    return MaxRateResult(rate=lo, metric=m, q=q, target_ms=float(target), probes=probes, bracket=(lo, hi))


def _quantile(records: list[RequestResult], metric: str, q: float) -> float | None:
    import numpy as np

    vals = metric_values(records, metric)
    return float(np.percentile(vals, q * 100)) if vals else None
