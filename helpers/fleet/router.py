"""vllm-router in front of vLLM replicas: start it with a policy, add and remove workers live, read its metrics.

::

    with fleet.Router([a.url, b.url], policy="cache_aware") as router:
        bench.run(workload, arrivals, base_url=router)          # the router speaks the OpenAI API
        router.add_worker(c.url)                                # a replica joins while traffic flows
        router.metrics().value("vllm_router_processed_requests_total", worker=c.url)

The router is PyPI ``vllm-router`` (a Rust binary with a Python launcher), run as a :class:`helpers.procs.Proc`
(registered, logged, its tree stopped on exit). Its metrics live on a port of their own (``metrics_url``).

Gotchas measured here (``phase4-fleet-findings.md``): ``cache_aware`` tokenizes each request by calling
``/v1/completions/render`` on the workers, which vLLM 0.32 refuses unless the replica runs with
``--enable-scale-out`` — without it the router silently routes by load (its metric says ``outcome="missing_tokens"``);
``power_of_two`` refuses to start with one worker; a request already queued on a replica never moves to one added
later.

Introduced in lab 22 (Routing and Autoscaling).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import httpx

from .. import metrics, procs
from ..endpoint import Endpoint, Listener, http

__all__ = ["Router", "router_executable", "POLICIES"]

#: The routing policies vllm-router 0.1.17 accepts.
POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
            "sticky_least_loaded")


def router_executable() -> str:
    """The ``vllm-router`` launcher of this environment (next to the interpreter), or a message saying how to get it.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    here = Path(sys.executable).parent / "vllm-router"
    found = str(here) if here.is_file() else shutil.which("vllm-router")
    if not found:
        raise FileNotFoundError("vllm-router is not installed in this environment: `pip install vllm-router==0.1.17` "
                                "(make setup does; it is a pure wheel, no torch)")
    return found


class Router(Listener):
    """A vllm-router process routing OpenAI requests over vLLM workers (or prefill/decode pools with ``pd``).

    ``workers`` are server roots (``http://127.0.0.1:PORT``) or servers with ``.url``. ``pd=(prefill_urls,
    decode_url)`` starts it in prefill/decode disaggregation mode instead. ``base_url`` ends in ``/v1``, so a
    :class:`Router` can be passed wherever a server is (``bench.run(..., base_url=router)``).

    Introduced in lab 22 (Routing and Autoscaling).
    """

    def __init__(self, workers: Sequence[Any] = (), policy: str = "round_robin", *, host: str = "127.0.0.1",
                 port: int | None = None, metrics_port: int | None = None,
                 pd: tuple[Sequence[Any], Any] | None = None, extra_args: Sequence[str] = (),
                 ready_timeout: float = 60.0, model: str | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; vllm-router 0.1.17 has {', '.join(POLICIES)}")
        urls = [_root(w) for w in workers]
        if policy == "power_of_two" and len(urls) < 2 and pd is None:
            raise ValueError("power_of_two needs at least 2 workers (vllm-router refuses to start otherwise)")
        if not urls and pd is None:
            raise ValueError("a router needs workers: start the replicas first and pass their URLs")
        self.workers, self.policy, self.host = urls, policy, host
        self.port, self.metrics_port = port, metrics_port
        self.pd = (tuple(_root(u) for u in pd[0]), _root(pd[1])) if pd else None
        self.extra_args, self.ready_timeout = list(extra_args), ready_timeout
        self.proc: procs.Proc | None = None
        self._model = model

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def endpoint(self) -> Endpoint:
        """Where the router answers (:class:`helpers.endpoint.Endpoint`): its ``/v1`` and the model it routes."""
        return Endpoint(self.base_url, model=self._model)

    @property
    def model(self) -> str | None:
        if self._model is None:
            cards = Endpoint(self.base_url).models()
            self._model = cards[0]["id"] if cards else None
        return self._model

    def command(self) -> list[str]:
        args = [router_executable(), "--host", self.host, "--port", str(self.port), "--policy", self.policy,
                "--prometheus-host", self.host, "--prometheus-port", str(self.metrics_port)]
        if self.pd:
            args += ["--vllm-pd-disaggregation", "--prefill", *self.pd[0], "--decode", self.pd[1]]
        else:
            args += ["--worker-urls", *self.workers]
        return args + self.extra_args

    def start(self) -> "Router":
        if self.proc is not None and self.proc.running:
            return self
        self.port = self.port or procs.free_port(self.host)
        self.metrics_port = self.metrics_port or procs.free_port(self.host)
        self.proc = procs.Proc(self.command(), kind="router", name=f"vllm-router {self.policy}", host=self.host,
                               port=self.port, meta={"metrics_port": self.metrics_port}).start()
        self.proc.wait_ready(self._ready, self.ready_timeout, what="vllm-router", interval=0.2,
                             hint=lambda log: "a worker URL is wrong or not up yet: start the replicas first"
                             if "worker" in log.lower() else "")
        return self

    def _ready(self) -> bool:
        try:
            return http().get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def add_worker(self, worker: Any) -> str:
        """Add a worker while the router runs (``POST /add_worker?url=``); returns the router's answer."""
        url = _root(worker)
        r = http().post(f"{self.url}/add_worker", params={"url": url}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vllm-router refused to add {url}: HTTP {r.status_code} {r.text[:200]}")
        self.workers.append(url)
        return r.text

    def remove_worker(self, worker: Any) -> str:
        """Remove a worker (``POST /remove_worker?url=``); requests already sent to it finish there."""
        url = _root(worker)
        r = http().post(f"{self.url}/remove_worker", params={"url": url}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"vllm-router refused to remove {url}: HTTP {r.status_code} {r.text[:200]}")
        self.workers = [w for w in self.workers if w != url]
        return r.text

    def list_workers(self) -> list[str]:
        """The workers the router routes to now (``GET /list_workers``)."""
        return list(http().get(f"{self.url}/list_workers", timeout=10).json().get("urls", []))

    def metrics(self) -> metrics.Snapshot:
        """The router's own Prometheus metrics (requests per worker, policy decisions, prefix-routing outcomes)."""
        r = http().get(self.metrics_url, timeout=10)
        r.raise_for_status()
        return metrics.parse(r.text)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def __enter__(self) -> "Router":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<vllm-router {self.policy} {self.url if self.port else ''} over {len(self.workers)} workers>"


def _root(worker: Any) -> str:
    url = worker if isinstance(worker, str) else getattr(worker, "url", None)
    if not url:
        raise TypeError(f"a worker is a URL or a server with .url, got {type(worker).__name__}")
    return metrics.server_root(url)
