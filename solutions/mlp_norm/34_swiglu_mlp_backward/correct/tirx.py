"""Problem 34 (backward of the SwiGLU MLP: grad_x, grad_w_gate_up, grad_w_down), TIRx: 5 GEMM launches.

One generic SIMT GEMM out[M, N] = A[M, K] @ B[N, K]^T with fp32 accumulation, instantiated per product through
two layout flags: A stored K-major ([M, K]) or M-major ([K, M]: the transposed operand of a weight gradient), B
K-major ([N, K]) or N-major ([K, N]). CTA tile 128 x 128, BK = 16, 256 threads each owning 8 x 8 fp32
accumulators (rows 8 ty .., columns 8 tx ..). Per K step every thread loads one 16-byte vector (8 bf16) of A and
one of B: K-major, thread (row tid % 128, k half tid / 128) reads 8 k values of one row; M/N-major, thread
(k row tid / 16, column vector tid % 16) reads 8 consecutive rows (16 threads cover a 256-byte line). Both are
widened to fp32 and stored k-major in shared memory (As[k, m], Bs[k, n], 2 x 8 KB; the M/N-major stores as two
16-byte vectors); the next K step's global loads are issued before the current step's FMAs (register prefetch).
The inner loop reads 8 + 8 fp32 per k (16-byte shared loads) and does 64 FMAs, in k order: every output is one
fp32 sum over k = 0 .. K-1. Rows / columns past M / N are clamped on load and never stored (small scale: f = 320).
Launches (t tokens, d hidden, f intermediate):
 1. H = x @ w_gate_up^T [t, 2f]            (A K-major, B K-major, K = d), rounded to bf16.
 2. d_act = grad_out @ w_down [t, f]       (A K-major, B N-major, K = d); epilogue: d_act rounded to bf16, gate and
    up read from H (columns n, f + n), s = sigmoid(gate), act = bf16(gate s up), d_up = d_act gate s,
    d_gate = d_act up s (1 + gate (1 - s)) in fp32, d_gu = [d_gate, d_up] rounded once to bf16.
 3. grad_w_down = grad_out^T @ act [d, f]  (A M-major, B N-major, K = t).
 4. grad_x = d_gu @ w_gate_up [t, d]       (A K-major, B N-major, K = 2f).
 5. grad_w_gate_up = d_gu^T @ x [2f, d]    (A M-major, B N-major, K = t).
TVM compiles with --use_fast_math: the sigmoid's divide and exp are the approximate ones, far inside the bf16
rounding that follows. All sizes are compile-time constants (one executable per product and shape, compiled once
per process); every launch goes to torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, BK = 128, 128, 16
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
LD = 8  # bf16 per thread per operand per K step
VPR = BM // LD  # 16 vectors of 8 along a 128-wide M/N-major tile row


def _make_gemm(m_, n_, k_, a_kmajor, b_kmajor, swiglu):
    """out [m_, n_] = A @ B^T. swiglu: x0 = H [m_, 2 n_] (gate | up), x1 = d_gu [m_, 2 n_], out = act; else x0 and
    x1 are the output again (unused)."""
    a_shape = (m_, k_) if a_kmajor else (k_, m_)
    b_shape = (n_, k_) if b_kmajor else (k_, n_)
    x_shape = (m_, 2 * n_) if swiglu else (m_, n_)
    nk = k_ // BK

    @Tx.prim_func
    def gemm(a_ptr: Tx.handle, b_ptr: Tx.handle, o_ptr: Tx.handle, x0_ptr: Tx.handle, x1_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, a_shape, "bfloat16", align=16)
        B = Tx.match_buffer(b_ptr, b_shape, "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (m_, n_), "bfloat16", align=16)
        X0 = Tx.match_buffer(x0_ptr, x_shape, "bfloat16", align=16)
        X1 = Tx.match_buffer(x1_ptr, x_shape, "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(n_ + BN - 1) // BN, (m_ + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")  # As[k, m]
        Bs = Tx.alloc_shared((BK, BN), "float32")  # Bs[k, n]
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_w = Tx.alloc_local((LD,), "float32")
        b_w = Tx.alloc_local((LD,), "float32")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ty: Tx.let = tid // (BN // TN)  # 0..15: 8-row strip
        tx: Tx.let = tid % (BN // TN)  # 0..15: 8-column strip
        # K-major loader: tile row r, k offset kc; rows past the extent read a valid row (never stored)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, m_ - 1)
        b_row: Tx.let = Tx.min(bx * BN + r, n_ - 1)
        # M/N-major loader: k row kr, column vector cv (clamped to the last full vector)
        kr: Tx.let = tid // VPR
        cq: Tx.let = tid % VPR
        a_cv: Tx.let = Tx.min(by * VPR + cq, m_ // LD - 1)
        b_cv: Tx.let = Tx.min(bx * VPR + cq, n_ // LD - 1)
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        if a_kmajor:
            for v in Tx.vectorized(LD):
                a_ld[v] = A[a_row, kc + v]
        else:
            for v in Tx.vectorized(LD):
                a_ld[v] = A[kr, a_cv * LD + v]
        if b_kmajor:
            for v in Tx.vectorized(LD):
                b_ld[v] = B[b_row, kc + v]
        else:
            for v in Tx.vectorized(LD):
                b_ld[v] = B[kr, b_cv * LD + v]
        for kt in range(nk):
            for v in Tx.unroll(LD):
                a_w[v] = Tx.cast(a_ld[v], "float32")
                b_w[v] = Tx.cast(b_ld[v], "float32")
            if a_kmajor:
                for v in Tx.unroll(LD):
                    As[kc + v, r] = a_w[v]
            else:
                for h in Tx.unroll(2):
                    for v in Tx.vectorized(4):
                        As[kr, cq * LD + h * 4 + v] = a_w[h * 4 + v]
            if b_kmajor:
                for v in Tx.unroll(LD):
                    Bs[kc + v, r] = b_w[v]
            else:
                for h in Tx.unroll(2):
                    for v in Tx.vectorized(4):
                        Bs[kr, cq * LD + h * 4 + v] = b_w[h * 4 + v]
            Tx.cuda.cta_sync()
            kn: Tx.let = Tx.min(kt + 1, nk - 1)  # prefetch the next K step (the last one reloads itself)
            if a_kmajor:
                for v in Tx.vectorized(LD):
                    a_ld[v] = A[a_row, kn * BK + kc + v]
            else:
                for v in Tx.vectorized(LD):
                    a_ld[v] = A[kn * BK + kr, a_cv * LD + v]
            if b_kmajor:
                for v in Tx.vectorized(LD):
                    b_ld[v] = B[b_row, kn * BK + kc + v]
            else:
                for v in Tx.vectorized(LD):
                    b_ld[v] = B[kn * BK + kr, b_cv * LD + v]
            for kk in Tx.unroll(BK):
                for h in Tx.unroll(2):
                    for i in Tx.vectorized(4):
                        a_frag[h * 4 + i] = As[kk, ty * TM + h * 4 + i]
                    for j in Tx.vectorized(4):
                        b_frag[h * 4 + j] = Bs[kk, tx * TN + h * 4 + j]
                for i in Tx.unroll(TM):
                    for j in Tx.unroll(TN):
                        acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
            Tx.cuda.cta_sync()
        outv = Tx.alloc_local((TN,), "bfloat16")
        g_ld = Tx.alloc_local((TN,), "bfloat16")
        u_ld = Tx.alloc_local((TN,), "bfloat16")
        dgv = Tx.alloc_local((TN,), "bfloat16")
        duv = Tx.alloc_local((TN,), "bfloat16")
        col0: Tx.let = bx * BN + tx * TN
        if col0 < n_:
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < m_:
                    if swiglu:
                        for j in Tx.vectorized(TN):
                            g_ld[j] = X0[m, col0 + j]
                        for j in Tx.vectorized(TN):
                            u_ld[j] = X0[m, n_ + col0 + j]
                        for j in Tx.unroll(TN):
                            da: Tx.float32 = Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32")
                            g: Tx.float32 = Tx.cast(g_ld[j], "float32")
                            u: Tx.float32 = Tx.cast(u_ld[j], "float32")
                            s: Tx.float32 = Tx.float32(1.0) / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - g))
                            outv[j] = Tx.cast(g * s * u, "bfloat16")
                            duv[j] = Tx.cast(da * g * s, "bfloat16")
                            dgv[j] = Tx.cast(da * u * s * (Tx.float32(1.0) + g * (Tx.float32(1.0) - s)), "bfloat16")
                        for j in Tx.vectorized(TN):
                            X1[m, col0 + j] = dgv[j]
                        for j in Tx.vectorized(TN):
                            X1[m, n_ + col0 + j] = duv[j]
                    else:
                        for j in Tx.unroll(TN):
                            outv[j] = Tx.cast(acc[i, j], "bfloat16")
                    for j in Tx.vectorized(TN):
                        O[m, col0 + j] = outv[j]

    return gemm


_EXES = {}


def _executables(t, d, f):
    key = (t, d, f)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        specs = (
            (t, 2 * f, d, True, True, False),  # H = x @ w_gate_up^T
            (t, f, d, True, False, True),  # d_act = grad_out @ w_down -> act, d_gu
            (d, f, t, False, False, False),  # grad_w_down = grad_out^T @ act
            (t, d, 2 * f, True, False, False),  # grad_x = d_gu @ w_gate_up
            (2 * f, d, t, False, False, False),  # grad_w_gate_up = d_gu^T @ x
        )
        exes = tuple(tvm.compile(_make_gemm(*s), target=target, tir_pipeline="tirx") for s in specs)
        _EXES[key] = exes
    return exes


def solve(x, w_gate_up, w_down, grad_out):
    """Return (grad_x [t, d], grad_w_gate_up [2f, d], grad_w_down [d, f]), bf16."""
    t, d = x.shape
    f = w_down.shape[1]
    if t % BK != 0 or d % BK != 0 or f % BK != 0:
        raise ValueError(f"unsupported sizes t = {t}, d = {d}, f = {f} (multiples of {BK} needed)")
    dev, dt = x.device, x.dtype
    x = x.contiguous()
    w_gate_up = w_gate_up.contiguous()
    w_down = w_down.contiguous()
    grad_out = grad_out.contiguous()
    h = torch.empty((t, 2 * f), dtype=dt, device=dev)
    act = torch.empty((t, f), dtype=dt, device=dev)
    d_gu = torch.empty((t, 2 * f), dtype=dt, device=dev)
    grad_x = torch.empty((t, d), dtype=dt, device=dev)
    grad_w_gate_up = torch.empty((2 * f, d), dtype=dt, device=dev)
    grad_w_down = torch.empty((d, f), dtype=dt, device=dev)
    g_h, g_act, g_wd, g_x, g_wgu = _executables(t, d, f)
    g_h(x, w_gate_up, h, h, h)
    g_act(grad_out, w_down, act, h, d_gu)
    g_wd(grad_out, act, grad_w_down, grad_w_down, grad_w_down)
    g_x(d_gu, w_gate_up, grad_x, grad_x, grad_x)
    g_wgu(d_gu, x, grad_w_gate_up, grad_w_gate_up, grad_w_gate_up)
    return grad_x, grad_w_gate_up, grad_w_down
