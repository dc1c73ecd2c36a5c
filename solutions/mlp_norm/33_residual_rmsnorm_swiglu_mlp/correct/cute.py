"""Problem 33 (Llama-3 post-attention half-layer: residual add + RMSNorm + SwiGLU MLP), CuTe DSL: three kernels.

1. _add_rmsnorm_kernel: one CTA per token row; each thread owns whole 128-bit vectors (8 bf16): 4096 -> 256
   threads x 2 vectors (small scale 128 -> 32 threads, 16 idle). res = bf16(attn_out + residual) is written out
   (residual_out) and its fp32 squares are summed (warp butterfly, lane 0 to shared memory, every thread adds the
   per-warp partials); h = bf16(res * rsqrt(mean(res^2) + eps) * w) (fp32, rounded once).
2. _swiglu_kernel: SIMT GEMM of h [T, d] with w_gate_up [2f, d] (fp32 accumulation), CTA tile 128 x 128, BK = 32,
   256 threads each owning an 8 x 8 register block. The CTA's 128 B rows are 64 gate rows (w_gate_up[n0 : n0+64])
   and the same 64 up rows (w_gate_up[f + n0 : ...]); a thread's 8 columns are 4 gate columns and the matching 4
   up columns, so the epilogue has both: g, u = bf16(acc) (F.linear's output), act = bf16(silu(g) * u) in fp32
   (SiLU as g / (1 + exp(-g))), 4 bf16 stored into act [T, f].
3. _down_kernel: the same mainloop for act [T, f] @ w_down^T (K = 14336), epilogue bf16(acc).
Per K step every thread loads 16 contiguous bf16 of A and of B (two 16-byte loads each), widens them to fp32 and
stores them k-major in shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k and does 64 FMAs (fp32,
sequential over K). Rows past T (small scale: 48 tokens in a 128-row tile) are clamped on load and never stored.
Compiled once per shape from fake tensors (TVM-FFI route); all launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
VEC = 8  # bf16 per 128-bit access
MAX_THREADS = 512
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
LD = 16  # bf16 per thread per tile load (BM * BK / THREADS)
HALF = BN // 2  # gate (or up) columns per CTA in the SwiGLU GEMM


def _threads_for(vectors):
    return max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))


@cute.jit
def _cta_sum(value, red: cute.Tensor, warps: cutlass.Constexpr):
    """CTA-wide sum broadcast to every thread; `red` (warps floats) is used by this one reduction only."""
    tidx, _, _ = cute.arch.thread_idx()
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    if tidx % 32 == 0:
        red[tidx // 32] = value
    cute.arch.sync_threads()
    total = cutlass.Float32(0.0)
    for q in cutlass.range_constexpr(warps):
        total = total + red[q]
    return total


@cute.kernel
def _add_rmsnorm_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mRes: cute.Tensor, mH: cute.Tensor,
                        threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    hidden = mX.shape[1]
    vectors = hidden // VEC
    n_iter = (vectors + threads - 1) // threads
    warps = threads // 32
    bf16 = mX.element_type

    rX = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rR = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rX.fill(0)
    rR.fill(0)
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(cute.local_tile(mX, (1, VEC), (row, j))[0, None], rX[None, i])
            cute.autovec_copy(cute.local_tile(mR, (1, VEC), (row, j))[0, None], rR[None, i])
    rRes = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rRes.store((rX.load().to(cutlass.Float32) + rR.load().to(cutlass.Float32)).to(bf16))  # the bf16 residual add
    res = rRes.load().to(cutlass.Float32)  # statistics from the rounded sum; padding is zero

    smem = cutlass.memory.SmemAllocator()
    red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps))
    sq = (res * res).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    rstd = cute.math.rsqrt(_cta_sum(sq, red, warps) / hidden + EPS)

    rW = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    rH = cute.make_rmem_tensor(cute.make_layout(VEC), bf16)
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(cute.local_tile(mW, (VEC,), (j,)), rW)
            rH.store((rRes[None, i].load().to(cutlass.Float32) * rstd * rW.load().to(cutlass.Float32)).to(bf16))
            cute.autovec_copy(rRes[None, i], cute.local_tile(mRes, (1, VEC), (row, j))[0, None])
            cute.autovec_copy(rH, cute.local_tile(mH, (1, VEC), (row, j))[0, None])


@cute.jit
def _mainloop(mA: cute.Tensor, mB: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor, acc: cute.Tensor, tidx, m0,
              n0, up_off, split: cutlass.Constexpr):
    """acc += A[m0:m0+128] @ B^T over all of K. split: B rows 0..63 are mB[n0 : n0+64], rows 64..127 are
    mB[up_off + n0 : ...], and a thread's fragment is tile columns 4tx..4tx+3 and 64+4tx..64+4tx+3.
    Else B rows are mB[n0 : n0+128] and the fragment is columns 8tx..8tx+7."""
    M, K = mA.shape
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    b_ld = cute.make_rmem_tensor(cute.make_layout(LD), mB.element_type)
    a_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    b_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)

    r = tidx % BM  # loader: tile row; a warp covers 32 consecutive rows
    kh = tidx // BM  # loader: which 16 of the 32 k values
    kc = kh * LD
    a_row = m0 + r
    if a_row > M - 1:  # rows past M read a valid row, results never stored
        a_row = M - 1
    b_row = n0 + r
    if cutlass.const_expr(split):
        if r >= HALF:
            b_row = up_off + n0 + r - HALF
    for kt in range(K // BK):
        cute.autovec_copy(cute.local_tile(mA, (1, LD), (a_row, kt * (BK // LD) + kh))[0, None], a_ld)
        cute.autovec_copy(cute.local_tile(mB, (1, LD), (b_row, kt * (BK // LD) + kh))[0, None], b_ld)
        a_w.store(a_ld.load().to(cutlass.Float32))
        b_w.store(b_ld.load().to(cutlass.Float32))
        for i in cutlass.range_constexpr(LD):
            sA[kc + i, r] = a_w[i]
            sB[kc + i, r] = b_w[i]
        cute.arch.sync_threads()
        for kk in cutlass.range_constexpr(BK):
            cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
            if cutlass.const_expr(split):
                for j in cutlass.range_constexpr(TN // 2):
                    b_frag[j] = sB[kk, tx * (TN // 2) + j]
                    b_frag[TN // 2 + j] = sB[kk, HALF + tx * (TN // 2) + j]
            else:
                cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
            for i in cutlass.range_constexpr(TM):
                for j in cutlass.range_constexpr(TN):
                    acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        cute.arch.sync_threads()


@cute.kernel
def _swiglu_kernel(mH: cute.Tensor, mWgu: cute.Tensor, mAct: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mH.shape[0]
    inter = mAct.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    _mainloop(mH, mWgu, sA, sB, acc, tidx, bm * BM, bn * HALF, inter, True)

    g = cute.make_rmem_tensor(cute.make_layout(TN // 2), cutlass.Float32)
    u = cute.make_rmem_tensor(cute.make_layout(TN // 2), cutlass.Float32)
    o = cute.make_rmem_tensor(cute.make_layout(TN // 2), mAct.element_type)
    for i in cutlass.range_constexpr(TM):
        m = bm * BM + ty * TM + i
        if m < M:
            for j in cutlass.range_constexpr(TN // 2):
                g[j] = acc[i, j]
                u[j] = acc[i, TN // 2 + j]
            gv = g.load().to(mAct.element_type).to(cutlass.Float32)  # F.linear's bf16 gate / up
            uv = u.load().to(mAct.element_type).to(cutlass.Float32)
            sv = gv / (cute.full_like(gv, 1.0) + cute.math.exp(-gv))  # SiLU in fp32, not rounded
            o.store((sv * uv).to(mAct.element_type))
            cute.autovec_copy(o, cute.local_tile(mAct, (1, TN // 2), (m, bn * (HALF // (TN // 2)) + tx))[0, None])


@cute.kernel
def _down_kernel(mAct: cute.Tensor, mWd: cute.Tensor, mOut: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mAct.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    _mainloop(mAct, mWd, sA, sB, acc, tidx, bm * BM, bn * BN, 0, False)

    o = cute.make_rmem_tensor(cute.make_layout(TN), mOut.element_type)
    for i in cutlass.range_constexpr(TM):
        m = bm * BM + ty * TM + i
        if m < M:
            o.store(acc[i, None].load().to(mOut.element_type))
            cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, bn * (BN // TN) + tx))[0, None])


@cute.jit
def _half_layer(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mWgu: cute.Tensor, mWd: cute.Tensor,
                mRes: cute.Tensor, mH: cute.Tensor, mAct: cute.Tensor, mOut: cute.Tensor, stream):
    t, d = mX.shape
    inter = mWd.shape[1]
    mt = (t + BM - 1) // BM
    nt = _threads_for(d // VEC)
    _add_rmsnorm_kernel(mX, mR, mW, mRes, mH, nt).launch(grid=[t, 1, 1], block=[nt, 1, 1], stream=stream)
    _swiglu_kernel(mH, mWgu, mAct).launch(grid=[inter // HALF, mt, 1], block=[THREADS, 1, 1], stream=stream)
    _down_kernel(mAct, mWd, mOut).launch(grid=[d // BN, mt, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(t, d, inter):
    key = (t, d, inter)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(shape):
            order = (1, 0) if len(shape) == 2 else (0,)
            return make_fake_compact_tensor(cutlass.BFloat16, shape, stride_order=order, assumed_align=16)

        fn = cute.compile(_half_layer, fake((t, d)), fake((t, d)), fake((d,)), fake((2 * inter, d)),
                          fake((d, inter)), fake((t, d)), fake((t, d)), fake((t, inter)), fake((t, d)),
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(attn_out, residual, norm_weight, w_gate_up, w_down):
    """Return (out [T, d], residual_out [T, d]), bf16."""
    t, d = attn_out.shape
    inter = w_down.shape[1]
    if d % BN != 0 or d % BK != 0 or inter % HALF != 0 or inter % BK != 0:
        raise ValueError(f"hidden {d} must be a multiple of {BN} and the intermediate size {inter} of {HALF}")
    res = torch.empty_like(attn_out)
    out = torch.empty_like(attn_out)
    if t == 0:
        return out, res
    h = torch.empty((t, d), dtype=attn_out.dtype, device=attn_out.device)
    act = torch.empty((t, inter), dtype=attn_out.dtype, device=attn_out.device)
    _compiled_for(t, d, inter)(attn_out.contiguous(), residual.contiguous(), norm_weight.contiguous(),
                               w_gate_up.contiguous(), w_down.contiguous(), res, h, act, out)
    return out, res
