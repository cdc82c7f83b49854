"""What a running deployment exposes, gathered into one record the checklist reads.

Four sources, each optional, none of them trusted to be there:

- **the server's ``/metrics``** over a window: two scrapes with the gauges sampled between them
  (:class:`helpers.metrics.ServerView`), or, for a benchmark run, the view the run saved; with no window, the
  counters since the server started;
- **its start-up record**: the log (found from the process registry or by port in the log folder) read into a
  :class:`helpers.server.StartupInfo`, and the engine arguments vLLM printed as ``non-default args: {...}``;
- **``vllm:cache_config_info``**: block size, blocks, whether prefix caching is on, the KV dtype, as the engine
  itself reports them;
- **a benchmark run folder** (:func:`helpers.bench.load_run`): the client's latency distributions, whether the run
  was valid, how the load was offered, and the workload's shape (a shared prefix?).

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

import ast
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .. import metrics as _metrics
from .. import procs, settings
from ..bench.stats import SLO
from ..bench.store import RunResult, load_run, slo_from
from ..server.args import normalize
from ..server.startup import StartupInfo, parse_startup_log

__all__ = ["Evidence", "RunFacts", "gather", "from_snapshots", "engine_args_from_log", "find_log"]

_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
#: vLLM 0.32's scheduler defaults where the engine arguments do not say (CPU; GPUs under 70 GiB use 256 sequences).
_DEFAULT_MAX_NUM_SEQS = {"cpu": 128, "cuda": 256}


@dataclass
class RunFacts:
    """What a benchmark run folder says, in the units the checklist uses (milliseconds, requests).

    Introduced in lab 24 (Putting It All Together).
    """

    path: str | None
    valid: bool
    invalid_reason: str | None
    completed: int
    failed: int
    errors: dict[str, int]
    arrivals: str
    concurrency: int | None
    rate: float | None
    workload: dict[str, Any]
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    itl_max_ms: float | None
    running_max: float | None
    slo: SLO | None

    @property
    def one_at_a_time(self) -> bool:
        """True when the load never had more than one request in flight (synchronous, or a closed loop of one)."""
        if self.arrivals == "synchronous" or self.concurrency == 1:
            return True
        return self.running_max is not None and self.running_max <= 1 and self.completed >= 2

    @property
    def shared_prefix_tokens(self) -> int:
        """Tokens every prompt of a prefix group shares (0 when the workload has no shared prefix)."""
        w = self.workload
        if w.get("kind") != "SharedPrefix":
            return 0
        groups = int(w.get("num_prefixes") or 1)
        return int(w.get("prefix_len") or 0) if self.completed > groups else 0

    @property
    def prompt_tokens(self) -> int | None:
        w = self.workload
        if w.get("kind") == "SharedPrefix":
            return int(w.get("prefix_len", 0)) + int(w.get("suffix_len", 0))
        return int(w["input_len"]) if w.get("input_len") else None

    @classmethod
    def of(cls, run: RunResult) -> "RunFacts":
        s, cfg = run.summary, run.config
        arr = cfg.get("arrivals") or {}
        itl = s.itl_ms
        running = [g.get("vllm:num_requests_running") for g in run.gauges]
        running = [float(v) for v in running if v is not None and not (isinstance(v, float) and math.isnan(v))]
        view = s.server
        if view is not None and view.num_requests_running_max is not None:
            running.append(view.num_requests_running_max)
        return cls(path=str(run.out_dir) if run.out_dir else None, valid=s.valid, invalid_reason=s.invalid_reason,
                   completed=s.completed, failed=s.failed, errors=dict(s.errors),
                   arrivals=str(arr.get("arrivals", "unknown")), concurrency=arr.get("concurrency"),
                   rate=arr.get("rate"), workload=dict(cfg.get("workload") or {}),
                   ttft_p50_ms=s.ttft_ms.p50, ttft_p99_ms=s.ttft_ms.p99, tpot_p50_ms=s.tpot_ms.p50,
                   tpot_p99_ms=s.tpot_ms.p99, itl_p50_ms=itl.p50, itl_p99_ms=itl.p99, itl_max_ms=itl.max,
                   running_max=max(running) if running else None, slo=slo_from(cfg.get("slo")))


@dataclass
class Evidence:
    """Everything the checklist may read, each field ``None`` where its source was not available.

    ``view`` is the server's own account of the window (means from histogram deltas, gauge maxima);
    ``latency`` holds percentiles in ms with ``source`` saying whose (the run's client, or the server's
    histograms); ``window`` says what span the numbers cover.

    Introduced in lab 24 (Putting It All Together).
    """

    url: str | None = None
    reachable: bool = False
    unreachable_reason: str | None = None
    device: str | None = None
    log_path: str | None = None
    log_text: str = ""
    startup: StartupInfo | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    view: _metrics.ServerView | None = None
    window: str = ""
    latency: dict[str, Any] = field(default_factory=dict)
    run: RunFacts | None = None
    slo: SLO | None = None

    # ------------------------------------------------------------------ what the engine was told
    @property
    def max_num_seqs(self) -> int | None:
        v = self.engine_args.get("max_num_seqs")
        if v is not None:
            return int(v)
        return _DEFAULT_MAX_NUM_SEQS.get(self.device or "") if self.engine_args else None

    @property
    def max_num_batched_tokens(self) -> int | None:
        v = self.engine_args.get("max_num_batched_tokens")
        if v is None and self.startup is not None:
            v = self.startup.max_num_batched_tokens
        return int(v) if v is not None else None

    @property
    def prefix_caching(self) -> bool | None:
        """Whether the engine caches prefixes: its own report first, then the arguments (on by default in V1)."""
        if "enable_prefix_caching" in self.cache_config:
            return self.cache_config["enable_prefix_caching"] == "True"
        if "enable_prefix_caching" in self.engine_args:
            return bool(self.engine_args["enable_prefix_caching"])
        return True if self.engine_args else None

    @property
    def block_size(self) -> int | None:
        v = self.cache_config.get("block_size")
        if v not in (None, "None"):
            return int(v)
        return self.startup.block_size if self.startup else None

    @property
    def kv_cache_tokens(self) -> int | None:
        v = self.cache_config.get("kv_cache_size_tokens")
        if v not in (None, "None"):
            return int(float(v))
        return self.startup.kv_cache_tokens if self.startup else None

    @property
    def max_model_len(self) -> int | None:
        v = self.engine_args.get("max_model_len")
        if v is not None:
            return int(v)
        return self.startup.max_model_len if self.startup else None

    @property
    def prompt_tokens_per_request(self) -> float | None:
        v = self.view
        if v is None or not v.requests or v.prompt_tokens is None:
            return None
        return v.prompt_tokens / v.requests

    @property
    def longest_prompt_tokens(self) -> tuple[float, float | None] | None:
        """Where the window's longest prompt lies: more than the first number of tokens, at most the second
        (vLLM's prompt-length buckets; past the last one, ``max_model_len``). ``None`` without the histogram."""
        v = self.view
        if v is None or not v.longest_prompt_bucket:
            return None
        above, at_most = v.longest_prompt_bucket
        return above, at_most if at_most is not None else self.max_model_len

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "reachable": self.reachable, "unreachable_reason": self.unreachable_reason,
                "device": self.device, "log_path": self.log_path, "window": self.window,
                "engine_args": {k: str(v) for k, v in self.engine_args.items()},
                "view": self.view.as_dict() if self.view else None, "latency": self.latency,
                "run": None if self.run is None else {**self.run.__dict__, "slo": self.run.slo.as_dict()
                                                      if self.run.slo else None},
                "slo": self.slo.as_dict() if self.slo else None}


# --------------------------------------------------------------------------------- the log
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
#: Keys of vLLM's ``non-default args`` that are not engine arguments of the served model.
_NOT_ENGINE = {"host", "port", "model", "served_model_name", "api_key"}
#: Never kept in the evidence (it is printed, saved in reports and returned as JSON).
_SECRETS = {"api_key"}


def engine_args_from_log(log_text: str) -> dict[str, Any]:
    """The engine arguments vLLM printed at start-up (``non-default args: {...}``), as a dict (``{}`` if absent).

    Introduced in lab 24 (Putting It All Together).
    """
    for line in log_text.splitlines():
        m = _NON_DEFAULT.search(line)
        if not m:
            continue
        try:
            args = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            return {}
        return {k: v for k, v in normalize(args).items() if k not in _NOT_ENGINE}
    return {}


def find_log(url: str, started_before: float | None = None) -> Path | None:
    """The log of the vLLM server the labs started at ``url``: from the process registry, else the newest
    ``vllm-*-PORT.log`` in the log folder (a server that died leaves its log there). ``started_before`` (a Unix
    time) skips servers started after it (a port reused by a later server).

    Introduced in lab 24 (Putting It All Together).
    """
    m = re.match(r"https?://([^:/]+):(\d+)", url)
    if not m:
        return None
    host, port = m.group(1), int(m.group(2))
    for rec in procs.records("vllm"):
        if rec.port == port and (rec.host in (host, None) or procs.is_loopback(host)) and rec.log_path \
                and (started_before is None or (rec.started_at or rec.create_time) <= started_before):
            return Path(rec.log_path)
    found = []
    for p in settings.log_dir().glob(f"vllm-*-{port}.log"):
        stamp = re.search(r"-(\d{8}-\d{6})-\d+\.log$", p.name)
        t = time.mktime(time.strptime(stamp.group(1), "%Y%m%d-%H%M%S")) if stamp else p.stat().st_mtime
        if started_before is None or t <= started_before:
            found.append((t, p))
    return max(found)[1] if found else None


# ------------------------------------------------------------------------------ gathering
def _server_parts(target: Any) -> tuple[str | None, str, str | None, dict[str, Any]]:
    """(url, log text, log path, engine args) from a Server, a URL or nothing."""
    if target is None:
        return None, "", None, {}
    if hasattr(target, "base_url") and hasattr(target, "log_text"):
        args = target.engine_args if isinstance(target.engine_args, dict) else {}
        from ..runtime import resolve_engine_args

        return (_metrics.server_root(target.url), target.log_text(), str(target.log_path or "") or None,
                normalize(resolve_engine_args(dict(args))))
    url = _metrics.server_root(str(target))
    log = find_log(url)
    text = log.read_text(errors="replace") if log and log.is_file() else ""
    return url, text, str(log) if log else None, {}


def _latency_from_histograms(d: _metrics.Snapshot) -> dict[str, Any]:
    def q(quant: float, name: str) -> float | None:
        v = d.histogram_quantile(quant, name)
        return None if math.isnan(v) else v * 1000.0

    return {"source": "server histograms",
            "ttft_p99_ms": q(0.99, "vllm:time_to_first_token_seconds"),
            "tpot_p99_ms": q(0.99, "vllm:request_time_per_output_token_seconds"),
            "itl_p50_ms": q(0.50, "vllm:inter_token_latency_seconds"),
            "itl_p99_ms": q(0.99, "vllm:inter_token_latency_seconds")}


def _assemble(ev: Evidence, before: _metrics.Snapshot, after: _metrics.Snapshot | None,
              gauges: Iterable[Mapping[str, float]], window: str) -> Evidence:
    """Fill ``ev`` from scrapes: the engine's cache config, and (unless a run brought its own) the window's view."""
    ev.reachable = True
    ev.cache_config = dict(before.labels_of("vllm:cache_config_info"))
    if after is not None:
        ev.view = _metrics.ServerView.between(before, after, gauges)
        ev.window = window or "between two scrapes"
        if not ev.run:
            ev.latency = _latency_from_histograms(after.delta(before))
    elif ev.view is None:
        ev.view = _metrics.ServerView.between(_metrics.Snapshot(t=0.0), before)
        ev.window = "everything since the server started"
        ev.latency = _latency_from_histograms(before)
    return ev


def _base(url: str | None, log_text: str, log_path: str | None, args: Mapping[str, Any],
          run: str | Path | RunResult | None, slo: SLO | None, explicit_log: bool) -> Evidence:
    ev = Evidence(url=url, log_path=log_path, log_text=log_text)
    ev.engine_args = {k: v for k, v in {**engine_args_from_log(log_text), **args}.items() if k not in _SECRETS}
    if run is not None:
        result = run if isinstance(run, RunResult) else load_run(run)
        ev.run = RunFacts.of(result)
        if url is None and not explicit_log and result.config.get("base_url"):
            found = find_log(result.config["base_url"], started_before=result.config.get("anchor", {}).get("wall"))
            if found is not None and found.is_file():
                ev.log_path, ev.log_text = str(found), found.read_text(errors="replace")
                ev.engine_args = {**engine_args_from_log(ev.log_text), **ev.engine_args}
        if result.server is not None and result.server.available:
            ev.view, ev.window = result.server, f"the benchmark run {ev.run.path or ''}".strip()
        ev.latency = {"source": "the run's client", "ttft_p99_ms": ev.run.ttft_p99_ms,
                      "tpot_p99_ms": ev.run.tpot_p99_ms, "itl_p50_ms": ev.run.itl_p50_ms,
                      "itl_p99_ms": ev.run.itl_p99_ms, "itl_max_ms": ev.run.itl_max_ms}
    if ev.log_text:
        ev.startup = parse_startup_log(ev.log_text)
        ev.device = ev.startup.device
    ev.slo = slo if slo is not None else (ev.run.slo if ev.run else None)
    return ev


def from_snapshots(before: _metrics.Snapshot, after: _metrics.Snapshot | None = None,
                   gauges: Iterable[Mapping[str, float]] = (), *, log_text: str = "",
                   run: str | Path | RunResult | None = None, slo: SLO | None = None,
                   engine_args: Mapping[str, Any] | None = None, url: str | None = None,
                   window: str = "") -> Evidence:
    """Evidence from recorded scrapes (``after`` None: ``before`` holds everything since start-up), a log's text and
    a run: what :func:`gather` builds from a live server, for a record kept from one.

    Introduced in lab 24 (Putting It All Together).
    """
    ev = _base(url, log_text, None, normalize(engine_args or {}), run, slo, explicit_log=True)
    return _assemble(ev, before, after, gauges, window)


def gather(target: Any = None, *, run: str | Path | RunResult | None = None, window_s: float = 0.0,
           log: str | Path | None = None, engine_args: Mapping[str, Any] | None = None, slo: SLO | None = None,
           sample_interval_s: float = 0.5, api_key: str | None = None) -> Evidence:
    """Collect what ``target`` (a :class:`helpers.server.Server`, a URL, or ``None``) and ``run`` (a run folder or
    a :class:`RunResult`) expose.

    The window: ``window_s`` > 0 samples the live server for that long; otherwise a run's own server view (what
    ``/metrics`` said during the run), else everything since the server started. ``log`` names a server log when
    the registry and the log folder do not know it (without a server, a run's log is found by its URL);
    ``engine_args`` adds what the log does not say; ``slo`` (default: the run's) is what "too high" means.

    Introduced in lab 24 (Putting It All Together).
    """
    url, log_text, log_path, args = _server_parts(target)
    api_key = api_key or getattr(target, "api_key", None)  # a Server knows its own key (kept out of the evidence)
    if log is not None:
        log_path, log_text = str(log), Path(log).read_text(errors="replace")
    ev = _base(url, log_text, log_path, {**args, **normalize(engine_args or {})}, run, slo, explicit_log=log is not None)
    if url is None:
        ev.unreachable_reason = "no server given"
        return ev
    try:
        before = _metrics.scrape(url, api_key=api_key)
    except _metrics.MetricsUnavailable as e:
        ev.unreachable_reason = str(e)
        return ev
    if not window_s or window_s <= 0:
        return _assemble(ev, before, None, (), "")
    with _metrics.Sampler(url, _GAUGES, interval=sample_interval_s, api_key=api_key) as sampler:
        time.sleep(window_s)
    after = _metrics.scrape(url, api_key=api_key)
    return _assemble(ev, before, after, sampler.rows, f"{window_s:g} s of live traffic")
