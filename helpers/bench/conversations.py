"""Multi-turn conversations, replayed turn by turn: each request carries the turns before it.

A chat application sends the whole conversation every turn, so turn k's prompt starts with turn k - 1's whole
prompt: the prefix cache can serve it. This workload replays the conversations this project wrote
(:data:`CONVERSATIONS`, 52 chats) or any JSONL of ``{"id": ..., "turns": ["user message", ...]}``::

    spec = bench.Conversations(output_len=32)
    res = bench.run(spec, bench.Poisson(2), base_url=srv, num_requests=60)
    res.server.prefix_cache_hit_rate      # the previous turns, served from the cache

The assistant's replies in the history are fixed stand-ins of ``output_len`` tokens (seeded vocabulary words), not
what the server answered: every request is known before the run, so any arrival process can replay them, and the
shared prefix is exact. Requests go turn-major (every conversation's turn 1, then every turn 2, ...), so a turn
usually follows its previous turn by a whole round. ``Request.meta`` holds the conversation, the turn, and
``prefix_tokens``: how many leading tokens it shares with the conversation's previous request (what a prefix
cache can skip).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import settings
from .records import Request
from .workloads import FixedLength, Workload, WorkloadSpec, jsonl_lines

__all__ = ["Conversations", "CONVERSATIONS", "read_conversations"]

#: The 52 multi-turn chats written for the labs (``{"id": ..., "turns": [...]}`` per line).
CONVERSATIONS = settings.data_dir() / "conversations" / "chats.jsonl"


def read_conversations(path: str | Path = CONVERSATIONS) -> list[dict[str, Any]]:
    """The conversations of a JSONL file, checked: each line ``{"id": str, "turns": [str, ...]}`` (>= 1 turn).

    Introduced in lab 09 (Prefix Caching, Measured).
    """
    p = Path(path).expanduser()
    out, seen = [], set()
    for lineno, row in jsonl_lines(p, f"conversation file {p} not found (the labs ship {CONVERSATIONS})"):
        turns = row.get("turns") if isinstance(row, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError(f'{p}:{lineno} needs "turns": a list of non-empty user messages')
        cid = str(row.get("id", lineno))
        if cid in seen:
            raise ValueError(f"{p}:{lineno}: conversation id {cid!r} appears twice")
        seen.add(cid)
        out.append({"id": cid, "turns": list(turns)})
    if not out:
        raise ValueError(f"{p} holds no conversations")
    return out


@dataclass
class Conversations(WorkloadSpec):
    """Multi-turn chats replayed turn by turn (chat endpoint), each request carrying the previous turns.

    ``output_len`` tokens are asked for each turn (exactly, with ``min_tokens``) and the stand-in reply in the
    history has as many. Conversations are taken in a seeded order (``shuffle``); asking for more requests than
    the file's turns replays conversations again (and warns: a replay hits the prefix cache of the first).
    Warmup requests are synthetic single-turn prompts with their own prefix.

    Introduced in lab 09 (Prefix Caching, Measured).
    """

    path: str | Path = CONVERSATIONS
    output_len: int = 32
    shuffle: bool = True
    tokenizer: str | None = None
    endpoint: str = "chat"

    def __post_init__(self) -> None:
        if self.endpoint != "chat":
            raise ValueError("conversations are chat messages: use endpoint='chat'")

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        tc = self._counter(tokenizer)
        convs = read_conversations(self.path)
        order = list(range(len(convs)))
        if self.shuffle:
            np.random.default_rng(seed).shuffle(order)
        total = sum(len(c["turns"]) for c in convs)
        if num_requests > total:
            warnings.warn(f"{num_requests} requests from {total} conversation turns: conversations are replayed, and "
                          "a replay hits the prefix cache of its first pass", stacklevel=2)
        picked: list[tuple[int, dict[str, Any]]] = []
        turns = 0
        while turns < num_requests:
            c = convs[order[len(picked) % len(convs)]]
            picked.append((len(picked) // len(convs), c))
            turns += len(c["turns"])
        reply_rng = np.random.default_rng([seed, 2])
        replies = [[tc.text(self.output_len, reply_rng) for _ in c["turns"]] for _, c in picked]
        slots = sorted(((k, j) for j, (_, c) in enumerate(picked) for k in range(len(c["turns"]))))[:num_requests]
        reqs = []
        for i, (k, j) in enumerate(slots):
            rep, c = picked[j]
            msgs: list[dict[str, str]] = []
            for t in range(k):
                msgs += [{"role": "user", "content": c["turns"][t]}, {"role": "assistant", "content": replies[j][t]}]
            msgs.append({"role": "user", "content": c["turns"][k]})
            prefix = self._shared(tc, msgs, k)
            reqs.append(Request(id=str(i), messages=tuple(msgs), expected_input_tokens=tc.chat(msgs),
                                max_output_tokens=self.output_len, min_output_tokens=self.output_len,
                                meta={"conversation": c["id"] + (f"#{rep}" if rep else ""), "turn": k + 1,
                                      "prefix_tokens": prefix}))
        warm: list[Request] = []
        if warmup:
            synth = FixedLength(input_len=32, output_len=self.output_len, endpoint="chat", tokenizer=tc.name)
            warm = synth.build(0, seed=seed, warmup=warmup).warmup
        return Workload("chat", reqs, warm, {**self.as_dict(), "seed": seed, "tokenizer": tc.name,
                                             "conversations": len(picked)})

    @staticmethod
    def _shared(tc: Any, msgs: list[dict[str, str]], k: int) -> int:
        """Leading tokens this turn's prompt shares with the previous turn's prompt (0 for a first turn)."""
        if k == 0:
            return 0
        prev = tc.ids(tc.render_chat(msgs[:-2]), special=False)
        now = tc.ids(tc.render_chat(msgs), special=False)
        n = 0
        for a, b in zip(prev, now):
            if a != b:
                break
            n += 1
        return n

    def as_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "path": str(self.path), "output_len": self.output_len,
                "shuffle": self.shuffle, "tokenizer": self.tokenizer, "endpoint": self.endpoint}

    def cli_args(self) -> list[str]:
        args = ["--endpoint", "chat", "--conversations", str(self.path), "--output-len", str(self.output_len)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        return args
