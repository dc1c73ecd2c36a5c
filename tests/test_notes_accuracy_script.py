"""scripts/check_notes_accuracy.py (the notes' accuracy figures, measured on the H200) compiles every kernel it
launches there: both DSLs, for sm_90a, on this CPU machine (`--compile-only`, one child process per DSL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_notes_accuracy.py"


def test_every_kernel_of_the_accuracy_script_compiles_for_sm_90a(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--compile-only", "--out", str(tmp_path / "unused.json")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for dsl in ("cute", "tirx"):
        assert f"{dsl}: all kernels compiled" in run.stdout, run.stdout[-4000:]
    rows = [ln for ln in run.stdout.splitlines() if ln.endswith(" compiled") and not ln.endswith("kernels compiled")]
    # 40 today: 11 + 11 accuracy cases, 4 + 4 timing kernels, 5 + 5 shared-memory sizes (228 KB may be refused)
    assert len(rows) >= 38, run.stdout
    assert not (tmp_path / "unused.json").exists()  # compiling writes no report


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message on a machine without CUDA")
def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", "/nonexistent/x.json"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr
