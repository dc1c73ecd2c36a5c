"""Static: torch.compile reached through a computed getattr; Triton (Inductor) does the norm, TIRx only the add.

`getattr(torch, "com" + "pile")` hid torch.compile from the old AST rules (they matched `torch.compile` chains and
import statements only). The TIRx kernel computes h = x + residual (needed: suppress it and both outputs break),
and the compiled function computes the normalised output from h in one Triton kernel. The old grader had no DSL
share rule and no foreign-kernel rule, so this passed. The new rules refuse a getattr whose name is not a constant.

Category: static
Expected: rule_violation/static
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5


@Tx.prim_func
def add_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle, c_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    C = Tx.match_buffer(c_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        C[i] = Tx.cast(Tx.cast(A[i], "float32") + Tx.cast(B[i], "float32"), "bfloat16")


def _norm(h, weight):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(h.dtype)


_STATE = {}


def solve(x, residual, weight):
    if "exe" not in _STATE:
        _STATE["exe"] = tvm.compile(add_bf16, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                    tir_pipeline="tirx")
        _STATE["norm"] = getattr(torch, "com" + "pile")(_norm) if x.is_cuda else _norm
    h = torch.empty_like(x)
    _STATE["exe"](x.reshape(-1), residual.reshape(-1), h.view(-1))
    return _STATE["norm"](h, weight), h
