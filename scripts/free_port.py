"""Print the first TCP port from START (default 8890) that nothing listens on (for `make lab`)."""

import socket
import sys

start = int(sys.argv[1]) if len(sys.argv) > 1 else 8890
for port in range(start, start + 100):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            continue
        print(port)
        break
else:
    sys.exit(f"no free port in {start}-{start + 99}")
