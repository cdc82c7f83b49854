"""The calibration text GPTQ, AWQ and SmoothQuant read, and how many tokens it holds for each model.

Two files in ``data/calibration/``, read in order: ``mixed.jsonl`` (410 short texts written for this project) and
``reference.jsonl`` (prose of the Python Language Reference, from the standard library; see the folder's README).
A build packs them into ``samples`` rows of ``seq_len`` tokens, so it needs ``samples x seq_len`` tokens of the
model's own tokenizer. ``data/calibration/tokens.json`` records, for each file, its SHA-256, the tokens of every
tokenizer this project ships (SmolLM2's), and a lower bound for the rest: the chunks that Llama 3's pre-tokenizer
splits the text into (:data:`PRETOKEN_PATTERN`). A byte-level BPE token never spans two chunks, so a tokenizer with
that split (Llama 3) or a finer one (Qwen2.5 splits digits one by one) makes at least that many tokens.
``helpers.plan`` reads the table to check every profile's calibration before a lab asks for it; the tests recount it.

    python -m helpers.calibration            # the counts, recomputed, against tokens.json
    python -m helpers.calibration --write    # rewrite tokens.json after changing a file

Introduced in lab 14 (AWQ, GPTQ, and What Died).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from . import settings

__all__ = ["FILES", "PRETOKEN_PATTERN", "texts", "pretoken_chunks", "count_tokens", "measure", "recorded",
           "tokens_available", "calibration_file"]

#: The calibration files, in the order a build reads them.
FILES = ("mixed.jsonl", "reference.jsonl")
#: Llama 3's pre-tokenizer split (its tokenizer.json); Qwen2.5's is the same with ``\p{N}`` for ``\p{N}{1,3}``.
PRETOKEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                    r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _dir() -> Path:
    return settings.data_dir() / "calibration"


def texts(name: str) -> list[str]:
    """The texts of one calibration file, each followed by the blank line the build packs it with.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return [json.loads(line)["text"] + "\n\n" for line in (_dir() / name).read_text().splitlines() if line.strip()]


def pretoken_chunks(name: str) -> int:
    """Chunks Llama 3's pre-tokenizer splits file ``name`` into: a lower bound on its tokens (see the module).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    import regex  # transformers' dependency; the standard re has no \\p{L}

    split = regex.compile(PRETOKEN_PATTERN)
    return sum(len(split.findall(t)) for t in texts(name))


def count_tokens(name: str, tokenizer: Any) -> int:
    """Tokens of file ``name`` as the build counts them (each text plus its blank line, no special tokens).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts(name))


def measure(tokenizers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table ``tokens.json`` holds, recomputed: per file its SHA-256, pre-tokenizer chunks and tokens per model
    (``tokenizers``: model id -> a transformers tokenizer; default the default model's, the one this project ships).

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if tokenizers is None:
        from transformers import AutoTokenizer

        from . import models

        tokenizers = {models.DEFAULT_ID: AutoTokenizer.from_pretrained(str(models.default_model(quiet=True)))}
    return {"pretoken_pattern": PRETOKEN_PATTERN,
            "files": {name: {"sha256": hashlib.sha256((_dir() / name).read_bytes()).hexdigest(),
                             "pretoken_chunks": pretoken_chunks(name),
                             "tokens": {m: count_tokens(name, tok) for m, tok in tokenizers.items()}}
                      for name in FILES}}


def recorded() -> dict[str, Any]:
    """``data/calibration/tokens.json`` as committed.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    return json.loads((_dir() / "tokens.json").read_text())


def tokens_available(model: str, files: tuple[str, ...] = FILES) -> tuple[int, str]:
    """(tokens, how they were counted) that ``files`` hold for ``model``: its tokenizer's count where this project
    ships the tokenizer, else the pre-tokenizer lower bound.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    table = recorded()["files"]
    if all(model in table[f]["tokens"] for f in files):
        return sum(table[f]["tokens"][model] for f in files), f"{model}'s own tokenizer"
    return (sum(table[f]["pretoken_chunks"] for f in files),
            "a lower bound: chunks of Llama 3's pre-tokenizer split (a BPE token never spans two)")


def calibration_file(model: str, tokens_needed: int) -> Path:
    """The file a build of ``model`` that packs ``tokens_needed`` tokens reads: ``mixed.jsonl`` where it holds them
    (so the CPU profile's builds, and their cache keys, never change), else both files joined, written once into the
    cache under their content's hash.

    Introduced in lab 14 (AWQ, GPTQ, and What Died).
    """
    if tokens_available(model, FILES[:1])[0] >= tokens_needed:
        return _dir() / FILES[0]
    blob = b"".join((_dir() / f).read_bytes() for f in FILES)
    out = settings.cache_dir() / "calibration" / f"calibration-{hashlib.sha256(blob).hexdigest()[:16]}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(blob)
        tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.calibration", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite data/calibration/tokens.json")
    a = ap.parse_args(argv)
    now = measure()
    if a.write:
        (_dir() / "tokens.json").write_text(json.dumps(now, indent=2) + "\n")
        print(f"wrote {_dir() / 'tokens.json'}")
    print(json.dumps(now, indent=2))
    return 0 if a.write or now == recorded() else 1


if __name__ == "__main__":
    sys.exit(main())
