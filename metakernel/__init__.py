"""metakernel: a benchmark of cross-DSL transfer of GPU-kernel knowledge (CuTe DSL ↔ TIRx) by LLM agents.

The public API: load problems, compute what a result is judged against, compare, validate.
"""

from importlib import import_module
from typing import Any

# Names are imported on first use (PEP 562): `import metakernel` must not import torch, so the CLI answers
# `--help` at once and the grader's child can enter its sandbox before any library (torch starts threads, and a
# process with threads can no longer enter a user namespace).
_EXPORTS = {
    "Catalog": "catalog", "load_catalog": "catalog",
    "Expected": "compare", "Mismatch": "compare", "OutputCheck": "compare", "Verdict": "compare",
    "compare": "compare", "UserError": "errors", "compute_expected": "expected", "run_reference": "expected",
    "FAMILY_SIZES": "families", "Family": "families", "load_families": "families",
    "ComparatorSpec": "problem", "Problem": "problem", "load_problem": "problem",
    "ProblemReport": "validate", "validate_problem": "validate", "DSLS": "variants", "task_text": "variants",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(f"metakernel.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'metakernel' has no attribute {name!r}")


__all__ = [
    "DSLS",
    "FAMILY_SIZES",
    "Catalog",
    "ComparatorSpec",
    "Expected",
    "Family",
    "Mismatch",
    "OutputCheck",
    "Problem",
    "ProblemReport",
    "UserError",
    "Verdict",
    "compare",
    "compute_expected",
    "load_catalog",
    "load_families",
    "load_problem",
    "run_reference",
    "task_text",
    "validate_problem",
]
