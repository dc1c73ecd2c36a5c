"""Problem 42, DeepSeek-V3 MTP head input (masked embedding gather, two RMSNorms, concatenation), in CuTe DSL.

One kernel, grid (T, 2): CTA (t, 0) gathers embed_table[input_ids[t]] (left as zeros when positions[t] == 0, which
then normalise to zeros) and writes enorm of it to out[t, 0:D]; CTA (t, 1) normalises previous_hidden[t] with
hnorm_weight into out[t, D:2D], so the concatenation is just the column offset of the store. Each thread owns
128-bit vectors (8 bf16) of the row kept in registers: hidden 7168 = 896 vectors -> 448 threads x 2 vectors, small
scale 256 -> 32 threads x 1. Sum of squares in fp32, warp butterfly, one shared-memory exchange in which every thread
adds the per-warp partials; out = x * rsqrt(sum / D + eps) * w in fp32, rounded once to bf16. Only the referenced
table rows are read. All sizes are compile-time constants (one compile per shape, TVM-FFI, torch's current stream).
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-6
VEC = 8  # bf16 elements per 128-bit access
MAX_THREADS = 512


def _layout_for(vectors):
    """(threads, vectors per thread): the fewest vectors per thread with at most 512 threads, balanced."""
    n_iter = (vectors + MAX_THREADS - 1) // MAX_THREADS
    per = (vectors + n_iter - 1) // n_iter
    return max(32, (per + 31) // 32 * 32), n_iter


@cute.kernel
def _dual_rmsnorm_kernel(mIds: cute.Tensor, mPos: cute.Tensor, mH: cute.Tensor, mE: cute.Tensor,
                         mEW: cute.Tensor, mHW: cute.Tensor, mOut: cute.Tensor,
                         threads: cutlass.Constexpr, n_iter: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    t, half, _ = cute.arch.block_idx()
    hidden = mH.shape[1]
    vectors = hidden // VEC
    warps = threads // 32
    bf16 = mH.element_type

    rX = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rW = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rX.fill(0)
    rW.fill(0)
    if half == 0:
        if mPos[t] != 0:  # a token at position 0 has no predecessor: its embedding stays zero
            row = cutlass.Int32(mIds[t])
            for i in cutlass.range_constexpr(n_iter):
                j = i * threads + tidx
                if j < vectors:
                    cute.autovec_copy(cute.local_tile(mE, (1, VEC), (row, j))[0, None], rX[None, i])
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(cute.local_tile(mEW, (VEC,), (j,)), rW[None, i])
    else:
        for i in cutlass.range_constexpr(n_iter):
            j = i * threads + tidx
            if j < vectors:
                cute.autovec_copy(cute.local_tile(mH, (1, VEC), (t, j))[0, None], rX[None, i])
                cute.autovec_copy(cute.local_tile(mHW, (VEC,), (j,)), rW[None, i])

    x = rX.load().to(cutlass.Float32)
    ss = (x * x).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> k)
    smem = cutlass.memory.SmemAllocator()
    red = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps))
    if tidx % 32 == 0:
        red[tidx // 32] = ss
    cute.arch.sync_threads()
    total = cutlass.Float32(0.0)
    for q in cutlass.range_constexpr(warps):
        total = total + red[q]
    inv_rms = cute.math.rsqrt(total / hidden + EPS)

    rOut = cute.make_rmem_tensor(cute.make_layout((VEC, n_iter)), bf16)
    rOut.store((x * inv_rms * rW.load().to(cutlass.Float32)).to(bf16))
    for i in cutlass.range_constexpr(n_iter):
        j = i * threads + tidx
        if j < vectors:
            cute.autovec_copy(rOut[None, i], cute.local_tile(mOut, (1, VEC), (t, half * vectors + j))[0, None])


@cute.jit
def _dual_rmsnorm(mIds: cute.Tensor, mPos: cute.Tensor, mH: cute.Tensor, mE: cute.Tensor, mEW: cute.Tensor,
                  mHW: cute.Tensor, mOut: cute.Tensor, stream):
    threads, n_iter = _layout_for(mH.shape[1] // VEC)
    _dual_rmsnorm_kernel(mIds, mPos, mH, mE, mEW, mHW, mOut, threads, n_iter).launch(
        grid=[mH.shape[0], 2, 1], block=[threads, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, hidden, vocab):
    key = (tokens, hidden, vocab)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        ids = make_fake_compact_tensor(cutlass.Int64, (tokens,))
        pos = make_fake_compact_tensor(cutlass.Int64, (tokens,))
        h = make_fake_compact_tensor(bf16, (tokens, hidden), stride_order=(1, 0), assumed_align=16)
        table = make_fake_compact_tensor(bf16, (vocab, hidden), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        out = make_fake_compact_tensor(bf16, (tokens, 2 * hidden), stride_order=(1, 0), assumed_align=16)
        fn = cute.compile(_dual_rmsnorm, ids, pos, h, table, w, w, out,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(input_ids, positions, previous_hidden, embed_table, enorm_weight, hnorm_weight):
    """Return cat([enorm(masked embedding), hnorm(previous_hidden)], -1), bf16 [T, 2D]."""
    tokens, hidden = previous_hidden.shape
    vocab = embed_table.shape[0]
    if hidden % VEC != 0:
        raise ValueError(f"hidden size {hidden} must be a multiple of {VEC}")
    out = torch.empty(tokens, 2 * hidden, dtype=previous_hidden.dtype, device=previous_hidden.device)
    if tokens > 0:
        _compiled_for(tokens, hidden, vocab)(input_ids.contiguous(), positions.contiguous(),
                                             previous_hidden.contiguous(), embed_table.contiguous(),
                                             enorm_weight.contiguous(), hnorm_weight.contiguous(), out)
    return out
