"""Wrong: the TIRx kernel never finishes (two nested loops of 2^31 - 1 dependent stores).

The grader must kill the candidate process at its timeout and stay healthy.
Expected: timeout/timeout
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def spin(a_ptr: Tx.handle):
    A = Tx.match_buffer(a_ptr, (1,), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([1])
    tx = Tx.thread_id([1])
    for i in range(2147483647):
        for j in range(2147483647):
            A[0] = A[0] * Tx.float32(0.5) + Tx.float32(1.0)


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(spin, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    acc = torch.zeros(1, device=x.device)
    _EXE[0](acc)
    h = x + residual
    return (h * acc[0].to(h.dtype)), h
