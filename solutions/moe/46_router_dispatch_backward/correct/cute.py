"""Problem 46 (Qwen3-30B-A3B router + permute + combine backward), CuTe DSL: five kernels, all CuTe.

The three router GEMMs are tiled SIMT GEMMs with fp32 accumulation: CTA tile 128 x 128, BK = 32, 256 threads each
owning an 8 x 8 register block. Per K step every thread stages two 8-element vectors of each operand (16-byte
loads of bf16, or two 16-byte loads of fp32), widened to fp32 and stored k-major in shared memory (2 x 16 KB); the
inner loop reads 8 + 8 fp32 per k and does 64 FMAs. An operand is either K-contiguous ([rows, K]: a thread takes 8
consecutive k of one row, stored transposed) or rows-contiguous ([K, rows]: 8 consecutive rows of one k, stored
as they are). Rows/columns past the matrix are clamped on load and never stored; k past the end is zero-filled.
 1. logits = x @ W^T, split-K in 4 slices of d (256 CTAs instead of 64): fp32 partials [4, T, E].
 2. routing backward, one warp per token (4 per CTA): lane l holds experts l, l + 32, ... (partials summed in slice
    order), softmax by butterfly max/sum; p_j, s = sum p_j, w_j = p_j / s from the same fp32 expressions; for each
    choice j the warp walks the expert_out row row_idx[t, j] in 16-byte vectors with grad_out[t] held in
    registers: dw_j = <grad_out[t], y> (butterfly sum) and grad_expert_out[row] = bf16(w_j * grad_out[t]) (every
    permuted row is written once: row_idx is a permutation). Then dp_j = (dw_j - sum w dw) / s,
    c = sum_j p_j dp_j and dlogits[t, e] = probs[e] * (dp(e) - c) in fp32 [T, E] (coalesced by lane).
 3. grad_x = bf16(sum_j grad_x_perm[row_idx[t, j]] + dlogits @ W): A = dlogits (fp32, K = E contiguous), B = W as
    [K = E, N = d]; the epilogue gathers the k permuted gradient rows (16-byte loads, fp32 sum in choice order).
 4. grad_W = dlogits^T @ x, both operands [K = T, rows]: split-K over the tokens in 16 slices of 512 (256 CTAs)
    into fp32 partials [16, E, d];
 5. a fixed-order sum of the slices rounded once to bf16 (deterministic, no atomics).
Router math in fp32 as the reference; outputs rounded once. Compiled once per shape from fake tensors (TVM-FFI
route); all launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
VEC = 8  # elements per staged vector
WARPS = 4  # tokens per CTA in the routing kernel
RED_THREADS = 256


@cute.jit
def _stage(mX: cute.Tensor, sX: cute.Tensor, tidx, r0, kb, k1, kc: cutlass.Constexpr):
    """Stage rows r0..r0+127, k = kb..kb+31 of operand X into sX [BK, 128] (fp32, k-major).
    kc: X is [R, K] (K contiguous), else X is [K, R] (R contiguous). Rows are clamped, k >= k1 zero-filled."""
    ld = cute.make_rmem_tensor(cute.make_layout(VEC), mX.element_type)
    w = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    for p in cutlass.range_constexpr((BM * BK // VEC) // THREADS):
        u = tidx + p * THREADS
        if cutlass.const_expr(kc):
            r = u % BM
            q = u // BM
            gr = cutlass.min(r0 + r, mX.shape[0] - 1)
            gk = kb + q * VEC
            if gk < k1:
                cute.autovec_copy(cute.local_tile(mX, (1, VEC), (gr, gk // VEC))[0, None], ld)
                w.store(ld.load().to(cutlass.Float32))
            else:
                w.fill(0.0)
            for i in cutlass.range_constexpr(VEC):
                sX[q * VEC + i, r] = w[i]
        else:
            seg = u % (BM // VEC)
            kr = u // (BM // VEC)
            gseg = cutlass.min(r0 // VEC + seg, mX.shape[1] // VEC - 1)
            gk = kb + kr
            if gk < k1:
                cute.autovec_copy(cute.local_tile(mX, (1, VEC), (gk, gseg))[0, None], ld)
                w.store(ld.load().to(cutlass.Float32))
            else:
                w.fill(0.0)
            cute.autovec_copy(w, cute.local_tile(sX[kr, None], (VEC,), (seg,)))


@cute.jit
def _mainloop(mA: cute.Tensor, mB: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor, acc: cute.Tensor, tidx,
              m0, n0, k0, k1, nk, a_kc: cutlass.Constexpr, b_kc: cutlass.Constexpr):
    """acc[8 x 8] += A[m0:m0+128, k0:k1] @ B[n0:n0+128, k0:k1]^T over nk K steps of BK."""
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    for kt in range(nk):
        kb = k0 + kt * BK
        _stage(mA, sA, tidx, m0, kb, k1, a_kc)
        _stage(mB, sB, tidx, n0, kb, k1, b_kc)
        cute.arch.sync_threads()
        for kk in cutlass.range_constexpr(BK):
            cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
            cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
            for i in cutlass.range_constexpr(TM):
                for j in cutlass.range_constexpr(TN):
                    acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        cute.arch.sync_threads()


@cute.jit
def _smem_tiles():
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    return sA, sB


@cute.kernel
def _logits_kernel(mX: cute.Tensor, mW: cute.Tensor, mLp: cute.Tensor, ks: cutlass.Constexpr):
    """mLp [S*T, E] fp32: slice z holds x[:, z*ks:(z+1)*ks] @ W[:, z*ks:(z+1)*ks]^T."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, bz = cute.arch.block_idx()
    T = mX.shape[0]
    E = mW.shape[0]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    k0 = bz * ks
    _mainloop(mX, mW, sA, sB, acc, tidx, bm * BM, bn * BN, k0, k0 + ks, (ks + BK - 1) // BK, True, True)
    col = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    if col * TN < E:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < T:
                o.store(acc[i, None].load())
                cute.autovec_copy(o, cute.local_tile(mLp, (1, TN), (bz * T + m, col))[0, None])


@cute.jit
def _warp_sum(v):
    for s in cutlass.range_constexpr(5):
        v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> s)
    return v


@cute.kernel
def _route_bwd_kernel(mLp: cute.Tensor, mTI: cute.Tensor, mRI: cute.Tensor, mY: cute.Tensor, mGO: cute.Tensor,
                      mGEO: cute.Tensor, mDL: cute.Tensor, S: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    T, K = mTI.shape
    E = mDL.shape[1]
    d = mGO.shape[1]
    per = (E + 31) // 32
    nv = d // VEC
    vpl = (nv + 31) // 32
    t = bidx * WARPS + warp
    f32 = cutlass.Float32
    if t < T:  # warp-uniform
        lg = cute.make_rmem_tensor(cute.make_layout(per), f32)
        for j in cutlass.range_constexpr(per):
            e = j * 32 + lane
            lg[j] = f32(-float("inf"))
            if e < E:
                s_ = mLp[t, e]
                for z in cutlass.range_constexpr(1, S):
                    s_ = s_ + mLp[z * T + t, e]
                lg[j] = s_
        mx = lg[0]
        for j in cutlass.range_constexpr(1, per):
            mx = cute.arch.fmax(mx, lg[j])
        for s in cutlass.range_constexpr(5):
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=16 >> s))
        ex = cute.make_rmem_tensor(cute.make_layout(per), f32)
        zs = f32(0.0)
        for j in cutlass.range_constexpr(per):
            ex[j] = cute.math.exp(lg[j] - mx)
            zs = zs + ex[j]
        z = _warp_sum(zs)

        # the chosen experts: p_j from the same fp32 expressions as the lanes' probs
        ids = cute.make_rmem_tensor(cute.make_layout(K), cutlass.Int32)
        pk = cute.make_rmem_tensor(cute.make_layout(K), f32)
        wk = cute.make_rmem_tensor(cute.make_layout(K), f32)
        dw = cute.make_rmem_tensor(cute.make_layout(K), f32)
        ssum = f32(0.0)
        for j in cutlass.range_constexpr(K):
            ids[j] = mTI[t, j].to(cutlass.Int32)
            s_ = mLp[t, ids[j]]
            for zz in cutlass.range_constexpr(1, S):
                s_ = s_ + mLp[zz * T + t, ids[j]]
            pk[j] = cute.math.exp(s_ - mx) / z
            ssum = ssum + pk[j]
        for j in cutlass.range_constexpr(K):
            wk[j] = pk[j] / ssum

        # grad_out[t] in registers (zeros past d)
        gl = cute.make_rmem_tensor(cute.make_layout(VEC), mGO.element_type)
        go = cute.make_rmem_tensor(cute.make_layout((VEC, vpl)), f32)
        go.fill(0.0)
        for v in cutlass.range_constexpr(vpl):
            c = v * 32 + lane
            if c < nv:
                cute.autovec_copy(cute.local_tile(mGO, (1, VEC), (t, c))[0, None], gl)
                go[None, v].store(gl.load().to(f32))
        yl = cute.make_rmem_tensor(cute.make_layout(VEC), mY.element_type)
        ob = cute.make_rmem_tensor(cute.make_layout(VEC), mGEO.element_type)
        for j in cutlass.range_constexpr(K):
            row = mRI[t, j].to(cutlass.Int32)
            part = f32(0.0)
            for v in cutlass.range_constexpr(vpl):
                c = v * 32 + lane
                if c < nv:
                    cute.autovec_copy(cute.local_tile(mY, (1, VEC), (row, c))[0, None], yl)
                    gv = go[None, v].load()
                    part = part + (yl.load().to(f32) * gv).reduce(cute.ReductionOp.ADD, f32(0.0),
                                                                  reduction_profile=0)
                    ob.store((gv * wk[j]).to(mGEO.element_type))
                    cute.autovec_copy(ob, cute.local_tile(mGEO, (1, VEC), (row, c))[0, None])
            dw[j] = _warp_sum(part)

        wdw = f32(0.0)
        for j in cutlass.range_constexpr(K):
            wdw = wdw + wk[j] * dw[j]
        cc = f32(0.0)
        for j in cutlass.range_constexpr(K):
            dw[j] = (dw[j] - wdw) / ssum  # dp_j
            cc = cc + pk[j] * dw[j]
        for jj in cutlass.range_constexpr(per):
            e = jj * 32 + lane
            dpr = f32(0.0)
            for j in cutlass.range_constexpr(K):
                if ids[j] == e:
                    dpr = dw[j]
            if e < E:
                mDL[t, e] = (ex[jj] / z) * (dpr - cc)


@cute.kernel
def _grad_x_kernel(mDL: cute.Tensor, mW: cute.Tensor, mRI: cute.Tensor, mGXP: cute.Tensor, mGX: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, _ = cute.arch.block_idx()
    T, E = mDL.shape
    d = mW.shape[1]
    K = mRI.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    _mainloop(mDL, mW, sA, sB, acc, tidx, bm * BM, bn * BN, 0, E, (E + BK - 1) // BK, True, False)
    col = bn * (BN // TN) + tx
    gl = cute.make_rmem_tensor(cute.make_layout(TN), mGXP.element_type)
    o = cute.make_rmem_tensor(cute.make_layout(TN), mGX.element_type)
    if col * TN < d:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < T:
                gs = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
                gs.fill(0.0)
                for j in cutlass.range_constexpr(K):
                    row = mRI[m, j].to(cutlass.Int32)
                    cute.autovec_copy(cute.local_tile(mGXP, (1, TN), (row, col))[0, None], gl)
                    gs.store(gs.load() + gl.load().to(cutlass.Float32))
                o.store((gs.load() + acc[i, None].load()).to(mGX.element_type))
                cute.autovec_copy(o, cute.local_tile(mGX, (1, TN), (m, col))[0, None])


@cute.kernel
def _grad_w_kernel(mDL: cute.Tensor, mX: cute.Tensor, mGWp: cute.Tensor, ks: cutlass.Constexpr):
    """mGWp [S*E, d] fp32: slice z holds dlogits[z*ks:(z+1)*ks]^T @ x[z*ks:(z+1)*ks]."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, bz = cute.arch.block_idx()
    T, E = mDL.shape
    d = mX.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    sA, sB = _smem_tiles()
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    acc.fill(0.0)
    k0 = bz * ks
    k1 = cutlass.min(k0 + ks, T)
    _mainloop(mDL, mX, sA, sB, acc, tidx, bm * BM, bn * BN, k0, k1, (ks + BK - 1) // BK, False, False)
    col = bn * (BN // TN) + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    if col * TN < d:
        for i in cutlass.range_constexpr(TM):
            m = bm * BM + ty * TM + i
            if m < E:
                o.store(acc[i, None].load())
                cute.autovec_copy(o, cute.local_tile(mGWp, (1, TN), (bz * E + m, col))[0, None])


@cute.kernel
def _reduce_kernel(mGWp: cute.Tensor, mGW: cute.Tensor, S: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    E, d = mGW.shape
    nv = d // VEC
    i = bidx * RED_THREADS + tidx
    if i < E * nv:
        e = i // nv
        c = i - e * nv
        pl = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
        s_ = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
        o = cute.make_rmem_tensor(cute.make_layout(VEC), mGW.element_type)
        cute.autovec_copy(cute.local_tile(mGWp, (1, VEC), (e, c))[0, None], s_)
        for z in cutlass.range_constexpr(1, S):
            cute.autovec_copy(cute.local_tile(mGWp, (1, VEC), (z * E + e, c))[0, None], pl)
            s_.store(s_.load() + pl.load())
        o.store(s_.load().to(mGW.element_type))
        cute.autovec_copy(o, cute.local_tile(mGW, (1, VEC), (e, c))[0, None])


@cute.jit
def _router_bwd(mX: cute.Tensor, mW: cute.Tensor, mTI: cute.Tensor, mRI: cute.Tensor, mY: cute.Tensor,
                mGO: cute.Tensor, mGXP: cute.Tensor, mLp: cute.Tensor, mDL: cute.Tensor, mGWp: cute.Tensor,
                mGX: cute.Tensor, mGW: cute.Tensor, mGEO: cute.Tensor, sl: cutlass.Constexpr,
                sw: cutlass.Constexpr, stream):
    T, d = mX.shape
    E = mW.shape[0]
    mt = (T + BM - 1) // BM
    _logits_kernel(mX, mW, mLp, d // sl).launch(grid=[(E + BN - 1) // BN, mt, sl], block=[THREADS, 1, 1],
                                                stream=stream)
    _route_bwd_kernel(mLp, mTI, mRI, mY, mGO, mGEO, mDL, sl).launch(grid=[(T + WARPS - 1) // WARPS, 1, 1],
                                                                    block=[WARPS * 32, 1, 1], stream=stream)
    _grad_x_kernel(mDL, mW, mRI, mGXP, mGX).launch(grid=[(d + BN - 1) // BN, mt, 1], block=[THREADS, 1, 1],
                                                   stream=stream)
    ksw = ((T + sw - 1) // sw + BK - 1) // BK * BK
    _grad_w_kernel(mDL, mX, mGWp, ksw).launch(grid=[(d + BN - 1) // BN, (E + BM - 1) // BM, sw],
                                              block=[THREADS, 1, 1], stream=stream)
    _reduce_kernel(mGWp, mGW, sw).launch(grid=[(E * (d // VEC) + RED_THREADS - 1) // RED_THREADS, 1, 1],
                                         block=[RED_THREADS, 1, 1], stream=stream)


def _splits(t, d):
    sl = 4 if d % (4 * BK) == 0 and d >= 1024 else 1  # logits: slices of d
    sw = max(1, min(16, t // 512))  # grad_W: slices of the tokens
    return sl, sw


_COMPILED = {}


def _compiled_for(t, d, e, k):
    key = (t, d, e, k)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        sl, sw = _splits(t, d)
        bf16, f32, i64 = cutlass.BFloat16, cutlass.Float32, cutlass.Int64
        fn = cute.compile(_router_bwd, fake(bf16, (t, d)), fake(bf16, (e, d)), fake(i64, (t, k)),
                          fake(i64, (t, k)), fake(bf16, (t * k, d)), fake(bf16, (t, d)), fake(bf16, (t * k, d)),
                          fake(f32, (sl * t, e)), fake(f32, (t, e)), fake(f32, (sw * e, d)), fake(bf16, (t, d)),
                          fake(bf16, (e, d)), fake(bf16, (t * k, d)), sl, sw,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm):
    """Return (grad_x [T, d] bf16, grad_router_w [E, d] bf16, grad_expert_out [T*k, d] bf16)."""
    t, d = x.shape
    e = router_w.shape[0]
    k = topk_idx.shape[1]
    if d % VEC != 0 or e % VEC != 0:
        raise ValueError(f"d = {d} and E = {e} must be multiples of {VEC}")
    args = [a.contiguous() for a in (x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm)]
    dev = x.device
    sl, sw = _splits(t, d)
    lp = torch.empty((sl * t, e), dtype=torch.float32, device=dev)
    dl = torch.empty((t, e), dtype=torch.float32, device=dev)
    gwp = torch.empty((sw * e, d), dtype=torch.float32, device=dev)
    grad_x = torch.empty((t, d), dtype=x.dtype, device=dev)
    grad_w = torch.empty((e, d), dtype=router_w.dtype, device=dev)
    grad_eo = torch.empty((t * k, d), dtype=expert_out.dtype, device=dev)
    if t > 0:
        _compiled_for(t, d, e, k)(*args, lp, dl, gwp, grad_x, grad_w, grad_eo)
    return grad_x, grad_w, grad_eo
