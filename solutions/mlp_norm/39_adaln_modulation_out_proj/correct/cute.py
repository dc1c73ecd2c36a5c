"""Problem 39 (Flux single-stream block minus attention: adaLN modulation, modulated LayerNorm, GELU-tanh MLP,
gated output projection), CuTe DSL: four kernels.

1. _mod_kernel: mod [B, 3D] = bf16(bf16(silu(vec)) @ w_mod^T + b_mod), a GEMV with B = 2 rows: one warp per output
   feature n (8 per CTA). Lane l walks 16-byte vectors l, l + 32, ... of w_mod[n] (a warp reads 512 contiguous
   bytes per step), recomputes silu(vec[b]) for those 8 k's in fp32 and rounds it to bf16 (F.silu's bf16 output),
   and accumulates both samples in fp32; warp butterflies, lane 0 adds the bias and rounds once.
2. _ln_mod_kernel: one CTA per token row, each thread owns 16-byte vectors: 3072 -> 384 threads x 1 vector (small
   scale 64 -> 32 threads, 24 idle). Mean, then the biased variance of (x - mean), in fp32 (warp butterflies, lane
   0 to shared memory, every thread adds the partials; one buffer per reduction); x_mod = bf16((1 + scale) * (x -
   mean) * rstd + shift) with scale, shift from mod[row // L] (fp32 of the bf16 modulation).
3. _mlp_kernel: SIMT GEMM x_mod [T, D] @ w_mlp^T, epilogue v = bf16(acc + b_mlp) (F.linear's output), then
   0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))) in fp32 (PyTorch's tanh-GELU) rounded to bf16 -> mlp [T, F].
4. _out_kernel: the same GEMM over K = D + F with the concatenation never built: K tiles 0 .. D/32 - 1 read A from
   attn, the rest from mlp (B is w_out's contiguous rows throughout). Epilogue: proj = bf16(acc + b_out),
   out = bf16(x + gate * proj) in fp32 with gate from mod[row // L] (rows of one tile may span both samples).
GEMMs: CTA tile 128 x 128, BK = 32, 256 threads each owning an 8 x 8 fp32 register block. Per K step every thread
loads 16 contiguous bf16 of A and of B (two 16-byte loads each), widens them to fp32 and stores them k-major in
shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k and does 64 FMAs (fp32, sequential over K).
Rows / columns past T / N (small scale: 48 tokens; 64 output columns in GEMM 2) are clamped on load, never stored.
Compiled once per shape from fake tensors (TVM-FFI route); all launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

LN_EPS = 1e-6
SQRT_2_OVER_PI = 0.7978845608028654
GELU_KAPPA = 0.044715
VEC = 8  # bf16 per 128-bit access
MAX_THREADS = 512
MOD_WARPS = 8  # output features per CTA of the modulation GEMV
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
LD = 16  # bf16 per thread per tile load (BM * BK / THREADS)


def _threads_for(vectors):
    return max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))


@cute.jit
def _warp_sum(value):
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    return value


@cute.jit
def _cta_sum(value, red: cute.Tensor, warps: cutlass.Constexpr):
    """CTA-wide sum broadcast to every thread; `red` (warps floats) is used by this one reduction only."""
    tidx, _, _ = cute.arch.thread_idx()
    value = _warp_sum(value)
    if tidx % 32 == 0:
        red[tidx // 32] = value
    cute.arch.sync_threads()
    total = cutlass.Float32(0.0)
    for q in cutlass.range_constexpr(warps):
        total = total + red[q]
    return total


@cute.kernel
def _mod_kernel(mVec: cute.Tensor, mW: cute.Tensor, mBias: cute.Tensor, mMod: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    batch, hidden = mVec.shape
    warp = tidx // 32
    lane = tidx % 32
    n = bidx * MOD_WARPS + warp
    nvec = hidden // VEC
    n_iter = (nvec + 31) // 32
    bf16 = mVec.element_type

    acc = cute.make_rmem_tensor(cute.make_layout(batch), cutlass.Float32)
    acc.fill(0.0)
    w_ld = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    v_ld = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    for i in cutlass.range_constexpr(n_iter):
        j = i * 32 + lane
        if j < nvec:
            cute.autovec_copy(cute.local_tile(mW, (1, VEC), (n, j))[0, None], w_ld)
            w = w_ld.load().to(cutlass.Float32)
            for b in cutlass.range_constexpr(batch):
                cute.autovec_copy(cute.local_tile(mVec, (1, VEC), (b, j))[0, None], v_ld)
                v = v_ld.load().to(cutlass.Float32)
                s = (v / (cute.full_like(v, 1.0) + cute.math.exp(-v))).to(bf16).to(cutlass.Float32)
                acc[b] = acc[b] + (s * w).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    bias = mBias[n].to(cutlass.Float32)
    for b in cutlass.range_constexpr(batch):
        total = _warp_sum(acc[b])
        if lane == 0:
            mMod[b, n] = (total + bias).to(mMod.element_type)


@cute.kernel
def _ln_mod_kernel(mX: cute.Tensor, mMod: cute.Tensor, mXm: cute.Tensor, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    tokens, hidden = mX.shape
    seq = tokens // mMod.shape[0]
    sample = row // seq
    vectors = hidden // VEC
    n_iter = (vectors + threads - 1) // threads
    warps = threads // 32
    bf16 = mX.element_type

    rX = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rX.fill(0)
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(cute.local_tile(mX, (1, VEC), (row, j))[0, None], rX[None, i])
    rF = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), cutlass.Float32)
    rF.store(rX.load().to(cutlass.Float32))

    smem = cutlass.memory.SmemAllocator()
    red_mean = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps))
    red_var = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps))
    s = rF.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)  # padding is zero
    mean = _cta_sum(s, red_mean, warps) / hidden
    sq = cutlass.Float32(0.0)
    for i in cutlass.range_constexpr(n_iter):
        if i * threads + tidx < vectors:
            dv = rF[None, i].load() - mean
            sq = sq + (dv * dv).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    rstd = cute.math.rsqrt(_cta_sum(sq, red_var, warps) / hidden + LN_EPS)

    rSh = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    rSc = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    rY = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(cute.local_tile(mMod, (1, VEC), (sample, j))[0, None], rSh)
            cute.autovec_copy(cute.local_tile(mMod, (1, VEC), (sample, vectors + j))[0, None], rSc)
            y = (rF[None, i].load() - mean) * rstd
            xm = (rSc.load().to(cutlass.Float32) + 1.0) * y + rSh.load().to(cutlass.Float32)
            rY.store(xm.to(bf16))
            cute.autovec_copy(rY, cute.local_tile(mXm, (1, VEC), (row, j))[0, None])


@cute.jit
def _k_step(mA: cute.Tensor, a_row, a_kt, mB: cute.Tensor, b_row, b_kt, sA: cute.Tensor, sB: cute.Tensor,
            acc: cute.Tensor, tidx):
    """One BK step: A[a_row, 32 a_kt :] and B[b_row, 32 b_kt :] into shared memory, then 32 rank-1 updates."""
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    r = tidx % BM
    kh = tidx // BM
    kc = kh * LD
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    b_ld = cute.make_rmem_tensor(cute.make_layout(LD), mB.element_type)
    a_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    b_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    cute.autovec_copy(cute.local_tile(mA, (1, LD), (a_row, a_kt * (BK // LD) + kh))[0, None], a_ld)
    cute.autovec_copy(cute.local_tile(mB, (1, LD), (b_row, b_kt * (BK // LD) + kh))[0, None], b_ld)
    a_w.store(a_ld.load().to(cutlass.Float32))
    b_w.store(b_ld.load().to(cutlass.Float32))
    for i in cutlass.range_constexpr(LD):
        sA[kc + i, r] = a_w[i]
        sB[kc + i, r] = b_w[i]
    cute.arch.sync_threads()
    for kk in cutlass.range_constexpr(BK):
        cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
        cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
        for i in cutlass.range_constexpr(TM):
            for j in cutlass.range_constexpr(TN):
                acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
    cute.arch.sync_threads()


@cute.kernel
def _mlp_kernel(mXm: cute.Tensor, mW: cute.Tensor, mBias: cute.Tensor, mMlp: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M, K = mXm.shape
    N = mW.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    a_row = bm * BM + tidx % BM
    if a_row > M - 1:  # rows past M read a valid row, never stored
        a_row = M - 1
    b_row = bn * BN + tidx % BM
    if b_row > N - 1:
        b_row = N - 1
    for kt in range(K // BK):
        _k_step(mXm, a_row, kt, mW, b_row, kt, sA, sB, acc, tidx)

    out_t = mMlp.element_type
    o = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
    bias_ld = cute.make_rmem_tensor(cute.make_layout(TN), mBias.element_type)
    if bn * BN + tx * TN < N:
        cute.autovec_copy(cute.local_tile(mBias, (TN,), (bn * (BN // TN) + tx,)), bias_ld)
        bias = bias_ld.load().to(cutlass.Float32)
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                h = (acc[i, None].load() + bias).to(out_t).to(cutlass.Float32)
                inner = SQRT_2_OVER_PI * (h + GELU_KAPPA * (h * h * h))
                o.store((0.5 * h * (1.0 + cute.math.tanh(inner))).to(out_t))
                cute.autovec_copy(o, cute.local_tile(mMlp, (1, TN), (m, bn * (BN // TN) + tx))[0, None])


@cute.kernel
def _out_kernel(mAttn: cute.Tensor, mMlp: cute.Tensor, mW: cute.Tensor, mBias: cute.Tensor, mX: cute.Tensor,
                mMod: cute.Tensor, mOut: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M, D = mAttn.shape
    F = mMlp.shape[1]
    N = mW.shape[0]
    seq = M // mMod.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    a_row = bm * BM + tidx % BM
    if a_row > M - 1:
        a_row = M - 1
    b_row = bn * BN + tidx % BM
    if b_row > N - 1:  # small scale: 64 output columns in a 128-column tile
        b_row = N - 1
    for kt in range(D // BK):  # cat([attn, mlp]): the attention columns first ...
        _k_step(mAttn, a_row, kt, mW, b_row, kt, sA, sB, acc, tidx)
    for kt in range(F // BK):  # ... then the MLP columns, w_out columns D + 32 kt
        _k_step(mMlp, a_row, kt, mW, b_row, D // BK + kt, sA, sB, acc, tidx)

    out_t = mOut.element_type
    cv = bn * (BN // TN) + tx  # this thread's 8-column vector
    o = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
    bias_ld = cute.make_rmem_tensor(cute.make_layout(TN), mBias.element_type)
    x_ld = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
    g_ld = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
    if cv * TN < N:
        cute.autovec_copy(cute.local_tile(mBias, (TN,), (cv,)), bias_ld)
        bias = bias_ld.load().to(cutlass.Float32)
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                proj = (acc[i, None].load() + bias).to(out_t).to(cutlass.Float32)  # F.linear's bf16 output
                cute.autovec_copy(cute.local_tile(mX, (1, TN), (m, cv))[0, None], x_ld)
                cute.autovec_copy(cute.local_tile(mMod, (1, TN), (m // seq, 2 * (N // TN) + cv))[0, None], g_ld)
                o.store((x_ld.load().to(cutlass.Float32) + g_ld.load().to(cutlass.Float32) * proj).to(out_t))
                cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, cv))[0, None])


def _gemm_grid(m, n):
    return [(n + BN - 1) // BN, (m + BM - 1) // BM, 1]


@cute.jit
def _single_block(mX: cute.Tensor, mVec: cute.Tensor, mAttn: cute.Tensor, mWmod: cute.Tensor, mBmod: cute.Tensor,
                  mWmlp: cute.Tensor, mBmlp: cute.Tensor, mWout: cute.Tensor, mBout: cute.Tensor,
                  mMod: cute.Tensor, mXm: cute.Tensor, mMlp: cute.Tensor, mOut: cute.Tensor, stream):
    t, d = mX.shape
    f = mWmlp.shape[0]
    lt = _threads_for(d // VEC)
    _mod_kernel(mVec, mWmod, mBmod, mMod).launch(grid=[mWmod.shape[0] // MOD_WARPS, 1, 1],
                                                 block=[32 * MOD_WARPS, 1, 1], stream=stream)
    _ln_mod_kernel(mX, mMod, mXm, lt).launch(grid=[t, 1, 1], block=[lt, 1, 1], stream=stream)
    _mlp_kernel(mXm, mWmlp, mBmlp, mMlp).launch(grid=_gemm_grid(t, f), block=[THREADS, 1, 1], stream=stream)
    _out_kernel(mAttn, mMlp, mWout, mBout, mX, mMod, mOut).launch(grid=_gemm_grid(t, d), block=[THREADS, 1, 1],
                                                                  stream=stream)


_COMPILED = {}


def _compiled_for(b, t, d, f):
    key = (b, t, d, f)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(shape):
            order = (1, 0) if len(shape) == 2 else (0,)
            return make_fake_compact_tensor(cutlass.BFloat16, shape, stride_order=order, assumed_align=16)

        fn = cute.compile(_single_block, fake((t, d)), fake((b, d)), fake((t, d)), fake((3 * d, d)), fake((3 * d,)),
                          fake((f, d)), fake((f,)), fake((d, d + f)), fake((d,)), fake((b, 3 * d)), fake((t, d)),
                          fake((t, f)), fake((t, d)), make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, vec, attn, w_mod, b_mod, w_mlp, b_mlp, w_out, b_out):
    """Return bf16 out [B, L, D] = x + gate * (cat(attn, GELU_tanh(x_mod @ w_mlp^T + b_mlp)) @ w_out^T + b_out)."""
    b, seq, d = x.shape
    f = w_mlp.shape[0]
    t = b * seq
    if d % BK != 0 or f % BN != 0 or d % VEC != 0:
        raise ValueError(f"unsupported sizes D = {d}, F = {f}")
    dev = x.device
    mod = torch.empty((b, 3 * d), dtype=x.dtype, device=dev)
    x_mod = torch.empty((t, d), dtype=x.dtype, device=dev)
    mlp = torch.empty((t, f), dtype=x.dtype, device=dev)
    out = torch.empty((t, d), dtype=x.dtype, device=dev)
    _compiled_for(b, t, d, f)(x.contiguous().view(t, d), vec.contiguous(), attn.contiguous().view(t, d),
                              w_mod.contiguous(), b_mod.contiguous(), w_mlp.contiguous(), b_mlp.contiguous(),
                              w_out.contiguous(), b_out.contiguous(), mod, x_mod, mlp, out)
    return out.view(b, seq, d)
