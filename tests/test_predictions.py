"""A learner's prediction (helpers.predictions): taken through the knob or the box, graded against the measurement
and the model, and a missing answer graded as missing, not as zero."""

import pytest

from helpers import predictions


def test_a_headless_run_answers_through_the_knob(monkeypatch, capsys):
    monkeypatch.setenv("LABS_HEADLESS", "1")
    p = predictions.ask("TTFT ratio", 6, unit="x", knob="MY_TTFT_RATIO")
    assert p.answer == 6.0 and "-> 6x" in capsys.readouterr().out
    table = p.grade(measured=8.0, model=4.0, model_name="the work ratio")
    out = capsys.readouterr().out
    assert "you predicted 6x, this run measured 8x (25% off)" in out and "the work ratio said 4x (50% off)" in out
    assert "you were closer" in out
    assert list(table.index) == ["measured in this run", "the work ratio", "your prediction"]
    assert list(table["off by"]) == ["+0%", "-50%", "-25%"]


def test_no_answer_is_graded_as_missing_and_says_how_to_give_one(monkeypatch, capsys):
    monkeypatch.setenv("LABS_HEADLESS", "1")
    p = predictions.ask("TTFT ratio", None, knob="MY_TTFT_RATIO")
    table = p.grade(measured=8.0, model=4.0)
    out = capsys.readouterr().out
    assert "no prediction made" in out and "set MY_TTFT_RATIO" in out
    assert "your prediction" not in table.index


def test_the_box_updates_the_answer_as_the_learner_types(monkeypatch):
    monkeypatch.setenv("LABS_HEADLESS", "0")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.extend(a))
    p = predictions.ask("TTFT ratio", None, unit="x")
    box = shown[0].children[1]
    box.value = "7.5"
    assert p.answer == 7.5
    box.value = "seven"  # not a number: no answer yet, not an old one kept
    assert p.answer is None


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="MY_TTFT_RATIO must be a number"):
        predictions.ask("TTFT ratio", "six", knob="MY_TTFT_RATIO")
    with pytest.raises(ValueError, match="measured no usable value"):
        predictions.Prediction("q", 1.0).grade(measured=float("nan"))
