"""Number formats in plain torch: every value a format can hold, and fake quantization into it.

A GPU with FP8 or FP4 tensor cores multiplies in these formats; this CPU cannot. What it *can* do is show what
the format does to the numbers: round a weight to the nearest value the format holds and turn it back into a
float ("fake quantization"). The error that leaves is the error the real kernel would see::

    formats.grid("fp4_e2m1")                       # tensor([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, ..., 6])
    w_hat = formats.fake_quantize(w, "fp8_e4m3")   # per output channel, scale = max|row| / 448
    formats.error_stats(w, w_hat)                  # ErrorStats(mse=..., max_abs=..., sqnr_db=...)

Formats (:data:`FORMATS`): ``fp8_e4m3`` (max 448, no infinities), ``fp8_e5m2`` (max 57344), ``nvfp4`` (E2M1 values
in 16-element blocks, each with an FP8 E4M3 scale, under one FP32 per-tensor scale), ``mxfp4`` (E2M1 values in
32-element blocks with a power-of-two E8M0 scale, OCP MX v1.0), ``int8`` and ``int4`` (round-to-nearest,
symmetric or asymmetric, per tensor, per output channel or per group of input columns).

Rounding is round-to-nearest, ties to even, computed here from each format's bits (not by casting to torch's
float8 types, which the tests use as the independent reference). Integer scales follow compressed-tensors,
whose checkpoints vLLM serves: symmetric ``scale = max|x| / ((qmax - qmin) / 2)`` (127.5 for int8, 7.5 for int4),
computed in the tensor's own dtype, so a bf16 weight gets the bit-identical codes and scales llm-compressor
writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["FORMATS", "FloatSpec", "Quantized", "ErrorStats", "float_spec", "grid", "round_to_grid", "quantize",
           "fake_quantize", "nvfp4_global_scale", "error_stats"]

FORMATS = ("fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4", "int8", "int4")


@dataclass(frozen=True)
class FloatSpec:
    """A small floating-point element format: exponent and mantissa bits, bias, and its largest finite value.

    ``ieee`` formats reserve the top exponent for infinities and NaN (E5M2); E4M3 "fn" keeps it for numbers
    and gives up only the all-ones pattern (NaN), so its max is 448 rather than 240; FP4 E2M1 has neither.

    Introduced in lab 12 (FP8 as the Default).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    ieee: bool

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)


_SPECS = {
    "fp8_e4m3": FloatSpec("fp8_e4m3", 4, 3, 7, 448.0, ieee=False),
    "fp8_e5m2": FloatSpec("fp8_e5m2", 5, 2, 15, 57344.0, ieee=True),
    "fp4_e2m1": FloatSpec("fp4_e2m1", 2, 1, 1, 6.0, ieee=False),
}
_ELEMENT = {"nvfp4": "fp4_e2m1", "mxfp4": "fp4_e2m1"}
_INT_BITS = {"int8": 8, "int4": 4}


def float_spec(fmt: str) -> FloatSpec:
    """The element format behind ``fmt`` (``nvfp4`` and ``mxfp4`` store FP4 E2M1 elements).

    Introduced in lab 12 (FP8 as the Default).
    """
    name = _ELEMENT.get(fmt, fmt)
    if name not in _SPECS:
        raise ValueError(f"{fmt!r} is not a floating-point format; use one of {', '.join(_SPECS)}, nvfp4, mxfp4")
    return _SPECS[name]


def grid(fmt: str) -> torch.Tensor:
    """Every finite value the element format of ``fmt`` can hold, ascending, as float64 (zero once).

    ``fp8_e4m3``: 253 values up to ±448; ``fp8_e5m2``: 247 up to ±57344; ``fp4_e2m1`` (also for ``nvfp4`` and
    ``mxfp4``): {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}; ``int8``: -128..127; ``int4``: -8..7. Built by decoding every
    bit pattern, so a lab can draw where the values crowd and where they thin out.

    Introduced in lab 12 (FP8 as the Default).
    """
    if fmt in _INT_BITS:
        b = _INT_BITS[fmt]
        return torch.arange(-(2 ** (b - 1)), 2 ** (b - 1), dtype=torch.float64)
    s = float_spec(fmt)
    values = set()
    top = 2 ** s.exponent_bits - 1
    for e in range(2 ** s.exponent_bits):
        if s.ieee and e == top:
            continue  # infinities and NaN
        for m in range(2 ** s.mantissa_bits):
            if e == 0:
                v = m / 2 ** s.mantissa_bits * 2.0 ** (1 - s.bias)
            else:
                v = (1 + m / 2 ** s.mantissa_bits) * 2.0 ** (e - s.bias)
            if v <= s.max:
                values.update((v, -v))
    return torch.tensor(sorted(values), dtype=torch.float64)


def round_to_grid(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round ``x`` (already divided by its scale) to the nearest value of ``fmt``'s element format, ties to
    even, saturating at ±max. Returns float32.

    Introduced in lab 12 (FP8 as the Default).
    """
    s = float_spec(fmt)
    a = x.float().abs()
    _, exp = torch.frexp(a)                       # a = m * 2**exp with m in [0.5, 1)
    e = torch.clamp(exp - 1, min=1 - s.bias)      # the binade; subnormals share the smallest one
    step = torch.pow(2.0, (e - s.mantissa_bits).float())
    r = torch.round(a / step) * step              # torch.round: half to even
    r = torch.clamp(r, max=s.max)
    return torch.copysign(r, x.float())


@dataclass
class Quantized:
    """One tensor quantized: the stored element values, their scales, and the dequantized tensor.

    ``values`` are what the checkpoint stores (integer codes, or FP8/FP4 element values as floats), shaped like
    the input. ``scale`` has one entry per tensor, row or group (``zero_point`` likewise, for asymmetric integer
    formats); for ``nvfp4``, ``scale`` holds the FP8 E4M3 block scales and ``global_scale`` the FP32 per-tensor
    factor they are divided by (compressed-tensors' ``weight_global_scale``). ``dequantized`` is
    ``values x scale`` back in the input's dtype: what a fake-quantized model computes with.

    Introduced in lab 12 (FP8 as the Default).
    """

    fmt: str
    values: torch.Tensor
    scale: torch.Tensor
    dequantized: torch.Tensor
    zero_point: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    granularity: str = "channel"
    group_size: int | None = None


def _blocks(x: torch.Tensor, size: int, what: str) -> torch.Tensor:
    if x.shape[-1] % size:
        raise ValueError(f"{what} needs the last dimension in multiples of {size}, got {x.shape[-1]} "
                         f"(shape {tuple(x.shape)})")
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _view(x: torch.Tensor, granularity: str, group_size: int | None, what: str) -> torch.Tensor:
    """``x`` shaped so that each scale covers exactly the last dimension."""
    if granularity == "tensor":
        return x.reshape(1, -1)
    if granularity == "group":
        return _blocks(x, group_size, what)
    return x


def _check_granularity(granularity: str, group_size: int | None) -> None:
    if granularity not in ("tensor", "channel", "group"):
        raise ValueError(f"granularity must be 'tensor', 'channel' or 'group', not {granularity!r}")
    if granularity == "group" and not group_size:
        raise ValueError("granularity='group' needs a group_size (columns that share one scale), e.g. 64")


def _fp8(x: torch.Tensor, fmt: str, granularity: str, group_size: int | None) -> Quantized:
    s = float_spec(fmt)
    xb = _view(x.float(), granularity, group_size, fmt)
    scale = xb.abs().amax(dim=-1, keepdim=True) / s.max
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    values = round_to_grid(xb / scale, fmt)
    deq = (values * scale).reshape(x.shape).to(x.dtype)
    return Quantized(fmt, values.reshape(x.shape), scale.squeeze(-1), deq, granularity=granularity,
                     group_size=group_size)


def _int(x: torch.Tensor, fmt: str, granularity: str, group_size: int | None, symmetric: bool) -> Quantized:
    """Integer round-to-nearest as compressed-tensors computes it, in ``x``'s own dtype."""
    bits = _INT_BITS[fmt]
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    xb = _view(x, granularity, group_size, fmt)
    lo = torch.clamp(xb.amin(dim=-1, keepdim=True), max=0)
    hi = torch.clamp(xb.amax(dim=-1, keepdim=True), min=0)
    span = torch.tensor(qmax - qmin, dtype=x.dtype)
    if symmetric:
        scale = torch.maximum(lo.abs(), hi) / (span / 2)  # int8: max / 127.5, so +max rounds to 128 -> 127
    else:
        scale = (hi - lo) / span
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(x.dtype).eps, dtype=x.dtype), scale)
    zp = None if symmetric else torch.round(torch.clamp(qmin - lo / scale, qmin, qmax))
    scaled = xb / scale if zp is None else xb / scale + zp
    values = torch.round(torch.clamp(scaled, qmin, qmax))
    deq = ((values if zp is None else values - zp) * scale).reshape(x.shape).to(x.dtype)
    return Quantized(fmt, values.reshape(x.shape), scale.squeeze(-1), deq,
                     zero_point=None if zp is None else zp.squeeze(-1), granularity=granularity,
                     group_size=group_size)


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor FP32 scale, ``448 x 6 / max|x|``: it maps the largest block's scale to E4M3's max.

    Layers that vLLM fuses into one matmul (q/k/v, gate/up) must share one: pass the smallest of theirs to
    :func:`quantize` as ``global_scale``, as llm-compressor does.

    Introduced in lab 13 (FP4 on Blackwell).
    """
    fp4, fp8 = float_spec("fp4_e2m1"), float_spec("fp8_e4m3")
    amax = x.abs().amax().clamp(min=torch.finfo(x.dtype).tiny)
    return (fp8.max * fp4.max / amax).float().reshape(1)  # computed in x's dtype, as compressed-tensors does


def _nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None) -> Quantized:
    """NVFP4 as compressed-tensors computes it: amax and block amax / 6 in ``x``'s dtype, the rest in float32."""
    fp4 = float_spec("fp4_e2m1")
    global_scale = nvfp4_global_scale(x) if global_scale is None else global_scale.float().reshape(1)
    xb = _blocks(x, 16, "nvfp4")
    block = round_to_grid(global_scale * (xb.abs().amax(dim=-1, keepdim=True) / fp4.max), "fp8_e4m3")
    block = torch.where(block == 0, torch.full_like(block, 0.125), block)  # E4M3's eps, as compressed-tensors
    eff = block / global_scale
    values = round_to_grid(xb.float() / eff, "nvfp4")
    deq = (values * eff).reshape(x.shape).to(x.dtype)
    return Quantized("nvfp4", values.reshape(x.shape), block.squeeze(-1), deq, global_scale=global_scale,
                     granularity="group", group_size=16)


def _mxfp4(x: torch.Tensor, mx_scale: str) -> Quantized:
    if mx_scale not in ("ocp", "llmcompressor"):
        raise ValueError(f"mx_scale must be 'ocp' or 'llmcompressor', not {mx_scale!r}")
    xb = _blocks(x.float(), 32, "mxfp4")
    amax = xb.abs().amax(dim=-1, keepdim=True)
    mantissa, exp = torch.frexp(amax)  # amax = mantissa * 2**exp, mantissa in [0.5, 1)
    if mx_scale == "llmcompressor":
        exp = exp + (mantissa >= 0.875).int()  # a block max of 1.75 x 2**k or more counts as 2**(k+1)
    # OCP MX v1.0: shared exponent = floor(log2(amax)) - emax of E2M1 (2), within E8M0's 2**-127 .. 2**127.
    shared = torch.where(amax > 0, exp - 1 - 2, torch.full_like(exp, -127)).clamp(-127, 127)
    scale = torch.pow(2.0, shared.float())
    values = round_to_grid(xb / scale, "mxfp4")
    deq = (values * scale).reshape(x.shape).to(x.dtype)
    return Quantized("mxfp4", values.reshape(x.shape), scale.squeeze(-1), deq, granularity="group", group_size=32)


def quantize(x: torch.Tensor, fmt: str, *, granularity: str = "channel", group_size: int | None = None,
             symmetric: bool = True, global_scale: torch.Tensor | None = None, mx_scale: str = "ocp") -> Quantized:
    """Quantize ``x`` into ``fmt`` (one of :data:`FORMATS`) and dequantize it again; returns a :class:`Quantized`.

    ``granularity``: one scale per ``"tensor"``, per ``"channel"`` (output row: the last dimension shares a scale,
    as ``FP8_DYNAMIC`` and ``W8A8`` store weights) or per ``"group"`` of ``group_size`` input columns (``W4A16``).
    ``symmetric=False`` (integers only) adds a zero point. ``nvfp4`` and ``mxfp4`` fix their own blocks (16 and 32)
    and ignore ``granularity``; ``global_scale`` overrides NVFP4's per-tensor scale (see :func:`nvfp4_global_scale`). ``mx_scale`` picks MXFP4's block
    exponent: ``"ocp"`` (the OCP MX spec: ``floor(log2(max)) - 2``, so a block max of 7 becomes 6) or
    ``"llmcompressor"`` (a block max whose mantissa is 1.75 or more counts as the next power of two: less
    clipping, coarser steps; the checkpoints llm-compressor 0.14 writes).

    Introduced in lab 12 (FP8 as the Default).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "nvfp4":
        return _nvfp4(x, global_scale)
    if fmt == "mxfp4":
        return _mxfp4(x, mx_scale)
    _check_granularity(granularity, group_size)
    if fmt in _INT_BITS:
        return _int(x, fmt, granularity, group_size, symmetric)
    if not symmetric:
        raise ValueError(f"{fmt} is symmetric by construction; asymmetric scales are for int8/int4")
    return _fp8(x, fmt, granularity, group_size)


def fake_quantize(x: torch.Tensor, fmt: str, **kwargs) -> torch.Tensor:
    """``x`` rounded through ``fmt`` and back, in ``x``'s dtype: ``quantize(x, fmt, **kwargs).dequantized``.

    Introduced in lab 12 (FP8 as the Default).
    """
    return quantize(x, fmt, **kwargs).dequantized


@dataclass(frozen=True)
class ErrorStats:
    """How far a quantized tensor is from the original: mean squared error, largest absolute error, the
    error relative to the tensor's RMS, and the signal-to-quantization-noise ratio in dB.

    Introduced in lab 12 (FP8 as the Default).
    """

    mse: float
    max_abs: float
    rel_rmse: float
    sqnr_db: float


def error_stats(x: torch.Tensor, x_hat: torch.Tensor) -> ErrorStats:
    """Error statistics of ``x_hat`` against ``x`` (computed in float64).

    Introduced in lab 12 (FP8 as the Default).
    """
    a, b = x.double(), x_hat.double()
    err = a - b
    mse = float((err ** 2).mean())
    power = float((a ** 2).mean())
    return ErrorStats(mse=mse, max_abs=float(err.abs().max()), rel_rmse=math.sqrt(mse / power) if power else 0.0,
                      sqnr_db=10 * math.log10(power / mse) if mse else math.inf)
