"""Problem 39 (Flux single-stream block minus attention: adaLN modulation, modulated LayerNorm, GELU-tanh MLP,
gated output projection), TIRx: four kernels.

1. mod_gemv: mod [B, 3D] = bf16(bf16(silu(vec)) @ w_mod^T + b_mod), a GEMV with B = 2 rows: one warp per output
   feature n (8 per CTA). Lane l walks 16-byte vectors l, l + 32, ... of w_mod[n] (a warp reads 512 contiguous
   bytes per step), recomputes silu(vec[b]) for those 8 k's in fp32 and rounds it to bf16 (F.silu's bf16 output),
   accumulates both samples in fp32; warp xor-shuffles, lane 0 adds the bias and rounds once.
2. ln_mod: one CTA per token row, each thread owns 16-byte vectors: 3072 -> 384 threads x 1 vector (small scale
   64 -> 32 threads, 24 idle). Mean, then the biased variance of (x - mean), in fp32; each reduction is warp
   xor-shuffles, lane 0 of every warp to its own shared buffer, one barrier, every thread adds the partials (12
   warps: Tx.cuda.cta_sum needs a power of two). x_mod = bf16((1 + scale) * (x - mean) * rstd + shift) with scale,
   shift from mod[row // L].
3. mlp_gemm: SIMT GEMM x_mod [T, D] @ w_mlp^T, epilogue v = bf16(acc + b_mlp) (F.linear's output), then
   0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) in fp32 rounded to bf16 -> mlp [T, F].
4. out_gemm: the same GEMM over K = D + F without building the concatenation: K tiles 0 .. D/32 - 1 read A from
   attn, the rest from mlp (B is w_out's contiguous rows throughout). Epilogue: proj = bf16(acc + b_out),
   out = bf16(x + gate * proj) in fp32 with gate from mod[row // L] (rows of one tile may span both samples).
GEMMs: CTA tile 128 x 128, BK = 32, 256 threads each owning an 8 x 8 fp32 register block. Per K step every thread
loads 16 contiguous bf16 of A and of B (two 16-byte loads each), widens them to fp32 and stores them k-major in
shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k (16-byte shared loads) and does 64 FMAs.
Rows / columns past T / N (small scale: 48 tokens; 64 output columns in GEMM 2) are clamped on load, never stored.
All sizes are compile-time constants (four executables per shape, compiled once); launches go to torch's current
stream.
"""

import torch
import tvm
from tvm.script import tirx as Tx

LN_EPS = 1e-6
SQRT_2_OVER_PI = 0.7978845608028654
GELU_KAPPA = 0.044715
VEC = 8
MAX_THREADS = 512
MOD_WARPS = 8
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
NT = (BM // TM) * (BN // TN)  # 256 threads
LD = 16  # bf16 per thread per tile load


def _make_mod(bsz, d):
    nvec = d // VEC
    n_iter = (nvec + 31) // 32
    n_out = 3 * d

    @Tx.prim_func
    def mod_gemv(v_ptr: Tx.handle, w_ptr: Tx.handle, b_ptr: Tx.handle, m_ptr: Tx.handle):
        V = Tx.match_buffer(v_ptr, (bsz, d), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (n_out, d), "bfloat16", align=16)
        BIAS = Tx.match_buffer(b_ptr, (n_out,), "bfloat16", align=16)
        MOD = Tx.match_buffer(m_ptr, (bsz, n_out), "bfloat16", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([n_out // MOD_WARPS])
        tid = Tx.thread_id([32 * MOD_WARPS])
        wv = Tx.alloc_local((VEC,), "bfloat16")
        vv = Tx.alloc_local((VEC,), "bfloat16")
        acc = Tx.alloc_local((bsz,), "float32")
        n: Tx.let = bx * MOD_WARPS + tid // 32
        lane: Tx.let = tid % 32
        for b in Tx.unroll(bsz):
            acc[b] = Tx.float32(0.0)
        for i in Tx.unroll(n_iter):
            if i * 32 + lane < nvec:
                col: Tx.let = (i * 32 + lane) * VEC
                for v in Tx.vectorized(VEC):
                    wv[v] = W[n, col + v]
                for b in Tx.unroll(bsz):
                    for v in Tx.vectorized(VEC):
                        vv[v] = V[b, col + v]
                    for v in Tx.unroll(VEC):
                        xf: Tx.float32 = Tx.cast(vv[v], "float32")
                        s: Tx.float32 = Tx.cast(Tx.cast(xf / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - xf)),
                                                        "bfloat16"), "float32")
                        acc[b] = acc[b] + s * Tx.cast(wv[v], "float32")
        for b in Tx.unroll(bsz):
            tot: Tx.float32 = acc[b]
            for k in Tx.unroll(5):  # xor 16, 8, 4, 2, 1
                tot = tot + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, tot, 16 >> k, 32, 32)
            if lane == 0:
                MOD[b, n] = Tx.cast(tot + Tx.cast(BIAS[n], "float32"), "bfloat16")

    return mod_gemv


def _make_ln_mod(bsz, seq, d):
    vectors = d // VEC
    tpb = max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))
    nv = (vectors + tpb - 1) // tpb
    nw = tpb // 32
    t = bsz * seq

    @Tx.prim_func
    def ln_mod(x_ptr: Tx.handle, m_ptr: Tx.handle, y_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (t, d), "bfloat16", align=16)
        MOD = Tx.match_buffer(m_ptr, (bsz, 3 * d), "bfloat16", align=16)
        Y = Tx.match_buffer(y_ptr, (t, d), "bfloat16", align=16)
        Tx.device_entry()
        row = Tx.cta_id([t])
        tx = Tx.thread_id([tpb])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        shv = Tx.alloc_local((VEC,), "bfloat16")
        scv = Tx.alloc_local((VEC,), "bfloat16")
        yv = Tx.alloc_local((VEC,), "bfloat16")
        rf = Tx.alloc_local((nv * VEC,), "float32")
        red_mean = Tx.alloc_shared((nw,), "float32")
        red_var = Tx.alloc_shared((nw,), "float32")
        sample: Tx.let = row // seq
        s: Tx.float32 = 0.0
        for q in Tx.unroll(nv):
            for v in Tx.unroll(VEC):
                rf[q * VEC + v] = Tx.float32(0.0)
            if q * tpb + tx < vectors:
                col: Tx.let = (q * tpb + tx) * VEC
                for v in Tx.vectorized(VEC):
                    xv[v] = X[row, col + v]
                for v in Tx.unroll(VEC):
                    rf[q * VEC + v] = Tx.cast(xv[v], "float32")
            for v in Tx.unroll(VEC):
                s = s + rf[q * VEC + v]
        for k in Tx.unroll(5):
            s = s + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, s, 16 >> k, 32, 32)
        if tx % 32 == 0:
            red_mean[tx // 32] = s
        Tx.cuda.cta_sync()
        total: Tx.float32 = 0.0
        for q in Tx.unroll(nw):
            total = total + red_mean[q]
        mean: Tx.float32 = total / Tx.float32(d)
        sq: Tx.float32 = 0.0
        for q in Tx.unroll(nv):
            if q * tpb + tx < vectors:
                for v in Tx.unroll(VEC):
                    dv: Tx.float32 = rf[q * VEC + v] - mean
                    sq = sq + dv * dv
        for k in Tx.unroll(5):
            sq = sq + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sq, 16 >> k, 32, 32)
        if tx % 32 == 0:
            red_var[tx // 32] = sq
        Tx.cuda.cta_sync()
        total_sq: Tx.float32 = 0.0
        for q in Tx.unroll(nw):
            total_sq = total_sq + red_var[q]
        rstd: Tx.float32 = Tx.rsqrt(total_sq / Tx.float32(d) + Tx.float32(LN_EPS))
        for q in Tx.unroll(nv):
            if q * tpb + tx < vectors:
                col: Tx.let = (q * tpb + tx) * VEC
                for v in Tx.vectorized(VEC):
                    shv[v] = MOD[sample, col + v]
                for v in Tx.vectorized(VEC):
                    scv[v] = MOD[sample, d + col + v]
                for v in Tx.unroll(VEC):
                    yv[v] = Tx.cast((Tx.cast(scv[v], "float32") + Tx.float32(1.0)) * ((rf[q * VEC + v] - mean) * rstd)
                                    + Tx.cast(shv[v], "float32"), "bfloat16")
                for v in Tx.vectorized(VEC):
                    Y[row, col + v] = yv[v]

    return ln_mod


def _make_mlp(t, d, f):
    @Tx.prim_func
    def mlp_gemm(a_ptr: Tx.handle, w_ptr: Tx.handle, b_ptr: Tx.handle, o_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, (t, d), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (f, d), "bfloat16", align=16)
        BIAS = Tx.match_buffer(b_ptr, (f,), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (t, f), "bfloat16", align=16)
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
        ov = Tx.alloc_local((TN,), "bfloat16")
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
                    a_ld[hv8 * 8 + v] = A[a_row, kt * BK + kc + hv8 * 8 + v]
                for v in Tx.vectorized(8):
                    b_ld[hv8 * 8 + v] = W[b_row, kt * BK + kc + hv8 * 8 + v]
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
                bias_v[j] = BIAS[col + j]
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < t:
                    for j in Tx.unroll(TN):
                        hb: Tx.float32 = Tx.cast(Tx.cast(acc[i, j] + Tx.cast(bias_v[j], "float32"), "bfloat16"),
                                                 "float32")
                        inner: Tx.float32 = Tx.float32(SQRT_2_OVER_PI) * (hb + Tx.float32(GELU_KAPPA) * (hb * hb * hb))
                        ov[j] = Tx.cast(Tx.float32(0.5) * hb * (Tx.float32(1.0) + Tx.tanh(inner)), "bfloat16")
                    for j in Tx.vectorized(TN):
                        O[m, col + j] = ov[j]

    return mlp_gemm


def _make_out(bsz, seq, d, f):
    t = bsz * seq

    @Tx.prim_func
    def out_gemm(at_ptr: Tx.handle, ml_ptr: Tx.handle, w_ptr: Tx.handle, b_ptr: Tx.handle, x_ptr: Tx.handle,
                 m_ptr: Tx.handle, o_ptr: Tx.handle):
        ATT = Tx.match_buffer(at_ptr, (t, d), "bfloat16", align=16)
        MLP = Tx.match_buffer(ml_ptr, (t, f), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (d, d + f), "bfloat16", align=16)
        BIAS = Tx.match_buffer(b_ptr, (d,), "bfloat16", align=16)
        X = Tx.match_buffer(x_ptr, (t, d), "bfloat16", align=16)
        MOD = Tx.match_buffer(m_ptr, (bsz, 3 * d), "bfloat16", align=16)
        O = Tx.match_buffer(o_ptr, (t, d), "bfloat16", align=16)
        Tx.device_entry()
        bx, by = Tx.cta_id([(d + BN - 1) // BN, (t + BM - 1) // BM])
        tid = Tx.thread_id([NT])
        As = Tx.alloc_shared((BK, BM), "float32")
        Bs = Tx.alloc_shared((BK, BN), "float32")
        acc = Tx.alloc_local((TM, TN), "float32")
        a_ld = Tx.alloc_local((LD,), "bfloat16")
        b_ld = Tx.alloc_local((LD,), "bfloat16")
        a_frag = Tx.alloc_local((TM,), "float32")
        b_frag = Tx.alloc_local((TN,), "float32")
        bias_v = Tx.alloc_local((TN,), "bfloat16")
        xv = Tx.alloc_local((TN,), "bfloat16")
        gv = Tx.alloc_local((TN,), "bfloat16")
        ov = Tx.alloc_local((TN,), "bfloat16")
        ty: Tx.let = tid // (BN // TN)
        tx: Tx.let = tid % (BN // TN)
        r: Tx.let = tid % BM
        kc: Tx.let = (tid // BM) * LD
        a_row: Tx.let = Tx.min(by * BM + r, t - 1)
        b_row: Tx.let = Tx.min(bx * BN + r, d - 1)  # small scale: 64 output columns in a 128-column tile
        for i in Tx.unroll(TM):
            for j in Tx.unroll(TN):
                acc[i, j] = Tx.float32(0.0)
        for kt in range((d + f) // BK):
            if kt < d // BK:  # cat([attn, mlp]): the attention columns first, then the MLP columns
                for hv8 in Tx.unroll(2):
                    for v in Tx.vectorized(8):
                        a_ld[hv8 * 8 + v] = ATT[a_row, kt * BK + kc + hv8 * 8 + v]
            else:
                for hv8 in Tx.unroll(2):
                    for v in Tx.vectorized(8):
                        a_ld[hv8 * 8 + v] = MLP[a_row, kt * BK - d + kc + hv8 * 8 + v]
            for hv8 in Tx.unroll(2):
                for v in Tx.vectorized(8):
                    b_ld[hv8 * 8 + v] = W[b_row, kt * BK + kc + hv8 * 8 + v]
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
        if col < d:
            for j in Tx.vectorized(TN):
                bias_v[j] = BIAS[col + j]
            for i in Tx.unroll(TM):
                m: Tx.let = by * BM + ty * TM + i
                if m < t:
                    for j in Tx.vectorized(TN):
                        xv[j] = X[m, col + j]
                    for j in Tx.vectorized(TN):
                        gv[j] = MOD[m // seq, 2 * d + col + j]
                    for j in Tx.unroll(TN):
                        proj: Tx.float32 = Tx.cast(Tx.cast(acc[i, j] + Tx.cast(bias_v[j], "float32"), "bfloat16"),
                                                   "float32")
                        ov[j] = Tx.cast(Tx.cast(xv[j], "float32") + Tx.cast(gv[j], "float32") * proj, "bfloat16")
                    for j in Tx.vectorized(TN):
                        O[m, col + j] = ov[j]

    return out_gemm


_EXES = {}


def _executables(bsz, seq, d, f):
    key = (bsz, seq, d, f)
    exes = _EXES.get(key)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        t = bsz * seq
        exes = tuple(tvm.compile(fn, target=target, tir_pipeline="tirx")
                     for fn in (_make_mod(bsz, d), _make_ln_mod(bsz, seq, d), _make_mlp(t, d, f),
                                _make_out(bsz, seq, d, f)))
        _EXES[key] = exes
    return exes


def solve(x, vec, attn, w_mod, b_mod, w_mlp, b_mlp, w_out, b_out):
    """Return bf16 out [B, L, D] = x + gate * (cat(attn, GELU_tanh(x_mod @ w_mlp^T + b_mlp)) @ w_out^T + b_out)."""
    bsz, seq, d = x.shape
    f = w_mlp.shape[0]
    t = bsz * seq
    if d % BK != 0 or f % BN != 0 or d % VEC != 0:
        raise ValueError(f"unsupported sizes D = {d}, F = {f}")
    dev = x.device
    x2 = x.contiguous().view(t, d)
    mod = torch.empty((bsz, 3 * d), dtype=x.dtype, device=dev)
    x_mod = torch.empty((t, d), dtype=x.dtype, device=dev)
    mlp = torch.empty((t, f), dtype=x.dtype, device=dev)
    out = torch.empty((t, d), dtype=x.dtype, device=dev)
    mod_gemv, ln_mod, mlp_gemm, out_gemm = _executables(bsz, seq, d, f)
    mod_gemv(vec.contiguous(), w_mod.contiguous(), b_mod.contiguous(), mod)
    ln_mod(x2, mod, x_mod)
    mlp_gemm(x_mod, w_mlp.contiguous(), b_mlp.contiguous(), mlp)
    out_gemm(attn.contiguous().view(t, d), mlp, w_out.contiguous(), b_out.contiguous(), x2, mod, out)
    return out.view(bsz, seq, d)
