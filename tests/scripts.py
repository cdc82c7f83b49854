"""The repository's scripts (scripts/, ci/) loaded as modules, for the tests that drive them: they are files to run,
not a package to import."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(relpath: str):
    """``scripts/colab_setup.py`` or ``ci/notebooks.py`` (a path from the repository's root) as a fresh module."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
