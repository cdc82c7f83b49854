"""``nvidia-smi`` on a rehearsal's machine (``REHEARSAL_MACHINE``): what the real one prints for the forms the labs and
the set-up scripts use (``--query-gpu=... --format=csv[,noheader][,nounits]``, ``-L`` and the banner)."""

import os
import sys
from pathlib import Path

from .cards import Machine, nvidia_smi


def main() -> int:
    path = os.environ.get("REHEARSAL_MACHINE")
    if not path:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
              "latest NVIDIA driver is installed and running.", file=sys.stderr)
        return 9
    rc, out = nvidia_smi(Machine.from_json(Path(path).read_text()), sys.argv[1:])
    (sys.stdout if rc == 0 else sys.stderr).write(out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
