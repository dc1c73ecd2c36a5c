"""Problem 61 (dynamic per-(token, 128-channel group) fp8 e4m3 quantization, UE8M0 scales), TIRx: one kernel.

Grid (T, K / (128 * G)), CTA of 16 * G threads (G groups per CTA: 8 for K = 7168, 4 for K = 512). Each thread
loads one 16-byte vector (8 bf16) of its row; the 16 lanes of a half-warp hold one 128-channel group. The group's
max |x| (exact in fp32) comes from a 16-lane butterfly max (Tx.cuda.warp_max with width 16), clamped at 1e-4.
The scale is the smallest power of two >= amax / 448, read exactly off the bits of amax:
    amax = 1.m * 2^E  ->  s = 2^(E-8) if 1.m <= 1.75 else 2^(E-7)      (448 = 1.75 * 2^8)
x * (1/s) is exact (1/s is a power of two built from the same bits); the cast to e4m3 rounds to nearest even.
The 8 fp8 results are stored as one 8-byte vector; lane 0 of each group writes the fp32 scale.
One executable per K (T symbolic), compiled once per process; launches on torch's current stream.
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


def solve(x):
    """Return (x_q [T, K] float8_e4m3fn, x_scale [T, K/128] float32) for bf16 x [T, K]."""
    t, k = x.shape
    if k % (2 * GROUP) != 0:
        raise ValueError(f"K = {k} must be a multiple of {2 * GROUP}")
    x = x.contiguous()
    x_q = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=x.device)
    x_scale = torch.empty((t, k // GROUP), dtype=torch.float32, device=x.device)
    if t > 0:
        _executable(k)(x, x_q, x_scale)
    return x_q, x_scale
