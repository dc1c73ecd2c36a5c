"""Problem 47 (ERNIE-4.5 shared SwiGLU expert + routed combine), CuTe DSL: two SIMT GEMM kernels, both CuTe.

Both are tiled SIMT GEMMs C = A @ B^T (A [M, K], B [N, K], bf16, K contiguous) with fp32 accumulation: CTA tile
128 x 128, BK = 32, 256 threads each owning an 8 x 8 register block. Per K step every thread loads 16 contiguous
bf16 of A and of B (two 16-byte loads each), widens them to fp32 and stores them k-major in shared memory
(2 x 16 KB); the inner loop reads 8 + 8 fp32 per k and does 64 FMAs. Rows past T are clamped on load, never stored.
 1. gate/up + SwiGLU: the B tile's 128 rows are 64 rows of W_gate and the same 64 rows of W_up, and a thread's 8
    columns are 4 gate columns and the matching 4 up columns, so the epilogue forms
    h = bf16(bf16(silu(bf16(g))) * bf16(u)) (eager bf16 PyTorch's roundings) and stores 4 bf16 of h [T, 3072].
 2. down projection + combine: acc = h @ W_down^T; the epilogue rounds it to bf16 (the shared output), adds
    sum_j topk_weights[t, j] * expert_out[row_idx[t, j]] (fp32, j = 0..5 in order; 16-byte gathers of the routed
    rows) and rounds once to bf16.
Compiled once per shape from fake tensors (TVM-FFI route); both launches go to torch's current stream.
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
TOP_K = 6


@cute.jit
def _mainloop(mA: cute.Tensor, mB0: cute.Tensor, mB1: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor,
              acc: cute.Tensor, tidx, m0, n0, split: cutlass.Constexpr):
    """acc += A[m0:m0+128] @ B^T over all of K. split: B rows 0..63 from mB0[n0:], rows 64..127 from mB1[n0:];
    a thread's fragment is columns 4tx..4tx+3 and 64+4tx..64+4tx+3. Else B rows from mB0[n0:n0+128]."""
    M, K = mA.shape
    tx = tidx % (BN // TN)
    ty = tidx // (BN // TN)
    a_frag = cute.make_rmem_tensor(cute.make_layout(TM), cutlass.Float32)
    b_frag = cute.make_rmem_tensor(cute.make_layout(TN), cutlass.Float32)
    a_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    b_ld = cute.make_rmem_tensor(cute.make_layout(LD), mA.element_type)
    a_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)
    b_w = cute.make_rmem_tensor(cute.make_layout(LD), cutlass.Float32)

    r = tidx % BM
    kh = tidx // BM
    kc = kh * LD
    a_row = m0 + r
    if a_row > M - 1:
        a_row = M - 1
    for kt in range(K // BK):
        cute.autovec_copy(cute.local_tile(mA, (1, LD), (a_row, kt * (BK // LD) + kh))[0, None], a_ld)
        if cutlass.const_expr(split):
            if r < HALF:
                cute.autovec_copy(cute.local_tile(mB0, (1, LD), (n0 + r, kt * (BK // LD) + kh))[0, None], b_ld)
            else:
                cute.autovec_copy(cute.local_tile(mB1, (1, LD), (n0 + r - HALF, kt * (BK // LD) + kh))[0, None],
                                  b_ld)
        else:
            cute.autovec_copy(cute.local_tile(mB0, (1, LD), (n0 + r, kt * (BK // LD) + kh))[0, None], b_ld)
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
def _down_combine_kernel(mH: cute.Tensor, mWd: cute.Tensor, mE: cute.Tensor, mTW: cute.Tensor, mRI: cute.Tensor,
                         mOut: cute.Tensor):
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
    e_ld = cute.make_rmem_tensor(cute.make_layout(TN), mE.element_type)
    o = cute.make_rmem_tensor(cute.make_layout(TN), mOut.element_type)
    for i in cutlass.range_constexpr(TM):
        m = bm * BM + ty * TM + i
        if m < M:
            shared = acc[i, None].load().to(mOut.element_type).to(cutlass.Float32)
            routed = cute.zeros_like(shared)
            for j in cutlass.range_constexpr(TOP_K):
                row = mRI[m, j].to(cutlass.Int32)
                w = mTW[m, j]
                cute.autovec_copy(cute.local_tile(mE, (1, TN), (row, col))[0, None], e_ld)
                routed = routed + e_ld.load().to(cutlass.Float32) * w
            o.store((shared + routed).to(mOut.element_type))
            cute.autovec_copy(o, cute.local_tile(mOut, (1, TN), (m, col))[0, None])


@cute.jit
def _shared_plus_routed(mX: cute.Tensor, mWg: cute.Tensor, mWu: cute.Tensor, mWd: cute.Tensor, mE: cute.Tensor,
                        mTW: cute.Tensor, mRI: cute.Tensor, mH: cute.Tensor, mOut: cute.Tensor, stream):
    T = mX.shape[0]
    inter = mWg.shape[0]
    d = mWd.shape[0]
    mt = (T + BM - 1) // BM
    _swiglu_kernel(mX, mWg, mWu, mH).launch(grid=[inter // HALF, mt, 1], block=[THREADS, 1, 1], stream=stream)
    _down_combine_kernel(mH, mWd, mE, mTW, mRI, mOut).launch(grid=[d // BN, mt, 1], block=[THREADS, 1, 1],
                                                             stream=stream)


_COMPILED = {}


def _compiled_for(t, d, inter):
    key = (t, d, inter)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=16)

        bf16 = cutlass.BFloat16
        fn = cute.compile(_shared_plus_routed,
                          fake(bf16, (t, d)), fake(bf16, (inter, d)), fake(bf16, (inter, d)), fake(bf16, (d, inter)),
                          fake(bf16, (t * TOP_K, d)), fake(cutlass.Float32, (t, TOP_K)),
                          fake(cutlass.Int64, (t, TOP_K)), fake(bf16, (t, inter)), fake(bf16, (t, d)),
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx):
    """Return bf16 out [T, d] = shared_mlp(x) + sum_j topk_weights[:, j] * expert_out[row_idx[:, j]]."""
    t, d = x.shape
    inter = w_gate.shape[0]
    if d % BN != 0 or d % BK != 0 or inter % HALF != 0 or inter % BK != 0:
        raise ValueError(f"d = {d} must be a multiple of {BN} and the intermediate size {inter} of {HALF}")
    args = [a.contiguous() for a in (x, w_gate, w_up, w_down, expert_out)]
    tw = topk_weights.float().contiguous()
    ri = row_idx.contiguous()
    h = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    if t > 0:
        _compiled_for(t, d, inter)(*args, tw, ri, h, out)
    return out
