"""The Sizing Sheet: what the arithmetic predicts, next to what the server measured."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import artifacts
from .config import ModelConfig, load_config, normalize_dtype
from .hardware import Hardware
from .kv import kv_bytes_for_context, kv_bytes_per_token, vllm_kv_capacity
from .params import param_count, resolved_weight_dtype, weight_bytes
from .roofline import decode_step_time, prefill_time

__all__ = ["Prediction", "SizingSheet", "predict_sheet", "plan_sheet"]


#: How each field of a Sizing Sheet is known (see :func:`helpers.artifacts.check_basis`).
SHEET_BASIS = {
    "model": "no numbers", "hardware": "input: the device the rows are computed for (its rates: see the rows' sources)",
    "context": "input", "weight_dtype": "input", "kv_dtype": "input", "notes": "no numbers",
    "rows": "predicted + measured: each row's prediction, and where this run measured it, the measurement and error",
}


@dataclass(frozen=True)
class Prediction:
    """One row of the sheet: a predicted value, and the measured one once the lab has it.

    ``error`` = (predicted - measured) / measured, ``None`` until measured (or when measured is 0).
    ``measured_ci`` is the measurement's own 95% CI where it has one (a timing on a shared machine does).

    Introduced in lab 05 (Where the Time Goes).
    """

    name: str
    predicted: float
    measured: float | None = None
    unit: str = ""
    source: str = ""          # how the prediction was made
    measured_by: str = ""     # how the measurement was made
    measured_ci: tuple[float, float] | None = None

    @property
    def error(self) -> float | None:
        if self.measured is None or self.measured == 0:
            return None
        return (self.predicted - self.measured) / self.measured

    def agrees(self, tolerance: float) -> bool:
        """Within ``tolerance`` of the measurement; with a CI, within ``tolerance`` of some value inside it.

        A measurement known only to +-5% cannot show that a prediction misses by 12% rather than 7%: the
        prediction fails only when it is more than ``tolerance`` away from every value the measurement allows.
        """
        if self.error is None:
            return True
        if self.measured_ci is None:
            return abs(self.error) <= tolerance
        lo, hi = self.measured_ci
        return lo * (1 - tolerance) <= self.predicted <= hi * (1 + tolerance)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if unit == "s":
        return f"{value * 1e3:,.2f} ms" if abs(value) < 1 else f"{value:,.3f} s"
    if unit == "x":
        return f"{value:,.2f}x"
    if abs(value) >= 1000 or (float(value).is_integer() and abs(value) >= 1):
        text = f"{round(value):,}"
        if unit == "bytes" and value >= 2**20:
            text += f" ({value / 2**30:,.2f} GiB)"
        return text
    return f"{value:,.4g}"


@dataclass
class SizingSheet:
    """Predictions for one model on one machine at one context, with room for the measurements.

    ``sheet.measure("kv_cache_tokens", srv.startup.kv_cache_tokens)`` fills a measured value;
    ``sheet.within(0.10)`` lists the rows that miss by more than 10%; ``sheet.write("reports/")``
    saves ``sizing_sheet.md`` and ``sizing_sheet.json``.

    Introduced in lab 05 (Where the Time Goes).
    """

    model: str
    hardware: str
    context: int
    weight_dtype: str
    kv_dtype: str
    rows: list[Prediction] = field(default_factory=list)
    notes: str = ""

    # ---------------------------------------------------------------- rows
    def add(self, name: str, predicted: float, unit: str = "", source: str = "", measured: float | None = None
            ) -> Prediction:
        """Append (or replace) a row; returns it."""
        row = Prediction(name, predicted, measured, unit, source)
        self.rows = [r for r in self.rows if r.name != name] + [row]
        return row

    def __getitem__(self, name: str) -> Prediction:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.rows)

    def measure(self, name: str, value: float, measured_by: str = "",
                ci: tuple[float, float] | None = None) -> Prediction:
        """Record the measured value of row ``name``, how it was measured and, for a noisy one, its 95% CI."""
        if ci is not None and not ci[0] <= value <= ci[1]:
            raise ValueError(f"{name}: measured {value} lies outside its own CI {ci}")
        old = self[name]
        new = dataclasses.replace(old, measured=value, measured_by=measured_by,
                                  measured_ci=None if ci is None else (float(ci[0]), float(ci[1])))
        self.rows = [new if r.name == name else r for r in self.rows]
        return new

    def within(self, tolerance: float) -> list[Prediction]:
        """Rows whose measured value misses the prediction by more than ``tolerance`` (0.1 = 10%),
        allowing for the measurement's CI where it has one (see :meth:`Prediction.agrees`).

        Rows not yet measured are not listed (see :meth:`unmeasured`)."""
        return [r for r in self.rows if not r.agrees(tolerance)]

    def unmeasured(self) -> list[Prediction]:
        return [r for r in self.rows if r.measured is None]

    # ----------------------------------------------------------- rendering
    def as_dict(self) -> dict[str, Any]:
        """Plain data: header fields and rows (with their errors)."""
        return {
            "model": self.model, "hardware": self.hardware, "context": self.context,
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype, "notes": self.notes,
            "rows": [{**dataclasses.asdict(r), "error": r.error} for r in self.rows],
        }

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SizingSheet":
        """Rebuild a sheet from :meth:`as_dict` output (``error`` is recomputed, not read)."""
        rows = [Prediction(r["name"], r["predicted"], r.get("measured"), r.get("unit", ""), r.get("source", ""),
                           r.get("measured_by", ""), tuple(r["measured_ci"]) if r.get("measured_ci") else None)
                for r in data.get("rows", [])]
        return cls(model=data["model"], hardware=data["hardware"], context=int(data["context"]),
                   weight_dtype=data["weight_dtype"], kv_dtype=data["kv_dtype"], rows=rows,
                   notes=data.get("notes", ""))

    @classmethod
    def read(cls, path: str | Path) -> "SizingSheet":
        """Load ``sizing_sheet.json`` (or a folder holding it)."""
        p = Path(path)
        if p.is_dir():
            p = p / "sizing_sheet.json"
        return cls.from_dict(json.loads(p.read_text()))

    def to_markdown(self) -> str:
        """A Markdown table: quantity, predicted, measured, error, how each was obtained."""
        lines = [
            f"# Sizing Sheet: {self.model}",
            "",
            f"- hardware: {self.hardware}",
            f"- context: {self.context:,} tokens",
            f"- weights: {self.weight_dtype}, KV cache: {self.kv_dtype}",
        ]
        if self.notes:
            lines.append(f"- notes: {self.notes}")
        lines += ["", "| quantity | predicted | measured | error | predicted by | measured by |",
                  "|---|---:|---:|---:|---|---|"]
        for r in self.rows:
            err = "" if r.error is None else f"{r.error:+.1%}"
            unit = f" ({r.unit})" if r.unit and r.unit not in ("s", "x") else ""
            measured = _fmt(r.measured, r.unit) + (
                f" (95% CI {_fmt(r.measured_ci[0], r.unit)} to {_fmt(r.measured_ci[1], r.unit)})" if r.measured_ci else "")
            lines.append(f"| {r.name}{unit} | {_fmt(r.predicted, r.unit)} | {measured} | {err} | "
                         f"{r.source} | {r.measured_by} |")
        return "\n".join(lines) + "\n"

    def write(self, directory: str | Path, charts: Mapping[str, Any] | None = None,
              provenance: Mapping[str, Any] | None = None, stem: str = "sizing_sheet") -> dict[str, Any]:
        """Write the sheet as ``sizing_sheet.md``, ``.json`` and ``.html`` (with ``charts`` as PNGs and
        ``provenance``) into ``directory``; returns the paths (see :func:`helpers.artifacts.write`)."""
        return artifacts.write(directory, stem, title=f"Sizing Sheet: {self.model}", markdown=self.to_markdown(),
                               data=self.as_dict(), basis=SHEET_BASIS, charts=charts, provenance=provenance)


def predict_sheet(
    cfg: "ModelConfig | Mapping[str, Any] | str",
    hw: Hardware,
    context: int,
    kv_cache_bytes: int | None = None,
    block_size: int | None = None,
    batch: int = 1,
    *,
    prompt_tokens: int | None = None,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    max_model_len: int | None = None,
    tp: int = 1,
    efficiency: float = 1.0,
    max_num_batched_tokens: int = 2048,
    concurrent_batches: int = 1,
    model_name: str | None = None,
    prefill_fit: Any = None,
    decode_fit: Any = None,
    checkpoint_dtype: str | None = None,
) -> SizingSheet:
    """Fill a :class:`SizingSheet` with predictions; the lab fills in what vLLM measured.

    Rows: ``params_total``, ``params_active``, ``weight_bytes``, ``kv_bytes_per_token``,
    ``kv_bytes_per_request`` (one sequence of ``context`` tokens), and when ``kv_cache_bytes`` and
    ``block_size`` are given ``num_blocks``, ``kv_cache_tokens`` and ``max_concurrency`` (vLLM's
    accounting with ``max_model_len``, default ``context``); ``ttft_s`` (prefill of ``prompt_tokens``,
    default ``context``, at batch 1), ``decode_step_s`` and ``decode_tokens_per_s`` (``batch``
    sequences at ``context``); with ``checkpoint_dtype`` (the weights' dtype on disk, when the server runs another)
    also ``checkpoint_bytes``. Times are roofline ideals at ``efficiency`` of the peak, unless a
    :class:`~helpers.sizing.calibrate.PrefillFit` / :class:`~helpers.sizing.calibrate.DecodeFit` is given:
    then they are the fit's predictions (rates achieved on short, cheap runs, carried to ``context``),
    with the roofline ideal named in the row's source.

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    wd, kd = normalize_dtype(weight_dtype), normalize_dtype(kv_dtype)
    kd = cfg.dtype if kd == "auto" else kd
    wb = weight_bytes(cfg, wd, strict=False)
    sheet = SizingSheet(model=model_name or cfg.name, hardware=hw.name, context=int(context),
                        weight_dtype=resolved_weight_dtype(cfg, wd), kv_dtype=kd)
    p = param_count(cfg)
    sheet.add("params_total", p.total, "params", "param_count")
    sheet.add("params_active", p.active, "params", "param_count (top-k experts)")
    sheet.add("weight_bytes", wb.total, "bytes", f"weight_bytes({sheet.weight_dtype}), as served")
    if checkpoint_dtype is not None:
        ck = weight_bytes(cfg.replace(dtype=normalize_dtype(checkpoint_dtype)), "auto", strict=False)
        sheet.add("checkpoint_bytes", ck.total, "bytes", f"weight_bytes({normalize_dtype(checkpoint_dtype)}), on disk")
    sheet.add("kv_bytes_per_token", kv_bytes_per_token(cfg, kd, tp=tp), "bytes", "kv_bytes_per_token (full layers)")
    sheet.add("kv_bytes_per_request", kv_bytes_for_context(cfg, context, kd, tp=tp), "bytes",
              f"kv_bytes_for_context({context})")
    if kv_cache_bytes is not None and block_size is not None:
        cap = vllm_kv_capacity(cfg, kv_cache_bytes, block_size, max_model_len or context, kd, tp,
                               max_num_batched_tokens=max_num_batched_tokens, concurrent_batches=concurrent_batches)
        src = f"vllm_kv_capacity(block {block_size}, max_model_len {cap.max_model_len})"
        sheet.add("num_blocks", cap.num_blocks, "blocks", src)
        sheet.add("kv_cache_tokens", cap.kv_cache_tokens, "tokens", src)
        sheet.add("max_concurrency", cap.max_concurrency, "x", src)
    prompt = prompt_tokens or context
    pf = prefill_time(cfg, hw, prompt, weight_dtype=wd, kv_dtype=kd, efficiency=efficiency)
    if prefill_fit is not None:
        sheet.add("ttft_s", prefill_fit.predict(prompt), "s",
                  f"prefill fit on {'/'.join(str(n) for n, _ in prefill_fit.points)} tokens, carried to {prompt} "
                  f"(roofline ideal {pf.time * 1e3:,.0f} ms)")
    else:
        sheet.add("ttft_s", pf.time, "s", f"prefill_time({prompt} tokens), {pf.bound}-bound")
    dec = decode_step_time(cfg, hw, batch, context, wd, kd, efficiency=efficiency)
    if decode_fit is not None:
        step = decode_fit.predict(batch, context)
        sheet.add("decode_step_s", step, "s",
                  f"decode fit on contexts {'/'.join(str(c) for _, c, _ in decode_fit.points)}, carried to {context} "
                  f"(roofline ideal {dec.time * 1e3:,.1f} ms)")
        sheet.add("decode_tokens_per_s", batch / step, "tokens/s", f"batch {batch} / decode_step_s")
    else:
        sheet.add("decode_step_s", dec.time, "s", f"decode_step_time(batch {batch}), {dec.bound}-bound")
        sheet.add("decode_tokens_per_s", dec.tokens_per_s, "tokens/s", f"batch {batch} / decode_step_s")
    if efficiency != 1.0:
        sheet.notes = f"times at {efficiency:.0%} of peak FLOP/s and bandwidth"
    return sheet


def check_request(cfg: ModelConfig, context: int, *, gpu_memory_utilization: float = 0.9, tp: int = 1,
                  batch: int = 1) -> None:
    """Refuse a sizing question vLLM would refuse, in one line that says what to give instead: a context beyond the
    model's ``max_position_embeddings`` (vLLM: "User-specified max_model_len ... is greater than the derived
    max_model_len"), a utilization outside (0, 1], a count below one.

    Introduced in lab 05 (Where the Time Goes).
    """
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a whole number of tokens, at least 1 (got {context!r})")
    limit = cfg.max_position_embeddings
    if limit and context > limit:
        raise ValueError(f"context {context:,} is longer than {cfg.name}'s limit of {limit:,} tokens "
                         "(max_position_embeddings): ask for at most that, as vLLM's max_model_len would")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization is a share of the card, in (0, 1] (got {gpu_memory_utilization!r}): "
                         "0.9 is vLLM's default")
    for name, n in (("tp", tp), ("batch", batch)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a whole number, at least 1 (got {n!r})")


def plan_sheet(
    model: "ModelConfig | Mapping[str, Any] | str",
    hw: Hardware,
    context: int,
    batch: int = 1,
    *,
    weight_dtype: str = "auto",
    kv_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    reserve_gib: float = 2.0,
    tp: int = 1,
    block_size: int = 16,
) -> SizingSheet:
    """A what-if Sizing Sheet before renting anything: ``model`` on ``hw`` (per device, ``tp`` devices).

    KV memory per device = ``gpu_memory_utilization`` x memory - weights / ``tp`` - ``reserve_gib``
    (activations and CUDA graphs; vLLM measures these, 1-3 GiB for an 8B model). Raises ``ValueError``
    when the weights do not fit, and :class:`~helpers.sizing.kv.CacheTooSmall` when one request of
    ``context`` tokens does not fit in what is left. Pure: the lab's sliders call it.

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(model)
    check_request(cfg, context, gpu_memory_utilization=gpu_memory_utilization, tp=tp, batch=batch)
    wd = normalize_dtype(weight_dtype)
    weights = weight_bytes(cfg, wd, strict=False).total
    budget = gpu_memory_utilization * hw.memory_gib * 2**30
    kv = int(budget - weights / tp - reserve_gib * 2**30)
    if kv <= 0:
        raise ValueError(
            f"{cfg.name} in {resolved_weight_dtype(cfg, wd)} needs {weights / tp / 2**30:.1f} GiB of weights per device, "
            f"more than {gpu_memory_utilization:.0%} of {hw.name}'s {hw.memory_gib:.0f} GiB leaves: quantize "
            "(lab 12), or split it over more devices (tp, lab 18)."
        )
    sheet = predict_sheet(cfg, hw, context, kv_cache_bytes=kv, block_size=block_size, batch=batch,
                          weight_dtype=wd, kv_dtype=kv_dtype, tp=tp, model_name=cfg.name)
    sheet.notes = (f"KV cache = {gpu_memory_utilization:.0%} x {hw.memory_gib:.0f} GiB - weights/{tp} - "
                   f"{reserve_gib:g} GiB reserve = {kv / 2**30:.1f} GiB per device; times are roofline ideals")
    return sheet
