"""A vLLM fleet on Kubernetes, as plain objects: replicas, prefix-aware routing, queue-based autoscaling, SLO alerts.

A :class:`FleetSpec` says what to run; :func:`objects` turns it into Kubernetes objects (dicts) and
:func:`write` into ``manifests/*.yaml``, numbered in the order ``kubectl apply -f manifests/`` needs::

    spec = manifests.spec_from_profile(runtime.PROFILES["h100"], name="chat", max_replicas=8)
    manifests.write(spec, "deploy/")

What is deployed, and why each piece:

- **vLLM Deployment + Service.** ``--enable-scale-out`` so the same replicas also work behind vllm-router's
  ``cache_aware`` policy, which tokenizes through ``/v1/completions/render`` (vLLM 0.32 answers 403 without the
  flag, and the router silently falls back to load-based routing). ``--max-num-seqs`` caps the running batch, so
  excess load shows up in ``vllm:num_requests_waiting`` — the autoscaler's signal (without a cap requests go
  straight to running and the queue stays at 0). The API key comes from a Secret through ``VLLM_API_KEY``, never
  in ``args``, where ``kubectl describe`` and the process list would show it.
- **Prefix-aware routing**: the Gateway API Inference Extension (GAIE) — an ``InferencePool`` selecting the vLLM
  pods, its endpoint picker (EPP) scoring queue, KV-cache use and prefix-cache affinity, and an ``HTTPRoute``
  whose backend is the pool.
- **Autoscaling**: a KEDA ``ScaledObject`` on ``sum(vllm:num_requests_waiting)`` through Prometheus; KEDA's
  ``AverageValue`` target gives ``ceil(waiting / queue_threshold)`` replicas.
- **Observability**: a ``PodMonitor`` (Prometheus Operator) scraping ``/metrics`` and a ``PrometheusRule`` holding
  :func:`helpers.fleet.observability.rule_groups` — the same rules the local lab's Prometheus runs.

Pinned releases: vLLM image ``v0.32.0``; GAIE ``v1.5.0`` (the last release shipping both the
``inference.networking.k8s.io/v1`` API and the reference EPP image; from v1.6.0 the EPP lives elsewhere and
``endpointPickerRef`` became optional); KEDA ``keda.sh/v1alpha1``; Gateway API ``gateway.networking.k8s.io/v1``;
Prometheus Operator ``monitoring.coreos.com/v1``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..models import DEFAULT_ID
from ..runtime import PROFILES, Profile
from ..server.args import engine_cli, normalize
from ..sizing.config import hub_ids, load_config
from ..sizing.params import weight_bytes
from .observability import FleetSLO, rule_groups

__all__ = [
    "FleetSpec", "Resources", "VLLM_IMAGE", "VLLM_CPU_IMAGE", "GAIE_RELEASE", "EPP_IMAGE", "API_KEY_ENV",
    "resources_for", "spec_from_profile", "objects", "deployment", "service", "api_key_secret", "epp_objects",
    "inference_pool", "http_route", "scaled_object", "pod_monitor", "prometheus_rule", "write",
]

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
#: vLLM's x86 CPU release image (its CUDA image cannot run without a GPU).
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"
GAIE_RELEASE = "v1.5.0"
EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{GAIE_RELEASE}"
API_KEY_ENV = "VLLM_API_KEY"

#: Upstream Hugging Face ids of models this project serves under its own name (the embedded CPU model is
#: converted offline from a GGUF of this checkpoint; a cluster downloads the original).
_CLUSTER_MODEL = {DEFAULT_ID: "HuggingFaceTB/SmolLM2-135M-Instruct"}
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti)?$")
_OWN_FLAGS = {"model", "served_model_name", "host", "port", "api_key", "tensor_parallel_size"}
_GIB = 2**30


@dataclass(frozen=True)
class FleetSpec:
    """What to deploy: the model, its replicas and their resources, and the SLO the fleet is held to.

    ``engine_args`` are vLLM engine arguments as for :func:`helpers.server.start` (``{"max_model_len": 8192}``);
    ``max_num_seqs`` and ``--enable-scale-out`` are always added (see the module docstring).
    ``gpus_per_replica`` > 1 becomes ``--tensor-parallel-size`` (divided by ``data_parallel_size`` when
    ``engine_args`` sets it: expert parallelism with data-parallel attention); 0 runs on CPU. ``cpu`` and ``memory`` are the
    container's requests (memory is also its limit). ``queue_threshold`` is waiting requests per replica that
    scale the fleet out. ``hf_cache_claim`` names a PersistentVolumeClaim holding the Hugging Face cache (else an
    emptyDir of ``hf_cache_size``: every new replica then downloads the weights again, which lengthens scale-out).
    ``gateway_namespace`` is where the Gateway's proxy pods run (default: the fleet's namespace): with the endpoint
    picker and Prometheus, the only clients the NetworkPolicy lets reach vLLM's port.

    Introduced in lab 22 (Routing and Autoscaling).
    """

    name: str
    model: str
    served_model_name: str
    namespace: str = "llm-serving"
    image: str = VLLM_IMAGE
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    max_num_seqs: int = 256
    min_replicas: int = 1
    max_replicas: int = 4
    gpus_per_replica: int = 1
    gpus_per_node: int = 8
    cpu: str = "8"
    memory: str = "32Gi"
    shm_size: str = "2Gi"
    hf_cache_size: str = "40Gi"
    hf_cache_claim: str | None = None
    gpu_min_memory_mib: int | None = None
    port: int = 8000
    ttft_p99_ms: float = 500.0
    tpot_p99_ms: float = 50.0
    queue_threshold: int = 4
    gateway: str = "inference-gateway"
    gateway_namespace: str | None = None
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    scrape_interval: str = "5s"
    api_key_secret: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or len(self.name) > 40:
            raise ValueError(f"fleet name {self.name!r}: use lowercase letters, digits and '-', start with a letter, "
                             "at most 40 characters (objects named after it get suffixes)")
        if not _NAME.match(self.namespace) or len(self.namespace) > 63:
            raise ValueError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        if self.gateway_namespace is not None and (not _NAME.match(self.gateway_namespace)
                                                   or len(self.gateway_namespace) > 63):
            raise ValueError(f"gateway_namespace {self.gateway_namespace!r} is not a valid Kubernetes namespace name")
        if not (1 <= self.min_replicas <= self.max_replicas):
            raise ValueError(f"replicas min={self.min_replicas} max={self.max_replicas}: need 1 <= min <= max")
        if self.gpus_per_replica < 0 or self.gpus_per_node < 1:
            raise ValueError("gpus_per_replica must be 0 (CPU) or more, gpus_per_node at least 1")
        if self.gpus_per_replica > self.gpus_per_node:
            raise ValueError(f"{self.gpus_per_replica} GPUs per replica do not fit on a node of {self.gpus_per_node}: "
                             "tensor parallelism must stay inside one node (use pipeline parallelism across nodes)")
        if self.gpus_per_replica and self.gpus_per_node % self.gpus_per_replica:
            raise ValueError(f"{self.gpus_per_replica} GPUs per replica do not divide a node's {self.gpus_per_node}: "
                             f"{self.gpus_per_node % self.gpus_per_replica} GPU(s) per node would never be used. "
                             f"Use one of {[d for d in range(1, self.gpus_per_node + 1) if self.gpus_per_node % d == 0]}.")
        dp = int(normalize(self.engine_args).get("data_parallel_size", 1) or 1)
        if self.gpus_per_replica and self.gpus_per_replica % dp:
            raise ValueError(f"data_parallel_size={dp} does not divide the replica's {self.gpus_per_replica} GPUs: "
                             "GPUs per replica = data-parallel size x tensor-parallel size")
        if self.tensor_parallel_size > 1:
            _check_heads_divide(self.model, self.tensor_parallel_size)
        for label, q in (("cpu", self.cpu), ("memory", self.memory), ("shm_size", self.shm_size),
                         ("hf_cache_size", self.hf_cache_size)):
            if not _QUANTITY.match(str(q)):
                raise ValueError(f"{label}={q!r} is not a Kubernetes quantity (e.g. '8', '500m', '32Gi')")
        clash = _OWN_FLAGS & set(normalize(self.engine_args))
        if clash:
            raise ValueError(f"engine_args sets {sorted(clash)}: these come from the spec's own fields (model, "
                             "served_model_name, port, gpus_per_replica) or, for the API key, from a Secret")
        if normalize(self.engine_args).get("enable_scale_out") is False:
            raise ValueError("enable_scale_out=False: the fleet's replicas need --enable-scale-out (vllm-router's "
                             "cache_aware policy tokenizes through it)")
        if self.max_num_seqs < 1 or not 1 <= self.port <= 65535:
            raise ValueError("max_num_seqs must be >= 1 and port within 1-65535")
        self.slo  # validates the targets

    @property
    def slo(self) -> FleetSLO:
        """The SLO record the alerts and the dashboard use."""
        return FleetSLO(ttft_p99_ms=self.ttft_p99_ms, tpot_p99_ms=self.tpot_p99_ms, queue_threshold=self.queue_threshold)

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per replica over the data-parallel size (expert parallelism's attention replicas), at least 1."""
        dp = int(normalize(self.engine_args).get("data_parallel_size", 1) or 1)
        return max(1, self.gpus_per_replica // dp)

    @property
    def secret_name(self) -> str:
        return self.api_key_secret or f"{self.name}-api-key"

    @property
    def labels(self) -> dict[str, str]:
        """The labels that select this fleet's vLLM pods (Service, InferencePool, PodMonitor)."""
        return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": self.name}

    def replace(self, **changes: Any) -> "FleetSpec":
        return dataclasses.replace(self, **changes)


def _check_heads_divide(model: str, tp: int) -> None:
    """Tensor parallelism splits attention heads across GPUs: refuse a count that does not divide them."""
    short = hub_ids().get(model)
    if short is None:
        return  # no shipped config for this model: vLLM itself will check at start-up
    cfg = load_config(short)
    fits = lambda d: cfg.heads % d == 0 and (cfg.kv_heads % d == 0 if d <= cfg.kv_heads  # noqa: E731
                                             else d % cfg.kv_heads == 0)
    if not fits(tp):
        ok = [d for d in range(1, 9) if fits(d)]
        raise ValueError(f"{tp} GPUs per replica do not divide {model}'s {cfg.heads} attention heads and "
                         f"{cfg.kv_heads} KV heads: tensor parallelism gives each GPU an equal share of heads (KV "
                         f"heads are split, or replicated a whole number of times). Use one of {ok}.")


# ------------------------------------------------------------------------------------ resources
@dataclass(frozen=True)
class Resources:
    """A replica's resources and the reasoning behind them (for a lab to print).

    Introduced in lab 22 (Routing and Autoscaling).
    """

    gpus: int
    cpu: str
    memory: str
    shm_size: str
    hf_cache_size: str
    gpu_min_memory_mib: int | None
    why: str


def _gib(n_bytes: float) -> int:
    return max(1, math.ceil(n_bytes / _GIB))


def resources_for(profile: Profile) -> Resources:
    """A replica's resources for a profile: the profile's single GPU (every GPU profile fits its model on one),
    host memory for the weights as they stream in plus the runtime, and on CPU the KV cache too.

    GPU: memory = weights + 8 GiB (API server, tokenizer, CUDA context, pinned buffers) + the 2 GiB ``/dev/shm``
    (a memory-backed emptyDir counts against the container's limit), CPU = 8 cores (API server, engine core,
    worker, tokenization), and a node affinity on NVIDIA GPU Feature
    Discovery's ``nvidia.com/gpu.memory`` label for at least 97% of the profile's card, so the replica lands on
    a GPU as large as the profile's ``gpu_memory_utilization`` and ``max_model_len`` assume. CPU: a fixed 1 GiB KV
    cache (``kv_cache_memory_bytes``; the lab's share-of-RAM setting means nothing on a cluster node), memory =
    weights + KV + 2 GiB runtime + 1 GiB ``/dev/shm``, 2 cores.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    model = _CLUSTER_MODEL.get(profile.model, profile.model)
    short = hub_ids().get(model) or hub_ids().get(profile.model)
    if short is None:
        raise ValueError(f"profile {profile.name!r} serves {profile.model!r}, which has no shipped config in "
                         "data/configs/: add it there (and to hub_ids.json) so its weights can be sized")
    weights = weight_bytes(load_config(short), profile.dtype).total
    cache = f"{_gib(weights * 1.5) + 1}Gi"
    if profile.device == "cpu":
        mem = _gib(weights + _GIB + 2 * _GIB + _GIB)
        return Resources(0, "2", f"{mem}Gi", "1Gi", cache, None,
                         f"CPU: {weights / _GIB:.1f} GiB of {profile.dtype} weights + 1 GiB KV cache + 2 GiB runtime "
                         f"+ 1 GiB /dev/shm -> {mem}Gi; 2 cores.")
    if profile.gpu_memory_gib is None:
        raise ValueError(f"GPU profile {profile.name!r} has no gpu_memory_gib: set it in helpers.runtime.PROFILES")
    mem = _gib(weights + 8 * _GIB + 2 * _GIB)
    min_mib = int(profile.gpu_memory_gib * 1024 * 0.97)
    return Resources(1, "8", f"{mem}Gi", "2Gi", cache, min_mib,
                     f"{profile.name}: 1 GPU with >= {min_mib:,} MiB; host memory {weights / _GIB:.1f} GiB of "
                     f"{profile.dtype} weights + 8 GiB runtime + 2 GiB /dev/shm -> {mem}Gi; 8 cores.")


def spec_from_profile(profile: Profile | str, name: str, **overrides: Any) -> FleetSpec:
    """A :class:`FleetSpec` for a profile (a :class:`~helpers.runtime.Profile` or a name in ``PROFILES``): its
    model, dtype, context length and engine arguments, and :func:`resources_for` its hardware. ``overrides``
    replace the derived fields (``engine_args=`` replaces the whole dict).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    res = resources_for(profile)
    args = {"dtype": profile.dtype, "max_model_len": profile.max_model_len, **normalize(profile.engine_args)}
    if profile.device == "cpu":
        args.pop("gpu_memory_utilization", None)
        args["kv_cache_memory_bytes"] = _GIB
    base = dict(model=_CLUSTER_MODEL.get(profile.model, profile.model), served_model_name=profile.served_model_name,
                image=VLLM_CPU_IMAGE if profile.device == "cpu" else VLLM_IMAGE, engine_args=args,
                gpus_per_replica=res.gpus, cpu=res.cpu, memory=res.memory, shm_size=res.shm_size,
                hf_cache_size=res.hf_cache_size, gpu_min_memory_mib=res.gpu_min_memory_mib)
    if profile.device == "cpu":
        base["max_num_seqs"] = 4  # what the lab's CPU fleet measured with: makes the queue visible
    base.update(overrides)
    return FleetSpec(name=name, **base)


# -------------------------------------------------------------------------------------- objects
def _meta(spec: FleetSpec, name: str, component: str) -> dict:
    return {"name": name, "namespace": spec.namespace,
            "labels": {**spec.labels, "app.kubernetes.io/component": component,
                       "app.kubernetes.io/part-of": "llm-serving-labs"}}


def _vllm_args(spec: FleetSpec) -> list[str]:
    args = {"max_num_seqs": spec.max_num_seqs, **normalize(spec.engine_args), "enable_scale_out": True}
    if spec.tensor_parallel_size > 1:
        args["tensor_parallel_size"] = spec.tensor_parallel_size
    return [spec.model, "--served-model-name", spec.served_model_name, "--host", "0.0.0.0",
            "--port", str(spec.port), *engine_cli(args)]


#: Readiness = /v1/models answers, as for the labs' local servers. vLLM guards /v1/* with the API key, and an
#: httpGet probe cannot read a Secret, so the probe is a short Python call carrying the key from the environment.
_READY = ("import os, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{port}/v1/models', "
          "headers={{'Authorization': 'Bearer ' + os.environ['" + API_KEY_ENV + "']}}), timeout=4)")


def deployment(spec: FleetSpec) -> dict:
    """The vLLM Deployment: probes, resources (``nvidia.com/gpu`` when GPUs > 0), ``/dev/shm``, the HF cache, and
    the API key from a Secret.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    limits: dict[str, str] = {"memory": spec.memory}
    requests: dict[str, str] = {"cpu": spec.cpu, "memory": spec.memory}
    if spec.gpus_per_replica:
        limits["nvidia.com/gpu"] = requests["nvidia.com/gpu"] = str(spec.gpus_per_replica)
    cache = ({"name": "hf-cache", "persistentVolumeClaim": {"claimName": spec.hf_cache_claim}} if spec.hf_cache_claim
             else {"name": "hf-cache", "emptyDir": {"sizeLimit": spec.hf_cache_size}})
    container = {
        "name": "vllm", "image": spec.image, "imagePullPolicy": "IfNotPresent",
        "command": ["vllm", "serve"], "args": _vllm_args(spec),
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "env": [{"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": spec.secret_name, "key": "api-key"}}},
                {"name": "HF_HOME", "value": "/root/.cache/huggingface"}],
        "resources": {"requests": requests, "limits": limits},
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": 180},
        "readinessProbe": {"exec": {"command": ["python3", "-c", _READY.format(port=spec.port)]},
                           "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}],
    }
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": 120,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}, cache],
    }
    if spec.gpus_per_replica:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if spec.gpu_min_memory_mib:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt",
                                   "values": [str(spec.gpu_min_memory_mib)]}]}]}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(spec, spec.name, "model-server"),
            "spec": {"replicas": spec.min_replicas, "selector": {"matchLabels": spec.labels},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {"labels": {**spec.labels, "app.kubernetes.io/component": "model-server"}},
                                  "spec": pod}}}


def service(spec: FleetSpec) -> dict:
    """A ClusterIP Service in front of the replicas (direct access and debugging; the gateway routes via the pool).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec, spec.name, "model-server"),
            "spec": {"type": "ClusterIP", "selector": spec.labels,
                     "ports": [{"name": "http", "port": spec.port, "targetPort": "http", "protocol": "TCP"}]}}


def api_key_secret(spec: FleetSpec, api_key: str) -> dict:
    """The Secret holding the API key (``stringData``; never write it into a committed file).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    if not api_key or api_key.strip() != api_key:
        raise ValueError("api_key is empty or has surrounding whitespace: pass the key itself")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(spec, spec.secret_name, "credentials"),
            "type": "Opaque", "stringData": {"api-key": api_key}}


def _epp_name(spec: FleetSpec) -> str:
    return f"{spec.name}-epp"


_EPP_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


def epp_objects(spec: FleetSpec) -> list[dict]:
    """GAIE's endpoint picker for the pool: ServiceAccount, Role and RoleBinding (watch pods and the pool),
    its plugin config (prefix-cache affinity weighted above queue length and KV-cache use), Deployment, Service.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    name = _epp_name(spec)
    sel = {"app.kubernetes.io/name": "epp", "app.kubernetes.io/instance": spec.name}
    meta = lambda n: {"name": n, "namespace": spec.namespace,  # noqa: E731
                      "labels": {**sel, "app.kubernetes.io/component": "endpoint-picker",
                                 "app.kubernetes.io/part-of": "llm-serving-labs"}}
    container = {
        "name": "epp", "image": EPP_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", spec.name, "--pool-namespace", spec.namespace,
                 "--pool-group", "inference.networking.k8s.io", "--config-file", "/config/plugins.yaml",
                 "--zap-encoder", "json", "--tracing=false", "--metrics-endpoint-auth=false"],
        "ports": [{"name": "grpc", "containerPort": 9002}, {"name": "grpc-health", "containerPort": 9003},
                  {"name": "metrics", "containerPort": 9090}],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "livenessProbe": {"grpc": {"port": 9003, "service": "inference-extension"}, "initialDelaySeconds": 5,
                          "periodSeconds": 10},
        "readinessProbe": {"grpc": {"port": 9003, "service": "inference-extension"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(name),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
                   {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
                    "verbs": ["get", "watch", "list"]},
                   {"apiGroups": ["inference.networking.x-k8s.io"],
                    "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": ["get", "watch", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(name),
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name), "data": {"plugins.yaml": _EPP_CONFIG}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name),
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": sel},
                  "template": {"metadata": {"labels": sel},
                               "spec": {"serviceAccountName": name, "terminationGracePeriodSeconds": 130,
                                        "containers": [container],
                                        "volumes": [{"name": "plugins-config", "configMap": {"name": name}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(name),
         "spec": {"type": "ClusterIP", "selector": sel,
                  "ports": [{"name": "grpc-ext-proc", "port": 9002, "protocol": "TCP"},
                            {"name": "http-metrics", "port": 9090, "protocol": "TCP"}]}},
    ]


def inference_pool(spec: FleetSpec) -> dict:
    """GAIE's ``InferencePool`` (``inference.networking.k8s.io/v1``): the vLLM pods, their port, and the picker.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": _meta(spec, spec.name, "inference-pool"),
            "spec": {"selector": {"matchLabels": spec.labels}, "targetPorts": [{"number": spec.port}],
                     "appProtocol": "http",
                     "endpointPickerRef": {"group": "", "kind": "Service", "name": _epp_name(spec),
                                           "port": {"number": 9002}, "failureMode": "FailOpen"}}}


def http_route(spec: FleetSpec) -> dict:
    """An ``HTTPRoute`` from the gateway to the pool (``backendRefs`` of kind ``InferencePool``) for the OpenAI API's
    three paths exactly (:data:`helpers.fleet.gateway.OPEN_PATHS`): vLLM answers ``/metrics``, ``/tokenize`` and
    ``/invocations`` (inference) without its key, so a prefix route would open them to the gateway's clients.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    from .gateway import OPEN_PATHS

    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": _meta(spec, spec.name, "route"),
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": spec.gateway}],
                     "rules": [{"matches": [{"path": {"type": "Exact", "value": p}} for p in OPEN_PATHS],
                                "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                 "name": spec.name}],
                                "timeouts": {"request": "300s"}}]}}


def network_policy(spec: FleetSpec) -> dict:
    """A ``NetworkPolicy``: vLLM's port takes connections from the Gateway's proxies (pods labelled with its name,
    in ``gateway_namespace``), the endpoint picker and Prometheus's namespace only. The pods listen on ``0.0.0.0``
    and vLLM's key guards only ``/v1``: without it any pod in the cluster reaches ``/invocations`` unauthenticated.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    ns = lambda name: {"matchLabels": {"kubernetes.io/metadata.name": name}}  # noqa: E731
    monitoring = re.sub(r"^https?://", "", spec.prometheus_url).split(":")[0].split("/")[0].split(".")
    sources = [{"namespaceSelector": ns(spec.gateway_namespace or spec.namespace),
                "podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": spec.gateway}}},
               {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "epp",
                                                "app.kubernetes.io/instance": spec.name}}}]
    if len(monitoring) > 1:  # prometheus-operated.monitoring.svc: the namespace is the second label
        sources.append({"namespaceSelector": ns(monitoring[1])})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(spec, f"{spec.name}-ingress", "network-policy"),
            "spec": {"podSelector": {"matchLabels": dict(spec.labels)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": sources, "ports": [{"protocol": "TCP", "port": spec.port}]}]}}


def scaled_object(spec: FleetSpec) -> dict:
    """A KEDA ``ScaledObject``: replicas = ceil(sum of ``vllm:num_requests_waiting`` / queue threshold), between
    min and max; scale-up at once, scale-down after 5 minutes of calm (a replica's start costs minutes).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    query = (f'sum(vllm:num_requests_waiting{{namespace="{spec.namespace}",'
             f'model_name="{spec.served_model_name}"}})')
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": _meta(spec, spec.name, "autoscaler"),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name},
                     "minReplicaCount": spec.min_replicas, "maxReplicaCount": spec.max_replicas,
                     "pollingInterval": 5, "cooldownPeriod": 300,
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                         "scaleUp": {"stabilizationWindowSeconds": 0},
                         "scaleDown": {"stabilizationWindowSeconds": 300}}}},
                     "triggers": [{"type": "prometheus", "metricType": "AverageValue",
                                   "metadata": {"serverAddress": spec.prometheus_url, "query": query,
                                                "threshold": str(spec.queue_threshold)}}]}}


def pod_monitor(spec: FleetSpec) -> dict:
    """A Prometheus Operator ``PodMonitor`` scraping each replica's ``/metrics``.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(spec, spec.name, "metrics"),
            "spec": {"selector": {"matchLabels": spec.labels},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": spec.scrape_interval}]}}


def prometheus_rule(spec: FleetSpec, **rule_kwargs: Any) -> dict:
    """A ``PrometheusRule`` with the fleet's recording rules and SLO alerts (:func:`observability.rule_groups`).

    Introduced in lab 23 (Observability and the Postmortem).
    """
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(spec, f"{spec.name}-slo", "alerts"),
            "spec": {"groups": rule_groups(spec.slo, **rule_kwargs)}}


def objects(spec: FleetSpec, api_key: str | None = None) -> list[dict]:
    """Every object of the fleet, in apply order (the Secret only when ``api_key`` is given).

    Introduced in lab 22 (Routing and Autoscaling).
    """
    out = [api_key_secret(spec, api_key)] if api_key is not None else []
    return out + [deployment(spec), service(spec), network_policy(spec), *epp_objects(spec), inference_pool(spec),
                  http_route(spec), scaled_object(spec), pod_monitor(spec), prometheus_rule(spec)]


def write(spec: FleetSpec, folder: str | Path, api_key: str | None = None) -> list[Path]:
    """Write ``folder/manifests/NN-kind-name.yaml``, one object per file, numbered in apply order.

    Without ``api_key`` no Secret is written: create it with
    ``kubectl -n NAMESPACE create secret generic NAME-api-key --from-literal=api-key=...``.
    With one, its file is readable by this user only.

    Introduced in lab 22 (Routing and Autoscaling).
    """
    out = Path(folder) / "manifests"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        old.unlink()
    paths = []
    for i, obj in enumerate(objects(spec, api_key)):
        p = out / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        p.write_text(yaml.safe_dump(obj, sort_keys=False))
        if obj["kind"] == "Secret":
            p.chmod(0o600)
        paths.append(p)
    return paths
