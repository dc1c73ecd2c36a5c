"""Problem 49 (DeepSeek-V2 group-limited top-6 of 160 softmax router), CuTe DSL: one warp per token.

The selection is done on the logits (softmax is monotonic, so the order of the scores is the order of the logits,
and the logits are compared exactly): lane l holds experts l, l+32, ..., l+128 (5 coalesced fp32 loads per lane).
 1. group maxima: for each of the 8 groups of 20 consecutive experts, a masked max per lane + a butterfly max;
 2. the 3 kept groups: every lane ranks the 8 group maxima (ties broken by the lower group id);
 3. top-6: six rounds of a butterfly arg-max over (logit, expert id) among the experts of the kept groups; the
    winner is struck out; lane k keeps the k-th winner;
 4. weights: the softmax denominator sum(exp(x - max)) over all 160 experts in float64 (a butterfly sum), and
    lane k (< 6) writes 16 * exp(x_k - max) / sum rounded once to fp32, plus its expert id (int64).
The row max is the largest group maximum. float64 for the normaliser makes the weights correctly rounded up to a
few float64 ulps: far inside the fp32 tolerance.

CTA = 4 warps = 4 tokens (128 threads); grid = ceil(T / 4). Compiled once per token count with the TVM-FFI
option; `solve` passes torch tensors straight in and the launch goes to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

NUM_EXPERTS = 160
N_GROUP = 8
PER_GROUP = NUM_EXPERTS // N_GROUP  # 20
TOPK_GROUP = 3
TOP_K = 6
SCALE = 16.0
PER_LANE = NUM_EXPERTS // 32  # 5 experts per lane
WARPS = 4
THREADS = WARPS * 32


@cute.jit
def _warp_max(v):
    for s in cutlass.range_constexpr(5):
        v = cute.arch.fmax(v, cute.arch.shuffle_sync_bfly(v, offset=1 << s))
    return v


@cute.jit
def _warp_sum_f64(v):
    for s in cutlass.range_constexpr(5):
        v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << s)
    return v


@cute.jit
def _warp_argmax(v, i):
    """Butterfly arg-max over (value, index): the larger value wins, equal values go to the lower index."""
    for s in cutlass.range_constexpr(5):
        ov = cute.arch.shuffle_sync_bfly(v, offset=1 << s)
        oi = cute.arch.shuffle_sync_bfly(i, offset=1 << s)
        take = ov > v
        if ov == v:
            take = oi < i
        if take:
            v = ov
            i = oi
    return v, i


@cute.kernel
def _router_kernel(mX: cute.Tensor, mW: cute.Tensor, mI: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    row = bidx * WARPS + warp
    neg_inf = cutlass.Float32(-float("inf"))

    if row < mX.shape[0]:  # warp-uniform
        xo = cute.make_rmem_tensor((PER_LANE,), cutlass.Float32)  # this lane's logits
        xm = cute.make_rmem_tensor((PER_LANE,), cutlass.Float32)  # the same, -inf outside the kept groups
        gs = cute.make_rmem_tensor((N_GROUP,), cutlass.Float32)  # group maxima (same in every lane)
        kept = cute.make_rmem_tensor((N_GROUP,), cutlass.Int32)
        for j in cutlass.range_constexpr(PER_LANE):
            xo[j] = mX[row, j * 32 + lane]

        # 1. group maxima
        for g in cutlass.range_constexpr(N_GROUP):
            m = neg_inf
            for j in cutlass.range_constexpr(PER_LANE):
                if (j * 32 + lane) // PER_GROUP == g:
                    m = cute.arch.fmax(m, xo[j])
            gs[g] = _warp_max(m)
        row_max = gs[0]
        for g in cutlass.range_constexpr(1, N_GROUP):
            row_max = cute.arch.fmax(row_max, gs[g])

        # 2. the top-3 groups: rank = number of groups ahead of g
        for g in cutlass.range_constexpr(N_GROUP):
            rank = cutlass.Int32(0)
            for h in cutlass.range_constexpr(N_GROUP):
                if cutlass.const_expr(h < g):
                    if gs[h] >= gs[g]:
                        rank = rank + 1
                if cutlass.const_expr(h > g):
                    if gs[h] > gs[g]:
                        rank = rank + 1
            kept[g] = cutlass.Int32(0)
            if rank < TOPK_GROUP:
                kept[g] = cutlass.Int32(1)
        for j in cutlass.range_constexpr(PER_LANE):
            xm[j] = neg_inf
            grp = (j * 32 + lane) // PER_GROUP
            for g in cutlass.range_constexpr(N_GROUP):
                if grp == g:
                    if kept[g] != 0:
                        xm[j] = xo[j]

        # 3. top-6 among the kept experts, one butterfly arg-max per pick
        my_id = cutlass.Int32(0)
        for k in cutlass.range_constexpr(TOP_K):
            bv = xm[0]
            bi = lane
            for j in cutlass.range_constexpr(1, PER_LANE):
                if xm[j] > bv:
                    bv = xm[j]
                    bi = j * 32 + lane
            bv, bi = _warp_argmax(bv, bi)
            for j in cutlass.range_constexpr(PER_LANE):
                if j * 32 + lane == bi:
                    xm[j] = neg_inf
            if lane == k:
                my_id = bi

        # 4. softmax normaliser over all 160 logits in float64, then the 6 weights
        mx = row_max.to(cutlass.Float64)
        part = cutlass.Float64(0.0)
        for j in cutlass.range_constexpr(PER_LANE):
            part = part + cute.math.exp(xo[j].to(cutlass.Float64) - mx)
        denom = _warp_sum_f64(part)
        if lane < TOP_K:
            xs = mX[row, my_id].to(cutlass.Float64)
            w = cute.math.exp(xs - mx) / denom * SCALE
            mW[row, lane] = w.to(cutlass.Float32)
            mI[row, lane] = my_id.to(cutlass.Int64)


@cute.jit
def _router(mX: cute.Tensor, mW: cute.Tensor, mI: cute.Tensor, stream):
    tokens = mX.shape[0]
    _router_kernel(mX, mW, mI).launch(grid=[(tokens + WARPS - 1) // WARPS, 1, 1], block=[THREADS, 1, 1],
                                      stream=stream)


_COMPILED = {}


def _compiled_for(tokens):
    fn = _COMPILED.get(tokens)
    if fn is None:
        x = make_fake_compact_tensor(cutlass.Float32, (tokens, NUM_EXPERTS), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(cutlass.Float32, (tokens, TOP_K), stride_order=(1, 0), assumed_align=16)
        i = make_fake_compact_tensor(cutlass.Int64, (tokens, TOP_K), stride_order=(1, 0), assumed_align=16)
        fn = cute.compile(_router, x, w, i, make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[tokens] = fn
    return fn


def solve(router_logits):
    """Return (topk_weights [T, 6] fp32, topk_ids [T, 6] int64)."""
    x = router_logits.contiguous()
    tokens, experts = x.shape
    if experts != NUM_EXPERTS:
        raise ValueError(f"expected {NUM_EXPERTS} experts, got {experts}")
    weights = torch.empty((tokens, TOP_K), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, TOP_K), dtype=torch.int64, device=x.device)
    if tokens > 0:
        _compiled_for(tokens)(x, weights, ids)
    return weights, ids
