"""Cost per million tokens: an hourly price over tokens per second measured *at the SLO*.

Pure functions over prices and measured rates — nothing here measures; the labs bring the rates::

    row = cost.cost_at_slo("h100", output_tokens_per_s=2300.0, input_tokens_per_s=9100.0)
    row.per_million_output     # USD per million output tokens

The rate must be the one a configuration sustains while meeting its SLO (``max_rate_at_slo`` from
:func:`helpers.bench.find_max_rate`, times the tokens per request), never peak throughput: a server run past its knee
makes more tokens per second and misses every user's latency target. ``utilization`` charges the idle hours a real
deployment pays for (a GPU reserved around the clock and busy 60% of it costs 1/0.6 as much per token).

Prices are editable assumptions, dated and sourced in :data:`PRICES` — not quotes.

Introduced in lab 17 (Cost per Million Tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Price", "PRICES", "price", "CostRow", "cost_per_million", "cost_at_slo", "compare", "RooflineRate",
           "roofline_rate_at_tpot"]


@dataclass(frozen=True)
class Price:
    """An hourly price for one device (per GPU, or the whole machine for a CPU VM), with where it came from.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    device: str
    usd_per_hour: float
    source: str
    as_of: str

    def with_price(self, usd_per_hour: float, source: str = "your quote") -> "Price":
        """The same device at another price (your contract, spot, a reservation)."""
        return dataclasses.replace(self, usd_per_hour=float(usd_per_hour), source=source)


_GPU_CLOUD = ("assumption: typical on-demand USD per GPU-hour at specialist GPU clouds (hyperscalers list more, spot "
              "and committed use less); replace with your quote")

#: Hourly prices by device key (the keys of ``helpers.sizing.HARDWARE``). Edit freely; every lab takes them from here.
PRICES: dict[str, Price] = {
    "t4": Price("NVIDIA T4 16GB", 0.35, _GPU_CLOUD, "2026-12"),
    "l4": Price("NVIDIA L4 24GB", 0.70, _GPU_CLOUD, "2026-12"),
    "a10g": Price("NVIDIA A10G 24GB", 1.00, _GPU_CLOUD, "2026-12"),
    "a100": Price("NVIDIA A100 SXM 80GB", 1.50, _GPU_CLOUD, "2026-12"),
    "h100": Price("NVIDIA H100 SXM 80GB", 2.50, _GPU_CLOUD, "2026-12"),
    "h200": Price("NVIDIA H200 SXM 141GB", 3.50, _GPU_CLOUD, "2026-12"),
    "h200-measured": Price("NVIDIA H200 SXM 141GB", 3.50, _GPU_CLOUD + " (the same card as h200)", "2026-12"),
    "b200": Price("NVIDIA B200 180GB", 5.50, _GPU_CLOUD, "2026-12"),
    "cpu": Price("2-vCPU cloud VM, 24 GB", 0.10,
                 "assumption: a general-purpose 2-vCPU/24 GB on-demand VM (the machine the CPU labs run on)", "2026-12"),
}


def price(device: str) -> Price:
    """The catalog price of ``device`` (a ``helpers.sizing.HARDWARE`` key), or a message naming the known ones.

    Introduced in lab 17 (Cost per Million Tokens).
    """
    if device not in PRICES:
        raise KeyError(f"no price for {device!r}: known devices are {', '.join(PRICES)}; add yours to "
                       "helpers.cost.PRICES (or pass usd_per_hour=...)")
    return PRICES[device]


def cost_per_million(usd_per_hour: float, tokens_per_s: float, devices: int = 1, utilization: float = 1.0) -> float:
    """USD per million tokens: ``devices`` x ``usd_per_hour`` spent over ``tokens_per_s`` x 3,600 tokens an hour,
    divided by ``utilization`` (the share of paid hours that carry this load).

    Introduced in lab 17 (Cost per Million Tokens).
    """
    if tokens_per_s <= 0:
        raise ValueError(f"tokens_per_s must be positive, got {tokens_per_s}: a configuration that meets the SLO at "
                         "no rate has no cost per token (it cannot serve the workload)")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization is a share of paid hours in (0, 1], got {utilization}")
    return devices * usd_per_hour / (tokens_per_s * 3600.0) * 1e6 / utilization


@dataclass(frozen=True)
class CostRow:
    """One configuration's cost at its SLO-meeting rate.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    name: str
    device: str
    devices: int
    usd_per_hour: float
    price_source: str
    output_tokens_per_s: float
    input_tokens_per_s: float | None
    utilization: float
    per_million_output: float
    per_million_input: float | None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def cost_at_slo(device: str, output_tokens_per_s: float, input_tokens_per_s: float | None = None, *,
                name: str | None = None, devices: int = 1, usd_per_hour: float | None = None,
                utilization: float = 1.0) -> CostRow:
    """Cost per million output (and input) tokens of one configuration on ``devices`` x ``device``.

    Both figures charge the same hours: a server makes its input and output tokens in the same time, so they are two
    views of one bill, not two bills to add. ``usd_per_hour`` overrides the catalog price (per device).

    Introduced in lab 17 (Cost per Million Tokens).
    """
    p = price(device) if usd_per_hour is None else Price(device, float(usd_per_hour), "given", "-")
    out = cost_per_million(p.usd_per_hour, output_tokens_per_s, devices, utilization)
    inp = cost_per_million(p.usd_per_hour, input_tokens_per_s, devices, utilization) if input_tokens_per_s else None
    return CostRow(name=name or device, device=device, devices=devices, usd_per_hour=p.usd_per_hour,
                   price_source=p.source, output_tokens_per_s=float(output_tokens_per_s),
                   input_tokens_per_s=input_tokens_per_s, utilization=utilization, per_million_output=out,
                   per_million_input=inp)


def compare(rows: list[CostRow], baseline: str | None = None) -> list[dict]:
    """Rows as dicts with each one's cost relative to ``baseline`` (the first row by default).

    Introduced in lab 17 (Cost per Million Tokens).
    """
    if not rows:
        return []
    base = next((r for r in rows if r.name == baseline), rows[0])
    return [{**r.as_dict(), "vs baseline": r.per_million_output / base.per_million_output} for r in rows]


@dataclass(frozen=True)
class RooflineRate:
    """A *predicted* decode rate at a TPOT target: the largest batch whose roofline step time meets the target and
    whose KV cache fits beside the weights, and the output tokens per second that batch makes.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    device: str
    weight_dtype: str
    batch: int
    step_ms: float
    output_tokens_per_s: float
    bound: str
    limited_by: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def roofline_rate_at_tpot(model: str, device: str, tpot_ms: float, context: int, *, weight_dtype: str = "auto",
                          kv_dtype: str = "auto", tp: int = 1, link: str = "nvlink4", efficiency: float = 0.5,
                          memory_share: float = 0.9, max_batch: int = 4096) -> RooflineRate:
    """The output tokens per second ``device`` (a ``helpers.sizing.HARDWARE`` key) is *predicted* to make with
    ``model`` while every step stays within ``tpot_ms``: decode steps of a batch each holding ``context`` tokens,
    from the roofline at ``efficiency`` of the peak; the batch doubles until the step misses the target or the KV
    cache no longer fits in ``memory_share`` of the card beside the weights. With ``tp`` > 1, ``tp`` such cards
    split the model (bandwidth, FLOP/s and memory times ``tp``) and each step adds its all-reduces over ``link`` (a
    ``helpers.sizing.LINKS`` key; lab 18's ring model). A prediction for devices this machine is not — label it so
    next to measured rows; ``output_tokens_per_s`` is the whole group's.

    Introduced in lab 17 (Cost per Million Tokens); ``tp`` in lab 24 (Putting It All Together).
    """
    from . import sizing

    if tp < 1:
        raise ValueError(f"tp is a number of cards, >= 1; got {tp}")
    cfg = sizing.load_config(model)
    hw = sizing.HARDWARE[device].times(tp)
    budget = memory_share * hw.memory_gib * 2**30 - sizing.weight_bytes(cfg, weight_dtype, strict=False).total
    per_seq = sizing.kv_bytes_for_context(cfg, context, kv_dtype)

    def step(b: int) -> tuple[float, str]:
        st = sizing.decode_step_time(cfg, hw, b, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                     efficiency=efficiency)
        comm = sizing.tp_comm_per_step(cfg, b, tp, sizing.LINKS[link]) if tp > 1 else 0.0
        return st.time + comm, ("all-reduce" if comm > st.time else st.bound)

    best, why, b = None, "the TPOT target at batch 1", 1
    while b <= max_batch:
        t, bound = step(b)
        if t * 1e3 > tpot_ms:
            why = f"the TPOT target (batch {b} steps in {t * 1e3:.1f} ms)"
            break
        if b * per_seq > budget:
            why = f"memory (batch {b} needs {b * per_seq / 2**30:.1f} GiB of KV cache)"
            break
        best, b = (b, t, bound), b * 2
    else:
        why = f"the batch cap {max_batch}"
    if best is None:
        raise ValueError(f"{model} on {tp} x {device} misses a TPOT of {tpot_ms} ms even at batch 1 (limited by {why})")
    lo, hi = best[0], min(b, max_batch + 1)  # lo fits, hi does not: bisect to the largest batch that fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t, bound = step(mid)
        if t * 1e3 <= tpot_ms and mid * per_seq <= budget:
            lo, best = mid, (mid, t, bound)
        else:
            hi = mid
    batch, t, bound = best
    if hi <= max_batch:
        t_next, _ = step(hi)
        why = (f"the TPOT target (batch {hi} steps in {t_next * 1e3:.1f} ms)" if t_next * 1e3 > tpot_ms else
               f"memory (batch {hi} needs {hi * per_seq / 2**30:.1f} GiB of KV cache)")
    return RooflineRate(device=device if tp == 1 else f"{tp} x {device}", weight_dtype=weight_dtype, batch=batch,
                        step_ms=t * 1e3, output_tokens_per_s=batch / t, bound=bound, limited_by=why)


def hardware_prices() -> Mapping[str, float]:
    """``{device: usd_per_hour}`` for every priced device."""
    return {k: v.usd_per_hour for k, v in PRICES.items()}
