"""Workloads: the prompts a benchmark sends, with their exact token counts.

Prompts are built with the served model's own tokenizer (``transformers.AutoTokenizer``; :func:`helpers.bench.run`
hands a spec the tokenizer of the server it targets, unless the spec names one), from words of its vocabulary drawn
with a seeded RNG, then re-encoded and adjusted until the count is exact. A tokenizer is read from the hub cache
when it is there; only a model not cached on this machine is downloaded.

- For ``/v1/completions`` the prompt is exactly ``input_len`` tokens as the server counts them
  (special tokens such as a BOS included).
- For ``/v1/chat/completions`` the user message holds ``input_len`` tokens and the expected
  ``prompt_tokens`` adds the chat template's overhead (measured with ``apply_chat_template``).

Warmup requests come from a different seed and start with a different prefix, so they never put
blocks of a measured prompt into the prefix cache. A spec (``FixedLength``, ``SharedPrefix``,
``FromJsonl``) builds a :class:`Workload` of any size with ``spec.build(n, seed=..., warmup=...)``;
runs of a sweep use different seeds, so one run never warms the cache for the next.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .. import models, settings
from .records import Request


def jsonl_lines(path: Path, missing: str) -> "Iterator[tuple[int, Any]]":
    """Each non-blank line of the JSONL file ``path`` parsed, with its line number; ``missing``: the message when the
    file is absent. A line that is not JSON stops it with the file and line named.

    Introduced in lab 02 (Prefill and Decode).
    """
    if not path.is_file():
        raise FileNotFoundError(missing)
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{lineno} is not valid JSON: {e}") from e

if TYPE_CHECKING:  # only for annotations: workloads do not depend on arrivals
    from .arrivals import Arrivals

__all__ = [
    "Workload",
    "WorkloadSpec",
    "FixedLength",
    "SharedPrefix",
    "FromJsonl",
    "TokenCounter",
    "load_tokenizer",
    "token_counter",
    "exact_request",
    "SAMPLE_CHAT",
]

#: ~50 varied chat prompts written for the labs (``{"messages": [...], "output_len": N}`` per line).
SAMPLE_CHAT = settings.data_dir() / "prompts" / "sample_chat.jsonl"

_WARMUP_SEED_SALT = 0x5741524D  # "WARM": warmup prompts come from their own random stream
_WARMUP_PREFIX = "Warmup only, do not cache. "
_WORD = re.compile(r"^[a-z]{3,10}$")


# ------------------------------------------------------------------------------------ tokenizer
@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str | None = None):
    """A model's tokenizer (``transformers.AutoTokenizer``), cached per model.

    ``path`` is a checkpoint folder or a Hugging Face id (default: the embedded model). A model in the hub cache
    (or a folder) loads offline; any other id is downloaded, as vLLM would download it.

    Introduced in lab 02 (Prefill and Decode).
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - vLLM brings transformers
        raise ImportError("building workloads needs `transformers` (vLLM installs it; else "
                          "`pip install transformers`)") from e
    local = models.local_path(path or models.DEFAULT_ID)
    if local is not None:
        return _load_local(_tokenizer_files(Path(local)), str(local))
    return AutoTokenizer.from_pretrained(str(path))


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt", "chat_template.jinja")


def _tokenizer_files(folder: Path) -> str:
    """A key for a folder's tokenizer by what its files hold: a quantized checkpoint carries its model's tokenizer,
    so the labs' many checkpoints of one model share one loaded tokenizer (a load takes about a second)."""
    h = hashlib.sha1()
    for name in _TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _load_local(key: str, folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)  # the first folder with these files


class TokenCounter:
    """Counts tokens the way vLLM does, and draws vocabulary words to write prompts with.

    ``completion(text)``: ``len(encode(text, add_special_tokens=True))`` (what ``/v1/completions``
    counts); ``chat(messages)``: the rendered chat template with the generation prompt, encoded
    without adding special tokens again (what ``/v1/chat/completions`` counts).

    Introduced in lab 02 (Prefill and Decode).
    """

    def __init__(self, tokenizer: Any, name: str = ""):
        self.tok = tokenizer
        self.name = name or getattr(tokenizer, "name_or_path", "") or ""
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        # Prefer pieces that start a word (" word"): joined by spaces they re-encode to one token each. Byte-level
        # BPE spells the space "Ġ", SentencePiece "▁": read from the vocabulary, they need no decoding (0.02 s of
        # CPU for SmolLM2's 49k pieces here, against 0.32 s decoding each; the same words either way).
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        spaced = {t[1:] for t, i in vocab.items() if t[:1] in ("Ġ", "▁") and i not in special and _WORD.match(t[1:])}
        if len(spaced) < 1000:  # another spelling: decode every piece
            pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
            spaced = {p[1:] for i, p in enumerate(pieces) if i not in special and p[:1] == " " and _WORD.match(p[1:])}
            if len(spaced) < 1000:
                spaced = {p.strip() for i, p in enumerate(pieces) if i not in special and _WORD.match(p.strip())}
        words = sorted(spaced)
        if len(words) < 100:
            raise ValueError(f"tokenizer {self.name!r} has only {len(words)} plain lowercase words in its vocabulary; "
                             "cannot write synthetic prompts with it")
        self.words = np.array(words)

    def content(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def _lengths(self) -> np.ndarray:
        """Tokens of each word after a space, encoded once in one batch."""
        if not hasattr(self, "_word_tokens"):
            ids = self.tok([" " + w for w in self.words], add_special_tokens=False)["input_ids"]
            self._word_tokens = np.array([len(x) for x in ids])
        return self._word_tokens

    def _singles(self) -> np.ndarray | None:
        """The words that are one token after a space (``None`` if there are none), found once."""
        if not hasattr(self, "_single_words"):
            ones = self.words[self._lengths() == 1]
            self._single_words = ones if len(ones) else None
        return self._single_words

    def _count_once(self, text: str, count: Any) -> int:
        """``count(text)``, remembered for the last few leads (a shared prefix is the lead of every request)."""
        memo = self.__dict__.setdefault("_lead_counts", {})
        key = (text, count)
        if key not in memo:
            if len(memo) > 64:
                memo.clear()
            memo[key] = count(text)
        return memo[key]

    def memo_ids(self, text: str) -> list[int]:
        """:meth:`ids` of ``text``, remembered for the last few texts (a shared prefix, checked in every request)."""
        memo = self.__dict__.setdefault("_memo_ids", {})
        if text not in memo:
            if len(memo) > 64:
                memo.clear()
            memo[text] = self.ids(text)
        return memo[text]

    def completion(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=True))

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tok.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)

    def chat(self, messages: Sequence[dict[str, str]]) -> int:
        return len(self.tok.encode(self.render_chat(messages), add_special_tokens=False))

    def ids(self, text: str, special: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=special))

    def text(self, n: int, rng: np.random.Generator, lead: str = "", count: Any = None) -> str:
        """Text of exactly ``n`` tokens under ``count`` (default :meth:`content`), starting with ``lead``.

        Words are drawn with ``rng``; the text is re-encoded and words are added or dropped until the
        count is exact (a word that splits into two tokens is replaced by another draw).
        """
        count = count or self.content
        if n <= 0:
            raise ValueError(f"a prompt needs at least 1 token, got {n}")
        # A first draft from each word's own token count (byte-level BPE and SentencePiece do not merge across the
        # space before a word, so counts add up): one encode usually confirms it, where re-encoding the growing
        # text took several (most of a rehearsal's client CPU, measured with py-spy).
        idx = rng.integers(0, len(self.words), size=n)
        lengths = self._lengths()[idx].copy()
        if not lead or lead[-1] in " \n":  # the first word follows no space of its own
            lengths[0] = len(self.tok.encode(str(self.words[idx[0]]), add_special_tokens=False))
        room = n - self._count_once(lead, count)
        keep = int(np.searchsorted(np.cumsum(lengths), room, side="right"))
        words = list(self.words[idx[:keep]])
        short = room - int(lengths[:keep].sum())
        singles = self._singles()
        if short > 0 and singles is not None:
            words += list(rng.choice(singles, size=short))
        for _ in range(400):
            text = lead + " ".join(words)
            c = count(text)
            if c == n:
                return text
            if c > n:
                if not words:
                    break
                # Words of several tokens: drop half the excess in words, then one at a time, never far below n.
                words = words[:-max(1, (c - n) // 2)]
            else:
                # Close to n, words of one token each close the gap exactly (a small vocabulary has few of them).
                singles = self._singles() if n - c <= 4 else None
                words += list(rng.choice(singles if singles is not None else self.words, size=n - c))
        raise ValueError(f"could not write a text of exactly {n} tokens (lead {lead!r}); the lead alone may be "
                         "longer than that")


@functools.lru_cache(maxsize=16)
def _counter_for(path: str | None) -> TokenCounter:
    """One counter per tokenizer path: its word table and its memos are built once, not per workload."""
    return TokenCounter(load_tokenizer(path), name=path or models.DEFAULT_ID)


def token_counter(tokenizer: Any = None) -> TokenCounter:
    """A :class:`TokenCounter` for a tokenizer path (``None``: the default model), or a loaded tokenizer.

    Introduced in lab 02 (Prefill and Decode).
    """
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return _counter_for(str(tokenizer) if tokenizer is not None else None)
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    return TokenCounter(tokenizer)


# ------------------------------------------------------------------------------------- workload
@dataclass
class Workload:
    """A materialised workload: measured requests, warmup requests (disjoint prompts), and its spec.

    Introduced in lab 02 (Prefill and Decode).
    """

    endpoint: str
    requests: list[Request]
    warmup: list[Request] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {self.endpoint!r}")
        for r in list(self.requests) + list(self.warmup):
            if r.endpoint != self.endpoint:
                raise ValueError(f"request {r.id!r} is for {r.endpoint!r} but the workload is {self.endpoint!r}")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique within a workload")

    def __len__(self) -> int:
        return len(self.requests)

    def head(self, n: int) -> "Workload":
        """The first ``n`` measured requests (same warmup)."""
        if n > len(self.requests):
            raise ValueError(f"the workload has {len(self.requests)} requests, {n} were asked for: build a bigger one "
                             "(spec.build(n)) rather than repeating prompts, which would hit the prefix cache")
        return Workload(self.endpoint, list(self.requests[:n]), list(self.warmup), dict(self.spec))


class WorkloadSpec:
    """How to build a workload of any size; ``build(n, seed, warmup)`` materialises one.

    Introduced in lab 02 (Prefill and Decode).
    """

    endpoint: str = "chat"

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0,
              tokenizer: str | None = None) -> Workload:  # pragma: no cover
        """``num_requests`` requests (and ``warmup`` warmup requests), counted with the spec's own tokenizer, else
        ``tokenizer`` (the served model's, as :func:`helpers.bench.run` passes it), else the default model's."""
        raise NotImplementedError

    def default_arrivals(self) -> "Arrivals | None":
        """The arrivals this workload brings with it (a trace's timestamps), used when ``run`` is given none."""
        return None

    def _counter(self, tokenizer: str | None) -> "TokenCounter":
        own = getattr(self, "tokenizer", None)
        return token_counter(own if own not in (None, False) else tokenizer)

    def as_dict(self) -> dict[str, Any]:
        d = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}  # type: ignore[call-overload]
        d["kind"] = type(self).__name__
        return d

    def cli_args(self) -> list[str] | None:
        """The CLI flags that rebuild this spec (``None`` if the CLI cannot express it)."""
        return None


def _messages(user: str, system: str | None = None) -> tuple[dict[str, str], ...]:
    msgs: list[dict[str, str]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": user})
    return tuple(msgs)


def exact_request(tc: TokenCounter, rid: str, rng: np.random.Generator, lead: str, input_len: int, output_len: int,
                  endpoint: str, warmup: bool = False) -> Request:
    """One request of exactly ``input_len`` prompt tokens (completions: as the server counts the prompt; chat: the
    user message's content, the template's tokens added to ``expected_input_tokens``) and ``output_len`` output
    tokens (fixed with ``min_tokens``/``ignore_eos``).

    Introduced in lab 02 (Prefill and Decode).
    """
    if endpoint == "completions":
        text = tc.text(input_len, rng, lead, count=tc.completion)
        return Request(id=rid, prompt=text, expected_input_tokens=input_len, max_output_tokens=output_len,
                       min_output_tokens=output_len, warmup=warmup)
    text = tc.text(input_len, rng, lead)
    msgs = _messages(text)
    total = tc.chat(msgs)
    return Request(id=rid, messages=msgs, expected_input_tokens=total, max_output_tokens=output_len,
                   min_output_tokens=output_len, warmup=warmup,
                   meta={"content_tokens": input_len, "template_tokens": total - input_len})


@dataclass
class FixedLength(WorkloadSpec):
    """Every request has exactly ``input_len`` prompt tokens and ``output_len`` output tokens.

    Completions: the prompt is ``input_len`` tokens as the server counts them. Chat: the user message
    is ``input_len`` tokens; the expected ``prompt_tokens`` adds the chat template (see
    ``Request.meta["template_tokens"]``). ``output_len`` is fixed with ``min_tokens``/``ignore_eos``.

    Introduced in lab 02 (Prefill and Decode).
    """

    input_len: int = 256
    output_len: int = 64
    endpoint: str = "chat"
    tokenizer: str | None = None

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        tc = self._counter(tokenizer)
        rng = np.random.default_rng(seed)
        reqs = [self._one(tc, f"{i}", rng, "") for i in range(num_requests)]
        wrng = np.random.default_rng([seed, _WARMUP_SEED_SALT])
        warm = [self._one(tc, f"warmup-{i}", wrng, _WARMUP_PREFIX, warmup=True) for i in range(warmup)]
        return Workload(self.endpoint, reqs, warm, {**self.as_dict(), "seed": seed, "tokenizer": tc.name})

    def _one(self, tc: TokenCounter, rid: str, rng: np.random.Generator, lead: str, warmup: bool = False) -> Request:
        return exact_request(tc, rid, rng, lead, self.input_len, self.output_len, self.endpoint, warmup)

    def cli_args(self) -> list[str]:
        args = ["--endpoint", self.endpoint, "--input-len", str(self.input_len), "--output-len", str(self.output_len)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        return args


@dataclass
class SharedPrefix(WorkloadSpec):
    """A common prefix of ``prefix_len`` tokens and a unique suffix of ``suffix_len`` tokens per request.

    Chat: the prefix is the system message and the suffix the user message (``prefix_len`` and
    ``suffix_len`` count their contents; the template adds its own tokens). Completions: the prompt is
    prefix + newline + suffix, ``prefix_len + suffix_len`` tokens in all, and the prefix's tokens are
    checked to be a token-for-token prefix of every prompt (else the prefix cache could not hit).
    ``num_prefixes`` > 1 spreads requests round-robin over several prefixes. Warmup requests use
    their own prefix, never a measured one.

    Introduced in lab 09 (Prefix Caching, Measured).
    """

    prefix_len: int = 512
    suffix_len: int = 64
    output_len: int = 32
    endpoint: str = "chat"
    num_prefixes: int = 1
    tokenizer: str | None = None

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        tc = self._counter(tokenizer)
        rng = np.random.default_rng(seed)
        prefixes = [self._prefix(tc, rng, "") for _ in range(max(1, self.num_prefixes))]
        reqs = [self._one(tc, f"{i}", rng, prefixes[i % len(prefixes)], i % len(prefixes))
                for i in range(num_requests)]
        wrng = np.random.default_rng([seed, _WARMUP_SEED_SALT])
        wprefix = self._prefix(tc, wrng, _WARMUP_PREFIX) if warmup else ""
        warm = [self._one(tc, f"warmup-{i}", wrng, wprefix, -1, warmup=True) for i in range(warmup)]
        return Workload(self.endpoint, reqs, warm, {**self.as_dict(), "seed": seed, "tokenizer": tc.name})

    def _prefix(self, tc: TokenCounter, rng: np.random.Generator, lead: str) -> str:
        count = tc.completion if self.endpoint == "completions" else tc.content
        return tc.text(self.prefix_len, rng, lead, count=count)

    def _one(self, tc: TokenCounter, rid: str, rng: np.random.Generator, prefix: str, pid: int,
             warmup: bool = False) -> Request:
        if self.endpoint == "completions":
            total_len = self.prefix_len + self.suffix_len
            text = tc.text(total_len, rng, prefix + "\n", count=tc.completion)
            p_ids = tc.memo_ids(prefix)
            shared = tc.ids(text)[:len(p_ids)] == p_ids
            return Request(id=rid, prompt=text, expected_input_tokens=total_len, max_output_tokens=self.output_len,
                           min_output_tokens=self.output_len, warmup=warmup,
                           meta={"prefix_id": pid, "prefix_tokens": len(p_ids), "prefix_intact": shared})
        suffix = tc.text(self.suffix_len, rng)
        msgs = _messages(suffix, system=prefix)
        total = tc.chat(msgs)
        return Request(id=rid, messages=msgs, expected_input_tokens=total, max_output_tokens=self.output_len,
                       min_output_tokens=self.output_len, warmup=warmup,
                       meta={"prefix_id": pid, "content_tokens": self.prefix_len + self.suffix_len,
                             "template_tokens": total - self.prefix_len - self.suffix_len})

    def cli_args(self) -> list[str]:
        args = ["--endpoint", self.endpoint, "--shared-prefix-len", str(self.prefix_len),
                "--input-len", str(self.suffix_len), "--output-len", str(self.output_len),
                "--num-prefixes", str(self.num_prefixes)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        return args


@dataclass
class FromJsonl(WorkloadSpec):
    """Prompts from a JSONL file: ``{"prompt": ..., "output_len": N}`` or ``{"messages": [...], ...}``.

    A line with ``output_len`` gets exactly that many output tokens; a line without it may stop on
    its own, up to ``max_output_len``. Prompt lines are sent as a user message on the chat endpoint;
    message lines need the chat endpoint. With a tokenizer (default: the embedded model's;
    ``tokenizer=False`` for none) the expected prompt tokens are computed. Requests take the file's
    lines in order, shuffled when ``shuffle`` (seeded); asking for more requests than lines repeats
    prompts (and warns: repeats hit the prefix cache). Warmup requests are synthetic, never from the file.

    Introduced in lab 02 (Prefill and Decode).
    """

    path: str | Path = SAMPLE_CHAT
    endpoint: str = "chat"
    max_output_len: int = 256
    shuffle: bool = False
    tokenizer: str | None | bool = None

    def rows(self) -> list[dict[str, Any]]:
        p = Path(self.path).expanduser()
        rows = []
        for lineno, row in jsonl_lines(p, f"prompt file {p} not found (the labs ship {SAMPLE_CHAT})"):
            if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
                raise ValueError(f"{p}:{lineno} needs exactly one of \"prompt\" or \"messages\"")
            if "messages" in row and self.endpoint != "chat":
                raise ValueError(f"{p}:{lineno} holds chat messages: use endpoint='chat' for this file")
            rows.append(row)
        if not rows:
            raise ValueError(f"{p} holds no prompts")
        return rows

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        import warnings

        rows = self.rows()
        order = list(range(len(rows)))
        if self.shuffle:
            np.random.default_rng(seed).shuffle(order)
        if num_requests > len(rows):
            warnings.warn(f"{num_requests} requests from {len(rows)} prompts: prompts repeat, and repeats hit the "
                          "prefix cache", stacklevel=2)
        tc = None if self.tokenizer is False else self._counter(tokenizer)
        reqs = []
        for i in range(num_requests):
            row = rows[order[i % len(rows)]]
            out = row.get("output_len")
            max_out = int(out) if out else self.max_output_len
            min_out = int(out) if out else None
            meta = {"line": order[i % len(rows)], **({"tag": row["tag"]} if "tag" in row else {})}
            if "messages" in row or self.endpoint == "chat":
                msgs = tuple(row["messages"]) if "messages" in row else _messages(row["prompt"])
                exp = tc.chat(msgs) if tc else None
                reqs.append(Request(id=str(i), messages=msgs, expected_input_tokens=exp, max_output_tokens=max_out,
                                    min_output_tokens=min_out, meta=meta))
            else:
                exp = tc.completion(row["prompt"]) if tc else None
                reqs.append(Request(id=str(i), prompt=row["prompt"], expected_input_tokens=exp,
                                    max_output_tokens=max_out, min_output_tokens=min_out, meta=meta))
        warm: list[Request] = []
        if warmup:
            if tc is None:
                raise ValueError("warmup prompts for a JSONL workload are synthetic and need a tokenizer")
            ins = sorted(r.expected_input_tokens or 64 for r in reqs) or [64]
            outs = sorted(r.max_output_tokens for r in reqs) or [32]
            median_in = max(8, min(ins[len(ins) // 2], 2048))
            synth = FixedLength(input_len=median_in, output_len=outs[len(outs) // 2], endpoint=self.endpoint,
                                tokenizer=tc.name)
            warm = synth.build(0, seed=seed, warmup=warmup).warmup
        return Workload(self.endpoint, reqs, warm, {**self.as_dict(), "seed": seed,
                                                    "tokenizer": tc.name if tc else None})

    def cli_args(self) -> list[str]:
        args = ["--endpoint", self.endpoint, "--prompts", str(self.path)]
        if self.tokenizer is False:
            args += ["--tokenizer", "none"]
        elif isinstance(self.tokenizer, (str, Path)):
            args += ["--tokenizer", str(self.tokenizer)]
        return args
