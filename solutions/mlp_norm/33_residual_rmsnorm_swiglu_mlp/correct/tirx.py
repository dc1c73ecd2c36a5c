"""Problem 33 (Llama-3 post-attention half-layer: residual add + RMSNorm + SwiGLU MLP), TIRx: three kernels.

1. add_rmsnorm: one CTA per token row; each thread owns 16-byte vectors (8 bf16): 4096 -> 256 threads x 2 vectors
   (small scale 128 -> 32 threads, 16 idle). res = bf16(attn_out + residual) is written out (residual_out); the
   fp32 squares of the rounded sum are reduced by warp xor-shuffles, lane 0 of every warp to shared memory, one
   barrier, every thread adds the partials (works for any warp count); h = bf16(res * rsqrt(mean + eps) * w).
2. swiglu_gemm: SIMT GEMM of h [T, d] with w_gate_up [2f, d] (fp32 accumulation), CTA tile 128 x 128, BK = 32,
   256 threads each owning an 8 x 8 register block. The CTA's 128 B rows are 64 gate rows (w_gate_up[n0 : n0+64])
   and the same 64 up rows (w_gate_up[f + n0 : ...]): loader row r reads w_gate_up[n0 + r % 64 + (r // 64) f].
   A thread's 8 columns are 4 gate columns and the matching 4 up columns, so the epilogue has both:
   g, u = bf16(acc) (F.linear's output), act = bf16(silu(g) * u) in fp32 (SiLU as g / (1 + exp(-g))).
3. down_gemm: the same mainloop for act [T, f] @ w_down^T (K = 14336), epilogue bf16(acc).
Per K step every thread loads 16 contiguous bf16 of A and of B (two 16-byte loads each), widens them to fp32 and
stores them k-major in shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k (16-byte shared loads) and
does 64 FMAs. Rows past T (small scale: 48 tokens in a 128-row tile) are clamped on load and never stored.
One executable per (d, f) and kernel, the token count symbolic; compiled once per process; all launches go to
torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
VEC = 8
MAX_THREADS = 512
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
LD = 16  # bf16 per thread per tile load
HALF = BN // 2


def _make_rmsnorm(d):
    vectors = d // VEC
    tpb = max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))
    nv = (vectors + tpb - 1) // tpb
    nw = tpb // 32

    @Tx.prim_func
    def add_rmsnorm(x_ptr: Tx.handle, r_ptr: Tx.handle, w_ptr: Tx.handle, res_ptr: Tx.handle, h_ptr: Tx.handle):
        M = Tx.int32()
        X = Tx.match_buffer(x_ptr, (M, d), "bfloat16", align=16)
        R = Tx.match_buffer(r_ptr, (M, d), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (d,), "bfloat16", align=16)
        RES = Tx.match_buffer(res_ptr, (M, d), "bfloat16", align=16)
        H = Tx.match_buffer(h_ptr, (M, d), "bfloat16", align=16)
        Tx.device_entry()
        row = Tx.cta_id([M])
        tx = Tx.thread_id([tpb])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        rv = Tx.alloc_local((VEC,), "bfloat16")
        sv = Tx.alloc_local((VEC,), "bfloat16")
        wv = Tx.alloc_local((VEC,), "bfloat16")
        hv = Tx.alloc_local((VEC,), "bfloat16")
        rf = Tx.alloc_local((nv * VEC,), "float32")
        red = Tx.alloc_shared((nw,), "float32")
        sq: Tx.float32 = 0.0
        for q in Tx.unroll(nv):
            for v in Tx.unroll(VEC):
                rf[q * VEC + v] = Tx.float32(0.0)
            if q * tpb + tx < vectors:
                col: Tx.let = (q * tpb + tx) * VEC
                for v in Tx.vectorized(VEC):
                    xv[v] = X[row, col + v]
                for v in Tx.vectorized(VEC):
                    rv[v] = R[row, col + v]
                for v in Tx.unroll(VEC):
                    sv[v] = Tx.cast(Tx.cast(xv[v], "float32") + Tx.cast(rv[v], "float32"), "bfloat16")
                    rf[q * VEC + v] = Tx.cast(sv[v], "float32")
                for v in Tx.vectorized(VEC):
                    RES[row, col + v] = sv[v]
            for v in Tx.unroll(VEC):
                sq = sq + rf[q * VEC + v] * rf[q * VEC + v]
        for k in Tx.unroll(5):  # xor 16, 8, 4, 2, 1
            sq = sq + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sq, 16 >> k, 32, 32)
        if tx % 32 == 0:
            red[tx // 32] = sq
        Tx.cuda.cta_sync()
        total: Tx.float32 = 0.0
        for q in Tx.unroll(nw):
            total = total + red[q]
        rstd: Tx.float32 = Tx.rsqrt(total / Tx.float32(d) + Tx.float32(EPS))
        for q in Tx.unroll(nv):
            if q * tpb + tx < vectors:
                col: Tx.let = (q * tpb + tx) * VEC
                for v in Tx.vectorized(VEC):
                    wv[v] = W[col + v]
                for v in Tx.unroll(VEC):
                    hv[v] = Tx.cast(rf[q * VEC + v] * rstd * Tx.cast(wv[v], "float32"), "bfloat16")
                for v in Tx.vectorized(VEC):
                    H[row, col + v] = hv[v]

    return add_rmsnorm


def _make_swiglu(d, f):
    @Tx.prim_func
    def swiglu_gemm(h_ptr: Tx.handle, w_ptr: Tx.handle, a_ptr: Tx.handle):
        M = Tx.int32()
        H = Tx.match_buffer(h_ptr, (M, d), "bfloat16", align=16)
        WGU = Tx.match_buffer(w_ptr, (2 * f, d), "bfloat16", align=16)
        ACT = Tx.match_buffer(a_ptr, (M, f), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([f // HALF, Tx.ceildiv(M, BM)])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ov = Tx.alloc_local((TN // 2,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, M - 1)  # rows past M read a valid row, never stored
        b_row: Tx.let = bx * HALF + r % HALF + (r // HALF) * f  # gate rows, then the matching up rows
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(d // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = H[a_row, kt * BK + kc + hv8 * 8 + v]
                for v in Tx.vectorized(8):
                    b_ld[hv8 * 8 + v] = WGU[b_row, kt * BK + kc + hv8 * 8 + v]
            for v in Tx.unroll(LD):
                As[kc + v, r] = Tx.cast(a_ld[v], "float32")
                Bs[kc + v, r] = Tx.cast(b_ld[v], "float32")
            Tx.cuda.cta_sync()
            for kk in Tx.unroll(BK):
                for hh in Tx.unroll(2):
                    for i in Tx.vectorized(4):
                        a_frag[hh * 4 + i] = As[kk, ty * TM + hh * 4 + i]
                for j in Tx.vectorized(4):
                    b_frag[j] = Bs[kk, tx * 4 + j]
                for j in Tx.vectorized(4):
                    b_frag[4 + j] = Bs[kk, HALF + tx * 4 + j]
                for i in Tx.unroll(TM):
                    for j in Tx.unroll(TN):
                        acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
            Tx.cuda.cta_sync()
        g: Tx.float32 = 0.0
        u: Tx.float32 = 0.0
        for i in Tx.unroll(TM):
            m: Tx.let = by * BM + ty * TM + i
            if m < M:
                for j in Tx.unroll(TN // 2):
                    g = Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32")
                    u = Tx.cast(Tx.cast(acc[i, 4 + j], "bfloat16"), "float32")
                    ov[j] = Tx.cast(g / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - g)) * u, "bfloat16")
                for j in Tx.vectorized(TN // 2):
                    ACT[m, bx * HALF + tx * 4 + j] = ov[j]

    return swiglu_gemm


def _make_down(d, f):
    @Tx.prim_func
    def down_gemm(a_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle):
        M = Tx.int32()
        ACT = Tx.match_buffer(a_ptr, (M, f), "bfloat16", align=16)
        WD = Tx.match_buffer(w_ptr, (d, f), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (M, d), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([d // BN, Tx.ceildiv(M, BM)])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, M - 1)
        b_row: Tx.let = bx * BN + r
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(f // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = ACT[a_row, kt * BK + kc + hv8 * 8 + v]
                for v in Tx.vectorized(8):
                    b_ld[hv8 * 8 + v] = WD[b_row, kt * BK + kc + hv8 * 8 + v]
            for v in Tx.unroll(LD):
                As[kc + v, r] = Tx.cast(a_ld[v], "float32")
                Bs[kc + v, r] = Tx.cast(b_ld[v], "float32")
            Tx.cuda.cta_sync()
            for kk in Tx.unroll(BK):
                for hh in Tx.unroll(2):
                    for i in Tx.vectorized(4):
                        a_frag[hh * 4 + i] = As[kk, ty * TM + hh * 4 + i]
                    for j in Tx.vectorized(4):
                        b_frag[hh * 4 + j] = Bs[kk, tx * TN + hh * 4 + j]
                for i in Tx.unroll(TM):
                    for j in Tx.unroll(TN):
                        acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
            Tx.cuda.cta_sync()
        col: Tx.let = bx * BN + tx * TN
        for i in Tx.unroll(TM):
            m: Tx.let = by * BM + ty * TM + i
            if m < M:
                for j in Tx.unroll(TN):
                    ov[j] = Tx.cast(acc[i, j], "bfloat16")
                for j in Tx.vectorized(TN):
                    O[m, col + j] = ov[j]

    return down_gemm


_EXES = {}


def _executables(d, f):
    key = (d, f)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exes = (tvm.compile(_make_rmsnorm(d), target=target, tir_pipeline="tirx"),
                tvm.compile(_make_swiglu(d, f), target=target, tir_pipeline="tirx"),
                tvm.compile(_make_down(d, f), target=target, tir_pipeline="tirx"))
        _EXES[key] = exes
    return exes


def solve(attn_out, residual, norm_weight, w_gate_up, w_down):
    """Return (out [T, d], residual_out [T, d]), bf16."""
    t, d = attn_out.shape
    f = w_down.shape[1]
    if d % BN != 0 or d % BK != 0 or f % HALF != 0 or f % BK != 0:
        raise ValueError(f"hidden {d} must be a multiple of {BN} and the intermediate size {f} of {HALF}")
    res = torch.empty_like(attn_out)
    out = torch.empty_like(attn_out)
    if t == 0:
        return out, res
    h = torch.empty((t, d), dtype=attn_out.dtype, device=attn_out.device)
    act = torch.empty((t, f), dtype=attn_out.dtype, device=attn_out.device)
    norm, swiglu, down = _executables(d, f)
    norm(attn_out.contiguous(), residual.contiguous(), norm_weight.contiguous(), res, h)
    swiglu(h, w_gate_up.contiguous(), act)
    down(act, w_down.contiguous(), out)
    return out, res
