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
from typing import Any, Mapping

__all__ = ["Price", "PRICES", "price", "CostRow", "cost_per_million", "cost_at_slo", "compare", "RooflineRate",
           "roofline_rate_at_tpot", "Offer", "Deployment"]


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
    "a100-40gb": Price("NVIDIA A100 40GB", 1.20, _GPU_CLOUD, "2026-12"),
    "h100-pcie": Price("NVIDIA H100 PCIe 80GB", 2.00, _GPU_CLOUD, "2026-12"),
    "l40s": Price("NVIDIA L40S 48GB", 0.90, _GPU_CLOUD, "2026-12"),
    "rtx4090": Price("NVIDIA GeForce RTX 4090 24GB", 0.40, _GPU_CLOUD + " (community clouds)", "2026-12"),
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


# ------------------------------------------------------------------------------------ the phase 3 deployment
@dataclass
class Offer:
    """One configuration of a deployment as its search at the SLO priced it: the checkpoint and speculative
    configuration it serves, the highest rate that met the SLO (``None``: none did) with the search's bracket, the
    output tokens per second there, the price and the cost per million output tokens; how to reproduce both;
    ``dtype``, the dtype its server computed in as vLLM logged it (INT8 kernels on a float32 CPU run in bf16: a gate
    against a float32 baseline then includes the dtype's drift). A drafting configuration carries two acceptance
    rates: ``acceptance_rate`` on the speed workload (fixed-length answers, ``ignore_eos``: a model made to write past
    its end tends to loop, and a loop is easy to draft) and ``acceptance_rate_open`` on open prompts answered until
    the model itself stops.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    name: str
    checkpoint: str
    speculative: dict | None
    max_rate_at_slo: float | None
    bracket: tuple | list
    output_tokens_per_s_at_slo: float | None
    price_per_hour: float
    cost_per_million_output_tokens: float | None
    acceptance_rate: float | None = None
    reproduce: dict = dataclasses.field(default_factory=dict)
    dtype: str | None = None
    acceptance_rate_open: float | None = None


def _verdict(gate: dict[str, Any]) -> str:
    """A saved gate's verdict: SAFE, NOT SAFE or INCONCLUSIVE (gates saved before verdicts said only safe or not)."""
    return gate.get("verdict") or ("SAFE" if gate["safe"] else "NOT SAFE")


@dataclass
class Deployment:
    """Phase 3's deliverable: configurations searched at one SLO and priced, the choice, and the evidence that the
    chosen one is the same model: the quantized checkpoint's accuracy gate (``gate``: :meth:`helpers.evals.Gate.as_dict`
    of ``gated_checkpoint``) and, for each drafting configuration, its greedy tokens against those of the same
    checkpoint without drafting (``drafting``: its name to :meth:`helpers.evals.Agreement.as_dict`). A configuration
    is safe when its checkpoint is the baseline's own (the reference every gate compares against) or passed the gate,
    and, if it drafts, its greedy tokens matched (``min_greedy_agreement`` of them before the first difference):
    :meth:`safe` reads that from the evidence, so the report can never call a configuration safe beside a gate that
    said NOT SAFE. :meth:`reasons` says, with the numbers, why each configuration was or was not chosen.

    Introduced in lab 17 (Cost per Million Tokens).
    """

    model: str
    profile: str
    baseline_checkpoint: str
    slo: dict
    workload: dict
    device: str
    price: dict
    offers: list[Offer]
    baseline: str
    gate: dict | None
    gated_checkpoint: str | None
    drafting: dict[str, dict] | None
    min_greedy_agreement: float
    predicted_devices: list[dict] = dataclasses.field(default_factory=list)
    chosen: str | None = None
    #: where the gate's qualities came from: ``"measured"`` (this run), ``"earlier lab 15"`` (lab 15's saved
    #: measurements of the same checkpoint), or both joined by " + "
    gate_basis: str = "measured"

    def __post_init__(self) -> None:
        if self.chosen is None:
            self.chosen = self.choose()

    @property
    def gate_verdict(self) -> str | None:
        """The saved gate's verdict on ``gated_checkpoint`` (SAFE, NOT SAFE or INCONCLUSIVE); None without a gate."""
        return _verdict(self.gate) if self.gate else None

    def offer(self, name: str) -> Offer:
        found = [o for o in self.offers if o.name == name]
        if not found:
            raise KeyError(f"no configuration {name!r} in this deployment: it offers {[o.name for o in self.offers]}")
        return found[0]

    def evidence(self, name: str) -> list[str]:
        """Why configuration ``name`` is the same model as the baseline, or why not: one line per piece of evidence."""
        o, out = self.offer(name), []
        if o.checkpoint == self.baseline_checkpoint:
            out.append("checkpoint: the baseline's own (the reference every gate compares against)")
        elif self.gate is not None and o.checkpoint == self.gated_checkpoint:
            out.append(f"checkpoint: lab 15's gate against the baseline said {_verdict(self.gate)}")
        else:
            out.append("checkpoint: not gated (no accuracy gate measured this checkpoint)")
        if o.speculative:
            d = (self.drafting or {}).get(name)
            out.append("drafting: not compared with the undrafted model" if d is None else
                       f"drafting: greedy tokens matched the undrafted model's on {d['identical']} of {d['prompts']} "
                       f"prompts, {d['share']:.0%} of tokens before the first difference (needs "
                       f"{self.min_greedy_agreement:.0%})")
        return out

    def safe(self, name: str) -> bool:
        """Whether configuration ``name`` is the same model as the baseline, by its evidence (:meth:`evidence`)."""
        return all(self._proven(name))

    def _proven(self, name: str) -> tuple[bool, bool]:
        """(its checkpoint is the baseline's or passed the gate, it drafts not or kept the greedy tokens): the two
        lines of :meth:`evidence` as verdicts."""
        o = self.offer(name)
        checkpoint_ok = o.checkpoint == self.baseline_checkpoint or (
            self.gate is not None and o.checkpoint == self.gated_checkpoint and bool(self.gate["safe"]))
        d = (self.drafting or {}).get(name)
        return checkpoint_ok, not o.speculative or (d is not None and d["share"] >= self.min_greedy_agreement)

    def undrafted(self, name: str) -> Offer | None:
        """The configuration that serves ``name``'s checkpoint without drafting (what its drafting is measured
        against), or None."""
        o = self.offer(name)
        return next((u for u in self.offers if u.checkpoint == o.checkpoint and not u.speculative), None)

    def reasons(self) -> dict[str, str]:
        """Why each configuration was chosen or not, with its numbers: no rate met the SLO; not shown to be the same
        model (the evidence that failed); or its cost against the chosen one's."""
        chosen = self.offer(self.chosen).cost_per_million_output_tokens if self.chosen else None
        out = {}
        for o in self.offers:
            c = o.cost_per_million_output_tokens
            if o.name == self.chosen:
                out[o.name] = f"chosen: the cheapest configuration that met the SLO and is the same model (${c:.4f})"
            elif not c:
                lowest = (o.bracket or [None, None])[1]
                out[o.name] = "met the SLO at no rate searched" + (
                    f" (it missed down to {lowest:g} req/s, its lowest probe)" if lowest else "") + ": not priced"
            elif not self.safe(o.name):
                failed = [e for e, ok in zip(self.evidence(o.name), self._proven(o.name)) if not ok]
                against = f"{'cheaper' if c < chosen else 'no cheaper'} (${c:.4f}, {c / chosen - 1:+.0%})" if chosen \
                    else f"${c:.4f}"
                out[o.name] = f"{against} but not shown to be the same model: " + "; ".join(failed)
            else:
                out[o.name] = f"${c:.4f}: {c / chosen - 1:+.0%} against the chosen one"
        return out

    def choose(self) -> str | None:
        """The cheapest configuration that met the SLO and is safe (the baseline when none beats it): what
        ``chosen`` is set to when a deployment is made; a saved one keeps what it chose. None when no configuration met
        the SLO and is safe (a card too slow for the SLO: the report then says what each missed)."""
        priced = [o for o in self.offers if o.cost_per_million_output_tokens and self.safe(o.name)]
        return min(priced, key=lambda o: o.cost_per_million_output_tokens).name if priced else None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["safe"] = {o.name: self.safe(o.name) for o in self.offers}
        out["evidence"] = {o.name: self.evidence(o.name) for o in self.offers}
        out["reasons"] = self.reasons()
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "Deployment":
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["offers"] = [Offer(**o) for o in d["offers"]]
        if kw.get("drafting") and "share" in kw["drafting"]:  # written before each drafter had its own comparison
            kw["drafting"] = {o.name: kw["drafting"] for o in kw["offers"] if o.speculative}
        return cls(**kw)

    @classmethod
    def load(cls, path) -> "Deployment":
        """Read a deployment written by :meth:`write` (its ``.json``)."""
        import json
        from pathlib import Path

        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_markdown(self) -> str:
        money = lambda x: f"${x:.4f}" if x else "n/a (no rate met the SLO)"  # noqa: E731
        b = self.offer(self.baseline)
        c = self.offer(self.chosen) if self.chosen else b  # nothing chosen: the baseline's facts head the report
        if not self.chosen:
            verdict = ("— none: no configuration met the SLO and is the same model on this device (below: what each "
                       "missed). Loosen the SLO, or serve on a faster card.")
        elif c.name == b.name:
            verdict = "— the baseline itself: no safe configuration made tokens cheaper at the SLO on this device."
        else:
            verdict = f"against {money(b.cost_per_million_output_tokens)} for the {b.name}"
            if c.cost_per_million_output_tokens and b.cost_per_million_output_tokens:
                saving = 1 - c.cost_per_million_output_tokens / b.cost_per_million_output_tokens
                verdict += f" ({saving:.0%} cheaper)." if saving >= 0 else f" ({-saving:.0%} dearer)."
        w, s = self.workload, self.slo
        md = [f"# Phase 3 deployment: {self.model} on {self.profile}", "",
              f"**Chosen: {c.name if self.chosen else 'nothing'}** "
              f"{'— ' + money(c.cost_per_million_output_tokens) + ' per million output tokens ' if self.chosen else ''}"
              f"{verdict}",
              *([f"Chosen configuration the same model as the baseline: **{'yes' if self.safe(c.name) else 'NO'}**:",
                 *[f"- {e}" for e in self.evidence(c.name)]] if self.chosen else []), "",
              f"SLO: {s['attainment']:.0%} of requests within TTFT {s['ttft_ms']} ms and TPOT {s['tpot_ms']} ms; "
              f"workload: {w['input tokens']} prompt and {w['output tokens']} output tokens, Poisson arrivals; price: "
              f"{self.device} at ${self.price['usd_per_hour']}/hour ({self.price['source']}, {self.price['as_of']}).", "",
              "| configuration | checkpoint | compute dtype | speculative (acceptance) | max rate at SLO (req/s) | "
              "output tok/s at SLO | $/hour | $ per M output | same model |", "|---|---|---|---|---|---|---|---|---|"]
        pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
        for o in self.offers:
            spec = "-" if not o.speculative else (f"{o.speculative} ({pct(o.acceptance_rate)} of drafts accepted; "
                                                  f"{pct(o.acceptance_rate_open)} on open prompts)")
            md.append(f"| {o.name} | `{o.checkpoint}` | {o.dtype or '-'} | {spec} | {o.max_rate_at_slo} | "
                      f"{o.output_tokens_per_s_at_slo or 0:.1f} | {o.price_per_hour} | "
                      f"{money(o.cost_per_million_output_tokens)} | {'yes' if self.safe(o.name) else 'NO'} |")
        md += ["", "## Why this configuration", ""] + [f"- **{n}**: {r}" for n, r in self.reasons().items()]
        for o in self.offers:
            u = self.undrafted(o.name) if o.speculative else None
            if u is not None and u.output_tokens_per_s_at_slo and o.output_tokens_per_s_at_slo:
                md.append(f"- Drafting on `{u.name}`: {o.output_tokens_per_s_at_slo / u.output_tokens_per_s_at_slo:.2f}x "
                          "its output tokens per second at the SLO.")
            if o.acceptance_rate is not None and o.acceptance_rate_open is not None:
                md.append(f"- {o.name}'s drafter accepted {o.acceptance_rate:.0%} of its drafts on the speed workload "
                          f"(fixed-length answers, the end of text ignored) and {o.acceptance_rate_open:.0%} on open "
                          "prompts answered until the model stopped" + (
                              ": a model made to write past its end loops, and a loop is easy to draft. Its rate "
                              "above holds for that workload; on open text drafting pays less."
                              if o.acceptance_rate > o.acceptance_rate_open + 0.1 else "."))
        if self.gate is not None:
            g = self.gate
            md += ["", f"## The gate: `{self.gated_checkpoint}` against the baseline: "
                   f"{_verdict(g)}", ""] + [f"- {r}" for r in g["reasons"]]
            d = g["figures"]["drift"]
            md += ["", f"Drift: KL {d['kl_mean']:.4f} nats/token (95% CI {d['kl_ci'][0]:.4f}-{d['kl_ci'][1]:.4f}), "
                   f"top-1 agreement {d['top1']:.1%} (95% CI {d['top1_ci'][0]:.1%}-{d['top1_ci'][1]:.1%}) over "
                   f"{d['positions']:,} positions."]
        if self.predicted_devices:
            md += ["", "## Other cards (predicted by the roofline, not measured)", "",
                   "| row | kind | $/hour | output tok/s | $ per M output |", "|---|---|---|---|---|"]
            md += [f"| {r['row']} | {r['kind']} | {r['$/hour']} | {r['output tok/s']:.1f} | {r['$ per M output']:.4f} |"
                   for r in self.predicted_devices]
        md += ["", "## Reproduce", ""]
        for o in (b, c) if self.chosen and c.name != b.name else (b,):
            md += [f"**{o.name}**", "", "```", o.reproduce.get("server", ""), o.reproduce.get("bench", ""), "```", ""]
        return "\n".join(md)

    def write(self, directory, charts: Mapping | None = None, provenance: Mapping | None = None) -> dict:
        """``phase3_deployment.{md,json,html}`` (and the charts' PNGs) in ``directory``, through
        :func:`helpers.artifacts.write`."""
        from . import artifacts

        md = self.to_markdown()
        return artifacts.write(directory, "phase3_deployment", title=md.splitlines()[0][2:], markdown=md,
                               data=self.as_dict(), basis=self.basis(), charts=charts, provenance=provenance)

    def basis(self) -> dict[str, str]:
        """How each field of the deliverable is known (see :func:`helpers.artifacts.check_basis`)."""
        gate = f"{self.gate_basis}: the accuracy gate's qualities of the baseline and the quantized checkpoint"
        return {
            "model": "no numbers", "profile": "no numbers", "baseline_checkpoint": "no numbers", "slo": "input",
            "workload": "input", "device": "no numbers", "price": "catalog: the hourly price and its source",
            "offers": "measured + catalog: each configuration's rate at the SLO measured in this run, priced at the "
                      "catalog price", "baseline": "no numbers", "gate": gate, "gated_checkpoint": "no numbers",
            "drafting": "measured: each drafter's greedy tokens against its checkpoint's without drafting, compared "
                        "in this run",
            "min_greedy_agreement": "input", "predicted_devices": "predicted + catalog: roofline rates at the SLO's "
            "TPOT on catalog devices, priced at catalog prices", "chosen": "no numbers",
            "gate_basis": "no numbers", "safe": f"{self.gate_basis} + measured: read from the evidence (the gate; "
            "drafting's greedy tokens compared in this run)", "evidence": f"{self.gate_basis} + measured",
            "reasons": f"{self.gate_basis} + measured + catalog: the evidence and each configuration's cost"}
