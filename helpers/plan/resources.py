"""What a lab asks of the machine besides time, answered for every profile: formats, disk, calibration text, the
servers that share one card, and the tools outside the lab's Python packages.

Each planner returns these next to its sizes; :func:`helpers.plan.lab` puts them into the :class:`LabPlan` and adds
the checks that can fail (calibration text short of what a build packs; servers that do not fit one card as vLLM's
memory profiler counts them)::

    python -m helpers.plan h100 --json     # every lab's formats, disk_bytes, calibration, servers_on_card, tools

Introduced in lab 12 (FP8 as the Default).
"""

from __future__ import annotations

from typing import Any

from .. import calibration as _calibration
from .. import runtime, sizing, support
from .core import GPU_OVERHEAD_GIB

__all__ = ["formats", "calibration", "disk", "item", "disk_total", "checkpoint_bytes", "server", "servers_on_card",
           "tools", "TOOLS"]


# ------------------------------------------------------------------------------------------ formats
def formats(p: runtime.Profile, *asks: tuple[str, str]) -> list[dict[str, Any]]:
    """Each ``(kind, name)`` a lab asks the server for, as :func:`helpers.support.lookup` answers it on ``p``'s
    device: ``{"name", "kind", "supported", "native", "why"}``.

    Introduced in lab 12 (FP8 as the Default).
    """
    device = support.Device.of(p)
    return [support.lookup(kind, name, device).as_dict() for kind, name in asks]


# ------------------------------------------------------------------------------------------ calibration
def calibration(p: runtime.Profile, samples: int, seq_len: int = 256) -> dict[str, Any]:
    """The calibration text a build of ``p``'s model packs (``samples`` rows of ``seq_len`` tokens), against what
    the shipped files hold for that model's tokenizer (its own count, or a stated lower bound).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    have, how = _calibration.tokens_available(p.model)
    return {"samples": samples, "seq_len": seq_len, "tokens_needed": samples * seq_len, "tokens_available": have,
            "counted_with": how}


def calibration_check(cal: dict[str, Any]) -> dict[str, Any]:
    return {"claim": f"calibration: {cal['samples']} x {cal['seq_len']} = {cal['tokens_needed']:,} tokens <= the "
                     f"{cal['tokens_available']:,} the shipped text holds ({cal['counted_with']})",
            "ok": cal["tokens_needed"] <= cal["tokens_available"]}


# ------------------------------------------------------------------------------------------ disk
def checkpoint_bytes(p: runtime.Profile, fmt: str, model: str | None = None) -> int:
    """Bytes of a checkpoint of ``p``'s model in ``fmt``: a quantized format (``int8``, ``int4``, ``fp8``,
    ``nvfp4``, ``mxfp4``; scales included, group 64 for int4), ``plain`` (a fake-quantized copy: the model's own
    dtype) or ``dequantized`` (quantized Linear weights multiplied back out in float32: at most the float32 model).

    Introduced in lab 12 (FP8 as the Default).
    """
    cfg = sizing.load_config(model or p.model, dtype=p.dtype)
    if fmt == "plain":
        return int(sizing.weight_bytes(cfg).total)
    if fmt == "dequantized":
        return int(sizing.weight_bytes(cfg, "fp32").total)
    return int(sizing.weight_bytes(cfg, fmt, group_size=64).total)


def item(what: str, nbytes: int, kept: str | None = None, key: str | None = None) -> dict[str, Any]:
    """One thing a lab writes: ``kept`` says why it stays after the lab (``None``: the lab deletes it at its end,
    unless its ``KEEP_BUILDS`` knob keeps it); ``key`` names it across labs (one checkpoint two labs reuse is one).

    Introduced in lab 12 (FP8 as the Default).
    """
    return {"what": what, "bytes": int(nbytes), "kept": kept, "key": key or what}


def disk(*items: dict[str, Any], one_at_a_time: bool = True) -> dict[str, Any]:
    """``{"peak", "kept", "items"}``: the most the lab holds at once, and what stays after it. ``one_at_a_time``:
    the lab deletes each item that is not kept once it has measured it (copies of a model, served one after another),
    so the peak is the kept items and the largest other one; else they all exist together (a KV store).

    Introduced in lab 12 (FP8 as the Default).
    """
    kept = sum(i["bytes"] for i in items if i["kept"])
    gone = [i["bytes"] for i in items if not i["kept"]]
    return {"peak": kept + (max(gone, default=0) if one_at_a_time else sum(gone)), "kept": kept, "items": list(items)}


# ------------------------------------------------------------------------------------------ servers on one card
def server(name: str, p: runtime.Profile, tokens: int, *, utilization: float | None = None,
           kv_bytes: int | None = None, model: str | None = None) -> dict[str, Any]:
    """One server a lab runs: the longest request it must hold (``tokens``: vLLM refuses to start without room for
    one ``max_model_len`` request), its ``gpu_memory_utilization`` and, when the lab fixes it, its KV bytes
    (``kv_cache_memory_bytes``: vLLM then skips its memory profiler).

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    cfg = sizing.load_config(model or p.model, dtype=p.dtype)
    return {"server": name, "model": model or p.model, "tokens": int(tokens),
            "utilization": p.utilization if utilization is None else utilization,
            "weights_bytes": int(sizing.weight_bytes(cfg).total),
            "kv_needed_bytes": int(sizing.kv_bytes_for_context(cfg, tokens)),
            "kv_bytes": None if kv_bytes is None else int(kv_bytes)}


def context_check(server_: dict[str, Any], p: runtime.Profile) -> dict[str, Any]:
    """vLLM refuses a ``max_model_len`` beyond the model's ``max_position_embeddings`` ("User-specified max_model_len
    ... is greater than the derived max_model_len"): each server's longest request within its own model's limit (a
    fleet lab on a 40 GB card serves a smaller model than its profile's, with a shorter limit).

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    limit = sizing.load_config(server_["model"], dtype=p.dtype).max_position_embeddings
    return {"claim": f"{server_['server']}: max_model_len {server_['tokens']:,} within {server_['model']}'s "
                     f"{limit or 'unknown':,} positions" if limit else f"{server_['server']}: no position limit known",
            "ok": not limit or server_["tokens"] <= limit}


def servers_on_card(p: runtime.Profile, servers: list[dict[str, Any]], together: bool = False
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The servers a lab runs at once on one device, each with the KV bytes vLLM gives it, and the checks.

    On a GPU, as vLLM 0.32 counts (``v1/worker/utils.py:716-767``, ``utils/mem_utils.py:230-321``): a start needs
    ``utilization x card`` free (other processes' memory counts); a server whose KV size is not fixed gets
    ``utilization x card`` less the drop in the card's free memory while it loads and profiles — its own weights and
    overhead, and, when the servers start ``together``, the others' weights and KV loaded meanwhile (the worst case);
    each needs room for its longest request. Fixed KV bytes skip the profiler, not the start check. On CPU each server
    sizes its pool in RAM: nothing to check.

    Introduced in lab 20 (Disaggregating Prefill and Decode).
    """
    if p.gpu_memory_gib is None:
        return [dict(s, kv_how="fixed (kv_cache_memory_bytes)" if s["kv_bytes"] is not None else
                     "sized by vLLM from the worker's share of RAM: the lab reads it from the live server")
                for s in servers], []
    card = p.gpu_memory_gib * 2**30
    overhead = GPU_OVERHEAD_GIB * 2**30
    out, checks = [], []
    # What each holds once up: all of its share when vLLM sizes its KV cache (the pool fills the budget), its weights,
    # fixed pool and overhead when kv_cache_memory_bytes fixes it (the profiler is skipped).
    used = {s["server"]: s["utilization"] * card if s["kv_bytes"] is None else
            s["weights_bytes"] + s["kv_bytes"] + overhead for s in servers}
    for s in servers:
        others = [o for o in servers if o is not s]
        requested = s["utilization"] * card
        free = card - sum(used[o["server"]] for o in others)
        checks.append({"claim": f"{s['server']}: starts with {s['utilization']} x {p.gpu_memory_gib:g} GiB = "
                                f"{requested / 2**30:.1f} GiB <= the {free / 2**30:.1f} GiB the other servers leave free",
                       "ok": requested <= free})
        if s["kv_bytes"] is not None:
            kv = s["kv_bytes"]
            how = "fixed (kv_cache_memory_bytes)"
        else:
            seen = sum(o["weights_bytes"] + (o["kv_bytes"] or o["kv_needed_bytes"]) for o in others) if together else 0
            kv = requested - s["weights_bytes"] - overhead - seen
            how = "profiled: utilization x card - weights - overhead" + (" - the others' weights and KV, loaded "
                                                                         "while it profiles" if together else "")
        out.append(dict(s, kv_bytes=int(kv), kv_how=how))
        checks.append({"claim": f"{s['server']}: KV {max(kv, 0) / 2**30:.2f} GiB ({how}) holds its longest request "
                                f"({s['tokens']:,} tokens, {s['kv_needed_bytes'] / 2**30:.2f} GiB)",
                       "ok": kv >= s["kv_needed_bytes"]})
    if len(servers) > 1:
        total = sum(used.values())
        checks.append({"claim": f"{len(servers)} servers on one card: {total / 2**30:.1f} GiB <= {p.gpu_memory_gib:g} GiB",
                       "ok": total <= card})
    return out, checks


# ------------------------------------------------------------------------------------------ tools
#: The tools outside a lab's own Python packages, how to tell each is there, and the route that installs it.
#: ``check``: ``module:NAME`` (importable), ``exe:NAME`` (on PATH or beside this Python), ``npm`` (the CRD schemas
#: under .npm-fleet/ and node), ``quant:MODULE`` (importable by the phase 3 environment's Python).
_FLEET = {"make setup": "requirements-fleet.txt", "colab": "scripts/colab_setup.py (requirements-fleet.txt)"}
_APT = {"make setup": "scripts/install_tools.sh (apt-get install prometheus nginx)",
        "colab": "scripts/colab_setup.py runs scripts/install_tools.sh (apt-get, as root)"}
_QUANT = {"make setup": ".venv-quant (requirements-quant.txt)",
          "colab": "built on first use (scripts/colab_setup.py --quant-env)"}
TOOLS: dict[str, dict[str, str]] = {
    "PyYAML": {"check": "module:yaml", "for": "writing and reading Kubernetes manifests and Prometheus files", **_FLEET},
    "jsonschema": {"check": "module:jsonschema", "for": "the InferencePool schema check", **_FLEET},
    "kubernetes-validate": {"check": "module:kubernetes_validate", "for": "validating core Kubernetes kinds offline",
                            **_FLEET},
    "grafana-foundation-sdk": {"check": "module:grafana_foundation_sdk", "for": "the SLO dashboard as code", **_FLEET},
    "vllm-router": {"check": "exe:vllm-router", "for": "routing between replicas (cache-aware, P/D)", **_FLEET},
    "prometheus": {"check": "exe:prometheus", "for": "scraping the fleet and evaluating alerts", **_APT},
    "promtool": {"check": "exe:promtool", "for": "checking Prometheus config and rules", **_APT},
    "nginx": {"check": "exe:nginx", "for": "the gateway: API keys, per-key rate limits, a canary and its rollback",
              **_APT},
    "crd-schemas": {"check": "npm", "for": "validating KEDA, Gateway API and Prometheus Operator objects offline",
                    "make setup": "scripts/install_tools.sh (npm into .npm-fleet/)",
                    "colab": "scripts/colab_setup.py runs scripts/install_tools.sh (npm into .npm-fleet/)"},
    "llm-compressor": {"check": "quant:llmcompressor", "for": "building quantized checkpoints", **_QUANT},
    "lm-eval": {"check": "quant:lm_eval", "for": "task accuracy in the accuracy gate", **_QUANT},
}


def tools(*names: str) -> list[dict[str, str]]:
    """The entries of :data:`TOOLS` a lab needs, each with its name.

    Introduced in lab 12 (FP8 as the Default).
    """
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise KeyError(f"no tool {unknown}; known: {', '.join(TOOLS)}")
    return [{"name": n, **TOOLS[n]} for n in names]


def disk_total(plans: list[Any]) -> dict[str, int]:
    """What a machine's disk must hold to run ``plans`` (one profile's labs) in order: everything they keep (each
    checkpoint once, however many labs reuse it) plus the largest thing one lab writes and deletes again.

    Introduced in lab 12 (FP8 as the Default).
    """
    kept = {i["key"]: i["bytes"] for p in plans for i in p.disk_bytes.get("items", []) if i["kept"]}
    transient = max((p.disk_bytes.get("peak", 0) - p.disk_bytes.get("kept", 0) for p in plans), default=0)
    return {"kept": sum(kept.values()), "largest_transient": transient, "need": sum(kept.values()) + transient}
