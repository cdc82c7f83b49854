"""A vLLM server that a notebook owns: start, wait until ready, read its startup log, stop it.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from .. import metrics as _metrics
from .. import models as _models
from .. import procs, settings, support
from ..endpoint import Endpoint, Listener, http
from ..progress import Bar as ProgressBar
from ..runtime import Profile, detect, resolve_engine_args
from .args import check_engine_args, engine_cli, normalize
from .startup import StartupInfo, failure_hint, parse_startup_log

__all__ = ["Server", "start", "stop_all", "stop_owned", "list_servers", "ServerError", "ServerStartError",
           "ServerTimeout", "PortInUse", "TooManyServers", "KIND"]

#: The registry's name for vLLM servers (``procs.records(KIND)``).
KIND = "vllm"

ServerError = procs.ProcessError
ServerStartError = procs.ProcessStartError
ServerTimeout = procs.ProcessTimeout
PortInUse = procs.PortInUse
TooManyServers = procs.TooManyProcesses

_PROXY_WHY = (
    "vLLM's API key guards only the /v1 routes: /metrics, /tokenize, /detokenize, /invocations, /health and the "
    "dev routes stay open to anyone who can reach the port. Put an authenticating reverse proxy in front (one that "
    "checks every path), bind vLLM to 127.0.0.1 behind it, and pass behind_auth_proxy=True to say you did.")


def _key_digest(api_key: str | None) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""



def _slot_lock():
    """The machine's server slots: one exclusive lock held for a count and a spawn — never while waiting."""
    return settings.file_lock(settings.state_dir() / "server-slots.lock")


def _tickets() -> Path:
    return settings.state_dir() / "server-waiters"


def _take_ticket() -> Path:
    """A waiter's place in line (first come, first served): a file named by when it started waiting and its PID."""
    folder = _tickets()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns()}-{os.getpid()}-{threading.get_ident()}"
    path.touch()
    return path


def _tickets_ahead(ticket: Path | None) -> int:
    """Live waiters that started waiting before ``ticket`` (every waiter, when this process is not waiting yet).
    A ticket whose process died is removed."""
    folder, ahead = _tickets(), 0
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if ticket is not None and path.name >= ticket.name:
            break
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if psutil.pid_exists(pid):
            ahead += 1
        else:
            path.unlink(missing_ok=True)
    return ahead


class Server(Listener):
    """One vLLM OpenAI-compatible server process, owned by this Python process.

    Use :func:`start` to make one. Attributes: ``base_url`` (``http://127.0.0.1:PORT/v1``, what the openai
    client takes), ``url`` (without ``/v1``), ``pid``, ``port``, ``log_path``, ``model`` (the served name),
    ``model_path`` (what vLLM loaded: a folder or a Hugging Face id), ``startup`` (a :class:`StartupInfo`).

    The API key, if any, reaches vLLM through ``VLLM_API_KEY`` and never appears in the command line, the log,
    the registry or :meth:`command`. A host other than loopback needs ``api_key`` *and* ``behind_auth_proxy=True``
    (vLLM's key guards only ``/v1``).

    With reuse on (``LABS_REUSE_SERVER=1``), :meth:`stop` parks a healthy server for the next :func:`start` with
    the same arguments in the same ``LABS_SESSION`` (a swappable one also serves a start that is not: its extra
    routes go unused, its weights are its own again once parked). When the machine is at its limit of servers
    (``LABS_MAX_SERVERS``), ``make_room`` lets a start stop one of this session's parked servers first: one that
    a process now gone parked (an earlier notebook's) before one the running notebook parked and may come back to;
    among those, the one adopted least often, the most recently parked among equals (so a configuration many labs
    share outlives the one-off servers started between them); before any of those, a plain server whose
    configuration a swappable server of the session also serves.

    A start that writes no log line and uses no CPU in its process tree for ``stall_s`` seconds is stuck (seen
    here: a process frozen in the kernel before its first line): it is stopped and started once more, long before
    ``ready_timeout``. ``stall_s=None`` waits for the deadline.

    ``swappable=True`` lets :meth:`swap_weights` load another checkpoint of the same model into the running server
    (it turns on vLLM's development routes, so it is refused on a host other than loopback).

    Introduced in lab 01 (One GPU, One Model).
    """

    def __init__(self, model: str | os.PathLike | None = "default", *, served_model_name: str | None = None,
                 engine_args: Mapping[str, Any] | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 host: str = "127.0.0.1", port: int | None = None, api_key: str | None = None,
                 behind_auth_proxy: bool = False, log_dir: str | os.PathLike | None = None,
                 ready_timeout: float = 900.0, python: str | None = None, reuse: bool | None = None,
                 progress: bool = True, make_room: bool = True, wait_for_slot_s: float | None = None,
                 stall_s: float | None = 60.0, swappable: bool = False):
        if swappable and not procs.is_loopback(host):
            raise ValueError(f"swappable=True opens vLLM's development routes (/collective_rpc, /reset_prefix_cache) "
                             f"with no key: keep host='127.0.0.1', not {host!r}.")
        if not procs.is_loopback(host):
            if not api_key:
                raise ValueError(f"host={host!r} exposes the server beyond this machine: pass api_key=... so that "
                                 "/v1 needs it, or keep the default host='127.0.0.1'.")
            if not behind_auth_proxy:
                raise ValueError(f"host={host!r} with an API key is still not closed. {_PROXY_WHY}")
        machine = detect()
        if isinstance(engine_args, Mapping):
            engine_args = normalize(engine_args)
            check_engine_args(engine_args, machine.device, machine.gpus[0] if machine.gpus else None)
            kv = engine_args.get("kv_cache_dtype")
            if kv is not None:  # refused before a start that would die in vLLM (an FP8 KV cache on a T4, or on an
                # A100 for a model whose head size FlashInfer does not take)
                s = support.lookup("kv_cache", str(kv), support.Device.of_machine(machine),
                                   head_size=_head_size(model))
                if not s.supported:
                    raise ValueError(f"kv_cache_dtype={kv!r} is not served on this machine: {s.why}")
        # On a GPU, the share of the card this server asks vLLM for: a start needs that much free, whatever other
        # servers hold (vLLM 0.32 counts the whole card), so parked servers make room by memory too, not by count.
        util = dict(engine_args).get("gpu_memory_utilization", 0.92) if isinstance(engine_args, Mapping) else None
        self.gpu_share = float(util) if machine.has_gpu and isinstance(util, (int, float)) else None
        self.model_path = _models.resolve(model)
        # What it then holds: all of that share when vLLM sizes the KV cache (it fills its budget), but only weights,
        # the fixed pool and activations with kv_cache_memory_bytes (vLLM skips its profiler: v1/worker/gpu_worker.py
        # determine_available_memory). Lab 04's two tiny servers, each asking 0.9 of a card, fit side by side so.
        self.gpu_held = self.gpu_share
        kv_fixed = dict(engine_args).get("kv_cache_memory_bytes") if isinstance(engine_args, Mapping) else None
        if self.gpu_share is not None and kv_fixed and machine.gpus:
            card = machine.gpus[0].memory_gib * 2**30
            held = _checkpoint_bytes(self.model_path) + int(kv_fixed) + _activation_bytes(self.model_path, engine_args) \
                + _GPU_CONTEXT_BYTES
            self.gpu_held = min(self.gpu_share, held / card)
        self.served_model_name = served_model_name or _models.served_name(model)
        self.engine_args = dict(engine_args) if isinstance(engine_args, Mapping) else list(engine_args or [])
        self.env = {k: str(v) for k, v in (env or {}).items()}
        if swappable:
            self.env[_DEV_MODE] = "1"
        self.weights_path: str | None = None  # set by swap_weights
        self.host, self.requested_port = host, port
        self.api_key = api_key
        self.ready_timeout = ready_timeout
        self.python = python or sys.executable
        self.reuse = settings.reuse_server() if reuse is None else reuse
        self.progress = progress
        self.make_room = make_room
        self.wait_for_slot_s = wait_for_slot_s
        self.stall_s = stall_s
        self.log_dir = Path(log_dir) if log_dir else settings.log_dir()
        self.port: int | None = None
        self.proc: procs.Proc | None = None
        self.reused = False
        self.ready_s: float | None = None
        self._startup: StartupInfo | None = None

    # -- identity ------------------------------------------------------------------------------
    def _args(self, resolved: bool = True) -> list[str]:
        """The flags; ``resolved=False`` keeps a CPU worker's memory as GiB (the identity), not today's share."""
        args = self.engine_args
        if resolved and isinstance(args, dict):
            args = resolve_engine_args(args)
        return [*engine_cli(args), "--served-model-name", self.served_model_name]

    @property
    def key(self) -> str:
        """Identity of this configuration: same key, same server (for reuse). The API key enters as a digest."""
        return self._key_with(self.env)

    def _key_with(self, env: Mapping[str, str]) -> str:
        blob = json.dumps([os.path.dirname(os.path.abspath(self.python)), self.model_path, self._args(resolved=False),
                           sorted(env.items()), self.host, _key_digest(self.api_key)])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path | None:
        return self.proc.log_path if self.proc else None

    @property
    def model(self) -> str:
        return self.served_model_name

    @property
    def endpoint(self) -> Endpoint:
        """Where this server answers, with its key and served name (:class:`helpers.endpoint.Endpoint`)."""
        if self.port is None:
            raise RuntimeError(f"{self.served_model_name} has no port yet: start() it (or use server.start) first")
        return Endpoint(self.base_url, self.api_key, self.served_model_name)

    @classmethod
    def from_profile(cls, profile: Profile, **kwargs: Any) -> "Server":
        """A server (not started) for ``profile``: its model, served name, dtype, context length, engine arguments
        and environment. A keyword that is one of this class's own (``api_key``, ``port``, ``env`` added to the
        profile's, ``model`` for another checkpoint with the profile's settings...) sets it; any other is an engine
        argument over the profile's (``max_num_seqs=4``). The profile describes; the server is built only here.

        Introduced in lab 01 (One GPU, One Model).
        """
        own = set(inspect.signature(cls.__init__).parameters) - {"self"}
        engine = {"dtype": profile.dtype, "max_model_len": profile.max_model_len, **profile.engine_args}
        engine.update({k.replace("-", "_"): v for k, v in kwargs.items() if k not in own})
        engine.update(normalize(kwargs.get("engine_args") or {}))
        args = {k: v for k, v in kwargs.items() if k in own and k not in ("engine_args", "env", "model")}
        args.setdefault("served_model_name", profile.served_model_name)
        return cls(kwargs.get("model", profile.model), engine_args=engine,
                   env={**profile.env, **(kwargs.get("env") or {})}, **args)

    @property
    def swappable(self) -> bool:
        """Started with ``swappable=True``: :meth:`swap_weights` can load another checkpoint into it."""
        return self.env.get(_DEV_MODE) == "1"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.running

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<vLLM server {self.served_model_name} pid={self.pid} {self.base_url if self.port else ''} {state}>"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Server":
        """Start (or, with reuse, adopt) the server and wait until it answers ``/v1/models``."""
        if self.running:
            return self
        procs.reap()
        if self.reuse and self._adopt():
            return self
        for attempt in (1, 2):
            self._check_capacity(then=self._launch)
            bar = _progress(self.progress, f"starting vLLM ({self.served_model_name}) on port {self.port}")
            try:
                self.ready_s = self.proc.wait_ready(
                    self._healthy, self.ready_timeout, what="vLLM", hint=failure_hint, stall_s=self.stall_s,
                    status=lambda elapsed: bar(elapsed, self.proc.last_line() if self.proc else ""))
                return self
            except procs.ProcessStalled as e:
                # Measured here, twice in lab 22's scale-out: a vLLM start froze (no CPU in the whole tree) for 15
                # minutes in the kernel's affine_move_task, once before its first line and once in the engine core
                # while the API server polled; a fresh process started normally. A healthy start always uses CPU
                # somewhere in its tree (downloads and weight loads included), so a minute of none is a stall.
                if attempt == 2:
                    raise
                print(f"{e}\nStarting it once more.", file=sys.stderr)
            finally:
                bar(None, None)
        return self

    def _serves(self) -> list[str]:
        """The keys of the starts this server can serve once parked: its own and, if swappable, the plain one's."""
        if not self.swappable:
            return [self.key]
        return [self.key, self._key_with({k: v for k, v in self.env.items() if k != _DEV_MODE})]

    def _adopt(self) -> bool:
        keys = {self.key}
        if not self.swappable:  # a parked swappable server is this configuration plus routes this start does not use
            keys.add(self._key_with({**self.env, _DEV_MODE: "1"}))
        # One adoption at a time in this process: replicas started together from threads can share a key (two on one
        # GPU), and each must take a different parked server. The registry is read again under the lock.
        with _ADOPTING:
            for rec in procs.records(KIND, session=settings.session()):
                if rec.parked and rec.key in keys and rec.alive and self._healthy(rec.host, rec.port):
                    self.proc = procs.Proc.adopt(rec, secrets=[self.api_key], on_release=self._release)
                    self.port, self.reused, self.ready_s = rec.port, True, 0.0
                    print(f"Reusing the vLLM server already running with these arguments: {rec.describe()}",
                          file=sys.stderr)
                    return True
        return False

    def _check_capacity(self, then: Any = None) -> None:
        """Wait for a free slot; ``then()`` (the launch) runs while this process still holds the machine-wide slot
        lock, so two waiters that see the same free slot cannot both take it (measured: five servers started at once
        when four waiters saw one slot free)."""
        limit = settings.max_processes(KIND)
        deadline = time.monotonic() + (settings.wait_for_slot_s() if self.wait_for_slot_s is None
                                       else self.wait_for_slot_s)
        told = False
        ticket: Path | None = None
        try:
            while True:
                with _slot_lock():
                    running = [r for r in procs.records(KIND) if r.alive]
                    ahead = _tickets_ahead(ticket)
                    if ticket is None and len(running) + ahead >= limit:
                        ticket = _take_ticket()  # the newest: the same waiters are still ahead of it
                    if (len(running) + ahead >= limit or self._card_short(running)) and self.make_room:
                        parked = [r for r in running if r.parked and r.session == settings.session()]
                        # A plain server whose configuration a swappable one of this session also serves goes
                        # first: lab 12's fp8-KV start stopped its new swappable baseline (used once) and kept lab
                        # 11's plain one (used twice), which no swappable start can adopt; lab 13 started it again.
                        twins = {k for r in running if r.session == settings.session()
                                 for k in r.meta.get("serves", [])[1:]}
                        # Then servers an exited process parked (an earlier notebook's) before those the running
                        # one parked: lab 24 parked its design's server and its FP8-KV variant to serve its gateway's
                        # two replicas, and lost both to lab 22's replica, adopted by lab 23 (two uses to their one).
                        parked.sort(key=lambda r: (r.key not in twins, r.parker_alive, int(r.meta.get("uses", 1)),
                                                   -float(r.meta.get("parked_at", 0.0))))
                        for rec in parked:
                            procs.kill_tree(rec.pid, rec.create_time)
                            rec.remove()
                            running.remove(rec)
                            if len(running) + ahead < limit and not self._card_short(running):
                                break
                    if len(running) + ahead < limit and not self._card_short(running):  # a slot for every earlier
                        # waiter, one for us, and on a GPU room on the card. Leave the line while still holding the
                        # lock: a start waiting on it (lab 20's second server, from a thread) counted this ticket
                        # as a waiter ahead of it and was refused.
                        if ticket is not None:
                            ticket.unlink(missing_ok=True)
                            ticket = None
                        if then is not None:
                            then()
                        return
                if time.monotonic() >= deadline:
                    break
                if not told:
                    short = " and the card has no room for this one" if self._card_short(running) else ""
                    print(f"{len(running)} vLLM servers are running (the limit is {limit}){short}: waiting for one to "
                          f"stop{f' ({ahead} waiting before this one)' if ahead else ''}...", file=sys.stderr)
                    told = True
                time.sleep(2.0)
                procs.reap(verbose=False)
        finally:
            if ticket is not None:
                ticket.unlink(missing_ok=True)
        names = "\n  ".join(r.describe() for r in running)
        if self._card_short(running):
            raise TooManyServers(
                f"this server asks vLLM for {self.gpu_share:.0%} of the card and the servers already on it hold "
                f"{self._card_taken(running):.0%}:\n  {names}\nvLLM would refuse to start ('Free memory on device ... "
                "is less than desired GPU memory utilization'). Stop one first (srv.stop() in its notebook, `python -m "
                "helpers.server stop PID`), or start this one with a lower gpu_memory_utilization.")
        raise TooManyServers(
            f"{len(running)} vLLM servers are already running (this machine allows {limit}):\n  {names}\n"
            "Stop one first: srv.stop() in its notebook, `python -m helpers.server stop PID`, "
            "or `python -m helpers.server stop-all` (or wait for a slot: LABS_WAIT_FOR_SLOT_S=seconds).")

    def _card_taken(self, running: list[Any]) -> float:
        """The share of this server's card the running servers hold (0 off a GPU, or on another card)."""
        mine = self.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
        return sum(float(r.meta.get("gpu_held", r.meta.get("gpu_share")) or 0.0) for r in running
                   if r.meta.get("gpus", "all") in (mine, "all") or mine == "all")

    def _card_short(self, running: list[Any]) -> bool:
        """On a GPU: the running servers leave less of the card free than this one asks for."""
        return self.gpu_share is not None and self._card_taken(running) + self.gpu_share > 1.0 + 1e-9

    def _launch(self) -> None:
        if self.requested_port is not None:
            if procs.port_in_use(self.host, self.requested_port):
                raise PortInUse(
                    f"port {self.requested_port} on {self.host} is in use by {procs.port_owner(self.requested_port)}. "
                    "Stop that process, or pass port=None to let the helper pick a free port.")
            self.port = self.requested_port
        else:
            self.port = procs.free_port(self.host)
        cmd = [self.python, "-m", settings.vllm_entrypoint(), "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), *self._args()]
        env = dict(os.environ)
        # Plain log lines (papermill kernels set FORCE_COLOR), no usage reporting, no buffering.
        env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                    "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"})
        env.pop("FORCE_COLOR", None)
        env.pop("VLLM_API_KEY", None)
        env.update(_models.offline_env(self.model_path))
        env.update(self.env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.proc = procs.Proc(
            cmd, kind=KIND, name=self.served_model_name, env=env, host=self.host, port=self.port, key=self.key,
            log_path=self.log_dir / f"vllm-{self.served_model_name}-{stamp}-{self.port}.log",
            secrets=[self.api_key], die_with_owner=not self.reuse, on_release=self._release,
            meta={"model": self.model_path, "serves": self._serves(), "gpu_share": self.gpu_share,
                  "gpu_held": self.gpu_held,
                  "gpus": self.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))},
            cpus=bound_cpus(self.env)).start()

    def _healthy(self, host: str | None = None, port: int | None = None) -> bool:
        return Endpoint(f"http://{host or self.host}:{port or self.port}/v1", self.api_key).ready()

    def stop(self) -> None:
        """Stop the server and its whole process tree (with reuse on: park it for the next lab).

        A server holding swapped weights (:meth:`swap_weights`) gets the weights it started with back first (about
        a second), so that it parks under its key; if that fails, it is stopped.
        """
        if self.proc is None:
            return
        if self.reuse and self.weights_path is not None and self.running and self._healthy():
            with contextlib.suppress(Exception):  # whatever went wrong, the server is stopped below, not parked
                self.swap_weights(self.model_path, timeout=120.0)
        if self.reuse and self.weights_path is None and self.running and self._healthy():
            self.proc.park()
        else:
            self.proc.stop()
        self.proc = None

    def terminate(self) -> None:
        """Stop the server and its whole process tree, even with reuse on."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def _release(self, _proc: procs.Proc) -> None:
        self.stop()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.terminate()  # an error inside the block: never leave it running, not even parked
        else:
            self.stop()

    def swap_weights(self, path: str | os.PathLike, timeout: float = 600.0) -> float:
        """Load another checkpoint's weights into the running server, in place, and return the seconds it took.

        For a copy of the served model with the same architecture, shapes and dtype and no quantization config (a
        fake-quantized or dequantized checkpoint): a new configuration costs a weight load (about a second for
        SmolLM2-135M) instead of a server start (about 40 s on a 2-core CPU). It calls vLLM's ``reload_weights``
        (the in-place update its RL integrations use) on every worker through ``/collective_rpc``, then
        ``/reset_prefix_cache``, so no KV computed with the old weights is reused. Needs ``swappable=True`` at start.
        A swapped server's key still names the weights it started with: with reuse on, :meth:`stop` swaps those back
        before it parks the server, and stops it if they cannot be loaded.

        Introduced in lab 12 (FP8 as the Default).
        """
        if not self.running:
            raise ServerError("swap_weights: the server is not running; start it first.")
        if not self.swappable:
            raise ServerError("swap_weights needs a server started with swappable=True "
                              "(e.g. server.start(PROFILE, swappable=True)).")
        local = _models.local_path(path)
        new = _read_config(local) if local else None
        if new is None:
            raise FileNotFoundError(f"swap_weights: {path} is not a checkpoint folder on this machine "
                                    "(no config.json).")
        if new.get("quantization_config"):
            method = new["quantization_config"].get("quant_method")
            raise ValueError(f"swap_weights: {path} is a quantized checkpoint ({method}); its layers differ from "
                             "the running model's: start a server for it instead.")
        original = _models.local_path(self.model_path)
        old = _read_config(_models.local_path(self.weights_path) if self.weights_path else original)
        if old is not None:
            differ = [k for k in _SAME_SHAPE_KEYS if old.get(k) != new.get(k)]
            if differ:
                raise ValueError(f"swap_weights: {path} is not the served model's architecture ({', '.join(differ)} "
                                 "differ): start a server for it instead.")
        t0 = time.perf_counter()
        self.weights_path = str(local)  # from here on the server may not be what its key says, whatever happens next
        for route, body in (("collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(local)}}),
                            ("reset_prefix_cache", None)):
            r = http().post(f"{self.url}/{route}", json=body, timeout=timeout)
            if r.status_code != 200:
                raise ServerError(f"swap_weights: POST /{route} answered {r.status_code}: {r.text[:300]}\n"
                                  f"{self.log_tail()}")
        if original is not None and local.resolve() == Path(original).resolve():
            self.weights_path = None  # back to the weights it started with: parkable again
        return time.perf_counter() - t0

    # -- what it says --------------------------------------------------------------------------
    def log_text(self) -> str:
        """The server's whole log so far (ANSI colour codes removed, the API key redacted)."""
        return self.proc.log_text() if self.proc else ""

    def log_tail(self, n: int = 20) -> str:
        return self.proc.log_tail(n) if self.proc else ""

    @property
    def startup(self) -> StartupInfo:
        """The startup log, parsed; block size and block count exact from ``vllm:cache_config_info``."""
        if self._startup is None:
            info = parse_startup_log(self.log_text())
            with contextlib.suppress(_metrics.MetricsUnavailable):
                cfg = self.metrics().labels_of("vllm:cache_config_info")
                if cfg.get("block_size", "None") != "None":
                    info.block_size = int(cfg["block_size"])
                if cfg.get("kv_cache_memory_bytes", "None") != "None":
                    info.kv_cache_bytes = int(float(cfg["kv_cache_memory_bytes"]))
                if cfg.get("num_gpu_blocks", "None") != "None":
                    info.num_blocks = int(cfg["num_gpu_blocks"])
            self._startup = info
        return self._startup

    def command(self, port: int | None = 8000) -> str:
        """The shell command that starts this server again: its environment overrides, ``python -m
        vllm.entrypoints.openai.api_server`` and every flag (``port`` replaces the one picked here), for reports.
        An API key appears as ``VLLM_API_KEY=$VLLM_API_KEY``, never its value. After :meth:`swap_weights` it serves
        the weights swapped in.

        Introduced in lab 11 (Latency, Throughput, Goodput).
        """
        args = ["--model", self.weights_path or self.model_path, "--host", self.host, "--port", str(port or self.port), *self._args()]
        env = {**_models.offline_env(self.model_path), **self.env}
        parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        if self.api_key:
            parts.append("VLLM_API_KEY=$VLLM_API_KEY")
        return " ".join([*parts, "python -m vllm.entrypoints.openai.api_server", shlex.join(args)])

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


def bound_cpus(env: Mapping[str, str]) -> set[int] | None:
    """The CPUs a server bound with ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``"1"``, ``"0-3|4-7"``) runs on, when they
    are fewer than this process may use; ``None`` otherwise (unbound, ``auto``, ``nobind``, or every CPU).

    Such a server (a fleet replica on CPU) starts confined to them, so that vLLM's binding of its worker's threads
    moves nothing. In four of lab 22's runs here, the replica its autoscaler started while its sibling was saturated
    froze (no CPU used, no log line; twice seen waiting in the kernel's ``affine_move_task``, a change of CPU
    affinity) until the stall guard restarted it a minute later, and the backlog that minute built took minutes more
    to drain. None froze in the runs since (ci/README.md, 2026-12-04).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    spec = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if not spec or not all(c.isdigit() or c in ",-|" for c in spec):
        return None
    cpus: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus if cpus and cpus < os.sched_getaffinity(0) else None


_DEV_MODE = "VLLM_SERVER_DEV_MODE"
#: What a vLLM process holds on a card before its model: the CUDA context and non-torch allocations (~0.5 GiB).
_GPU_CONTEXT_BYTES = 2**29


def _activation_bytes(model_path: str, engine_args: Mapping[str, Any]) -> int:
    """The peak of vLLM's profiling pass, as its profiler sizes it: one step of ``max_num_batched_tokens`` through the
    MLP's gate and up projections, and float32 logits for ``max_num_seqs`` sequences (2 GiB, the plans' allowance,
    when the config cannot be read)."""
    cfg = _read_config(_models.local_path(model_path)) or {}
    cfg = cfg.get("text_config") or cfg
    if not cfg.get("hidden_size"):
        return 2 * 2**30
    budget = int(engine_args.get("max_num_batched_tokens") or 2048)
    seqs = int(engine_args.get("max_num_seqs") or 256)
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 4 * cfg["hidden_size"])
    return budget * (2 * inter + 4 * int(cfg["hidden_size"])) * 2 + seqs * int(cfg.get("vocab_size") or 0) * 4


def _checkpoint_bytes(model_path: str) -> int:
    """The bytes of a checkpoint's safetensors files (what its weights take, to a few percent), 0 when not local."""
    folder = _models.local_path(model_path)
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")) if folder else 0
_ADOPTING = threading.Lock()
#: What must match for one checkpoint's weights to load into a server started with another.
_SAME_SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "vocab_size", "tie_word_embeddings")


def _head_size(model: Any) -> int:
    """The attention head size of ``model`` from its local config (128, the common one, when it cannot be read)."""
    try:
        folder = _models.local_path(_models.resolve(model)) if model is not None else None
        cfg = _read_config(folder) or {}
    except (OSError, ValueError):
        return 128
    cfg = cfg.get("text_config") or cfg
    heads = cfg.get("num_attention_heads") or 1
    return int(cfg.get("head_dim") or (cfg.get("hidden_size") or 128 * heads) // heads)


def _read_config(path: Path | None) -> dict[str, Any] | None:
    f = Path(path) / "config.json" if path else None
    return json.loads(f.read_text()) if f is not None and f.is_file() else None


def start(model: "str | os.PathLike | Profile | None" = "default", /, **kwargs: Any) -> Server:
    """Start a vLLM server and wait until it is ready; returns a :class:`Server` (also a context manager).

    ``server.start(PROFILE)`` serves a profile's model with its engine arguments and environment;
    ``server.start(PROFILE, max_num_seqs=4, env={...})`` adds overrides (any keyword that is not one of
    :class:`Server`'s is an engine argument); ``server.start(PROFILE, model=path, served_model_name=...)`` serves
    another checkpoint with the profile's settings. ``server.start("path/or/hf-id", engine_args={...})`` serves
    anything else. ``port=None`` picks a free port on 127.0.0.1.

    Introduced in lab 01 (One GPU, One Model).
    """
    if isinstance(model, Profile):
        return Server.from_profile(model, **kwargs).start()
    return Server(model, **kwargs).start()


def list_servers() -> list[str]:
    """Describe every vLLM server the labs started that is still running.

    Introduced in lab 01 (One GPU, One Model).
    """
    return procs.describe_all(KIND)


def stop_owned() -> int:
    """Stop every server this Python process (this notebook's kernel) started. Returns how many.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    return procs.stop_owned(KIND)


def stop_all(verbose: bool = True, session: str | None = None) -> int:
    """Stop every process the labs started — servers, routers, Prometheus — any kernel's, parked or not, or only
    ``session``'s. Returns how many.

    Introduced in lab 01 (One GPU, One Model).
    """
    return procs.stop_all(session=session, verbose=verbose)


def _progress(enabled: bool, desc: str):
    """A progress line for the start-up wait: elapsed seconds and vLLM's latest log line."""
    bar = ProgressBar(desc=desc, bar_format="{desc}: {elapsed} {postfix}", leave=False, enabled=enabled)

    def update(elapsed, status):
        if elapsed is None:
            bar.close()
        else:
            bar.show(postfix=status or "")

    return update


def smoke(timeout: float = 600.0) -> str:
    """Start the embedded model (SmolLM2-135M) on this machine's device with its profile's settings, ask it one
    completion, stop it: proof, in seconds, that the installed vLLM build runs on this card. Returns one line that
    says so; raises :class:`ServerError` (whose first line says why) when it does not.

    Introduced in lab 01 (One GPU, One Model).
    """
    from .. import runtime

    prof = runtime.profile()
    path = _models.local_path(_models.DEFAULT_ID)
    if path is None:
        raise ServerError("the embedded model is not installed: run `python -m helpers.models install` first")
    small = {"max_model_len": 512, "enforce_eager": True,
             **({"gpu_memory_utilization": 0.3} if prof.device == "cuda" else {})}  # a corner of the card
    t0 = time.monotonic()
    with start(prof, model=str(path), served_model_name="smoke", reuse=False, progress=False,
               ready_timeout=timeout, **small) as srv:
        r = http().post(f"{srv.base_url}/completions", json={"model": srv.model, "prompt": "The capital of France is",
                                                            "max_tokens": 4, "temperature": 0.0}, timeout=120.0)
        if r.status_code != 200 or not r.json()["choices"][0]["text"]:
            raise ServerError(f"vLLM started but did not answer a completion ({r.status_code}): {r.text[:200]}")
        took = time.monotonic() - t0
        return (f"vLLM {srv.startup.version} ({srv.startup.device}, {srv.startup.dtype}) started the embedded model "
                f"and answered in {took:.0f} s: this build runs here")
