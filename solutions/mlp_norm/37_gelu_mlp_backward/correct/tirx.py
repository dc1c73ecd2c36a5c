"""Problem 37 (backward of Linear-GELU(erf)-Linear with biases, fc1 recomputed), TIRx: five GEMM kernels.

All are SIMT GEMMs with fp32 accumulation: CTA tile 128 x 128, BK = 32, 256 threads each owning an 8 x 8 register
block; per K step both operand tiles are widened to fp32 and stored k-major in shared memory (2 x 16 KB), then 32
rank-1 updates (8 + 8 fp32 reads as 16-byte shared loads, 64 FMAs per k; fp32 sums sequential over K). Two
loaders:
 * k-contiguous rows (an nn.Linear weight or activation read as [rows, K]): thread r = tid % 128 loads 16
   contiguous k of row r (two 16-byte loads); rows past the end are clamped (never stored);
 * row-major [K, cols] operands (K = tokens in the weight gradients, or w1 / w2 used untransposed): thread loads
   8 contiguous columns (16 bytes; 16 threads cover one 128-column row) of K rows kr and kr + 16; past K or past
   the columns the tile gets zeros (T = 12608 = 394 x 32; small scale 51 tokens).
Kernels (T tokens, d = 1024, f = 4096):
 1. fc1   (x [T,d] @ w1^T):     h = bf16(acc + b1) and a = bf16(h * Phi(h)), Phi in fp32 from the bf16 h.
 2. dgrad (grad_out @ w2 [d,f]): d_h = bf16(bf16(acc) * (Phi(h) + h phi(h))) with h re-read from fc1's output.
 3. wgrad (grad_out^T @ a, K = T): grad_w2 [d, f] = bf16(acc); the CTAs of column tile 0 also sum their fp32 A
    tile over k (threads 0..127, one column each, in token order): grad_b2 = bf16(sum_t grad_out).
 4. wgrad (d_h^T @ x, K = T): grad_w1 [f, d], and grad_b1 = bf16(sum_t d_h) the same way.
 5. dgrad (d_h @ w1 [f,d]):     grad_x = bf16(acc).
No float atomics: every output element has one owner and a fixed summation order (deterministic).
All sizes are compile-time constants (four executables per shape, compiled once); launches go to torch's current
stream.
"""

import math

import torch
import tvm
from tvm.script import tirx as Tx

SQRT1_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
LD = 16  # bf16 per thread per k-contiguous tile load
CV = 8  # bf16 per thread per row-major tile load
CPR = BN // CV  # threads per 128-column row: 16
KR = NT // CPR  # rows of a row-major tile per pass: 16


def _make_fc1(t, d, f):
    @Tx.prim_func
    def fc1(x_ptr: Tx.handle, w_ptr: Tx.handle, b_ptr: Tx.handle, h_ptr: Tx.handle, a_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (t, d), "bfloat16", align=16)
        W1 = Tx.match_buffer(w_ptr, (f, d), "bfloat16", align=16)
        B1 = Tx.match_buffer(b_ptr, (f,), "bfloat16", align=16)
        H = Tx.match_buffer(h_ptr, (t, f), "bfloat16", align=16)
        ACT = Tx.match_buffer(a_ptr, (t, f), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(f + BN - 1) // BN, (t + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        bias_v = Tx.alloc_local((TN,), "bfloat16")
        hv = Tx.alloc_local((TN,), "bfloat16")
        av = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, t - 1)  # rows past T read a valid row, never stored
        b_row: Tx.let = Tx.min(bx * BN + r, f - 1)
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(d // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = X[a_row, kt * BK + kc + hv8 * 8 + v]
                for v in Tx.vectorized(8):
                    b_ld[hv8 * 8 + v] = W1[b_row, kt * BK + kc + hv8 * 8 + v]
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
        if col < f:
            for j in Tx.vectorized(TN):
                bias_v[j] = B1[col + j]
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < t:
                    for j in Tx.unroll(TN):
                        hv[j] = Tx.cast(acc[i, j] + Tx.cast(bias_v[j], "float32"), "bfloat16")
                        hf: Tx.float32 = Tx.cast(hv[j], "float32")
                        av[j] = Tx.cast(hf * (Tx.float32(0.5) * (Tx.float32(1.0) + Tx.erf(hf * Tx.float32(SQRT1_2)))),
                                        "bfloat16")
                    for j in Tx.vectorized(TN):
                        H[m, col + j] = hv[j]
                    for j in Tx.vectorized(TN):
                        ACT[m, col + j] = av[j]

    return fc1


def _make_dgrad(t, k_dim, n_dim, f, gelu):
    """out [t, n] = A [t, k] @ B [k, n]; gelu: out = bf16(bf16(acc) * GELU'(h)), h [t, f] with n == f."""

    @Tx.prim_func
    def dgrad(a_ptr: Tx.handle, b_ptr: Tx.handle, h_ptr: Tx.handle, o_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, (t, k_dim), "bfloat16", align=16)
        B = Tx.match_buffer(b_ptr, (k_dim, n_dim), "bfloat16", align=16)
        H = Tx.match_buffer(h_ptr, (t, f), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (t, n_dim), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(n_dim + BN - 1) // BN, (t + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((CV,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        hv = Tx.alloc_local((TN,), "bfloat16")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        kr: Tx.let = tid // CPR
        nc: Tx.let = (tid % CPR) * CV
        a_row: Tx.let = Tx.min(by * BM + r, t - 1)
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(k_dim // BK):
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    a_ld[hv8 * 8 + v] = A[a_row, kt * BK + kc + hv8 * 8 + v]
            for v in Tx.unroll(LD):
                As[kc + v, r] = Tx.cast(a_ld[v], "float32")
            for p in Tx.unroll(BK // KR):
                if bx * BN + nc < n_dim:
                    for v in Tx.vectorized(CV):
                        b_ld[v] = B[kt * BK + kr + p * KR, bx * BN + nc + v]
                    for v in Tx.unroll(CV):
                        Bs[kr + p * KR, nc + v] = Tx.cast(b_ld[v], "float32")
                else:  # columns past N (small scale grad_x: 64 of 128)
                    for v in Tx.unroll(CV):
                        Bs[kr + p * KR, nc + v] = Tx.float32(0.0)
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
        if col < n_dim:
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < t:
                    if gelu:
                        for j in Tx.vectorized(TN):
                            hv[j] = H[m, col + j]
                        for j in Tx.unroll(TN):
                            hf: Tx.float32 = Tx.cast(hv[j], "float32")
                            cdf: Tx.float32 = Tx.float32(0.5) * (Tx.float32(1.0) + Tx.erf(hf * Tx.float32(SQRT1_2)))
                            pdf: Tx.float32 = Tx.exp(Tx.float32(-0.5) * hf * hf) * Tx.float32(INV_SQRT_2PI)
                            gb: Tx.float32 = Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32")
                            ov[j] = Tx.cast(gb * (cdf + hf * pdf), "bfloat16")
                    else:
                        for j in Tx.unroll(TN):
                            ov[j] = Tx.cast(acc[i, j], "bfloat16")
                    for j in Tx.vectorized(TN):
                        O[m, col + j] = ov[j]

    return dgrad


def _make_wgrad(t, m_dim, n_dim):
    """out [m, n] = A^T B with A [t, m], B [t, n]; column tile 0 also writes bias[m] = sum_t A[t, m]."""
    k_tiles = (t + BK - 1) // BK

    @Tx.prim_func
    def wgrad(a_ptr: Tx.handle, b_ptr: Tx.handle, o_ptr: Tx.handle, s_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, (t, m_dim), "bfloat16", align=16)
        B = Tx.match_buffer(b_ptr, (t, n_dim), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (m_dim, n_dim), "bfloat16", align=16)
        S = Tx.match_buffer(s_ptr, (m_dim,), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(n_dim + BN - 1) // BN, (m_dim + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((CV,), "bfloat16")
        b_ld = Tx.alloc_local((CV,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        kr: Tx.let = tid // CPR
        nc: Tx.let = (tid % CPR) * CV
        bsum: Tx.float32 = 0.0
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range(k_tiles):
            for p in Tx.unroll(BK // KR):
                k: Tx.let = kt * BK + kr + p * KR
                if k < t and by * BM + nc < m_dim:
                    for v in Tx.vectorized(CV):
                        a_ld[v] = A[k, by * BM + nc + v]
                    for v in Tx.unroll(CV):
                        As[kr + p * KR, nc + v] = Tx.cast(a_ld[v], "float32")
                else:  # tokens past T, rows past M: zeros
                    for v in Tx.unroll(CV):
                        As[kr + p * KR, nc + v] = Tx.float32(0.0)
                if k < t and bx * BN + nc < n_dim:
                    for v in Tx.vectorized(CV):
                        b_ld[v] = B[k, bx * BN + nc + v]
                    for v in Tx.unroll(CV):
                        Bs[kr + p * KR, nc + v] = Tx.cast(b_ld[v], "float32")
                else:
                    for v in Tx.unroll(CV):
                        Bs[kr + p * KR, nc + v] = Tx.float32(0.0)
            Tx.cuda.cta_sync()
            if bx == 0 and tid < BM:  # the bias gradient: column tid of the A tile, tokens in order
                for kk in Tx.unroll(BK):
                    bsum = bsum + As[kk, tid]
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
        if col < n_dim:
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < m_dim:
                    for j in Tx.unroll(TN):
                        ov[j] = Tx.cast(acc[i, j], "bfloat16")
                    for j in Tx.vectorized(TN):
                        O[m, col + j] = ov[j]
        if bx == 0 and tid < BM:
            if by * BM + tid < m_dim:
                S[by * BM + tid] = Tx.cast(bsum, "bfloat16")

    return wgrad


_EXES = {}


def _executables(t, d, f):
    key = (t, d, f)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        fns = (_make_fc1(t, d, f), _make_dgrad(t, d, f, f, True), _make_wgrad(t, d, f), _make_wgrad(t, f, d),
               _make_dgrad(t, f, d, f, False))
        exes = tuple(tvm.compile(fn, target=target, tir_pipeline="tirx") for fn in fns)
        _EXES[key] = exes
    return exes


def solve(x, w1, b1, w2, b2, grad_out):
    """Return (grad_x, grad_w1, grad_b1, grad_w2, grad_b2), bf16."""
    d = x.shape[-1]
    f = w1.shape[0]
    t = x.numel() // d
    if d % BK != 0 or f % BK != 0 or d % CV != 0 or f % CV != 0:
        raise ValueError(f"unsupported sizes d = {d}, f = {f}")
    dev, dt = x.device, x.dtype
    x2 = x.contiguous().view(t, d)
    g2 = grad_out.contiguous().view(t, d)
    w1c, w2c = w1.contiguous(), w2.contiguous()
    h = torch.empty((t, f), dtype=dt, device=dev)
    act = torch.empty((t, f), dtype=dt, device=dev)
    d_h = torch.empty((t, f), dtype=dt, device=dev)
    grad_x = torch.empty((t, d), dtype=dt, device=dev)
    grad_w1 = torch.empty((f, d), dtype=dt, device=dev)
    grad_b1 = torch.empty((f,), dtype=dt, device=dev)
    grad_w2 = torch.empty((d, f), dtype=dt, device=dev)
    grad_b2 = torch.empty((d,), dtype=dt, device=dev)
    fc1, dgrad_h, wgrad_2, wgrad_1, dgrad_x = _executables(t, d, f)
    fc1(x2, w1c, b1.contiguous(), h, act)
    dgrad_h(g2, w2c, h, d_h)
    wgrad_2(g2, act, grad_w2, grad_b2)
    wgrad_1(d_h, x2, grad_w1, grad_b1)
    dgrad_x(d_h, w1c, h, grad_x)
    return grad_x.view(x.shape), grad_w1, grad_b1, grad_w2, grad_b2
