"""Problem 38 (backward of residual add + RMSNorm: grad_hidden and grad_weight), TIRx: two kernels.

Kernel 1: CTA b owns token rows [32 b, 32 b + 32). Each thread owns fixed 16-byte column vectors (8 bf16), 320
threads x 1 vector at hidden 2560 (32 x 1 at small scale), and keeps the weight and its fp32 grad_weight partial for
those columns in registers across the CTA's rows. Per row: load x, residual, grad_y, grad_h; h = x + residual
rounded to bf16 (as the forward stored it); two fp32 sums at once, sum(h^2) and sum(gy * w * h), reduced by warp
xor-shuffles and one shared-memory exchange (every thread adds the per-warp partials; 10 warps is not a power of two,
so Tx.cuda.cta_sum does not apply; a second barrier protects the buffer before the next row). Then
r = rsqrt(sum(h^2)/d + eps), m = r * sum(gy*w*h)/d, grad_hidden = gh + r * (gy*w - h*r*m) rounded once to bf16,
and the partial gw += gy * h * r. The CTA writes its fp32 partial row into a [CTAs, d] scratch.
Kernel 2: deterministic column sum of the scratch: a CTA of 32 warps takes 32 columns, warp k adds rows k, k+32, ...,
the 32 warp sums meet in shared memory and are rounded once to bf16.
Hidden size is a compile-time constant (one executable pair per hidden size; token and CTA counts symbolic).
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-6
VEC = 8  # bf16 lanes per 16-byte access
MAX_THREADS = 512
ROWS_PER_CTA = 32
RED_WARPS = 32


def _make_rows_kernel(n):
    vectors = n // VEC
    tpb = max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))
    nv = (vectors + tpb - 1) // tpb
    nw = tpb // 32

    @Tx.prim_func
    def rmsnorm_bwd_rows(x_ptr: Tx.handle, r_ptr: Tx.handle, w_ptr: Tx.handle, gy_ptr: Tx.handle,
                         gh_ptr: Tx.handle, o_ptr: Tx.handle, p_ptr: Tx.handle):
        M = Tx.int32()
        P = Tx.int32()
        X = Tx.match_buffer(x_ptr, (M, n), "bfloat16", align=16)
        R = Tx.match_buffer(r_ptr, (M, n), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (n,), "bfloat16", align=16)
        GY = Tx.match_buffer(gy_ptr, (M, n), "bfloat16", align=16)
        GH = Tx.match_buffer(gh_ptr, (M, n), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (M, n), "bfloat16", align=16)
        PART = Tx.match_buffer(p_ptr, (P, n), "float32", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([P])
        tx = Tx.thread_id([tpb])
        wv = Tx.alloc_local((VEC,), "bfloat16")
        xv = Tx.alloc_local((VEC,), "bfloat16")
        rv = Tx.alloc_local((VEC,), "bfloat16")
        gyv = Tx.alloc_local((VEC,), "bfloat16")
        ghv = Tx.alloc_local((VEC,), "bfloat16")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        wf = Tx.alloc_local((nv * VEC,), "float32")
        hf = Tx.alloc_local((nv * VEC,), "float32")
        gyf = Tx.alloc_local((nv * VEC,), "float32")
        ghf = Tx.alloc_local((nv * VEC,), "float32")
        acc = Tx.alloc_local((nv * VEC,), "float32")
        red = Tx.alloc_shared((2 * nw,), "float32")
        for c in Tx.unroll(nv):
            for v in Tx.unroll(VEC):
                wf[c * VEC + v] = Tx.float32(0.0)
                acc[c * VEC + v] = Tx.float32(0.0)
            if c * tpb + tx < vectors:
                for v in Tx.vectorized(VEC):
                    wv[v] = W[(c * tpb + tx) * VEC + v]
                for v in Tx.unroll(VEC):
                    wf[c * VEC + v] = Tx.cast(wv[v], "float32")
        for k in range(ROWS_PER_CTA):
            row: Tx.let = bx * ROWS_PER_CTA + k
            if row < M:  # uniform over the CTA
                s_hh: Tx.float32 = 0.0
                s_gh: Tx.float32 = 0.0
                for c in Tx.unroll(nv):
                    for v in Tx.unroll(VEC):
                        hf[c * VEC + v] = Tx.float32(0.0)
                        gyf[c * VEC + v] = Tx.float32(0.0)
                        ghf[c * VEC + v] = Tx.float32(0.0)
                    if c * tpb + tx < vectors:
                        col: Tx.let = (c * tpb + tx) * VEC
                        for v in Tx.vectorized(VEC):
                            xv[v] = X[row, col + v]
                        for v in Tx.vectorized(VEC):
                            rv[v] = R[row, col + v]
                        for v in Tx.vectorized(VEC):
                            gyv[v] = GY[row, col + v]
                        for v in Tx.vectorized(VEC):
                            ghv[v] = GH[row, col + v]
                        for v in Tx.unroll(VEC):
                            hf[c * VEC + v] = Tx.cast(
                                Tx.cast(Tx.cast(xv[v], "float32") + Tx.cast(rv[v], "float32"), "bfloat16"),
                                "float32")
                            gyf[c * VEC + v] = Tx.cast(gyv[v], "float32")
                            ghf[c * VEC + v] = Tx.cast(ghv[v], "float32")
                    for v in Tx.unroll(VEC):
                        s_hh = s_hh + hf[c * VEC + v] * hf[c * VEC + v]
                        s_gh = s_gh + gyf[c * VEC + v] * wf[c * VEC + v] * hf[c * VEC + v]
                for s in Tx.unroll(5):  # xor 16, 8, 4, 2, 1
                    s_hh = s_hh + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, s_hh, 16 >> s, 32, 32)
                    s_gh = s_gh + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, s_gh, 16 >> s, 32, 32)
                if tx % 32 == 0:
                    red[tx // 32] = s_hh
                    red[nw + tx // 32] = s_gh
                Tx.cuda.cta_sync()
                t_hh: Tx.float32 = 0.0
                t_gh: Tx.float32 = 0.0
                for q in Tx.unroll(nw):
                    t_hh = t_hh + red[q]
                    t_gh = t_gh + red[nw + q]
                Tx.cuda.cta_sync()  # all reads done before the next row overwrites `red`
                rr: Tx.float32 = Tx.rsqrt(t_hh / Tx.float32(n) + Tx.float32(EPS))
                m: Tx.float32 = rr * t_gh / Tx.float32(n)
                for c in Tx.unroll(nv):
                    if c * tpb + tx < vectors:
                        for v in Tx.unroll(VEC):
                            hhat: Tx.float32 = hf[c * VEC + v] * rr
                            gw: Tx.float32 = gyf[c * VEC + v] * wf[c * VEC + v]
                            ov[v] = Tx.cast(ghf[c * VEC + v] + rr * (gw - hhat * m), "bfloat16")
                            acc[c * VEC + v] = acc[c * VEC + v] + gyf[c * VEC + v] * hhat
                        for v in Tx.vectorized(VEC):
                            O[row, (c * tpb + tx) * VEC + v] = ov[v]
        for c in Tx.unroll(nv):
            if c * tpb + tx < vectors:
                for v in Tx.vectorized(VEC):
                    PART[bx, (c * tpb + tx) * VEC + v] = acc[c * VEC + v]

    return rmsnorm_bwd_rows


def _make_colsum_kernel(n):
    @Tx.prim_func
    def column_sum(p_ptr: Tx.handle, g_ptr: Tx.handle):
        P = Tx.int32()
        PART = Tx.match_buffer(p_ptr, (P, n), "float32", align=16)
        GW = Tx.match_buffer(g_ptr, (n,), "bfloat16", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([(n + 31) // 32])
        tx = Tx.thread_id([32 * RED_WARPS])
        red = Tx.alloc_shared((RED_WARPS * 32,), "float32")
        col: Tx.let = bx * 32 + tx % 32
        acc: Tx.float32 = 0.0
        if col < n:
            for p in range((P + RED_WARPS - 1) // RED_WARPS):
                if p * RED_WARPS + tx // 32 < P:
                    acc = acc + PART[p * RED_WARPS + tx // 32, col]
        red[tx] = acc
        Tx.cuda.cta_sync()
        if tx < 32:
            total: Tx.float32 = 0.0
            for q in Tx.unroll(RED_WARPS):
                total = total + red[q * 32 + tx]
            if col < n:
                GW[col] = Tx.cast(total, "bfloat16")

    return column_sum


_EXES = {}


def _executables(n):
    exes = _EXES.get(n)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exes = (tvm.compile(_make_rows_kernel(n), target=target, tir_pipeline="tirx"),
                tvm.compile(_make_colsum_kernel(n), target=target, tir_pipeline="tirx"))
        _EXES[n] = exes
    return exes


def solve(x, residual, weight, grad_y, grad_h):
    """Return (grad_hidden [.., d] bf16, grad_weight [d] bf16)."""
    d = x.shape[-1]
    if d % VEC != 0:
        raise ValueError(f"hidden size {d} must be a multiple of {VEC}")
    x2 = x.reshape(-1, d).contiguous()
    r2 = residual.reshape(-1, d).contiguous()
    gy2 = grad_y.reshape(-1, d).contiguous()
    gh2 = grad_h.reshape(-1, d).contiguous()
    parts = (x2.shape[0] + ROWS_PER_CTA - 1) // ROWS_PER_CTA
    grad_hidden = torch.empty_like(x2)
    partial = torch.empty(parts, d, dtype=torch.float32, device=x.device)
    grad_weight = torch.empty(d, dtype=x.dtype, device=x.device)
    rows_exe, colsum_exe = _executables(d)
    rows_exe(x2, r2, weight.contiguous(), gy2, gh2, grad_hidden, partial)
    colsum_exe(partial, grad_weight)
    return grad_hidden.view(x.shape), grad_weight
