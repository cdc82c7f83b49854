"""What every lab plan is made of: the record, the registry, and the arithmetic that says a plan fits.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .. import runtime, sizing

__all__ = ["LabPlan", "PlanError", "LABS", "EFFICIENCY", "GPU_OVERHEAD_GIB", "TINY_TP", "TINY_MOE", "predicted_e2e_s"]

#: The share of the roofline a real engine is assumed to reach when a plan predicts run lengths (measured here,
#: vLLM on CPU reached 0.6-0.7 of bandwidth and compute; a GPU reaches 0.7-0.9 of bandwidth in decode).
EFFICIENCY = 0.5
#: GPU memory a vLLM server needs beyond weights and KV (activations, CUDA graphs, allocator slack), as planned.
GPU_OVERHEAD_GIB = 2.0


class PlanError(ValueError):
    """A plan that does not fit its profile (the message lists each failed check).

    Introduced in lab 01 (One GPU, One Model).
    """


@dataclass
class LabPlan:
    """One lab's device-dependent values for one profile, and the checks that say they fit.

    ``max_model_len``: the longest context the lab's servers take; ``max_request_tokens``: its longest prompt +
    output; ``min_gpu_memory_utilization``: the lowest utilization it starts a server at (``None`` on CPU);
    ``min_run_s``: its shortest measured run (0 when it measures single requests only); ``values``: the rest.
    What it asks of the machine besides time (:mod:`helpers.plan.resources`): ``formats`` (each format the lab
    asks the server for, served here or not and why), ``disk_bytes`` (what it writes: ``peak``, ``kept`` after
    it, ``items``), ``calibration`` (text a quantization build packs, against what ships; ``None``: no build),
    ``servers_on_card`` (the servers it runs at once and each one's KV bytes) and ``tools`` (outside its packages).
    ``time_s``: the wall seconds it is predicted to take here, ``{"total", "cells"}`` (:mod:`helpers.plan.timing`).

    Introduced in lab 01 (One GPU, One Model).
    """

    lab: str
    profile: str
    model: str
    max_model_len: int
    max_request_tokens: int
    min_gpu_memory_utilization: float | None
    min_run_s: float
    values: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    formats: list[dict[str, Any]] = field(default_factory=list)
    disk_bytes: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    servers_on_card: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, str]] = field(default_factory=list)
    time_s: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def fill(self, namespace: dict[str, Any], *knobs: str) -> None:
        """Set each knob of ``namespace`` (a notebook's ``globals()``) that is still ``None`` to this plan's value of
        its lower-case name (a copy): ``PLAN.fill(globals(), "LIMIT", "GATE")``. An override stays, ``0``, ``False``
        and ``[]`` included (``LIMIT or PLAN["limit"]`` dropped them). A knob the plan has no value for is refused,
        with the values it has, and so is one the parameters cell never set.

        Introduced in lab 01 (One GPU, One Model).
        """
        unknown = [k for k in knobs if k.lower() not in self.values]
        if unknown:
            raise KeyError(f"lab {self.lab}'s plan has no value for {', '.join(unknown)}: its values are "
                           f"{', '.join(sorted(self.values))}")
        unset = [k for k in knobs if k not in namespace]
        if unset:
            raise NameError(f"{', '.join(unset)} not defined: run the parameters cell first")
        self._filled = {}
        for k in knobs:
            mine = namespace[k] is None
            if mine:
                namespace[k] = copy.deepcopy(self.values[k.lower()])
            self._filled[k] = (namespace[k], "this device's plan" if mine else "you (the parameters cell)")

    def knobs(self) -> Any:
        """The knobs :meth:`fill` resolved, as the table a lab shows after its setup: each one's value and where it
        came from (this device's plan, or the parameters cell). Long values are cut to a line.

        Introduced in lab 01 (One GPU, One Model).
        """
        import pandas as pd

        filled = getattr(self, "_filled", {})
        rows = [{"knob": k, "value": _one_line(v), "from": src} for k, (v, src) in filled.items()]
        return pd.DataFrame(rows, columns=["knob", "value", "from"]).set_index("knob")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)

    def supported(self, name: str) -> bool:
        """Whether the format called ``name`` in :attr:`formats` is served on this plan's device."""
        found = [f for f in self.formats if f["name"] == name]
        if not found:
            raise KeyError(f"lab {self.lab}'s plan asks for no format {name!r}: {[f['name'] for f in self.formats]}")
        return bool(found[0]["supported"])

    def keeps(self, name: str) -> bool:
        """Whether what the lab writes for configuration ``name`` stays after it (:attr:`disk_bytes`: a later lab
        reuses it); the lab deletes the rest."""
        return any(i["kept"] and i["what"].split(":")[0] == name for i in self.disk_bytes.get("items", []))

    def not_served(self) -> list[str]:
        """One line per format the lab asks for that this device does not serve, with why (a lab prints them
        before it starts, and skips those parts)."""
        return [f"not served on this device: {f['name']}: {f['why']}" for f in self.formats if not f["supported"]]


def _one_line(value: Any, width: int = 90) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 1] + "…"


Planner = Callable[[runtime.Profile, bool], dict[str, Any]]
LABS: dict[str, Planner] = {}


def register(number: str) -> Callable[[Planner], Planner]:
    def deco(fn: Planner) -> Planner:
        LABS[number] = fn
        return fn
    return deco


# ------------------------------------------------------------------------------------ arithmetic
def model_config(profile: runtime.Profile) -> sizing.ModelConfig:
    return sizing.load_config(profile.model, dtype=profile.dtype)


def hardware(profile: runtime.Profile) -> sizing.Hardware:
    return sizing.HARDWARE[profile.hardware]


def predicted_e2e_s(profile: runtime.Profile, prompt: int, output: int, batch: int = 1,
                    model: str | None = None, efficiency: float = EFFICIENCY) -> float:
    """A request's end-to-end seconds as the roofline predicts it at ``efficiency`` of the hardware's peak
    (:data:`EFFICIENCY`, conservative, by default): one prefill of ``prompt`` tokens, then ``output`` decode steps
    shared with ``batch - 1`` others.

    Introduced in lab 01 (One GPU, One Model).
    """
    cfg = sizing.load_config(model, dtype=profile.dtype) if model else model_config(profile)
    hw = hardware(profile)
    pre = sizing.prefill_time(cfg, hw, max(prompt, 1), efficiency=efficiency).time
    step = sizing.decode_step_time(cfg, hw, max(batch, 1), prompt + output // 2, efficiency=efficiency).time
    return pre + output * step


def gpu_fit(profile: runtime.Profile, util: float | None, tokens: int, concurrent: int = 1,
            draft_bytes: int = 0) -> dict[str, Any]:
    """The profile's weights, ``draft_bytes`` of a draft model beside them, and the KV cache of ``concurrent``
    sequences of ``tokens`` within ``util`` of the card."""
    if profile.gpu_memory_gib is None or util is None:
        return {"claim": "CPU: vLLM sizes the KV pool from RAM (no card to fit)", "ok": True}
    cfg = model_config(profile)
    weights = sizing.weight_bytes(cfg).total / 2**30
    kv = concurrent * sizing.kv_bytes_for_context(cfg, tokens) / 2**30
    budget = util * profile.gpu_memory_gib
    need = weights + draft_bytes / 2**30 + kv + GPU_OVERHEAD_GIB
    draft = f" + draft model {draft_bytes / 2**30:.2f} GiB" if draft_bytes else ""
    return {"claim": f"weights {weights:.1f} GiB{draft} + KV of {concurrent} x {tokens:,} tokens {kv:.2f} GiB + "
                     f"{GPU_OVERHEAD_GIB:g} GiB overhead = {need:.1f} GiB <= {util} x {profile.gpu_memory_gib:g} GiB "
                     f"= {budget:.1f} GiB", "ok": need <= budget}


def fit_concurrency(profile: runtime.Profile, util: float | None, tokens: int, top: int, draft_bytes: int = 0) -> int:
    """``top``, halved until ``top`` sequences of ``tokens`` fit the card beside the weights (:func:`gpu_fit`), at
    least 1: an L4 holds 64 of Llama-8B's 384-token sequences, but not beside an EAGLE-3 head."""
    while top > 1 and not gpu_fit(profile, util, tokens, top, draft_bytes)["ok"]:
        top //= 2
    return top


def fits_context(tokens: int, max_model_len: int, what: str) -> dict[str, Any]:
    return {"claim": f"{what}: {tokens:,} tokens <= max_model_len {max_model_len:,}", "ok": tokens <= max_model_len}


def long_enough(profile: runtime.Profile, run_s: float, prompt: int, output: int, batch: int = 1,
                 what: str = "the shortest measured run", model: str | None = None) -> dict[str, Any]:
    e2e = predicted_e2e_s(profile, prompt, output, batch, model)
    return {"claim": f"{what} lasts {run_s:g} s >= 3 x the predicted E2E of one request ({e2e:.2f} s)",
            "ok": run_s >= 3 * e2e}


def gpu(profile: runtime.Profile) -> bool:
    return profile.device == "cuda"


def geometric(top: int, n: int, ratio: int = 2) -> list[int]:
    return [top // ratio ** k for k in range(n - 1, -1, -1)]



# ------------------------------------------------------------------------------------ phase 4
#: A small model this project writes with random weights (``helpers.models.random_checkpoint``) for what the
#: profile's own model cannot show on a CPU: an even number of heads for TP=2, experts for expert parallelism.
TINY_TP, TINY_MOE = "random:tiny-tp", "random:tiny-moe"


def kv_per_token(p: runtime.Profile, model: str | None = None) -> int:
    return int(sizing.kv_bytes_for_context(sizing.load_config(model or p.model, dtype=p.dtype), 1))


def shared_gpu_fit(p: runtime.Profile, replicas: int, tokens: int, model: str | None = None) -> dict[str, Any]:
    """``replicas`` servers of ``model`` sharing one card (what a one-GPU learner runs), each with ``tokens`` of KV."""
    if p.gpu_memory_gib is None:
        return {"claim": "CPU: each replica gets its own cores and its own KV pool in RAM", "ok": True}
    cfg = sizing.load_config(model or p.model, dtype=p.dtype)
    weights = sizing.weight_bytes(cfg).total / 2**30
    kv = sizing.kv_bytes_for_context(cfg, tokens) / 2**30
    share = p.utilization / replicas * p.gpu_memory_gib
    need = weights + kv + GPU_OVERHEAD_GIB
    return {"claim": f"{replicas} replicas on one card: each needs weights {weights:.1f} + KV {kv:.2f} + "
                     f"{GPU_OVERHEAD_GIB:g} GiB = {need:.1f} GiB <= its share {share:.1f} GiB", "ok": need <= share}


#: The longest context a fleet lab gives one of two replicas on a card (lab 20's 32,768-token prompt and its output,
#: in 256-token steps): the KV each copy must hold beside its weights.
FLEET_CONTEXT = 33024


def fleet_model(p: runtime.Profile) -> str:
    """The model a one-card fleet lab runs two replicas of: the profile's, unless two copies, each with the KV of the
    longest fleet request, cannot share the card (an L40S's 45 GiB holds two 8B copies but not their 32k contexts)."""
    if p.gpu_memory_gib is None:
        return p.model
    fits = shared_gpu_fit(p, 2, min(p.max_model_len, FLEET_CONTEXT), p.model)["ok"]
    return p.model if fits else runtime.QWEN_1_5B


