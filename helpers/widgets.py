"""Knobs a learner can turn: a control per knob over a pure function of this run's measurements, and charts that
read anywhere.

::

    widgets.explore(what_if, budget=widgets.choice([128, 256, 512, 2048], 512), tokens=(256, 8192, 256))

``explore`` draws one control per keyword (a ``(min, max, step)`` tuple is a slider starting at ``min`` unless a
``default`` is given through :func:`slider`; a list is a dropdown; a bool a checkbox) and shows what ``fn``
returns — an altair chart, a pandas table, text — again each time a knob moves. The function must be pure: it
answers from what the lab already measured (or a model fitted to it), never by starting a server. Run headless
(``LABS_HEADLESS=1``, set by ``make test`` and the papermill runner), it shows ``fn`` at the defaults as a static
chart, so CI output stays stable and an executed notebook still shows the picture.

**Charts that read anywhere.** Importing this module enables the ``labs`` altair renderer: each chart is a PNG
rendered offline by ``vl-convert`` and, where a browser can fetch vega, replaced by the interactive chart. An
executed notebook converted to HTML and read offline shows the image — altair's own renderer there shows "Error
loading script" instead of every chart.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import artifacts, settings

__all__ = ["explore", "slider", "choice", "Slider", "Choice", "render_chart", "enable_offline_charts"]


@dataclass(frozen=True)
class Slider:
    """A numeric knob: ``min``..``max`` by ``step``, starting at ``default``.

    Introduced in lab 01 (One GPU, One Model).
    """

    min: float
    max: float
    step: float
    default: float
    log: bool = False


@dataclass(frozen=True)
class Choice:
    """A knob with named options, starting at ``default``.

    Introduced in lab 01 (One GPU, One Model).
    """

    options: tuple[Any, ...]
    default: Any


def slider(min: float, max: float, step: float = 1, default: float | None = None, log: bool = False) -> Slider:
    """A numeric knob (integers when every bound is an int).

    Introduced in lab 01 (One GPU, One Model).
    """
    return Slider(min, max, step, min if default is None else default, log)


def choice(options: Any, default: Any = None) -> Choice:
    """A knob with a fixed set of options.

    Introduced in lab 01 (One GPU, One Model).
    """
    opts = tuple(options)
    if not opts:
        raise ValueError("a choice needs at least one option")
    if default is not None and default not in opts:
        raise ValueError(f"default {default!r} is not one of the options {opts}")
    return Choice(opts, opts[0] if default is None else default)


def _spec(value: Any) -> Slider | Choice | bool:
    if isinstance(value, (Slider, Choice, bool)):
        return value
    if isinstance(value, tuple) and len(value) in (2, 3) and all(isinstance(v, (int, float)) for v in value):
        return slider(*value)
    if isinstance(value, (list, tuple)):
        return choice(value)
    if isinstance(value, (int, float)):
        return slider(value, value, 1, value)
    raise TypeError(f"cannot make a knob from {value!r}: give (min, max[, step]), a list of options, a bool, "
                    "widgets.slider(...) or widgets.choice(...)")


def defaults(**knobs: Any) -> dict[str, Any]:
    """Each knob's starting value."""
    out = {}
    for name, k in knobs.items():
        spec = _spec(k)
        out[name] = spec if isinstance(spec, bool) else spec.default
    return out


def _widget(name: str, spec: Slider | Choice | bool):
    import ipywidgets as W

    label = name.replace("_", " ")
    if isinstance(spec, bool):
        return W.Checkbox(value=spec, description=label)
    if isinstance(spec, Choice):
        return W.Dropdown(options=list(spec.options), value=spec.default, description=label)
    ints = all(float(x).is_integer() for x in (spec.min, spec.max, spec.step, spec.default))
    if spec.log:
        return W.FloatLogSlider(value=spec.default, min=spec.min, max=spec.max, step=spec.step, description=label)
    cls = W.IntSlider if ints else W.FloatSlider
    cast = int if ints else float
    return cls(value=cast(spec.default), min=cast(spec.min), max=cast(spec.max), step=cast(spec.step),
               description=label, continuous_update=False, style={"description_width": "initial"})


def _show(result: Any) -> None:
    from IPython.display import Markdown, display

    items = result if isinstance(result, tuple) else (result,)
    for item in items:
        if isinstance(item, str):
            display(Markdown(item))
        else:
            display(item)


def explore(fn: Callable[..., Any], **knobs: Any) -> Any:
    """Controls for ``knobs`` over ``fn``; headless, ``fn`` at the defaults. Returns what ``fn`` returned at the
    defaults (so a check cell can test the default view).

    Introduced in lab 01 (One GPU, One Model).
    """
    specs = {name: _spec(k) for name, k in knobs.items()}
    start = {name: (s if isinstance(s, bool) else s.default) for name, s in specs.items()}
    first = fn(**start)
    if settings.headless():
        _show(first)
        return first
    import ipywidgets as W
    from IPython.display import display

    controls = {name: _widget(name, s) for name, s in specs.items()}
    out = W.interactive_output(lambda **kw: _show(fn(**kw)), controls)
    display(W.VBox([W.HBox(list(controls.values()), layout=W.Layout(flex_flow="row wrap")), out]))
    return first


# ------------------------------------------------------------------------------------- charts
_TEMPLATE = """<div class="labs-chart" id="{id}">
<img alt="chart (a static image; it turns interactive where vega can load)" src="data:image/png;base64,{png}"
 style="max-width:100%">
<div class="labs-vega" style="display:none"></div>
</div>
<script>
(function() {{
  var root = document.getElementById("{id}");
  if (!root) return;
  function load(src) {{
    return new Promise(function(ok, ko) {{
      var s = document.createElement("script"); s.src = src; s.onload = ok; s.onerror = ko;
      document.head.appendChild(s);
    }});
  }}
  var ready = window.vegaEmbed ? Promise.resolve() :
    (window.define ? Promise.reject() :  /* RequireJS pages (classic notebook) keep the image */
     load("https://cdn.jsdelivr.net/npm/vega@{vega}").then(function() {{
       return load("https://cdn.jsdelivr.net/npm/vega-lite@{vegalite}"); }}).then(function() {{
       return load("https://cdn.jsdelivr.net/npm/vega-embed@{embed}"); }}));
  ready.then(function() {{
    var el = root.querySelector(".labs-vega");
    return window.vegaEmbed(el, {spec}, {{"actions": false}}).then(function() {{
      el.style.display = ""; root.querySelector("img").style.display = "none"; }});
  }}).catch(function() {{ /* offline, or a page that cannot load scripts: the image stays */ }});
}})();
</script>"""


def render_chart(spec: dict, **_: Any) -> dict[str, str]:
    """The ``labs`` altair renderer: a PNG (rendered offline) that becomes the interactive chart where it can.

    Introduced in lab 01 (One GPU, One Model).
    """
    import altair as alt

    png = base64.b64encode(artifacts.chart_png(spec)).decode()
    page = _TEMPLATE.format(id=f"labs-{uuid.uuid4().hex[:12]}", png=png, spec=json.dumps(spec),
                            vega=alt.VEGA_VERSION, vegalite=alt.VEGALITE_VERSION, embed=alt.VEGAEMBED_VERSION)
    return {"text/html": page, "image/png": png, "text/plain": "<altair chart>"}


def enable_offline_charts() -> None:
    """Make altair show every chart through :func:`render_chart` (done when this module is imported).

    Introduced in lab 01 (One GPU, One Model).
    """
    import altair as alt

    if "labs" not in alt.renderers.names():
        alt.renderers.register("labs", render_chart)
    alt.renderers.enable("labs")


try:  # pragma: no cover - altair is a dependency; a bare environment still imports this module
    enable_offline_charts()
except ImportError:
    pass
