"""Problem 43, backward through embedding lookup + RMSNorm (dense grad_table, grad_norm_weight), in CuTe DSL.

Deterministic, no atomics. Index prep in torch (16K ids): a stable sort of the token ids (`order`, `sorted_ids`)
and per-vocabulary-row segment starts seg[v] = #tokens with id < v (searchsorted). Three kernels:
K1, CTA b takes sorted positions [32 b, 32 b + 32): for position p (token order[p], row sorted_ids[p]) its threads
  (one 128-bit vector of 8 bf16 each: 256 threads at hidden 2048, 32 at small scale) load e = table[row], gn and gr,
  reduce sum(e^2) and sum(gn * w * e) together (warp butterflies + one shared-memory exchange, a second barrier
  before the next position reuses the buffer), then r = rsqrt(sum(e^2)/d + eps), m = r * sum(gn*w*e)/d and
  d_e = gr + r * (gn*w - e*r*m) in fp32, stored to row p of an fp32 scratch in sorted order; the CTA's fp32
  partial of sum(gn * e * r) goes to row b of a [CTAs, d] scratch.
K2, one CTA per vocabulary row v: adds the contiguous scratch rows seg[v] .. seg[v+1]-1 in fp32 (4 rows per step,
  loads independent of each other), writes the row once as bf16: zeros where no token refers to v, so the dense
  table gradient is written exactly once without a memset. Frequent (low) ids have the longest segments and the
  lowest block indices, so they start first.
K3, grad_norm_weight: fixed-order column sum of K1's partials (32 warps x 32 columns per CTA), rounded to bf16.
All sizes are compile-time constants (one compile per shape, TVM-FFI, torch's current stream).
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
VEC = 8  # bf16 elements per 128-bit access
MAX_THREADS = 512
ROWS_PER_CTA = 32
RED_WARPS = 32
UNROLL = 4  # scratch rows added per step in K2


def _threads_for(vectors):
    return max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))


@cute.jit
def _warp_allreduce_sum(value):
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    return value


@cute.kernel
def _token_grad_kernel(mOrder: cute.Tensor, mSorted: cute.Tensor, mE: cute.Tensor, mW: cute.Tensor,
                       mGN: cute.Tensor, mGR: cute.Tensor, mDe: cute.Tensor, mPart: cute.Tensor,
                       threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = mGN.shape[0]
    hidden = mGN.shape[1]
    vectors = hidden // VEC
    n_iter = (vectors + threads - 1) // threads
    warps = threads // 32
    warp = tidx // 32
    lane = tidx % 32
    bf16 = mGN.element_type

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

    rE = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rGN = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rGR = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rDe = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), cutlass.Float32)
    rE.fill(0)
    rGN.fill(0)
    rGR.fill(0)

    p0 = bidx * ROWS_PER_CTA
    n_rows = cutlass.min(ROWS_PER_CTA, tokens - p0)
    for k in range(n_rows):
        p = p0 + k
        tok = cutlass.Int32(mOrder[p])
        row = cutlass.Int32(mSorted[p])
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(cute.local_tile(mE, (1, VEC), (row, j))[0, None], rE[None, i])
                cute.autovec_copy(cute.local_tile(mGN, (1, VEC), (tok, j))[0, None], rGN[None, i])
                cute.autovec_copy(cute.local_tile(mGR, (1, VEC), (tok, j))[0, None], rGR[None, i])
        e = rE.load().to(cutlass.Float32)
        gn = rGN.load().to(cutlass.Float32)
        gw = gn * w
        s_ee = _warp_allreduce_sum((e * e).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
        s_ge = _warp_allreduce_sum((gw * e).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0))
        if lane == 0:
            red[warp, 0] = s_ee
            red[warp, 1] = s_ge
        cute.arch.sync_threads()
        t_ee = cutlass.Float32(0.0)
        t_ge = cutlass.Float32(0.0)
        for q in cutlass.range_constexpr(warps):
            t_ee = t_ee + red[q, 0]
            t_ge = t_ge + red[q, 1]
        cute.arch.sync_threads()  # everyone has read `red` before the next position overwrites it
        r = cute.math.rsqrt(t_ee / hidden + EPS)
        m = r * t_ge / hidden  # mean(gn * w * ehat)
        ehat = e * r
        rDe.store(rGR.load().to(cutlass.Float32) + r * (gw - ehat * m))
        rAcc.store(rAcc.load() + gn * ehat)
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(rDe[None, i], cute.local_tile(mDe, (1, VEC), (p, j))[0, None])
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(rAcc[None, i], cute.local_tile(mPart, (1, VEC), (bidx, j))[0, None])


@cute.kernel
def _table_grad_kernel(mSeg: cute.Tensor, mDe: cute.Tensor, mGT: cute.Tensor, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    v, _, _ = cute.arch.block_idx()
    hidden = mDe.shape[1]
    vectors = hidden // VEC
    n_iter = (vectors + threads - 1) // threads
    start = mSeg[v]
    count = mSeg[v + 1] - start
    full = count // UNROLL * UNROLL

    rAcc = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), cutlass.Float32)
    rAcc.fill(0.0)
    rD = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter, UNROLL)), cutlass.Float32)
    rD.fill(0.0)
    for base in range(0, full, UNROLL):
        for u in cutlass.range_constexpr(UNROLL):
            for i in cutlass.range_constexpr(n_iter):
                j = i * threads + tidx
                if j < vectors:
                    cute.autovec_copy(cute.local_tile(mDe, (1, VEC), (start + base + u, j))[0, None], rD[None, i, u])
        for u in cutlass.range_constexpr(UNROLL):
            rAcc.store(rAcc.load() + rD[None, None, u].load())
    for q in range(full, count):
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(cute.local_tile(mDe, (1, VEC), (start + q, j))[0, None], rD[None, i, 0])
        rAcc.store(rAcc.load() + rD[None, None, 0].load())

    rOut = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), mGT.element_type)
    rOut.store(rAcc.load().to(mGT.element_type))
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(rOut[None, i], cute.local_tile(mGT, (1, VEC), (v, j))[0, None])


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
def _embedding_rmsnorm_bwd(mOrder: cute.Tensor, mSorted: cute.Tensor, mSeg: cute.Tensor, mE: cute.Tensor,
                           mW: cute.Tensor, mGN: cute.Tensor, mGR: cute.Tensor, mDe: cute.Tensor,
                           mPart: cute.Tensor, mGT: cute.Tensor, mGW: cute.Tensor, stream):
    threads = _threads_for(mGN.shape[1] // VEC)
    _token_grad_kernel(mOrder, mSorted, mE, mW, mGN, mGR, mDe, mPart, threads).launch(
        grid=[mPart.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)
    _table_grad_kernel(mSeg, mDe, mGT, threads).launch(
        grid=[mGT.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)
    _column_sum_kernel(mPart, mGW).launch(
        grid=[(mGN.shape[1] + 31) // 32, 1, 1], block=[32 * RED_WARPS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, vocab, hidden, parts):
    key = (tokens, vocab, hidden)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32

        def matrix(dtype, rows):
            return make_fake_compact_tensor(dtype, (rows, hidden), stride_order=(1, 0), assumed_align=16)

        order = make_fake_compact_tensor(cutlass.Int64, (tokens,))
        sorted_ids = make_fake_compact_tensor(cutlass.Int64, (tokens,))
        seg = make_fake_compact_tensor(cutlass.Int32, (vocab + 1,))
        w = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        gw = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        fn = cute.compile(_embedding_rmsnorm_bwd, order, sorted_ids, seg, matrix(bf16, vocab), w,
                          matrix(bf16, tokens), matrix(bf16, tokens), matrix(f32, tokens), matrix(f32, parts),
                          matrix(bf16, vocab), gw, make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(input_ids, embed_table, norm_weight, grad_normed, grad_residual):
    """Return (grad_table [V, d] bf16, grad_norm_weight [d] bf16)."""
    vocab, d = embed_table.shape
    if d % VEC != 0:
        raise ValueError(f"hidden size {d} must be a multiple of {VEC}")
    ids = input_ids.reshape(-1)
    tokens = ids.numel()
    gn = grad_normed.reshape(-1, d).contiguous()
    gr = grad_residual.reshape(-1, d).contiguous()
    # index prep (glue): stable sort of the ids and each vocabulary row's segment of the sorted order
    sorted_ids, order = torch.sort(ids, stable=True)
    seg = torch.searchsorted(sorted_ids, torch.arange(vocab + 1, device=ids.device), out_int32=True)
    parts = (tokens + ROWS_PER_CTA - 1) // ROWS_PER_CTA
    d_e = torch.empty(tokens, d, dtype=torch.float32, device=ids.device)
    partial = torch.empty(parts, d, dtype=torch.float32, device=ids.device)
    grad_table = torch.empty_like(embed_table)
    grad_weight = torch.empty(d, dtype=embed_table.dtype, device=ids.device)
    _compiled_for(tokens, vocab, d, parts)(order, sorted_ids.contiguous(), seg, embed_table.contiguous(),
                                           norm_weight.contiguous(), gn, gr, d_e, partial, grad_table, grad_weight)
    return grad_table, grad_weight
