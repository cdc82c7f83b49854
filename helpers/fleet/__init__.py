"""A fleet of vLLM replicas: its Kubernetes deployment, offline validation, and its observability.

Phase 4 (*Running a Fleet*) ends in a multi-replica deployment with prefix-aware routing, queue-based
autoscaling and an SLO dashboard. No cluster runs on a lab machine, so the deployment ships as configuration that
is validated offline, and the same Prometheus rules and dashboard panels run against the local fleet::

    from helpers.fleet import manifests, validate, observability

    spec = manifests.spec_from_profile(PROFILE, name="chat")     # or manifests.FleetSpec(...)
    paths = manifests.write(spec, "deploy/")                      # deploy/manifests/*.yaml
    for r in validate.validate_folder("deploy/"):                 # every object against its real schema
        print(r)

    cfg = observability.prometheus_config(["127.0.0.1:8201", "127.0.0.1:8202"], router="127.0.0.1:29001")
    board = observability.dashboard(observability.SLO(ttft_p99_ms=500, tpot_p99_ms=50))

- :mod:`~helpers.fleet.manifests`: :class:`FleetSpec` and the Kubernetes objects it implies (vLLM Deployment and
  Service, the Gateway API Inference Extension's InferencePool and endpoint picker, an HTTPRoute, a KEDA
  ScaledObject, a PodMonitor and a PrometheusRule).
- :mod:`~helpers.fleet.validate`: each object checked against a schema of the release it targets, offline.
- :mod:`~helpers.fleet.observability`: Prometheus scrape config, recording rules and SLO alerts (checked with
  ``promtool``), the Grafana dashboard, and ``query_range`` results as DataFrames and altair charts.

The live pieces (replicas, vllm-router, Prometheus processes, the autoscaler loop) live in other modules of this
package.
"""
