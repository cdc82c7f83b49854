"""``python -m helpers.bench``: run a benchmark, summarize a saved run, compare two runs.

::

    python -m helpers.bench run --base-url http://127.0.0.1:8000/v1 --model smollm2 --endpoint chat \\
        --arrivals poisson --rate 4 --num-requests 200 --input-len 256 --output-len 64 --warmup 8 \\
        --seed 0 --out runs/poisson-4 --slo-ttft-ms 500
    python -m helpers.bench run --base-url ... --arrivals poisson --rate 40 --duration 60 --workers auto \\
        --input-len uniform:64:512 --output-len normal:128:32:16:256
    python -m helpers.bench run --base-url ... --arrivals ramp --rate 1 --end-rate 20 --ramp-duration 60
    python -m helpers.bench run --base-url ... --conversations --arrivals poisson --rate 2 --num-requests 60
    python -m helpers.bench run --base-url ... --trace data/traces/example.jsonl --time-scale 0.5
    python -m helpers.bench summarize runs/poisson-4 --slo-ttft-ms 300
    python -m helpers.bench compare runs/a runs/b --metric ttft --q 0.99
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Sequence

from .arrivals import make_arrivals
from .conversations import CONVERSATIONS, Conversations
from .lengths import VariableLength, parse_length
from .options import Recording, Sending, Size
from .runner import run
from .stats import SLO
from .store import compare, load_run
from .traces import Trace
from .workloads import FixedLength, FromJsonl, SharedPrefix

__all__ = ["main"]


def _slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="SLO on time to first token (ms)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="SLO on time per output token (ms)")
    p.add_argument("--slo-e2e-ms", type=float, default=None, help="SLO on end-to-end latency (ms)")


def _slo(a: argparse.Namespace):
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"):
        value = getattr(a, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be above 0 ms, got {value:g} (leave it out for no bound)")
    slo = SLO(ttft_ms=a.slo_ttft_ms, tpot_ms=a.slo_tpot_ms, e2e_ms=a.slo_e2e_ms)
    return slo if slo.is_set() else None


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"--workers takes a number >= 1 or 'auto', not {text!r}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labs-bench",
                                description="Benchmark an OpenAI-compatible (vLLM) server honestly.")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a benchmark and write DIR/requests.jsonl, summary.json, config.json")
    r.add_argument("--base-url", required=True, help="OpenAI base URL ending in /v1")
    r.add_argument("--model", default=None, help="served model name (default: the first in /v1/models)")
    r.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    r.add_argument("--tokenizer", default=None, help="tokenizer path or id (default: the served model's, from "
                   "/v1/models); 'none' with --prompts: no expected token counts")
    r.add_argument("--arrivals", choices=["synchronous", "concurrent", "constant", "poisson", "ramp", "trace"],
                   default=None, help="default: synchronous (with --trace: the trace's own times)")
    r.add_argument("--rate", type=float, default=None, help="requests/s (constant, poisson; ramp: the start rate)")
    r.add_argument("--end-rate", type=float, default=None, help="ramp: the rate reached after --ramp-duration")
    r.add_argument("--ramp-duration", type=float, default=None, help="ramp: seconds to go from --rate to --end-rate")
    r.add_argument("--concurrency", type=int, default=None, help="requests in flight (concurrent)")
    r.add_argument("--max-in-flight", type=int, default=None,
                   help="cap for open-loop arrivals (the wait is recorded as client queue time)")
    r.add_argument("--arrival-seed", type=int, default=None, help="seed of Poisson arrivals (default: --seed)")
    r.add_argument("--num-requests", type=int, default=None, help="requests to send (default 100, or --duration)")
    r.add_argument("--duration", type=float, default=None,
                   help="seconds of load instead of --num-requests (open loop: rate x duration requests; closed "
                        "loop: keep them in flight that long, then drain)")
    r.add_argument("--workers", type=_workers, default=1,
                   help="client processes: a number, or 'auto' (as many as the expected chunk rate needs)")
    r.add_argument("--input-len", default="256",
                   help="prompt tokens (chat: of the user message; with --shared-prefix-len: the unique suffix); a "
                        "number or a distribution: uniform:LOW:HIGH, normal:MEAN:STD[:LOW[:HIGH]], hist:EDGES:WEIGHTS")
    r.add_argument("--output-len", default="64",
                   help="output tokens (fixed with min_tokens/ignore_eos); a number or a distribution, as --input-len")
    r.add_argument("--shared-prefix-len", type=int, default=None, help="tokens of a prefix shared by all prompts")
    r.add_argument("--num-prefixes", type=int, default=1)
    r.add_argument("--prompts", default=None, help="JSONL prompt file instead of synthetic prompts")
    r.add_argument("--conversations", nargs="?", const=str(CONVERSATIONS), default=None,
                   help="replay multi-turn chats turn by turn (default file: the labs' own)")
    r.add_argument("--trace", default=None, help="JSONL trace of {t, input_len, output_len}: its lengths (and, "
                   "unless --arrivals says otherwise, its times)")
    r.add_argument("--time-scale", type=float, default=1.0, help="multiplies a trace's gaps (0.5: twice as fast)")
    r.add_argument("--warmup", type=int, default=0, help="warmup requests (disjoint prompts, not counted)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", default=None, help="results folder (default runs/bench/<time>-<arrivals>)")
    r.add_argument("--api-key-env", default="VLLM_API_KEY",
                   help="environment variable holding the server's API key (never on the command line)")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--no-vllm-extras", action="store_true", help="do not send min_tokens/ignore_eos")
    r.add_argument("--no-server-metrics", action="store_true", help="do not scrape /metrics")
    r.add_argument("--sample-interval", type=float, default=0.5, help="seconds between gauge samples")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    _slo_args(r)

    s = sub.add_parser("summarize", help="recompute and print the summary of a saved run")
    s.add_argument("dir")
    s.add_argument("--json", action="store_true")
    _slo_args(s)

    c = sub.add_parser("compare", help="does a quantile differ between two saved runs?")
    c.add_argument("dir_a")
    c.add_argument("dir_b")
    c.add_argument("--metric", default="ttft", choices=["ttft", "tpot", "itl", "e2e", "client_queue"])
    c.add_argument("--q", type=float, default=0.99)
    return p


def _spec(a: argparse.Namespace):
    no_tokenizer = (a.tokenizer or "").lower() == "none"
    if no_tokenizer and not a.prompts:
        raise ValueError("synthetic prompts are built with the model's tokenizer; --tokenizer none only works "
                         "with --prompts FILE")
    if sum(x is not None for x in (a.prompts, a.conversations, a.trace)) > 1:
        raise ValueError("give one of --prompts, --conversations, --trace")
    if a.prompts:
        return FromJsonl(path=a.prompts, endpoint=a.endpoint, tokenizer=False if no_tokenizer else a.tokenizer)
    if a.trace:
        return Trace(path=a.trace, endpoint=a.endpoint, time_scale=a.time_scale, tokenizer=a.tokenizer)
    input_len, output_len = parse_length(a.input_len), parse_length(a.output_len)
    if a.conversations:
        if not isinstance(output_len, int):
            raise ValueError("--conversations asks for a fixed --output-len per turn")
        return Conversations(path=a.conversations, output_len=output_len, tokenizer=a.tokenizer)
    if a.shared_prefix_len:
        if not isinstance(input_len, int) or not isinstance(output_len, int):
            raise ValueError("--shared-prefix-len takes fixed --input-len and --output-len")
        return SharedPrefix(prefix_len=a.shared_prefix_len, suffix_len=input_len, output_len=output_len,
                            endpoint=a.endpoint, num_prefixes=a.num_prefixes, tokenizer=a.tokenizer)
    if isinstance(input_len, int) and isinstance(output_len, int):
        return FixedLength(input_len=input_len, output_len=output_len, endpoint=a.endpoint, tokenizer=a.tokenizer)
    return VariableLength(input_len=input_len, output_len=output_len, endpoint=a.endpoint, tokenizer=a.tokenizer)


#: The run options that are a count (>= 1) or a positive amount, and how the error names them.
_AT_LEAST_ONE = ("num_requests", "concurrency", "max_in_flight", "num_prefixes")
_POSITIVE = ("rate", "end_rate", "ramp_duration", "duration", "time_scale", "timeout", "sample_interval")
_PACED = ("constant", "poisson", "ramp")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_run(a: argparse.Namespace) -> None:
    """Refuse a run's options that cannot mean what they say, in one line each, before any request is sent."""
    for name in _AT_LEAST_ONE:
        if getattr(a, name) is not None and getattr(a, name) < 1:
            raise ValueError(f"{_flag(name)} must be at least 1, got {getattr(a, name)}")
    for name in _POSITIVE:
        if getattr(a, name) is not None and not getattr(a, name) > 0:
            raise ValueError(f"{_flag(name)} must be above 0, got {getattr(a, name)}")
    if a.rate is not None and a.arrivals not in _PACED:
        raise ValueError("--rate paces --arrivals constant, poisson or ramp: " + (
            f"--arrivals {a.arrivals} ignores it" if a.arrivals else
            "without --arrivals a run sends one request at a time (add --arrivals poisson, say)"))
    if a.concurrency is not None and a.arrivals != "concurrent":
        raise ValueError(f"--concurrency is for --arrivals concurrent, not {a.arrivals or '(none)'}")
    if a.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {a.warmup}")


def _cmd_run(a: argparse.Namespace, argv: Sequence[str]) -> int:
    _check_run(a)
    slo = _slo(a)
    spec = _spec(a)
    if isinstance(spec, (FromJsonl, Trace)):
        spec.rows()  # a missing or malformed file is named now, not after asking the server
    seed = a.seed if a.arrival_seed is None else a.arrival_seed
    if a.arrivals == "trace" or (a.arrivals is None and isinstance(spec, Trace)):
        if not isinstance(spec, Trace):
            raise ValueError("--arrivals trace needs --trace FILE")
        arrivals = spec.arrivals(time_scale=a.time_scale, max_in_flight=a.max_in_flight)
    else:
        arrivals = make_arrivals(a.arrivals or "synchronous", rate=a.rate, concurrency=a.concurrency, seed=seed,
                                 max_in_flight=a.max_in_flight, end_rate=a.end_rate, ramp_duration_s=a.ramp_duration)
    if a.num_requests is not None and a.duration is not None:
        raise ValueError("give --num-requests or --duration, not both")
    num = a.num_requests if a.num_requests is not None or a.duration is not None else 100
    if isinstance(spec, Trace) and a.num_requests is None and a.duration is None:
        num = len(spec.rows())
    res = run(spec, arrivals, base_url=a.base_url, model=a.model, api_key=os.environ.get(a.api_key_env) or None,
              slo=slo, size=Size(num_requests=num, duration_s=a.duration, warmup=a.warmup, seed=a.seed),
              sending=Sending(temperature=a.temperature, timeout_s=a.timeout, vllm_extras=not a.no_vllm_extras,
                              workers=a.workers),
              recording=Recording(out=a.out or True, progress=not a.no_progress, server_metrics=not a.no_server_metrics,
                                  sample_interval_s=a.sample_interval,
                                  command=" ".join(["python", "-m", "helpers.bench", *map(shlex.quote, argv)])))
    if a.json:
        print(json.dumps(res.summary.as_dict(), indent=2))
    else:
        print(res)
        print(f"\nresults in {res.out_dir}")
    return 0 if res.summary.completed else 1


def _cmd_summarize(a: argparse.Namespace) -> int:
    res = load_run(a.dir, slo=_slo(a))
    if a.json:
        print(json.dumps(res.summary.as_dict(), indent=2))
    else:
        print(res)
    return 0


def _cmd_compare(a: argparse.Namespace) -> int:
    if not 0 < a.q < 1:
        raise ValueError(f"--q is a quantile between 0 and 1 (0.99 for p99), got {a.q:g}")
    print(compare(a.dir_a, a.dir_b, metric=a.metric, q=a.q))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m helpers.bench``.

    Introduced in lab 02 (Prefill and Decode).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "run":
            return _cmd_run(a, argv)
        if a.cmd == "summarize":
            return _cmd_summarize(a)
        return _cmd_compare(a)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"\n{e or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
