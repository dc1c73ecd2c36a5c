"""Known-correct and known-wrong solutions beside the problems, and validating the grader against them.

Layout: `solutions/<family>/<NN>_<slug>/correct/<dsl>[_<variant>].py` must pass;
`solutions/<family>/<NN>_<slug>/wrong/<dsl>_<what>.py` must be rejected with the status and reason its docstring
names on a line `Expected: <status>/<reason>`. `metakernel problems validate --gold` grades all of them (on the GPU;
on the CPU only the dry-run check) and fails when a gold solution fails or a wrong one is not caught as expected.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metakernel.paths import repo_root

_EXPECTED = re.compile(r"^Expected:\s*(?P<status>[a-z_]+)/(?P<reason>[a-z_]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Solution:
    """One file of the solutions tree."""

    path: Path
    number: int
    dsl: str
    kind: str  # "gold" | "wrong"
    expected_status: str
    expected_reason: str

    @property
    def key(self) -> str:
        """Stable name in reports: `28/correct/tirx.py`."""
        return f"{self.number:02d}/{self.path.parent.name}/{self.path.name}"

    @property
    def sha256(self) -> str:
        """Hash of the file's bytes (reports resume per content)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def solutions_dir() -> Path:
    """`solutions/` in the checkout."""
    return repo_root() / "solutions"


def discover(root: Path | None = None) -> list[Solution]:
    """Every solution file, in problem order (gold first)."""
    root = root or solutions_dir()
    found: list[Solution] = []
    for path in sorted(root.glob("*/*/*/*.py")):
        kind_dir = path.parent.name
        if kind_dir not in ("correct", "wrong"):
            continue
        number = int(path.parent.parent.name[:2])
        parts = path.stem.split("_")
        dsl = parts[1] if parts[0] == "rt" and len(parts) > 1 else parts[0]  # rt_<dsl>_...: the red-team corpus
        if kind_dir == "correct":
            found.append(Solution(path, number, dsl, "gold", "passed", ""))
            continue
        match = _EXPECTED.search(path.read_text(encoding="utf-8"))
        if match is None:
            raise ValueError(f"{path}: a wrong solution must say 'Expected: <status>/<reason>' in its docstring")
        found.append(Solution(path, number, dsl, "wrong", match["status"], match["reason"]))
    return sorted(found, key=lambda s: (s.number, s.kind != "gold", s.dsl, s.path.name))


def entry(solution: Solution, report: Any) -> dict[str, Any]:
    """The per-solution record of `validation/h200-gold.json`."""
    timing, eager = report.timing, report.eager
    matched = (report.status == solution.expected_status and
               (solution.kind == "gold" or report.reason == solution.expected_reason))
    return {
        "path": str(solution.path.relative_to(repo_root())) if solution.path.is_relative_to(repo_root())
        else str(solution.path),
        "sha256": solution.sha256, "problem": report.problem, "kind": solution.kind, "dsl": solution.dsl,
        "status": report.status, "reason": report.reason,
        "expected": f"{solution.expected_status}/{solution.expected_reason}".rstrip("/"),
        "expected_matched": matched, "ok": matched,
        "message": report.message[-2000:],
        "kernel_median_us": timing.median_us if timing else None,
        "eager_median_us": eager.median_us if eager else None,
        "speedup": report.speedup, "speedup_gpu": report.speedup_gpu, "dsl_share": report.dsl_share,
        "roofline_fraction": report.roofline_fraction, "gpu_only_us": report.gpu_only_us,
        "eager_gpu_only_us": eager.gpu_only_us if eager else None, "launches_per_call": report.launches_per_call,
        "timing_spread": {"rse": timing.rse, "stdev_us": timing.stdev_us, "min_us": timing.min_us, "n": timing.n}
        if timing else None,
        "integrity": report.integrity, "phases_s": report.phases_s,
        "rechecks": report.rechecks, "ablations": report.ablations, "seed": report.seed,
        "kernels": report.kernels[:12], "isolation": report.isolation, "protocol": report.protocol,
    }
