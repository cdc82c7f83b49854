"""Where an OpenAI-compatible server answers: its base URL, its API key and the model it serves, in one type.

A :class:`helpers.server.Server`, a :class:`helpers.fleet.Router` and the gateway all expose ``.endpoint``; the
benchmark, the metrics scraper and the evaluations take one (or anything with ``base_url``). The ``Authorization``
header is built here and nowhere else, so a key is sent the same way everywhere and never logged::

    ep = srv.endpoint                  # Endpoint(url='http://127.0.0.1:40123/v1', api_key=None, model='smollm2')
    ep.ready()                         # GET /v1/models answered 200
    ep.models()                        # the model cards it lists
    http().get(f"{ep.base_url}/models", headers=ep.headers)

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["Endpoint", "Listener", "SendsTo", "auth_headers", "http"]

_CLIENT: httpx.Client | None = None


def http() -> httpx.Client:
    """The one HTTP client the helpers' short requests go through (health polls, scrapes, Prometheus queries, router
    calls). ``httpx.get`` builds a client, and with it a TLS context, for every call: 23 ms of CPU each on this
    project's 2-core machine against 1.2 ms through a kept client (measured), taken from the server being measured
    when a scrape runs once a second beside it. No connection is kept between calls: a server restarted on the same
    port is reached afresh.

    Introduced in lab 01 (One GPU, One Model).
    """
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    return _CLIENT


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request headers that carry ``api_key`` (vLLM's ``--api-key``: a bearer token); none without a key.

    Introduced in lab 01 (One GPU, One Model).
    """
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible base URL (ending in ``/v1``), the key it needs and the model it serves (``None``: ask
    it, :meth:`models`). The key is never part of the ``repr``.

    Introduced in lab 01 (One GPU, One Model).
    """

    url: str
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    @property
    def root(self) -> str:
        """``http://host:port``: where ``/metrics`` and ``/health`` answer, beside the OpenAI routes."""
        return self.base_url.removesuffix("/v1")

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    def models(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The model cards ``GET /models`` lists (``id``: the served name, ``root``: what was loaded,
        ``max_model_len``); raises ``httpx.HTTPError`` when the server does not answer 200."""
        r = http().get(f"{self.base_url}/models", headers=self.headers, timeout=timeout)
        r.raise_for_status()
        return r.json().get("data", [])

    def ready(self, timeout: float = 2.0) -> bool:
        """Whether ``GET /models`` answers 200 now (a readiness probe: no exception, just yes or no)."""
        try:
            return http().get(f"{self.base_url}/models", headers=self.headers, timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False


class Listener:
    """What serves the OpenAI API at ``host``:``port`` (a server, a router): its root URL and its ``/v1`` base URL,
    written once. Subclasses set ``host`` and ``port``.

    Introduced in lab 01 (One GPU, One Model).
    """

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


class SendsTo:
    """What sends requests to an :class:`Endpoint` (its ``endpoint`` field: a benchmark's target, the client's
    configuration): the endpoint's base URL, model and key, read through it rather than kept again.

    Introduced in lab 02 (Prefill and Decode).
    """

    endpoint: Endpoint

    @property
    def base_url(self) -> str:
        return self.endpoint.base_url

    @property
    def model(self) -> str:
        return str(self.endpoint.model)

    @property
    def api_key(self) -> str | None:
        return self.endpoint.api_key
