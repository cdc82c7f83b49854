"""``python -m benchmarks.side_by_side run|capacity|rerender``: see the package's docstring."""

from __future__ import annotations

import argparse
import datetime as _dt
import signal
import sys
from pathlib import Path
from typing import Sequence

from . import __doc__ as _doc
from . import capacity as _capacity
from .records import Load
from .render import STEM
from .rounds import rerender
from .rounds import side_by_side
from .serving import MAX_MODEL_LEN, serving, warm_up
from .tools import LABELS, TOOLS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.side_by_side", description=(_doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="every tool at one load against one vLLM server, and the comparison report")
    r.add_argument("--out", default=None, help="results folder (default runs/side-by-side/<time>)")
    r.add_argument("--base-url", default=None, help="attach to this server (OpenAI base URL ending in /v1) "
                                                    "instead of starting one")
    r.add_argument("--model", default=None, help="served model name (default: the first in /v1/models)")
    r.add_argument("--tokenizer", default=None, help="tokenizer path (default: the project's SmolLM2)")
    r.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN, help="of the server started here")
    r.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS, help="which tools (ours first)")
    r.add_argument("--num-requests", type=int, default=30, help="requests per run (each tool, each round)")
    r.add_argument("--rounds", type=int, default=3, help="rounds; each runs every tool once, order rotated")
    r.add_argument("--rate", type=float, default=1.0, help="constant request rate (req/s)")
    r.add_argument("--input-len", type=int, default=256)
    r.add_argument("--output-len", type=int, default=64)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--extra-rounds", type=int, default=0,
                   help="if the verdict misses 5%%, run up to this many more rounds and judge all together")
    r.add_argument("--no-role-probe", action="store_true", help="skip the chat role-chunk probe")
    r.add_argument("--no-calibration", action="store_true",
                   help="skip the cross-check against the calibration server (known TTFT, TPOT and chunking)")

    c = sub.add_parser("capacity", help="the highest chunk rate each tool sustains against the calibration server")
    c.add_argument("--out", default=None, help="results folder (default runs/side-by-side-capacity/<time>)")
    c.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    c.add_argument("--rates", type=float, nargs="+", default=list(_capacity.RATES), help="request rates to step "
                   "through (req/s); each request is one chunk per output token")
    c.add_argument("--duration", type=float, default=8.0, help="seconds of load per step")
    c.add_argument("--retries", type=int, default=1, help="measure a failing step this many more times")
    c.add_argument("--tokenizer", default=None)

    rr = sub.add_parser("rerender", help="rebuild DIR's report from the runs saved in DIR/report.json")
    rr.add_argument("dir")
    return p


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _cmd_run(a: argparse.Namespace) -> int:
    from helpers import settings

    out = Path(a.out) if a.out else settings.runs_dir() / "side-by-side" / _stamp()
    load = Load(rate=a.rate, num_requests=a.num_requests, input_len=a.input_len, output_len=a.output_len,
                seed=a.seed)
    tools = ["ours", *[t for t in a.tools if t != "ours"]]
    with serving(a.base_url, a.model, a.tokenizer, max_model_len=a.max_model_len) as (target, srv):
        warm_up(target)
        rep = side_by_side(target, load, out, rounds=a.rounds, tools=tools, probe_role_chunk=not a.no_role_probe,
                           calibration=not a.no_calibration, extra_rounds=a.extra_rounds, server=srv)
    print(f"\nreport: {out / (STEM + '.md')}")
    for t, c in rep["comparison"].items():
        for m in ("ttft", "tpot"):
            if c[m].get("available"):
                raw = c[m]["raw"]
                print(f"{LABELS[t]} vs ours, {m.upper()} mean: {c[m]['rel_diff']:+.1%} ({c[m]['verdict_on']}; plain "
                      f"difference {raw['rel_diff']:+.1%}, 95% CI {raw['ci95'][0]:+.1%} to {raw['ci95'][1]:+.1%})")
    return 0 if rep["passed"] and not rep["failed_runs"] else 1


def _cmd_capacity(a: argparse.Namespace) -> int:
    from helpers import settings

    out = Path(a.out) if a.out else settings.runs_dir() / "side-by-side-capacity" / _stamp()
    rep = _capacity.capacity(a.tools, out, rates=a.rates, duration_s=a.duration, tokenizer=a.tokenizer,
                             retries=a.retries)
    print(f"\nreport: {out / (_capacity.STEM + '.md')}")
    for t in rep["tools"]:
        b = rep["capacity"][t]
        shown = "none" if b["chunk_rate"] is None else f"{'>= ' if b['at_least'] else ''}{b['chunk_rate']:.0f} chunks/s"
        err = "-" if b["ttft_error"] is None else f"{b['ttft_error']:+.2%}"
        print(f"{LABELS[t]}: {shown} (TTFT error there {err}; stopped by: {b['limited_by']})")
    return 0 if all(rep["capacity"][t]["chunk_rate"] for t in rep["tools"]) else 1


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    # `kill PID` stops cleanly too: the server and the running tool are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.cmd == "rerender":
        rep = rerender(Path(a.dir))
        print(f"report: {Path(a.dir) / (STEM + '.md')}")
        return 0 if rep["passed"] else 1
    return _cmd_run(a) if a.cmd == "run" else _cmd_capacity(a)


if __name__ == "__main__":
    sys.exit(main())
