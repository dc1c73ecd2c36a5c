"""Wrong: the TIRx kernel writes 2 TiB past the end of its output buffer (an illegal address on the GPU).

At 4 GB past (until session 32) the writes landed in memory the grader had mapped by then and the file read
`wrong/mismatch`; 2 TiB is far beyond anything an 80-141 GB card maps.

The candidate's CUDA context dies; the grader reports a runtime error and stays healthy.
Expected: runtime_error/illegal_address
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def wild(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[Tx.Cast("int64", i) + Tx.int64(1 << 40)] = A[i]


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(wild, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    h = x + residual
    out = torch.empty_like(x)
    _EXE[0](h.view(-1), out.view(-1))
    return out, h
