"""A learner's prediction, taken before the run and graded after it: beside the measurement and the lab's own model.

A lab asks in its "Predict" section and grades after its "Run"::

    guess = predictions.ask("TTFT at the longest prompt / at the shortest", MY_TTFT_RATIO, unit="x")
    ...                                   # the run
    guess.grade(measured=ratio, model=work_ratio, model_name="the work ratio")

In a live notebook :func:`ask` shows a box to type the answer in (filled with the parameters cell's knob, so a run
with papermill or ``LABS_HEADLESS=1`` answers through the knob); whatever the box holds when :meth:`Prediction.grade`
runs is graded. No answer is not an error: the grade says how to give one.

Introduced in lab 02 (Prefill and Decode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import settings

__all__ = ["Prediction", "ask"]


@dataclass
class Prediction:
    """One question, the learner's answer (``None`` until given) and its unit.

    Introduced in lab 02 (Prefill and Decode).
    """

    question: str
    answer: float | None = None
    unit: str = ""
    knob: str = ""

    def grade(self, measured: float, model: float | None = None, model_name: str = "the lab's model") -> Any:
        """A table of the answer, the model's prediction and this run's measurement, each with how far it is from
        the measurement; printed first, one line in words.

        Introduced in lab 02 (Prefill and Decode).
        """
        import pandas as pd

        if not (isinstance(measured, (int, float)) and math.isfinite(measured) and measured != 0):
            raise ValueError(f"cannot grade {self.question!r} against {measured!r}: the run measured no usable value")
        rows = [("measured in this run", measured)]
        if model is not None:
            rows.append((model_name, float(model)))
        if self.answer is not None:
            rows.append(("your prediction", float(self.answer)))
        table = pd.DataFrame([{"": who, f"value{f' ({self.unit})' if self.unit else ''}": v,
                               "off by": f"{(v - measured) / abs(measured):+.0%}"} for who, v in rows]).set_index("")
        print(self.verdict(measured, model, model_name))
        return table

    def verdict(self, measured: float, model: float | None = None, model_name: str = "the lab's model") -> str:
        """The grade in one line of words."""
        if self.answer is None:
            where = f" or set {self.knob} in the parameters cell" if self.knob else ""
            return (f"{self.question}: no prediction made. Type one in the box above{where} before the run, "
                    "then run this cell again to grade it.")
        mine = abs(self.answer - measured) / abs(measured)
        line = f"{self.question}: you predicted {self.answer:g}{self.unit}, this run measured {measured:.3g}{self.unit} " \
               f"({mine:.0%} off)"
        if model is not None:
            theirs = abs(model - measured) / abs(measured)
            line += (f"; {model_name} said {model:.3g}{self.unit} ({theirs:.0%} off): "
                     f"{'you were closer' if mine < theirs else 'the model was closer' if theirs < mine else 'a tie'}")
        return line + "."


def ask(question: str, answer: float | None = None, unit: str = "", knob: str = "") -> Prediction:
    """A :class:`Prediction` for ``question``, answered by ``answer`` (the parameters cell's knob, named ``knob``); in
    a live notebook also a box to type it in, which updates the answer as you type.

    Introduced in lab 02 (Prefill and Decode).
    """
    if answer is not None and not (isinstance(answer, (int, float)) and math.isfinite(answer)):
        raise ValueError(f"{knob or 'the prediction'} must be a number (or None), not {answer!r}")
    p = Prediction(question, None if answer is None else float(answer), unit, knob)
    if settings.headless():
        print(f"Predict: {question}" + (f" -> {p.answer:g}{unit}" if p.answer is not None else
                                         f" (no answer: set {knob or 'the knob'} to give one)"))
        return p
    import ipywidgets as w
    from IPython.display import display

    box = w.Text(value="" if p.answer is None else f"{p.answer:g}", placeholder="a number",
                 description="your answer", style={"description_width": "initial"})

    def changed(change: dict) -> None:  # what cannot be read as a number counts as no answer yet
        try:
            value = float(change["new"])
        except (TypeError, ValueError):
            value = None
        p.answer = value if value is not None and math.isfinite(value) else None

    box.observe(changed, names="value")
    display(w.VBox([w.HTML(f"<b>Predict:</b> {question}{f' ({unit})' if unit else ''}"), box]))
    return p
