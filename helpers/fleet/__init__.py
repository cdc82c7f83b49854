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
    board = observability.dashboard(observability.FleetSLO(ttft_p99_ms=500, tpot_p99_ms=50))

- :mod:`~helpers.fleet.manifests`: :class:`FleetSpec` and the Kubernetes objects it implies (vLLM Deployment and
  Service, the Gateway API Inference Extension's InferencePool and endpoint picker, an HTTPRoute, a KEDA
  ScaledObject, a PodMonitor and a PrometheusRule).
- :mod:`~helpers.fleet.validate`: each object checked against a schema of the release it targets, offline.
- :mod:`~helpers.fleet.observability`: Prometheus scrape config, recording rules and SLO alerts (checked with
  ``promtool``), the Grafana dashboard, and ``query_range`` results as DataFrames and altair charts.

The live fleet runs on this machine with the same pieces a cluster uses::

    reps = fleet.start_replicas(PROFILE, 2, max_num_seqs=4)           # each bound to its own cores or card
    with fleet.Router(reps, policy="cache_aware") as router:           # PyPI vllm-router
        files = observability.write_prometheus(run / "prom", [r.url[7:] for r in reps], router.metrics_url[7:-8], slo)
        with fleet.Prometheus(files) as prom:                          # Debian's prometheus
            ...

- :mod:`~helpers.fleet.replicas`: replicas of a profile, each with its share of the device.
- :mod:`~helpers.fleet.router`: vllm-router with a policy, workers added and removed live.
- :mod:`~helpers.fleet.prometheus`: a Prometheus process on the generated files; instant and range queries.
- :mod:`~helpers.fleet.gateway`: nginx in front of the replicas: API keys, closed paths, a per-key rate limit, a
  weighted canary and its rollback by reload.
- :mod:`~helpers.fleet.routing`: what round-robin and cache-aware routing do to each replica's prefix cache,
  predicted by simulating its blocks.
- :mod:`~helpers.fleet.autoscaler`: the queue rules and a loop that scales out and back in through the router, timed.
- :mod:`~helpers.fleet.experts`: a mixture-of-experts router's choices measured, expert placement on EP ranks and
  the imbalance that sets a step's length.
- :mod:`~helpers.fleet.postmortem`: an overloaded run reconstructed (fluid queue model, alert timeline, SLO by
  send time) and written up.

Every process is a :class:`helpers.procs.Proc`: stopped on exit, on error, and by a dead kernel's next start.
"""

from . import experts, postmortem, routing
from .gateway import Gateway
from .autoscaler import QueueAutoscaler, QueueRule, ScaleIn, ScaleOut, decide, decide_in
from .prometheus import Prometheus
from .replicas import parallel_slots, replica_env, start_replica, start_replicas, stop_replicas, tp_env
from .router import Router
from .routing import RoutingPrediction, RoutingRun, measure_routing, predict_routing, routing_trace

__all__ = ["Router", "Prometheus", "Gateway", "QueueAutoscaler", "QueueRule", "ScaleOut", "ScaleIn", "decide", "decide_in", "start_replica", "start_replicas",
           "stop_replicas", "replica_env", "tp_env", "parallel_slots", "routing_trace", "predict_routing", "RoutingPrediction", "measure_routing",
           "RoutingRun"]
