"""One configuration of a Phase 3 plan, served: a fake-quantized copy, a quantized checkpoint, or engine arguments.

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import support
from .build import build
from .cache import Checkpoint
from .dequant import servable
from .fake import fake_quantized_checkpoint
from .recipes import checkpoint_format, first_layers


def serve(profile: Any, spec: "Mapping[str, Any] | Checkpoint", *, into: Any = None) -> tuple[Any, Checkpoint | None]:
    """A running server for ``spec`` and its checkpoint (``None`` for engine arguments).

    ``spec`` is a :class:`Checkpoint` (served as it is) or one configuration of a lab's plan: ``{"fake": fmt, ...}``
    (the profile's model rounded through ``fmt``, :func:`fake_quantized_checkpoint`'s keywords beside it),
    ``{"recipe": name}`` (llm-compressor's checkpoint, :func:`servable` on this machine; ``"first_layers": n``
    beside it quantizes only the first ``n`` decoder layers, ``"samples": n`` calibrates on ``n`` rows) or
    ``{"engine": {...}}`` (the profile's model with those engine arguments) or ``{"dtype": name}`` (the profile's
    model computed in another dtype: the control that tells a quantized checkpoint's drift from its compute dtype's,
    where its kernels need another dtype than the baseline's; ``"engine"`` may sit beside it).

    A checkpoint of plain weights (a fake-quantized copy, or a quantized one :func:`servable` multiplied back out
    because this machine lacks its kernel) is loaded into ``into`` in place when that server runs with
    ``swappable=True`` (:meth:`helpers.server.Server.swap_weights`: about a second, where a start takes about 40 s
    on a 2-core CPU) if ``into`` computes in ``profile``'s dtype; anything else gets a server of its own, after
    ``into`` is stopped (one server at a time: on a GPU each takes the card's memory; with reuse on, ``into`` gets its
    own weights back and is parked). The caller stops the returned server unless it is ``into``.

    Introduced in lab 12 (FP8 as the Default).
    """
    from .. import server  # the server imports nothing of quant; quant needs it only here

    ckpt = spec if isinstance(spec, Checkpoint) else _checkpoint(profile, dict(spec))
    plain = ckpt is not None and checkpoint_format(ckpt.path) is None  # bf16 weights of the same shapes
    if plain and into is not None and into.running and into.swappable and _computes_in(into, profile.dtype):
        into.swap_weights(ckpt.path)
        return into, ckpt
    if into is not None:
        into.stop()
    if ckpt is None:
        return server.start(profile.replace(dtype=spec["dtype"]) if "dtype" in spec else profile,
                            **spec.get("engine", {})), None
    return server.start(serving_profile(profile, ckpt)), ckpt


def _computes_in(srv: Any, dtype: str) -> bool:
    """Whether running server ``srv`` computes in ``dtype``, as its start-up log said (``dtype=torch.X``)."""
    logged = getattr(getattr(srv, "startup", None), "dtype", None)
    return logged is None or logged == dtype


def serving_profile(profile: Any, ckpt: "Checkpoint | str") -> Any:
    """``profile`` serving checkpoint ``ckpt`` (a :class:`Checkpoint` or its folder): the model replaced, and a float32
    profile (a CPU without native bf16) moved to bfloat16 for an INT8 or INT4 checkpoint, whose kernels take half
    precision only (emulated bf16 there: slower, but it serves). Any other profile and checkpoint: the model only.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    path = str(getattr(ckpt, "path", ckpt))
    return profile.replace(model=path, dtype=support.compute_dtype(checkpoint_format(path), profile.dtype,
                                                                   support.Device.of(profile)))


def _checkpoint(profile: Any, spec: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint a plan's configuration serves; ``None`` for engine arguments on the profile's own."""
    if "fake" in spec:
        return fake_quantized_checkpoint(profile.model, spec.pop("fake"), **spec)
    allowed = {"recipe", "first_layers", "samples"} if "recipe" in spec else {"engine", "dtype"}
    if set(spec) - allowed:
        raise ValueError(f"a configuration is {{'fake': fmt, ...}}, {{'recipe': name[, 'first_layers': n][, 'samples': "
                         f"n]}}, {{'engine': {{...}}}} or {{'dtype': name}}; got the keys {sorted(spec)}")
    if "recipe" in spec:
        r = first_layers(spec["recipe"], spec["first_layers"]) if spec.get("first_layers") else spec["recipe"]
        return servable(build(profile.model, r, **({"samples": spec["samples"]} if spec.get("samples") else {})))
    return None
