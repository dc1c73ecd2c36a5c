"""Problem 47 (ERNIE-4.5 shared SwiGLU expert + routed combine), TIRx: two SIMT GEMM kernels, both TIRx.

Both are tiled SIMT GEMMs C = A @ B^T (A [M, K], B [N, K], bf16, K contiguous) with fp32 accumulation: CTA tile
128 x 128, BK = 32, 256 threads each owning an 8 x 8 register block. Per K step every thread loads 16 contiguous
bf16 of A and of B (two 16-byte vector loads), widens them to fp32 and stores them k-major in shared memory
(2 x 16 KB); the inner loop reads 8 + 8 fp32 per k (16-byte shared loads) and does 64 FMAs. Rows past T are
clamped on load and never stored.
 1. gate/up + SwiGLU: the B tile's 128 rows are 64 rows of W_gate and the same 64 rows of W_up; a thread's 8
    columns are 4 gate columns and the matching 4 up columns, so the epilogue forms
    h = bf16(bf16(silu(bf16(g))) * bf16(u)) (eager bf16 PyTorch's roundings) and stores 4 bf16 of h [T, 3072].
 2. down projection + combine: acc = h @ W_down^T; the epilogue rounds it to bf16 (the shared output), adds
    sum_j topk_weights[t, j] * expert_out[row_idx[t, j]] (fp32, j = 0..5 in order; 16-byte gathers of the routed
    rows) and rounds once to bf16.
T, d and the intermediate size are compile-time constants (two executables per shape, compiled once); both
launches go to torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
LD = 16  # bf16 per thread per tile load
HALF = BN // 2
TOP_K = 6


def _make_swiglu(t, d, inter):
    @Tx.prim_func
    def swiglu_gemm(x_ptr: Tx.handle, g_ptr: Tx.handle, u_ptr: Tx.handle, h_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (t, d), "bfloat16", align=16)
        WG = Tx.match_buffer(g_ptr, (inter, d), "bfloat16", align=16)
        WU = Tx.match_buffer(u_ptr, (inter, d), "bfloat16", align=16)
        H = Tx.match_buffer(h_ptr, (t, inter), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([inter // HALF, (t + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        hv = Tx.alloc_local((TN // 2,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, t - 1)
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(d // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = X[a_row, kt * BK + kc + hv8 * 8 + v]
            if r < HALF:
                for hv8 in Tx.unroll(2):
                    for v in Tx.vectorized(8):
                        b_ld[hv8 * 8 + v] = WG[bx * HALF + r, kt * BK + kc + hv8 * 8 + v]
            else:
                for hv8 in Tx.unroll(2):
                    for v in Tx.vectorized(8):
                        b_ld[hv8 * 8 + v] = WU[bx * HALF + r - HALF, kt * BK + kc + hv8 * 8 + v]
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
        s: Tx.float32 = 0.0
        for i in Tx.unroll(TM):
            m: Tx.let = by * BM + ty * TM + i
            if m < t:
                for j in Tx.unroll(TN // 2):
                    g = Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32")
                    u = Tx.cast(Tx.cast(acc[i, 4 + j], "bfloat16"), "float32")
                    s = Tx.cast(Tx.cast(g / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - g)), "bfloat16"), "float32")
                    hv[j] = Tx.cast(s * u, "bfloat16")
                for j in Tx.vectorized(TN // 2):
                    H[m, bx * HALF + tx * 4 + j] = hv[j]

    return swiglu_gemm


def _make_down(t, d, inter):
    @Tx.prim_func
    def down_combine(h_ptr: Tx.handle, w_ptr: Tx.handle, e_ptr: Tx.handle, tw_ptr: Tx.handle, ri_ptr: Tx.handle,
                     o_ptr: Tx.handle):
        H = Tx.match_buffer(h_ptr, (t, inter), "bfloat16", align=16)
        WD = Tx.match_buffer(w_ptr, (d, inter), "bfloat16", align=16)
        EO = Tx.match_buffer(e_ptr, (t * TOP_K, d), "bfloat16", align=16)
        TW = Tx.match_buffer(tw_ptr, (t, TOP_K), "float32")
        RI = Tx.match_buffer(ri_ptr, (t, TOP_K), "int64")
        O = Tx.match_buffer(o_ptr, (t, d), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([d // BN, (t + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ev = Tx.alloc_local((TN,), "bfloat16")
        rt = Tx.alloc_local((TN,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, t - 1)
        b_row: Tx.let = bx * BN + r
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(inter // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = H[a_row, kt * BK + kc + hv8 * 8 + v]
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
            if m < t:
                for j in Tx.unroll(TN):
                    rt[j] = Tx.float32(0.0)
                for q in Tx.unroll(TOP_K):
                    row: Tx.let = Tx.cast(RI[m, q], "int32")
                    for j in Tx.vectorized(TN):
                        ev[j] = EO[row, col + j]
                    for j in Tx.unroll(TN):
                        rt[j] = rt[j] + Tx.cast(ev[j], "float32") * TW[m, q]
                for j in Tx.unroll(TN):
                    ov[j] = Tx.cast(Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32") + rt[j], "bfloat16")
                for j in Tx.vectorized(TN):
                    O[m, col + j] = ov[j]

    return down_combine


_EXES = {}


def _executables(t, d, inter):
    key = (t, d, inter)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exes = (tvm.compile(_make_swiglu(t, d, inter), target=target, tir_pipeline="tirx"),
                tvm.compile(_make_down(t, d, inter), target=target, tir_pipeline="tirx"))
        _EXES[key] = exes
    return exes


def solve(x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx):
    """Return bf16 out [T, d] = shared_mlp(x) + sum_j topk_weights[:, j] * expert_out[row_idx[:, j]]."""
    t, d = x.shape
    inter = w_gate.shape[0]
    if d % BN != 0 or d % BK != 0 or inter % HALF != 0 or inter % BK != 0:
        raise ValueError(f"d = {d} must be a multiple of {BN} and the intermediate size {inter} of {HALF}")
    x, w_gate, w_up, w_down, expert_out = (a.contiguous() for a in (x, w_gate, w_up, w_down, expert_out))
    tw = topk_weights.float().contiguous()
    ri = row_idx.contiguous()
    h = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t > 0:
        swiglu, down = _executables(t, d, inter)
        swiglu(x, w_gate, w_up, h)
        down(h, w_down, expert_out, tw, ri, out)
    return out
