"""Helpers for LLM Serving Labs.

One module per concept; each lab imports what it needs::

    from helpers import runtime, server, sizing, bench

- ``runtime``: which machine this is and the profile (model, dtype, memory knobs) a lab runs with.
- ``models``: the embedded default model (SmolLM2-135M-Instruct, converted offline).
- ``server``: a vLLM server as a context manager, and its startup log as a typed record.
- ``sizing``: parameters, weights, KV cache, vLLM's own capacity accounting, the roofline.
- ``bench``: the load generator and its metrics (TTFT, TPOT, ITL, goodput).
"""

__version__ = "0.1.0"
