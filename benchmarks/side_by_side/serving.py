"""The server under test: one vLLM started with the CPU profile (stopped on exit), or one you already run."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

from .records import Target, server_under_test

__all__ = ["serving", "warm_up", "first_model", "MAX_MODEL_LEN"]

MAX_MODEL_LEN = 1024  # the loads here need a few hundred tokens; a short context starts faster and holds less


@contextlib.contextmanager
def serving(base_url: str | None = None, model: str | None = None, tokenizer: str | None = None,
            max_model_len: int = MAX_MODEL_LEN, wait_for_slot_s: float = 300.0,
            log: Callable[[str], None] = print) -> Iterator[tuple[Target, Any]]:
    """``(target, server)``: the given server (``server`` is then None), or one started with the detected profile
    through :func:`helpers.server.start` and always stopped on exit, never parked.

    The start never stops a parked server to make room (``make_room=False``): on a machine shared with a
    notebook run that parks its servers for reuse, that server may be about to be adopted. At the machine's
    limit of servers it waits for a slot instead, up to ``wait_for_slot_s``.
    """
    from helpers import models, runtime, server

    tok = tokenizer or str(models.default_model(quiet=True))
    if base_url:
        yield server_under_test(base_url.rstrip("/"), model or first_model(base_url), tok), None
        return
    prof = runtime.profile()
    deadline = time.monotonic() + wait_for_slot_s
    while True:
        try:
            log(f"starting vLLM ({prof.name} profile, {prof.dtype}, max_model_len {max_model_len}) ...")
            srv = server.start(prof, max_model_len=max_model_len, progress=False, reuse=False, make_room=False)
            break
        except server.TooManyServers as e:
            if time.monotonic() > deadline:
                raise
            log(f"waiting for a server slot: {str(e).splitlines()[0]}")
            time.sleep(15)
    try:
        log(f"vLLM ready at {srv.base_url} (PID {srv.pid}, {srv.ready_s:.0f} s)")
        yield server_under_test(srv.base_url, srv.model, tok), srv
    finally:
        srv.stop()  # reuse=False: always stopped, never parked


def first_model(base_url: str) -> str:
    """The first model a server lists at ``/v1/models``."""
    from helpers.endpoint import Endpoint

    return Endpoint(base_url).models()[0]["id"]


def warm_up(target: Target, n: int = 3) -> None:
    """A few requests before any measured run (prompts disjoint from every tool's), so that no tool
    pays for the server's first requests."""
    from helpers import bench

    spec = bench.FixedLength(input_len=64, output_len=16, endpoint="completions", tokenizer=target.model_path)
    bench.run(spec, bench.Synchronous(), base_url=target.base_url, model=target.model, num_requests=n, seed=10_000,
              out=False, progress=False, server_metrics=False)
