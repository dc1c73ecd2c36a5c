"""metakernel: a benchmark of cross-DSL transfer of GPU-kernel knowledge (CuTe DSL ↔ TIRx) by LLM agents.

The public API: load problems, compute what a result is judged against, compare, validate.
"""

from metakernel.catalog import Catalog, load_catalog
from metakernel.compare import Expected, Mismatch, OutputCheck, Verdict, compare
from metakernel.errors import UserError
from metakernel.expected import compute_expected, run_reference
from metakernel.families import FAMILY_SIZES, Family, load_families
from metakernel.problem import ComparatorSpec, Problem, load_problem
from metakernel.validate import ProblemReport, validate_problem
from metakernel.variants import DSLS, task_text

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
