"""helpers.speculative: the expected-tokens formula against a simulation, acceptance from counters, the workloads."""

import json
import random

import pytest

from helpers import speculative
from helpers.metrics import ServerView


def _simulate(alpha: float, k: int, steps: int = 200_000, seed: int = 0) -> float:
    rng, total = random.Random(seed), 0
    for _ in range(steps):
        n = 1
        for _ in range(k):
            if rng.random() >= alpha:
                break
            n += 1
        total += n
    return total / steps


@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.3, 1), (0.6, 3), (0.9, 5)])
def test_expected_tokens_per_step_matches_a_simulation(alpha, k):
    assert speculative.expected_tokens_per_step(alpha, k) == pytest.approx(_simulate(alpha, k), rel=0.01)


def test_formula_edges_and_its_inverse():
    assert speculative.expected_tokens_per_step(1.0, 4) == 5.0
    assert speculative.expected_tokens_per_step(0.0, 4) == 1.0
    for a in (0.1, 0.5, 0.85):
        assert speculative.equivalent_alpha(speculative.expected_tokens_per_step(a, 3), 3) == pytest.approx(a, abs=1e-9)
    assert speculative.predicted_speedup(0.5, 3, verify_cost=1.25) == pytest.approx(1.875 / 1.25)
    with pytest.raises(ValueError):
        speculative.expected_tokens_per_step(1.2, 3)
    with pytest.raises(ValueError, match="lies in"):
        speculative.equivalent_alpha(5.0, 3)


def test_acceptance_from_counter_deltas():
    # 10 drafts of 3 tokens: 8 accepted their first token, 6 the second, 4 the third -> 18 accepted of 30.
    view = ServerView(spec_drafts=10, spec_draft_tokens=30, spec_accepted_tokens=18,
                      spec_accepted_per_position=[8, 6, 4])
    acc = speculative.acceptance(view)
    assert acc.k == 3 and acc.rate == pytest.approx(0.6) and acc.mean_length == pytest.approx(2.8)
    assert acc.per_position == pytest.approx([0.8, 0.6, 0.4])
    assert acc.conditional == pytest.approx([0.8, 0.75, 4 / 6])
    assert acc.mean_length == pytest.approx(1 + sum(acc.per_position))
    none = speculative.acceptance(ServerView())
    assert none.rate is None and none.mean_length is None and none.k == 0
    with pytest.raises(ValueError, match="no /metrics"):
        speculative.acceptance(ServerView.unavailable("scrape failed"))


def test_workloads_copy_their_prompt_or_do_not(tmp_path):
    copy = speculative.prompts("copy", 5, seed=1)
    assert copy == speculative.prompts("copy", 5, seed=1) and copy != speculative.prompts("copy", 5, seed=2)
    for p in copy:
        text = p.split("Text: ", 1)[1].split("\n\nCopy: ")[0]
        assert p.endswith(" ".join(text.split()[:4]))  # the answer starts copying the paragraph
    assert len({p[:20] for p in copy}) == 5          # a ticket number first: no shared cached prefix
    assert all("Text:" not in p for p in speculative.prompts("open", 5))
    wl = speculative.workload("copy", 4, output_len=16, path=tmp_path / "w.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["output_len"] == 16 for r in rows) and wl.endpoint == "completions"
    with pytest.raises(ValueError, match="kind"):
        speculative.prompts("poetry", 1)
