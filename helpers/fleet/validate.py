"""Kubernetes manifests checked offline, each kind against a schema of the release it targets.

No cluster runs here (no kube-apiserver, kind, k3s or Docker can be installed; ``kubectl apply --dry-run=client``
needs a server), so each object is checked by the strictest offline validator there is for its kind::

    for r in validate.validate_objects(manifests.objects(spec)):
        print(r)        # "ok   Deployment/chat (kubernetes-validate 1.37, strict)"

- **Core kinds** (Deployment, Service, Secret, ConfigMap, RBAC...): PyPI ``kubernetes-validate`` — Kubernetes'
  own OpenAPI schemas as JSON schemas, in their *strict* variant (unknown fields are errors). Every error is
  reported, not only the first (the command-line tool stops at one).
- **KEDA ScaledObject, Gateway API HTTPRoute, Prometheus Operator PodMonitor/PrometheusRule**: the validators
  npm's ``@kubernetes-models/*`` packages compile from those projects' CRDs, run by ``node``
  (``crd_validate.mjs``), which also reports fields the CRD does not declare.
- **GAIE InferencePool**: no registry package carries its schema, so this project wrote one from the pinned
  release's API reference (``data/schemas/inferencepool-v1.json``), checked with ``jsonschema``.
- Any other kind fails: an object no schema can check is not called valid.

Not checked offline: cross-object references (that the Secret or the Gateway exists), admission webhooks, and
CEL rules other than the two the InferencePool schema restates.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from ..settings import data_dir, repo_root

__all__ = [
    "Result", "ValidatorMissing", "K8S_VERSION", "NPM_PACKAGES", "NPM_INSTALL", "CRD_GROUPS", "validate_core",
    "validate_crds", "validate_inferencepool", "validate_objects", "validate_folder", "load_manifests",
    "npm_modules",
]

K8S_VERSION = "1.37"
#: The npm packages whose compiled CRD schemas check the custom resources (install under .npm-fleet/).
NPM_PACKAGES = ("@kubernetes-models/keda@2.0.0", "@kubernetes-models/gateway-api@2.0.0",
                "@kubernetes-models/prometheus-operator@6.0.0")
NPM_INSTALL = ("npm install --no-audit --no-fund --prefix .npm-fleet " + " ".join(NPM_PACKAGES))
CRD_GROUPS = {"keda.sh", "gateway.networking.k8s.io", "monitoring.coreos.com"}
_POOL_API = "inference.networking.k8s.io/v1"


@dataclass(frozen=True)
class Result:
    """One object's verdict: which validator checked it, and every message it gave (empty when ``ok``).

    Introduced in lab 22 (Routing and Autoscaling).
    """

    kind: str
    name: str
    ok: bool
    messages: tuple[str, ...]
    validator: str

    def __str__(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'} {self.kind}/{self.name} ({self.validator})"
        return "\n".join([head, *(f"     {m}" for m in self.messages)])


class ValidatorMissing(FileNotFoundError):
    """A validator this check needs is not installed; the message says how to install it.

    Introduced in lab 22 (Routing and Autoscaling).
    """


def _ident(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    return str(obj.get("kind", "?")), str(meta.get("name", "?"))


def _path(parts: Iterable[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(object)"


def _messages(validator: Any, obj: Mapping[str, Any]) -> tuple[str, ...]:
    """Every error, each led by the path of the field it is about (for a missing field: that field's path)."""
    out = []
    for e in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(map(str, e.absolute_path))):
        where = list(e.absolute_path)
        if e.validator == "required":
            where += [f for f in e.validator_value if f not in (e.instance or {})][:1]
        msg = f"{_path(where)}: {e.message}"
        if msg not in out:
            out.append(msg)
    return tuple(out)


# ------------------------------------------------------------------------------------ core kinds
@functools.lru_cache(maxsize=4)
def _definitions(folder: str, version: str) -> Any:
    import kubernetes_validate.utils as kv
    from referencing import Resource

    return Resource.from_contents(kv.schema_contents(f"{folder}/_definitions.json", version))


def _core_validator(obj: Mapping[str, Any], version: str):
    import jsonschema
    import kubernetes_validate.utils as kv
    from referencing import Registry, Resource

    # the file naming kubernetes-validate uses: apps/v1 -> apps-v1, rbac.authorization.k8s.io/v1 -> rbac-v1
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", str(obj.get("apiVersion", "")))
    folder = f"kubernetes-json-schema/v{version}.0-local-strict"
    try:
        schema = kv.schema_contents(f"{folder}/{str(obj.get('kind', '')).lower()}-{api}.json", version)
    except FileNotFoundError:
        return None
    registry = _definitions(folder, version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_core(obj: Mapping[str, Any], version: str = K8S_VERSION) -> Result:
    """Check a built-in kind against Kubernetes ``version``'s strict schema (PyPI ``kubernetes-validate``).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    kind, name = _ident(obj)
    label = f"kubernetes-validate {version}, strict"
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError as e:
        raise ValidatorMissing("kubernetes-validate is not installed: `pip install kubernetes-validate==1.37.0` "
                               "(it is in requirements.txt; `make setup` installs it)") from e
    validator = _core_validator(obj, version)
    if validator is None:
        return Result(kind, name, False, (f"apiVersion: no schema for {obj.get('apiVersion')} {kind} (neither "
                                          f"Kubernetes {version} nor the fleet's custom resources): it cannot be "
                                          "checked offline",), label)
    msgs = _messages(validator, obj)
    return Result(kind, name, not msgs, msgs, label)


# ------------------------------------------------------------------------------------------ CRDs
def _pointer_to_path(message: str) -> str:
    """``/spec/rules/0/x: ...`` (a JSON pointer) -> ``spec.rules[0].x: ...``, as the other validators write it."""
    pointer, sep, rest = message.partition(": ")
    if not pointer.startswith("/"):
        return message
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:] if p]
    return f"{_path(int(p) if p.isdigit() else p for p in parts)}{sep}{rest}"


def npm_modules(folder: str | Path | None = None) -> Path:
    """The ``node_modules`` holding :data:`NPM_PACKAGES`: ``folder``, else ``.npm-fleet/node_modules`` in the
    repository. Raises :class:`ValidatorMissing` with the install command when they are not there.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    root = repo_root()
    nm = Path(folder) if folder else (root / ".npm-fleet" / "node_modules" if root else None)
    missing = [p.rsplit("@", 1)[0] for p in NPM_PACKAGES
               if nm is None or not (nm / p.rsplit("@", 1)[0] / "package.json").is_file()]
    if missing:
        raise ValidatorMissing(f"npm packages {missing} are not installed in {nm}: run `{NPM_INSTALL}` in the "
                               "repository (Node.js 20+; `make setup` does it)")
    return nm


def validate_crds(objs: Sequence[Mapping[str, Any]], node_modules: str | Path | None = None,
                  timeout: float = 60) -> list[Result]:
    """Check KEDA, Gateway API and Prometheus Operator objects with npm ``@kubernetes-models`` validators (node),
    unknown fields included.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if not objs:
        return []
    node = shutil.which("node")
    if node is None:
        raise ValidatorMissing("node is not on PATH: install Node.js 20+ (`apt-get install -y nodejs`), then "
                               f"`{NPM_INSTALL}`")
    nm = npm_modules(node_modules)
    script = Path(__file__).with_name("crd_validate.mjs")
    proc = subprocess.run([node, str(script), str(nm)], input=json.dumps(list(map(dict, objs))),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    out = []
    for obj, messages in zip(objs, json.loads(proc.stdout)):
        kind, name = _ident(obj)
        pkg = {"keda.sh": NPM_PACKAGES[0], "gateway.networking.k8s.io": NPM_PACKAGES[1]}.get(
            str(obj.get("apiVersion", "")).split("/")[0], NPM_PACKAGES[2])
        msgs = tuple(dict.fromkeys(_pointer_to_path(m) for m in messages))
        out.append(Result(kind, name, not msgs, msgs, f"npm {pkg}, strict"))
    return out


# ---------------------------------------------------------------------------------- InferencePool
def validate_inferencepool(obj: Mapping[str, Any]) -> Result:
    """Check an ``InferencePool`` against this project's schema of GAIE v1.5.0 (``data/schemas/``).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    import jsonschema

    kind, name = _ident(obj)
    schema = json.loads((data_dir() / "schemas" / "inferencepool-v1.json").read_text())
    msgs = _messages(jsonschema.Draft202012Validator(schema), obj)
    return Result(kind, name, not msgs, tuple(msgs), "data/schemas/inferencepool-v1.json (GAIE v1.5.0), strict")


# ----------------------------------------------------------------------------------------- all
def validate_objects(objs: Sequence[Mapping[str, Any]], node_modules: str | Path | None = None) -> list[Result]:
    """Every object with the validator for its kind, in the given order. A kind no validator knows fails.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    results: list[Result | None] = [None] * len(objs)
    crds = [(i, o) for i, o in enumerate(objs) if str(o.get("apiVersion", "")).split("/")[0] in CRD_GROUPS]
    for (i, _), r in zip(crds, validate_crds([o for _, o in crds], node_modules)):
        results[i] = r
    for i, o in enumerate(objs):
        if results[i] is not None:
            continue
        results[i] = validate_inferencepool(o) if o.get("apiVersion") == _POOL_API else validate_core(o)
    return [r for r in results if r is not None]


def load_manifests(folder: str | Path) -> list[dict]:
    """Every object in ``folder/manifests/*.yaml`` (or ``folder/*.yaml``), in file-name order.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    folder = Path(folder)
    sub = folder / "manifests"
    files = sorted((sub if sub.is_dir() else folder).glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no *.yaml in {sub if sub.is_dir() else folder}: write them with manifests.write")
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def validate_folder(folder: str | Path, node_modules: str | Path | None = None) -> list[Result]:
    """:func:`validate_objects` over the manifests written in ``folder``.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    return validate_objects(load_manifests(folder), node_modules)
