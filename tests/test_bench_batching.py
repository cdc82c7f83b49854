"""bench.decode_steps_ms (lab 07's static-vs-continuous prediction) against hand counts and a second formula;
bench.with_output_lengths."""

import pytest

from helpers import bench


def test_hand_counted_schedules():
    step = {1: 10.0, 2: 15.0}.__getitem__
    # outputs 4 and 2 tokens: 3 and 1 decode steps (the first token comes with the prefill)
    assert bench.decode_steps_ms([4, 2], 2, step) == 15 + 10 + 10            # [3,1] -> [2] -> [1]
    # static, batch 1 + a third request: continuous refills the freed slot, static waits for the batch
    assert bench.decode_steps_ms([4, 2, 2], 2, step) == 15 + 15 + 10          # [3,1] -> [2,1] -> [1]
    assert bench.decode_steps_ms([4, 2, 2], 2, step, continuous=False) == 15 + 10 + 10 + 10
    assert bench.decode_steps_ms([1, 1], 2, step) == 0                       # one token each: prefill only


def test_flat_steps_give_the_slot_share_and_proportional_steps_no_gain():
    outs, batch = [129, 17, 17, 17, 65, 33, 17, 9, 97, 17, 17, 17], 4
    steps = [n - 1 for n in outs]
    slot_share = sum(steps) / (batch * sum(max(steps[i:i + batch]) for i in range(0, len(steps), batch)))
    flat = lambda k: 40.0  # noqa: E731  (a GPU: weights dominate the bytes a step reads)
    static = bench.decode_steps_ms(outs, batch, flat, continuous=False)
    continuous = bench.decode_steps_ms(outs, batch, flat)
    # static holds every slot until its batch's longest ends: it uses slot_share of the slot-steps it pays for
    assert sum(steps) * 40.0 / (batch * static) == pytest.approx(slot_share)
    # continuous is greedy list scheduling: Graham's bound puts its length between max(total / slots, longest)
    # and total / slots + longest
    assert max(sum(steps) / batch, max(steps)) <= continuous / 40.0 <= sum(steps) / batch + max(steps)
    assert continuous < static
    same = [33] * 8  # equal replies: nothing for continuous batching to refill
    assert bench.decode_steps_ms(same, batch, flat) == bench.decode_steps_ms(same, batch, flat, continuous=False)
    # a step that costs as much per request however many run: batching of either kind saves nothing
    per_request = lambda k: 10.0 * k  # noqa: E731
    assert bench.decode_steps_ms(outs, batch, per_request, continuous=False) == \
        bench.decode_steps_ms(outs, batch, per_request) == 10.0 * sum(steps)
    with pytest.raises(ValueError, match="batch must be"):
        bench.decode_steps_ms(outs, 0, flat)


def test_with_output_lengths_cycles_and_keeps_the_prompts():
    base = bench.Workload("completions", [bench.Request(id=str(i), prompt=f"p{i}") for i in range(5)])
    mixed = bench.with_output_lengths(base, [128, 16])
    assert [r.max_output_tokens for r in mixed.requests] == [128, 16, 128, 16, 128]
    assert all(r.min_output_tokens == r.max_output_tokens for r in mixed.requests)
    assert [r.prompt for r in mixed.requests] == [r.prompt for r in base.requests]
    assert mixed.spec["output_lengths"] == [128, 16]
    with pytest.raises(ValueError, match=">= 1 tokens"):
        bench.with_output_lengths(base, [16, 0])


def test_joined_and_left_counts_what_comparing_every_pair_counts():
    import random

    from helpers.bench import joined_and_left

    rng = random.Random(5)
    for n in (0, 1, 2, 7, 60):
        for _ in range(30):
            starts = [round(rng.random() * 5, 1) for _ in range(n)]  # rounded: ties in dispatch time happen
            iv = [(d, d + round(rng.random() * 3, 1)) for d in starts]
            brute = sum(1 for a in iv for b in iv if a[0] < b[0] < a[1] and b[1] < a[1])
            assert joined_and_left(iv) == brute
    assert joined_and_left([(0, 10), (1, 2), (3, 4)]) == 2 and joined_and_left([(0, 1), (0, 1)]) == 0
