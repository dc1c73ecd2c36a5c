"""Wrong: the CuTe gold residual-RMSNorm backward with the norm weight left out of the direct term of grad_hidden.

The input gradient of y = hhat * weight must first scale grad_y by the weight and then go through the normalisation:
grad_hidden = grad_h + r * (grad_y * w - hhat * mean(grad_y * w * hhat)). This kernel computes the mean term with
the weight (s_gh) but writes r * (grad_y - hhat * m), i.e. it back-propagates grad_y straight through the norm as if
the weight were 1. With weights drawn in [0.2, 1.2], most grad_hidden entries are off by r * grad_y * (1 - w), far
beyond a bf16 rounding. grad_weight is still right.

Expected: wrong/mismatch
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-6
VEC = 8  # bf16 elements per 128-bit access
MAX_THREADS = 512
ROWS_PER_CTA = 32
RED_WARPS = 32  # warps of the column-reduction kernel (one column per lane)


def _threads_for(vectors):
    return max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))


@cute.jit
def _warp_allreduce_sum(value):
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    return value


@cute.kernel
def _rmsnorm_bwd_rows_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mGY: cute.Tensor,
                             mGH: cute.Tensor, mOut: cute.Tensor, mPart: cute.Tensor, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = mX.shape[0]
    hidden = mX.shape[1]
    vectors = hidden // VEC
    n_iter = (vectors + threads - 1) // threads
    warps = threads // 32
    warp = tidx // 32
    lane = tidx % 32
    bf16 = mX.element_type

    smem = cutlass.memory.SmemAllocator()
    red = smem.allocate_tensor(cutlass.Float32, cute.make_layout((warps, 2)))

    rW = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rW.fill(0)
    for i in cutlass.range_constexpr(n_iter):
        if i * threads + tidx < vectors:
            cute.autovec_copy(cute.local_tile(mW, (VEC,), (i * threads + tidx,)), rW[None, i])
    w = rW.load().to(cutlass.Float32)
    rAcc = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), cutlass.Float32)
    rAcc.fill(0.0)

    rX = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rR = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rGY = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rGH = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rH = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rO = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rX.fill(0)
    rR.fill(0)
    rGY.fill(0)
    rGH.fill(0)

    row0 = bidx * ROWS_PER_CTA
    n_rows = cutlass.min(ROWS_PER_CTA, tokens - row0)
    for k in range(n_rows):
        row = row0 + k
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(cute.local_tile(mX, (1, VEC), (row, j))[0, None], rX[None, i])
                cute.autovec_copy(cute.local_tile(mR, (1, VEC), (row, j))[0, None], rR[None, i])
                cute.autovec_copy(cute.local_tile(mGY, (1, VEC), (row, j))[0, None], rGY[None, i])
                cute.autovec_copy(cute.local_tile(mGH, (1, VEC), (row, j))[0, None], rGH[None, i])
        rH.store((rX.load().to(cutlass.Float32) + rR.load().to(cutlass.Float32)).to(bf16))  # forward's bf16 h
        h = rH.load().to(cutlass.Float32)
        gy = rGY.load().to(cutlass.Float32)
        gw = gy * w
        s_hh = _warp_allreduce_sum((h * h).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
        s_gh = _warp_allreduce_sum((gw * h).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
        if lane == 0:
            red[warp, 0] = s_hh
            red[warp, 1] = s_gh
        cute.arch.sync_threads()
        t_hh = cutlass.Float32(0.0)
        t_gh = cutlass.Float32(0.0)
        for q in cutlass.range_constexpr(warps):
            t_hh = t_hh + red[q, 0]
            t_gh = t_gh + red[q, 1]
        cute.arch.sync_threads()  # everyone has read `red` before the next row overwrites it
        r = cute.math.rsqrt(t_hh / hidden + EPS)
        m = r * t_gh / hidden  # mean(gy * w * hhat)
        hhat = h * r
        rO.store((rGH.load().to(cutlass.Float32) + r * (gy - hhat * m)).to(bf16))
        rAcc.store(rAcc.load() + gy * hhat)
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(rO[None, i], cute.local_tile(mOut, (1, VEC), (row, j))[0, None])
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(rAcc[None, i], cute.local_tile(mPart, (1, VEC), (bidx, j))[0, None])


@cute.kernel
def _column_sum_kernel(mPart: cute.Tensor, mGW: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    parts = mPart.shape[0]
    hidden = mPart.shape[1]
    warp = tidx // 32
    lane = tidx % 32
    col = bidx * 32 + lane
    smem = cutlass.memory.SmemAllocator()
    red = smem.allocate_tensor(cutlass.Float32, cute.make_layout((RED_WARPS, 32)))
    acc = cutlass.Float32(0.0)
    if col < hidden:
        for p in range(warp, parts, RED_WARPS):
            acc = acc + mPart[p, col]
    red[warp, lane] = acc
    cute.arch.sync_threads()
    if warp == 0:
        total = cutlass.Float32(0.0)
        for q in cutlass.range_constexpr(RED_WARPS):
            total = total + red[q, lane]
        if col < hidden:
            mGW[col] = total.to(mGW.element_type)


@cute.jit
def _rmsnorm_bwd(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mGY: cute.Tensor, mGH: cute.Tensor,
                 mOut: cute.Tensor, mPart: cute.Tensor, mGW: cute.Tensor, stream):
    threads = _threads_for(mX.shape[1] // VEC)
    _rmsnorm_bwd_rows_kernel(mX, mR, mW, mGY, mGH, mOut, mPart, threads).launch(
        grid=[mPart.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)
    _column_sum_kernel(mPart, mGW).launch(
        grid=[(mX.shape[1] + 31) // 32, 1, 1], block=[32 * RED_WARPS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, hidden, parts):
    key = (tokens, hidden)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16

        def matrix():
            return make_fake_compact_tensor(bf16, (tokens, hidden), stride_order=(1, 0), assumed_align=16)

        vector = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        part = make_fake_compact_tensor(cutlass.Float32, (parts, hidden), stride_order=(1, 0), assumed_align=16)
        gw = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        fn = cute.compile(_rmsnorm_bwd, matrix(), matrix(), vector, matrix(), matrix(), matrix(), part, gw,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, residual, weight, grad_y, grad_h):
    """Return (grad_hidden [.., d] bf16, grad_weight [d] bf16)."""
    d = x.shape[-1]
    if d % VEC != 0:
        raise ValueError(f"hidden size {d} must be a multiple of {VEC}")
    x2 = x.reshape(-1, d).contiguous()
    r2 = residual.reshape(-1, d).contiguous()
    gy2 = grad_y.reshape(-1, d).contiguous()
    gh2 = grad_h.reshape(-1, d).contiguous()
    tokens = x2.shape[0]
    parts = (tokens + ROWS_PER_CTA - 1) // ROWS_PER_CTA
    grad_hidden = torch.empty_like(x2)
    partial = torch.empty(parts, d, dtype=torch.float32, device=x.device)
    grad_weight = torch.empty(d, dtype=x.dtype, device=x.device)
    _compiled_for(tokens, d, parts)(x2, r2, weight.contiguous(), gy2, gh2, grad_hidden, partial, grad_weight)
    return grad_hidden.view(x.shape), grad_weight
