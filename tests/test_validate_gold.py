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


def test_file_keys_select_single_files_and_an_infra_error_is_graded_again(tmp_path):
    """A selection item with a slash is one file (a shard re-grades just the files that need it), and an entry
    that failed for the machine's reasons is graded again on resume, whatever grader graded it."""
    from metakernel.errors import UserError

    report = tmp_path / "gold.json"
    key = "25/correct/tirx.py"
    run_gold_validation(key, device="cpu", as_json=True, report_path=report, resume=True)
    data = json.loads(report.read_text())
    assert list(data["solutions"]) == [key]
    data["solutions"][key]["status"], data["solutions"][key]["graded_at"] = "infra_error", "old"
    report.write_text(json.dumps(data))
    run_gold_validation(key, device="cpu", as_json=True, report_path=report, resume=True)
    again = json.loads(report.read_text())["solutions"][key]
    assert again["status"] != "infra_error" and again["graded_at"] != "old"
    with pytest.raises(UserError, match="no such solution"):
        run_gold_validation("25/correct/nothing.py", device="cpu", as_json=True, report_path=report, resume=True)


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


def test_children_are_started_ahead_for_the_next_files_within_the_memory_budget():
    """The run's prefetch queue: the next file's child always; three ahead while a wrong file is graded (most are
    rejected within seconds, and waited for their child's start); never past the arena budget; a child goes only
    to its own file, and the ones left over are stopped. (Starting a real child needs the GPU: the start is
    recorded here, with what would be discarded.)"""
    from types import SimpleNamespace

    from metakernel.validate_run import Prefetch

    started, discarded = [], []

    class Child:
        def __init__(self, key):
            self.key = key
            started.append(key)

        def discard(self):
            discarded.append(self.key)

    def sol(key, kind="wrong"):
        return SimpleNamespace(key=key, kind=kind)

    files = [sol("28/correct/tirx.py", "gold"), sol("28/wrong/a.py"), sol("28/wrong/static.py"), sol("28/wrong/c.py"),
             sol("28/wrong/d.py"), sol("36/correct/cute.py", "gold")]
    sizes = {"36/correct/cute.py": 3 << 30}
    ahead = Prefetch(lambda s: None if "static" in s.key else Child(s.key), lambda s: sizes.get(s.key, 1 << 30),
                     depth=3, budget=4 << 30)
    assert ahead.take(files[0:]) is None and started == ["28/wrong/a.py"]  # a gold file is timed: one ahead
    child = ahead.take(files[1:])
    assert child.key == "28/wrong/a.py"
    assert started == ["28/wrong/a.py", "28/wrong/c.py", "28/wrong/d.py"]  # static.py is refused: no child
    assert ahead.take(files[2:]) is None  # the refused file had no child
    # 36's child (3 GiB of arenas) would pass the 4 GiB budget beside c's and d's (1 GiB each): it waits its turn
    assert "36/correct/cute.py" not in started
    assert ahead.take(files[3:]).key == "28/wrong/c.py" and started[-1] == "36/correct/cute.py"
    assert ahead.take(files[4:]).key == "28/wrong/d.py" and not discarded
    # a run cut short by its budget stops whatever is still waiting
    ahead.close()
    assert discarded == ["36/correct/cute.py"] and not ahead.waiting
    # a child whose own arenas pass the budget is never started ahead: it starts in line, alone
    big = [sol("42/correct/cute.py", "gold"), sol("42/correct/tirx.py", "gold")]
    sizes["42/correct/tirx.py"] = 9 << 30
    assert ahead.take(big) is None and "42/correct/tirx.py" not in started
    assert ahead.take(big[1:]) is None
