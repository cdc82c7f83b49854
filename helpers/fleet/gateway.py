"""An nginx gateway in front of a deployment's replicas: API keys, a per-key rate limit, a weighted canary, rollback.

vLLM's own ``--api-key`` guards only ``/v1``: ``/metrics``, ``/tokenize`` and ``/invocations`` stay open to anyone who
reaches the port. The gateway is the only door: it answers 401 to a missing or unknown key (429 to a flood of them),
404 to every request line but the three paths the OpenAI API needs, exactly as sent (no dot segments, no encoding),
429 to a key over its rate or its requests in flight, and sends each admitted request to the baseline replicas or,
for a stated share, to a canary; responses say nothing of the replica that answered. Rolling back is a reload: nginx's old worker finishes what it holds while the new one
takes every new request, so nothing in flight is lost (clients get one request per connection, so no request
can be sent on a connection the old worker is closing)::

    keys = gateway.Keys.generate(["alice", "bob"])                    # kept in memory and a 0600 file nginx reads
    with gateway.Gateway(gateway.Route([base.url], [cand.url], canary_percent=10), keys,
                         {"bob": gateway.RateLimit(per_second=5, burst=5)}) as gw:   # alice is not limited
        bench.run(workload, arrivals, base_url=gw.endpoint("alice"))  # an Endpoint carrying alice's key
        gw.log()                                                      # one GatewayRecord per request, no key in it
        gw.set_route(gateway.Route([base.url]))                       # rollback: the canary gets nothing new

nginx is Debian's ``nginx`` package (``make setup`` installs it: ``scripts/install_tools.sh``), run as a
:class:`helpers.procs.Proc`. The split is nginx's smooth weighted round-robin, so a 10% canary gets exactly one
request in ten; a replica that refuses connections is taken out for ``fail_timeout`` and its share moves to the others.

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import httpx

from .. import procs, settings
from ..endpoint import Endpoint, Listener, http
from .router import _root

__all__ = ["Gateway", "Route", "RateLimit", "Keys", "GatewayRecord", "nginx_config", "nginx_executable",
           "OPEN_PATHS", "admitted", "read_log"]

#: The only paths the gateway passes on (everything else, ``/metrics`` and ``/tokenize`` included, is a 404).
OPEN_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions")
_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def nginx_executable() -> str:
    """The ``nginx`` binary, or a message saying how to install it.

    Introduced in lab 24 (Putting It All Together).
    """
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        raise FileNotFoundError("nginx is not installed: `apt-get install -y nginx` on Debian/Ubuntu (make setup runs "
                                "scripts/install_tools.sh, which does; on Colab scripts/colab_setup.py runs it)")
    return found


@dataclass(frozen=True)
class Route:
    """Where admitted requests go: ``baseline`` replicas (server roots, or servers with ``.url``) and, for
    ``canary_percent`` of them, the ``canary`` replicas. ``canary_percent=0`` or no canary: everything to the baseline.

    Introduced in lab 24 (Putting It All Together).
    """

    baseline: Sequence[Any]
    canary: Sequence[Any] = ()
    canary_percent: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "baseline", tuple(_root(u) for u in self.baseline))
        object.__setattr__(self, "canary", tuple(_root(u) for u in self.canary))
        if not self.baseline:
            raise ValueError("a route needs at least one baseline replica")
        if not 0 <= int(self.canary_percent) <= 100 or int(self.canary_percent) != self.canary_percent:
            raise ValueError(f"canary_percent is a whole percentage from 0 to 100, got {self.canary_percent!r}")
        if self.canary_percent and not self.canary:
            raise ValueError(f"canary_percent={self.canary_percent} but no canary replica: pass canary=[...]")
        if set(self.baseline) & set(self.canary):
            raise ValueError("a replica cannot be both baseline and canary")

    def weights(self) -> dict[str, int]:
        """nginx ``weight`` per replica: each canary carries ``canary_percent`` of the traffic in all, spread evenly."""
        p = int(self.canary_percent) if self.canary else 0
        nb, nc = len(self.baseline), len(self.canary)
        w = {u: (100 - p) * max(nc, 1) for u in self.baseline}
        w.update({u: p * nb for u in self.canary} if p else {})
        w = {u: x for u, x in w.items() if x > 0}
        g = math.gcd(*w.values())
        return {u: x // g for u, x in w.items()}

    def role(self, address: str) -> str:
        """``baseline``, ``canary`` or ``other`` for an upstream ``host:port`` as nginx logs it."""
        roots = {_hostport(u): "baseline" for u in self.baseline} | {_hostport(u): "canary" for u in self.canary}
        return roots.get(address, "other")


@dataclass(frozen=True)
class RateLimit:
    """nginx ``limit_req`` for one API key: ``per_second`` requests a second, ``burst`` more admitted at once
    (``nodelay``); the rest are answered 429 at the gateway. ``connections`` (nginx ``limit_conn``): at most that many
    of the key's requests in flight at once, the rest 429 too (a rate alone lets a key hold every slot with long
    requests).

    Introduced in lab 24 (Putting It All Together).
    """

    per_second: int
    burst: int = 0
    connections: int | None = None

    def __post_init__(self) -> None:
        if int(self.per_second) < 1 or int(self.burst) < 0:
            raise ValueError(f"a rate limit needs per_second >= 1 and burst >= 0, got {self}")
        if self.connections is not None and int(self.connections) < 1:
            raise ValueError(f"connections is the most requests in flight at once (1 or more, or None), got {self}")


def admitted(limit: RateLimit, sent: int, span_s: float) -> int:
    """How many of ``sent`` requests from one key, spread over ``span_s`` seconds faster than the limit, nginx's leaky
    bucket admits: the first ``burst + 1`` at once, then one per ``1/per_second`` s (a prediction to check against
    the gateway's 429s).

    Introduced in lab 24 (Putting It All Together).
    """
    return min(int(sent), int(limit.burst) + 1 + int(math.floor(limit.per_second * max(span_s, 0.0) + 1e-9)))


class Keys:
    """Engineers' API keys. Kept in this object and in the gateway's private config file (mode 0600, deleted when the
    gateway stops); never in argv, logs, state files or reports — ``repr`` shows only the names.

    Introduced in lab 24 (Putting It All Together).
    """

    def __init__(self, keys: Mapping[str, str]):
        for name, key in keys.items():
            if not _NAME.match(name):
                raise ValueError(f"engineer name {name!r}: use letters, digits, '_', '.', '-' (a letter first)")
            if not _KEY.match(key or ""):
                raise ValueError(f"the key for {name!r} must be 16-256 characters of A-Z a-z 0-9 . _ ~ + / = - "
                                 "(generate one: Keys.generate)")
        if len(set(keys.values())) != len(keys):
            raise ValueError("two engineers share a key: give each their own")
        self._keys = dict(keys)

    @classmethod
    def generate(cls, names: Iterable[str]) -> "Keys":
        return cls({n: secrets.token_urlsafe(24) for n in names})

    @property
    def names(self) -> list[str]:
        return list(self._keys)

    def key(self, name: str) -> str:
        if name not in self._keys:
            raise KeyError(f"no key for {name!r}; the gateway knows {', '.join(self._keys)}")
        return self._keys[name]

    def items(self) -> Iterable[tuple[str, str]]:
        return self._keys.items()

    def __repr__(self) -> str:
        return f"Keys({', '.join(self._keys)})"


#: Requests a second the gateway answers with 401 from all clients together (and ``UNKNOWN_KEY_BURST`` more at once);
#: past that, 429: guessing keys costs a flood of requests, and a flood is refused before it reaches anything.
UNKNOWN_KEY_RATE, UNKNOWN_KEY_BURST = 5, 20


def _exact(text: str) -> str:
    """An nginx ``map`` source matching ``text`` exactly, case included: a PCRE regex (``map``'s plain strings are
    compared case-insensitively, and a few words, ``default`` among them, are its keywords)."""
    return '"~^' + re.sub(r"([.+^$*?()\[\]{}|\\])", r"\\\1", text) + '$"'


def nginx_config(route: Route, keys: Keys, *, port: int, workdir: str | Path, access_log: str | Path,
                 limits: Mapping[str, RateLimit] | None = None, host: str = "127.0.0.1", run_as: str | None = None
                 ) -> str:
    """The nginx configuration of the gateway (pure: the same inputs give the same text). It holds the keys, so it
    is written only to the gateway's private folder.

    Only :data:`OPEN_PATHS` pass, compared with the request line's raw URI (nginx matches ``location`` on the
    normalized path but, with ``proxy_pass`` naming no URI, sends the raw one on: ``/metrics/../v1/models`` would
    pass a check on ``/v1/models`` and reach vLLM's ``/metrics`` mount); the log records the raw URI. Keys are
    matched exactly (case included), unknown keys are answered 401 at :data:`UNKNOWN_KEY_RATE` a second at most.

    Introduced in lab 24 (Putting It All Together).
    """
    w = Path(workdir)
    servers = "\n".join(f"        server {_hostport(u)} weight={x};" for u, x in route.weights().items())
    keymap = "\n".join(f'        {_exact("Bearer " + k)} "{n}";' for n, k in keys.items())
    paths = "|".join(re.escape(p[len("/v1/"):]) for p in OPEN_PATHS)
    limits = dict(limits or {})
    # one zone per limited engineer: its key variable is the name for that engineer and empty (not counted) for others
    limit_zone = "".join(f'    map $engineer $limit_{i} {{ default ""; {_exact(n)} "{n}"; }}\n'
                         f"    limit_req_zone $limit_{i} zone=limit_{i}:1m rate={int(r.per_second)}r/s;\n"
                         + (f"    limit_conn_zone $limit_{i} zone=conn_{i}:1m;\n" if r.connections else "")
                         for i, (n, r) in enumerate(limits.items()))
    limit = "".join(f"            limit_req zone=limit_{i}{f' burst={int(r.burst)} nodelay' if r.burst else ''};\n"
                    + (f"            limit_conn conn_{i} {int(r.connections)};\n" if r.connections else "")
                    for i, r in enumerate(limits.values()))  # nginx refuses burst=0: no burst is none
    limit += "            limit_req_status 429;\n            limit_conn_status 429;\n" if limits else ""
    return f"""# The gateway of helpers.fleet.gateway (written by the lab; holds API keys: private to this folder)
{f"user {run_as};" if run_as else ""}
worker_processes 1;
daemon off;
pid {w / "nginx.pid"};
error_log {w / "error.log"} notice;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {w / "tmp/body"};
    proxy_temp_path {w / "tmp/proxy"};
    fastcgi_temp_path {w / "tmp/fastcgi"};
    uwsgi_temp_path {w / "tmp/uwsgi"};
    scgi_temp_path {w / "tmp/scgi"};
    client_body_buffer_size 1m;
    client_max_body_size 1m;
    default_type application/json;
    server_tokens off;
    map $http_authorization $engineer {{
        default "";
{keymap}
    }}
    limit_req_zone $binary_remote_addr zone=unknown_key:1m rate={UNKNOWN_KEY_RATE}r/s;
{limit_zone}    log_format gateway escape=json '{{"t":$msec,"rt":$request_time,"status":$status,"engineer":"$engineer",'
                                   '"upstream":"$upstream_addr","uri":"$request_uri","id":"$http_x_bench_request_id"}}';
    upstream replicas {{
{servers}
        keepalive 32;
    }}
    server {{
        listen {host}:{port};
        # one request per client connection: at a reload the old worker closes its idle keep-alive connections, and a
        # request a client sends on one at that instant is lost (measured: 1 in ~600 with keep-alive)
        keepalive_timeout 0;
        access_log {access_log} gateway;
        error_page 401 @unauthorized;
        error_page 404 @not_served;
        error_page 429 @too_many;
        if ($engineer = "") {{ rewrite ^ /.unknown-key last; }}
        if ($request_uri !~ "^/v1/({paths})$") {{ return 404; }}
        location ~ ^/v1/({paths})$ {{
{limit}            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_buffering off;
            proxy_max_temp_file_size 0;
            proxy_read_timeout 600s;
            proxy_send_timeout 600s;
        }}
        # unknown keys: counted (preaccess) before they are refused (access), so a flood of guesses gets 429s
        location = /.unknown-key {{
            internal;
            limit_req zone=unknown_key burst={UNKNOWN_KEY_BURST} nodelay;
            limit_req_status 429;
            deny all;
            error_page 403 =401 @unauthorized;
        }}
        location @unauthorized {{ return 401 '{{"error": "missing or unknown API key"}}\\n'; }}
        location @not_served {{ return 404 '{{"error": "not served by the gateway"}}\\n'; }}
        location @too_many {{ return 429 '{{"error": "too many requests: slow down"}}\\n'; }}
        location / {{ return 404; }}
    }}
}}
"""


@dataclass(frozen=True)
class GatewayRecord:
    """One request as the gateway logged it: when it ended (epoch s), how long it took there, its status, the
    engineer's name (never the key), the replica that answered (``host:port``, empty when none did), the path and the
    benchmark's request id.

    Introduced in lab 24 (Putting It All Together).
    """

    t: float
    request_time_s: float
    status: int
    engineer: str
    upstream: str
    uri: str
    request_id: str = ""

    @property
    def started(self) -> float:
        return self.t - self.request_time_s


def read_log(path: str | Path) -> list[GatewayRecord]:
    """The gateway's access log as records (a line cut by a crash is skipped).

    Introduced in lab 24 (Putting It All Together).
    """
    out = []
    p = Path(path)
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        # with a retry nginx logs "a:1, b:2": the replica that answered is the last
        upstream = d.get("upstream", "").split(",")[-1].strip()
        out.append(GatewayRecord(float(d["t"]), float(d["rt"]), int(d["status"]), d.get("engineer", ""),
                                 upstream, d.get("uri", ""), d.get("id", "")))
    return out


class Gateway(Listener):
    """An nginx process on ``host`` in front of ``route``'s replicas, admitting ``keys``. ``limits``: one
    :class:`RateLimit` for every key, or a limit per engineer's name (the others are not limited).

    Introduced in lab 24 (Putting It All Together).
    """

    def __init__(self, route: Route, keys: Keys, limits: RateLimit | Mapping[str, RateLimit] | None = None, *,
                 host: str = "127.0.0.1", port: int | None = None, ready_timeout: float = 20.0,
                 model: str | None = None):
        if not procs.is_loopback(host):
            raise ValueError(f"the gateway binds to loopback here ({host!r} is not): it holds the keys' file")
        self.limits = {n: limits for n in keys.names} if isinstance(limits, RateLimit) else dict(limits or {})
        unknown = set(self.limits) - set(keys.names)
        if unknown:
            raise ValueError(f"rate limits for engineers without a key: {', '.join(sorted(unknown))}")
        self.route, self.keys, self.host, self.port = route, keys, host, port
        self.ready_timeout, self._model = ready_timeout, model
        self.proc: procs.Proc | None = None
        self.workdir: Path | None = None
        self.access_log: Path | None = None

    # -- addresses ---------------------------------------------------------------------------------
    def endpoint(self, engineer: str) -> Endpoint:
        """Where ``engineer`` sends requests: the gateway's ``/v1`` with their key."""
        return Endpoint(self.base_url, api_key=self.keys.key(engineer), model=self._model)

    # -- lifecycle ---------------------------------------------------------------------------------
    def _write(self, route: Route) -> Path:
        assert self.workdir is not None and self.access_log is not None
        run_as = "nobody nogroup" if os.geteuid() == 0 else None
        text = nginx_config(route, self.keys, port=int(self.port), workdir=self.workdir, access_log=self.access_log,
                            limits=self.limits, host=self.host, run_as=run_as)
        conf = self.workdir / "nginx.conf"
        tmp = self.workdir / "nginx.conf.new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        test = subprocess.run([nginx_executable(), "-t", "-q", "-p", str(self.workdir), "-c", str(tmp),
                               "-e", str(self.workdir / "error.log")], capture_output=True, text=True, timeout=30)
        if test.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"nginx refused the gateway's configuration (nothing changed): "
                               f"{procs.redact(test.stderr.strip(), [k for _, k in self.keys.items()])[-600:]}")
        tmp.replace(conf)
        return conf

    def start(self) -> "Gateway":
        if self.proc is not None and self.proc.running:
            return self
        self.port = self.port or procs.free_port(self.host)
        self.workdir = Path(tempfile.mkdtemp(prefix="gateway-"))
        self.workdir.chmod(0o711)  # nginx's workers (nobody) reach tmp/ through it; only root lists or reads it
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.workdir / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        self.access_log = settings.log_dir() / f"gateway-{self.port}-access.jsonl"
        self.access_log.parent.mkdir(parents=True, exist_ok=True)
        self.access_log.unlink(missing_ok=True)
        try:
            conf = self._write(self.route)
            self.proc = procs.Proc([nginx_executable(), "-p", str(self.workdir), "-c", str(conf),
                                    "-e", str(self.workdir / "error.log")], kind="gateway", name="nginx gateway",
                                   host=self.host, port=self.port).start()
            self.proc.wait_ready(self._ready, self.ready_timeout, what="the nginx gateway", interval=0.1,
                                 hint=lambda log: self._error_tail())
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        try:
            return http().get(f"{self.url}/", timeout=2).status_code in (401, 404, 429)
        except httpx.HTTPError:
            return False

    def _error_tail(self) -> str:
        p = self.workdir / "error.log" if self.workdir else None
        return p.read_text()[-600:] if p and p.exists() else ""

    def _workers(self) -> set[int]:
        import psutil

        try:
            return {c.pid for c in psutil.Process(int(self.proc.pid)).children()} if self.proc else set()
        except psutil.Error:
            return set()

    def set_route(self, route: Route, timeout: float = 10.0) -> float:
        """Send new traffic by ``route`` (a canary's share changed, or rolled back): the config is rewritten, checked
        by ``nginx -t`` and loaded with SIGHUP; requests in flight finish where they are. Returns the epoch second of
        the signal, once nginx has started a worker on the new configuration: a reload nginx could not apply leaves
        the old workers serving the old route, and that raises here with nginx's error rather than passing as done.
        """
        if self.proc is None or not self.proc.running:
            raise RuntimeError("the gateway is not running: start it first")
        self._write(route)
        before = self._workers()
        t = time.time()
        os.kill(int(self.proc.pid), signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while not self._workers() - before:
            if time.monotonic() > deadline or not self.proc.running:
                raise RuntimeError(f"nginx did not apply the new route within {timeout:g} s (its workers still serve "
                                   f"the old one: {self.route.weights()}): {self._error_tail()[-400:]}")
            time.sleep(0.02)
        self.route = route
        return t

    def log(self, wait_for: Iterable[str] = (), timeout: float = 10.0) -> list[GatewayRecord]:
        """Every request the gateway has logged so far. nginx writes a request's line after its response has gone,
        so a client can finish before the line exists: ``wait_for`` (request ids) waits, up to ``timeout`` seconds,
        until each of them is logged (measured: the last 2 of 400 were missing when read at once under load)."""
        want = set(wait_for)
        deadline = time.monotonic() + timeout
        while True:
            records = read_log(self.access_log) if self.access_log else []
            if not want - {r.request_id for r in records} or time.monotonic() > deadline:
                return records
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)  # the keys' file goes with it
            self.workdir = None

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<nginx gateway {self.url if self.port else ''} keys={self.keys.names} {self.route.weights()}>"


def _hostport(url: str) -> str:
    return re.sub(r"^https?://", "", url).rstrip("/")
