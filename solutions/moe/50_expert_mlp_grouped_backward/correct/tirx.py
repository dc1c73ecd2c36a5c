"""Problem 50 (Qwen3-30B-A3B routed experts, EP-8: grouped SwiGLU MLP backward), TIRx: six kernels, all TIRx; no
host synchronisation (the value-dependent group sizes stay on the device).

All GEMMs are tiled SIMT GEMMs with fp32 accumulation: CTA tile 128 x 128, BK = 32, 256 threads each owning an
8 x 8 register block. Per K step every thread stages two 8-element bf16 vectors (16-byte loads) of each operand,
widened to fp32 and stored k-major in shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k (16-byte
shared loads) and does 64 FMAs. An operand is either K-contiguous ([rows, K]: a thread takes 8 consecutive k of
one row, stored transposed) or rows-contiguous ([K, rows]: 8 consecutive rows of one k). Rows/columns past the
matrix are clamped on load and never stored; k past the group's end is zero-filled. The weights are viewed 2-D
([E * rows, cols]). Staging, main loop and the bf16 store are `Tx.inline` helpers shared by the GEMMs.
 0. schedule (one warp): exclusive offsets of tokens_per_expert, and the grouped-M tile table (expert, first row,
    end row) of 128-row tiles, at most N/128 + E entries (the unused tail marked -1: those CTAs skip all work).
 1. h = bf16(X @ W_gate_up[e]^T) [N, 2I] over the tile table (eager bf16 GEMM output, as the reference has it).
 2. da = bf16(dY @ W_down[e]) over the tile table, with the SwiGLU backward in the epilogue: a thread's 8
    columns c.. read gate = h[:, c..] and up = h[:, I + c..]; sig = sigmoid(gate), silu = gate * sig,
    a = bf16(silu * up), dgate = da * up * (sig * (1 + gate * (1 - sig))), dup = da * silu (fp32; TVM's
    fast-math exp/divide in the sigmoid, far below the bf16 rounding), stored as a [N, I] and
    dh = [bf16(dgate), bf16(dup)] [N, 2I].
 3. grad_W_down[e] = dY^T @ a (both operands [K = rows of e, *]): grid (I/128, d/128, E), each CTA loops over
    its expert's rows (an empty expert writes zeros).
 4. grad_W_gate_up[e] = dh^T @ X, the same way: grid (d/128, 2I/128, E).
 5. grad_x = dh @ W_gate_up[e] over the tile table (K = 2I).
Every output rounded once to bf16 from fp32. All sizes are compile-time constants (six executables per shape,
compiled once); launches go to torch's current stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
VEC = 8
UNITS = (BM * BK // VEC) // NT  # staged vectors per thread per operand (2)


@Tx.inline
def _stage(X, sX, tid, r0, kb, k1, kc, R, ld, w):
    """Rows r0..r0+127, k = kb..kb+31 of X into sX [BK, 128] fp32. kc: X is [R, K] (K contiguous), else [K, R]."""
    for p in Tx.unroll(UNITS):
        if kc:
            r: Tx.let = (tid + p * NT) % BM
            q: Tx.let = (tid + p * NT) // BM
            gr: Tx.let = Tx.min(r0 + r, R - 1)
            gk: Tx.let = kb + q * VEC
            if gk < k1:
                for v in Tx.vectorized(VEC):
                    ld[v] = X[gr, gk + v]
                for v in Tx.unroll(VEC):
                    w[v] = Tx.cast(ld[v], "float32")
            else:
                for v in Tx.unroll(VEC):
                    w[v] = Tx.float32(0.0)
            for v in Tx.unroll(VEC):
                sX[q * VEC + v, r] = w[v]
        else:
            seg: Tx.let = (tid + p * NT) % (BM // VEC)
            kr: Tx.let = (tid + p * NT) // (BM // VEC)
            gc: Tx.let = Tx.min(r0 + seg * VEC, R - VEC)
            gk: Tx.let = kb + kr
            if gk < k1:
                for v in Tx.vectorized(VEC):
                    ld[v] = X[gk, gc + v]
                for v in Tx.unroll(VEC):
                    w[v] = Tx.cast(ld[v], "float32")
            else:
                for v in Tx.unroll(VEC):
                    w[v] = Tx.float32(0.0)
            for h in Tx.unroll(2):
                for v in Tx.vectorized(4):
                    sX[kr, seg * VEC + h * 4 + v] = w[h * 4 + v]


@Tx.inline
def _gemm(A, B, sA, sB, acc, a_frag, b_frag, ld, w, tid, m0, n0, k0, k1, boff, a_kc, ra, b_kc, rb):
    """acc[8 x 8] = A[m0:m0+128, k0:k1] @ B[n0:n0+128, boff+k0:boff+k1]^T (B's k shifted by boff)."""
    for i in Tx.unroll(TM):
        for j in Tx.unroll(TN):
            acc[i, j] = Tx.float32(0.0)
    for kt in range((k1 - k0 + BK - 1) // BK):
        _stage(A, sA, tid, m0, k0 + kt * BK, k1, a_kc, ra, ld, w)
        _stage(B, sB, tid, n0, k0 + kt * BK + boff, k1 + boff, b_kc, rb, ld, w)
        Tx.cuda.cta_sync()
        for kk in Tx.unroll(BK):
            for hh in Tx.unroll(2):
                for i in Tx.vectorized(4):
                    a_frag[hh * 4 + i] = sA[kk, (tid // (BN // TN)) * TM + hh * 4 + i]
                for j in Tx.vectorized(4):
                    b_frag[hh * 4 + j] = sB[kk, (tid % (BN // TN)) * TN + hh * 4 + j]
            for i in Tx.unroll(TM):
                for j in Tx.unroll(TN):
                    acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        Tx.cuda.cta_sync()


@Tx.inline
def _store_rows(acc, O, ov, tid, m0, m1, orow, n0, ncols):
    """Rows m0 + i < m1 of the tile to O[orow + i - m0, n0 + ...] as bf16 (columns < ncols only)."""
    if n0 + (tid % (BN // TN)) * TN < ncols:
        for i in Tx.unroll(TM):
            if m0 + (tid // (BN // TN)) * TM + i < m1:
                for j in Tx.unroll(TN):
                    ov[j] = Tx.cast(acc[i, j], "bfloat16")
                for j in Tx.vectorized(TN):
                    O[orow + (tid // (BN // TN)) * TM + i, n0 + (tid % (BN // TN)) * TN + j] = ov[j]


def _max_tiles(n, e):
    return n // BM + e


def _make_schedule(n, e):
    maxt = _max_tiles(n, e)

    @Tx.prim_func
    def schedule(tpe_ptr: Tx.handle, off_ptr: Tx.handle, tt_ptr: Tx.handle):
        TPE = Tx.match_buffer(tpe_ptr, (e,), "int64")
        OFF = Tx.match_buffer(off_ptr, (e + 1,), "int32")
        TT = Tx.match_buffer(tt_ptr, (maxt, 3), "int32")
        Tx.device_entry()
        bx = Tx.cta_id([1])  # noqa: F841
        tid = Tx.thread_id([32])
        sOff = Tx.alloc_shared((e + 1,), "int32")
        sT = Tx.alloc_shared((e + 1,), "int32")
        run = Tx.alloc_local((1,), "int32")
        tr = Tx.alloc_local((1,), "int32")
        ex_id = Tx.alloc_local((1,), "int32")
        ms = Tx.alloc_local((1,), "int32")
        me = Tx.alloc_local((1,), "int32")
        if tid == 0:
            run[0] = 0
            tr[0] = 0
            for ee in range(e):
                sOff[ee] = run[0]
                sT[ee] = tr[0]
                run[0] = run[0] + Tx.cast(TPE[ee], "int32")
                tr[0] = tr[0] + (Tx.cast(TPE[ee], "int32") + BM - 1) // BM
            sOff[e] = run[0]
            sT[e] = tr[0]
        Tx.cuda.cta_sync()
        for q in range((e + 1 + 31) // 32):
            if q * 32 + tid < e + 1:
                OFF[q * 32 + tid] = sOff[q * 32 + tid]
        for q in range((maxt + 31) // 32):
            if q * 32 + tid < maxt:
                ex_id[0] = -1
                for ee in range(e):
                    if sT[ee] <= q * 32 + tid and q * 32 + tid < sT[ee + 1]:
                        ex_id[0] = ee
                ms[0] = 0
                me[0] = 0
                if ex_id[0] >= 0:
                    ms[0] = sOff[ex_id[0]] + (q * 32 + tid - sT[ex_id[0]]) * BM
                    me[0] = Tx.min(ms[0] + BM, sOff[ex_id[0] + 1])
                TT[q * 32 + tid, 0] = ex_id[0]
                TT[q * 32 + tid, 1] = ms[0]
                TT[q * 32 + tid, 2] = me[0]

    return schedule


def _make_h(n, d, e, inter):
    two_i = 2 * inter
    maxt = _max_tiles(n, e)

    @Tx.prim_func
    def h_gemm(x_ptr: Tx.handle, w_ptr: Tx.handle, tt_ptr: Tx.handle, h_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (n, d), "bfloat16", align=16)
        WGU = Tx.match_buffer(w_ptr, (e * two_i, d), "bfloat16", align=16)
        TT = Tx.match_buffer(tt_ptr, (maxt, 3), "int32")
        H = Tx.match_buffer(h_ptr, (n, two_i), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(two_i + BN - 1) // BN, maxt])
        tid = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BK, BM), "float32")
        sB = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ld = Tx.alloc_local((VEC,), "bfloat16")
        w = Tx.alloc_local((VEC,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ex: Tx.let = TT[by, 0]
        if ex >= 0:  # CTA-uniform
            m0: Tx.let = TT[by, 1]
            m1: Tx.let = TT[by, 2]
            _gemm(X, WGU, sA, sB, acc, a_frag, b_frag, ld, w, tid, m0, ex * two_i + bx * BN, 0, d, 0,
                  True, n, True, e * two_i)
            _store_rows(acc, H, ov, tid, m0, m1, m0, bx * BN, two_i)

    return h_gemm


def _make_da(n, d, e, inter):
    two_i = 2 * inter
    maxt = _max_tiles(n, e)

    @Tx.prim_func
    def da_gemm(gy_ptr: Tx.handle, w_ptr: Tx.handle, tt_ptr: Tx.handle, h_ptr: Tx.handle, a_ptr: Tx.handle,
                dh_ptr: Tx.handle):
        GY = Tx.match_buffer(gy_ptr, (n, d), "bfloat16", align=16)
        WD = Tx.match_buffer(w_ptr, (e * d, inter), "bfloat16", align=16)
        TT = Tx.match_buffer(tt_ptr, (maxt, 3), "int32")
        H = Tx.match_buffer(h_ptr, (n, two_i), "bfloat16", align=16)
        ACT = Tx.match_buffer(a_ptr, (n, inter), "bfloat16", align=16)
        DH = Tx.match_buffer(dh_ptr, (n, two_i), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(inter + BN - 1) // BN, maxt])
        tid = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BK, BM), "float32")
        sB = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ld = Tx.alloc_local((VEC,), "bfloat16")
        w = Tx.alloc_local((VEC,), "float32")
        gl = Tx.alloc_local((TN,), "bfloat16")
        ul = Tx.alloc_local((TN,), "bfloat16")
        ao = Tx.alloc_local((TN,), "bfloat16")
        go = Tx.alloc_local((TN,), "bfloat16")
        uo = Tx.alloc_local((TN,), "bfloat16")
        g = Tx.alloc_local((1,), "float32")
        u = Tx.alloc_local((1,), "float32")
        da = Tx.alloc_local((1,), "float32")
        sig = Tx.alloc_local((1,), "float32")
        ex: Tx.let = TT[by, 0]
        if ex >= 0:  # CTA-uniform
            m0: Tx.let = TT[by, 1]
            m1: Tx.let = TT[by, 2]
            _gemm(GY, WD, sA, sB, acc, a_frag, b_frag, ld, w, tid, m0, bx * BN, 0, d, ex * d,
                  True, n, False, inter)
            col: Tx.let = bx * BN + (tid % (BN // TN)) * TN
            if col < inter:
                for i in Tx.unroll(TM):
                    if m0 + (tid // (BN // TN)) * TM + i < m1:
                        for j in Tx.vectorized(TN):
                            gl[j] = H[m0 + (tid // (BN // TN)) * TM + i, col + j]
                        for j in Tx.vectorized(TN):
                            ul[j] = H[m0 + (tid // (BN // TN)) * TM + i, inter + col + j]
                        for j in Tx.unroll(TN):
                            g[0] = Tx.cast(gl[j], "float32")
                            u[0] = Tx.cast(ul[j], "float32")
                            da[0] = Tx.cast(Tx.cast(acc[i, j], "bfloat16"), "float32")
                            sig[0] = Tx.float32(1.0) / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - g[0]))
                            ao[j] = Tx.cast(g[0] * sig[0] * u[0], "bfloat16")
                            go[j] = Tx.cast(da[0] * u[0] * (sig[0] * (Tx.float32(1.0) + g[0] * (Tx.float32(1.0)
                                                                                                 - sig[0]))),
                                            "bfloat16")
                            uo[j] = Tx.cast(da[0] * (g[0] * sig[0]), "bfloat16")
                        for j in Tx.vectorized(TN):
                            ACT[m0 + (tid // (BN // TN)) * TM + i, col + j] = ao[j]
                        for j in Tx.vectorized(TN):
                            DH[m0 + (tid // (BN // TN)) * TM + i, col + j] = go[j]
                        for j in Tx.vectorized(TN):
                            DH[m0 + (tid // (BN // TN)) * TM + i, inter + col + j] = uo[j]

    return da_gemm


def _make_wgrad(n, e, m, ncols):
    """O[e * m + i, j] = sum over expert e's rows k of A[k, i] * B[k, j] (A [n, m], B [n, ncols])."""

    @Tx.prim_func
    def wgrad_gemm(a_ptr: Tx.handle, b_ptr: Tx.handle, off_ptr: Tx.handle, o_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, (n, m), "bfloat16", align=16)
        B = Tx.match_buffer(b_ptr, (n, ncols), "bfloat16", align=16)
        OFF = Tx.match_buffer(off_ptr, (e + 1,), "int32")
        O = Tx.match_buffer(o_ptr, (e * m, ncols), "bfloat16", align=16)
        Tx.device_entry()
        bx, by, bz = Tx.cta_id([(ncols + BN - 1) // BN, (m + BM - 1) // BM, e])
        tid = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BK, BM), "float32")
        sB = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ld = Tx.alloc_local((VEC,), "bfloat16")
        w = Tx.alloc_local((VEC,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        k0: Tx.let = OFF[bz]
        k1: Tx.let = OFF[bz + 1]
        _gemm(A, B, sA, sB, acc, a_frag, b_frag, ld, w, tid, by * BM, bx * BN, k0, k1, 0, False, m, False, ncols)
        _store_rows(acc, O, ov, tid, by * BM, m, bz * m + by * BM, bx * BN, ncols)

    return wgrad_gemm


def _make_gx(n, d, e, inter):
    two_i = 2 * inter
    maxt = _max_tiles(n, e)

    @Tx.prim_func
    def gx_gemm(dh_ptr: Tx.handle, w_ptr: Tx.handle, tt_ptr: Tx.handle, gx_ptr: Tx.handle):
        DH = Tx.match_buffer(dh_ptr, (n, two_i), "bfloat16", align=16)
        WGU = Tx.match_buffer(w_ptr, (e * two_i, d), "bfloat16", align=16)
        TT = Tx.match_buffer(tt_ptr, (maxt, 3), "int32")
        GX = Tx.match_buffer(gx_ptr, (n, d), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(d + BN - 1) // BN, maxt])
        tid = Tx.thread_id([NT])
        sA = Tx.alloc_shared((BK, BM), "float32")
        sB = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        ld = Tx.alloc_local((VEC,), "bfloat16")
        w = Tx.alloc_local((VEC,), "float32")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ex: Tx.let = TT[by, 0]
        if ex >= 0:  # CTA-uniform
            m0: Tx.let = TT[by, 1]
            m1: Tx.let = TT[by, 2]
            _gemm(DH, WGU, sA, sB, acc, a_frag, b_frag, ld, w, tid, m0, bx * BN, 0, two_i, ex * two_i,
                  True, n, False, d)
            _store_rows(acc, GX, ov, tid, m0, m1, m0, bx * BN, d)

    return gx_gemm


_EXES = {}


def _executables(n, d, e, inter):
    key = (n, d, e, inter)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        funcs = (_make_schedule(n, e), _make_h(n, d, e, inter), _make_da(n, d, e, inter),
                 _make_wgrad(n, e, d, inter), _make_wgrad(n, e, 2 * inter, d), _make_gx(n, d, e, inter))
        exes = tuple(tvm.compile(f, target=target, tir_pipeline="tirx") for f in funcs)
        _EXES[key] = exes
    return exes


def solve(x_perm, tokens_per_expert, w_gate_up, w_down, grad_y):
    """Return (grad_x_perm [N, d], grad_w_gate_up [E, 2I, d], grad_w_down [E, d, I]), all bf16."""
    n, d = x_perm.shape
    e, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    if d % VEC != 0 or inter % VEC != 0:
        raise ValueError(f"unsupported shape: d = {d}, intermediate {inter}")
    dev = x_perm.device
    x = x_perm.contiguous()
    gy = grad_y.contiguous()
    tpe = tokens_per_expert.to(torch.int64).contiguous()
    wgu = w_gate_up.contiguous().view(e * two_i, d)
    wd = w_down.contiguous().view(e * d, inter)
    off = torch.empty((e + 1,), dtype=torch.int32, device=dev)
    tiles = torch.empty((_max_tiles(n, e), 3), dtype=torch.int32, device=dev)
    h = torch.empty((n, two_i), dtype=x.dtype, device=dev)
    act = torch.empty((n, inter), dtype=x.dtype, device=dev)
    dh = torch.empty((n, two_i), dtype=x.dtype, device=dev)
    grad_x = torch.empty((n, d), dtype=x.dtype, device=dev)
    grad_wgu = torch.empty((e, two_i, d), dtype=w_gate_up.dtype, device=dev)
    grad_wd = torch.empty((e, d, inter), dtype=w_down.dtype, device=dev)
    if n > 0:
        schedule, hk, dak, gwd, gwgu, gxk = _executables(n, d, e, inter)
        schedule(tpe, off, tiles)
        hk(x, wgu, tiles, h)
        dak(gy, wd, tiles, h, act, dh)
        gwd(gy, act, off, grad_wd.view(e * d, inter))
        gwgu(dh, x, off, grad_wgu.view(e * two_i, d))
        gxk(dh, wgu, tiles, grad_x)
    return grad_x, grad_wgu, grad_wd
