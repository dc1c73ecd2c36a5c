"""Wrong: a TIRx kernel computes h = x + residual correctly, but one element of the normalised output is NaN.

Expected: wrong/nan
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def add_out(a_ptr: Tx.handle, b_ptr: Tx.handle, c_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    C = Tx.match_buffer(c_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        C[i] = Tx.cast(Tx.cast(A[i], "float32") + Tx.cast(B[i], "float32"), "bfloat16")


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(add_out, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    h = torch.empty_like(x)
    _EXE[0](x.view(-1), residual.view(-1), h.view(-1))
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    out.view(-1)[out.numel() // 2] = float("nan")
    return out, h
