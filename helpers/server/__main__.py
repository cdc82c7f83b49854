"""``python -m helpers.server list|stop PID|stop-all [--session S]|smoke``: the processes the labs started, and a
seconds-long proof that the installed vLLM runs on this device."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable

from .. import procs


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labs-server",
                                     description="List or stop the processes (vLLM servers, routers, Prometheus, "
                                                 "calibration servers) the labs started.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list running processes")
    p = sub.add_parser("stop", help="stop one process (and its whole tree) by PID")
    p.add_argument("pid", type=int)
    sub.add_parser("smoke", help="start the embedded model on this device, ask one completion, stop it: proves the "
                                 "installed vLLM build runs here (seconds)")
    p = sub.add_parser("stop-all", help="stop every process the labs started")
    p.add_argument("--session", default=None, help="only those of this LABS_SESSION (as `make test` uses)")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.cmd == "smoke":
        from .core import ServerError, smoke

        try:
            print(smoke())
        except (ServerError, procs.ProcessError) as e:
            lines = str(e).strip().splitlines()
            said = [lines[0]] + [x for x in lines[1:] if x.startswith(("Cause:", "Full log:"))]
            print(f"error: {' '.join(said)}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "list":
        rows = procs.describe_all()
        print("\n".join(rows) if rows else "no processes running")
    elif args.cmd == "stop":
        recs = [r for r in procs.records() if r.pid == args.pid]
        if not recs:
            print(f"PID {args.pid} is not a process the labs started; `list` shows those.", file=sys.stderr)
            return 1
        procs.kill_tree(recs[0].pid, recs[0].create_time)
        recs[0].remove()
        print(f"stopped PID {args.pid}")
    else:
        n = procs.stop_all(session=args.session)
        print(f"stopped {n} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
