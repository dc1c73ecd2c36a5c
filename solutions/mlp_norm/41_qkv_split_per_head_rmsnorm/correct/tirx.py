"""Problem 41 (QKV split + Gemma per-head RMSNorm, scale 1 + w, head_dim 256), TIRx: one warp per head vector.

Work item u = t * (Hq + Hk) + h enumerates the q and k heads of every token (the v columns are never read). The
warp's 32 lanes each load one 16-byte vector (8 bf16) of head h straight from qkv (columns [256 h, 256 h + 256):
k heads follow the q heads, so one formula serves both), sum its squares in fp32, and a butterfly of xor-shuffles
16, 8, 4, 2, 1 gives every lane the head's sum of squares. out = x * rsqrt(sum / 256 + eps) * (1 + w) in fp32,
rounded once to bf16, goes to q[t, h] (q_norm_weight) when h < Hq, else to k[t, h - Hq] (k_norm_weight); the branch
is uniform per warp. A CTA of 256 threads takes 8 items; items past the end load zeros and store nothing. Head
counts are compile-time constants (one executable per qkv width; the token count is symbolic).
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-6
HEAD_DIM = 256
VEC = 8  # bf16 lanes per 16-byte access
TPB = 256
HEADS_PER_CTA = TPB // 32


def _make_kernel(hq, hk):
    width = (hq + 2 * hk) * HEAD_DIM
    heads = hq + hk

    @Tx.prim_func
    def qk_norm(qkv_ptr: Tx.handle, qw_ptr: Tx.handle, kw_ptr: Tx.handle, q_ptr: Tx.handle, k_ptr: Tx.handle):
        T = Tx.int32()
        QKV = Tx.match_buffer(qkv_ptr, (T, width), "bfloat16", align=16)
        QW = Tx.match_buffer(qw_ptr, (HEAD_DIM,), "bfloat16", align=16)
        KW = Tx.match_buffer(kw_ptr, (HEAD_DIM,), "bfloat16", align=16)
        Q = Tx.match_buffer(q_ptr, (T * hq, HEAD_DIM), "bfloat16", align=16)
        K = Tx.match_buffer(k_ptr, (T * hk, HEAD_DIM), "bfloat16", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([Tx.ceildiv(T * heads, HEADS_PER_CTA)])
        tx = Tx.thread_id([TPB])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        wv = Tx.alloc_local((VEC,), "bfloat16")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        xf = Tx.alloc_local((VEC,), "float32")
        item: Tx.let = bx * HEADS_PER_CTA + tx // 32
        t: Tx.let = item // heads
        h: Tx.let = item % heads
        col: Tx.let = (tx % 32) * VEC
        for v in Tx.unroll(VEC):
            xv[v] = Tx.bfloat16(0.0)
            wv[v] = Tx.bfloat16(0.0)
        if t < T:
            for v in Tx.vectorized(VEC):
                xv[v] = QKV[t, h * HEAD_DIM + col + v]
            if h < hq:
                for v in Tx.vectorized(VEC):
                    wv[v] = QW[col + v]
            else:
                for v in Tx.vectorized(VEC):
                    wv[v] = KW[col + v]
        sq: Tx.float32 = 0.0
        for v in Tx.unroll(VEC):
            xf[v] = Tx.cast(xv[v], "float32")
            sq = sq + xf[v] * xf[v]
        for s in Tx.unroll(5):  # xor 16, 8, 4, 2, 1: the whole warp is one head
            sq = sq + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sq, 16 >> s, 32, 32)
        inv_rms: Tx.float32 = Tx.rsqrt(sq / Tx.float32(HEAD_DIM) + Tx.float32(EPS))
        for v in Tx.unroll(VEC):
            ov[v] = Tx.cast(xf[v] * inv_rms * (Tx.float32(1.0) + Tx.cast(wv[v], "float32")), "bfloat16")
        if t < T:
            if h < hq:
                for v in Tx.vectorized(VEC):
                    Q[t * hq + h, col + v] = ov[v]
            else:
                for v in Tx.vectorized(VEC):
                    K[t * hk + h - hq, col + v] = ov[v]

    return qk_norm


_EXES = {}


def _executable(hq, hk):
    key = (hq, hk)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(hq, hk), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


def solve(qkv, q_norm_weight, k_norm_weight):
    """Return (q [T, Hq, 256], k [T, Hk, 256]) bf16, each head Gemma-RMS-normalised."""
    tokens, width = qkv.shape
    hk = width // HEAD_DIM // 4  # (Hq + 2 Hk) heads with Hq = 2 Hk
    hq = 2 * hk
    qkv = qkv.contiguous()
    q = torch.empty(tokens, hq, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, hk, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    if tokens > 0:
        _executable(hq, hk)(qkv, q_norm_weight.contiguous(), k_norm_weight.contiguous(),
                            q.view(tokens * hq, HEAD_DIM), k.view(tokens * hk, HEAD_DIM))
    return q, k
