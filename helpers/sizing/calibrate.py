"""Calibrated timing models: fit what this machine achieves on cheap, short measurements, then predict
the expensive long-context ones — and check the prediction against a run.

The roofline (:mod:`.roofline`) gives the ideal: FLOPs over peak FLOP/s, bytes over peak bandwidth.
Real kernels reach a fraction of it, and that fraction is a property of the machine and the engine,
not of the context length. So a capacity planner measures it once where measuring is cheap and
carries it to where it is not:

- **prefill** (compute-bound): ``t = overhead + linear_FLOPs / R_linear + attention_FLOPs / R_attention``.
  The matmuls (2 x parameters per token) and attention (quadratic in the prompt) run at different
  achieved rates, so each gets its own; fitted by least squares on a few prompt lengths.
- **decode** (memory-bound): ``t = overhead + bytes_read / B_achieved``, where a step reads the weights
  once plus every sequence's KV cache; fitted on short contexts, it predicts long ones (the KV term grows).

Each fit keeps its points and residuals, and reports the achieved fraction of the measured ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .config import ModelConfig, load_config
from .hardware import Hardware, compute_flops
from .roofline import _attention_flops, _decode_work, _matmul_params, _weight_dtype

__all__ = ["PrefillFit", "DecodeFit", "LinearFit", "fit_prefill", "fit_decode", "fit_line", "prefill_flops"]


@dataclass
class LinearFit:
    """``y = intercept + slope * x`` fitted by least squares, with R² and the points it was fitted on.

    Lab 02 reads prefill as a fixed cost plus a cost per prompt token, and a decode step as a fixed cost (reading
    the weights) plus a cost per sequence in the batch.

    Introduced in lab 02 (Prefill and Decode).
    """

    intercept: float
    slope: float
    r2: float
    points: list[tuple[float, float]] = field(default_factory=list)

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    def residuals(self) -> list[float]:
        """Relative error at each fitted point (prediction / measurement - 1)."""
        return [self.predict(x) / y - 1 for x, y in self.points]


def fit_line(points: Iterable[tuple[float, float]]) -> LinearFit:
    """Least-squares line through ``(x, y)`` points (at least two distinct x).

    Introduced in lab 02 (Prefill and Decode).
    """
    pts = [(float(x), float(y)) for x, y in points]
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if len(set(xs)) < 2:
        raise ValueError("a line needs points at two or more distinct x")
    slope, intercept = np.polyfit(xs, ys, 1)
    pred = intercept + slope * xs
    ss_tot = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - float(((ys - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(float(intercept), float(slope), r2, pts)


def prefill_flops(cfg: "ModelConfig | Mapping[str, Any] | str", tokens: int, cached: int = 0) -> tuple[float, float]:
    """(linear FLOPs, attention FLOPs) to prefill ``tokens`` after ``cached`` ones: the two terms of :func:`fit_prefill`.

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    linear = 2.0 * _matmul_params(cfg) * tokens + 2.0 * cfg.vocab * cfg.hidden
    return linear, _attention_flops(cfg, "prefill", cached, tokens)


def _nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop a negative term and refit; tiny problems only)."""
    active = list(range(X.shape[1]))
    while True:
        coef = np.zeros(X.shape[1])
        sol, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        coef[active] = sol
        neg = [i for i in active if coef[i] < 0]
        if not neg:
            return coef
        active.remove(min(neg, key=lambda i: coef[i]))
        if not active:
            return np.zeros(X.shape[1])


@dataclass
class PrefillFit:
    """Prefill time as overhead + linear FLOPs / achieved rate + attention FLOPs / achieved rate.

    Introduced in lab 05 (Where the Time Goes).
    """

    model: str
    overhead_s: float
    linear_flops_per_s: float | None       # achieved on the matmuls (None: the fit found no linear term)
    attention_flops_per_s: float | None    # achieved on attention
    points: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, seconds) it was fitted on
    peak_flops_per_s: float | None = None
    _cfg: Any = None

    def predict(self, tokens: int, cached: int = 0) -> float:
        """Predicted seconds to prefill ``tokens`` prompt tokens (after ``cached`` cached ones)."""
        lin, att = prefill_flops(self._cfg, tokens, cached)
        t = self.overhead_s
        if self.linear_flops_per_s:
            t += lin / self.linear_flops_per_s
        if self.attention_flops_per_s:
            t += att / self.attention_flops_per_s
        return t

    def residuals(self) -> list[float]:
        """Relative error of the fit at each of its own points (prediction / measurement - 1)."""
        return [self.predict(n) / s - 1 for n, s in self.points]

    @property
    def fraction_of_peak(self) -> float | None:
        """Achieved matmul rate over the hardware's peak (measured or catalog) FLOP/s."""
        if self.peak_flops_per_s and self.linear_flops_per_s:
            return self.linear_flops_per_s / self.peak_flops_per_s
        return None

    def describe(self) -> str:
        fmt = lambda r: f"{r / 1e12:.2f} TFLOP/s" if r else "n/a"  # noqa: E731
        frac = f" ({self.fraction_of_peak:.0%} of peak)" if self.fraction_of_peak else ""
        if (self.fraction_of_peak or 0) > 1:  # the rates share out one time between two terms that move together
            frac = f" ({self.fraction_of_peak:.0%} of the measured peak: the split between the two rates is a fit)"
        return (f"prefill = {self.overhead_s * 1e3:.0f} ms + linear FLOPs at {fmt(self.linear_flops_per_s)}{frac} "
                f"+ attention FLOPs at {fmt(self.attention_flops_per_s)}; fitted on "
                f"{', '.join(str(n) for n, _ in self.points)} tokens")


def fit_prefill(cfg: "ModelConfig | Mapping[str, Any] | str", points: Iterable[tuple[int, float]],
                hw: Hardware | None = None, overhead: bool = True) -> PrefillFit:
    """Fit :class:`PrefillFit` to measured ``(prompt tokens, TTFT seconds)`` points (at least 3 lengths).

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    pts = [(int(n), float(s)) for n, s in points]
    if len({n for n, _ in pts}) < 3:
        raise ValueError("fit_prefill needs measurements at three or more prompt lengths")
    rows = [prefill_flops(cfg, n) for n, _ in pts]
    X = np.array([[1.0 if overhead else 0.0, lin, att] for lin, att in rows])
    y = np.array([s for _, s in pts])
    # Scale the columns so the solver sees numbers of similar size; weight rows by 1/y (relative error).
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / y
    coef = _nonneg_lstsq((X / scale) * w[:, None], y * w) / scale
    peak = None
    if hw is not None:
        _, peak = compute_flops(hw, cfg.dtype)
    return PrefillFit(model=cfg.name, overhead_s=float(coef[0]),
                      linear_flops_per_s=1.0 / coef[1] if coef[1] > 0 else None,
                      attention_flops_per_s=1.0 / coef[2] if coef[2] > 0 else None,
                      points=pts, peak_flops_per_s=peak, _cfg=cfg)


@dataclass
class DecodeFit:
    """Decode step time as overhead + bytes read per step / achieved bandwidth.

    Introduced in lab 05 (Where the Time Goes).
    """

    model: str
    overhead_s: float
    bandwidth: float                                   # achieved bytes/s
    points: list[tuple[int, int, float]] = field(default_factory=list)  # (batch, context, seconds per step)
    peak_bandwidth: float | None = None
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    note: str = ""
    _cfg: Any = None

    def step_bytes(self, batch: int, context: int) -> int:
        _, wbytes, kvbytes = _decode_work(self._cfg, batch, context, self.weight_dtype, self.kv_dtype)
        return wbytes + kvbytes

    def predict(self, batch: int, context: int) -> float:
        """Predicted seconds per decode step (= per output token of each sequence) at ``batch`` and ``context``."""
        return self.overhead_s + self.step_bytes(batch, context) / self.bandwidth

    def residuals(self) -> list[float]:
        return [self.predict(b, c) / s - 1 for b, c, s in self.points]

    @property
    def fraction_of_peak(self) -> float | None:
        return self.bandwidth / self.peak_bandwidth if self.peak_bandwidth else None

    def describe(self) -> str:
        frac = f" ({self.fraction_of_peak:.0%} of the measured {self.peak_bandwidth / 1e9:.1f} GB/s)" \
            if self.peak_bandwidth else ""
        if (self.fraction_of_peak or 0) > 1:  # at batch 1 the weights read the same bytes as the overhead's share
            frac = frac[:-1] + ": the split between overhead and bandwidth is a fit)"
        return (f"decode step = {self.overhead_s * 1e3:.1f} ms + bytes read at {self.bandwidth / 1e9:.1f} GB/s{frac}; "
                f"fitted on (batch, context) {', '.join(f'({b}, {c})' for b, c, _ in self.points)}"
                + (f" ({self.note})" if self.note else ""))


def fit_decode(cfg: "ModelConfig | Mapping[str, Any] | str", points: Iterable[tuple[int, int, float]],
               hw: Hardware | None = None, weight_dtype: str = "auto", kv_dtype: str = "auto",
               overhead: bool = False) -> DecodeFit:
    """Fit :class:`DecodeFit` to measured ``(batch, context, seconds per step)`` points.

    With ``overhead=False`` (the default) the line goes through the origin: one parameter, the achieved
    bandwidth, which even a single point determines — every byte is charged to memory, the roofline's
    view. ``overhead=True`` adds a fixed per-step cost (needs points with different byte counts).

    Introduced in lab 05 (Where the Time Goes).
    """
    cfg = load_config(cfg)
    wd = _weight_dtype(weight_dtype)
    pts = [(int(b), int(c), float(s)) for b, c, s in points]
    if not pts:
        raise ValueError("fit_decode needs at least one measured (batch, context, seconds) point")
    if any(s <= 0 for _, _, s in pts):
        raise ValueError(f"fit_decode needs positive seconds per step; got {[s for _, _, s in pts]} "
                         "(a quantile of inter-token latencies can be 0 when tokens arrive in one chunk: use the median)")
    fit = DecodeFit(model=cfg.name, overhead_s=0.0, bandwidth=1.0, points=pts, weight_dtype=wd, kv_dtype=kv_dtype,
                    peak_bandwidth=hw.memory_bandwidth if hw else None, _cfg=cfg)
    X = np.array([[1.0 if overhead else 0.0, fit.step_bytes(b, c)] for b, c, _ in pts])
    y = np.array([s for _, _, s in pts])
    if overhead and len({row[1] for row in X}) < 2:
        raise ValueError("overhead=True needs points that read different numbers of bytes")
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / y
    coef = _nonneg_lstsq((X / scale) * w[:, None], y * w) / scale
    if coef[1] <= 0 and overhead:
        # The times did not grow with the bytes (noise larger than the KV term): charge everything to memory.
        fit = fit_decode(cfg, pts, hw, weight_dtype, kv_dtype, overhead=False)
        fit.note = "times did not grow with context, so the fit went through the origin"
        return fit
    if coef[1] <= 0:
        raise ValueError("decode times did not grow with bytes read: the fit found no bandwidth term")
    fit.overhead_s, fit.bandwidth = float(coef[0]), float(1.0 / coef[1])
    return fit
