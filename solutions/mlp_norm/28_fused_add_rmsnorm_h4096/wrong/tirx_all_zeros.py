"""Wrong: a TIRx kernel runs and fills both outputs with zeros.

Expected: wrong/mismatch
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def fill_zero(b_ptr: Tx.handle):
    n = Tx.int32()
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = Tx.bfloat16(0.0)


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(fill_zero, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    out, h = torch.empty_like(x), torch.empty_like(x)
    _EXE[0](out.view(-1))
    _EXE[0](h.view(-1))
    return out, h
