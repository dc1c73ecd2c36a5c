"""Problem 45 (GShard top-2 gating with capacity, fairseq/NLLB-MoE), CuTe DSL: four kernels, no atomics.

Tokens are cut into chunks of 128 (one CTA each); the slot of an assignment is a per-expert exclusive prefix count,
so it splits into (count in earlier chunks) + (rank inside the chunk):
 1. route (grid = chunks, 256 threads): a group of LPT = min(8, E/4) lanes per token loads the E fp32 logits as
    coalesced 16-byte vectors; each lane keeps its top-2 (value, expert), visited in ascending expert order with
    strict `>` (ties -> lowest id), and a butterfly merge over the group gives e1, e2 exactly as torch.argmax does.
    It also sums exp(x - max) and stores b = exp(x2 - x1) and g2 = b / sum (fp32). e1/e2 go to shared memory,
    then thread j < 2E walks the chunk in token order for (choice j // E, expert j % E), writing each matching
    token's in-chunk rank and finally the chunk count cnt[chunk, j].
 2. scan (1 CTA, 2E threads): column j of cnt becomes its exclusive prefix over chunks; tot[j] = column total.
 3. finalize (grid = chunks, 128 threads, one per token): s1 = cnt[c, e1] + rank1, s2 = tot[e2] + cnt[c, E + e2]
    + rank2 (all first choices of an expert precede its second choices); kept iff slot < C. Weights after dropping:
    both kept -> 1 / (1 + b), b / (1 + b) (= g1 / (g1 + g2) exactly, the softmax normaliser cancels); only the
    first -> 1 (g1 >= 1/E > eps); only the second -> g2 / max(g2, eps); none -> 0. Kept pairs write src[e, s] = t.
 4. copy (one 16-byte vector per thread over dispatched [E*C, d]): expert e's slots 0..min(tot[e] + tot[E+e], C)-1
    are exactly the filled ones, so row (e, s) copies hidden[src[e, s]] there and zeros elsewhere: every output
    byte is written once, coalesced.
T, E, d, C are compile-time constants (compiled once per shape, TVM-FFI route, torch's current stream).
"""

import math

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

CHUNK = 128  # tokens per chunk (route / finalize CTA)
THREADS = 256  # route CTA
VEC = 8  # bf16 per 16-byte vector in the copy
COPY_THREADS = 256
EPS = float(torch.finfo(torch.float32).eps)


@cute.jit
def _better(v, i, w, j):
    """(v, i) ranks before (w, j): larger value, equal values -> lower expert id."""
    res = v > w
    if v == w:
        res = i < j
    return res


@cute.kernel
def _route_kernel(mL: cute.Tensor, mIds: cute.Tensor, mSlots: cute.Tensor, mW: cute.Tensor, mCnt: cute.Tensor,
                  LPT: cutlass.Constexpr, LOG_LPT: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    T = mL.shape[0]
    E = mL.shape[1]
    nq = E // 4 // LPT  # float4 vectors per lane
    tpp = THREADS // LPT  # tokens per pass
    grp = tidx // LPT
    sub = tidx % LPT
    neg_inf = cutlass.Float32(-float("inf"))

    smem = cutlass.memory.SmemAllocator()
    sE = smem.allocate_tensor(cutlass.Int32, cute.make_layout((2, CHUNK), stride=(CHUNK, 1)), 16)

    for p in cutlass.range_constexpr(CHUNK // tpp):
        li = p * tpp + grp  # token inside the chunk
        t = bidx * CHUNK + li
        tr = t
        if t >= T:
            tr = T - 1  # tail: compute on a valid row, write nothing
        xs = cute.make_rmem_tensor((nq * 4,), cutlass.Float32)
        for r in cutlass.range_constexpr(nq):
            v4 = cute.local_tile(mL, (1, 4), (tr, sub + LPT * r))[0, None].load()
            for c in cutlass.range_constexpr(4):
                xs[r * 4 + c] = v4[c]
        v1 = neg_inf
        i1 = cutlass.Int32(E)
        v2 = neg_inf
        i2 = cutlass.Int32(E)
        for r in cutlass.range_constexpr(nq):
            for c in cutlass.range_constexpr(4):
                x = xs[r * 4 + c]
                idx = (sub + LPT * r) * 4 + c
                if x > v1:
                    v2 = v1
                    i2 = i1
                    v1 = x
                    i1 = idx
                elif x > v2:
                    v2 = x
                    i2 = idx
        for k in cutlass.range_constexpr(LOG_LPT):
            o = LPT >> (k + 1)
            b1 = cute.arch.shuffle_sync_bfly(v1, offset=o)
            bi1 = cute.arch.shuffle_sync_bfly(i1, offset=o)
            b2 = cute.arch.shuffle_sync_bfly(v2, offset=o)
            bi2 = cute.arch.shuffle_sync_bfly(i2, offset=o)
            if _better(v1, i1, b1, bi1):
                if _better(b1, bi1, v2, i2):
                    v2 = b1
                    i2 = bi1
            else:
                if _better(v1, i1, b2, bi2):
                    v2 = v1
                    i2 = i1
                else:
                    v2 = b2
                    i2 = bi2
                v1 = b1
                i1 = bi1
        s = cutlass.Float32(0.0)
        for j in cutlass.range_constexpr(nq * 4):
            s = s + cute.math.exp(xs[j] - v1)
        for k in cutlass.range_constexpr(LOG_LPT):
            s = s + cute.arch.shuffle_sync_bfly(s, offset=LPT >> (k + 1))
        b = cute.math.exp(v2 - v1)
        if sub == 0:
            if t < T:
                mIds[t, 0] = cutlass.Int64(i1)
                mIds[t, 1] = cutlass.Int64(i2)
                mW[t, 0] = b
                mW[t, 1] = b / s
                sE[0, li] = i1
                sE[1, li] = i2
            else:
                sE[0, li] = cutlass.Int32(-1)
                sE[1, li] = cutlass.Int32(-1)
    cute.arch.sync_threads()

    if tidx < 2 * E:
        ch = tidx // E
        e = tidx - ch * E
        cnt = cutlass.Int32(0)
        for i in cutlass.range(CHUNK):
            if sE[ch, i] == e:
                mSlots[bidx * CHUNK + i, ch] = cutlass.Int64(cnt)
                cnt = cnt + 1
        mCnt[bidx, tidx] = cnt


@cute.kernel
def _scan_kernel(mCnt: cute.Tensor, mTot: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    nch = mCnt.shape[0]
    vals = cute.make_rmem_tensor((nch,), cutlass.Int32)
    for c in cutlass.range_constexpr(nch):
        vals[c] = mCnt[c, tidx]
    run = cutlass.Int32(0)
    for c in cutlass.range_constexpr(nch):
        mCnt[c, tidx] = run
        run = run + vals[c]
    mTot[tidx] = run


@cute.kernel
def _finalize_kernel(mIds: cute.Tensor, mSlots: cute.Tensor, mW: cute.Tensor, mCnt: cute.Tensor, mTot: cute.Tensor,
                     mSrc: cute.Tensor, E: cutlass.Constexpr, C: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    t = bidx * CHUNK + tidx
    if t < mIds.shape[0]:
        e1 = mIds[t, 0].to(cutlass.Int32)
        e2 = mIds[t, 1].to(cutlass.Int32)
        s1 = mCnt[bidx, e1] + mSlots[t, 0].to(cutlass.Int32)
        s2 = mTot[e2] + mCnt[bidx, E + e2] + mSlots[t, 1].to(cutlass.Int32)
        b = mW[t, 0]
        g2 = mW[t, 1]
        one = cutlass.Float32(1.0)
        w1 = cutlass.Float32(0.0)
        w2 = cutlass.Float32(0.0)
        out1 = cutlass.Int64(-1)
        out2 = cutlass.Int64(-1)
        if s1 < C:
            out1 = cutlass.Int64(s1)
            mSrc[e1 * C + s1] = t
            if s2 < C:
                w1 = one / (one + b)
                w2 = b / (one + b)
            else:
                w1 = one
        if s2 < C:
            out2 = cutlass.Int64(s2)
            mSrc[e2 * C + s2] = t
            if s1 >= C:
                w2 = g2 / cute.arch.fmax(g2, cutlass.Float32(EPS))
        mW[t, 0] = w1
        mW[t, 1] = w2
        mSlots[t, 0] = out1
        mSlots[t, 1] = out2


@cute.kernel
def _copy_kernel(mH: cute.Tensor, mSrc: cute.Tensor, mTot: cute.Tensor, mD: cute.Tensor,
                 E: cutlass.Constexpr, C: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    vpr = mD.shape[1] // VEC
    i = bidx * COPY_THREADS + tidx
    if i < mD.shape[0] * vpr:
        row = i // vpr
        v = i - row * vpr
        e = row // C
        s = row - e * C
        frag = cute.make_rmem_tensor((VEC,), mD.element_type)
        frag.fill(0.0)
        if s < mTot[e] + mTot[E + e]:
            frag.store(cute.local_tile(mH, (1, VEC), (mSrc[row], v))[0, None].load())
        cute.local_tile(mD, (1, VEC), (row, v))[0, None].store(frag.load())


@cute.jit
def _dispatch(mH: cute.Tensor, mL: cute.Tensor, mD: cute.Tensor, mW: cute.Tensor, mIds: cute.Tensor,
              mSlots: cute.Tensor, mCnt: cute.Tensor, mTot: cute.Tensor, mSrc: cute.Tensor, stream,
              LPT: cutlass.Constexpr, LOG_LPT: cutlass.Constexpr, E: cutlass.Constexpr, C: cutlass.Constexpr):
    nch = mCnt.shape[0]
    _route_kernel(mL, mIds, mSlots, mW, mCnt, LPT, LOG_LPT).launch(grid=[nch, 1, 1], block=[THREADS, 1, 1],
                                                                   stream=stream)
    _scan_kernel(mCnt, mTot).launch(grid=[1, 1, 1], block=[2 * E, 1, 1], stream=stream)
    _finalize_kernel(mIds, mSlots, mW, mCnt, mTot, mSrc, E, C).launch(grid=[nch, 1, 1], block=[CHUNK, 1, 1],
                                                                     stream=stream)
    total = mD.shape[0] * (mD.shape[1] // VEC)
    _copy_kernel(mH, mSrc, mTot, mD, E, C).launch(grid=[(total + COPY_THREADS - 1) // COPY_THREADS, 1, 1],
                                                  block=[COPY_THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(T, E, d, C):
    key = (T, E, d, C)
    fn = _COMPILED.get(key)
    if fn is None:
        nch = (T + CHUNK - 1) // CHUNK
        lpt = min(8, E // 4)

        def fake(dtype, shape, align=16):
            order = tuple(range(len(shape) - 1, -1, -1))
            return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)

        fn = cute.compile(_dispatch, fake(cutlass.BFloat16, (T, d)), fake(cutlass.Float32, (T, E)),
                          fake(cutlass.BFloat16, (E * C, d)), fake(cutlass.Float32, (T, 2)),
                          fake(cutlass.Int64, (T, 2)), fake(cutlass.Int64, (T, 2)),
                          fake(cutlass.Int32, (nch, 2 * E)), fake(cutlass.Int32, (2 * E,)),
                          fake(cutlass.Int32, (E * C,)), make_fake_stream(use_tvm_ffi_env_stream=True),
                          lpt, lpt.bit_length() - 1, E, C, options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(hidden_states, router_logits):
    """Return (dispatched [E, C, d] bf16, combine_weights [T, 2] fp32, expert_ids [T, 2] i64, slots [T, 2] i64)."""
    h = hidden_states.contiguous()
    logits = router_logits.contiguous().float()
    T, E = logits.shape
    d = h.shape[1]
    C = 2 * math.ceil(T / E)
    if E % 4 != 0 or 2 * E > THREADS or d % VEC != 0:
        raise ValueError("unsupported shape")
    dev = h.device
    nch = (T + CHUNK - 1) // CHUNK
    dispatched = torch.empty((E, C, d), dtype=h.dtype, device=dev)
    combine = torch.empty((T, 2), dtype=torch.float32, device=dev)
    expert_ids = torch.empty((T, 2), dtype=torch.int64, device=dev)
    slots = torch.empty((T, 2), dtype=torch.int64, device=dev)
    cnt = torch.empty((nch, 2 * E), dtype=torch.int32, device=dev)
    tot = torch.empty((2 * E,), dtype=torch.int32, device=dev)
    src = torch.empty((E * C,), dtype=torch.int32, device=dev)
    _compiled_for(T, E, d, C)(h, logits, dispatched.view(E * C, d), combine, expert_ids, slots, cnt, tot, src)
    return dispatched, combine, expert_ids, slots
