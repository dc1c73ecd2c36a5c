"""The 74 problems: numbering, family cards, and every reference validated on the CPU at small scale."""

from __future__ import annotations

import pytest

from metakernel.catalog import load_catalog
from metakernel.families import FAMILY_SIZES, expected_ranges
from metakernel.problem import problem_paths
from metakernel.validate import validate_problem

PATHS = problem_paths()


def test_family_sizes_cover_01_to_74():
    """Pins DESIGN 2: six families numbered 01-74 in a fixed order with fixed sizes."""
    assert list(FAMILY_SIZES) == ["attention", "kv_cache", "mlp_norm", "moe", "quantization", "linear_attention"]
    assert list(FAMILY_SIZES.values()) == [18, 8, 17, 8, 10, 13]
    ranges = expected_ranges()
    assert ranges["attention"] == range(1, 19) and ranges["linear_attention"] == range(62, 75)


def test_catalog_is_complete_and_consistent():
    """Every family card lists exactly its range, and every number 01-74 has one file in its family's folder."""
    catalog = load_catalog()
    assert catalog.issues() == []
    assert list(catalog.paths) == list(range(1, 75))
    for name, card in catalog.families.items():
        assert all(catalog.paths[n].parent.name == name for n in card.members)


@pytest.mark.parametrize("number", list(PATHS), ids=[p.stem for p in PATHS.values()])
def test_problem_validates_on_cpu(number):
    """Every check of `metakernel problems validate` passes at small scale on the CPU."""
    problem = load_catalog().problem(number)
    report = validate_problem(problem, device="cpu", scale="small")
    assert report.error is None, report.error
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]
    assert not failed, failed
