"""Where the problem files and family cards live.

They ship as package data (`metakernel._problems`, `metakernel._families`) so a wheel install works; a plain
checkout on PYTHONPATH (the H200 machine runs `python3 -m metakernel` that way) falls back to the folders beside
the package. `METAKERNEL_PROBLEMS_DIR` / `METAKERNEL_FAMILIES_DIR` point elsewhere (tests use them).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def _data_dir(env_var: str, package: str, folder: str) -> Path:
    override = os.environ.get(env_var)
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return _ROOT / folder


def problems_dir() -> Path:
    """The folder holding `<family>/<NN>_<slug>.py` problem files."""
    return _data_dir("METAKERNEL_PROBLEMS_DIR", "metakernel._problems", "problems")


def families_dir() -> Path:
    """The folder holding `<family>.yaml` family cards."""
    return _data_dir("METAKERNEL_FAMILIES_DIR", "metakernel._families", "families")


def guides_dir() -> Path:
    """The folder holding the per-DSL agent guides (`docs/guides/<dsl>.md`; shipped as `metakernel._guides`)."""
    return _data_dir("METAKERNEL_GUIDES_DIR", "metakernel._guides", "docs/guides")


def repo_root() -> Path:
    """The checkout root (for `validation/` reports and the git revision); meaningful only in a checkout."""
    return _ROOT
