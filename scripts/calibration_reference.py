"""Write data/calibration/reference.jsonl: prose of the Python Language Reference, as calibration text.

The project's own calibration texts (``mixed.jsonl``, 410 short texts, about 19,000 tokens) suffice for the CPU
profile's builds; a GPU profile calibrates on more (128 rows of 256 tokens = 32,768 tokens). This adds English
technical prose with code from the Python standard library's own copy of the Language Reference
(``pydoc_data.topics``, Python Software Foundation, PSF License 2.0), so nothing is downloaded: the topics whose
text is mostly words (letters >= 68% of characters), in alphabetical order, until about 30,000 pre-tokenizer chunks,
each topic cut at blank lines into texts of at most 1,500 characters.

    python scripts/calibration_reference.py          # rewrites the file (deterministic for one Python version)

The file is committed (its bytes enter the cache key of every checkpoint calibrated on it): rerun this only to
change it on purpose. ``helpers.quant`` reads it after ``mixed.jsonl``, only when a build needs more text.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "calibration" / "reference.jsonl"
MIN_LETTERS, MAX_CHARS, TARGET_CHUNKS = 0.68, 1500, 30_000


def texts() -> list[str]:
    import pydoc_data.topics as topics
    import regex  # transformers' dependency

    from helpers.calibration import PRETOKEN_PATTERN

    split = regex.compile(PRETOKEN_PATTERN)
    out, chunks = [], 0
    for name in sorted(topics.topics):
        body = topics.topics[name]
        if sum(c.isalpha() for c in body) / len(body) < MIN_LETTERS:
            continue
        piece = ""
        for para in body.split("\n\n"):
            if piece and len(piece) + len(para) + 2 > MAX_CHARS:
                out.append(piece.strip())
                piece = ""
            piece += para + "\n\n"
        if piece.strip():
            out.append(piece.strip())
        chunks += len(split.findall(body))
        if chunks >= TARGET_CHUNKS:
            break
    return out


def main() -> int:
    rows = texts()
    with OUT.open("w") as fh:
        for t in rows:
            fh.write(json.dumps({"kind": "python-reference", "text": t}) + "\n")
    print(f"wrote {len(rows)} texts to {OUT} (Python {platform.python_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
