"""Stands in for `python -m vllm.entrypoints.openai.api_server` in the server-lifecycle tests.

Invoked as ``fake_vllm.py -m vllm.entrypoints.openai.api_server --model M --host H --port P ...``.
FAKE_VLLM_MODE picks a behaviour: serve (answer /v1/models after FAKE_VLLM_DELAY s, logging a line every
FAKE_VLLM_TICK s meanwhile if set), crash (log a real vLLM error and exit 3), hang (never listen, never log),
hang-once (hang the first time, when FAKE_VLLM_MARKER does not exist yet, then serve), spawn (serve, with a child process of its own), stubborn
(serve, with a child that ignores SIGTERM, as vLLM's EngineCore was seen to). With VLLM_API_KEY set, /v1/models
needs ``Authorization: Bearer <key>``, as vLLM's /v1 routes do.
"""

import http.server
import os
import subprocess
import sys
import time

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
host = args[args.index("--host") + 1]
mode = os.environ.get("FAKE_VLLM_MODE", "serve")
print("INFO fake vLLM starting", flush=True)

if mode == "crash":
    print("(EngineCore pid=1) ERROR [core.py:1510] ValueError: To serve at least one request with the model's "
          "max seq len (8192), (0.18 GiB KV cache is needed, which is larger than the available KV cache "
          "memory (0.04 GiB).", flush=True)
    sys.exit(3)
if mode == "hang-once":  # hang (no output, no CPU) on the first start only, as a frozen process would
    marker = os.environ["FAKE_VLLM_MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        mode = "hang"
if mode == "hang":
    time.sleep(3600)
if mode in ("spawn", "stubborn"):
    code = "import time; time.sleep(3600)"
    if mode == "stubborn":
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    with open(os.environ["FAKE_VLLM_CHILD_PID_FILE"], "w") as fh:
        fh.write(str(child.pid))
KEY = os.environ.get("VLLM_API_KEY")

delay, tick = float(os.environ.get("FAKE_VLLM_DELAY", "0.3")), float(os.environ.get("FAKE_VLLM_TICK", "0"))
while tick and delay > 0:  # a slow start that keeps logging (loading weights, compiling)
    print("INFO loading ...", flush=True)
    time.sleep(min(tick, delay))
    delay -= tick
time.sleep(max(delay, 0))
print("(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, "
      "Maximum concurrency for 2,048 tokens per request: 22.75x", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/models" and KEY and self.headers.get("Authorization") != f"Bearer {KEY}":
            body = b'{"error":"Unauthorized"}'
            self.send_response(401)
        elif self.path in ("/v1/models", "/health"):
            body = b'{"object":"list","data":[{"id":"fake"}]}'
            self.send_response(200)
        else:
            body = b"not found"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # vLLM's development routes exist only with VLLM_SERVER_DEV_MODE=1
        known = self.path in ("/collective_rpc", "/reset_prefix_cache")
        ok = known and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if ok and self.path == "/collective_rpc":
            print(f"collective_rpc {body.decode()}", flush=True)
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


http.server.HTTPServer((host, port), Handler).serve_forever()
