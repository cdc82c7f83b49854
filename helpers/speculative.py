"""Speculative decoding by the numbers: acceptance from vLLM's counters, tokens per step predicted from it, and the
two workloads that show where drafting pays and where it does not.

::

    acc = speculative.acceptance(run.summary.server)       # from vllm:spec_decode_* deltas of one run
    acc.rate, acc.mean_length, acc.per_position             # alpha, tokens per step, each position's share accepted
    speculative.expected_tokens_per_step(acc.rate, acc.k)  # (1 - alpha^(k+1)) / (1 - alpha)
    speculative.workload("copy", 8, output_len=64)          # prompts whose answer repeats the prompt (drafts hit)

The expected-tokens formula (Leviathan et al., 2023) assumes each drafted token is accepted independently with
probability alpha, and a step stops at the first rejection: it yields 1 + alpha + ... + alpha^k tokens. The measured
mean acceptance length is 1 + accepted / drafts; the per-position counters say how far from independent the
acceptances really are (an n-gram match tends to keep matching). A step that verifies k + 1 tokens costs more than a
plain decode step, so the speedup of TPOT is the tokens per step divided by that cost — never more than the tokens
per step, and less than 1 once the batch is compute-bound.

Introduced in lab 16 (Speculative Decoding).
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .evals import drift_texts
from .bench.workloads import FromJsonl

__all__ = ["Acceptance", "acceptance", "expected_tokens_per_step", "equivalent_alpha", "predicted_speedup",
           "prompts", "workload", "KINDS"]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one verification step yields when each of ``k`` drafted tokens is accepted with probability ``alpha``
    independently, stopping at the first rejection: (1 - alpha^(k+1)) / (1 - alpha), = k + 1 at alpha = 1.

    Introduced in lab 16 (Speculative Decoding).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a probability, got {alpha}")
    if k < 0:
        raise ValueError(f"k is a number of drafted tokens, got {k}")
    if alpha >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def equivalent_alpha(mean_length: float, k: int) -> float:
    """The alpha whose :func:`expected_tokens_per_step` equals ``mean_length`` (bisection; the formula rises with
    alpha) — the per-token acceptance that independent drafts would need to match a measured mean length.

    Introduced in lab 16 (Speculative Decoding).
    """
    if not 1.0 <= mean_length <= k + 1:
        raise ValueError(f"a mean acceptance length lies in [1, k + 1] = [1, {k + 1}], got {mean_length}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < mean_length else (lo, mid)
    return (lo + hi) / 2


def predicted_speedup(alpha: float, k: int, verify_cost: float = 1.0) -> float:
    """TPOT without drafting over TPOT with it: tokens per step over what a verification step costs relative to a
    plain decode step (1.0 = verifying k + 1 tokens is free, the memory-bound ideal; the upper bound).

    Introduced in lab 16 (Speculative Decoding).
    """
    if verify_cost <= 0:
        raise ValueError(f"verify_cost is a ratio of step times, got {verify_cost}")
    return expected_tokens_per_step(alpha, k) / verify_cost


@dataclass
class Acceptance:
    """What vLLM's ``vllm:spec_decode_*`` counters say about one run: ``drafts`` (steps that drafted, per request),
    ``draft_tokens``, ``accepted``; ``rate`` = accepted / draft tokens (alpha); ``mean_length`` = 1 + accepted /
    drafts (tokens per step, the verified token included); ``per_position``: share of drafts whose i-th token was
    accepted; ``conditional``: share accepted at position i given position i - 1 was.

    Introduced in lab 16 (Speculative Decoding).
    """

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: list[float] = field(default_factory=list)

    @property
    def k(self) -> int:
        """Tokens drafted per step (draft tokens / drafts, rounded)."""
        return round(self.draft_tokens / self.drafts) if self.drafts else 0

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def conditional(self) -> list[float]:
        out, prev = [], 1.0
        for share in self.per_position:
            out.append(share / prev if prev > 0 else 0.0)
            prev = share
        return out

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "k": self.k, "rate": self.rate, "mean_length": self.mean_length,
                "conditional": self.conditional}


def acceptance(view: Any) -> Acceptance:
    """The :class:`Acceptance` of a run from its :class:`helpers.metrics.ServerView` (``run.summary.server``), which
    holds the counters' deltas over the run. A server that never drafted gives zeros (rate ``None``).

    Introduced in lab 16 (Speculative Decoding).
    """
    if view is None or not getattr(view, "available", True):
        raise ValueError(f"no /metrics view of this run ({getattr(view, 'note', 'none')}): acceptance needs the "
                         "server's vllm:spec_decode_* counters")
    drafts = float(view.spec_drafts or 0.0)
    per_pos = [float(v) / drafts for v in (view.spec_accepted_per_position or [])] if drafts else []
    return Acceptance(drafts=drafts, draft_tokens=float(view.spec_draft_tokens or 0.0),
                      accepted=float(view.spec_accepted_tokens or 0.0), per_position=per_pos)


# ------------------------------------------------------------------------------------------------ workloads
#: ``copy``: rewrite a paragraph given in the prompt (an edit: most of the answer is already in the prompt, so an
#: n-gram lookup drafts it). ``open``: continue a story from a one-line premise (nothing to look up).
KINDS = ("copy", "open")
_PREMISES = ("a lighthouse keeper who finds a map", "two friends lost in a night market", "a robot learning to bake",
             "a storm that stops every clock in town", "a letter delivered fifty years late",
             "a child who can hear plants", "the last train before the border closes", "a painter who loses colour",
             "a dog that guards a forgotten garden", "an island that moves each night", "a chess game by post",
             "a violin found in a wall")


def _paragraphs() -> list[str]:
    return drift_texts()


def prompts(kind: str, n: int, seed: int = 0) -> list[str]:
    """``n`` completion prompts of ``kind`` (:data:`KINDS`), different for each ``seed``.

    Introduced in lab 16 (Speculative Decoding).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = random.Random(f"{kind}-{seed}")
    # A ticket number first, so no two prompts share a cached prefix block (lab 09) even when their texts repeat.
    ticket = lambda: f"Ticket {rng.randrange(10**6):06d}. "  # noqa: E731
    if kind == "copy":
        paras = _paragraphs()
        out = []
        for _ in range(n):
            p = rng.choice(paras)
            out.append(ticket() + "Copy the text below exactly, word for word.\n\nText: " + p + "\n\nCopy: "
                       + " ".join(p.split()[:4]))
        return out
    return [ticket() + f"Here is a short story about {rng.choice(_PREMISES)}, in the voice of {rng.choice(('a sailor', 'a child', 'an old teacher', 'a detective'))}.\n\n"
            for _ in range(n)]


def workload(kind: str, n: int, output_len: int, seed: int = 0, path: str | Path | None = None,
             shuffle: bool = False) -> FromJsonl:
    """A :class:`helpers.bench.FromJsonl` completions workload of ``n`` :func:`prompts` of ``kind``, each answered
    with exactly ``output_len`` tokens, written to ``path`` (a temporary file by default; name a lasting one for a
    reproducible command). ``shuffle``: each run's seed picks its own order (a rate search's probes then send
    different prompts).

    Introduced in lab 16 (Speculative Decoding).
    """
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="labs-spec-")) / f"{kind}-{seed}.jsonl"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p, "output_len": int(output_len), "tag": kind}) + "\n"
                            for p in prompts(kind, n, seed)))
    return FromJsonl(path=path, endpoint="completions", shuffle=shuffle)
