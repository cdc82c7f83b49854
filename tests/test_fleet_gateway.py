"""helpers.fleet.gateway: a real nginx in front of stand-in replicas (small HTTP servers in this process).

What is under test is nginx running the generated configuration: the keys, the closed paths, the per-key rate limit
against its prediction, the canary's share, a rollback under load, and where the keys are not. nginx comes from
Debian's package (`make setup` installs it); without it these tests fail with that instruction rather than skip.
"""

import concurrent.futures as cf
import http.server
import json
import threading
import time

import httpx
import pytest

from helpers import procs, settings
from helpers.fleet import gateway


class _Replica(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        body = json.dumps({"port": self.server.server_address[1], "path": self.path,
                           "authorization": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(0.02)  # a request takes a while, so a reload lands on some in flight
        self._answer()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def replicas():
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replica) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers], servers
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def keys():
    return gateway.Keys.generate(["alice", "bob"])


# ----------------------------------------------------------------------------------------- pure parts
def test_weights_give_the_canary_its_share_of_all_traffic():
    assert gateway.Route(["http://a:1"], ["http://b:2"], canary_percent=10).weights() == {"http://a:1": 9,
                                                                                         "http://b:2": 1}
    w = gateway.Route(["http://a:1", "http://a:2"], ["http://b:2"], canary_percent=25).weights()
    assert w["http://b:2"] / sum(w.values()) == 0.25
    assert gateway.Route(["http://a:1"], ["http://b:2"], canary_percent=0).weights() == {"http://a:1": 1}
    assert gateway.Route(["http://a:1"]).role("a:1") == "baseline"


@pytest.mark.parametrize("kwargs, needle", [
    ({"baseline": []}, "at least one baseline"),
    ({"baseline": ["http://a:1"], "canary_percent": 10}, "no canary replica"),
    ({"baseline": ["http://a:1"], "canary": ["http://b:1"], "canary_percent": 12.5}, "whole percentage"),
    ({"baseline": ["http://a:1"], "canary": ["http://a:1"], "canary_percent": 5}, "both baseline and canary"),
])
def test_bad_routes_are_refused(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        gateway.Route(**kwargs)


def test_every_key_or_each_engineer_gets_its_own_bucket(replicas, keys):
    urls, _ = replicas
    with pytest.raises(ValueError, match="without a key: mallory"):
        gateway.Gateway(gateway.Route(urls[:1]), keys, {"mallory": gateway.RateLimit(1)})
    with gateway.Gateway(gateway.Route(urls[:1]), keys, gateway.RateLimit(per_second=1, burst=0)) as gw:
        for name in ("alice", "bob"):   # the same limit, a bucket each: the first passes, the second is refused
            h = gw.endpoint(name).headers
            assert [httpx.get(f"{gw.base_url}/models", headers=h).status_code for _ in range(2)] == [200, 429]


def test_keys_are_checked_and_never_shown():
    with pytest.raises(ValueError, match="16-256"):
        gateway.Keys({"alice": "short"})
    with pytest.raises(ValueError, match='"?share a key'):
        gateway.Keys({"alice": "k" * 20, "bob": "k" * 20})
    with pytest.raises(ValueError, match="engineer name"):
        gateway.Keys({"al ice": "k" * 20})
    keys = gateway.Keys.generate(["alice"])
    assert keys.key("alice") not in repr(keys)
    with pytest.raises(KeyError, match="knows alice"):
        keys.key("mallory")


def test_admitted_is_the_leaky_bucket_with_nodelay():
    limit = gateway.RateLimit(per_second=5, burst=5)
    assert gateway.admitted(limit, 40, 0.0) == 6         # the burst and the first
    assert gateway.admitted(limit, 40, 1.0) == 11        # then five a second
    assert gateway.admitted(limit, 3, 10.0) == 3         # never more than were sent
    with pytest.raises(ValueError):
        gateway.RateLimit(per_second=0)


# ----------------------------------------------------------------------------------------- real nginx
def test_keys_closed_paths_and_the_key_kept_from_the_replica(replicas, keys):
    urls, _ = replicas
    with gateway.Gateway(gateway.Route(urls[:1]), keys) as gw:
        alice = gw.endpoint("alice")
        assert httpx.get(f"{gw.base_url}/models").status_code == 401
        assert httpx.get(f"{gw.base_url}/models", headers={"Authorization": "Bearer " + "x" * 32}).status_code == 401
        assert httpx.get(f"{gw.url}/metrics").status_code == 401
        for path in ("/metrics", "/tokenize", "/invocations", "/v1/completions/render", "/health"):
            assert httpx.get(gw.url + path, headers=alice.headers).status_code == 404, path
        r = httpx.get(f"{gw.base_url}/models", headers={**alice.headers, "X-Bench-Request-Id": "last"})
        assert r.status_code == 200 and r.json()["authorization"] is None   # the key stops at the gateway
        assert [(x.status, x.engineer) for x in gw.log(wait_for=["last"]) if x.request_id == "last"] == [(200, "alice")]


def test_rate_limit_is_per_key_and_matches_the_prediction(replicas, keys):
    urls, _ = replicas
    limit = gateway.RateLimit(per_second=5, burst=4)
    with gateway.Gateway(gateway.Route(urls[:1]), keys, {"alice": limit}) as gw:
        alice, bob = gw.endpoint("alice"), gw.endpoint("bob")
        with httpx.Client(headers=alice.headers) as c:
            t0 = time.monotonic()
            codes = [c.get(f"{gw.base_url}/models", headers={"X-Bench-Request-Id": f"r{i}"}).status_code
                     for i in range(40)]
            span = time.monotonic() - t0
        assert set(codes) == {200, 429}
        assert abs(codes.count(200) - gateway.admitted(limit, 40, span)) <= 1, (codes.count(200), span)
        with httpx.Client(headers=bob.headers) as c:                                 # bob has no limit
            assert {c.get(f"{gw.base_url}/models").status_code for _ in range(20)} == {200}
        logged = [x for x in gw.log(wait_for=[f"r{i}" for i in range(40)]) if x.engineer == "alice"]
        assert sum(x.status == 429 for x in logged) == codes.count(429)
        assert all(x.upstream == "" for x in logged if x.status == 429)   # refused at the gateway, not by a replica


def _load(gw, n, during=None, at=0.5):
    headers = gw.endpoint("alice").headers
    with httpx.Client(headers=headers) as client, cf.ThreadPoolExecutor(8) as pool:
        def one(i):
            try:
                return client.post(f"{gw.base_url}/completions", json={"i": i},
                                   headers={"X-Bench-Request-Id": str(i)}).status_code
            except httpx.HTTPError as e:
                return repr(e)
        futures = [pool.submit(one, i) for i in range(n)]
        t = None
        if during is not None:
            time.sleep(at)
            t = during()
        return [f.result() for f in futures], t


def test_canary_gets_its_share_and_a_rollback_loses_nothing(replicas, keys):
    urls, _ = replicas
    route = gateway.Route(urls[:1], urls[1:], canary_percent=20)
    with gateway.Gateway(route, keys) as gw:
        codes, _ = _load(gw, 200)
        assert codes == [200] * 200
        logged = gw.log(wait_for=[str(i) for i in range(200)])
        share = sum(route.role(x.upstream) == "canary" for x in logged if x.uri == "/v1/completions") / 200
        assert abs(share - 0.20) <= 0.01, share                        # smooth weighted round-robin
        start = len(logged)
        codes, t_reload = _load(gw, 400, during=lambda: gw.set_route(gateway.Route(urls[:1])), at=0.3)
        assert codes == [200] * 400, [c for c in codes if c != 200][:3]  # nothing lost across the reload
        after = gw.log(wait_for=[str(i) for i in range(400)])[start:]
        assert {x.request_id for x in after} == {str(i) for i in range(400)}
        late = [x for x in after if route.role(x.upstream) == "canary" and x.started > t_reload + 0.5]
        assert not late                                                  # the canary gets nothing new
        assert any(x.started < t_reload and route.role(x.upstream) == "canary" for x in after)
        assert sum(route.role(x.upstream) == "baseline" for x in after if x.started > t_reload + 0.5) > 0


def test_a_dead_canary_moves_its_share_to_the_baseline(replicas, keys):
    urls, servers = replicas
    route = gateway.Route(urls[:1], urls[1:], canary_percent=50)
    servers[1].shutdown()
    servers[1].server_close()
    with gateway.Gateway(route, keys) as gw:
        codes, _ = _load(gw, 40)
        assert codes == [200] * 40           # refused connections are retried on the baseline (nothing was sent)
        served = [x for x in gw.log(wait_for=[str(i) for i in range(40)]) if x.uri == "/v1/completions"]
        assert len(served) == 40 and all(route.role(x.upstream) == "baseline" for x in served)


def test_the_keys_are_not_in_argv_logs_or_state_and_leave_with_the_gateway(replicas, keys):
    urls, _ = replicas
    secret = keys.key("alice")
    with gateway.Gateway(gateway.Route(urls[:1]), keys) as gw:
        httpx.get(f"{gw.base_url}/models", headers={**gw.endpoint("alice").headers, "X-Bench-Request-Id": "k"})
        gw.log(wait_for=["k"])
        conf = gw.workdir / "nginx.conf"
        assert secret in conf.read_text() and (conf.stat().st_mode & 0o077) == 0
        rec = next(r for r in procs.records("gateway") if r.pid == gw.proc.pid)
        assert secret not in " ".join(rec.cmd) and secret not in gw.proc.log_text()
        assert secret not in repr(gw) and secret not in repr(gw.endpoint("alice"))
        access, workdir = gw.access_log, gw.workdir
    assert secret not in access.read_text()
    assert not workdir.exists()
    assert not any(secret in p.read_text(errors="replace") for p in settings.log_dir().glob("gateway*") if p.is_file())


# ------------------------------------------------------------------------------ no side door (raw requests)
def _raw(gw, target, key=None, method="GET"):
    """The status line's code for a request sent byte for byte (no client normalizes the path on the way)."""
    import socket

    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {key}\r\n" if key else ""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall((head + "Content-Length: 0\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, rest = data.partition(b"\r\n")
    return int(status.split()[1]), rest


def _curl(gw, path, key):
    import subprocess

    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--path-as-is", "-K", "-",
                          f"{gw.url}{path}"], input=f'header = "Authorization: Bearer {key}"\n',  # key not in argv
                         capture_output=True, text=True, timeout=30)
    return int(out.stdout)


@pytest.mark.parametrize("target", [
    "/metrics/../v1/models", "/v1/models/../../metrics", "/v1/./models", "//v1/models", "/v1/%6Dodels",
    "/v1/models%2F..%2F..%2Fmetrics", "/v1/models?x=1", "/V1/models", "/v1/models/", "/tokenize/../v1/completions",
])
def test_only_the_exact_raw_paths_pass(replicas, keys, target):
    urls, _ = replicas
    with gateway.Gateway(gateway.Route(urls[:1]), keys) as gw:
        key = keys.key("alice")
        status, body = _raw(gw, target, key)
        assert status == 404 and b'"port"' not in body, (target, status, body[-200:])   # no replica answered
        assert _curl(gw, target, key) == 404
        assert _raw(gw, "/v1/models", key)[0] == 200 and _curl(gw, "/v1/models", key) == 200
        r = httpx.get(f"{gw.base_url}/models", headers={**gw.endpoint("alice").headers, "X-Bench-Request-Id": "z"})
        assert r.status_code == 200 and "x-upstream" not in r.headers          # no replica's address
        assert "nginx/" not in r.headers.get("server", "")                       # nor nginx's version
        logged = {x.uri for x in gw.log(wait_for=["z"])}
        assert target in logged                                              # logged as it was sent


def test_keys_are_compared_exactly_whatever_their_length_or_the_names(replicas):
    urls, _ = replicas
    long_key = "Ab.+/=~-_" * 28                                             # 252 characters, regex characters in it
    keys = gateway.Keys({"default": long_key, "hostnames": "k" * 16 + "X" * 8, "include": "A" * 40})
    with gateway.Gateway(gateway.Route(urls[:1]), keys, {"default": gateway.RateLimit(100, 10)}) as gw:
        for name in keys.names:
            assert _raw(gw, "/v1/models", keys.key(name))[0] == 200, name
        for wrong in (long_key.upper(), long_key.lower(), long_key[:-1], long_key + "x", "A" * 39, "a" * 40,
                      "Ab.+/=~-_" * 27 + "Ab.+/=~-x", "k" * 16 + "x" * 8):
            assert _raw(gw, "/v1/models", wrong)[0] == 401, wrong[:20]


def test_a_flood_of_unknown_keys_is_refused_before_it_counts(replicas, keys):
    urls, _ = replicas
    with gateway.Gateway(gateway.Route(urls[:1]), keys) as gw:
        codes = [_raw(gw, "/v1/models", f"guess-{i:012d}")[0] for i in range(3 * gateway.UNKNOWN_KEY_BURST)]
        assert codes[:gateway.UNKNOWN_KEY_BURST] == [401] * gateway.UNKNOWN_KEY_BURST
        assert codes.count(429) >= gateway.UNKNOWN_KEY_BURST                 # sent far faster than 5 a second
        assert _raw(gw, "/v1/models", keys.key("alice"))[0] == 200          # a known key is not in that bucket


def test_a_keys_requests_in_flight_are_capped(replicas, keys):
    urls, _ = replicas
    limit = gateway.RateLimit(per_second=1000, burst=1000, connections=2)
    with gateway.Gateway(gateway.Route(urls[:1]), keys, {"alice": limit}) as gw:
        codes, _ = _load(gw, 16)                        # 8 at once, each 20 ms at the replica
        assert codes.count(429) > 0 and codes.count(200) >= 2, codes
    with pytest.raises(ValueError, match="in flight"):
        gateway.RateLimit(1, connections=0)


def test_a_reload_nginx_cannot_apply_fails_loudly(replicas, keys):
    import socket

    urls, _ = replicas
    with gateway.Gateway(gateway.Route(urls[:1], urls[1:], canary_percent=50), keys) as gw, \
            socket.socket() as taken:
        gw.set_route(gateway.Route(urls[:1]))           # applied: a new worker serves it
        assert gw.route.canary == ()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port, gw.port = gw.port, taken.getsockname()[1]  # nginx -t passes; the reload cannot bind
        try:
            with pytest.raises(RuntimeError, match="did not apply"):
                gw.set_route(gateway.Route(urls[1:]), timeout=3)
        finally:
            gw.port = port
        assert gw.route.baseline == (urls[0],)          # the route it reports is the one still served
        assert _raw(gw, "/v1/models", keys.key("alice"))[0] == 200
