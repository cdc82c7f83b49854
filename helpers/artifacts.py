"""Writing an artifact: the same content as Markdown, JSON and a self-contained HTML page, with its charts as PNGs.

Every phase deliverable goes through :func:`write` (the Sizing Sheet, the Phase 2 report, the side-by-side
report, the Phase 3 deployment, the Phase 4 fleet results, the capstone design)::

    paths = artifacts.write(reports_dir, "phase2_benchmark_report", title=..., markdown=md, data=obj,
                            basis={"configs": "measured", "slo": "input", ...},
                            charts={"Latency-throughput": chart}, provenance=provenance.provenance(...))
    paths["md"], paths["json"], paths["html"], paths["charts"]["Latency-throughput"]

Every deliverable says how each of its numbers is known (``basis``: one of :data:`BASES` per top-level key of its data,
or one for them all): measured in this run, predicted, taken from a catalog, saved by an earlier lab, or an input (a
knob, a target). The JSON carries it under ``"basis"`` and the Markdown as a table, so a reader never takes a
prediction or a datasheet figure for a measurement.

The HTML page needs no network: charts are embedded as PNG images rendered offline by ``vl-convert`` (an
altair chart's own HTML would fetch vega from a CDN and show "Error loading script" to an offline reader).

Introduced in lab 05 (Where the Time Goes).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

__all__ = ["write", "chart_png", "markdown_to_html", "slug", "provenance_markdown", "BASES", "check_basis",
           "basis_markdown"]

#: How a number in a deliverable is known. A basis is one of these (``"earlier lab 15"`` names the lab), several
#: joined by " + ", optionally followed by ": " and what exactly (``"measured + predicted: each row carries both"``).
BASES = {
    "measured": "measured in this run",
    "predicted": "predicted by a formula or a model fitted earlier, not measured",
    "catalog": "taken from a catalog: datasheets, published configs, list prices",
    "earlier lab": "saved by an earlier lab of this series and read back",
    "input": "set by the learner, the brief or the plan (a knob, a target): not a result",
    "no numbers": "names, commands, paths",
}


def check_basis(data: Mapping[str, Any], basis: "str | Mapping[str, str]") -> dict[str, str]:
    """``basis`` for every top-level key of ``data`` (a string: the same for all), each checked against
    :data:`BASES`; raises ``ValueError`` naming the keys without one, the keys it names that ``data`` lacks, and
    the bases it does not know.

    Introduced in lab 05 (Where the Time Goes).
    """
    full = {k: basis for k in data} if isinstance(basis, str) else dict(basis)
    problems = []
    missing = [k for k in data if k not in full]
    if missing:
        problems.append(f"no basis for {missing}: say for each whether this run measured it, predicted it, took it "
                        f"from a catalog or an earlier lab, or it is an input (one of {list(BASES)})")
    stale = [k for k in full if k not in data]
    if stale:
        problems.append(f"a basis for {stale}, which the data does not hold")
    for k, v in full.items():
        kinds = [re.sub(r"^earlier lab \d\d$", "earlier lab", x.strip()) for x in str(v).split(":", 1)[0].split("+")]
        if not all(x in BASES for x in kinds):
            problems.append(f"{k}: {v!r} names no known basis (the text before ':' is one of {list(BASES)}, several "
                            "joined by ' + ')")
    if problems:
        raise ValueError("; ".join(problems))
    return full


def basis_markdown(basis: Mapping[str, str]) -> str:
    """The ``## What each number is`` section of a deliverable.

    Introduced in lab 05 (Where the Time Goes).
    """
    rows = [f"| `{k}` | {v} |" for k, v in basis.items()]
    return "\n".join(["## What each number is", "", "| field | how it is known |", "|---|---|", *rows])


def slug(text: str) -> str:
    """A file-name-safe slug: ``"TTFT CDFs (every probe)"`` -> ``"ttft-cdfs-every-probe"``.

    Introduced in lab 05 (Where the Time Goes).
    """
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "chart"


def chart_png(chart: Any, scale: float = 2.0) -> bytes:
    """An altair chart rendered to PNG offline (``vl-convert``; no browser, no network).

    Introduced in lab 05 (Where the Time Goes).
    """
    import vl_convert as vlc

    spec = chart.to_dict() if hasattr(chart, "to_dict") else chart
    return vlc.vegalite_to_png(spec, scale=scale)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "as_dict"):
        return _clean(obj.as_dict())
    return obj


def provenance_markdown(prov: Mapping[str, Any]) -> str:
    """A short Markdown section from :func:`helpers.provenance.provenance`.

    Introduced in lab 05 (Where the Time Goes).
    """
    v = prov.get("versions", {})
    dev = prov.get("device", {})
    repo = prov.get("repository", {})
    lines = ["## Provenance", "",
             f"- created: {prov.get('created')}",
             f"- device: {dev.get('description')}; GPU driver {dev.get('driver')}, CUDA {dev.get('cuda')}",
             f"- vLLM {prov.get('vllm', {}).get('version')} (commit {prov.get('vllm', {}).get('commit') or 'not recorded'}); "
             f"torch {v.get('torch')}; transformers {v.get('transformers')}; helpers {v.get('llm-serving-labs')}",
             f"- this repository: commit {repo.get('commit') or 'not a checkout'}"
             + (" (with uncommitted changes)" if repo.get("dirty") else "")]
    m = prov.get("model")
    if m:
        lines.append(f"- model: {m.get('model')} (revision {m.get('revision') or '-'}, checkpoint digest "
                     f"{m.get('checkpoint_sha256_16') or '-'})")
    srv = prov.get("server")
    if srv:
        lines.append(f"- server: dtype {srv.get('dtype')}, KV cache dtype {srv.get('kv_cache_dtype')}, block size "
                     f"{srv.get('block_size')}, {srv.get('num_blocks')} KV blocks")
    return "\n".join(lines)


def write(directory: str | Path, stem: str, *, title: str, markdown: str, data: Mapping[str, Any],
          basis: "str | Mapping[str, str]", charts: Mapping[str, Any] | None = None,
          provenance: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``<stem>.md``, ``<stem>.json``, ``<stem>.html`` and one ``<stem>-<chart>.png`` per chart.

    ``markdown`` is the body; a section saying how each number is known (``basis``, checked by
    :func:`check_basis` before anything is written), a provenance section and the charts (as image links) are
    appended. ``data`` is the JSON body; ``basis`` and ``provenance`` are added to it under those keys. A chart that
    cannot render is reported in the page, never loses the artifact. Returns the paths: ``md``, ``json``, ``html`` and ``charts`` (title -> PNG path).

    Introduced in lab 05 (Where the Time Goes).
    """
    basis = check_basis(data, basis)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    figures_md, figures_html = [], []
    for name, chart in (charts or {}).items():
        path = d / f"{stem}-{slug(name)}.png"
        try:
            png = chart_png(chart)
        except Exception as e:  # noqa: BLE001 - a chart that cannot render must not lose the artifact
            figures_md.append(f"### {name}\n\n(chart not rendered: {e})")
            figures_html.append(f"<h3>{html.escape(name)}</h3><p>chart not rendered: {html.escape(str(e))}</p>")
            continue
        path.write_bytes(png)
        pngs[name] = path
        figures_md.append(f"### {name}\n\n![{name}]({path.name})")
        figures_html.append(f"<h3>{html.escape(name)}</h3><img alt='{html.escape(name)}' style='max-width:100%' "
                            f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    text = markdown.rstrip() + "\n\n" + basis_markdown(basis) + "\n"
    if figures_md:
        text += "\n## Charts\n\n" + "\n\n".join(figures_md) + "\n"
    if provenance:
        text += "\n" + provenance_markdown(provenance) + "\n"
    md_path, json_path, html_path = d / f"{stem}.md", d / f"{stem}.json", d / f"{stem}.html"
    md_path.write_text(text)
    body = dict(_clean(dict(data)))
    body["basis"] = basis
    if provenance:
        body["provenance"] = _clean(dict(provenance))
    json_path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    page_md = markdown.rstrip() + "\n\n" + basis_markdown(basis) + (
        "\n\n" + provenance_markdown(provenance) if provenance else "")
    html_path.write_text(
        "<!doctype html><meta charset='utf-8'><title>" + html.escape(title) + "</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px}pre{background:#f6f6f6;padding:8px;overflow:auto}</style>"
        + markdown_to_html(page_md) + ("<h2>Charts</h2>" + "\n".join(figures_html) if figures_html else ""))
    return {"md": md_path, "json": json_path, "html": html_path, "charts": pngs}


def markdown_to_html(text: str) -> str:
    """Just enough Markdown for the artifacts: headings, bullets, tables, code fences, bold, code, links, images.

    Introduced in lab 05 (Where the Time Goes).
    """
    out, in_table, in_code, in_list = [], False, False, False

    def inline(s: str) -> str:
        s = html.escape(s)
        s = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r"<img alt='\1' src='\2'>", s)
        s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"<a href='\2'>\1</a>", s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", s)

    for line in text.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(line))
            continue
        if in_list and not line.startswith("- "):
            out.append("</ul>")
            in_list = False
        if line.startswith("|"):
            if set(line.replace("|", "").strip()) <= {"-", ":", " "}:
                continue
            cells = [inline(c.strip()) for c in line.strip().strip("|").split("|")]
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    if in_table:
        out.append("</table>")
    if in_list:
        out.append("</ul>")
    return "\n".join(out)
