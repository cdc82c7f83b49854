"""A Prometheus server for a lab's fleet: started on the config and rules ``observability`` writes, queried back.

::

    files = observability.write_prometheus(folder, [a.url, b.url], router=router.metrics_url, slo=slo)
    with fleet.Prometheus(files) as prom:
        ...                                          # scrapes every second
        prom.query('sum(vllm:num_requests_waiting)')
        frame = prom.query_range_frame('fleet:ttft_seconds:p99_30s', start, end)
        prom.alerts()                                # what fired

Prometheus is Debian's ``prometheus`` package (``make setup`` installs it: ``scripts/install_tools.sh``), run as a
:class:`helpers.procs.Proc`. Its data lives in a folder of the run, so a postmortem can query it after the fact.

Introduced in lab 23 (Observability and the Postmortem).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from .. import procs, settings
from ..endpoint import http
from .observability import PrometheusFiles, query_range_frame

__all__ = ["Prometheus", "prometheus_executable"]


def prometheus_executable() -> str:
    """The ``prometheus`` binary, or a message saying how to install it.

    Introduced in lab 23 (Observability and the Postmortem).
    """
    found = shutil.which("prometheus")
    if not found:
        raise FileNotFoundError("Prometheus is not installed: `apt-get install -y prometheus` on Debian/Ubuntu (make "
                                "setup runs scripts/install_tools.sh, which does), or put the prometheus binary of a "
                                "2.x release from https://prometheus.io/download/ on PATH")
    return found


class Prometheus:
    """A Prometheus process on 127.0.0.1 with ``files`` (its config and rule files) and its own data folder.

    Introduced in lab 23 (Observability and the Postmortem).
    """

    def __init__(self, files: PrometheusFiles, *, port: int | None = None, data_dir: str | Path | None = None,
                 retention: str = "1d", ready_timeout: float = 60.0):
        self.files, self.port, self.retention, self.ready_timeout = files, port, retention, ready_timeout
        self.data_dir = Path(data_dir) if data_dir else Path(files.config).parent / "data"
        self.proc: procs.Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Prometheus":
        if self.proc is not None and self.proc.running:
            return self
        self.port = self.port or procs.free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [prometheus_executable(), f"--config.file={self.files.config}",
               f"--web.listen-address=127.0.0.1:{self.port}", f"--storage.tsdb.path={self.data_dir}",
               f"--storage.tsdb.retention.time={self.retention}", "--web.enable-lifecycle"]
        self.proc = procs.Proc(cmd, kind="prometheus", name="prometheus", host="127.0.0.1", port=self.port,
                               log_path=settings.log_dir() / f"prometheus-{self.port}.log").start()
        self.proc.wait_ready(self._ready, self.ready_timeout, what="Prometheus", interval=0.2)
        return self

    def _ready(self) -> bool:
        try:
            return http().get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _api(self, path: str, **params: Any) -> Any:
        r = http().get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: HTTP {r.status_code} {body.get('error', r.text[:200])}")
        return body["data"]

    def query(self, expr: str, t: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: ``[(labels, value), ...]``."""
        data = self._api("query", query=expr, **({"time": t} if t is not None else {}))
        return [(r["metric"], float(r["value"][1])) for r in data.get("result", [])]

    def value(self, expr: str, default: float = float("nan")) -> float:
        """The single value of an instant query that returns one series (``default`` when it returns none)."""
        rows = self.query(expr)
        return rows[0][1] if rows else default

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> dict:
        """A range query's JSON payload (``status``/``data``), as the HTTP API returns it."""
        return {"status": "success", "data": self._api("query_range", query=expr, start=start, end=end, step=step)}

    def query_range_frame(self, expr: str, start: float, end: float, step: float = 1.0):
        """A range query as a pandas DataFrame (``observability.query_range_frame``)."""
        return query_range_frame(self.query_range(expr, start, end, step))

    def alerts(self) -> list[dict]:
        """The alerts pending or firing now."""
        return list(self._api("alerts").get("alerts", []))

    def targets_up(self) -> dict[str, bool]:
        """Each scrape target and whether its last scrape worked."""
        data = self._api("targets")
        return {t["scrapeUrl"]: t["health"] == "up" for t in data.get("activeTargets", [])}

    def wait_for_targets(self, timeout: float = 30.0) -> dict[str, bool]:
        """Wait until every target has been scraped once (or ``timeout``); returns their health."""
        deadline = time.monotonic() + timeout
        up: dict[str, bool] = {}
        while time.monotonic() < deadline:
            up = self.targets_up()
            if up and all(up.values()):
                break
            time.sleep(0.5)
        return up

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
