"""What a benchmark run is told besides its workload, arrivals and target, in three typed groups: how much it sends
(:class:`Size`), how each request is sent (:class:`Sending`), and where its records go and what it watches
(:class:`Recording`).

A lab keeps the groups its plan decides and names only what differs at the call; any field may also be passed to
:func:`~helpers.bench.run` by name, and then wins over the group's value::

    size = bench.Size(num_requests=200, warmup=8)
    bench.run(wl, bench.Poisson(4), base_url=srv, size=size, label="rate 4")      # Recording's label
    bench.run(wl, bench.Poisson(8), base_url=srv, size=size, seed=1)               # the same size, another seed

Introduced in lab 02 (Prefill and Decode).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from .health import ClientLimits

__all__ = ["Size", "Sending", "Recording", "resolve_options"]


@dataclasses.dataclass(frozen=True)
class Size:
    """How much a run sends: ``num_requests``, or ``duration_s`` seconds of the arrivals (not both); ``warmup``
    requests first, which count nowhere; ``seed`` builds the prompts.

    Introduced in lab 02 (Prefill and Decode).
    """

    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests= or duration_s=, not both")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0 seconds, got {self.duration_s}")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


@dataclasses.dataclass(frozen=True)
class Sending:
    """How each request is sent, and by whom: sampling ``temperature``, a per-request ``timeout_s``, vLLM's extra
    fields (``vllm_extras``: ``min_tokens``, ``ignore_eos``, the usage stream) and any ``extra_body``; ``workers``
    sending processes (1, N or ``"auto"``) and the ``client_limits`` past which the client, not the server, set
    the numbers.

    Introduced in lab 02 (Prefill and Decode).
    """

    temperature: float = 0.0
    timeout_s: float = 600.0
    vllm_extras: bool = True
    extra_body: Mapping[str, Any] | None = None
    workers: int | str = 1
    client_limits: ClientLimits | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")


@dataclasses.dataclass(frozen=True)
class Recording:
    """Where a run's records go and what it watches: ``out`` (a folder; ``True`` for a new one under
    ``runs/bench/``; ``False`` for none; ``None``: none in a notebook, a new one from a script), a ``label``, the
    ``command`` that reproduces it, a ``progress`` bar (``None``: in a notebook), and the server's ``/metrics``
    (``server_metrics``, its gauges sampled every ``sample_interval_s``).

    Introduced in lab 02 (Prefill and Decode).
    """

    out: str | Path | bool | None = None
    label: str | None = None
    command: str | None = None
    progress: bool | None = None
    server_metrics: bool = True
    sample_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.sample_interval_s > 0:
            raise ValueError(f"sample_interval_s must be > 0 seconds, got {self.sample_interval_s}")


_GROUPS = (Size, Sending, Recording)


def resolve_options(size: Size | None = None, sending: Sending | None = None, recording: Recording | None = None,
                    **options: Any) -> tuple[Size, Sending, Recording]:
    """The three groups a run uses: those given (or the defaults), each field named in ``options`` replacing the
    group's value (a size given in requests at the call drops the group's seconds, and the reverse). An option no
    group has is refused with the names there are.

    Introduced in lab 02 (Prefill and Decode).
    """
    given = [size, sending, recording]
    for group, value in zip(_GROUPS, given):
        if value is not None and not isinstance(value, group):
            raise TypeError(f"{group.__name__.lower()}= takes a bench.{group.__name__}, got {type(value).__name__}")
    fields = {f.name: i for i, group in enumerate(_GROUPS) for f in dataclasses.fields(group)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TypeError(f"bench.run got unknown option(s) {', '.join(unknown)}; it takes {', '.join(fields)} "
                        "(or the groups size=, sending=, recording=)")
    if size is not None and options.get("num_requests") is not None:  # sized in requests at the call: not also
        size = dataclasses.replace(size, duration_s=None)                # in the group's seconds
    if size is not None and options.get("duration_s") is not None:
        size = dataclasses.replace(size, num_requests=None)
    given[0] = size
    out = []
    for i, (group, value) in enumerate(zip(_GROUPS, given)):
        mine = {k: v for k, v in options.items() if fields[k] == i}
        out.append(dataclasses.replace(value or group(), **mine) if mine else (value or group()))
    return out[0], out[1], out[2]
