"""Processes the labs start: spawn with a log file, wait until ready or died, stop the whole tree.

Every server the labs run — vLLM, the calibration server, vllm-router, Prometheus, a benchmark tool — is a
:class:`Proc`::

    p = procs.Proc([sys.executable, "-m", "http.server", "8123"], kind="demo", name="files").start()
    p.wait_ready(lambda: probe("http://127.0.0.1:8123"), timeout=30, what="the file server")
    ...
    p.stop()          # SIGTERM to its whole tree, SIGKILL to what is left

**The whole tree, also after its leader died.** Each process starts as the leader of a new session, so
everything it forks stays in that session unless it asks otherwise. :func:`kill_tree` stops the session's
members and the leader's descendants. This matters: after a SIGKILL of vLLM's API server its EngineCore and
worker are re-parented to PID 1 — no longer anyone's children — yet still in the session, holding gigabytes and
a core (measured with vLLM 0.32: the EngineCore also ignored SIGTERM for over 8 s and needed SIGKILL).

**A registry of what this user started.** One JSON record per process in :func:`settings.state_dir` (readable
by this user only): kind, name, PID and its start time, the owning Python process and its start time, the
session (``LABS_SESSION``), host and port, the log file, and the command with secrets redacted. A process whose
owner died (a crashed kernel) is stopped by the next :func:`reap`; ``python -m helpers.server list|stop|stop-all``
reads the same records from any shell.

**Nothing left behind.** Owned processes are stopped at interpreter exit and when a notebook cell raises
(:func:`install_hooks`); a process may instead be *parked* (kept running, owned by nobody) for a later
:meth:`Proc.adopt` in the same session, which is how ``make test`` shares one vLLM start between labs.

This module imports only :mod:`helpers.settings` from ``helpers``.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import psutil

from . import settings

__all__ = [
    "Proc", "Record", "ProcessError", "ProcessStartError", "ProcessTimeout", "ProcessStalled", "PortInUse",
    "TooManyProcesses",
    "records", "kill_tree", "session_members", "reap", "stop_all", "stop_owned", "owned", "describe_all",
    "free_port", "port_in_use", "port_owner", "redact", "install_hooks", "root_cause",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


# --------------------------------------------------------------------------------------- errors
class ProcessError(RuntimeError):
    """Base class: a process the labs started needs the learner's attention.

    Introduced in lab 01 (One GPU, One Model).
    """


class ProcessStartError(ProcessError):
    """The process exited while starting. The message holds its exit code, the root cause, a hint and its log's
    last lines.

    Introduced in lab 01 (One GPU, One Model).
    """

    def __init__(self, message: str, returncode: int | None = None, log_tail: str = "", hint: str = ""):
        super().__init__(message)
        self.returncode, self.log_tail, self.hint = returncode, log_tail, hint


class ProcessTimeout(ProcessError):
    """The process did not become ready before the deadline (it has been stopped).

    Introduced in lab 01 (One GPU, One Model).
    """


class ProcessStalled(ProcessTimeout):
    """The process made no progress while starting (no new log output, no CPU time in its whole tree) for longer
    than the start's ``stall_s``; it has been stopped. The message says where each of its processes waited.

    Introduced in lab 01 (One GPU, One Model).
    """


class PortInUse(ProcessError):
    """The requested port is taken (the message names the process holding it).

    Introduced in lab 01 (One GPU, One Model).
    """


class TooManyProcesses(ProcessError):
    """Starting another process of this kind would exceed what this machine allows.

    Introduced in lab 01 (One GPU, One Model).
    """


# -------------------------------------------------------------------------------------- helpers
def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``.

    Introduced in lab 01 (One GPU, One Model).
    """
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it).

    Introduced in lab 01 (One GPU, One Model).
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when ``port`` on ``host`` cannot be bound (something listens there).

    Introduced in lab 01 (One GPU, One Model).
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_owner(port: int) -> str:
    """Who listens on ``port``: ``PID n (command)``, or a sentence saying it cannot be seen.

    Introduced in lab 01 (One GPU, One Model).
    """
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


_ROOT_ERROR = re.compile(r"(?:^|\] |\s)((?:[A-Z]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")
_WRAPPER_ERRORS = ("Engine core initialization failed", "Failed core proc", "See root cause above")


def root_cause(log_text: str) -> str:
    """The first exception line in a log that is not a wrapper (vLLM's 'Engine core initialization failed').

    Introduced in lab 01 (One GPU, One Model).
    """
    for line in log_text.splitlines():
        m = _ROOT_ERROR.search(line.strip())
        if m and not any(w in m.group(2) for w in _WRAPPER_ERRORS) and "Warning" not in m.group(1):
            return f"{m.group(1)}: {m.group(2)}"
    return ""


def _create_time(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


#: How far the wall clock may have been stepped since a process was recorded, for :func:`_same_start`.
_CLOCK_STEP_S = 120.0


def _same_start(now: float, recorded: float) -> bool:
    """Whether a process's create time read ``now`` is the one recorded earlier for its PID (not a reused PID).

    On Linux, psutil's create time is the start in clock ticks since boot plus /proc/stat's ``btime``, a whole number
    of seconds the kernel derives from the wall clock at each read: when the clock is stepped, or slewed across a
    second boundary, every process's create time moves by the same whole seconds. A strict comparison then takes a
    live server for a dead one (a benchmark stops sending to it) and finds no process tree to stop.
    """
    d = now - recorded
    return abs(d) < 1.0 or (abs(d) <= _CLOCK_STEP_S and abs(d - round(d)) < 0.005)


def _alive(pid: int | None, create_time: float | None) -> bool:
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or _same_start(p.create_time(), create_time)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# ------------------------------------------------------------------------------------- registry
@dataclass
class Record:
    """What the registry knows about one process the labs started (one JSON file per process).

    Introduced in lab 01 (One GPU, One Model).
    """

    kind: str
    name: str
    pid: int
    create_time: float
    log_path: str
    cmd: list[str]
    owner_pid: int | None
    owner_create_time: float | None
    session: str = ""
    parked: bool = False
    key: str = ""
    host: str | None = None
    port: int | None = None
    started_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return settings.state_dir() / f"{self.pid}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(self)))
        tmp.replace(self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @property
    def alive(self) -> bool:
        return _alive(self.pid, self.create_time)

    @property
    def owner_alive(self) -> bool:
        return _alive(self.owner_pid, self.owner_create_time)

    @property
    def parker_alive(self) -> bool:
        """Whether the process that parked this one (a notebook's kernel, say) is still running."""
        by = self.meta.get("parked_by") or [None, None]
        return _alive(by[0], by[1])

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.host and self.port else None

    def describe(self) -> str:
        age = time.time() - (self.started_at or self.create_time)
        state = ("parked" if self.parked else f"owned by PID {self.owner_pid}" if self.owner_alive
                 else "left behind by a dead kernel")
        where = f" on {self.host}:{self.port}" if self.port else ""
        return f"{self.kind} {self.name!r} PID {self.pid}{where} ({state}, up {age / 60:.0f} min, log {self.log_path})"


def records(kind: str | None = None, session: str | None = None) -> list[Record]:
    """Every process the registry knows (of ``kind``, in ``session``), oldest first. Unreadable records are dropped.

    Introduced in lab 01 (One GPU, One Model).
    """
    out = []
    for p in settings.state_dir().glob("*.json"):
        try:
            rec = Record(**json.loads(p.read_text()))
        except (ValueError, TypeError):
            p.unlink(missing_ok=True)
            continue
        if (kind is None or rec.kind == kind) and (session is None or rec.session == session):
            out.append(rec)
    return sorted(out, key=lambda r: r.create_time)


def session_members(pid: int, create_time: float | None = None) -> list[psutil.Process]:
    """Every live process of the session ``pid`` leads (started no earlier than it), and its descendants.

    Introduced in lab 01 (One GPU, One Model).
    """
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
        leader = psutil.Process(pid)
        if create_time is not None and not _same_start(leader.create_time(), create_time):
            # The PID now belongs to another process. Linux frees a PID only once no process uses it as its ID, group
            # or session, so none of the recorded session is left: every process in session ``pid`` is the new
            # owner's (a reused PID leading another session would otherwise be collected, as root on Colab).
            return []
        create_time = leader.create_time()  # as this clock reads it now, to compare its members' with
        found[pid] = leader
        for c in leader.children(recursive=True):
            found[c.pid] = c
    since = (create_time or 0.0) - 1.0
    for p in psutil.process_iter(["pid", "create_time"]):
        if p.pid in found or p.pid == os.getpid():
            continue
        try:
            if os.getsid(p.pid) == pid and (p.info["create_time"] or 0.0) >= since:
                found[p.pid] = p
        except (OSError, psutil.Error):
            continue
    return list(found.values())


def kill_tree(pid: int, create_time: float | None = None, timeout: float = 20.0) -> int:
    """SIGTERM a process, its descendants and the rest of its session; SIGKILL what is left after ``timeout``.

    Works when the leader is already dead: its orphans are found by session. Returns how many processes
    were signalled.

    Introduced in lab 01 (One GPU, One Model).
    """
    procs = session_members(pid, create_time)
    if not procs:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    # Anything forked while it was shutting down.
    late = [p for p in session_members(pid, create_time) if p.is_running()]
    for p in late:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(late, timeout=5)
    return len(procs)


def reap(kind: str | None = None, verbose: bool = True) -> int:
    """Forget dead processes; stop live ones whose owner died without stopping them. Returns how many stopped.

    Introduced in lab 01 (One GPU, One Model).
    """
    n = 0
    for rec in records(kind):
        if not rec.alive:
            # Its leader is gone; orphans of its session may not be.
            kill_tree(rec.pid, rec.create_time, timeout=5)
            rec.remove()
        elif not rec.parked and not rec.owner_alive:
            if verbose:
                print(f"Stopping a process left behind by a dead kernel: {rec.describe()}", file=sys.stderr)
            kill_tree(rec.pid, rec.create_time)
            rec.remove()
            n += 1
    return n


def stop_all(session: str | None = None, kind: str | None = None, verbose: bool = True) -> int:
    """Stop every process the labs started (any kernel's, parked or not), or only ``session``'s / ``kind``'s.

    Introduced in lab 01 (One GPU, One Model).
    """
    n = 0
    for rec in records(kind, session):
        if rec.alive:
            if verbose:
                print(f"stopping {rec.describe()}", file=sys.stderr)
            n += 1
        kill_tree(rec.pid, rec.create_time)
        rec.remove()
    for p in list(_OWNED):
        if p.record is None or ((session is None or p.record.session == session)
                                and (kind is None or p.record.kind == kind)):
            p._forget()
    return n


def describe_all(kind: str | None = None) -> list[str]:
    """One line per live process the labs started.

    Introduced in lab 01 (One GPU, One Model).
    """
    return [r.describe() for r in records(kind) if r.alive]


# ----------------------------------------------------------------------------------------- Proc
_OWNED: set["Proc"] = set()


def owned(kind: str | None = None) -> list["Proc"]:
    """The processes this Python process owns (of ``kind``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return [p for p in _OWNED if kind is None or p.kind == kind]


def stop_owned(kind: str | None = None) -> int:
    """Stop (or, where a process says so, park) every process this Python process owns. Returns how many.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    mine = owned(kind)
    for p in mine:
        p.release()
    return len(mine)


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _preexec(pdeath: bool, cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """What the child runs between fork and exec: the parent-death signal, and its CPUs (inherited by every process
    it starts)."""
    if not pdeath and not cpus:
        return None

    def run() -> None:
        if pdeath:
            _set_pdeathsig()
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)
    return run


class Proc:
    """A process this Python process owns: spawned into its own session, logged to a file, registered.

    ``kind`` groups processes ("vllm", "calibration", "router", "prometheus", "tool"); ``name`` is what a
    person calls it. ``secrets`` are redacted from the registered command and from :meth:`log_text`.
    ``die_with_owner`` (default) asks the kernel to SIGTERM the process when the thread that started it
    ends, so not even a SIGKILL of this Python process leaves it behind; parked processes must not use it.
    ``on_release`` replaces :meth:`stop` at interpreter exit and in :func:`stop_owned` (a server parks itself
    there when reuse is on). ``cpus`` confines the process, and every process it starts, to those CPUs from its
    first instruction.

    Introduced in lab 01 (One GPU, One Model).
    """

    def __init__(self, cmd: Sequence[str], *, kind: str, name: str, log_path: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 host: str | None = None, port: int | None = None, key: str = "",
                 secrets: Iterable[str | None] = (), die_with_owner: bool = True,
                 meta: Mapping[str, Any] | None = None, on_release: Callable[["Proc"], None] | None = None,
                 cpus: Iterable[int] | None = None):
        self.cmd = [str(c) for c in cmd]
        self.cpus = frozenset(cpus) if cpus else None
        self.kind, self.name = kind, name
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.host, self.port, self.key = host, port, key
        self.secrets = [s for s in secrets if s]
        self.die_with_owner = die_with_owner
        self.meta = dict(meta or {})
        self.on_release = on_release
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^\w.-]+", "-", name)[:60]
        self.log_path = Path(log_path) if log_path else settings.log_dir() / f"{kind}-{safe}-{stamp}-{os.getpid()}.log"
        self.popen: subprocess.Popen | None = None
        self.record: Record | None = None
        self.pid: int | None = None
        self.started_at: float | None = None
        self.adopted = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Proc":
        """Spawn the process (its output to :attr:`log_path`) and register it."""
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shown = redact(" ".join(self.cmd), self.secrets)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as log:
            log.write("$ " + shown + "\n")
            log.flush()
            pdeath = self.die_with_owner and threading.current_thread() is threading.main_thread()
            self.popen = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                cwd=str(self.cwd) if self.cwd else None, start_new_session=True,
                preexec_fn=_preexec(pdeath, self.cpus))
        self.pid = self.popen.pid
        self.started_at = time.time()
        self.record = Record(
            kind=self.kind, name=self.name, pid=self.pid, create_time=_create_time(self.pid) or self.started_at,
            log_path=str(self.log_path), cmd=[redact(c, self.secrets) for c in self.cmd], owner_pid=os.getpid(),
            owner_create_time=_create_time(os.getpid()), session=settings.session(), key=self.key,
            host=self.host, port=self.port, started_at=self.started_at, meta=self.meta)
        self.record.save()
        _OWNED.add(self)
        install_hooks()
        return self

    @classmethod
    def adopt(cls, rec: Record, **kwargs: Any) -> "Proc":
        """Take ownership of a parked process from the registry."""
        p = cls(rec.cmd, kind=rec.kind, name=rec.name, log_path=rec.log_path, host=rec.host, port=rec.port,
                key=rec.key, die_with_owner=False, meta=rec.meta, **kwargs)
        rec.parked, rec.owner_pid, rec.owner_create_time = False, os.getpid(), _create_time(os.getpid())
        rec.meta["uses"] = int(rec.meta.get("uses", 1)) + 1
        rec.save()
        p.record, p.pid, p.started_at, p.adopted = rec, rec.pid, rec.started_at, True
        _OWNED.add(p)
        install_hooks()
        return p

    @property
    def running(self) -> bool:
        return self.record is not None and self.record.alive

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited (``None`` while it runs, or for an adopted one)."""
        return self.popen.poll() if self.popen is not None else None

    def wait_ready(self, probe: Callable[[], bool], timeout: float, *, what: str | None = None,
                   hint: Callable[[str], str] | None = None, status: Callable[[float], None] | None = None,
                   interval: float = 0.5, stall_s: float | None = None) -> float:
        """Poll ``probe()`` until it is true; returns the seconds it took.

        If the process exits first, raises :class:`ProcessStartError` with its exit code, the log's root cause,
        ``hint(log)`` and the log's last lines; past ``timeout`` s, stops it and raises :class:`ProcessTimeout`.
        With ``stall_s``, a start that writes nothing to its log and uses no CPU (its whole tree) for that long is
        stopped at once with :class:`ProcessStalled`, instead of at the deadline. ``status(elapsed)`` is called
        each poll (a progress line).
        """
        what = what or f"{self.kind} {self.name!r}"
        t0 = time.monotonic()
        progress, moved = self._progress(), t0
        try:
            while True:
                rc = self.returncode
                if rc is not None:
                    text = self.log_text()
                    cause, advice = root_cause(text), (hint(text) if hint else "")
                    tail = self.log_tail(40)
                    raise ProcessStartError(
                        f"{what} exited during start-up with exit code {rc}."
                        + (f"\nCause: {cause}" if cause else "") + (f"\nWhat to do: {advice}" if advice else "")
                        + f"\nFull log: {self.log_path}\nLast lines:\n{tail}",
                        returncode=rc, log_tail=tail, hint=advice)
                if probe():
                    return time.monotonic() - t0
                now = time.monotonic()
                elapsed = now - t0
                if stall_s is not None:
                    seen = self._progress()
                    if seen != progress:
                        progress, moved = seen, now
                    elif now - moved > stall_s:
                        raise ProcessStalled(
                            f"{what} made no progress for {now - moved:.0f} s while starting: no new log output and no "
                            f"CPU time in its process tree{self._waiting_in()} (it has been stopped). Start it again; "
                            f"if it stalls again at the same place, the machine (not the process) is stuck.\n"
                            f"Full log: {self.log_path}\nLast lines:\n{self.log_tail(10)}")
                if elapsed > timeout:
                    tail = self.log_tail(30)
                    raise ProcessTimeout(
                        f"{what} did not become ready within {timeout:.0f} s (it has been stopped). Raise the "
                        f"timeout if the machine is slow; read the log for a stuck step.\nFull log: {self.log_path}\n"
                        f"Last lines:\n{tail}")
                if status is not None:
                    status(elapsed)
                time.sleep(interval)
        except BaseException:
            self.stop()
            raise

    def _progress(self) -> tuple[int, float]:
        """What moves while a process starts: its log's size and its tree's CPU seconds."""
        size = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
        cpu = 0.0
        for p in self._members():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system
        return size, round(cpu, 2)

    def _members(self) -> list[psutil.Process]:
        """The processes this one started (its session, as :func:`kill_tree` stops them)."""
        return session_members(self.pid, self.record.create_time if self.record else None) if self.pid else []

    def _waiting_in(self) -> str:
        """Where each process of the tree waits in the kernel, when Linux says (``/proc/PID/stack``, else
        ``wchan``): a stuck child (vLLM's engine core) leaves its parent waiting in ``poll``."""
        seen = []
        for pid in sorted(p.pid for p in self._members()):
            for name in ("stack", "wchan"):
                with contextlib.suppress(OSError, TypeError):
                    text = Path(f"/proc/{pid}/{name}").read_text().strip()
                    frames = [ln.split("] ", 1)[-1].split("+")[0] for ln in text.splitlines()][:2]
                    if frames and frames[0] not in ("", "0"):
                        seen.append(f"PID {pid} at {' <- '.join(frames)}")
                        break
        return f"; in the kernel, {'; '.join(seen)}" if seen else ""

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the process and its whole tree (session included), and forget it."""
        if self.pid:
            kill_tree(self.pid, self.record.create_time if self.record else None, timeout=timeout)
        if self.popen is not None:
            with contextlib.suppress(Exception):
                self.popen.wait(timeout=5)
        if self.record is not None:
            self.record.remove()
        self._forget()

    def park(self) -> None:
        """Keep the process running, owned by nobody, for a later :meth:`adopt` in this session."""
        if self.record is None:
            return
        self.record.parked, self.record.owner_pid, self.record.owner_create_time = True, None, None
        self.record.meta["parked_at"] = time.time()
        # who parked it: a notebook still running may come back to its own parked servers (helpers.server's make_room)
        self.record.meta["parked_by"] = [os.getpid(), _create_time(os.getpid())]
        self.record.save()
        self._forget()

    def release(self) -> None:
        """What interpreter exit and :func:`stop_owned` do: ``on_release`` if given, else :meth:`stop`."""
        (self.on_release or Proc.stop)(self)

    def _forget(self) -> None:
        self.record = None
        self.popen = None
        _OWNED.discard(self)

    # -- output --------------------------------------------------------------------------------
    def log_text(self) -> str:
        """The whole log so far (ANSI colour codes removed, secrets redacted)."""
        if not self.log_path or not self.log_path.exists():
            return ""
        return redact(_ANSI.sub("", self.log_path.read_text(errors="replace")), self.secrets)

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def last_line(self, width: int = 100) -> str:
        """The log's last non-empty line (for a progress line)."""
        for line in reversed(self.log_text().splitlines()[-5:]):
            line = re.sub(r"^\(\w+ pid=\d+\)\s*", "", line.strip())
            if line:
                return line[:width]
        return ""

    def __enter__(self) -> "Proc":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{self.kind} {self.name!r} pid={self.pid} {state}>"


# ------------------------------------------------------------------------------ exit and cell hooks
_HOOKS_INSTALLED = False


def _at_exit() -> None:
    for p in list(_OWNED):
        with contextlib.suppress(Exception):
            p.release()


def _on_cell_error(result: Any) -> None:
    """An exception in a notebook cell stops this kernel's processes: a failing cell leaves none running."""
    err = getattr(result, "error_in_exec", None)
    if err is None or isinstance(err, KeyboardInterrupt) or not _OWNED or settings.keep_server_on_error():
        return
    names = ", ".join(f"{p.kind} PID {p.pid}" for p in _OWNED)
    for p in list(_OWNED):
        with contextlib.suppress(Exception):
            p.stop()
    print(f"\n[helpers] A cell failed, so the processes it owned ({names}) were stopped: nothing is left "
          "running. Fix the cell, then run the start cell again. (Set LABS_KEEP_SERVER_ON_ERROR=1 to keep them "
          "running after an error.)", file=sys.stderr)


def install_hooks() -> None:
    """Stop owned processes at interpreter exit and when a notebook cell raises (installed once).

    Introduced in lab 01 (One GPU, One Model).
    """
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


def is_loopback(host: str) -> bool:
    return host in _LOOPBACK
