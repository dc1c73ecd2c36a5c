"""Red team (session 33, CPU round). DSL-share padding past the per-unit ablation: `rt_tirx_burn_share` with a
burn whose file raises when the burn is ablated, which the grader read as "its values are required".

TIRx only multiplies by the weight; eager PyTorch does the residual add and the normalisation, and a second TIRx
module burns GPU time copying a 256 MiB buffer of ones. After the burn `solve` reads one element of the copy: 1.0 in
every call except where the burn's arguments were randomised (or the burn suppressed), and there it raises. The
per-unit ablation counted the burn as required, its time as TIRx work, and the 50 % share passed.

Now (session 33): a failure in an ablated call is no evidence, and the whole-call ablations ablate the burn too, so
this file fails both ways there: `dsl_unused` (an H100 at ae6cd94). The per-unit ablation still counts a unit that
fails both ways (honest pipelines do); a file that raises only when the burn alone is ablated (telling that from
the whole-call ablation by the multiply's output) is docs/integrity.md hole 4's, bounded by the share rule.

Category: gate_forgery
Expected: rule_violation/dsl_unused
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
BURN_PASSES = 12  # ~0.17 ms each: more than the eager part of the call (~0.9 ms)
BURN_ELEMENTS = 64 * 1024 * 1024  # fp32: 256 MiB


@Tx.prim_func
def scale_by_weight(n_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle):
    rows = Tx.int32()
    N = Tx.match_buffer(n_ptr, (rows, 4096), "float32")
    W = Tx.match_buffer(w_ptr, (4096,), "bfloat16")
    O = Tx.match_buffer(o_ptr, (rows, 4096), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([rows * 16])
    tx = Tx.thread_id([256])
    r: Tx.let = bx // 16
    c: Tx.let = (bx % 16) * 256 + tx
    O[r, c] = Tx.cast(N[r, c] * Tx.cast(W[c], "float32"), "bfloat16")


@Tx.prim_func
def burn(a_ptr: Tx.handle, b_ptr: Tx.handle):
    A = Tx.match_buffer(a_ptr, (BURN_ELEMENTS,), "float32")
    B = Tx.match_buffer(b_ptr, (BURN_ELEMENTS,), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([BURN_ELEMENTS // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    B[i] = A[i]


_EXE = {}
_SCRATCH = {}


def _exe(func):
    key = func  # (the function itself: id() is refused since session 31)
    if key not in _EXE:
        _EXE[key] = tvm.compile(func, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx")
    return _EXE[key]


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)).contiguous()
    out = torch.empty_like(h)
    _exe(scale_by_weight)(normed, weight, out)
    if "a" not in _SCRATCH:
        _SCRATCH["a"] = torch.ones(BURN_ELEMENTS, device=x.device)
        _SCRATCH["b"] = torch.empty_like(_SCRATCH["a"])
    for _ in range(BURN_PASSES):
        _exe(burn)(_SCRATCH["a"], _SCRATCH["b"])
    if x.is_cuda and _SCRATCH["b"][12345].item() != 1.0:  # the burn's arguments randomised (or it was suppressed)
        _SCRATCH["a"].fill_(1.0)  # (a restore leaves it as it was; this is only belt and braces)
        raise RuntimeError("burn ablated")
    return out, h
