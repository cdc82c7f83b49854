"""Length distributions: prompts and outputs whose lengths vary from request to request, each one still exact.

Real traffic does not send 256-token prompts and ask for 64 tokens every time. A distribution draws each
request's length (seeded), then the prompt is written to exactly that many tokens and the output fixed at exactly
its drawn length, so the server's counts can still be checked request by request::

    spec = bench.VariableLength(input_len=bench.Uniform(64, 512), output_len=bench.Normal(128, 32, low=16, high=256))
    bench.run(spec, bench.Poisson(4), base_url=srv, duration_s=60)

On the command line a length is a number or one of ``uniform:LOW:HIGH``, ``normal:MEAN:STD[:LOW[:HIGH]]``,
``hist:E0,E1,...,Ek:W1,...,Wk`` (bin edges, then one weight per bin): ``--input-len uniform:64:512``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from .workloads import _WARMUP_PREFIX, _WARMUP_SEED_SALT, Workload, WorkloadSpec, exact_request

__all__ = ["LengthDist", "Uniform", "Normal", "Histogram", "VariableLength", "parse_length"]


class LengthDist:
    """Base class of the length distributions: ``sample(rng, n)`` gives ``n`` integer lengths, each >= 1, and
    ``high`` is the longest length it can draw (it bounds prompt + output against the server's context).

    Introduced in lab 10 (Load Testing Honestly).
    """

    kind: ClassVar[str] = "dist"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    @property
    def mean(self) -> float:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    def spec(self) -> str:  # pragma: no cover - every subclass has one
        """The command-line form (see :func:`parse_length`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Lengths uniform over the integers ``low .. high`` (both included).

    Introduced in lab 10 (Load Testing Honestly).
    """

    low: int
    high: int
    kind: ClassVar[str] = "uniform"

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"Uniform needs 1 <= low <= high, got low={self.low}, high={self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def spec(self) -> str:
        return f"uniform:{self.low}:{self.high}"


@dataclass(frozen=True)
class Normal(LengthDist):
    """Lengths from a normal distribution of ``mean`` and ``std``, rounded and clipped to ``low .. high``.

    Clipping piles the tails onto the bounds (it does not redraw), so the bounds are reached exactly; the ``mean``
    property is the clipped distribution's mean, computed.

    Introduced in lab 10 (Load Testing Honestly).
    """

    mu: float
    std: float
    low: int = 1
    high: int = 4096
    kind: ClassVar[str] = "normal"

    def __post_init__(self) -> None:
        if self.std < 0 or not 1 <= self.low <= self.high:
            raise ValueError(f"Normal needs std >= 0 and 1 <= low <= high, got std={self.std}, low={self.low}, "
                             f"high={self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(np.rint(rng.normal(self.mu, self.std, size=n)), self.low, self.high).astype(np.int64)

    @property
    def mean(self) -> float:
        return float(self.sample(np.random.default_rng(0), 20000).mean())

    def spec(self) -> str:
        return f"normal:{self.mu:g}:{self.std:g}:{self.low}:{self.high}"


@dataclass(frozen=True)
class Histogram(LengthDist):
    """Lengths from a histogram: bin ``i`` covers ``edges[i] <= length < edges[i + 1]`` and is drawn with probability
    ``weights[i] / sum(weights)``; within a bin every integer is equally likely.

    ``Histogram.of(lengths, bins)`` builds one from observed lengths (a log, a dataset).

    Introduced in lab 10 (Load Testing Honestly).
    """

    edges: tuple[int, ...]
    weights: tuple[float, ...]
    kind: ClassVar[str] = "hist"

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", tuple(int(e) for e in self.edges))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        e, w = self.edges, self.weights
        if len(e) != len(w) + 1 or not w:
            raise ValueError(f"a histogram needs one more edge than weights, got {len(e)} edges and {len(w)} weights")
        if e[0] < 1 or any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError(f"histogram edges must start at >= 1 and increase, got {list(e)}")
        if any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"histogram weights must be >= 0 with a positive sum, got {list(w)}")

    @classmethod
    def of(cls, lengths: Sequence[int], bins: int = 10) -> "Histogram":
        """A histogram of observed ``lengths`` with ``bins`` equal-width integer bins."""
        x = np.asarray(lengths, dtype=float)
        if x.size == 0:
            raise ValueError("Histogram.of needs at least one length")
        lo, hi = max(1, int(x.min())), int(x.max()) + 1
        edges = np.unique(np.linspace(lo, hi, bins + 1).round().astype(int))
        if len(edges) < 2:
            edges = np.array([lo, lo + 1])
        counts, _ = np.histogram(x, bins=edges)
        return cls(tuple(edges.tolist()), tuple(counts.astype(float).tolist()))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = np.asarray(self.weights) / sum(self.weights)
        which = rng.choice(len(self.weights), size=n, p=p)
        lo = np.asarray(self.edges[:-1])[which]
        hi = np.asarray(self.edges[1:])[which]
        return rng.integers(lo, hi)  # upper edge excluded

    @property
    def mean(self) -> float:
        p = np.asarray(self.weights) / sum(self.weights)
        mids = [(a + b - 1) / 2 for a, b in zip(self.edges, self.edges[1:])]
        return float(np.dot(p, mids))

    @property
    def high(self) -> int:
        return self.edges[-1] - 1

    def spec(self) -> str:
        return f"hist:{','.join(map(str, self.edges))}:{','.join(f'{w:g}' for w in self.weights)}"


def parse_length(text: str | int | LengthDist) -> int | LengthDist:
    """A length from its command-line form: ``256``, ``uniform:64:512``, ``normal:MEAN:STD[:LOW[:HIGH]]`` or
    ``hist:E0,...,Ek:W1,...,Wk``.

    Introduced in lab 10 (Load Testing Honestly).
    """
    if isinstance(text, (int, LengthDist)):
        return text
    t = str(text).strip()
    if t.isdigit():
        return int(t)
    kind, _, rest = t.partition(":")
    parts = rest.split(":") if rest else []
    try:
        if kind == "uniform" and len(parts) == 2:
            return Uniform(int(parts[0]), int(parts[1]))
        if kind == "normal" and 2 <= len(parts) <= 4:
            nums = [float(p) for p in parts]
            return Normal(nums[0], nums[1], *(int(x) for x in nums[2:]))
        if kind == "hist" and len(parts) == 2:
            return Histogram(tuple(int(x) for x in parts[0].split(",")), tuple(float(x) for x in parts[1].split(",")))
    except ValueError as e:
        raise ValueError(f"length {t!r}: {e}") from e
    raise ValueError(f"length {t!r} is not a number, uniform:LOW:HIGH, normal:MEAN:STD[:LOW[:HIGH]] or "
                     "hist:E0,...,Ek:W1,...,Wk")


def _as_dict(length: int | LengthDist) -> Any:
    return length if isinstance(length, int) else {"kind": length.kind, "spec": length.spec(), "mean": length.mean}


def _draw(length: int | LengthDist, rng: np.random.Generator, n: int) -> list[int]:
    if isinstance(length, int):
        return [length] * n
    return [int(x) for x in length.sample(rng, n)]


@dataclass
class VariableLength(WorkloadSpec):
    """Each request's prompt and output lengths drawn from distributions (or fixed numbers), each exact.

    ``input_len`` / ``output_len``: an ``int`` or a :class:`LengthDist`. Lengths are drawn from their own seeded
    stream, so the same seed gives the same lengths whatever the tokenizer; the request's ``meta`` keeps them.
    Warmup requests draw from the same distributions with their own seed and prefix.

    Introduced in lab 10 (Load Testing Honestly).
    """

    input_len: int | LengthDist = field(default_factory=lambda: Uniform(64, 512))
    output_len: int | LengthDist = 64
    endpoint: str = "chat"
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        self.input_len = parse_length(self.input_len)
        self.output_len = parse_length(self.output_len)

    def build(self, num_requests: int, seed: int = 0, warmup: int = 0, tokenizer: str | None = None) -> Workload:
        tc = self._counter(tokenizer)
        reqs = self._many(tc, num_requests, np.random.default_rng([seed, 1]), np.random.default_rng(seed), "", "")
        warm = self._many(tc, warmup, np.random.default_rng([seed, _WARMUP_SEED_SALT, 1]),
                          np.random.default_rng([seed, _WARMUP_SEED_SALT]), _WARMUP_PREFIX, "warmup-", warmup=True)
        return Workload(self.endpoint, reqs, warm, {**self.as_dict(), "seed": seed, "tokenizer": tc.name})

    def _many(self, tc: Any, n: int, length_rng: np.random.Generator, text_rng: np.random.Generator, lead: str,
              prefix: str, warmup: bool = False) -> list:
        ins, outs = _draw(self.input_len, length_rng, n), _draw(self.output_len, length_rng, n)
        out = []
        for i, (a, b) in enumerate(zip(ins, outs)):
            req = exact_request(tc, f"{prefix}{i}", text_rng, lead, a, b, self.endpoint, warmup)
            req.meta.update(input_len=a, output_len=b)
            out.append(req)
        return out

    @property
    def longest(self) -> int:
        """The longest prompt + output it can draw (content tokens; chat adds the template)."""
        def hi(x: int | LengthDist) -> int:
            return x if isinstance(x, int) else x.high
        return hi(self.input_len) + hi(self.output_len)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "input_len": _as_dict(self.input_len),
                "output_len": _as_dict(self.output_len), "endpoint": self.endpoint, "tokenizer": self.tokenizer}

    def cli_args(self) -> list[str]:
        def arg(x: int | LengthDist) -> str:
            return str(x) if isinstance(x, int) else x.spec()
        args = ["--endpoint", self.endpoint, "--input-len", arg(self.input_len), "--output-len", arg(self.output_len)]
        if self.tokenizer:
            args += ["--tokenizer", str(self.tokenizer)]
        return args
