"""helpers.server and helpers.procs: the startup-log parser on real CPU and GPU log text, and the process
lifecycle (readiness, fail-fast, timeout, port in use, dead-kernel reaping, reuse, tree kill, orphans, the API
key) against a fake server process, so these run in seconds and need no vLLM. One test does the same with real
vLLM (marked ``vllm``)."""

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import procs, server
from helpers.runtime import GPU

FIXTURES = Path(__file__).parent / "fixtures"
FAKE = Path(__file__).parent / "fake_vllm.py"


# ----------------------------------------------------------------------------- log parsing
def test_parse_real_cpu_startup_log():
    info = server.parse_startup_log((FIXTURES / "vllm_cpu_startup.log").read_text())
    assert info.version == "0.32.0"
    assert info.device == "cpu"
    assert info.dtype == "bfloat16"
    assert info.max_model_len == 2048
    assert info.weights_gib == 0.25            # "Checkpoint size: 0.25 GiB"
    assert info.weights_load_s == 0.46
    assert info.kv_cache_gib == 1.0            # "Explicitly set (1.0/8.34) GiB for KV cache"
    assert info.kv_cache_tokens == 46_592
    assert info.max_concurrency == 22.75
    assert info.concurrency_len == 2048
    assert info.engine_init_s == 1.53
    assert info.compile_s == 0.0               # -O0: no compilation
    # vLLM's own numbers agree with each other: tokens = concurrency x length.
    assert info.kv_cache_tokens == int(info.max_concurrency * info.concurrency_len)
    four = info.four_lines()
    assert len(four) == 3  # on vLLM 0.32 the KV size and concurrency share one line
    assert "Checkpoint size: 0.25 GiB" in four[0] and "46,592 tokens" in four[2]


def test_parse_real_gpu_startup_log():
    info = server.parse_startup_log((FIXTURES / "vllm_gpu_v1_runai67.log").read_text())
    assert info.device == "cuda"
    assert info.kv_cache_tokens == 1_131_008
    assert info.max_concurrency == 8.63
    assert info.concurrency_len == 131_072
    assert info.compile_s == 45.81
    assert info.graph_capture_s == 37 and info.graph_capture_gib == 0.45
    assert info.engine_init_s == 90.84
    assert info.num_blocks == 70_688
    # 70,688 blocks of 16 tokens = 1,131,008 tokens: the log agrees with itself.
    assert info.num_blocks * 16 == info.kv_cache_tokens


def test_token_budget_from_either_line_vllm_writes():
    # vLLM 0.32 (this machine) echoes the arguments it was given; its scheduler's own line (vllm/config/scheduler.py)
    # is not in a vllm-cpu log, and a budget left at its default appears in neither.
    echoed = ("(APIServer pid=3512) INFO 12-02 03:31:33 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
              "'port': 57379, 'model': 'llm-serving-labs/smollm2-135m-instruct', 'dtype': 'bfloat16', "
              "'max_model_len': 8192, 'max_num_batched_tokens': 2048, 'max_num_seqs': 128, 'optimization_level': '0'}")
    assert server.parse_startup_log(echoed).max_num_batched_tokens == 2048
    own = "INFO 05-06 20:59:41 [scheduler.py:308] Chunked prefill is enabled with max_num_batched_tokens=8192."
    assert server.parse_startup_log(own).max_num_batched_tokens == 8192
    assert server.parse_startup_log((FIXTURES / "vllm_cpu_startup.log").read_text()).max_num_batched_tokens is None


@pytest.mark.parametrize("case", json.loads((FIXTURES / "vllm_gpu_lines.json").read_text()),
                         ids=lambda c: c["line"].split("]")[-1][:40])
def test_parse_real_gpu_lines(case):
    info = server.parse_startup_log(case["line"])
    for key, value in case["expect"].items():
        assert getattr(info, key) == pytest.approx(value) if isinstance(value, float) else getattr(info, key) == value
        assert case["line"].strip() == info.lines[key]


def test_init_engine_line_with_compilation_time():
    line = ("(EngineCore pid=1) INFO 11-30 10:10:08 [core.py:402] init engine (profile, create kv cache, "
            "warmup model) took 56.20 s (compilation: 44.90 s)")
    info = server.parse_startup_log(line)
    assert info.engine_init_s == 56.20 and info.compile_s == 44.90


@pytest.mark.parametrize("held", [0, 1, 80, 136])
def test_blocks_in_use_inverts_vllms_own_usage_gauge(held):
    """The gauge's value comes from vLLM's own block pool (the code behind vllm:kv_cache_usage_perc)."""
    block_pool = pytest.importorskip("vllm.v1.core.block_pool")
    pool = block_pool.BlockPool(num_gpu_blocks=137, enable_caching=False, hash_block_size=128)
    pool.get_new_blocks(held)
    assert server.StartupInfo(num_blocks=137).blocks_in_use(pool.get_usage()) == held
    with pytest.raises(ValueError, match="num_blocks"):
        server.StartupInfo().blocks_in_use(0.5)


def test_root_cause_and_hint_from_real_failure_log():
    text = (FIXTURES / "vllm_cpu_kv_too_small.log").read_text()
    cause = server.root_cause(text)
    assert cause.startswith("ValueError: To serve at least one request with the model's max seq len (8192)")
    assert "max_model_len" in server.failure_hint(text)
    # A healthy log has no root cause (the ulimit warning mentions OSError inside backticks).
    assert server.root_cause((FIXTURES / "vllm_cpu_startup.log").read_text()) == ""


# ----------------------------------------------------------------------------- engine args
def test_engine_cli():
    flags = server.engine_cli({"max_model_len": 2048, "enforce_eager": True, "enable_prefix_caching": False,
                               "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
                               "block_size": None, "middleware": ["a", "b"]})
    assert flags == ["--max-model-len", "2048", "--enforce-eager", "--no-enable-prefix-caching",
                     "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}', "--middleware", "a", "b"]
    assert server.engine_cli(["-O0", "--foo"]) == ["-O0", "--foo"]


def test_check_engine_args_refuses_what_the_device_cannot_run():
    with pytest.raises(ValueError, match="FP8 compute"):
        server.check_engine_args({"quantization": "fp8"}, "cpu")
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        server.check_engine_args({"pipeline_parallel_size": 2}, "cpu")
    t4 = GPU("Tesla T4", 15.0, (7, 5))
    with pytest.raises(ValueError, match="float16"):
        server.check_engine_args({"dtype": "bfloat16"}, "cuda", t4)
    # vLLM 0.32 serves --quantization fp8 weight-only (FP8 Marlin) from 7.5: a T4 takes it, a Pascal card does not
    server.check_engine_args({"quantization": "fp8"}, "cuda", t4)
    with pytest.raises(ValueError, match="FP8 Marlin needs compute capability 7.5"):
        server.check_engine_args({"quantization": "fp8"}, "cuda", GPU("Tesla P100", 16.0, (6, 0)))
    server.check_engine_args({"dtype": "float16"}, "cuda", t4)  # fine
    with pytest.raises(ValueError, match="VLLM_API_KEY"):
        server.check_engine_args({"api_key": "secret"}, "cpu")  # never on the command line
    server.check_engine_args({"quantization": "fp8"}, "cuda", GPU("NVIDIA H100 80GB HBM3", 80, (9, 0)))


# ------------------------------------------------------------------------------ lifecycle
@pytest.fixture()
def fake(tmp_path, monkeypatch):
    """A model folder, an isolated state dir, and the fake vLLM as the 'python' that runs it."""
    monkeypatch.setenv("LABS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LABS_REUSE_SERVER", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    exe = tmp_path / "python-fake"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    started = []

    def make(**kw):
        kw.setdefault("python", str(exe))
        kw.setdefault("progress", False)
        kw.setdefault("ready_timeout", 20)
        srv = server.Server(str(model), served_model_name="fake", **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.terminate()
    server.stop_all(verbose=False)


def test_start_ready_and_stop_kills_the_tree(fake, tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_VLLM_MODE", "spawn")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(pid_file))
    with fake() as srv:
        assert srv.running and srv.port and srv.base_url.endswith("/v1")
        child = int(pid_file.read_text())
        assert psutil.pid_exists(child)
        assert srv.startup.kv_cache_tokens == 46_592  # parsed from its log file
        assert any(str(srv.pid) in row for row in server.list_servers())
        pid = srv.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert server.list_servers() == []


def test_crash_during_startup_fails_fast_with_exit_code_cause_and_hint(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    t0 = time.monotonic()
    with pytest.raises(server.ServerStartError) as err:
        fake(ready_timeout=60).start()
    assert time.monotonic() - t0 < 15  # fail fast: not at the deadline
    msg = str(err.value)
    assert err.value.returncode == 3 and "exit code 3" in msg
    assert "Cause: ValueError: To serve at least one request" in msg
    assert "max_model_len" in msg  # the hint names the setting to change
    assert server.list_servers() == []


def test_readiness_timeout_stops_the_process(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    srv = fake(ready_timeout=2)
    with pytest.raises(server.ServerTimeout, match="did not become ready within 2 s"):
        srv.start()
    assert srv.pid and not psutil.pid_exists(srv.pid) or psutil.Process(srv.pid).status() == psutil.STATUS_ZOMBIE
    assert server.list_servers() == []


def test_a_stalled_start_is_stopped_early_and_started_once_more(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang-once")
    monkeypatch.setenv("FAKE_VLLM_MARKER", str(tmp_path / "hung-once"))
    t0 = time.monotonic()
    with fake(ready_timeout=60, stall_s=1.5) as srv:
        assert srv.running and time.monotonic() - t0 < 20  # not at the 60 s deadline
    err = capsys.readouterr().err
    assert "made no progress for" in err and "Starting it once more" in err
    assert server.list_servers() == []


def test_a_start_that_stalls_twice_fails_with_the_reason_and_leaves_nothing(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    t0 = time.monotonic()
    with pytest.raises(procs.ProcessStalled, match="no new log output and no CPU time"):
        fake(ready_timeout=60, stall_s=1.5).start()
    assert time.monotonic() - t0 < 20
    assert server.list_servers() == []


def test_a_slow_start_that_keeps_logging_is_not_a_stall(fake, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_DELAY", "4")
    monkeypatch.setenv("FAKE_VLLM_TICK", "0.5")
    with fake(ready_timeout=30, stall_s=1.5) as srv:
        assert srv.running and srv.ready_s > 3.5


def test_port_in_use_names_the_pid(fake):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(server.PortInUse, match=f"port {port} .* in use by PID {os.getpid()}"):
            fake(port=port).start()


def test_non_loopback_host_requires_an_api_key_and_a_proxy(fake):
    with pytest.raises(ValueError, match="api_key"):
        fake(host="0.0.0.0")
    with pytest.raises(ValueError, match="guards only the /v1 routes.*/metrics"):
        fake(host="0.0.0.0", api_key="secret")  # the key alone leaves /metrics, /tokenize ... open
    fake(host="0.0.0.0", api_key="secret", behind_auth_proxy=True)  # accepted (not started)


def test_api_key_reaches_vllm_by_environment_never_argv_log_state_or_command(fake, tmp_path):
    secret = "s3cr3t-key-" + str(os.getpid())
    with fake(api_key=secret) as srv:
        assert srv.running  # readiness needed the key: the fake's /v1/models answers 401 without it
        import httpx

        assert httpx.get(f"{srv.base_url}/models", timeout=5).status_code == 401
        cmdline = " ".join(psutil.Process(srv.pid).cmdline())
        assert secret not in cmdline and "--api-key" not in cmdline
        state = "".join(p.read_text() for p in (tmp_path / "cache" / "procs").glob("*.json"))
        assert state and secret not in state
        assert secret not in srv.log_path.read_text() and secret not in srv.log_text()
        assert secret not in srv.command() and "VLLM_API_KEY=$VLLM_API_KEY" in srv.command()
    mode = stat.S_IMODE((tmp_path / "cache" / "procs").stat().st_mode)
    assert mode & 0o077 == 0, oct(mode)  # the state folder is this user's alone


def test_missing_model_path_says_what_to_do():
    with pytest.raises(FileNotFoundError, match="does not exist.*model='default'"):
        server.Server("/no/such/checkpoint", progress=False)


def test_server_left_by_a_dead_kernel_is_stopped_before_the_next_start(fake, tmp_path, monkeypatch):
    # A 'kernel' process starts a server, then is SIGKILLed (no atexit, no cleanup).
    script = tmp_path / "kernel.py"
    script.write_text(
        "import sys, time\n"
        "from helpers import server\n"
        f"srv = server.Server({str(tmp_path / 'model')!r}, served_model_name='orphan', python={str(tmp_path / 'python-fake')!r},"
        " progress=False, reuse=True)\n"  # reuse=True: no PDEATHSIG, so the server outlives its kernel
        "srv.start(); srv.proc.record.parked = False; srv.proc.record.save()\n"
        "print(srv.pid, flush=True); time.sleep(3600)\n"
    )
    kernel = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ)
    orphan = int(kernel.stdout.readline())
    kernel.kill()
    kernel.wait()
    assert psutil.pid_exists(orphan)
    assert any("left behind by a dead kernel" in row for row in server.list_servers())
    with fake() as srv:
        assert srv.running
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE


def test_too_many_servers_are_refused_with_names(fake, monkeypatch):
    monkeypatch.setenv("LABS_MAX_SERVERS", "1")
    with fake():
        with pytest.raises(server.TooManyServers, match="(?s)already running.*PID"):
            fake().start()


def test_a_start_can_wait_for_a_slot_to_free_up(fake, monkeypatch):
    monkeypatch.setenv("LABS_MAX_SERVERS", "1")
    first = fake().start()
    threading.Timer(1.5, first.stop).start()
    t0 = time.monotonic()
    with fake(wait_for_slot_s=30) as second:      # would be refused at once without the wait
        assert second.running
    assert time.monotonic() - t0 >= 1.4
    monkeypatch.setenv("LABS_WAIT_FOR_SLOT_S", "0.5")
    with fake():
        with pytest.raises(server.TooManyServers, match="LABS_WAIT_FOR_SLOT_S"):
            fake().start()



def test_waiters_never_take_the_same_free_slot(fake, monkeypatch):
    """Four starts wait for one slot; when it frees, exactly one takes it (the count and the spawn happen under one
    machine-wide lock). Without the lock all four saw the free slot and started at once."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "1")
    first = fake().start()
    started, errors = [], []

    def wait_and_start():
        try:
            started.append(fake(wait_for_slot_s=4).start())
        except server.TooManyServers as e:
            errors.append(e)

    threads = [threading.Thread(target=wait_and_start) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    first.stop()
    for t in threads:
        t.join(30)
    try:
        assert len(started) == 1 and len(errors) == 3, (len(started), len(errors))
    finally:
        for s in started:
            s.stop()

def test_waiters_take_free_slots_in_the_order_they_came(fake, monkeypatch):
    """First come, first served: a waiter is not overtaken by one that came later, nor by a newcomer that finds the
    slot free the moment it frees (measured here before tickets: a lab waited 15 minutes while newer starts from
    other notebooks took every slot that freed)."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "1")
    first = fake().start()
    order = []

    def wait_and_start(name):
        srv = fake(wait_for_slot_s=20).start()
        order.append(name)
        time.sleep(1.0)
        srv.stop()

    early = threading.Thread(target=wait_and_start, args=("early",))
    early.start()
    time.sleep(1.0)
    late = threading.Thread(target=wait_and_start, args=("late",))
    late.start()
    time.sleep(1.0)
    first.stop()
    early.join(30)
    late.join(30)
    assert order == ["early", "late"], order


def test_reuse_parks_and_adopts_same_arguments_only(fake):
    a = fake(reuse=True, engine_args={"max_model_len": 2048})
    a.start()
    pid = a.pid
    a.stop()
    assert psutil.pid_exists(pid)  # parked, not killed
    assert any("parked" in row for row in server.list_servers())
    b = fake(reuse=True, engine_args={"max_model_len": 2048})
    b.start()
    assert b.reused and b.pid == pid
    b.stop()
    c = fake(reuse=True, engine_args={"max_model_len": 4096})  # different arguments: a fresh server
    c.start()
    assert not c.reused and c.pid != pid
    assert psutil.pid_exists(pid)  # room for both: the parked one stays for a later adopter
    c.terminate()


def test_starts_from_threads_adopt_different_parked_servers_of_one_key(fake, monkeypatch):
    """Two replicas on one GPU share a key; started together (fleet.start_replicas), each must adopt its own parked
    server. A slow health probe holds both threads between finding a parked record and taking it."""
    parked = [fake(reuse=True).start() for _ in range(2)]
    pids = {s.pid for s in parked}
    for s in parked:
        s.stop()
    healthy = server.Server._healthy

    def slow_healthy(self, host=None, port=None):
        time.sleep(0.5)
        return healthy(self, host, port)

    monkeypatch.setattr(server.Server, "_healthy", slow_healthy)
    starts = [fake(reuse=True) for _ in range(2)]
    threads = [threading.Thread(target=s.start) for s in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert all(s.reused for s in starts) and {s.pid for s in starts} == pids, [(s.reused, s.pid) for s in starts]
    finally:
        for s in starts:
            s.terminate()


def test_a_plain_start_adopts_a_parked_swappable_server_but_not_the_reverse(fake):
    # Lab 15 starts the baseline swappable, lab 17 plainly: the second adopts the first (one start saved in the
    # sequence) and cannot swap it; a swappable start never adopts a server without the routes it needs.
    swappable = fake(reuse=True, swappable=True).start()
    pid = swappable.pid
    swappable.stop()
    plain = fake(reuse=True).start()
    assert plain.reused and plain.pid == pid and not plain.swappable
    with pytest.raises(server.ServerError, match="swappable=True"):
        plain.swap_weights("elsewhere")
    plain.stop()
    other = fake(reuse=True, engine_args={"max_model_len": 4096}).start()  # other arguments: not adopted
    assert not other.reused
    other.stop()
    assert sum("parked" in row for row in server.list_servers()) == 2
    needs_routes = fake(reuse=True, swappable=True, engine_args={"max_model_len": 4096}).start()
    assert not needs_routes.reused  # the parked plain server of these arguments lacks the routes


def test_room_is_made_first_by_stopping_a_plain_server_that_a_swappable_twin_also_serves(fake, monkeypatch):
    """Labs 11 and 12: lab 11's plain baseline (adopted twice) and lab 12's swappable one of the same arguments
    (used once) are parked when lab 12 starts its fp8-KV server. The plain one must go: the swappable one serves
    both kinds of start, and labs 13-15 start it swappable."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "2")
    plain = fake(reuse=True).start()
    plain_pid = plain.pid
    plain.stop()
    again = fake(reuse=True).start()
    assert again.reused
    again.stop()  # parked, used twice
    swappable = fake(reuse=True, swappable=True).start()
    assert not swappable.reused  # the plain server lacks the routes
    swappable_pid = swappable.pid
    swappable.stop()  # parked, used once
    other = fake(reuse=True, engine_args={"max_model_len": 4096}).start()  # the machine is full
    assert psutil.pid_exists(swappable_pid) and psutil.Process(swappable_pid).status() != psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(plain_pid) or psutil.Process(plain_pid).status() == psutil.STATUS_ZOMBIE
    other.stop()
    for start in (dict(swappable=True), {}):
        s = fake(reuse=True, **start).start()
        assert s.reused and s.pid == swappable_pid
        s.stop()


def test_two_starts_from_threads_each_make_room_beside_two_parked_servers(fake, monkeypatch):
    """Lab 20 starts its prefill and decode servers together while two earlier labs' servers are parked. The first
    start stopped one, launched, released the slot lock, and only then dropped its place in line; the second,
    already waiting on the lock, counted that stale place as a waiter ahead of it and was refused (a fresh-clone CI
    failed so). A pause after the lock's release holds that window open."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "2")
    for args in ({"max_model_len": 2048}, {"max_model_len": 4096}):
        fake(reuse=True, engine_args=args).start().stop()  # parked, each with its own arguments
    real_lock = server.core._slot_lock

    @contextlib.contextmanager
    def slow_release():
        with real_lock():
            yield
        time.sleep(0.5)

    monkeypatch.setattr(server.core, "_slot_lock", slow_release)
    starts = [fake(engine_args={"max_model_len": n}) for n in (1024, 512)]
    errors = []

    def start(s):
        try:
            s.start()
        except server.TooManyServers as e:
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and all(s.running for s in starts), errors


def test_swap_weights_loads_a_same_shape_checkpoint_in_place_and_parks_only_its_own_weights(fake, tmp_path):
    with pytest.raises(ValueError, match="development routes"):
        fake(host="0.0.0.0", api_key="secret", behind_auth_proxy=True, swappable=True)
    plain = fake().start()
    with pytest.raises(server.ServerError, match="swappable=True"):
        plain.swap_weights(tmp_path / "model")
    plain.terminate()

    copy, other, packed = (tmp_path / n for n in ("copy", "other", "packed"))
    for d, cfg in ((copy, {}), (other, {"hidden_size": 64}), (packed, {"quantization_config": {"quant_method": "x"}})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    srv = fake(reuse=True, swappable=True).start()
    assert "VLLM_SERVER_DEV_MODE=1" in srv.command() and srv.key != fake(reuse=True).key
    with pytest.raises(ValueError, match="architecture.*hidden_size"):
        srv.swap_weights(other)
    with pytest.raises(ValueError, match="quantized checkpoint"):
        srv.swap_weights(packed)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        srv.swap_weights(tmp_path / "nowhere")
    assert srv.weights_path is None  # refused before anything was sent
    srv.swap_weights(copy)
    assert srv.weights_path == str(copy) and f"--model {copy}" in srv.command()  # what it serves now
    assert f'"reload_weights","kwargs":{{"weights_path":"{copy}"}}' in srv.log_text()  # what vLLM got
    pid = srv.pid
    srv.stop()  # reuse is on: the weights its key names are loaded back, then it is parked
    again = fake(reuse=True, swappable=True).start()
    assert again.reused and again.pid == pid and again.weights_path is None
    assert f'"reload_weights","kwargs":{{"weights_path":"{srv.model_path}"}}' in again.log_text()
    again.swap_weights(copy)
    (tmp_path / "model" / "config.json").unlink()  # the weights it started with cannot be loaded back:
    again.stop()                                     # stopped, not parked
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_full_machine_makes_room_by_stopping_this_sessions_oldest_parked_server(fake, monkeypatch):
    monkeypatch.setenv("LABS_MAX_SERVERS", "1")
    a = fake(reuse=True, engine_args={"max_model_len": 2048})
    a.start()
    pid = a.pid
    a.stop()  # parked
    b = fake(reuse=True, engine_args={"max_model_len": 4096})
    b.start()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    b.terminate()
    c = fake(reuse=True, make_room=False)
    c.start()
    c.stop()
    with pytest.raises(server.TooManyServers):
        fake(reuse=True, make_room=False, engine_args={"max_model_len": 1024}).start()


def _one_gpu(monkeypatch, cc=(9, 0)):
    """Make the server helpers see one NVIDIA GPU (the fake vLLM runs on CPU all the same)."""
    from helpers.runtime import Machine
    from helpers.server import core

    gpu = Machine(is_colab=False, gpus=(GPU("NVIDIA H100 80GB HBM3", 79.6, cc),), cpu_count=2, memory_gib=24.0)
    monkeypatch.setattr(core, "detect", lambda: gpu)


def test_on_one_gpu_a_parked_server_makes_room_by_memory_not_only_by_count(fake, monkeypatch):
    """Under make test on a GPU, a parked server kept 90% of the card while the limit (2 servers) still had a slot,
    and the next different server failed vLLM's start check ('Free memory on device ... is less than desired GPU
    memory utilization'). A start now counts the card: it stops this session's parked server first."""
    _one_gpu(monkeypatch)
    a = fake(reuse=True, engine_args={"gpu_memory_utilization": 0.9, "max_model_len": 2048})
    a.start()
    pid = a.pid
    a.stop()  # parked, holding 90% of the card
    b = fake(reuse=True, engine_args={"gpu_memory_utilization": 0.9, "max_model_len": 4096})
    b.start()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # two servers that share the card (fleet replicas at half each) still run side by side
    c = fake(reuse=True, engine_args={"gpu_memory_utilization": 0.05, "max_model_len": 1024})
    c.start()
    assert b.running and c.running
    with pytest.raises(server.TooManyServers, match="of the card"):  # running, not parked: refused, with why
        fake(reuse=True, make_room=False, engine_args={"gpu_memory_utilization": 0.5}).start()


def test_an_fp8_kv_cache_is_refused_before_a_start_on_a_t4(fake, monkeypatch):
    """vLLM 0.32 runs only its Triton backend below compute capability 8.0, which refuses an FP8 KV cache when the
    engine builds it: the server would die at start (labs 12 and 15 on Colab's T4)."""
    _one_gpu(monkeypatch, cc=(7, 5))
    with pytest.raises(ValueError, match="SM89"):
        fake(engine_args={"kv_cache_dtype": "fp8"})
    _one_gpu(monkeypatch, cc=(9, 0))
    fake(engine_args={"kv_cache_dtype": "fp8"})  # an H100 stores it (FlashAttention 3)


def test_error_inside_with_block_never_parks(fake):
    srv = fake(reuse=True)
    with pytest.raises(RuntimeError):
        with srv:
            pid = srv.pid
            raise RuntimeError("boom")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_failed_notebook_cell_stops_the_kernels_servers(fake):
    srv = fake().start()

    class Result:
        error_in_exec = ValueError("a typo in some later cell")

    procs._on_cell_error(Result())
    assert not srv.running


def test_command_reproduces_the_server_with_its_environment(fake):
    srv = fake(engine_args={"max_model_len": 2048, "enable_prefix_caching": False}, env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
    cmd = srv.command(port=8000)
    assert cmd.startswith("HF_HUB_OFFLINE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 python -m vllm.entrypoints.openai.api_server "
                          "--model ")
    assert "--port 8000" in cmd and "--max-model-len 2048 --no-enable-prefix-caching" in cmd
    assert cmd.endswith("--served-model-name fake")


def test_reuse_and_stop_all_stay_within_a_session(fake, monkeypatch):
    monkeypatch.setenv("LABS_SESSION", "learner")
    mine = fake(reuse=True)
    mine.start()
    mine_pid = mine.pid
    mine.stop()  # parked for the learner's session
    monkeypatch.setenv("LABS_SESSION", "make-test")
    other = fake(reuse=True)
    other.start()  # same arguments, other session: neither adopts nor stops the learner's server
    assert not other.reused and other.pid != mine_pid and psutil.pid_exists(mine_pid)
    assert server.stop_all(verbose=False, session="make-test") == 1
    assert psutil.pid_exists(mine_pid) and not other.running
    assert server.stop_all(verbose=False, session="learner") == 1


# ----------------------------------------------------------------------------------- orphans
def test_orphans_of_a_killed_leader_are_stopped_by_session_even_when_they_ignore_sigterm(fake, tmp_path, monkeypatch):
    """vLLM's EngineCore outlived a SIGKILLed API server (re-parented to PID 1) and ignored SIGTERM for 8 s."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_VLLM_MODE", "stubborn")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(pid_file))
    srv = fake().start()
    child = int(pid_file.read_text())
    os.kill(srv.pid, 9)
    time.sleep(0.5)
    assert psutil.pid_exists(child) and psutil.Process(child).ppid() != srv.pid  # an orphan now
    t0 = time.monotonic()
    procs.kill_tree(srv.pid, srv.proc.record.create_time, timeout=2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert time.monotonic() - t0 < 10  # SIGKILL after the SIGTERM grace period


def test_reap_stops_the_orphans_of_a_dead_leader(fake, tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_VLLM_MODE", "spawn")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(pid_file))
    srv = fake().start()
    child = int(pid_file.read_text())
    os.kill(srv.pid, 9)
    srv.proc.popen.wait()
    procs.reap(verbose=False)
    time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert procs.records() == []


# --------------------------------------------------------------------------------- real vLLM
@pytest.mark.vllm
@pytest.mark.skipif(not __import__("importlib").util.find_spec("vllm"), reason="needs vLLM installed")
def test_real_vllm_key_by_environment_and_no_orphans_after_sigkill(tmp_path, monkeypatch):
    """With real vLLM: the key guards /v1 but never appears in argv, the log or the state; after a SIGKILL of the
    API server mid-run its EngineCore lives on, and stop() still leaves nothing running."""
    import httpx

    from helpers import runtime

    monkeypatch.delenv("LABS_REUSE_SERVER", raising=False)
    secret = "real-key-" + str(os.getpid())
    prof = runtime.profile("cpu")
    srv = server.start(prof, max_model_len=1024, api_key=secret, progress=False, reuse=False)
    try:
        assert httpx.get(f"{srv.base_url}/models", timeout=10).status_code == 401
        assert httpx.get(f"{srv.base_url}/models", timeout=10,
                         headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        assert httpx.get(f"{srv.url}/metrics", timeout=10).status_code == 200  # why a proxy is needed
        tree = [srv.pid] + [c.pid for c in psutil.Process(srv.pid).children(recursive=True)]
        assert all(secret not in " ".join(psutil.Process(p).cmdline()) for p in tree)
        assert secret not in srv.log_path.read_text()
        assert all(secret not in r.path.read_text() for r in procs.records())
        os.kill(srv.pid, 9)
        time.sleep(2)
        orphans = [p for p in tree[1:] if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert orphans, "vLLM's engine should outlive its API server (what this test guards against)"
    finally:
        srv.terminate()
    left = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_room_is_made_by_stopping_the_least_adopted_parked_server(fake, monkeypatch):
    """A configuration many labs share (adopted often) outlives one-off servers started between them."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "2")
    shared = fake(reuse=True, engine_args={"max_model_len": 2048})
    shared.start()
    shared_pid = shared.pid
    shared.stop()
    again = fake(reuse=True, engine_args={"max_model_len": 2048})
    again.start()  # adopted: used twice now
    assert again.reused
    again.stop()
    one_off = fake(reuse=True, engine_args={"max_model_len": 1024})
    one_off.start()
    one_off_pid = one_off.pid
    one_off.stop()  # parked after the shared one, used once
    third = fake(reuse=True, engine_args={"max_model_len": 512})
    third.start()  # the machine is full: one parked server must go
    assert psutil.pid_exists(shared_pid)
    assert not psutil.pid_exists(one_off_pid) or psutil.Process(one_off_pid).status() == psutil.STATUS_ZOMBIE
    third.terminate()


def test_a_notebook_keeps_the_servers_it_parked_over_an_earlier_notebooks(fake, monkeypatch):
    """Lab 24 parks its design's server to come back to it; a server an exited kernel parked (lab 22's replica,
    adopted by lab 23: two uses to one) goes first, however often it was adopted."""
    monkeypatch.setenv("LABS_MAX_SERVERS", "2")
    earlier = fake(reuse=True, engine_args={"max_model_len": 2048})
    earlier.start()
    earlier.stop()
    again = fake(reuse=True, engine_args={"max_model_len": 2048})
    again.start()  # adopted: used twice
    earlier_pid = again.pid
    again.stop()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rec = next(r for r in procs.records(server.KIND) if r.pid == earlier_pid)
    rec.meta["parked_by"] = [gone.pid, None]  # as an earlier notebook's kernel, now exited, left it
    rec.save()
    own = fake(reuse=True, engine_args={"max_model_len": 1024})
    own.start()
    own_pid = own.pid
    own.stop()  # parked by this process, used once
    third = fake(reuse=True, engine_args={"max_model_len": 512})
    third.start()  # the machine is full: one parked server must go
    assert psutil.pid_exists(own_pid) and psutil.Process(own_pid).status() != psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(earlier_pid) or psutil.Process(earlier_pid).status() == psutil.STATUS_ZOMBIE
    third.terminate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil's create time reads /proc/stat's btime")
def test_a_clock_step_neither_kills_a_live_process_on_paper_nor_hides_its_tree(monkeypatch):
    """psutil adds /proc/stat's btime, a whole second derived from the wall clock at each read, to a process's start:
    after a clock step every create time moves by whole seconds. The registry must still know the process as alive
    (else a benchmark stops sending to a live server) and still find its tree to stop; a different start (a reused
    PID) is still a different process."""
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 30  # until the leader has started its child (a busy machine starts Python slowly)
        while not psutil.Process(leader.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        recorded = psutil.Process(leader.pid).create_time()
        real_btime = psutil._pslinux.boot_time
        monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_btime() - 1)  # the clock stepped back 1 s
        assert abs(psutil.Process(leader.pid).create_time() - recorded + 1) < 1e-6  # as psutil now reads it
        assert procs._alive(leader.pid, recorded)
        assert not procs._alive(leader.pid, recorded + 0.5)
        members = procs.session_members(leader.pid, recorded)
        assert len(members) == 2, members  # the leader and its child
        assert procs.kill_tree(leader.pid, recorded, timeout=5) == 2
        assert leader.wait(5) is not None
    finally:
        with contextlib.suppress(ProcessLookupError):  # only if an assert above failed
            os.killpg(leader.pid, 9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil's create time reads /proc/stat's btime")
def test_a_reused_pid_leading_another_session_is_not_collected():
    """A record's server died and its PID now leads someone else's session (as root on Colab, any process): stopping
    the record must signal nothing, though that session's members have the recorded PID as their session and started
    after the record."""
    other = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(other.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        recorded = psutil.Process(other.pid).create_time() - 7200.25  # our server started two hours earlier with this PID
        assert procs.session_members(other.pid, recorded) == []
        assert procs.kill_tree(other.pid, recorded, timeout=2) == 0
        assert other.poll() is None and len(psutil.Process(other.pid).children()) == 1  # untouched
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(other.pid, 9)


@pytest.mark.vllm
@pytest.mark.skipif(not __import__("importlib").util.find_spec("vllm"), reason="needs vLLM installed")
def test_the_cpu_profile_serves_from_two_processes_not_three(cpu_server):
    """The CPU profile keeps the worker in the engine core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a start
    imports vLLM twice, not three times: the API server's only vLLM child is the engine core, which has none."""
    api = psutil.Process(cpu_server.pid)
    python_children = [c for c in api.children() if "resource_tracker" not in " ".join(c.cmdline())]
    assert [c.name()[:15] for c in python_children] == ["VLLM::EngineCor"], [c.cmdline() for c in python_children]
    grandchildren = [c for c in python_children[0].children(recursive=True)
                     if "resource_tracker" not in " ".join(c.cmdline())]
    assert grandchildren == [], [(c.name(), c.cmdline()) for c in grandchildren]
    log = cpu_server.log_text()
    assert "(Worker pid=" not in log and any("(EngineCore" in line and "Loading weights took" in line
                                              for line in log.splitlines()), cpu_server.log_tail(40)


def test_a_server_bound_to_some_cores_starts_on_them_with_its_children(tmp_path):
    """A CPU replica's VLLM_CPU_OMP_THREADS_BIND names its cores: its process starts there and so do the processes it
    starts (vLLM's engine core and worker), so binding the worker's threads later moves nothing."""
    from helpers.server.core import bound_cpus

    allowed = os.sched_getaffinity(0)
    assert bound_cpus({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) is None and bound_cpus({}) is None
    assert bound_cpus({"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(c) for c in sorted(allowed))}) is None  # every CPU
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to confine a process to one")
    last = max(allowed)
    assert bound_cpus({"VLLM_CPU_OMP_THREADS_BIND": str(last)}) == {last}
    child = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), subprocess.run([sys.executable, '-c', " \
            "'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip())"
    p = procs.Proc([sys.executable, "-c", child], kind="tool", name="affinity", log_path=tmp_path / "a.log",
                   cpus={last}).start()
    p.popen.wait(30)
    assert f"[{last}] [{last}]" in (tmp_path / "a.log").read_text()
    p.stop()


def test_a_server_and_a_router_expose_one_endpoint_type_and_the_key_never_shows():
    """One Endpoint type for every server-like thing: the bench, metrics and evals read base_url, api_key and model
    from it; the Authorization header is built in one place; the key is not in its repr (logs, notebooks)."""
    from helpers.endpoint import Endpoint, auth_headers
    from helpers.fleet.router import Router

    srv = server.Server("default", api_key="sk-secret", port=43210)
    with pytest.raises(RuntimeError, match="start"):
        srv.endpoint  # noqa: B018 - not started: no port to point at
    srv.port = 43210   # as start() sets it
    ep = srv.endpoint
    assert ep == Endpoint("http://127.0.0.1:43210/v1", "sk-secret", srv.served_model_name)
    assert ep.headers == {"Authorization": "Bearer sk-secret"} == auth_headers("sk-secret") and auth_headers(None) == {}
    assert "sk-secret" not in repr(ep) and not ep.ready(timeout=0.5)  # nothing listens there: no, not an exception
    router = Router.__new__(Router)   # its fields only: no vllm-router process
    router.host, router.port, router._model = "127.0.0.1", 43211, "smollm2"
    assert router.endpoint == Endpoint("http://127.0.0.1:43211/v1", None, "smollm2")
