"""N vLLM replicas of one profile on one machine, each with its own share of the device, started together.

::

    reps = fleet.start_replicas(PROFILE, 2, max_num_seqs=4)        # two servers, ready, in about one start's time
    with fleet.Router(reps, policy="cache_aware") as router:
        ...
    fleet.stop_replicas(reps)

What each replica gets is decided here from the machine, never in a lab (:func:`replica_env`):

- on CPU, a contiguous block of cores for its worker threads (``VLLM_CPU_OMP_THREADS_BIND``); two workers bound to
  the same cores would halve each other's speed (measured here: vLLM binds every worker to all cores by default);
- on GPUs, its own card (``CUDA_VISIBLE_DEVICES``) when there are enough, else a share of the one card
  (``gpu_memory_utilization`` divided by the replicas, the way two vLLM processes can share a GPU).

Every replica of a fleet runs with ``--enable-scale-out`` (vllm-router's ``cache_aware`` policy tokenizes through
``/v1/completions/render``, which vLLM 0.32 refuses without it).

Introduced in lab 22 (Routing and Autoscaling).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .. import procs
from ..runtime import Machine, Profile, detect
from ..server import Server, TooManyServers
from ..server import start as start_server

__all__ = ["replica_env", "replica_overrides", "start_replica", "start_replicas", "stop_replicas", "core_blocks",
           "tp_env", "parallel_slots"]


def core_blocks(cpu_count: int, n: int) -> list[str]:
    """Split ``cpu_count`` cores into ``n`` contiguous blocks in vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` syntax.

    ``core_blocks(2, 2) == ["0", "1"]``; ``core_blocks(8, 3) == ["0-2", "3-5", "6-7"]``.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if n < 1:
        raise ValueError(f"a fleet needs at least one replica, got {n}")
    if cpu_count < n:
        raise ValueError(f"{n} replicas need at least {n} cores to bind one each; this machine has {cpu_count}. "
                         "Run fewer replicas (each CPU replica needs a core of its own).")
    size, extra = divmod(cpu_count, n)
    blocks, start = [], 0
    for i in range(n):
        width = size + (1 if i < extra else 0)
        end = start + width - 1
        blocks.append(str(start) if end == start else f"{start}-{end}")
        start = end + 1
    return blocks


def replica_env(profile: Profile, index: int, n: int, machine: Machine | None = None) -> dict[str, str]:
    """The environment replica ``index`` of ``n`` needs on this machine (its cores or its card).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    machine = machine or detect()
    if not 0 <= index < n:
        raise ValueError(f"replica index {index} outside 0..{n - 1}")
    if profile.device == "cpu":
        return _bound(core_blocks(machine.cpu_count, n)[index])
    gpus = len(machine.gpus)
    if gpus >= n:
        return {"CUDA_VISIBLE_DEVICES": str(index)}
    return {"CUDA_VISIBLE_DEVICES": "0"} if gpus else {}


def parallel_slots(profile: Profile, machine: Machine | None = None) -> int:
    """How many ranks one server can split over on this machine: its GPUs, or on CPU its cores (one per rank).

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    machine = machine or detect()
    return max(1, machine.cpu_count if profile.device == "cpu" else len(machine.gpus))


def tp_env(profile: Profile, tp: int, machine: Machine | None = None) -> dict[str, str]:
    """The environment a server with ``tp`` tensor-parallel ranks needs: on CPU one block of cores per rank
    (``VLLM_CPU_OMP_THREADS_BIND='0|1'``: vLLM's syntax, ranks separated by ``|``); on GPUs nothing (ranks take the
    first ``tp`` visible cards).

    Introduced in lab 18 (Tensor and Pipeline Parallel).
    """
    machine = machine or detect()
    slots = parallel_slots(profile, machine)
    if tp > slots:
        raise ValueError(f"tensor_parallel_size={tp} needs {tp} {'cores' if profile.device == 'cpu' else 'GPUs'}; "
                         f"this machine has {slots}")
    if profile.device == "cpu":
        return _bound("|".join(core_blocks(machine.cpu_count, tp)))
    return {}


def _bound(cores: str) -> dict[str, str]:
    """A CPU server's threads bound to ``cores`` (vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` syntax).

    vLLM binds a worker's OpenMP threads only in its multiprocessing executor, which the CPU profile turns off for
    single servers (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one import less a start): turned back on here, or the
    binding is silently ignored (a TP=1 server, a replica) and the threads roam over every core."""
    return {"VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def replica_overrides(profile: Profile, n: int, machine: Machine | None = None) -> dict[str, Any]:
    """Engine arguments every replica of ``n`` gets on this machine: ``enable_scale_out``, and on a GPU shared by
    several replicas each one's share of the card.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    machine = machine or detect()
    out: dict[str, Any] = {"enable_scale_out": True}
    if profile.device != "cpu" and len(machine.gpus) < n:
        out["gpu_memory_utilization"] = round(profile.utilization / n, 3)
    return out


def _replica_kwargs(profile: Profile, index: int, of: int, port: int | None, machine: Machine,
                    env: dict[str, str] | None, progress: bool, reuse: bool | None,
                    engine_overrides: dict[str, Any]) -> dict[str, Any]:
    return dict(replica_overrides(profile, of, machine), **engine_overrides,
                env={**(env or {}), **replica_env(profile, index, of, machine)},
                port=port, reuse=reuse, make_room=True, progress=progress)


def start_replica(profile: Profile, index: int, of: int, *, port: int | None = None, machine: Machine | None = None,
                  env: dict[str, str] | None = None, progress: bool = True, reuse: bool | None = False,
                  **engine_overrides: Any) -> Server:
    """Start replica ``index`` of a fleet of ``of`` (its cores or card, ``--enable-scale-out``) and wait until ready.

    What an autoscaler calls to add a replica: ``start_replica(PROFILE, 1, 2, port=port_b, **same_overrides)``.
    ``reuse`` as in :func:`start_replicas` (a replica it adopts keeps its own port, not ``port``).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    machine = machine or detect()
    return start_server(profile, **_replica_kwargs(profile, index, of, port, machine, env, progress, reuse,
                                                   engine_overrides))


def start_replicas(profile: Profile, n: int = 2, *, ports: Sequence[int | None] | None = None,
                   machine: Machine | None = None, env: dict[str, str] | None = None,
                   parallel: bool = True, reuse: bool | None = False, **engine_overrides: Any) -> list[Server]:
    """Start ``n`` replicas of ``profile`` (together when ``parallel``), each bound to its share of the device.

    ``ports`` fixes their ports (e.g. one picked in advance for a replica the autoscaler starts later); the rest
    is :func:`helpers.server.start`'s. If one fails, the others are stopped too and the error says which.
    By default replicas are not parked for reuse (a fleet's servers carry per-replica bindings, and lab 20's and 21's
    hold connector state). ``reuse=None`` follows ``LABS_REUSE_SERVER`` as a single server does: a replica parks when
    stopped and a later start with the same arguments and index adopts it (labs 22 and 23 share their two, so
    a run of both with reuse on starts them once).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    machine = machine or detect()
    ports = list(ports) if ports is not None else [None] * n
    if len(ports) != n:
        raise ValueError(f"{len(ports)} ports for {n} replicas")
    kwargs = [_replica_kwargs(profile, i, n, ports[i], machine, env, not parallel, reuse, engine_overrides)
              for i in range(n)]
    if parallel and n > 1:
        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(start_server, profile, **kw) for kw in kwargs]
            started, errors = [], []
            for i, fut in enumerate(futures):
                try:
                    started.append(fut.result())
                except Exception as exc:  # collect every failure, then stop what did start
                    errors.append((i, exc))
        if errors:
            stop_replicas(started)
            i, exc = errors[0]
            if isinstance(exc, TooManyServers):
                raise exc
            raise RuntimeError(f"replica {i} of {n} failed to start, so the fleet was stopped: {exc}") from exc
        return started
    started = []
    try:
        for kw in kwargs:
            started.append(start_server(profile, **kw))
    except BaseException:
        stop_replicas(started)
        raise
    return started


def stop_replicas(replicas: Sequence[Server]) -> None:
    """Stop every replica and its process tree; one started with reuse on is parked instead (see
    :func:`start_replicas`).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    for r in replicas:
        r.stop()
    procs.reap(verbose=False)
