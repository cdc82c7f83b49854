"""Lab 19's expert-parallel arithmetic: loads, placement, imbalance, and distinct experts per batch, each checked
against a hand count or a second formula; the router read from a real (random-weight) checkpoint."""

import json

import numpy as np
import pytest

from helpers import models, settings, sizing
from helpers.fleet import experts


def test_expert_load_counts_every_choice_once_per_layer():
    choices = np.array([[[0, 1], [2, 3]], [[0, 2], [3, 1]], [[0, 3], [3, 2]]])  # 3 tokens, 2 layers, top-2
    load = experts.expert_load(choices, 4)
    assert load.tolist() == [[3, 1, 1, 1], [0, 1, 2, 3]]
    assert (load.sum(axis=1) == 3 * 2).all()
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        experts.expert_load(choices, 3)
    with pytest.raises(ValueError, match="tokens, layers, k"):
        experts.expert_load(choices[0], 4)


def test_placement_keeps_experts_per_rank_and_balancing_never_loses():
    rng = np.random.default_rng(1)
    for _ in range(50):
        load = rng.integers(0, 100, size=16)
        for ranks in (2, 4, 8, 16):
            contiguous = experts.place(load, ranks, "contiguous")
            balanced = experts.place(load, ranks, "balanced")
            for owner in (contiguous, balanced):
                assert np.bincount(owner, minlength=ranks).tolist() == [16 // ranks] * ranks
                assert experts.rank_loads(load, owner).sum() == pytest.approx(load.sum())
            assert experts.imbalance(experts.rank_loads(load, balanced)) <= \
                experts.imbalance(experts.rank_loads(load, contiguous)) + 1e-12
    load = [8, 1, 1, 1, 1, 1, 1, 2]
    assert experts.place(load, 2, "contiguous") == [0, 0, 0, 0, 1, 1, 1, 1]
    # one rank per expert: the rank imbalance is the experts' own, max over mean
    assert experts.imbalance(experts.rank_loads(load, experts.place(load, 8))) == pytest.approx(8 / 2)
    with pytest.raises(ValueError, match="divides 8"):
        experts.place(load, 3)
    with pytest.raises(ValueError, match="policy"):
        experts.place(load, 2, "random")
    with pytest.raises(ValueError):
        experts.imbalance([0, 0])


def test_distinct_experts_matches_the_uniform_formula_on_uniform_routing():
    rng = np.random.default_rng(0)
    e, k = 8, 2
    choices = np.stack([np.stack([rng.choice(e, size=k, replace=False) for _ in range(3)]) for _ in range(4000)])
    assert experts.distinct_experts(choices, 1) == k
    for b in (2, 4, 16):
        assert experts.distinct_experts(choices, b, samples=400) == pytest.approx(sizing.expected_experts(e, k, b),
                                                                                  rel=0.03)
    skewed = choices.copy()
    skewed[: 3000] = [[0, 1]] * 3  # three quarters of the tokens pick the same two experts
    assert experts.distinct_experts(skewed, 4) < sizing.expected_experts(e, k, 4) - 1
    with pytest.raises(ValueError, match="batch"):
        experts.distinct_experts(choices, 0)


def test_the_router_of_a_real_checkpoint_picks_k_distinct_experts_per_token():
    path = models.resolve("random:tiny-moe")
    spec = json.loads(models.tiny_config_path("tiny-moe").read_text())
    texts = [json.loads(line)["text"] for line in (settings.data_dir() / "evals" / "drift_texts.jsonl")
             .read_text().splitlines()[:2]]
    choices = experts.router_choices(path, texts, max_tokens=32)
    k, e = spec["num_experts_per_tok"], spec["num_experts"]
    assert choices.shape == (64, spec["num_hidden_layers"], k)
    assert all(len(set(row)) == k for row in choices.reshape(-1, k).tolist())
    assert experts.expert_load(choices, e).sum(axis=1).tolist() == [64 * k] * spec["num_hidden_layers"]
    # teacher-forced choices: one per position after the first; the last is what greedy generation emits first
    import torch
    tok, model = experts._load(path)
    ids = tok(texts[0], return_tensors="pt").input_ids
    firsts = experts.next_token_choices(path, texts[:1])
    assert len(firsts) == 1 and len(firsts[0]) == ids.shape[1] - 1
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=tok.eos_token_id or 0)
    assert firsts[0][-1] == int(generated[0, -1])
    assert len(experts.next_token_choices(path, texts[:1], dtype="bfloat16")[0]) == len(firsts[0])
