"""Problem 48 (Qwen3-Next MoE front: router, top-10 of 512, sigmoid-gated shared expert), CuTe DSL: four kernels.

The three GEMMs are tiled SIMT GEMMs C = A @ B^T (A [M, K], B [N, K], bf16, K contiguous) with fp32 accumulation:
CTA tile 128 x 128, BK = 32, 256 threads each owning an 8 x 8 register block. Per K step every thread loads 16
contiguous bf16 of A and of B (16-byte loads), widens them to fp32 and stores them k-major in shared memory
(2 x 16 KB); the inner loop reads 8 + 8 fp32 per k and does 64 FMAs. Rows past T (or N) are clamped on load and
never stored.
 1. router GEMM: logits [T, 512] accumulated and kept in float64 (fragments widened, float64 FMAs): a
    sequential fp32 sum over K = 2048 moved the renormalised weights by ~2x the comparator's allowance (6e-7);
    float64 makes the logits (nearly) exact, as the float64 anchor has them.
 2. top-10 + shared gate, one warp per token: lane l holds experts l, l + 32, ... (16 logits); ten rounds of a
    butterfly arg-max over (float64 logit, expert id) (ties -> lower id; softmax is monotonic, so the order of the logits
    is the order of the probabilities); weight_i = exp(l_i - max) / sum over the ten chosen (float64: the softmax
    normaliser cancels in the renormalisation). The warp also forms the shared-expert gate
    bf16(sigmoid(bf16(x[t] . w_shared_gate))) (fp32 dot, butterfly sum) into an fp32 buffer.
 3. gate/up + SwiGLU: the B tile's rows are 64 rows of W_gate and the same 64 of W_up; a thread holds 4 gate and
    the matching 4 up columns, so the epilogue stores h = bf16(bf16(silu(bf16(g))) * bf16(u)).
 4. down projection: shared_out = bf16(gate[t] * bf16(h @ W_down^T)).
Compiled once per shape from fake tensors (TVM-FFI route); all launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
LD = 16  # bf16 per thread per tile load (BM * BK / THREADS)
HALF = BN // 2  # gate (or up) columns per CTA in the SwiGLU GEMM
TOP_K = 10
WARPS = 4  # tokens per CTA in the top-k kernel


@cute.jit
def _mainloop(mA: cute.Tensor, mB0: cute.Tensor, mB1: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor,
              acc: cute.Tensor, tidx, m0, n0, split: cutlass.Constexpr, wide: cutlass.Constexpr = False):
    """acc += A[m0:m0+128] @ B^T over all of K. split: B rows 0..63 from mB0[n0:], rows 64..127 from mB1[n0:];
    a thread's fragment is columns 4tx..4tx+3 and 64+4tx..64+4tx+3. Else B rows from mB0[n0:n0+128] (clamped to N).
    wide: acc is float64 (the fragments are widened to float64 and the FMAs are float64)."""
    M, K = mA.shape
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    b_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    a_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    b_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    a64 = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float64)
    b64 = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float64)

    r = tidx % BM
    kh = tidx // BM
    kc = kh * LD
    a_row = m0 + r
    if a_row > M - 1:
        a_row = M - 1
    b_row = n0 + r  # plain mode: rows past N read a valid row, never stored
    if b_row > mB0.shape[0] - 1:
        b_row = mB0.shape[0] - 1
    for kt in range(K // BK):
        cute.autovec_copy(cute.local_tile(mA, (1, LD), (a_row, kt * (BK // LD) + kh))[0, None], a_ld)
        if cutlass.const_expr(split):
            if r < HALF:
                cute.autovec_copy(cute.local_tile(mB0, (1, LD), (n0 + r, kt * (BK // LD) + kh))[0, None], b_ld)
            else:
                cute.autovec_copy(cute.local_tile(mB1, (1, LD), (n0 + r - HALF, kt * (BK // LD) + kh))[0, None],
                                  b_ld)
        else:
            cute.autovec_copy(cute.local_tile(mB0, (1, LD), (b_row, kt * (BK // LD) + kh))[0, None], b_ld)
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
            if cutlass.const_expr(wide):
                a64.store(a_frag.load().to(cutlass.Float64))
                b64.store(b_frag.load().to(cutlass.Float64))
                for i in cutlass.range_constexpr(TM):
                    for j in cutlass.range_constexpr(TN):
                        acc[i, j] = acc[i, j] + a64[i] * b64[j]
            else:
                for i in cutlass.range_constexpr(TM):
                    for j in cutlass.range_constexpr(TN):
                        acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        cute.arch.sync_threads()


@cute.kernel
def _swiglu_kernel(mX: cute.Tensor, mWg: cute.Tensor, mWu: cute.Tensor, mH: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mX.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    _mainloop(mX, mWg, mWu, sA, sB, acc, tidx, bm * BM, bn * HALF, True)

    g = cute.make_rmem_tensor(cute.make_layout(TN // 2), cutlass.Float32)
    u = cute.make_rmem_tensor(cute.make_layout(TN // 2), cutlass.Float32)
    h = cute.make_rmem_tensor(cute.make_layout(TN // 2), mH.element_type)
    for i in cutlass.range_constexpr(TM):
        m = bm * BM + ty * TM + i
        if m < M:
            for j in cutlass.range_constexpr(TN // 2):
                g[j] = acc[i, j]
                u[j] = acc[i, TN // 2 + j]
            gv = g.load().to(mH.element_type).to(cutlass.Float32)
            uv = u.load().to(mH.element_type).to(cutlass.Float32)
            sv = (gv / (cute.full_like(gv, 1.0) + cute.math.exp(-gv))).to(mH.element_type).to(cutlass.Float32)
            h.store((sv * uv).to(mH.element_type))
            cute.autovec_copy(h, cute.local_tile(mH, (1, TN // 2), (m, bn * (HALF // (TN // 2)) + tx))[0, None])


@cute.kernel
def _router_gemm_kernel(mX: cute.Tensor, mWr: cute.Tensor, mL: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mX.shape[0]
    N = mWr.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float64)
    acc.fill(0.0)
    _mainloop(mX, mWr, mWr, sA, sB, acc, tidx, bm * BM, bn * BN, False, True)
    col = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float64)
    if col * TN < N:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < M:
                o.store(acc[i, None].load())
                cute.autovec_copy(o, cute.local_tile(mL, (1, TN), (m, col))[0, None])


@cute.jit
def _warp_sum(v):
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
def _topk_gate_kernel(mL: cute.Tensor, mX: cute.Tensor, mSG: cute.Tensor, mTW: cute.Tensor, mTI: cute.Tensor,
                      mG: cute.Tensor, vg: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    row = bidx * WARPS + warp
    T, E = mL.shape
    d = mX.shape[1]
    per_lane = E // 32
    n_vec = d // (32 * vg)
    neg_inf = cutlass.Float64(-float("inf"))
    if row < T:  # warp-uniform
        xo = cute.make_rmem_tensor((per_lane,), cutlass.Float64)
        xm = cute.make_rmem_tensor((per_lane,), cutlass.Float64)
        for j in cutlass.range_constexpr(per_lane):
            xo[j] = mL[row, j * 32 + lane]
            xm[j] = xo[j]
        my_id = cutlass.Int32(0)
        my_v = neg_inf
        row_max = neg_inf
        for k in cutlass.range_constexpr(TOP_K):
            bv = xm[0]
            bi = lane
            for j in cutlass.range_constexpr(1, per_lane):
                if xm[j] > bv:
                    bv = xm[j]
                    bi = j * 32 + lane
            bv, bi = _warp_argmax(bv, bi)
            for j in cutlass.range_constexpr(per_lane):
                if j * 32 + lane == bi:
                    xm[j] = neg_inf
            if cutlass.const_expr(k == 0):
                row_max = bv
            if lane == k:
                my_id = bi
                my_v = bv
        e = cutlass.Float64(0.0)
        if lane < TOP_K:
            e = cute.math.exp(my_v - row_max)
        denom = _warp_sum(e)
        if lane < TOP_K:
            mTW[row, lane] = (e / denom).to(cutlass.Float32)
            mTI[row, lane] = my_id.to(cutlass.Int64)

        # shared-expert gate: bf16(sigmoid(bf16(x[row] . w_shared_gate)))
        part = cutlass.Float32(0.0)
        for j in cutlass.range_constexpr(n_vec):
            xv = cute.local_tile(mX, (1, vg), (row, j * 32 + lane))[0, None].load().to(cutlass.Float32)
            wv = cute.local_tile(mSG, (1, vg), (0, j * 32 + lane))[0, None].load().to(cutlass.Float32)
            part = part + (xv * wv).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
        z = _warp_sum(part)
        zb = z.to(cutlass.BFloat16).to(cutlass.Float32)
        sg = cutlass.Float32(1.0) / (cutlass.Float32(1.0) + cute.math.exp(-zb))
        if lane == 0:
            mG[row] = sg.to(cutlass.BFloat16).to(cutlass.Float32)


@cute.kernel
def _down_gate_kernel(mH: cute.Tensor, mWd: cute.Tensor, mG: cute.Tensor, mOut: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    M = mH.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    _mainloop(mH, mWd, mWd, sA, sB, acc, tidx, bm * BM, bn * BN, False)
    col = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), mOut.element_type)
    for i in cutlass.range_constexpr(TM):
        m = bm * BM + ty * TM + i
        if m < M:
            down = acc[i, None].load().to(mOut.element_type).to(cutlass.Float32)
            o.store((down * mG[m]).to(mOut.element_type))
            cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, col))[0, None])


@cute.jit
def _moe_front(mX: cute.Tensor, mWr: cute.Tensor, mWg: cute.Tensor, mWu: cute.Tensor, mWd: cute.Tensor,
               mSG: cute.Tensor, mL: cute.Tensor, mTW: cute.Tensor, mTI: cute.Tensor, mG: cute.Tensor,
               mH: cute.Tensor, mOut: cute.Tensor, stream):
    T, d = mX.shape
    vg = 8 if d % 256 == 0 else 4  # bf16 per lane load in the gate dot (static shapes)
    E = mWr.shape[0]
    inter = mWg.shape[0]
    mt = (T + BM - 1) // BM
    _router_gemm_kernel(mX, mWr, mL).launch(grid=[(E + BN - 1) // BN, mt, 1], block=[THREADS, 1, 1],
                                            stream=stream)
    _topk_gate_kernel(mL, mX, mSG, mTW, mTI, mG, vg).launch(grid=[(T + WARPS - 1) // WARPS, 1, 1],
                                                            block=[WARPS * 32, 1, 1], stream=stream)
    _swiglu_kernel(mX, mWg, mWu, mH).launch(grid=[inter // HALF, mt, 1], block=[THREADS, 1, 1], stream=stream)
    _down_gate_kernel(mH, mWd, mG, mOut).launch(grid=[d // BN, mt, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(t, d, e, inter):
    key = (t, d, e, inter)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(dtype, shape):
            order = (1, 0) if len(shape) == 2 else (0,)
            return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        fn = cute.compile(_moe_front,
                          fake(bf16, (t, d)), fake(bf16, (e, d)), fake(bf16, (inter, d)), fake(bf16, (inter, d)),
                          fake(bf16, (d, inter)), fake(bf16, (1, d)), fake(cutlass.Float64, (t, e)), fake(f32, (t, TOP_K)),
                          fake(cutlass.Int64, (t, TOP_K)), fake(f32, (t,)), fake(bf16, (t, inter)),
                          fake(bf16, (t, d)),
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, w_router, w_gate, w_up, w_down, w_shared_gate):
    """Return (topk_weights [T, 10] fp32, topk_ids [T, 10] int64, shared_out [T, d] bf16)."""
    t, d = x.shape
    e = w_router.shape[0]
    inter = w_gate.shape[0]
    if (e % 32 != 0 or e < TOP_K or d % BN != 0 or d % 128 != 0 or inter % HALF != 0 or inter % BK != 0):
        raise ValueError(f"unsupported shape: d = {d}, E = {e}, intermediate {inter}")
    args = [a.contiguous() for a in (x, w_router, w_gate, w_up, w_down, w_shared_gate)]
    dev = x.device
    logits = torch.empty((t, e), dtype=torch.float64, device=dev)
    topk_weights = torch.empty((t, TOP_K), dtype=torch.float32, device=dev)
    topk_ids = torch.empty((t, TOP_K), dtype=torch.int64, device=dev)
    gate = torch.empty((t,), dtype=torch.float32, device=dev)
    h = torch.empty((t, inter), dtype=x.dtype, device=dev)
    out = torch.empty((t, d), dtype=x.dtype, device=dev)
    if t > 0:
        _compiled_for(t, d, e, inter)(*args, logits, topk_weights, topk_ids, gate, h, out)
    return topk_weights, topk_ids, out
