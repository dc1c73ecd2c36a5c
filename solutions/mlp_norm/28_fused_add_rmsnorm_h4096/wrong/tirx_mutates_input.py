"""Wrong: writes the new residual stream into the `residual` input in place (problem 28 mutates nothing).

The returned values are right; changing an input the problem does not declare in MUTATES is the violation.
Expected: rule_violation/input_mutated
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def add_into(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = Tx.cast(Tx.cast(A[i], "float32") + Tx.cast(B[i], "float32"), "bfloat16")


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(add_into, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    _EXE[0](x.view(-1), residual.view(-1))  # residual now holds h = x + residual
    hf = residual.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out, residual
