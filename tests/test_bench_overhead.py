"""scripts/bench_overhead.py (issue 13's harness-overhead measurement): the plain bracket in its own process and
the bound it is judged by. The grader side needs the GPU's gold kernels; this pins the CPU-reachable parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_a_plain_process_times_the_eager_reference():
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_overhead.py"), "--plain", "28", "eager",
                           "--draws", "20", "--device", "cpu"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["n"] == 20 and 0 < row["min_us"] <= row["median_us"]


def test_the_bound_is_the_largest_of_five_us_three_percent_and_twice_the_aa_spread():
    sys.path.insert(0, str(SCRIPTS))
    from bench_overhead import within_bound

    a, b = {"median_us": 100.0}, {"median_us": 102.0}
    assert within_bound(105.9, a, b)["ok"] and within_bound(106.1, a, b)["ok"] is False  # 2 x A/A = 4 < 5 us
    big_a, big_b = {"median_us": 1000.0}, {"median_us": 1000.0}
    assert within_bound(1029.0, big_a, big_b)["ok"] and within_bound(1031.0, big_a, big_b)["ok"] is False  # 3 %
    noisy_a, noisy_b = {"median_us": 100.0}, {"median_us": 110.0}
    assert within_bound(124.0, noisy_a, noisy_b)["ok"]  # 2 x 10 us A/A spread
    assert within_bound(None, a, b)["ok"] is None and within_bound(100.0, {"error": "x"}, b)["ok"] is None


def test_a_plain_process_takes_the_graders_pieces_one_by_one():
    """`--layers`: the audit hook and the poison fill of the grader's child added to the plain bracket, audit events
    inside the window counted (the eager reference raises none: torch's operators are not audited)."""
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_overhead.py"), "--plain", "28", "eager",
                           "--draws", "20", "--device", "cpu", "--layers", "guard,poison"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["n"] == 20 and row["layers"] == ["guard", "poison"] and row["audit_events_per_call"] == {}
    bad = subprocess.run([sys.executable, str(SCRIPTS / "bench_overhead.py"), "--plain", "28", "eager",
                          "--device", "cpu", "--layers", "gate"], capture_output=True, text=True, timeout=300,
                         check=False)
    assert bad.returncode != 0 and "needs a kernel file" in bad.stderr


def test_the_rows_layer_times_draws_in_rows_as_the_grader_does():
    """`--layers rows`: the plain twin of the grader's timed rows (ROW draws made first, called back to back, a
    sample the mean of the calls after the first, as protocol 5 scores them), so a residual between the grader and
    the plain bracket can be split between the rows and the child; the first calls and the host probe reported."""
    from metakernel.grader.timing import ROW

    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_overhead.py"), "--plain", "28", "eager",
                           "--draws", str(5 * ROW), "--device", "cpu", "--layers", "rows,poison"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["n"] == 5 and row["calls_per_sample"] == ROW - 1 and 0 < row["min_us"] <= row["median_us"]
    assert row["first_call_median_us"] > 0 and row["all_calls_median_us"] > 0
    assert 0 < row["kept_share"] <= 1 and 0 < row["probe_fast_us"] <= row["probe_median_us"]


def test_study_patches_change_the_chunk_and_skip_phases_only_while_they_last():
    """The overhead study's grader variants that are not GradeOptions (draws per timed request, no ablations or
    audit) change this process's grader modules and leave them as they were."""
    sys.path.insert(0, str(SCRIPTS))
    from bench_overhead import GRADER_STUDY, _study_patches

    from metakernel.grader import evaluate, timing

    chunk, ablation = timing.ROW, evaluate.Evaluation.ablation
    with _study_patches(chunk=GRADER_STUDY["chunk_16"]["chunk"], phases=False):
        assert timing.row_size(64) == 16 and timing.row_size(3) == 3
        assert evaluate.Evaluation.ablation(object()) is None  # type: ignore[arg-type]
    assert timing.ROW == chunk and evaluate.Evaluation.ablation is ablation


def test_the_mask_layer_unmasks_each_later_draw_before_its_call():
    """`--layers rows,mask`: the plain twin of protocol 4's masked rows; values stay right (the reference's own
    outputs are not checked here, so the layer's XOR pair is checked directly)."""
    import torch

    sys.path.insert(0, str(SCRIPTS))
    from bench_overhead import _xor_draw

    draw = [torch.randn(64, 32), torch.randint(0, 9, (17,)), 3]
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in draw]
    _xor_draw(draw, 5, "cpu")
    assert not torch.equal(draw[0], before[0]) and not torch.equal(draw[1], before[1])
    _xor_draw(draw, 5, "cpu")
    assert torch.equal(draw[0], before[0]) and torch.equal(draw[1], before[1]) and draw[2] == 3
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_overhead.py"), "--plain", "28", "eager",
                           "--draws", "8", "--device", "cpu", "--layers", "rows,mask"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["layers"] == ["mask", "rows"] and row["n"] >= 1 and row["median_us"] > 0
