"""`problems validate --gold --report R --resume --time-budget S`, the H200 validation's shard loop, on the CPU:
a shard stops at its budget with exit 3 and a report on disk, the next one resumes without re-grading, and each
entry says at which commit it was graded (a resumed report spans commits)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from metakernel.validate_run import run_gold_validation

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is not installed")


def test_a_shard_stops_at_its_budget_and_the_next_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("METAKERNEL_REVISION", "abc1234")
    report = tmp_path / "gold.json"
    assert run_gold_validation("25", device="cpu", as_json=True, report_path=report, resume=True,
                               time_budget=0.5) == 3
    first = json.loads(report.read_text())
    assert len(first["solutions"]) == 1 and len(first["runs"]) == 1
    (entry,) = first["solutions"].values()
    assert entry["graded_at"] == "abc1234" and entry["dsl"] in ("cute", "tirx")
    monkeypatch.setenv("METAKERNEL_REVISION", "def5678")
    run_gold_validation("25", device="cpu", as_json=True, report_path=report, resume=True, time_budget=0.5)
    second = json.loads(report.read_text())
    assert len(second["runs"]) == 2 and len(second["solutions"]) == 2
    kept = second["solutions"][next(iter(first["solutions"]))]
    assert kept["graded_at"] == "abc1234" and kept["sha256"] == entry["sha256"]  # not graded again
    assert {e["graded_at"] for e in second["solutions"].values()} == {"abc1234", "def5678"}


def test_an_entry_graded_by_other_grader_code_is_graded_again(tmp_path, monkeypatch):
    """Resuming across sessions keeps only entries graded by identical grader code (`grader` fingerprint), so a
    report assembled over several device sessions still describes one grader; the summary lists the graders."""
    from metakernel.provenance import grader_fingerprint

    report = tmp_path / "gold.json"
    run_gold_validation("25", device="cpu", as_json=True, report_path=report, resume=True, time_budget=0.5)
    data = json.loads(report.read_text())
    (key, entry), = data["solutions"].items()
    assert entry["grader"] == grader_fingerprint() and data["summary"]["graders"] == [grader_fingerprint()]
    entry["grader"], entry["graded_at"] = "0123456789abcdef", "old"  # as if an older grader had graded it
    report.write_text(json.dumps(data))
    run_gold_validation("25", device="cpu", as_json=True, report_path=report, resume=True, time_budget=0.5)
    again = json.loads(report.read_text())["solutions"][key]
    assert again["grader"] == grader_fingerprint() and again["graded_at"] != "old"


def test_the_grader_fingerprint_ignores_docstrings_but_not_code(tmp_path):
    """Correcting a grader docstring must not void the device validation; changing a line of code must."""
    import shutil
    from pathlib import Path

    import metakernel
    from metakernel.provenance import GRADER_CODE, grader_fingerprint

    root = tmp_path / "metakernel"
    source = Path(metakernel.__file__).parent
    for part in GRADER_CODE:
        (shutil.copytree if (source / part).is_dir() else shutil.copyfile)(source / part, root / part)
    assert grader_fingerprint(root) == grader_fingerprint()
    timing = root / "grader" / "timing.py"
    text = timing.read_text()
    timing.write_text(text.replace('"""The timing procedure', '"""The timing procedure, reworded,', 1))
    assert timing.read_text() != text and grader_fingerprint(root) == grader_fingerprint()
    timing.write_text(text.replace("ROW = 4", "ROW = 5", 1))
    assert grader_fingerprint(root) != grader_fingerprint()
