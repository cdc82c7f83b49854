"""bench.together and the stall load's pacing: loads side by side, each after its delay; an error surfaces once all
have finished; long prompts spaced by their prefill, decoders that outlast them."""

import time

import pytest

from helpers import bench


def test_runs_overlap_after_their_delays_and_keep_their_order():
    started = {}

    def job(name, seconds):
        def go():
            started[name] = time.monotonic()
            time.sleep(seconds)
            return name
        return go

    t0 = time.monotonic()
    assert bench.together(job("a", 0.3), job("b", 0.1), delays_s=(0, 0.1)) == ["a", "b"]
    assert time.monotonic() - t0 < 0.55                      # side by side, not one after the other
    assert 0.08 <= started["b"] - started["a"] <= 0.25         # b waited for its delay


def test_an_error_is_raised_once_the_others_finish():
    done = []
    with pytest.raises(ZeroDivisionError):
        bench.together(lambda: 1 / 0, lambda: (time.sleep(0.2), done.append(1)))
    assert done == [1]
    with pytest.raises(ValueError, match="none negative"):
        bench.together(lambda: 1, delays_s=(-1,))


def test_stall_pacing_spaces_prompts_by_their_prefill_and_outlasts_them():
    every, output = bench.stall_pacing(500.0, 25.0, long_prompts=4, lead_s=0.5, spacing=1.5, max_output=1000)
    assert every == 0.75                                   # 1.5 prefills apart
    assert output == 140                                   # (0.5 + 4 x 0.75) s of 25 ms steps
    assert bench.stall_pacing(500.0, 25.0, long_prompts=4, lead_s=0.5, max_output=100) == (1.0, 100)   # capped
    assert bench.stall_pacing(500.0, 25.0, long_prompts=1, lead_s=0.0, max_output=999, min_every_s=3.0,
                              min_output=500) == (3.0, 500)  # the plan's floors
    with pytest.raises(ValueError, match="must be measured"):
        bench.stall_pacing(0.0, 25.0, long_prompts=1, lead_s=0.0, max_output=10)
