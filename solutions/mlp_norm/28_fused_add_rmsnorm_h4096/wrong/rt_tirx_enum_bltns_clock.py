"""Timer tampering through a module that re-exports builtins: `enum.bltns` is the builtins module.

Its getattr / setattr are attributes, not names, so the static rules once let them through; from there torch's
`sys`, the child's __main__ module and its clock, which this file slows a hundredfold in the grader's eyes (module
attribute writes raise no audit event). On the CPU grader a correct kernel then passed at 41x instead of 0.46x.
The static rules now refuse the builtins' names as attributes and the re-exported module names; a test walks every
allowed import for more.

Category: timer_tamper
Expected: rule_violation/static
"""

import enum

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
B = enum.bltns
_main = B.getattr(B, "_" * 2 + "import" + "_" * 2)("s" + "ys").modules["_" * 2 + "main" + "_" * 2]
_real = B.getattr(_main, "_" + "perf")


def _slow():
    return _real() * 0.01


B.setattr(_main, "_" + "perf", _slow)


@Tx.prim_func
def halve_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = Tx.cast(Tx.cast(A[i], "float32") * Tx.float32(0.5), "bfloat16")


_EXE = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(halve_bf16, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    return _EXE[0]


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    eager = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    out = torch.empty_like(eager)
    h_out = torch.empty_like(h)
    _exe()((2 * eager).reshape(-1), out.view(-1))
    _exe()((2 * h).reshape(-1), h_out.view(-1))
    return out, h_out
