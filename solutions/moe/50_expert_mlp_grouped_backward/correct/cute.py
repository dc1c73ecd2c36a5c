"""Problem 50 (Qwen3-30B-A3B routed experts, EP-8: grouped SwiGLU MLP backward), CuTe DSL: six kernels, all CuTe;
no host synchronisation (the value-dependent group sizes stay on the device).

All GEMMs are tiled SIMT GEMMs with fp32 accumulation: CTA tile 128 x 128, BK = 32, 256 threads each owning an
8 x 8 register block. Per K step every thread stages two 8-element bf16 vectors (16-byte loads) of each operand,
widened to fp32 and stored k-major in shared memory (2 x 16 KB); the inner loop reads 8 + 8 fp32 per k and does
64 FMAs. An operand is either K-contiguous ([rows, K]: a thread takes 8 consecutive k of one row, stored
transposed) or rows-contiguous ([K, rows]: 8 consecutive rows of one k). Rows/columns past the matrix are clamped
on load and never stored; k past the group's end is zero-filled. The weights are viewed 2-D ([E * rows, cols]).
 0. schedule (one warp): exclusive offsets of tokens_per_expert, and the grouped-M tile table (expert, first row,
    end row) of 128-row tiles, at most N/128 + E entries (the unused tail marked -1: those CTAs exit at once).
 1. h = bf16(X @ W_gate_up[e]^T) [N, 2I] over the tile table (eager bf16 GEMM output, as the reference has it).
 2. da = bf16(dY @ W_down[e]) over the tile table, with the SwiGLU backward in the epilogue: a thread's 8
    columns c.. read gate = h[:, c..] and up = h[:, I + c..]; sig = sigmoid(gate), silu = gate * sig,
    a = bf16(silu * up), dgate = da * up * (sig * (1 + gate * (1 - sig))), dup = da * silu (fp32), stored as
    a [N, I] and dh = [bf16(dgate), bf16(dup)] [N, 2I].
 3. grad_W_down[e] = dY^T @ a (both operands [K = rows of e, *]): grid (I/128, d/128, E), each CTA loops over
    its expert's rows (an empty expert writes zeros).
 4. grad_W_gate_up[e] = dh^T @ X, the same way: grid (d/128, 2I/128, E).
 5. grad_x = dh @ W_gate_up[e] over the tile table (K = 2I).
Every output rounded once to bf16 from fp32. Compiled once per shape from fake tensors (TVM-FFI route); all
launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BM, BN, BK = 128, 128, 32
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 256
VEC = 8


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
def _gemm(mA: cute.Tensor, mB: cute.Tensor, acc: cute.Tensor, tidx, m0, n0, k0, k1, boff,
          a_kc: cutlass.Constexpr, b_kc: cutlass.Constexpr):
    """acc[8 x 8] = A[m0:m0+128, k0:k1] @ B[n0:n0+128, boff+k0:boff+k1]^T (B's k shifted by boff)."""
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BM), stride=(BM, 1)), byte_alignment=16)
    sB = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BK, BN), stride=(BN, 1)), byte_alignment=16)
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    acc.fill(0.0)
    for kt in range((k1 - k0 + BK - 1) // BK):
        kb = k0 + kt * BK
        _stage(mA, sA, tidx, m0, kb, k1, a_kc)
        _stage(mB, sB, tidx, n0, kb + boff, k1 + boff, b_kc)
        cute.arch.sync_threads()
        for kk in cutlass.range_constexpr(BK):
            cute.autovec_copy(cute.local_tile(sA[kk, None], (TM,), (ty,)), a_frag)
            cute.autovec_copy(cute.local_tile(sB[kk, None], (TN,), (tx,)), b_frag)
            for i in cutlass.range_constexpr(TM):
                for j in cutlass.range_constexpr(TN):
                    acc[i, j] = acc[i, j] + a_frag[i] * b_frag[j]
        cute.arch.sync_threads()


@cute.jit
def _store_rows(acc: cute.Tensor, mO: cute.Tensor, tidx, m0, m1, orow, n0):
    """Rows m0 + i < m1 of the 128 x 128 tile to mO[orow + i - m0, n0 + ...] as bf16 (columns < N only)."""
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    col = n0 // TN + tx
    o = cute.make_rmem_tensor(cute.make_layout(TN), mO.element_type)
    if col * TN < mO.shape[1]:
        for i in cutlass.range_constexpr(TM):
            m = m0 + ty * TM + i
            if m < m1:
                o.store(acc[i, None].load().to(mO.element_type))
                cute.autovec_copy(o, cute.local_tile(mO, (1, TN), (orow + ty * TM + i, col))[0, None])


@cute.kernel
def _schedule_kernel(mTPE: cute.Tensor, mOff: cute.Tensor, mTT: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    E = mTPE.shape[0]
    maxt = mTT.shape[0]
    i32 = cutlass.Int32
    smem = cutlass.memory.SmemAllocator()
    sOff = smem.allocate_tensor(i32, cute.make_layout(E + 1), 16)
    sT = smem.allocate_tensor(i32, cute.make_layout(E + 1), 16)
    if tidx == 0:
        run = i32(0)
        tr = i32(0)
        for e in range(E):
            sOff[e] = run
            sT[e] = tr
            n = mTPE[e].to(i32)
            run = run + n
            tr = tr + (n + BM - 1) // BM
        sOff[E] = run
        sT[E] = tr
    cute.arch.sync_threads()
    for e in range(tidx, E + 1, 32):
        mOff[e] = sOff[e]
    for i in range(tidx, maxt, 32):
        ex_id = i32(-1)
        for e in range(E):
            if sT[e] <= i:
                if i < sT[e + 1]:
                    ex_id = e
        ms = i32(0)
        me = i32(0)
        if ex_id >= 0:
            ms = sOff[ex_id] + (i - sT[ex_id]) * BM
            me = cutlass.min(ms + BM, sOff[ex_id + 1])
        mTT[i, 0] = ex_id
        mTT[i, 1] = ms
        mTT[i, 2] = me


@cute.kernel
def _h_kernel(mX: cute.Tensor, mWgu: cute.Tensor, mTT: cute.Tensor, mH: cute.Tensor):
    """h = bf16(X @ W_gate_up[e]^T): B rows e * 2I + n (K = d contiguous)."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bt, _ = cute.arch.block_idx()
    d = mX.shape[1]
    two_i = mH.shape[1]
    e = mTT[bt, 0]
    if e >= 0:  # CTA-uniform
        ms = mTT[bt, 1]
        me = mTT[bt, 2]
        acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
        _gemm(mX, mWgu, acc, tidx, ms, e * two_i + bn * BN, 0, d, 0, True, True)
        _store_rows(acc, mH, tidx, ms, me, ms, bn * BN)


@cute.kernel
def _da_kernel(mGY: cute.Tensor, mWd: cute.Tensor, mTT: cute.Tensor, mH: cute.Tensor, mAct: cute.Tensor,
               mDH: cute.Tensor):
    """da = bf16(dY @ W_down[e]) (B = W_down[e] as [K = d, N = I], rows e * d + k), SwiGLU backward epilogue."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bt, _ = cute.arch.block_idx()
    d = mGY.shape[1]
    inter = mAct.shape[1]
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    e = mTT[bt, 0]
    if e >= 0:  # CTA-uniform
        ms = mTT[bt, 1]
        me = mTT[bt, 2]
        acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
        _gemm(mGY, mWd, acc, tidx, ms, bn * BN, 0, d, e * d, True, False)
        f32 = cutlass.Float32
        bf16 = mAct.element_type
        col = bn * (BN // TN) + tx
        gl = cute.make_rmem_tensor(cute.make_layout(TN), mH.element_type)
        ul = cute.make_rmem_tensor(cute.make_layout(TN), mH.element_type)
        ao = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
        go = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
        uo = cute.make_rmem_tensor(cute.make_layout(TN), bf16)
        if col * TN < inter:
            for i in cutlass.range_constexpr(TM):
                m = ms + ty * TM + i
                if m < me:
                    cute.autovec_copy(cute.local_tile(mH, (1, TN), (m, col))[0, None], gl)
                    cute.autovec_copy(cute.local_tile(mH, (1, TN), (m, inter // TN + col))[0, None], ul)
                    g = gl.load().to(f32)
                    u = ul.load().to(f32)
                    da = acc[i, None].load().to(bf16).to(f32)
                    one = cute.full_like(g, 1.0)
                    sig = one / (one + cute.math.exp(-g))
                    silu = g * sig
                    ao.store((silu * u).to(bf16))
                    go.store((da * u * (sig * (one + g * (one - sig)))).to(bf16))
                    uo.store((da * silu).to(bf16))
                    cute.autovec_copy(ao, cute.local_tile(mAct, (1, TN), (m, col))[0, None])
                    cute.autovec_copy(go, cute.local_tile(mDH, (1, TN), (m, col))[0, None])
                    cute.autovec_copy(uo, cute.local_tile(mDH, (1, TN), (m, inter // TN + col))[0, None])


@cute.kernel
def _wgrad_kernel(mA: cute.Tensor, mB: cute.Tensor, mOff: cute.Tensor, mO: cute.Tensor):
    """mO[e * M + m, n] = sum over expert e's rows k of A[k, m] * B[k, n] (A [N, M], B [N, Ncols], rows-contiguous)."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bm, e = cute.arch.block_idx()
    M = mA.shape[1]
    k0 = mOff[e]
    k1 = mOff[e + 1]
    acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
    _gemm(mA, mB, acc, tidx, bm * BM, bn * BN, k0, k1, 0, False, False)
    _store_rows(acc, mO, tidx, bm * BM, M, e * M + bm * BM, bn * BN)


@cute.kernel
def _gx_kernel(mDH: cute.Tensor, mWgu: cute.Tensor, mTT: cute.Tensor, mGX: cute.Tensor):
    """grad_x = bf16(dh @ W_gate_up[e]) (B = W_gate_up[e] as [K = 2I, N = d], rows e * 2I + k)."""
    tidx, _, _ = cute.arch.thread_idx()
    bn, bt, _ = cute.arch.block_idx()
    two_i = mDH.shape[1]
    e = mTT[bt, 0]
    if e >= 0:  # CTA-uniform
        ms = mTT[bt, 1]
        me = mTT[bt, 2]
        acc = cute.make_rmem_tensor(cute.make_layout((TM, TN)), cutlass.Float32)
        _gemm(mDH, mWgu, acc, tidx, ms, bn * BN, 0, two_i, e * two_i, True, False)
        _store_rows(acc, mGX, tidx, ms, me, ms, bn * BN)


@cute.jit
def _expert_bwd(mX: cute.Tensor, mTPE: cute.Tensor, mWgu: cute.Tensor, mWd: cute.Tensor, mGY: cute.Tensor,
                mOff: cute.Tensor, mTT: cute.Tensor, mH: cute.Tensor, mAct: cute.Tensor, mDH: cute.Tensor,
                mGX: cute.Tensor, mGWgu: cute.Tensor, mGWd: cute.Tensor, stream):
    N, d = mX.shape
    E = mTPE.shape[0]
    two_i = mH.shape[1]
    inter = mAct.shape[1]
    maxt = mTT.shape[0]
    blk = [THREADS, 1, 1]
    _schedule_kernel(mTPE, mOff, mTT).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)
    _h_kernel(mX, mWgu, mTT, mH).launch(grid=[(two_i + BN - 1) // BN, maxt, 1], block=blk, stream=stream)
    _da_kernel(mGY, mWd, mTT, mH, mAct, mDH).launch(grid=[(inter + BN - 1) // BN, maxt, 1], block=blk,
                                                    stream=stream)
    _wgrad_kernel(mGY, mAct, mOff, mGWd).launch(grid=[(inter + BN - 1) // BN, (d + BM - 1) // BM, E], block=blk,
                                                stream=stream)
    _wgrad_kernel(mDH, mX, mOff, mGWgu).launch(grid=[(d + BN - 1) // BN, (two_i + BM - 1) // BM, E], block=blk,
                                               stream=stream)
    _gx_kernel(mDH, mWgu, mTT, mGX).launch(grid=[(d + BN - 1) // BN, maxt, 1], block=blk, stream=stream)


def _max_tiles(n, e):
    return n // BM + e


_COMPILED = {}


def _compiled_for(n, d, e, inter):
    key = (n, d, e, inter)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(dtype, shape):
            order = tuple(range(len(shape) - 1, -1, -1))
            return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

        bf16, i32 = cutlass.BFloat16, cutlass.Int32
        two_i = 2 * inter
        fn = cute.compile(_expert_bwd, fake(bf16, (n, d)), fake(cutlass.Int64, (e,)), fake(bf16, (e * two_i, d)),
                          fake(bf16, (e * d, inter)), fake(bf16, (n, d)), fake(i32, (e + 1,)),
                          fake(i32, (_max_tiles(n, e), 3)), fake(bf16, (n, two_i)), fake(bf16, (n, inter)),
                          fake(bf16, (n, two_i)), fake(bf16, (n, d)), fake(bf16, (e * two_i, d)),
                          fake(bf16, (e * d, inter)), make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x_perm, tokens_per_expert, w_gate_up, w_down, grad_y):
    """Return (grad_x_perm [N, d], grad_w_gate_up [E, 2I, d], grad_w_down [E, d, I]), all bf16."""
    n, d = x_perm.shape
    e, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    if d % VEC != 0 or inter % VEC != 0:
        raise ValueError(f"unsupported shape: d = {d}, intermediate {inter}")
    dev = x_perm.device
    x = x_perm.contiguous()
    gy = grad_y.contiguous()
    tpe = tokens_per_expert.to(torch.int64).contiguous()
    wgu = w_gate_up.contiguous().view(e * two_i, d)
    wd = w_down.contiguous().view(e * d, inter)
    off = torch.empty((e + 1,), dtype=torch.int32, device=dev)
    tiles = torch.empty((_max_tiles(n, e), 3), dtype=torch.int32, device=dev)
    h = torch.empty((n, two_i), dtype=x.dtype, device=dev)
    act = torch.empty((n, inter), dtype=x.dtype, device=dev)
    dh = torch.empty((n, two_i), dtype=x.dtype, device=dev)
    grad_x = torch.empty((n, d), dtype=x.dtype, device=dev)
    grad_wgu = torch.empty((e, two_i, d), dtype=w_gate_up.dtype, device=dev)
    grad_wd = torch.empty((e, d, inter), dtype=w_down.dtype, device=dev)
    if n > 0:
        _compiled_for(n, d, e, inter)(x, tpe, wgu, wd, gy, off, tiles, h, act, dh, grad_x,
                                      grad_wgu.view(e * two_i, d), grad_wd.view(e * d, inter))
    return grad_x, grad_wgu, grad_wd
