"""The fleet's live pieces without a fleet: the scale-out rule, the autoscaler loop on stand-ins, device shares.

The real replicas, vllm-router and Prometheus run in labs 22 and 23 (``make test`` executes both).
"""

import math
import threading
import time

import pytest

from helpers import fleet, runtime
from helpers.fleet import replicas
from helpers.fleet.router import POLICIES, Router


def test_rule_fires_only_after_the_queue_holds_for_the_whole_window():
    rule = fleet.QueueRule(threshold=4, hold_s=3)
    steady = [(t * 0.5, 5.0) for t in range(10)]
    assert fleet.decide(steady, rule) == 3.0
    assert fleet.decide([(t, 3.9) for t in range(10)], rule) is None
    dip = [(0, 5), (1, 5), (2, 2), (3, 5), (4, 5), (5, 5), (6, 5)]
    assert fleet.decide(dip, rule) == 6            # the dip at t=2 restarts the hold
    gap = [(0, 5), (1, math.nan), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert fleet.decide(gap, rule) == 5            # a missing sample breaks it too


def test_rule_is_per_replica():
    rule = fleet.QueueRule(threshold=4, hold_s=0)
    assert fleet.decide([(0, 6)], rule, replicas=1) == 0
    assert fleet.decide([(0, 6)], rule, replicas=2) is None
    with pytest.raises(ValueError, match="threshold"):
        fleet.QueueRule(threshold=0)


def test_cores_split_into_contiguous_blocks_and_refuse_more_replicas_than_cores():
    assert replicas.core_blocks(2, 2) == ["0", "1"]
    assert replicas.core_blocks(2, 1) == ["0-1"]
    assert replicas.core_blocks(8, 3) == ["0-2", "3-5", "6-7"]
    with pytest.raises(ValueError, match="at least 3 cores"):
        replicas.core_blocks(2, 3)


GPU = runtime.GPU(name="NVIDIA H100 80GB HBM3", memory_gib=79.6, compute_capability=(9, 0))


@pytest.mark.parametrize("name", sorted(runtime.PROFILES))
def test_every_profile_gets_a_share_of_its_device_per_replica(name):
    prof = runtime.PROFILES[name]
    one_gpu = runtime.Machine(is_colab=False, gpus=(GPU,), cpu_count=16, memory_gib=128.0, cpu_name="x",
                              cpu_flags=frozenset())
    two_gpu = runtime.Machine(is_colab=False, gpus=(GPU, GPU), cpu_count=16, memory_gib=128.0, cpu_name="x",
                              cpu_flags=frozenset())
    cpu = runtime.Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_name="x",
                          cpu_flags=frozenset({"avx2"}))
    machine_one, machine_two = (cpu, cpu) if prof.device == "cpu" else (one_gpu, two_gpu)
    envs = [fleet.replica_env(prof, i, 2, machine_two) for i in range(2)]
    assert envs[0] != envs[1]                        # two cards or two core blocks: never the same
    if prof.device == "cpu":                         # vLLM binds cores only in its multiprocessing executor
        assert all(e["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" for e in envs)
    over = replicas.replica_overrides(prof, 2, machine_one)
    assert over["enable_scale_out"] is True
    if prof.device != "cpu":                         # two replicas on one card split its memory
        assert over["gpu_memory_utilization"] * 2 <= prof.utilization + 1e-9
        assert "gpu_memory_utilization" not in replicas.replica_overrides(prof, 2, two_gpu)


def test_tp_env_binds_every_tp_size_on_cpu_and_nothing_on_gpu():
    """TP=1 and TP=2 on the same cores, both through vLLM's multiprocessing executor (the only one that binds)."""
    cpu = runtime.Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_name="x",
                          cpu_flags=frozenset({"avx2"}))
    prof = runtime.PROFILES["cpu"]
    assert fleet.tp_env(prof, 1, cpu) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    assert fleet.tp_env(prof, 2, cpu) == {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with pytest.raises(ValueError, match="needs 3 cores"):
        fleet.tp_env(prof, 3, cpu)
    gpu = next(p for p in runtime.PROFILES.values() if p.device != "cpu")
    two = runtime.Machine(is_colab=False, gpus=(GPU, GPU), cpu_count=16, memory_gib=128.0, cpu_name="x",
                          cpu_flags=frozenset())
    assert fleet.tp_env(gpu, 2, two) == {}


class _Prom:
    def __init__(self):
        self.waiting = 0.0

    def value(self, expr):
        return self.waiting


class _Replica:
    url = "http://127.0.0.1:1"

    def __init__(self):
        self.served = threading.Event()

    def metrics(self):
        from helpers.metrics import Sample, Snapshot

        value = 1.0 if self.served.is_set() else 0.0
        return Snapshot(t=time.time(), samples=[Sample("vllm:request_success_total", (), value)])

    def stop(self):
        self.stopped = True


class _Router:
    def __init__(self):
        self.added = []

    def add_worker(self, w):
        self.added.append(w.url)


def test_autoscaler_times_decision_registration_and_first_request():
    prom, router, replica = _Prom(), _Router(), _Replica()

    def launch():
        time.sleep(0.3)                              # a (short) start-up
        return replica

    scaler = fleet.QueueAutoscaler(prom, router, launch, rule=fleet.QueueRule(4, 0.5), interval_s=0.05,
                                   max_replicas=2)
    with scaler:
        time.sleep(0.3)
        assert not scaler.events                      # idle queue: nothing happens
        prom.waiting = 6.0
        deadline = time.monotonic() + 5
        while not router.added and time.monotonic() < deadline:
            time.sleep(0.05)
        replica.served.set()
        event = scaler.wait_for_serving(5)
    assert router.added == [replica.url] and scaler.replicas == 2
    assert event.error is None
    assert event.decision_s >= 0.3 + 0.5 - 0.1
    assert event.decision_s < event.healthy_s <= event.registered_s <= event.first_served_s
    assert event.decision_to_healthy_s >= 0.3
    assert len(scaler.events) == 1                   # at max_replicas it stops scaling however long the queue


def test_a_starved_autoscaler_acts_when_its_rule_fires():
    """In lab 22 on a busy 2-core machine the loop sampled seconds apart; it must still scale out at the sample where
    the rule (decide, on everything it sampled) fires, not once a hold_s window of fresh samples has refilled."""
    class SlowProm(_Prom):
        calls = 0

        def value(self, expr):
            self.calls += 1
            if self.calls == 3:
                time.sleep(1.0)                      # the query that took a second: a gap longer than hold_s
            return 6.0

    replica = _Replica()
    replica.served.set()
    scaler = fleet.QueueAutoscaler(SlowProm(), _Router(), lambda: replica, rule=fleet.QueueRule(4, 0.5),
                                   interval_s=0.05, max_replicas=2)
    with scaler:
        event = scaler.wait_for_serving(5)
    assert event is not None and event.error is None
    assert fleet.decide([s for s in scaler.samples if s[0] <= event.decision_s], scaler.rule) == event.decision_s
    assert event.decision_s < 1.5, event             # at the first sample after the gap (~1.1 s), not ~0.5 s later


def test_autoscaler_records_a_failed_launch_and_keeps_running():
    prom, router = _Prom(), _Router()
    prom.waiting = 10

    def launch():
        raise RuntimeError("no room")

    scaler = fleet.QueueAutoscaler(prom, router, launch, rule=fleet.QueueRule(4, 0), interval_s=0.05)
    with scaler:
        event = scaler.wait_for_serving(3)
    assert event is not None and "no room" in event.error and router.added == []


def test_router_refuses_what_vllm_router_would_refuse_later():
    with pytest.raises(ValueError, match="unknown policy"):
        Router(["http://127.0.0.1:1"], policy="fastest")
    with pytest.raises(ValueError, match="at least 2 workers"):
        Router(["http://127.0.0.1:1"], policy="power_of_two")
    with pytest.raises(ValueError, match="start the replicas first"):
        Router([], policy="round_robin")
    assert "cache_aware" in POLICIES


def test_scale_in_waits_for_a_whole_stabilization_window_below_one_replica_fewer():
    rule = fleet.QueueRule(threshold=4, hold_s=3, scale_in_target=4, cooldown_s=2)
    quiet = [(t * 0.5, 3.0) for t in range(10)]
    assert fleet.decide_in(quiet, rule, replicas=2) == 2.0
    assert fleet.decide_in(quiet, rule, replicas=1) is None           # never below one replica
    busy = [(0, 3), (1, 3), (1.5, 5), (2, 3), (3, 3), (4, 3)]
    assert fleet.decide_in(busy, rule, replicas=2) == 4               # 5 in flight needs both: the window restarts
    assert fleet.decide_in([(0, 3), (1, math.nan), (2, 3), (3, 3), (4, 3)], rule, replicas=2) == 4
    assert fleet.decide_in([(t, 7.0) for t in range(10)], rule, replicas=3) == 2   # 7 fit in two replicas of 4
    assert fleet.decide_in(quiet, fleet.QueueRule(threshold=4), replicas=2) is None   # no target: never
    with pytest.raises(ValueError, match="scale_in_target"):
        fleet.QueueRule(scale_in_target=0)


class _InFlightProm(_Prom):
    def __init__(self):
        super().__init__()
        self.load = 0.0

    def value(self, expr):
        return self.load if expr == fleet.autoscaler.IN_FLIGHT_QUERY else self.waiting


class _FleetReplica(_Replica):
    """A warm standby that had served before it joined, and holds requests until released."""

    def __init__(self):
        super().__init__()
        self.done, self.holding = 5.0, 0.0

    def metrics(self):
        from helpers.metrics import Sample, Snapshot

        return Snapshot(t=time.time(), samples=[Sample("vllm:request_success_total", (), self.done),
                                                Sample("vllm:num_requests_running", (), self.holding)])


class _RemovingRouter(_Router):
    def __init__(self):
        super().__init__()
        self.removed = []

    def remove_worker(self, w):
        self.removed.append(w.url)


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_autoscaler_scales_out_then_in_drains_before_retiring_and_keeps_the_first_replica():
    prom, router, replica = _InFlightProm(), _RemovingRouter(), _FleetReplica()
    retired = []
    scaler = fleet.QueueAutoscaler(prom, router, lambda: replica, interval_s=0.02, max_replicas=2,
                                   rule=fleet.QueueRule(2, 0.1, scale_in_target=4, cooldown_s=0.3),
                                   retire=retired.append)
    with scaler:
        prom.waiting, prom.load = 6.0, 12.0
        assert _wait(lambda: router.added)
        time.sleep(0.2)
        assert scaler.events[-1].first_served_s is None        # its earlier requests do not count as serving here
        replica.done += 1
        assert scaler.wait_for_serving(5).first_served_s is not None
        prom.waiting, prom.load = 0.0, 6.0                 # the queue is gone but 6 need both replicas
        time.sleep(0.6)
        assert not scaler.scale_ins
        replica.holding, prom.load = 2.0, 3.0              # the load falls; the replica still holds two
        assert _wait(lambda: router.removed)
        sampled = len(scaler.samples)
        time.sleep(0.2)
        assert retired == [] and scaler.scale_ins[-1].drained_s is None   # not stopped while it holds requests
        assert len(scaler.samples) >= sampled + 3          # and the loop goes on watching the queue meanwhile
        replica.holding = 0.0
        event = scaler.wait_for_scale_in(5)
        time.sleep(0.5)                                         # one replica left: no further scale-in
    assert router.removed == [replica.url] and retired == [replica] and scaler.replicas == 1
    assert event.error is None and event.decision_s < event.removed_s <= event.drained_s <= event.retired_s
    assert event.decision_s - scaler.events[-1].first_served_s >= 0.3   # a whole window after the last busy sample
    assert len(scaler.scale_ins) == 1
    assert "load" in scaler.frame()
