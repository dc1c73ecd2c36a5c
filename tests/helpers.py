"""Small builders shared by tests: temporary problem files and family cards."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_problem(root: Path, family: str, name: str, body: str) -> Path:
    """Write `root/<family>/<name>.py` with a docstring and the given body; returns its path."""
    folder = root / family
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text('"""A test problem used by the suite.\n\nProvenance: synthetic.\n"""\nimport torch\n\n'
                    + textwrap.dedent(body), encoding="utf-8")
    return path


SIMPLE = """
def reference(x, w):
    return torch.tanh(x @ w)

def make_inputs(device="cuda", scale="full"):
    return [torch.randn(8, 16, device=device), torch.randn(16, 4, device=device) / 4]

def roofline(x, w):
    return {"flops": 2 * 8 * 16 * 4, "bytes": 4 * (8 * 16 + 16 * 4 + 8 * 4)}
"""


#: A CPU (llvm-target) TIRx kernel y = 2x + b that really runs on CPU tensors; test kernels build on it.
#: A small synthetic problem (y = 2·x + b in fp32) for the grader's CPU tests: the llvm-target TIRx kernel below
#: solves it, and the grader's machinery is what is under test.
AXPB_PROBLEM = """
def reference(x, b):
    return x * 2.0 + b

def make_inputs(device="cuda", scale="full"):
    return [torch.randn(64, 32, device=device), torch.randn(32, device=device)]

def roofline(x, b):
    return {"flops": 2 * x.numel(), "bytes": 4 * (2 * x.numel() + b.numel())}
"""

#: The kernel's imports and signature, shared by its two targets.
_AXPB_HEAD = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def axpb(x_ptr: Tx.handle, b_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, N), "float32")
    B = Tx.match_buffer(b_ptr, (N,), "float32")
    Y = Tx.match_buffer(y_ptr, (M, N), "float32")
'''

AXPB_LLVM = _AXPB_HEAD + '''    for i, j in Tx.grid(M, N):
        Y[i, j] = X[i, j] * Tx.float32(2.0) + B[j]
'''

#: The same y = 2x + b as a CUDA-target TIRx kernel (one CTA per row): what the free check (dry run) is for. Where
#: the kernel is for the GPU, an llvm build of the candidate's own is refused (metakernel/dsl/tirx_host.py).
AXPB_CUDA = _AXPB_HEAD + '''    Tx.device_entry()
    row = Tx.cta_id([M])
    tx = Tx.thread_id([32])
    for c in Tx.serial((N + 31) // 32):
        col: Tx.let = c * 32 + tx
        if col < N:
            Y[row, col] = X[row, col] * Tx.float32(2.0) + B[col]


_EXE = {}


def exe(f):
    key = f
    if key not in _EXE:
        _EXE[key] = tvm.compile(f, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), tir_pipeline="tirx")
    return _EXE[key]
'''
