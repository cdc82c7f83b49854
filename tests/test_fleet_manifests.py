"""helpers.fleet.manifests and helpers.fleet.validate: the fleet's Kubernetes objects, and the offline validators
that check them (each shown to reject a broken object, naming the field)."""

import copy
import re
import stat

import pytest
import yaml

from helpers import runtime
from helpers.fleet import manifests as m
from helpers.fleet import observability as obs
from helpers.fleet import validate as v
from helpers.server.args import engine_cli

SPEC = m.spec_from_profile("h100", "chat")


def _container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def _flag(args, name):
    return args[args.index(name) + 1]


# ------------------------------------------------------------------------------- profile -> spec
# Independent arithmetic: weights from the shipped configs (Llama-3.1-8B 8.03e9 params in bf16 = 14.96 GiB;
# Qwen2.5-1.5B 1.54e9 in fp16 = 2.88 GiB; SmolLM2-135M 0.134e9 in fp32 = 0.50 GiB), then the rules of
# resources_for: GPU = weights + 8 GiB + 2 GiB shm; CPU = weights + 1 GiB KV + 2 GiB + 1 GiB shm.
EXPECTED = {
    "cpu": (0, "2", "5Gi", None),
    "colab-t4": (1, "8", "13Gi", int(15.0 * 1024 * 0.97)),
    "l4": (1, "8", "25Gi", int(22.5 * 1024 * 0.97)),
    "a100": (1, "8", "25Gi", int(80.0 * 1024 * 0.97)),
    "h100": (1, "8", "25Gi", int(79.6 * 1024 * 0.97)),
    "h200": (1, "8", "25Gi", int(140.4 * 1024 * 0.97)),
    "b200": (1, "8", "25Gi", int(178.4 * 1024 * 0.97)),
}


def test_every_profile_has_an_expected_row():
    assert set(EXPECTED) == set(runtime.PROFILES)


@pytest.mark.parametrize("name", sorted(runtime.PROFILES))
def test_profile_to_resources(name):
    prof = runtime.PROFILES[name]
    res = m.resources_for(prof)
    assert (res.gpus, res.cpu, res.memory, res.gpu_min_memory_mib) == EXPECTED[name]
    spec = m.spec_from_profile(prof, "fleet")
    c = _container(m.deployment(spec))
    args = c["args"]
    assert args[0] == spec.model and _flag(args, "--served-model-name") == prof.served_model_name
    assert _flag(args, "--dtype") == prof.dtype and _flag(args, "--max-model-len") == str(prof.max_model_len)
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == res.memory
    pod = m.deployment(spec)["spec"]["template"]["spec"]
    if prof.device == "cpu":
        assert "nvidia.com/gpu" not in c["resources"]["limits"] and "affinity" not in pod
        assert spec.image == m.VLLM_CPU_IMAGE and spec.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert "--gpu-memory-utilization" not in args and _flag(args, "--kv-cache-memory-bytes") == str(2**30)
    else:
        assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert spec.image == m.VLLM_IMAGE and spec.model == prof.model
        assert _flag(args, "--gpu-memory-utilization") == str(prof.utilization)
        expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]
        assert expr == {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(res.gpu_min_memory_mib)]}
        assert res.gpu_min_memory_mib < prof.gpu_memory_gib * 1024
        assert "--tensor-parallel-size" not in args


def test_every_profiles_manifests_validate():
    objs = [o for name in runtime.PROFILES for o in m.objects(m.spec_from_profile(name, f"f-{name}"), api_key="k")]
    results = v.validate_objects(objs)
    assert len(results) == len(objs) == 15 * len(runtime.PROFILES)
    bad = [str(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    assert {r.kind for r in results} >= {"Deployment", "Service", "Secret", "InferencePool", "HTTPRoute", "NetworkPolicy",
                                         "ScaledObject", "PodMonitor", "PrometheusRule"}


# --------------------------------------------------------------------------------- the Deployment
def test_vllm_args_reuse_engine_cli_and_add_scale_out_and_max_num_seqs():
    spec = SPEC.replace(engine_args={"max_model_len": 8192, "enable_prefix_caching": True}, max_num_seqs=64)
    args = _container(m.deployment(spec))["args"]
    tail = args[args.index("--port") + 2:]
    assert tail == engine_cli({"max_num_seqs": 64, "max_model_len": 8192, "enable_prefix_caching": True,
                               "enable_scale_out": True})
    assert "--enable-scale-out" in args and _flag(args, "--max-num-seqs") == "64"


def test_api_key_comes_from_a_secret_and_never_appears_in_the_deployment():
    objs = m.objects(SPEC, api_key="s3cr3t-key")
    secret, dep = objs[0], objs[1]
    assert secret["kind"] == "Secret" and secret["stringData"] == {"api-key": "s3cr3t-key"}
    assert "s3cr3t-key" not in yaml.safe_dump(dep)
    c = _container(dep)
    assert not any("api-key" in a or "api_key" in a for a in c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "chat-api-key", "key": "api-key"}
    assert not any(o["kind"] == "Secret" for o in m.objects(SPEC))


def test_probes_volumes_and_ports():
    dep = m.deployment(SPEC)
    c = _container(dep)
    ready = " ".join(c["readinessProbe"]["exec"]["command"])
    assert "/v1/models" in ready and "os.environ['VLLM_API_KEY']" in ready  # the key is read at probe time
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    vols = {vol["name"]: vol for vol in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert "emptyDir" in vols["hf-cache"]
    mounts = {mt["mountPath"] for mt in c["volumeMounts"]}
    assert mounts == {"/dev/shm", "/root/.cache/huggingface"}
    pvc = m.deployment(SPEC.replace(hf_cache_claim="hf-models"))
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-models"}} in \
        pvc["spec"]["template"]["spec"]["volumes"]
    assert dep["spec"]["template"]["metadata"]["labels"].items() >= dep["spec"]["selector"]["matchLabels"].items()


def test_two_gpus_per_replica_become_tensor_parallelism():
    c = _container(m.deployment(SPEC.replace(gpus_per_replica=2)))
    assert _flag(c["args"], "--tensor-parallel-size") == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"


# ------------------------------------------------------------------------- routing and autoscaling
def test_pool_route_picker_and_autoscaler_point_at_each_other():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in m.objects(SPEC)}
    dep, pool = objs[("Deployment", "chat")], objs[("InferencePool", "chat")]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pod_labels.items() >= pool["spec"]["selector"]["matchLabels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": SPEC.port}]
    ref = pool["spec"]["endpointPickerRef"]
    epp_svc = objs[("Service", ref["name"])]
    assert ref["port"]["number"] in {p["port"] for p in epp_svc["spec"]["ports"]}
    epp = objs[("Deployment", ref["name"])]
    assert _flag(_container(epp)["args"], "--pool-name") == pool["metadata"]["name"]
    route = objs[("HTTPRoute", "chat")]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat"}]
    # the OpenAI paths exactly: vLLM's /metrics, /tokenize and /invocations take no key
    assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "Exact", "value": p}}
                                                    for p in ("/v1/models", "/v1/completions", "/v1/chat/completions")]
    # vLLM's port open to the gateway's proxies, the endpoint picker and Prometheus's namespace, nothing else
    policy = objs[("NetworkPolicy", "chat-ingress")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"] and len(policy["ingress"]) == 1
    rule = policy["ingress"][0]
    assert rule["ports"] == [{"protocol": "TCP", "port": SPEC.port}]
    assert rule["from"][1]["podSelector"]["matchLabels"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    assert rule["from"][2] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    plugins = yaml.safe_load(objs[("ConfigMap", ref["name"])]["data"]["plugins.yaml"])
    assert "prefix-cache-scorer" in {p["type"] for p in plugins["plugins"]}
    so = objs[("ScaledObject", "chat")]
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (SPEC.min_replicas, SPEC.max_replicas)
    trig = so["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
    assert obs.metric_names(trig["metadata"]["query"]) == {"vllm:num_requests_waiting"}
    assert trig["metadata"]["threshold"] == str(SPEC.queue_threshold)
    assert objs[("PodMonitor", "chat")]["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert objs[("PrometheusRule", "chat-slo")]["spec"]["groups"] == obs.rule_groups(SPEC.slo)


def test_write_numbers_files_in_apply_order_and_protects_the_secret(tmp_path):
    paths = m.write(SPEC, tmp_path, api_key="k3y")
    assert [p.name[:2] for p in paths] == [f"{i:02d}" for i in range(len(paths))]
    assert paths[0].name == "00-secret-chat-api-key.yaml" and stat.S_IMODE(paths[0].stat().st_mode) == 0o600
    assert v.load_manifests(tmp_path) == m.objects(SPEC, api_key="k3y")
    again = m.write(SPEC, tmp_path)  # no key: the old Secret file is gone too
    assert not any("secret" in p.name for p in (tmp_path / "manifests").iterdir()) and len(again) == len(paths) - 1


# ----------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("changes, needle", [
    (dict(gpus_per_replica=3), "do not divide a node's 8"),
    (dict(gpus_per_replica=3, gpus_per_node=6), "do not divide NousResearch/Meta-Llama-3.1-8B-Instruct's 32 attention"),
    (dict(model="Qwen/Qwen2.5-1.5B-Instruct", gpus_per_replica=3, gpus_per_node=6), "Use one of [1, 2, 4, 6]"),
    (dict(gpus_per_replica=16), "do not fit on a node of 8"),
    (dict(min_replicas=3, max_replicas=2), "1 <= min <= max"),
    (dict(engine_args={"api_key": "x"}), "from a Secret"),
    (dict(engine_args={"enable_scale_out": False}), "need --enable-scale-out"),
    (dict(name="Chat_1"), "lowercase letters"),
    (dict(memory="32GB"), "not a Kubernetes quantity"),
    (dict(ttft_p99_ms=0), "positive number of milliseconds"),
])
def test_bad_specs_are_refused_with_what_to_do(changes, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        SPEC.replace(**changes)


def test_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown profile 'h300'; choose one of cpu, colab-t4"):
        m.spec_from_profile("h300", "x")


# ------------------------------------------------------------------ each validator rejects breakage
def _broken(obj, set_=(), drop=(), add=()):
    obj = copy.deepcopy(obj)
    for path, value in [*set_, *add]:
        *head, last = path
        node = obj
        for p in head:
            node = node[p]
        node[last] = value
    for path in drop:
        *head, last = path
        node = obj
        for p in head:
            node = node[p]
        del node[last]
    return obj


def _assert_names(result, *fields):
    assert not result.ok
    text = "\n".join(result.messages)
    for f in fields:
        assert f in text, f"{f!r} not named in:\n{text}"


def test_kubernetes_validate_rejects_wrong_type_unknown_field_and_missing_field():
    bad = _broken(m.deployment(SPEC), set_=[(("spec", "replicas"), "two")],
                  add=[(("spec", "template", "spec", "containers", 0, "portz"), [8000])],
                  drop=[("spec", "selector")])
    r = v.validate_core(bad)
    _assert_names(r, "spec.replicas: 'two' is not of type 'integer'",
                  "spec.template.spec.containers[0]: Additional properties are not allowed ('portz' was unexpected)",
                  "spec.selector: 'selector' is a required property")
    assert v.validate_core(m.service(SPEC)).ok


@pytest.mark.parametrize("make, set_, add, drop, fields", [
    (m.scaled_object, [(("spec", "maxReplicaCount"), "4")], [(("spec", "triggerz"), [])],
     [("spec", "triggers")],
     ["spec.maxReplicaCount: must be integer", 'spec.triggerz: unknown field "triggerz"',
      "spec.triggers: must have required property triggers"]),
    (m.http_route, [(("spec", "rules", 0, "backendRefs", 0, "weight"), "1")],
     [(("spec", "rules", 0, "backendRefz"), [])], [("spec", "rules", 0, "backendRefs", 0, "name")],
     ["spec.rules[0].backendRefs[0].weight: must be integer", 'spec.rules[0].backendRefz: unknown field',
      "spec.rules[0].backendRefs[0].name: must have required property name"]),
    (m.pod_monitor, [(("spec", "podMetricsEndpoints", 0, "interval"), 5)],
     [(("spec", "podMetricsEndpoints", 0, "scrapeEvery"), "5s")], [("spec", "selector")],
     ["spec.podMetricsEndpoints[0].interval: must be string", "spec.podMetricsEndpoints[0].scrapeEvery: unknown",
      "spec.selector: must have required property selector"]),
    (m.prometheus_rule, [(("spec", "groups", 0, "rules", 0, "for"), 5)], [(("spec", "groups", 0, "rulez"), [])],
     [("spec", "groups", 1, "name")],
     ["spec.groups[0].rules[0].for: must be string", 'spec.groups[0].rulez: unknown field',
      "spec.groups[1].name: must have required property name"]),
])
def test_npm_crd_validators_reject_wrong_type_unknown_field_and_missing_field(make, set_, add, drop, fields):
    good = make(SPEC)
    r_good, r_bad = v.validate_crds([good, _broken(good, set_, drop, add)])
    assert r_good.ok, r_good
    _assert_names(r_bad, *fields)


def test_npm_validator_sees_unknown_fields_deep_inside_but_not_in_maps():
    so = _broken(m.scaled_object(SPEC), add=[(("spec", "advanced", "horizontalPodAutoscalerConfig", "behavior",
                                               "scaleUp", "stabilisationWindowSeconds"), 0),
                                              (("spec", "triggers", 0, "metadata", "anyKeyIsFine"), "x"),
                                              (("metadata", "labels", "team"), "serving")])
    (r,) = v.validate_crds([so])
    assert r.messages == ('spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.stabilisationWindowSeconds: '
                          'unknown field "stabilisationWindowSeconds" (not in the schema)',)


def test_inferencepool_schema_rejects_wrong_type_unknown_field_missing_field_and_the_cel_rules():
    pool = m.inference_pool(SPEC)
    assert v.validate_inferencepool(pool).ok
    r = v.validate_inferencepool(_broken(pool, set_=[(("spec", "targetPorts", 0, "number"), "8000")],
                                         add=[(("spec", "selectr"), {})], drop=[("spec", "endpointPickerRef")]))
    _assert_names(r, "spec.targetPorts[0].number: '8000' is not of type 'integer'",
                  "spec: Additional properties are not allowed ('selectr' was unexpected)",
                  "spec.endpointPickerRef: 'endpointPickerRef' is a required property")
    no_port = v.validate_inferencepool(_broken(pool, drop=[("spec", "endpointPickerRef", "port")]))
    _assert_names(no_port, "spec.endpointPickerRef.port: 'port' is a required property")
    other_kind = _broken(pool, set_=[(("spec", "endpointPickerRef", "kind"), "Backend")],
                         drop=[("spec", "endpointPickerRef", "port")])
    assert v.validate_inferencepool(other_kind).ok  # the port rule binds only kind Service
    dup = v.validate_inferencepool(_broken(pool, set_=[(("spec", "targetPorts"), [{"number": 1}, {"number": 1}])]))
    _assert_names(dup, "spec.targetPorts: [{'number': 1}, {'number': 1}] has non-unique elements")
    old_shape = v.validate_inferencepool(_broken(pool, set_=[(("spec", "targetPortNumber"), 8000)]))
    _assert_names(old_shape, "'targetPortNumber' was unexpected")  # the v1alpha2 field name


def test_a_kind_no_schema_knows_is_not_called_valid():
    (r,) = v.validate_objects([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}])
    assert not r.ok and "cannot be checked offline" in r.messages[0]


def test_missing_npm_packages_say_how_to_install_them(tmp_path):
    with pytest.raises(v.ValidatorMissing, match="npm install --no-audit --no-fund --prefix .npm-fleet"):
        v.validate_crds([m.pod_monitor(SPEC)], node_modules=tmp_path)


def test_expert_parallel_replica_splits_its_gpus_into_data_parallel_ranks():
    spec = m.spec_from_profile("h200", name="moe", model="Qwen/Qwen3-30B-A3B", gpus_per_replica=8,
                                       engine_args={"data_parallel_size": 8, "enable_expert_parallel": True})
    args = m.deployment(spec)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-expert-parallel" in args and args[args.index("--data-parallel-size") + 1] == "8"
    assert "--tensor-parallel-size" not in args and spec.tensor_parallel_size == 1
    with pytest.raises(ValueError, match="does not divide"):
        m.spec_from_profile("h200", name="moe", gpus_per_replica=8, engine_args={"data_parallel_size": 3})
