"""Fixtures shared by the test files.

``cpu_server``: one real vLLM server (the CPU profile, max_model_len 1024, ``swappable=True``) for the tests marked
``vllm`` that need nothing but a running server of the default model: each start costs 40-60 s here (two
processes importing vLLM in turn), and ``make test`` runs inside a budget. Started at its first use and stopped when
the session ends, never parked. A test that swaps weights into it gets the original weights back after it, pass or
fail, so the next test finds the server it expects.
"""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def _cpu_server_session():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM installed")
    from helpers import runtime, server

    # a notebook run's servers on this machine: wait up to 10 minutes for a slot, never stop a parked one
    srv = server.start(runtime.profile("cpu"), max_model_len=1024, swappable=True, reuse=False, progress=False,
                       make_room=False, wait_for_slot_s=600)
    try:
        yield srv
    finally:
        srv.terminate()


@pytest.fixture
def cpu_server(_cpu_server_session):
    """The session's CPU-profile server, holding the weights it started with."""
    srv = _cpu_server_session
    if not srv.running:
        pytest.fail(f"the shared vLLM server (PID {srv.pid}) died in an earlier test:\n{srv.log_tail()}")
    yield srv
    if srv.running and srv.weights_path is not None:
        srv.swap_weights(srv.model_path)
