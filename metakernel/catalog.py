"""The catalog: family cards plus problem files, cross-checked against the fixed numbering."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metakernel.families import Family, check_catalog, load_families
from metakernel.problem import (
    Problem,
    ProblemSummary,
    load_problem,
    parse_selection,
    problem_paths,
    summarise_problem_file,
)


@dataclass
class Catalog:
    """What is on disk: family cards and problem file paths by number."""

    families: dict[str, Family]
    paths: dict[int, Path]

    def problem(self, number: int) -> Problem:
        """Load one problem (raises `UserError` for unknown numbers or broken files)."""
        return load_problem(number, self.paths[number].parent.parent if number in self.paths else None)

    def problems(self) -> list[Problem]:
        """Load every problem in number order."""
        return [self.problem(n) for n in self.paths]

    def summaries(self) -> list[ProblemSummary]:
        """Every problem's listing line, in number order, without running any problem file."""
        return [summarise_problem_file(self.paths[n]) for n in self.paths]

    def select(self, text: str) -> list[int]:
        """Numbers for a selection such as '1,3-5,moe'; empty text means all."""
        if not text.strip():
            return list(self.paths)
        return parse_selection(text, self.paths, self.families)

    def issues(self) -> list[str]:
        """Disagreements between the cards, the expected family sizes and the files."""
        by_family: dict[str, list[int]] = {}
        for number, path in self.paths.items():
            by_family.setdefault(path.parent.name, []).append(number)
        return check_catalog(self.families, by_family)


def load_catalog(problems: Path | None = None, families: Path | None = None) -> Catalog:
    """Read the family cards and find the problem files."""
    return Catalog(families=load_families(families), paths=problem_paths(problems))
