"""Problem 34, backward of the SwiGLU MLP (grad_x, grad_w_gate_up, grad_w_down), in CuTe DSL: 5 GEMM launches.

One generic SIMT GEMM kernel out[M, N] = A[M, K] @ B[N, K]^T with fp32 accumulation, reused for every product
through two layout flags: A is stored K-major ([M, K], row-major) or M-major ([K, M]: the transposed operand of a
weight gradient), B K-major ([N, K]) or N-major ([K, N]). CTA tile 128 x 128, BK = 16, 256 threads each owning
8 x 8 fp32 accumulators (rows 8 ty .. 8 ty + 7, columns 8 tx .. 8 tx + 7). Per K step every thread loads one
16-byte vector (8 bf16) of A and one of B: K-major, thread (row r = tid % 128, k half tid / 128) reads 8 k values
of one row (a warp covers 32 rows); M/N-major, thread (k row tid / 16, column vector tid % 16) reads 8
consecutive rows (16 threads cover a 256-byte line). Both are widened to fp32 and stored k-major in shared
memory (sA[k, m], sB[k, n], 2 x 8 KB); the next K step's global loads are issued before the FMAs of the current
one (register prefetch). The inner loop reads 8 + 8 fp32 per k and does 64 FMAs, in k order: every output is one
fp32 sum over k = 0 .. K-1. Rows / columns past M / N are clamped on load and never stored (the small scale has
a partial tile, f = 320).
Launches (t tokens, d hidden, f intermediate; all bf16 in, bf16 out):
 1. H = x @ w_gate_up^T [t, 2f]              (A K-major, B K-major, K = d), rounded to bf16 (the recomputed GEMM).
 2. d_act = grad_out @ w_down [t, f]         (A K-major, B N-major, K = d); epilogue: d_act rounded to bf16, gate
    and up read from H (columns n and f + n), s = sigmoid(gate), act = bf16(gate s up), d_up = d_act gate s,
    d_gate = d_act up s (1 + gate (1 - s)) in fp32, d_gu = [d_gate, d_up] rounded once to bf16.
 3. grad_w_down = grad_out^T @ act [d, f]    (A M-major, B N-major, K = t).
 4. grad_x = d_gu @ w_gate_up [t, d]         (A K-major, B N-major, K = 2f).
 5. grad_w_gate_up = d_gu^T @ x [2f, d]      (A M-major, B N-major, K = t).
The weight gradients sum K = t = 4096 products in fp32 (one accumulator per output), rounded once to bf16.
Shapes are compile-time constants (one compile per shape, TVM-FFI route, torch's current stream).
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BM, BN, BK = 128, 128, 16
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
LD = 8  # bf16 per thread per operand per K step (BM * BK / THREADS)
VPR = BM // LD  # 16 vectors of 8 along a 128-wide M/N-major tile row

EPI_STORE = 0  # out = bf16(acc)
EPI_SWIGLU_BWD = 1  # d_act = bf16(acc) -> act, d_gu


@cute.jit
def _gload(mX: cute.Tensor, buf: cute.Tensor, kmajor: cutlass.Constexpr, tidx, t0, extent, kt):
    """Global -> registers: this thread's 8 bf16 of the operand tile at tile origin t0 (rows of A / B), K step kt.
    K-major mX [extent, K]; M/N-major mX [K, extent]. Rows / columns past `extent` are clamped."""
    if cutlass.const_expr(kmajor):
        row = t0 + tidx % BM
        if row > extent - 1:
            row = extent - 1
        cute.autovec_copy(cute.local_tile(mX, (1, LD), (row, kt * (BK // LD) + tidx // BM))[0, None], buf)
    else:
        cv = t0 // LD + tidx % VPR
        if cv > extent // LD - 1:
            cv = extent // LD - 1
        cute.autovec_copy(cute.local_tile(mX, (1, LD), (kt * BK + tidx // VPR, cv))[0, None], buf)


@cute.jit
def _sstore(sX: cute.Tensor, wide: cute.Tensor, kmajor: cutlass.Constexpr, tidx):
    """Registers (fp32) -> shared memory sX[k, m], the layout the inner loop reads."""
    if cutlass.const_expr(kmajor):
        r = tidx % BM
        kc = (tidx // BM) * LD
        for i in cutlass.range_constexpr(LD):
            sX[kc + i, r] = wide[i]
    else:
        cute.autovec_copy(wide, cute.local_tile(sX[tidx // VPR, None], (LD,), (tidx % VPR,)))


@cute.kernel
def _gemm_kernel(mA: cute.Tensor, mB: cute.Tensor, mOut: cute.Tensor, mX0: cute.Tensor, mX1: cute.Tensor,
                 K: cutlass.Constexpr, a_kmajor: cutlass.Constexpr, b_kmajor: cutlass.Constexpr,
                 epi: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mOut.shape[0]
    N = mOut.shape[1]
    tx = tidx % (BN // TN)  # 0..15: 8-column strip
    ty = tidx // (BN // TN)  # 0..15: 8-row strip
    m0 = bm * BM
    n0 = bn * BN

    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)

    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    b_ld = cute.make_rmem_tensor(cute.make_layout(LD), mB.element_type)
    a_wide = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    b_wide = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)

    nk = K // BK
    _gload(mA, a_ld, a_kmajor, tidx, m0, M, 0)
    _gload(mB, b_ld, b_kmajor, tidx, n0, N, 0)
    for kt in range(nk):
        a_wide.store(a_ld.load().to(cutlass.Float32))
        b_wide.store(b_ld.load().to(cutlass.Float32))
        _sstore(sA, a_wide, a_kmajor, tidx)
        _sstore(sB, b_wide, b_kmajor, tidx)
        cute.arch.sync_threads()
        kn = kt + 1  # prefetch the next K step (the last step reloads itself; harmless)
        if kn > nk - 1:
            kn = nk - 1
        _gload(mA, a_ld, a_kmajor, tidx, m0, M, kn)
        _gload(mB, b_ld, b_kmajor, tidx, n0, N, kn)
        for kk in cutlass.range_constexpr(BK):
            cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
            cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
            for i in cutlass.range_constexpr(TM):
                for j in cutlass.range_constexpr(TN):
                    acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        cute.arch.sync_threads()

    out_t = mOut.element_type
    ct = bn * (BN // TN) + tx  # column vector index (8 columns)
    o_frag = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
    if n0 + tx * TN < N:
        if cutlass.const_expr(epi == EPI_STORE):
            for i in cutlass.range_constexpr(TM):
                m = m0 + ty * TM + i
                if m < M:
                    o_frag.store(acc[i, None].load().to(out_t))
                    cute.autovec_copy(o_frag, cute.local_tile(mOut, (1, TN), (m, ct))[0, None])
        else:
            # mX0 = H [M, 2N] (gate | up), mX1 = d_gu [M, 2N]; mOut = act [M, N]
            g_ld = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
            u_ld = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
            dg = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
            du = cute.make_rmem_tensor(cute.make_layout(TN), out_t)
            for i in cutlass.range_constexpr(TM):
                m = m0 + ty * TM + i
                if m < M:
                    cute.autovec_copy(cute.local_tile(mX0, (1, TN), (m, ct))[0, None], g_ld)
                    cute.autovec_copy(cute.local_tile(mX0, (1, TN), (m, ct + N // TN))[0, None], u_ld)
                    da = acc[i, None].load().to(out_t).to(cutlass.Float32)
                    g = g_ld.load().to(cutlass.Float32)
                    u = u_ld.load().to(cutlass.Float32)
                    one = cute.full_like(g, 1.0)
                    s = one / (one + cute.math.exp(-g))
                    o_frag.store((g * s * u).to(out_t))
                    du.store((da * g * s).to(out_t))
                    dg.store((da * u * s * (one + g * (one - s))).to(out_t))
                    cute.autovec_copy(o_frag, cute.local_tile(mOut, (1, TN), (m, ct))[0, None])
                    cute.autovec_copy(dg, cute.local_tile(mX1, (1, TN), (m, ct))[0, None])
                    cute.autovec_copy(du, cute.local_tile(mX1, (1, TN), (m, ct + N // TN))[0, None])


def _grid(m, n):
    return [(n + BN - 1) // BN, (m + BM - 1) // BM, 1]


@cute.jit
def _swiglu_mlp_bwd(mX: cute.Tensor, mWgu: cute.Tensor, mWd: cute.Tensor, mGo: cute.Tensor, mH: cute.Tensor,
                    mAct: cute.Tensor, mDgu: cute.Tensor, mGx: cute.Tensor, mGwgu: cute.Tensor, mGwd: cute.Tensor,
                    stream):
    t = mX.shape[0]
    d = mX.shape[1]
    f = mWd.shape[1]
    blk = [THREADS, 1, 1]
    # 1. H = x @ w_gate_up^T
    _gemm_kernel(mX, mWgu, mH, mH, mH, d, True, True, EPI_STORE).launch(grid=_grid(t, 2 * f), block=blk,
                                                                        stream=stream)
    # 2. d_act = grad_out @ w_down -> act, d_gu
    _gemm_kernel(mGo, mWd, mAct, mH, mDgu, d, True, False, EPI_SWIGLU_BWD).launch(grid=_grid(t, f), block=blk,
                                                                                  stream=stream)
    # 3. grad_w_down = grad_out^T @ act
    _gemm_kernel(mGo, mAct, mGwd, mGwd, mGwd, t, False, False, EPI_STORE).launch(grid=_grid(d, f), block=blk,
                                                                                 stream=stream)
    # 4. grad_x = d_gu @ w_gate_up
    _gemm_kernel(mDgu, mWgu, mGx, mGx, mGx, 2 * f, True, False, EPI_STORE).launch(grid=_grid(t, d), block=blk,
                                                                                  stream=stream)
    # 5. grad_w_gate_up = d_gu^T @ x
    _gemm_kernel(mDgu, mX, mGwgu, mGwgu, mGwgu, t, False, False, EPI_STORE).launch(grid=_grid(2 * f, d), block=blk,
                                                                                   stream=stream)


_COMPILED = {}


def _compiled_for(t, d, f):
    key = (t, d, f)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(shape):
            return make_fake_compact_tensor(cutlass.BFloat16, shape, stride_order=(1, 0), assumed_align=16)

        fn = cute.compile(_swiglu_mlp_bwd, fake((t, d)), fake((2 * f, d)), fake((d, f)), fake((t, d)),
                          fake((t, 2 * f)), fake((t, f)), fake((t, 2 * f)), fake((t, d)), fake((2 * f, d)),
                          fake((d, f)), make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, w_gate_up, w_down, grad_out):
    """Return (grad_x [t, d], grad_w_gate_up [2f, d], grad_w_down [d, f]), bf16."""
    t, d = x.shape
    f = w_down.shape[1]
    if t % BK != 0 or d % BK != 0 or f % BK != 0:
        raise ValueError(f"unsupported sizes t = {t}, d = {d}, f = {f} (multiples of {BK} needed)")
    dev, dt = x.device, x.dtype
    h = torch.empty((t, 2 * f), dtype=dt, device=dev)
    act = torch.empty((t, f), dtype=dt, device=dev)
    d_gu = torch.empty((t, 2 * f), dtype=dt, device=dev)
    grad_x = torch.empty((t, d), dtype=dt, device=dev)
    grad_w_gate_up = torch.empty((2 * f, d), dtype=dt, device=dev)
    grad_w_down = torch.empty((d, f), dtype=dt, device=dev)
    _compiled_for(t, d, f)(x.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), grad_out.contiguous(), h,
                           act, d_gu, grad_x, grad_w_gate_up, grad_w_down)
    return grad_x, grad_w_gate_up, grad_w_down
