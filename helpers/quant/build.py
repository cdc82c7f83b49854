"""Build a compressed-tensors checkpoint with llm-compressor, once, in its own environment.

::

    ckpt = quant.build("default", quant.W4A16_GPTQ)            # ~1-2 min the first time, milliseconds after
    ckpt.path, ckpt.seconds, ckpt.weight_bytes
    server.start(PROFILE, model=str(ckpt.path))

Before any work: the group size is checked against the model's layer widths, and the quantization environment
must exist. The recipe runs as ``_worker.py`` under :func:`helpers.quant.env.quant_python`, spawned with
:class:`helpers.procs.Proc` (logged to ``settings.log_dir()``, stopped with this process), offline. Calibration
text is the project's own (``data/calibration/``: :mod:`helpers.calibration`), packed into ``samples`` rows of
``seq_len`` tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from .. import calibration as _calibration
from .. import models, procs
from . import cache
from .env import llmcompressor_version, quant_python, quant_torch_version
from .recipes import Recipe, check_group_size, recipe

__all__ = ["build", "QuantBuildError", "default_calibration", "model_dir", "DEFAULT_SAMPLES", "DEFAULT_SEQ_LEN"]

#: Calibration defaults: small enough for two CPU cores (64 x 256 tokens).
DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 256
_WORKER = Path(__file__).with_name("_worker.py")
_RESULT = "LABS_RESULT "


class QuantBuildError(RuntimeError):
    """llm-compressor failed; the message carries its exit code, the root cause and the log's last lines.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """


def default_calibration(model: str | os.PathLike | None = None,
                        tokens: int = DEFAULT_SAMPLES * DEFAULT_SEQ_LEN) -> Path:
    """The project's calibration text for a build of ``model`` that packs ``tokens`` tokens: ``data/calibration/
    mixed.jsonl`` (written for this project; see its README) where it holds them, else it and the Python Language
    Reference's prose joined (:func:`helpers.calibration.calibration_file`).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return _calibration.calibration_file(_model_id(model), tokens)


def _model_id(model: str | os.PathLike | None) -> str:
    """The id :mod:`helpers.calibration`'s token table knows a model by (the default model's hub id for "default")."""
    return models.DEFAULT_ID if model in (None, "default") else str(model)


def model_dir(model: str | os.PathLike | None) -> Path:
    """The local folder of ``model`` (``"default"``: the cached SmolLM2): a Hugging Face id not yet in the hub cache is
    downloaded first (:func:`helpers.models.fetch`; a fresh Colab runtime reaches labs 12-14 before any server
    pulled the model), except under ``HF_HUB_OFFLINE=1``.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    path = models.fetch(model or "default")
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{model!r} resolves to {path}, which holds no config.json: pass a model folder, "
                                "'default', or a Hugging Face id.")
    return Path(path)


def _short_name(model: str | os.PathLike | None) -> str:
    """``smollm2`` for the default model, a folder's name, or the repository name of a hub-cache snapshot."""
    name = models.served_name(model)
    path = Path(str(model))
    if re.fullmatch(r"[0-9a-f]{40}", name) and path.parent.name == "snapshots":
        name = path.parent.parent.name.split("--")[-1]
    return name.lower()


def build(model: str | os.PathLike | None, r: "Recipe | str", *, calibration: str | os.PathLike | None = None,
          samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN, timeout: float = 1800.0,
          quiet: bool = False) -> cache.Checkpoint:
    """The checkpoint ``r`` makes of ``model``: from the cache if it was built before, else built now.

    ``calibration`` (a JSONL file of ``{"text": ...}`` lines; default :func:`default_calibration`) is used only by
    recipes that need data (:attr:`Recipe.needs_calibration`), and then enters the cache key with ``samples`` and
    ``seq_len``. Returns a :class:`~helpers.quant.cache.Checkpoint` (folder, build seconds, bytes on disk).

    Raises before any work: ``ValueError`` for a group size the model's widths refuse,
    :class:`~helpers.quant.env.QuantEnvMissing` without the quantization environment. Raises
    :class:`QuantBuildError` if llm-compressor fails (nothing is left in the cache then).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    r = recipe(r)
    src = model_dir(model)
    check_group_size(src, r)
    if r.needs_calibration and calibration is None:
        have, how = _calibration.tokens_available(_model_id(model))
        if have < samples * seq_len:
            raise ValueError(
                f"{r.name}: {samples} samples x {seq_len} tokens = {samples * seq_len:,} tokens of calibration text, "
                f"and the project's holds {have:,} for {model} ({how}): ask for fewer samples or shorter ones, or "
                "pass calibration= a longer JSONL file of {\"text\": ...} lines.")
    python = quant_python()
    if r.algorithm == "awq" and (quant_torch_version(python) or "").endswith("+cpu"):
        raise QuantBuildError(
            f"{r.name}: llm-compressor 0.14.0.1's AWQ pins its cached activations in page-locked memory, which a "
            "CPU-only torch refuses ('Cannot access accelerator device when none is available', measured here). "
            "Use GPTQ on this machine (recipes.W4A16_GPTQ), or build AWQ where the quantization environment has a "
            "CUDA torch.")
    job = {"recipe": r.to_dict(), "calibration": None, "samples": None, "seq_len": None}
    calib_sha = None
    calib = Path(calibration) if calibration else default_calibration(model, samples * seq_len)
    if r.needs_calibration:
        if not calib.is_file():
            raise FileNotFoundError(f"calibration file {calib} is missing (the project ships data/calibration/)")
        calib_sha = hashlib.sha256(calib.read_bytes()).hexdigest()
        job.update(calibration=str(calib.resolve()), samples=int(samples), seq_len=int(seq_len))
    version = llmcompressor_version(python)
    key = cache.digest(cache.model_digest(src), r.canonical_json(), calib_sha, job["samples"], job["seq_len"],
                       version, cache.file_digest(_WORKER))
    name = f"{_short_name(model)}-{r.name}"

    def make(out: Path) -> dict:
        if not quiet:
            print(f"building {name} with llm-compressor {version} (once; cached as {cache.cached(name, key).name})",
                  file=sys.stderr)
        return _run_worker(python, {**job, "model": str(src), "out": str(out)}, name, timeout) | {
            "llmcompressor": version, "calibration_file": calib.name if calib_sha else None,
            "calibration_sha256": calib_sha, "samples": job["samples"], "seq_len": job["seq_len"]}

    t0 = time.perf_counter()
    ckpt = cache.build_once(name, key, make, kind="compressed-tensors", source_model=str(model or "default"),
                            recipe=r.to_dict())
    ckpt.details["call_s"] = round(time.perf_counter() - t0, 4)
    return ckpt


def _run_worker(python: Path, job: dict, name: str, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="quant-job-", delete=False) as fh:
        json.dump(job, fh)
        job_path = fh.name
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "DO_NOT_TRACK": "1"})
    env.pop("PYTHONPATH", None)  # the worker imports nothing from helpers
    p = procs.Proc([str(python), str(_WORKER), job_path], kind="quant", name=name, env=env, cwd=job["out"])
    try:
        p.start()
        deadline = time.monotonic() + timeout
        while p.returncode is None:
            if time.monotonic() > deadline:
                raise QuantBuildError(f"building {name} took over {timeout:.0f} s and was stopped; raise timeout= or "
                                      f"use fewer calibration samples. Log: {p.log_path}\n{p.log_tail(20)}")
            time.sleep(0.5)
        text = p.log_text()
        if p.returncode != 0:
            cause = procs.root_cause(text) or next(
                (ln for ln in reversed(text.splitlines()) if ln.strip()), "")
            raise QuantBuildError(f"llm-compressor failed building {name} (exit code {p.returncode}).\nCause: {cause}"
                                  f"\nFull log: {p.log_path}\nLast lines:\n{p.log_tail(25)}")
        result = next((json.loads(ln[len(_RESULT):]) for ln in text.splitlines() if ln.startswith(_RESULT)), {})
        return {"worker": result, "log": str(p.log_path)}
    finally:
        p.stop()
        Path(job_path).unlink(missing_ok=True)
