"""Wrong: computes the answer once (eager, then copied through TIRx) and returns the cached copy ever after.

The first correctness draw passes; the second, on fresh inputs, does not.
Expected: wrong/mismatch
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def copy_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = A[i]


_EXE = []
_CACHE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(copy_bf16, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    if not _CACHE:
        h = x + residual
        hf = h.float()
        _CACHE.append(((hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype), h))
    out, h = torch.empty_like(x), torch.empty_like(x)
    _EXE[0](_CACHE[0][0].view(-1), out.view(-1))
    _EXE[0](_CACHE[0][1].view(-1), h.view(-1))
    return out, h
