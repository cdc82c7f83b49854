"""How long a lab takes on a profile: predicted wall seconds for each cell that does real work, from the plan's own
values, so an instructor can price a sequence before renting the card.

Every lab's plan carries ``time_s`` (``{"total": …, "cells": [{"cell", "s"}, …]}``; each lab's working cells are
in :mod:`helpers.plan.lab_times`)::

    python -m helpers.plan h100 --json     # each lab's time_s; helpers.plan.sequence_time("h100") sums them

A cell's seconds are built from a few parts, each with its basis:

- **a server start** (:func:`start`): on a GPU about 45 s before the weights (vLLM's import, the engine's memory
  profile, the torch.compile cache read and CUDA-graph capture: vLLM issue #20264 logs "init engine ... took 34.11
  seconds" and a first response 59 s after launch for a 3.4 GiB model with its compile cache warm; PR #10460 logs
  "Graph capturing finished in 15 secs" for Llama-3-8B), plus the weights read at :data:`DISK_BPS`; on this
  project's CPU profile about 22 s (measured: a vLLM 0.32 start of the 135M model on a 2-core EPYC);
- **a model's first use** (:func:`download`): its bytes at :data:`HUB_BPS` (nothing on CPU: the model ships);
- **requests** (:func:`requests`): ``n`` of them, ``concurrency`` at a time, each as long as the roofline predicts
  (:func:`e2e`: at :data:`EXPECTED_EFFICIENCY`, what engines reach, where the plans' checks use a conservative
  half);
- **a timed run** (:func:`run`): its duration, plus the drain of the requests still in flight;
- **a quantization build** (:func:`build`): the weights read and written, plus, for a calibrated recipe, two
  forward passes of the calibration text and a solve priced per Linear input column (:data:`COLUMN_S`, measured on
  the CPU, assumed on a GPU);
- **tokenizing** (:func:`tokenize`): the client's CPU at :data:`TOKENIZE_PER_S`;
- **every other cell**: :data:`CELL_S` (imports, tables, charts).

These are predictions, not measurements: :func:`helpers.plan.time_against` sets them beside what a run measured
(``make test-labs`` records each cell's seconds in ``runs/lab_seconds.json``); :func:`helpers.plan.sequence_time`
sums a profile's sequence with each model's first download.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .. import runtime, sizing
from .core import gpu, predicted_e2e_s

__all__ = ["start", "download", "e2e", "requests", "run", "build", "tokenize", "cell", "lab_time", "TIMES", "CELL_S",
           "EXPECTED_EFFICIENCY", "COLUMN_S", "DISK_BPS", "HUB_BPS", "TOKENIZE_PER_S", "GPU_START_S", "CPU_START_S",
           "CELL_LIMIT_S"]

#: The share of the roofline a time prediction expects (the plans' run-length checks assume a conservative 0.5):
#: measured on an H200, Llama-3.1-8B's decode matmuls read at 0.72 of the card's bandwidth and its prefill matmuls
#: ran at 0.57-0.68 of its bf16 peak (shared/notes, h200-measured); vLLM on this project's CPU reached 0.6-0.7.
EXPECTED_EFFICIENCY = 0.7
#: Seconds of a cell that only computes, prints or draws.
CELL_S = 1.0
#: A server start before its weights: GPU (vLLM issue #20264, PR #10460; see the module's docstring) and CPU
#: (measured here: the 135M model's start took 20-24 s on a 2-core EPYC, vLLM 0.32).
GPU_START_S, CPU_START_S = 45.0, 22.0
#: Local disk read while loading weights (a cloud NVMe or the page cache after the first start).
DISK_BPS = 2e9
#: A model's first download from the Hugging Face hub (a cloud machine's typical rate).
HUB_BPS = 2e8
#: Tokens a fast (Rust) tokenizer encodes per second on one core of the client.
TOKENIZE_PER_S = 1e6
#: Seconds a GPTQ solve spends per input column of a Linear layer (it quantizes one column at a time and updates
#: the rest of its block): on the CPU profile measured (GPTQ over all 30 layers of SmolLM2-135M, 149,760 columns,
#: 16 samples: 18 minutes on a 2-core CPU, 7 ms a column); on a GPU assumed at 0.2 ms (a column's ten-odd small
#: kernels at launch latency: about 4 minutes for Llama-3.1-8B's 1.25 M columns).
COLUMN_S = {"cuda": 2e-4, "cpu": 7e-3}
#: The instructor's runner stops a cell after this long (``ci/run_sequence.py --timeout``).
CELL_LIMIT_S = 3600.0


def _weights(p: runtime.Profile, model: str | None) -> float:
    if model and model.startswith("random:"):
        return 0.0
    return float(sizing.weight_bytes(sizing.load_config(model or p.model, dtype=p.dtype)).total)


def start(p: runtime.Profile, model: str | None = None, *, tp: int = 1) -> float:
    """Seconds from launch to a server that answers: fixed start-up plus the weights read from local disk (``tp``
    GPUs read their shards side by side).

    Introduced in lab 01 (One GPU, One Model).
    """
    base = GPU_START_S if gpu(p) else CPU_START_S
    return base + _weights(p, model) / DISK_BPS / max(tp, 1)


def download(p: runtime.Profile, model: str | None = None) -> float:
    """Seconds to fetch ``model`` (the profile's) from the hub the first time; 0 on CPU, whose model ships.

    Introduced in lab 01 (One GPU, One Model).
    """
    return _weights(p, model) / HUB_BPS if gpu(p) else 0.0


def e2e(p: runtime.Profile, prompt: int, output: int, batch: int = 1, model: str | None = None) -> float:
    """One request's predicted seconds at :data:`EXPECTED_EFFICIENCY` (:func:`helpers.plan.core.predicted_e2e_s`).

    Introduced in lab 01 (One GPU, One Model).
    """
    return predicted_e2e_s(p, prompt, output, batch, model, efficiency=EXPECTED_EFFICIENCY)


def requests(p: runtime.Profile, n: int, prompt: int, output: int, concurrency: int = 1,
             model: str | None = None) -> float:
    """Seconds for ``n`` requests of ``prompt`` + ``output`` tokens sent ``concurrency`` at a time (waves).

    Introduced in lab 01 (One GPU, One Model).
    """
    c = max(1, min(concurrency, n)) if n else 1
    return math.ceil(max(n, 0) / c) * e2e(p, prompt, output, c, model)


def run(p: runtime.Profile, seconds: float, prompt: int = 0, output: int = 0, concurrency: int = 1) -> float:
    """A load run of ``seconds`` plus the drain of its last requests (one predicted E2E at ``concurrency``).

    Introduced in lab 10 (Load Testing Honestly).
    """
    return float(seconds) + (e2e(p, prompt, output, concurrency) if output else 0.0)


def build(p: runtime.Profile, calibrated: bool, tokens: int = 0, model: str | None = None,
          share: float = 1.0) -> float:
    """A quantization build of ``model`` (``share``: the fraction of its layers quantized): the weights read and
    written at :data:`DISK_BPS`; a calibrated recipe (GPTQ, AWQ, SmoothQuant) adds ``tokens`` of calibration text
    through each layer twice (llm-compressor's sequential pipeline captures a layer's inputs, then propagates its
    quantized outputs: two forward passes, at a quarter of the prefill roofline) and the solve, which quantizes one
    input column of each Linear layer at a time (:data:`COLUMN_S` per column).

    Introduced in lab 13 (FP4 on Blackwell).
    """
    io = 2 * _weights(p, model) / DISK_BPS
    if not calibrated:
        return io + (5.0 if gpu(p) else 10.0)
    cfg = sizing.load_config(model or p.model, dtype=p.dtype)
    forward = 2 * sizing.prefill_time(cfg, sizing.HARDWARE[p.hardware], max(tokens, 1), efficiency=0.25).time
    columns = cfg.layers * (5 * cfg.hidden + cfg.heads * cfg.head_dim + cfg.intermediate)  # q, k, v, gate, up; o; down
    return io + share * (forward + columns * COLUMN_S["cuda" if gpu(p) else "cpu"])


def tokenize(tokens: float) -> float:
    """The client's seconds to tokenize ``tokens`` (a haystack, a calibration set).

    Introduced in lab 15 (Proving Quantization Safe).
    """
    return tokens / TOKENIZE_PER_S


def cell(name: str, seconds: float) -> dict[str, Any]:
    """One cell's predicted seconds, named by its index in the notebook and what it does (``"cell 13: ..."``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return {"cell": name, "s": round(float(seconds), 1)}


Timer = Callable[[runtime.Profile, dict[str, Any], bool], list[dict[str, Any]]]
#: Each lab's cells that do work, as a function of its profile, its plan's values and whether it runs quick.
TIMES: dict[str, Timer] = {}


def times(number: str) -> Callable[[Timer], Timer]:
    def deco(fn: Timer) -> Timer:
        TIMES[number] = fn
        return fn
    return deco


#: Code cells a lab has besides those that do work (the notebooks hold 20-40 code cells).
OTHER_CELLS = 30


def lab_time(number: str, p: runtime.Profile, values: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    """Lab ``number``'s predicted wall seconds: its working cells (:data:`TIMES`) and :data:`CELL_S` for each of
    :data:`OTHER_CELLS` more; ``{"total", "cells"}``.

    Introduced in lab 01 (One GPU, One Model).
    """
    work = TIMES[number](p, values, quick) if number in TIMES else []
    out = work + [cell("every other cell", OTHER_CELLS * CELL_S)]
    return {"total": round(sum(c["s"] for c in out), 1), "cells": out}
