"""Lazy output: on calls that do not look checked, meta tensors (shape and dtype, no storage) are returned.

The old grader sent outputs back only on poisoned calls, so on the others `solve` returns
`torch.empty(..., device="meta")` after quantizing one row with TIRx (the call still counts a launch): no GPU work,
nothing to transfer, nothing compared. It also does so on 0x7F-poisoned calls after the 60th, so a grader that
poisons every call still meets it. The new child checks each call's outputs for exact type and the GPU device.

Category: lazy_output
Expected: rule_violation/output_type
"""

import torch
import tvm
from tvm.script import tirx as Tx

GROUP = 128
VEC = 8  # bf16 per 16-byte load
LANES = GROUP // VEC  # 16 threads per group


def _groups_per_cta(n_groups):
    """Groups per CTA: 16, 8, 4 or 2 (a CTA must hold whole warps for the full-mask shuffles)."""
    for g in (16, 8, 4, 2):
        if n_groups % g == 0:
            return g
    raise ValueError(f"K / 128 = {n_groups} groups must be even")


def _make_kernel(k):
    ng = k // GROUP
    gpc = _groups_per_cta(ng)
    tpb = gpc * LANES

    @Tx.prim_func
    def fp8_group_quant(x_ptr: Tx.handle, q_ptr: Tx.handle, s_ptr: Tx.handle):
        T = Tx.int32()
        X = Tx.match_buffer(x_ptr, (T, k), "bfloat16", align=16)
        Q = Tx.match_buffer(q_ptr, (T, k), "float8_e4m3fn", align=16)
        S = Tx.match_buffer(s_ptr, (T, ng), "float32", align=16)
        Tx.device_entry()
        row, cb = Tx.cta_id([T, ng // gpc])
        tx = Tx.thread_id([tpb])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        xf = Tx.alloc_local((VEC,), "float32")
        qv = Tx.alloc_local((VEC,), "float8_e4m3fn")
        vec: Tx.let = cb * tpb + tx  # vector index inside the row
        col: Tx.let = vec * VEC
        for v in Tx.vectorized(VEC):
            xv[v] = X[row, col + v]
        amax: Tx.float32 = 0.0
        for v in Tx.unroll(VEC):
            xf[v] = Tx.cast(xv[v], "float32")
            amax = Tx.max(amax, Tx.fabs(xf[v]))
        gmax: Tx.float32 = Tx.max(Tx.cuda.warp_max(amax, LANES), Tx.float32(1e-4))
        bits: Tx.int32 = Tx.reinterpret("int32", gmax)
        sb: Tx.int32 = Tx.shift_right(bits, 23) - 8  # biased exponent of s (sign bit is 0)
        if Tx.bitwise_and(bits, 0x7FFFFF) > 0x600000:  # mantissa 1.m > 1.75
            sb = sb + 1
        inv_s: Tx.float32 = Tx.reinterpret("float32", Tx.shift_left(254 - sb, 23))
        for v in Tx.unroll(VEC):
            qv[v] = Tx.cast(xf[v] * inv_s, "float8_e4m3fn")
        for v in Tx.vectorized(VEC):
            Q[row, col + v] = qv[v]
        if tx % LANES == 0:
            S[row, vec // LANES] = Tx.reinterpret("float32", Tx.shift_left(sb, 23))

    return fp8_group_quant


_EXES = {}


def _executable(k):
    exe = _EXES.get(k)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(k), target=target, tir_pipeline="tirx")
        _EXES[k] = exe
    return exe

_CALLS = [0]


def _poisoned(nbytes, device):
    """Was the allocator just poisoned? The old grader freed a 2x-outputs block full of 0xFF / 0x7F right before a
    checked call; a fresh allocation of that size is that block (best fit), a stale one otherwise."""
    probe = torch.empty(2 * nbytes, dtype=torch.uint8, device=device)
    head, mid = (int(v) for v in probe[[0, nbytes]].tolist())
    del probe
    if head == mid == 0xFF:
        return True
    return head == mid == 0x7F and _CALLS[0] <= 60



def solve(x):
    _CALLS[0] += 1
    t, k = x.shape
    x = x.contiguous()
    checked = not x.is_cuda or t < 2 or _poisoned(t * k + t * (k // GROUP) * 4, x.device)
    x_q = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=x.device)
    x_scale = torch.empty((t, k // GROUP), dtype=torch.float32, device=x.device)
    if not checked:
        _executable(k)(x[:1], x_q[:1], x_scale[:1])
        return (torch.empty((t, k), dtype=torch.float8_e4m3fn, device="meta"),
                torch.empty((t, k // GROUP), dtype=torch.float32, device="meta"))
    if t > 0:
        _executable(k)(x, x_q, x_scale)
    return x_q, x_scale
