"""The shape of helpers/ and benchmarks/: no import circle (imports inside functions included), leaves that stay
leaves, and a README that names every module.

The graph is read from the source (ast), not by importing, so an import placed inside a function to dodge a
circle is still an edge here, and still fails.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "helpers"
#: The packages whose import graph is read: the helpers, and the benchmarks beside them.
PACKAGES = ("helpers", "benchmarks")


def _modules() -> dict[str, Path]:
    out = {}
    for p in (f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")):
        if "_data" in p.parts:
            continue
        rel = p.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports_of(name: str) -> set[str]:
    """Every helpers or benchmarks module ``name`` imports, at module level or inside functions."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    pkg = _package_of(name, path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    found.add(_existing(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in MODULES else _existing(mod))
    found.discard(name)
    return found


def _existing(mod: str) -> str:
    while mod not in MODULES and "." in mod:
        mod = mod.rsplit(".", 1)[0]
    return mod


GRAPH = {m: imports_of(m) for m in MODULES}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_import_graph_has_no_circle():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_benchmarks_are_read_too_and_import_helpers_only_downwards():
    """The side-by-side had a circle (render <-> rounds, and every module through the package's ROOT): the graph
    covers benchmarks/ now, and nothing in helpers/ imports it."""
    assert "benchmarks.side_by_side.render" in GRAPH and "benchmarks.side_by_side.rounds" in GRAPH
    assert "benchmarks.side_by_side.rounds" not in GRAPH["benchmarks.side_by_side.render"]
    assert not any(n.startswith("benchmarks") for m, deps in GRAPH.items() if m.startswith("helpers") for n in deps)


def test_the_cycle_finder_finds_a_planted_circle():
    saved = dict(GRAPH)
    try:
        GRAPH["helpers.settings"] = {"helpers.procs"}
        assert _cycle() is not None
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


# Leaves, and what each may import from helpers (nothing else).
LEAVES = {
    "helpers.settings": set(),
    "helpers.artifacts": set(),
    "helpers.endpoint": set(),
    "helpers.metrics": {"helpers.endpoint"},
    "helpers.procs": {"helpers.settings"},
    "helpers.progress": {"helpers.settings"},
    "helpers.runtime": {"helpers.settings"},
    "helpers.models": {"helpers.settings"},
    "helpers.bench.records": set(),
    "helpers.dependency_tree": set(),
}


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaves_import_only_what_they_may(leaf):
    assert GRAPH[leaf] <= LEAVES[leaf], f"{leaf} imports {sorted(GRAPH[leaf] - LEAVES[leaf])}"


def test_statistics_never_know_the_run_folder_and_the_runner_not_the_search():
    assert "helpers.bench.store" not in GRAPH["helpers.bench.stats"]
    assert "helpers.bench.runner" not in GRAPH["helpers.bench.stats"]
    assert "helpers.bench.search" not in GRAPH["helpers.bench.runner"]
    assert "helpers.server" not in GRAPH["helpers.bench.runner"]


def test_helpers_never_import_labs_benchmarks_or_ci():
    for name, path in MODULES.items():
        text = path.read_text()
        for forbidden in ("import benchmarks", "from benchmarks", "import ci.", "from ci"):
            assert forbidden not in text, f"{name}: {forbidden}"


def test_readme_layout_names_every_top_level_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    tops = {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and m.startswith("helpers.")}
    missing = [t for t in sorted(tops) if f"{t}" not in layout]
    assert not missing, f"README's Layout does not name: {missing}"


def _public(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


def test_every_public_function_says_which_lab_introduces_it():
    """d2l's "Defined in": each function and class a module exports (``__all__``) names the lab that introduces it."""
    missing = []
    for name, path in MODULES.items():
        if not name.startswith("helpers"):  # the benchmarks are not a lab's: no lab introduces them
            continue
        tree = ast.parse(path.read_text())
        public = _public(tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in public:
                if "Introduced in lab" not in (ast.get_docstring(node) or ""):
                    missing.append(f"{name}.{node.name}")
    assert not missing, "no 'Introduced in lab NN' in: " + ", ".join(missing)
