"""Keep the lab notebooks to the house rules.

    python ci/notebooks.py strip labs/*.ipynb   # drop outputs, keep cell tags, normalise metadata
    python ci/notebooks.py check labs/*.ipynb   # fail if a notebook breaks the skeleton every lab follows

The skeleton (see README "How a lab is built"): a title with a one-line promise and an Open-in-Colab badge;
"What you will learn"; one setup cell; a cell tagged `parameters`; a check cell tagged `check`; "Exercises";
a last code cell that stops the server. No outputs committed; no sys.path tricks; at least one widget over the lab's
knob (`widgets.explore`); and one code path on every device: no branching on the profile's name or device outside the
parameters cell (device-dependent sizes come from helpers.plan).
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")
#: Lab code that decides by device or profile name (allowed only in the parameters cell).
BRANCH = re.compile(r"PROFILE\.name\s*(==|!=|in\b)|\.device\s*(==|!=|in\b)|\bif\b[^\n]*\b(PROFILE\.(name|device)|"
                    r"\.has_gpu|\.gpus)\b|\bsupports_(bf16|fp8|fp4)\b")
WIDGET = re.compile(r"widgets\.explore\(|\binteract\(")
COLAB = "https://colab.research.google.com/github/"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


#: The cell metadata a committed notebook keeps: tags (papermill's parameters, the self-test's checks) and a heading
#: JupyterLab shows collapsed (the self-test, out of the lesson's way).
KEPT_METADATA = ("tags", "jp-MarkdownHeadingCollapsed")
#: The heading the self-test sits under, collapsed, before its first check cell.
SELF_TEST = "## Self-test"


def strip(path: Path) -> bool:
    """Remove outputs and execution counts, keep only :data:`KEPT_METADATA`; returns True if the file changed."""
    before = path.read_text()
    nb = json.loads(before)
    ids = {c.get("id") for c in nb["cells"]}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        cell["metadata"] = {k: meta[k] for k in KEPT_METADATA if meta.get(k)}
        if not cell.get("id"):  # nbformat 4.5 requires one (a cell pasted in by hand lacks it)
            cell["id"] = uuid.uuid4().hex[:8]
            while cell["id"] in ids:
                cell["id"] = uuid.uuid4().hex[:8]
            ids.add(cell["id"])
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    nb["metadata"] = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    nb["nbformat"], nb["nbformat_minor"] = 4, 5
    after = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if after != before:
        path.write_text(after)
        return True
    return False


#: A code cell a person reads at once (house style 4).
MAX_CELL_LINES = 40


def check(path: Path) -> list[str]:
    """Every way ``path`` breaks the house rules (empty when it follows them)."""
    problems = []
    try:
        nb = json.loads(path.read_text())
    except ValueError as e:
        return [f"not valid JSON: {e}"]
    cells = nb.get("cells", [])
    code = [c for c in cells if c["cell_type"] == "code"]
    md = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    if not NAME.match(path.name):
        problems.append("name must be NN_slug.ipynb (lower case, underscores)")
    if any(c.get("outputs") or c.get("execution_count") for c in code):
        problems.append("outputs are committed: run `make strip`")
    if not all(c.get("id") for c in cells):
        problems.append("a cell has no id (nbformat 4.5 requires one): run `make strip`")
    first = _source(cells[0]) if cells else ""
    if not (cells and cells[0]["cell_type"] == "markdown" and first.lstrip().startswith("# ")):
        problems.append("the first cell must be a markdown title ('# Lab NN — ...')")
    if f"{COLAB}" not in first or f"labs/{path.name}" not in first:
        problems.append("the title cell needs an Open-in-Colab badge pointing at this notebook")
    if not re.search(r"^\*\*.+\*\*\s*$", first, re.M):
        problems.append("the title cell needs a one-line promise in bold")
    for heading in ("What you will learn", "Exercises"):
        if not re.search(rf"^#+ .*{heading}", md, re.M):
            problems.append(f"missing a '{heading}' section")
    tags = [t for c in cells for t in c.get("metadata", {}).get("tags", [])]
    if tags.count("parameters") != 1:
        problems.append("exactly one cell must be tagged 'parameters'")
    if "check" not in tags:
        problems.append("the closing check cell must be tagged 'check'")
    else:
        first_check = next(i for i, c in enumerate(cells) if "check" in c.get("metadata", {}).get("tags", []))
        heads = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and _source(c).startswith(SELF_TEST)]
        if len(heads) != 1 or heads[0] > first_check:
            problems.append(f"the check cells must sit under one '{SELF_TEST}' heading, after the lesson")
        elif not cells[heads[0]].get("metadata", {}).get("jp-MarkdownHeadingCollapsed"):
            problems.append(f"the '{SELF_TEST}' heading must be collapsed (metadata jp-MarkdownHeadingCollapsed)")
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    if params and re.search(r"papermill|make test|CI-sized|CI overrides?|\bin CI\b", _source(params[0])):
        problems.append("the parameters cell speaks of the test runner (papermill, CI, make test): speak to the learner")
    if code and not re.search(r"\.stop\(|stop_all\(|stop_owned\(|stop_replicas\(", _source(code[-1])):
        problems.append("the last code cell must stop the server")
    for c in code:
        if re.search(r"sys\.path\.(append|insert)|sys\.path\s*[+=]", _source(c)):
            problems.append("a cell patches sys.path: import the installed helpers package instead")
            break
    for i, c in enumerate(code):
        if "parameters" in c.get("metadata", {}).get("tags", []):
            continue
        m = BRANCH.search(_source(c))
        if m:
            problems.append(f"code cell {i} branches on the device or profile ({m.group(0)!r}): one code path on every "
                            "device — take sizes from helpers.plan and what the device decides from the live server")
    for i, c in enumerate(code):
        if len(_source(c).splitlines()) > MAX_CELL_LINES:
            problems.append(f"code cell {i} has {len(_source(c).splitlines())} lines (at most {MAX_CELL_LINES}): split it "
                            "where it changes subject, or move library code into helpers/")
    if not any(WIDGET.search(_source(c)) for c in code):
        problems.append("no widget for the lab's knob: add widgets.explore(fn, knob=...) over this run's measurements")
    if nb.get("metadata", {}).get("kernelspec", {}).get("name") != "python3":
        problems.append("kernelspec must be python3: run `make strip`")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in {"strip", "check"}:
        print(__doc__)
        return 2
    cmd, paths = argv[0], [Path(p) for p in argv[1:]]
    bad = 0
    for p in paths:
        if cmd == "strip":
            if strip(p):
                print(f"stripped {p}")
        else:
            for problem in check(p):
                print(f"{p}: {problem}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
