"""Wrong: a TIRx kernel runs on a scratch buffer nobody reads; the returned values come from eager PyTorch.

Ablation catches it: with every TIRx launch suppressed the outputs are still correct.
Expected: rule_violation/dsl_unused
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def scale2(a_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        A[i] = A[i] * Tx.float32(2.0)


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(scale2, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    scratch = torch.ones(1024, device=x.device)
    _EXE[0](scratch)
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out, h
