"""Every ``LABS_*`` environment variable and every folder the labs use, read in one place.

Nothing else in ``helpers`` reads ``os.environ`` for a ``LABS_*`` name or builds one of these paths::

    settings.quick()          # LABS_QUICK: CI-sized loads
    settings.data_dir()       # what the labs ship: configs, prompts, eval sets
    settings.cache_dir()      # converted models, quantized checkpoints, logs, process state
    settings.reports_dir()    # phase artifacts
    settings.runs_dir()       # benchmark records

``python -m helpers.settings`` prints each variable, its value here and what it does.

This module is a leaf: it imports nothing from ``helpers``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

__all__ = [
    "file_lock",
    "FLAGS", "Flag", "flag", "enabled", "quick", "headless", "session", "reuse_server", "max_processes",
    "keep_server_on_error", "profile_name", "cpu_dtype", "rehearsal", "vllm_entrypoint", "gpu_probe", "repo_root", "data_dir", "cache_dir", "hub_cache_dir",
    "reports_dir", "runs_dir", "state_dir", "log_dir", "describe",
]


@dataclass(frozen=True)
class Flag:
    """One ``LABS_*`` environment variable: its default and what it does.

    Introduced in lab 01 (One GPU, One Model).
    """

    name: str
    default: str | None
    doc: str


FLAGS: dict[str, Flag] = {f.name: f for f in (
    Flag("LABS_PROFILE", None, "force a profile (cpu, colab-t4, l4, a100, h100, h200, b200) instead of detecting one"),
    Flag("LABS_QUICK", "0", "1 = CI-sized loads in every lab (set by `make test`)"),
    Flag("LABS_HEADLESS", "0", "1 = no frontend: widgets show their default view as a static chart (set by "
                               "`make test` and ci/run_sequence.py)"),
    Flag("LABS_HOME", None, "the labs' repository (a folder holding labs/ and data/), when it cannot be found "
                            "from the installed package"),
    Flag("LABS_CACHE", None, "cache folder (default ~/.cache/llm-serving-labs): converted models, quantized "
                             "checkpoints, server logs, process state"),
    Flag("LABS_REPORTS", None, "where phase artifacts are written (default reports/ in the repository)"),
    Flag("LABS_RUNS", None, "where benchmark records are written (default runs/ in the repository)"),
    Flag("LABS_SESSION", "", "processes started in one session are parked for, adopted by and stopped with that "
                             "session only (`make test` sets one)"),
    Flag("LABS_REUSE_SERVER", "0", "1 = a stopped server is parked, and the next start with the same arguments in "
                                   "the same session adopts it (set by `make test`)"),
    Flag("LABS_MAX_SERVERS", "2", "most vLLM servers that may run at once on this machine"),
    Flag("LABS_WAIT_FOR_SLOT_S", "0", "seconds a server start waits for another's slot to free up when the machine "
                                      "is at LABS_MAX_SERVERS (0 = refuse at once, naming what runs)"),
    Flag("LABS_KEEP_SERVER_ON_ERROR", "0", "1 = a failing notebook cell leaves its servers running"),
    Flag("LABS_CPU_DTYPE", None, "bfloat16 or float32: override the CPU profile's dtype, which is otherwise "
                                 "chosen from the CPU's instructions (native bf16 or not)"),
    Flag("LABS_QUANT_PYTHON", None, "the python of the llm-compressor environment (default .venv-quant/bin/python "
                                    "in the repository, built by `make setup`)"),
    Flag("LABS_REPO", None, "the repository the Colab setup cell clones (read by that cell, before helpers is "
                            "installed)"),
    Flag("LABS_REHEARSAL", "0", "1 = a rehearsal (`python -m ci.rehearse`): every plan at its rehearsal size (the full "
                                "plan's structure, counts and durations cut), servers from LABS_VLLM_ENTRYPOINT"),
    Flag("LABS_VLLM_ENTRYPOINT", "vllm.entrypoints.openai.api_server",
         "the module `python -m` runs for a vLLM server (a rehearsal names its stand-in)"),
    Flag("LABS_GPU_PROBE", None, "a module `python -m` runs instead of the torch probe of sizing.measure('cuda') (a "
                                 "rehearsal names its stand-in; it prints the probe's JSON)"),
)}

_TRUE = {"1", "true", "yes", "on"}


def flag(name: str) -> str | None:
    """The value of ``LABS_*`` variable ``name`` (its default when unset or empty).

    Introduced in lab 01 (One GPU, One Model).
    """
    if name not in FLAGS:
        raise KeyError(f"{name} is not a known setting; see helpers.settings.FLAGS")
    value = os.environ.get(name)
    return value if value not in (None, "") else FLAGS[name].default


def enabled(name: str) -> bool:
    """True when boolean flag ``name`` is set to 1/true/yes/on.

    Introduced in lab 01 (One GPU, One Model).
    """
    return str(flag(name) or "").strip().lower() in _TRUE


def quick() -> bool:
    """True when CI asks for CI-sized loads (``LABS_QUICK=1``, set by ``make test``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return enabled("LABS_QUICK")


def rehearsal() -> bool:
    """True in a rehearsal (``LABS_REHEARSAL=1``, set by ``python -m ci.rehearse``): plans take their rehearsal size.

    Introduced in lab 01 (One GPU, One Model).
    """
    return enabled("LABS_REHEARSAL")


def vllm_entrypoint() -> str:
    """The module a vLLM server runs as (``LABS_VLLM_ENTRYPOINT``; vLLM's OpenAI API server unless a rehearsal
    names its stand-in).

    Introduced in lab 01 (One GPU, One Model).
    """
    return flag("LABS_VLLM_ENTRYPOINT") or "vllm.entrypoints.openai.api_server"


def gpu_probe() -> str | None:
    """The module that stands in for the GPU probe (``LABS_GPU_PROBE``), or None for the real one.

    Introduced in lab 05 (Where the Time Goes).
    """
    return flag("LABS_GPU_PROBE")


def headless() -> bool:
    """True when no frontend will render widgets (``LABS_HEADLESS=1``): show static charts instead.

    Introduced in lab 01 (One GPU, One Model).
    """
    return enabled("LABS_HEADLESS")


def session() -> str:
    """The process session (``LABS_SESSION``): parking, adoption and ``stop-all --session`` stay inside it.

    Introduced in lab 01 (One GPU, One Model).
    """
    return flag("LABS_SESSION") or ""


def reuse_server() -> bool:
    """True when stopped servers are parked for reuse (``LABS_REUSE_SERVER=1``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return enabled("LABS_REUSE_SERVER")


def max_processes(kind: str = "vllm") -> int:
    """How many processes of ``kind`` may run at once (vLLM servers: ``LABS_MAX_SERVERS``, default 2).

    Introduced in lab 01 (One GPU, One Model).
    """
    return int(flag("LABS_MAX_SERVERS") or 2) if kind == "vllm" else 64


def wait_for_slot_s() -> float:
    """Seconds a server start waits for a free slot (``LABS_WAIT_FOR_SLOT_S``, default 0: refuse at once).

    Introduced in lab 01 (One GPU, One Model).
    """
    return float(flag("LABS_WAIT_FOR_SLOT_S") or 0)


def keep_server_on_error() -> bool:
    """True when a failing cell should leave its servers running (``LABS_KEEP_SERVER_ON_ERROR=1``).

    Introduced in lab 01 (One GPU, One Model).
    """
    return enabled("LABS_KEEP_SERVER_ON_ERROR")


def profile_name() -> str | None:
    """The profile forced by ``LABS_PROFILE`` (``None``: detect).

    Introduced in lab 01 (One GPU, One Model).
    """
    return flag("LABS_PROFILE")


def cpu_dtype() -> str | None:
    """The CPU dtype forced by ``LABS_CPU_DTYPE`` (``None``: choose from the CPU's instructions).

    Introduced in lab 01 (One GPU, One Model).
    """
    value = flag("LABS_CPU_DTYPE")
    if value and value not in ("bfloat16", "float32"):
        raise ValueError(f"LABS_CPU_DTYPE={value!r}: use bfloat16 or float32 (or unset it to detect)")
    return value


# ------------------------------------------------------------------------------------------- paths
_COLAB_CLONE = Path("/content/llm-serving-labs")


def _is_repo(d: Path) -> bool:
    return (d / "labs").is_dir() and (d / "data").is_dir()


def repo_root() -> Path | None:
    """The labs' repository: ``$LABS_HOME``, else the checkout this package is installed from (editable),
    else the working directory or the one above it (a notebook runs in labs/), else the Colab clone.
    ``None`` when there is none: an installed wheel works without it (data ships inside the package).

    Introduced in lab 01 (One GPU, One Model).
    """
    home = flag("LABS_HOME")
    if home:
        p = Path(home).expanduser()
        if not _is_repo(p):
            raise FileNotFoundError(f"LABS_HOME={home} holds no labs/ and data/: point it at the repository")
        return p
    here = Path(__file__).resolve().parent.parent
    for c in (here, Path.cwd(), Path.cwd().parent, _COLAB_CLONE):
        if _is_repo(c):
            return c
    return None


def data_dir() -> Path:
    """What the labs ship (model configs, prompts, eval sets): ``data/`` of the repository the package is installed
    from (editable) or that ``LABS_HOME`` names, else the copy inside the installed package (``helpers/_data``, put
    there when the wheel is built; a wheel never reads a ``data/`` of the folder it runs in).

    Introduced in lab 01 (One GPU, One Model).
    """
    packaged = Path(str(resources.files("helpers") / "_data"))
    if not flag("LABS_HOME") and not _is_repo(Path(__file__).resolve().parent.parent) \
            and (packaged / "configs").is_dir():
        return packaged  # an installed wheel reads its own data, never a folder it happens to run in
    root = repo_root()
    if root is not None:
        return root / "data"
    raise FileNotFoundError(
        "cannot find the labs' data: no repository (labs/ and data/) here or above, and the installed package "
        "carries no helpers/_data. Run from the repository, set LABS_HOME to it, or reinstall the package.")


def _mkdir(d: Path, private: bool = False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if private:
        mode = stat.S_IMODE(d.stat().st_mode)
        if mode & 0o077:
            d.chmod(0o700)
    return d


def cache_dir() -> Path:
    """``$LABS_CACHE``, else ``~/.cache/llm-serving-labs`` (created).

    Introduced in lab 01 (One GPU, One Model).
    """
    return _mkdir(Path(flag("LABS_CACHE") or Path.home() / ".cache" / "llm-serving-labs").expanduser())


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache (``HF_HUB_CACHE`` / ``HF_HOME`` as huggingface_hub resolves them).

    Introduced in lab 01 (One GPU, One Model).
    """
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers brings huggingface_hub
        hf_home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
        return Path(os.environ.get("HF_HUB_CACHE") or Path(hf_home) / "hub")


def _in_repo_or_cache(env: str, name: str) -> Path:
    value = flag(env)
    if value:
        return _mkdir(Path(value).expanduser())
    root = repo_root()
    return _mkdir(root / name if root is not None else cache_dir() / name)


def reports_dir() -> Path:
    """Where phase artifacts go: ``$LABS_REPORTS``, else ``reports/`` in the repository (created).

    Introduced in lab 05 (Where the Time Goes).
    """
    return _in_repo_or_cache("LABS_REPORTS", "reports")


def runs_dir() -> Path:
    """Where benchmark records go: ``$LABS_RUNS``, else ``runs/`` in the repository (created).

    Introduced in lab 02 (Prefill and Decode).
    """
    return _in_repo_or_cache("LABS_RUNS", "runs")


def state_dir() -> Path:
    """Process state files (one per process the labs started), readable by this user only.

    Introduced in lab 01 (One GPU, One Model).
    """
    return _mkdir(cache_dir() / "procs", private=True)


def log_dir() -> Path:
    """Logs of the processes the labs start (servers, routers, Prometheus), readable by this user only.

    Introduced in lab 01 (One GPU, One Model).
    """
    return _mkdir(cache_dir() / "logs", private=True)


def describe() -> str:
    """Each ``LABS_*`` variable, its value here, and what it does.

    Introduced in lab 01 (One GPU, One Model).
    """
    lines = []
    for f in FLAGS.values():
        value = os.environ.get(f.name)
        shown = value if value not in (None, "") else f"(unset; default {f.default!r})"
        lines.append(f"{f.name:26s} {shown}\n    {f.doc}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
    sys.exit(0)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created with its folder if missing) for the ``with`` block: how
    processes of this project take turns (the model conversion, a quantized build, a server slot).

    Introduced in lab 01 (One GPU, One Model).
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
