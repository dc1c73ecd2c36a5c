"""DSL-share padding: eager PyTorch does the residual add and the normalisation, TIRx only multiplies by the
weight, and a second TIRx module burns GPU time copying a 256 MiB scratch buffer nobody reads.

Every older rule passes: the TIRx multiply's values are required (suppress it and the output is poison, randomise
its inputs and the output is noise), no launch argument holds the answer, and with the burn the TIRx kernels are
about 70 % of the profiled GPU time. The per-unit ablation randomises each compiled module's arguments alone: the
outputs stay correct with the burn's inputs randomised, so its time is not DSL work and the share falls far below
50 %.

Category: gate_forgery
Expected: rule_violation/dsl_share
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
    return out, h
