"""Honest kernels the runtime rules once mis-graded, graded end to end on the CPU (real child, real TIRx llvm
kernels, the real launch gate): each must pass. Session 32's false-positive review found them by reading the gate;
no gold kernel used either pattern, so the GPU validation could not show them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from metakernel.grader.evaluate import GradeOptions, grade
from metakernel.problem import load_problem_file
from tests.helpers import AXPB_PROBLEM, write_problem

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is not installed")

FAST = GradeOptions(draws=5, warmup=1, min_timed=10, max_timed=20, rse_target=0.5, timing_cap_s=10,
                    call_timeout_s=60, start_timeout_s=180, host_gate=0.0, min_timing_s=0.0, baselines=False)

HEAD = '''
import torch
import tvm
from tvm.script import tirx as Tx

_EXE = {}


def exe(f):
    if f not in _EXE:
        _EXE[f] = tvm.compile(f, target="llvm", tir_pipeline="tirx")
    return _EXE[f]
'''

# A scale kept in a tensor between calls (a constant table, a workspace): the suppress ablation garbled it for the
# rest of the grading.
KEPT_TABLE = HEAD + '''

@Tx.prim_func
def scaled(x_ptr: Tx.handle, s_ptr: Tx.handle, b_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, N), "float32")
    S = Tx.match_buffer(s_ptr, (1,), "float32")
    B = Tx.match_buffer(b_ptr, (N,), "float32")
    Y = Tx.match_buffer(y_ptr, (M, N), "float32")
    for i, j in Tx.grid(M, N):
        Y[i, j] = X[i, j] * S[0] + B[j]


_KEPT = []


def solve(x, b):
    if not _KEPT:
        _KEPT.append(torch.full((1,), 2.0, dtype=torch.float32, device=x.device))
    y = torch.empty_like(x)
    exe(scaled)(x, _KEPT[0], b, y)
    return y
'''

HISTOGRAM_PROBLEM = """
def reference(ids):
    return torch.bincount(ids.long(), minlength=64).to(torch.int32)

def make_inputs(device="cuda", scale="full"):
    return [torch.randint(0, 64, (4096,), device=device, dtype=torch.int32)]

def roofline(ids):
    return {"flops": ids.numel(), "bytes": 4 * ids.numel() + 4 * 64}
"""

# Per-bin counts of integer ids (a MoE dispatch's tokens per expert): a shuffle of the ids left them unchanged.
HISTOGRAM = HEAD + '''

@Tx.prim_func
def histogram(i_ptr: Tx.handle, c_ptr: Tx.handle):
    N = Tx.int32()
    I = Tx.match_buffer(i_ptr, (N,), "int32")
    C = Tx.match_buffer(c_ptr, (64,), "int32")
    for k in Tx.serial(64):
        C[k] = 0
    for n in Tx.serial(N):
        C[I[n]] = C[I[n]] + 1


def solve(ids):
    counts = torch.empty(64, dtype=torch.int32, device=ids.device)
    exe(histogram)(ids, counts)
    return counts
'''


@pytest.mark.parametrize("name, family_slug, problem_text, kernel", [
    ("kept_table", "27_axpb", AXPB_PROBLEM, KEPT_TABLE),
    ("histogram", "26_histogram", HISTOGRAM_PROBLEM, HISTOGRAM),
])
def test_an_honest_kernel_passes_every_ablation(tmp_path: Path, name, family_slug, problem_text, kernel):
    problem = load_problem_file(write_problem(tmp_path / "problems", "mlp_norm", family_slug, problem_text))
    path = tmp_path / f"{name}.py"
    path.write_text(kernel, encoding="utf-8")
    report = grade(problem, "tirx", path, device="cpu", options=FAST)
    assert (report.status, report.reason) == ("passed", ""), report.message
    required = "outputs wrong: the DSL's values are required"
    assert report.ablations["suppress"] == report.ablations["randomize"] == required
