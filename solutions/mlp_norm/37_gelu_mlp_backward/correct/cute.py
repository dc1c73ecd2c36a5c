"""Problem 37 (backward of Linear-GELU(erf)-Linear with biases, fc1 recomputed), CuTe DSL: five GEMM kernels.

All are SIMT GEMMs with fp32 accumulation: CTA tile 128 x 128, BK = 32, 256 threads each owning an 8 x 8 register
block; per K step both operand tiles are widened to fp32 and stored k-major in shared memory (2 x 16 KB), then 32
rank-1 updates (8 + 8 fp32 reads, 64 FMAs per k; fp32 sums sequential over K). Two loaders:
 * k-contiguous rows (an nn.Linear weight or activation read as [rows, K]): thread r = tid % 128 loads 16
   contiguous k of row r (two 16-byte loads); rows past the end are clamped (never stored);
 * row-major [K, cols] operands (K = tokens in the weight gradients, or w1 / w2 used untransposed): thread loads
   8 contiguous columns (16 bytes; 16 threads cover one 128-column row) of K rows kr and kr + 16; loads past K or
   past the columns are zero (T = 12608 = 394 x 32; small scale 51 tokens).
Kernels (T tokens, d = 1024, f = 4096):
 1. fc1   (x [T,d] @ w1^T):     h = bf16(acc + b1) and a = bf16(h * Phi(h)), Phi in fp32 from the bf16 h.
 2. dgrad (grad_out @ w2 [d,f]): d_h = bf16(bf16(acc) * (Phi(h) + h phi(h))) with h re-read from fc1's output.
 3. wgrad (grad_out^T @ a, K = T): grad_w2 [d, f] = bf16(acc); the CTAs of column tile 0 also sum their fp32 A
    tile over k (threads 0..127, one column each, in token order): grad_b2 = bf16(sum_t grad_out).
 4. wgrad (d_h^T @ x, K = T): grad_w1 [f, d], and grad_b1 = bf16(sum_t d_h) the same way.
 5. dgrad (d_h @ w1 [f,d]):     grad_x = bf16(acc).
No float atomics: every output element has one owner and a fixed summation order (deterministic).
Compiled once per shape from fake tensors (TVM-FFI route); all launches go to torch's current stream.
"""

import math

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

SQRT1_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
LD = 16  # bf16 per thread per k-contiguous tile load
CV = 8  # bf16 per thread per row-major tile load (one 16-byte vector)
CPR = BN // CV  # threads per 128-column row of a row-major tile: 16


@cute.jit
def _load_krows(mA: cute.Tensor, row, kt, sA: cute.Tensor, tidx):
    """k-contiguous operand: A[row, 32 kt + 16 kh : +16] -> sA[16 kh + i, tidx % 128] (fp32)."""
    r = tidx % BM
    kh = tidx // BM
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    a_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    cute.autovec_copy(cute.local_tile(mA, (1, LD), (row, kt * (BK // LD) + kh))[0, None], a_ld)
    a_w.store(a_ld.load().to(cutlass.Float32))
    for i in cutlass.range_constexpr(LD):
        sA[kh * LD + i, r] = a_w[i]


@cute.jit
def _load_kmajor(mB: cute.Tensor, k0, c0, sB: cute.Tensor, tidx):
    """Row-major [K, cols] operand: B[k0 + kr + 16 p, c0 + nc : +8] -> sB[kr + 16 p, nc + i]; zero outside."""
    K, C = mB.shape
    kr = tidx // CPR
    nc = (tidx % CPR) * CV
    b_ld = cute.make_rmem_tensor(cute.make_layout(CV), mB.element_type)
    b_w = cute.make_rmem_tensor(cute.make_layout(CV), cutlass.Float32)
    for p in cutlass.range_constexpr(BK // (THREADS // CPR)):  # 2 passes of 16 rows
        k = k0 + kr + p * (THREADS // CPR)
        b_ld.fill(0)
        if k < K and c0 + nc < C:
            cute.autovec_copy(cute.local_tile(mB, (1, CV), (k, (c0 + nc) // CV))[0, None], b_ld)
        b_w.store(b_ld.load().to(cutlass.Float32))
        for i in cutlass.range_constexpr(CV):
            sB[kr + p * (THREADS // CPR), nc + i] = b_w[i]


@cute.jit
def _rank_updates(sA: cute.Tensor, sB: cute.Tensor, acc: cute.Tensor, tidx):
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    for kk in cutlass.range_constexpr(BK):
        cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
        cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
        for i in cutlass.range_constexpr(TM):
            for j in cutlass.range_constexpr(TN):
                acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]


@cute.jit
def _smem_tiles():
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    return sA, sB


@cute.kernel
def _fc1_kernel(mX: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor, mH: cute.Tensor, mAct: cute.Tensor):
    """h = bf16(x @ w1^T + b1), a = bf16(h Phi(h))."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M, K = mX.shape
    N = mW1.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    a_row = bm * BM + tidx % BM
    if a_row > M - 1:  # rows past M read a valid row, never stored
        a_row = M - 1
    b_row = bn * BN + tidx % BM
    if b_row > N - 1:
        b_row = N - 1
    for kt in range(K // BK):
        _load_krows(mX, a_row, kt, sA, tidx)
        _load_krows(mW1, b_row, kt, sB, tidx)
        cute.arch.sync_threads()
        _rank_updates(sA, sB, acc, tidx)
        cute.arch.sync_threads()

    bf16 = mH.element_type
    cv = bn * (BN // TN) + tx
    bias_ld = cute.make_rmem_tensor(cute.make_layout(TN), mB1.element_type)
    h_o = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
    a_o = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
    if cv * TN < N:
        cute.autovec_copy(cute.local_tile(mB1, (TN,), (cv,)), bias_ld)
        bias = bias_ld.load().to(cutlass.Float32)
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                h_o.store((acc[i, None].load() + bias).to(bf16))
                h = h_o.load().to(cutlass.Float32)
                cdf = 0.5 * (1.0 + cute.math.erf(h * SQRT1_2))
                a_o.store((h * cdf).to(bf16))
                cute.autovec_copy(h_o, cute.local_tile(mH, (1, TN), (m, cv))[0, None])
                cute.autovec_copy(a_o, cute.local_tile(mAct, (1, TN), (m, cv))[0, None])


@cute.kernel
def _dgrad_kernel(mA: cute.Tensor, mB: cute.Tensor, mH: cute.Tensor, mOut: cute.Tensor, gelu: cutlass.Constexpr):
    """out = A [M, K] @ B [K, N]; gelu: out = bf16(bf16(acc) * GELU'(h)) with h [M, N] from fc1."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M, K = mA.shape
    N = mB.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    a_row = bm * BM + tidx % BM
    if a_row > M - 1:
        a_row = M - 1
    for kt in range(K // BK):
        _load_krows(mA, a_row, kt, sA, tidx)
        _load_kmajor(mB, kt * BK, bn * BN, sB, tidx)
        cute.arch.sync_threads()
        _rank_updates(sA, sB, acc, tidx)
        cute.arch.sync_threads()

    bf16 = mOut.element_type
    cv = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
    h_ld = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
    if cv * TN < N:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                if cutlass.const_expr(gelu):
                    cute.autovec_copy(cute.local_tile(mH, (1, TN), (m, cv))[0, None], h_ld)
                    h = h_ld.load().to(cutlass.Float32)
                    cdf = 0.5 * (1.0 + cute.math.erf(h * SQRT1_2))
                    pdf = cute.math.exp(-0.5 * h * h) * INV_SQRT_2PI
                    g = acc[i, None].load().to(bf16).to(cutlass.Float32)  # (grad_out @ w2) in bf16
                    o.store((g * (cdf + h * pdf)).to(bf16))
                else:
                    o.store(acc[i, None].load().to(bf16))
                cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, cv))[0, None])


@cute.kernel
def _wgrad_kernel(mA: cute.Tensor, mB: cute.Tensor, mOut: cute.Tensor, mBias: cute.Tensor):
    """out [M, N] = A^T B with A [K, M], B [K, N] (K = tokens); column tile 0 also writes bias[m] = sum_k A[k, m]."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    K, M = mA.shape
    N = mB.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    bsum = cute.make_rmem_tensor(cute.make_layout(1), cutlass.Float32)
    bsum.fill(0.0)
    for kt in range((K + BK - 1) // BK):
        _load_kmajor(mA, kt * BK, bm * BM, sA, tidx)
        _load_kmajor(mB, kt * BK, bn * BN, sB, tidx)
        cute.arch.sync_threads()
        if bn == 0 and tidx < BM:  # the bias gradient: column tidx of the A tile, tokens in order
            for kk in cutlass.range_constexpr(BK):
                bsum[0] = bsum[0] + sA[kk, tidx]
        _rank_updates(sA, sB, acc, tidx)
        cute.arch.sync_threads()

    bf16 = mOut.element_type
    cv = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
    if cv * TN < N:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                o.store(acc[i, None].load().to(bf16))
                cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, cv))[0, None])
    if bn == 0 and tidx < BM:
        if bm * BM + tidx < M:
            mBias[bm * BM + tidx] = bsum[0].to(mBias.element_type)


def _grid(m, n):
    return [(n + BN - 1) // BN, (m + BM - 1) // BM, 1]


@cute.jit
def _mlp_backward(mX: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor, mW2: cute.Tensor, mG: cute.Tensor,
                  mH: cute.Tensor, mAct: cute.Tensor, mDh: cute.Tensor, mGx: cute.Tensor, mGw1: cute.Tensor,
                  mGb1: cute.Tensor, mGw2: cute.Tensor, mGb2: cute.Tensor, stream):
    t, d = mX.shape
    f = mW1.shape[0]
    blk = [THREADS, 1, 1]
    _fc1_kernel(mX, mW1, mB1, mH, mAct).launch(grid=_grid(t, f), block=blk, stream=stream)
    _dgrad_kernel(mG, mW2, mH, mDh, True).launch(grid=_grid(t, f), block=blk, stream=stream)
    _wgrad_kernel(mG, mAct, mGw2, mGb2).launch(grid=_grid(d, f), block=blk, stream=stream)
    _wgrad_kernel(mDh, mX, mGw1, mGb1).launch(grid=_grid(f, d), block=blk, stream=stream)
    _dgrad_kernel(mDh, mW1, mH, mGx, False).launch(grid=_grid(t, d), block=blk, stream=stream)


_COMPILED = {}


def _compiled_for(t, d, f):
    key = (t, d, f)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(shape):
            order = (1, 0) if len(shape) == 2 else (0,)
            return make_fake_compact_tensor(cutlass.BFloat16, shape, stride_order=order, assumed_align=16)

        fn = cute.compile(_mlp_backward, fake((t, d)), fake((f, d)), fake((f,)), fake((d, f)), fake((t, d)),
                          fake((t, f)), fake((t, f)), fake((t, f)), fake((t, d)), fake((f, d)), fake((f,)),
                          fake((d, f)), fake((d,)), make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


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
    h = torch.empty((t, f), dtype=dt, device=dev)
    act = torch.empty((t, f), dtype=dt, device=dev)
    d_h = torch.empty((t, f), dtype=dt, device=dev)
    grad_x = torch.empty((t, d), dtype=dt, device=dev)
    grad_w1 = torch.empty((f, d), dtype=dt, device=dev)
    grad_b1 = torch.empty((f,), dtype=dt, device=dev)
    grad_w2 = torch.empty((d, f), dtype=dt, device=dev)
    grad_b2 = torch.empty((d,), dtype=dt, device=dev)
    _compiled_for(t, d, f)(x2, w1.contiguous(), b1.contiguous(), w2.contiguous(), g2, h, act, d_h, grad_x,
                           grad_w1, grad_b1, grad_w2, grad_b2)
    return grad_x.view(x.shape), grad_w1, grad_b1, grad_w2, grad_b2
