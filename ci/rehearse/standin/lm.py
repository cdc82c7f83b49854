"""The stand-in's language model: deterministic next-token distributions, cheap enough to run per token.

Not a model of any text: a rehearsal needs tokens that behave like a model's where the labs look. Greedy decoding is a
function of the context (the same prompt gives the same continuation, so two configurations can be compared token by
token); a bigram seen earlier in the context is usually continued as it was then (an "induction" rule, so prompt lookup
drafts get accepted on text that repeats, as on a real model); an end-of-sequence token turns up now and then; a
quantized or FP8-KV configuration perturbs a small share of positions, more for coarser formats.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Sequence

#: Share of positions whose top two tokens swap, per configuration (a coarser format moves more of them).
NOISE = {None: 0.0, "fp8": 0.02, "fp8_e4m3": 0.02, "fp8_e5m2": 0.08, "int8": 0.03, "int8-weights": 0.02, "int4": 0.07, "nvfp4": 0.06, "nvfp4a16": 0.05,
         "mxfp4": 0.10, "mxfp4a16": 0.08, "kv-fp8": 0.01}
COPY = 0.8          # how often a bigram seen earlier is continued as it was
EOS_EVERY = 60      # about one position in this many ends a free generation
TOP = 20


def _h(*parts: int) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


class LM:
    def __init__(self, words: Sequence[int], eos_id: int | None, noise: float = 0.0, salt: int = 0):
        self.words = list(words) or list(range(256, 1256))
        self.eos_id = eos_id
        self.noise = noise
        self.salt = salt

    def _base(self, ctx: Sequence[int], i: int) -> int:
        """The token the model puts first after ``ctx[:i]``."""
        a, b = (ctx[i - 2] if i >= 2 else -1), (ctx[i - 1] if i >= 1 else -1)
        return self.words[_h(a, b, ctx[i - 3] if i >= 3 else -1) % len(self.words)]

    def ranked(self, ctx: Sequence[int], i: int, index: dict[tuple[int, int], int] | None = None) -> list[int]:
        """The top tokens after ``ctx[:i]``, best first. ``index`` maps each bigram to where it last ended before
        ``i`` (the induction rule's memory; built on the fly when absent)."""
        first = self._base(ctx, i)
        if i >= 2:
            key = (ctx[i - 2], ctx[i - 1])
            j = index.get(key) if index is not None else _last(ctx, i, key)
            if j is not None and j < i and _h(key[0], key[1], 7) % 100 < COPY * 100:
                first = ctx[j]
        h = _h(ctx[i - 1] if i else -1, i % 7, 13)
        rest = [self.words[(h + 7919 * k) % len(self.words)] for k in range(1, TOP + 2)]
        out = [first] + [t for t in rest if t != first][: TOP - 1]
        if self.noise and (_h(self.salt, *(ctx[max(0, i - 3):i])) % 10_000) < self.noise * 10_000:
            out[0], out[1] = out[1], out[0]
        return out

    def logprobs(self, ranked: list[int], ctx: Sequence[int], i: int) -> list[float]:
        """Log-probabilities of ``ranked`` (a peaked, Zipf-like distribution; a perturbed configuration's differ)."""
        h = _h(ctx[i - 1] if i else -1, 3)
        margin = 1.0 + (h % 100) / 50.0
        jitter = self.noise * ((_h(self.salt, i, h) % 200) / 100.0 - 1.0)
        raw = [0.0] + [-(margin + math.log(k + 1) * 1.5) + jitter for k in range(1, len(ranked))]
        z = math.log(sum(math.exp(x) for x in raw) + 0.05)
        return [x - z for x in raw]

    def ends(self, ctx: Sequence[int], i: int) -> bool:
        return self.eos_id is not None and _h(ctx[i - 1] if i else -1, ctx[i - 2] if i >= 2 else -1, 99) \
            % EOS_EVERY == 0

    def first(self, ctx: Sequence[int], i: int, index: dict[tuple[int, int], int] | None = None) -> int:
        """``ranked(ctx, i)[0]`` without ranking the rest (what greedy decoding needs, per token)."""
        first = self._base(ctx, i)
        if i >= 2:
            key = (ctx[i - 2], ctx[i - 1])
            j = index.get(key) if index is not None else _last(ctx, i, key)
            if j is not None and j < i and _h(key[0], key[1], 7) % 100 < COPY * 100:
                first = ctx[j]
        if self.noise and (_h(self.salt, *(ctx[max(0, i - 3):i])) % 10_000) < self.noise * 10_000:
            return self.ranked(ctx, i, index)[0]
        return first

    def next(self, ctx: Sequence[int], index: dict[tuple[int, int], int], *, greedy: bool, rng: random.Random | None,
             allow_eos: bool) -> int:
        i = len(ctx)
        if allow_eos and self.ends(ctx, i):
            return int(self.eos_id)  # type: ignore[arg-type]
        if greedy or rng is None:
            return self.first(ctx, i, index)
        ranked = self.ranked(ctx, i, index)
        return ranked[min(int(rng.expovariate(1.5)), len(ranked) - 1)]


def _last(ctx: Sequence[int], i: int, key: tuple[int, int]) -> int | None:
    for j in range(i - 1, 1, -1):
        if (ctx[j - 2], ctx[j - 1]) == key and j < i:
            return j if j < i - 0 else None
    return None


def bigram_index(ctx: Sequence[int]) -> dict[tuple[int, int], int]:
    """Where each bigram of ``ctx`` last ended (the position of the token that followed it), for :meth:`LM.ranked`."""
    index: dict[tuple[int, int], int] = {}
    for j in range(2, len(ctx)):
        index[(ctx[j - 2], ctx[j - 1])] = j
    return index


def extend_index(index: dict[tuple[int, int], int], ctx: Sequence[int], start: int) -> None:
    for j in range(max(2, start), len(ctx)):
        index[(ctx[j - 2], ctx[j - 1])] = j
