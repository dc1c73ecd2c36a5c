"""Problem 32 (Llama-3.1-8B SwiGLU MLP), CuTe DSL: two Hopper tensor-core GEMMs (TMA + wgmma), SwiGLU fused.

Both launches run one kernel, `_gemm_kernel`, a variant of the warpgroup-MMA GEMM in docs/guides/cute.md
("Tensor cores"): C = A @ B^T with A [M, K], B [N, K] bf16 K-major, fp32 accumulation in registers.
 - CTA: 2 warpgroups (256 threads); CTA tile 128 x 256 x 64 held as two 128 x 128 halves, acc0 and acc1 (each
   warpgroup owns 64 rows of both: 2 x 64 fp32 registers per thread). Per k-tile the CTA TMA-loads a 128 x 64 box
   of A and two 128 x 64 boxes of B (box0 -> acc0, box1 -> acc1) into a 4-stage ring (4 x 48 KB, 128-byte
   swizzle); warp 0 issues the loads, a full and an empty mbarrier per stage order them with the MMAs (hand-made:
   cutlass.pipeline's helpers are @cute.jit library functions the grader's sandbox refuses to re-parse), each
   k-tile is 4 x 2 wgmma m64n128k16 per warpgroup, and one wgmma group stays in flight while the next stage's
   barrier is awaited.
 - GEMM 1 (swiglu=True): A = x [T, D], box0 = gate rows w_gate_up[j*128 : j*128+128], box1 = the matching up rows
   w_gate_up[F + j*128 : ...], so acc0[i] and acc1[i] are gate and up of the same (t, j) element. The epilogue
   computes h = bf16(silu(g) * u) with g = bf16(acc0), u = bf16(acc1) and silu(g) = g / (1 + exp(-g)) in fp32:
   the reference's roundings (bf16 F.linear output, fp32 SiLU and product, one rounding). h [T, F] bf16 goes to
   global memory; the (m, n) of each accumulator register comes from partition_C of the same tiled MMA (see the
   guide: the wgmma fragment puts value v of thread t at row 16*(t%128//32) + t%32//4 + 8*(v//2%2) + 64*(t//128),
   column 8*(v//4) + 2*(t%4) + v%2, so adjacent values v, v+1 are adjacent columns: 4-byte stores).
 - GEMM 2 (swiglu=False): A = h [T, F], box0 / box1 = w_down rows of column tiles 2j and 2j+1; acc0 / acc1 are
   stored (bf16) to out[:, 256j : 256j+128] and out[:, 256j+128 : 256j+256].
 - The kernel has no bounds checks: T % 128, F % 128, D % 256 == 0 (true at full scale: 4096, 14336, 4096). Other
   shapes (the small scale: T 64, D 128, F 320) are zero-padded by eager torch in `solve` and the result sliced;
   zero rows/columns contribute exact zeros (silu(0) * 0 = 0).
Expected speed (not measured yet): 1.44 TFLOP per call; eager PyTorch (cuBLAS + elementwise) takes 2.65 ms on
the H200 (~545 TFLOP/s). This kernel has the mainloop shape of NVIDIA's non-persistent Hopper example (one CTA per
SM at 193 KB of shared memory, TMA, 4 stages, 128 x 256 tile, no clusters / multicast, no warp specialisation, the
epilogue not overlapped with the next tile's loads), which typically reaches 60-80 % of cuBLAS: roughly 1.9-2.6 ms
here (~550-750 TFLOP/s on the GEMMs). The fused SwiGLU saves the [T, 2F] bf16 round trip (0.35 GB) eager pays.
Compiled once per shape from fake tensors (TVM-FFI route); both launches go to torch's current stream.
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BM, BH, BK = 128, 128, 64  # CTA tile rows, columns per half (two halves), k-tile
STAGES = 4  # 4 x (128 + 2 x 128) x 64 bf16 = 192 KB of shared memory
THREADS = 256  # two warpgroups; warpgroup w computes tile rows 64w .. 64w+63 of both halves
TILE_BYTES = BM * BK * 2  # one 128 x 64 bf16 TMA box


def _load_k_tile(bars, k, tma_a, tAgA, tAsA, tma_b0, tBgB0, tBsB0, tma_b1, tBgB1, tBsB1):
    """Warp 0: wait until ring stage s = k % STAGES is free, then TMA-load k-tile k of A, B0, B1 into it.
    bars[s]: stage s full (1 arrive with expect_tx + the TMA bytes); bars[STAGES + s]: stage s empty (one arrive
    per warp). The n-th fill of a stage waits for the end of phase n - 1 of its empty barrier: parity (n + 1) % 2
    (a fresh barrier passes parity 1 at once)."""
    s = k % STAGES
    cute.arch.mbarrier_wait(bars + STAGES + s, (k // STAGES + 1) % 2)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bars + s, 3 * TILE_BYTES)
    cute.copy(tma_a, tAgA[None, k], tAsA[None, s], tma_bar_ptr=bars + s)  # the copy elects its own thread
    cute.copy(tma_b0, tBgB0[None, k], tBsB0[None, s], tma_bar_ptr=bars + s)
    cute.copy(tma_b1, tBgB1[None, k], tBsB1[None, s], tma_bar_ptr=bars + s)


@cute.kernel
def _gemm_kernel(tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b0: cute.CopyAtom, mB0: cute.Tensor,
                 tma_b1: cute.CopyAtom, mB1: cute.Tensor, mC: cute.Tensor, tiled_mma: cute.TiledMma,
                 s_layout: cute.ComposedLayout, swiglu: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bm, bn, _ = cute.arch.block_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

    smem = cutlass.memory.SmemAllocator()
    bars = smem.allocate_array(cutlass.Int64, 2 * STAGES)
    sA = smem.allocate_tensor(cutlass.BFloat16, s_layout.outer, byte_alignment=1024, swizzle=s_layout.inner)
    sB0 = smem.allocate_tensor(cutlass.BFloat16, s_layout.outer, byte_alignment=1024, swizzle=s_layout.inner)
    sB1 = smem.allocate_tensor(cutlass.BFloat16, s_layout.outer, byte_alignment=1024, swizzle=s_layout.inner)
    if warp == 0:
        cpasync.prefetch_descriptor(tma_a)
        cpasync.prefetch_descriptor(tma_b0)
        cpasync.prefetch_descriptor(tma_b1)
        with cute.arch.elect_one():
            for s in cutlass.range_constexpr(STAGES):
                cute.arch.mbarrier_init(bars + s, 1)
                cute.arch.mbarrier_init(bars + STAGES + s, THREADS // 32)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    # B column tiles: GEMM 1 takes gate tile bn and up tile bn (two tensors); GEMM 2 tiles 2bn and 2bn+1 of one.
    n0 = bn
    n1 = bn
    if cutlass.const_expr(not swiglu):
        n0 = 2 * bn
        n1 = 2 * bn + 1
    gA = cute.local_tile(mA, (BM, BK), (bm, None))  # (128, 64, k_tiles) TMA coordinates
    gB0 = cute.local_tile(mB0, (BH, BK), (n0, None))
    gB1 = cute.local_tile(mB1, (BH, BK), (n1, None))
    one = cute.make_layout(1)
    tAsA, tAgA = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
    tBsB0, tBgB0 = cpasync.tma_partition(tma_b0, 0, one, cute.group_modes(sB0, 0, 2), cute.group_modes(gB0, 0, 2))
    tBsB1, tBgB1 = cpasync.tma_partition(tma_b1, 0, one, cute.group_modes(sB1, 0, 2), cute.group_modes(gB1, 0, 2))

    thr_mma = tiled_mma.get_slice(tidx)
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (MMA, 1, BK/16, STAGES) smem descriptors
    tCrB0 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB0))
    tCrB1 = tiled_mma.make_fragment_B(thr_mma.partition_B(sB1))
    # This thread's share of a 128 x 128 output tile: ((2, 2, 16), 1, 1), the accumulator's layout.
    tCgC0 = thr_mma.partition_C(cute.local_tile(mC, (BM, BH), (bm, n0)))
    tCgC1 = thr_mma.partition_C(cute.local_tile(mC, (BM, BH), (bm, n1)))
    acc0 = cute.make_rmem_tensor(tCgC0.shape, cutlass.Float32)
    acc1 = cute.make_rmem_tensor(tCgC0.shape, cutlass.Float32)
    acc0.fill(0.0)
    acc1.fill(0.0)
    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)

    k_tiles = cute.size(gA, mode=[2])
    if warp == 0:
        for k in cutlass.range_constexpr(min(STAGES, k_tiles)):
            _load_k_tile(bars, k, tma_a, tAgA, tAsA, tma_b0, tBgB0, tBsB0, tma_b1, tBgB1, tBsB1)
    for kt in cutlass.range(k_tiles, unroll=1):
        s = kt % STAGES
        cute.arch.mbarrier_wait(bars + s, kt // STAGES % 2)  # the n-th fill of stage s ends its phase n
        warpgroup.fence()
        for kb in cutlass.range_constexpr(BK // 16):
            a = tCrA[None, None, kb, s]
            cute.gemm(tiled_mma, acc0, a, tCrB0[None, None, kb, s], acc0)
            cute.gemm(tiled_mma, acc1, a, tCrB1[None, None, kb, s], acc1)
        warpgroup.commit_group()
        warpgroup.wait_group(1)  # k-tile kt's MMAs may still run; kt - 1's are done: free its stage, refill it
        if kt > 0:
            if tidx % 32 == 0:
                cute.arch.mbarrier_arrive(bars + STAGES + (kt - 1) % STAGES)
            if warp == 0 and kt - 1 + STAGES < k_tiles:
                _load_k_tile(bars, kt - 1 + STAGES, tma_a, tAgA, tAsA, tma_b0, tBgB0, tBsB0, tma_b1, tBgB1, tBsB1)
    warpgroup.wait_group(0)

    # Epilogue: element i of acc0 / acc1 belongs at element i of tCgC0 / tCgC1 (same tiled-MMA partition).
    out0 = cute.make_rmem_tensor(tCgC0.shape, mC.element_type)
    if cutlass.const_expr(swiglu):
        g = acc0.load().to(mC.element_type).to(cutlass.Float32)
        u = acc1.load().to(mC.element_type).to(cutlass.Float32)
        silu = g / (cute.full_like(g, 1.0) + cute.math.exp(-g))
        out0.store((silu * u).to(mC.element_type))
        cute.autovec_copy(out0, tCgC0)
    else:
        out1 = cute.make_rmem_tensor(tCgC1.shape, mC.element_type)
        out0.store(acc0.load().to(mC.element_type))
        out1.store(acc1.load().to(mC.element_type))
        cute.autovec_copy(out0, tCgC0)
        cute.autovec_copy(out1, tCgC1)


def _launch(mA, mB0, mB1, mC, tiled_mma, s_layout, swiglu, stream):
    """TMA atoms for A and both B operands (one 128 x 64 box each), then the launch (x: row tiles)."""
    box = cute.slice_(s_layout, (None, None, 0))
    op = cpasync.CopyBulkTensorTileG2SOp()
    tma_a, tA = cpasync.make_tiled_tma_atom(op, mA, box, (BM, BK))
    tma_b0, tB0 = cpasync.make_tiled_tma_atom(op, mB0, box, (BH, BK))
    tma_b1, tB1 = cpasync.make_tiled_tma_atom(op, mB1, box, (BH, BK))
    n_tiles = mC.shape[1] // BH if swiglu else mC.shape[1] // (2 * BH)
    _gemm_kernel(tma_a, tA, tma_b0, tB0, tma_b1, tB1, mC, tiled_mma, s_layout, swiglu).launch(
        grid=[mC.shape[0] // BM, n_tiles, 1], block=[THREADS, 1, 1], stream=stream)


@cute.jit
def _swiglu_mlp(mX: cute.Tensor, mWg: cute.Tensor, mWu: cute.Tensor, mWd: cute.Tensor, mH: cute.Tensor,
                mOut: cute.Tensor, stream):
    op = warpgroup.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (64, BH, 16), warpgroup.OperandSource.SMEM,
                                OperandMajorMode.K, OperandMajorMode.K)
    tiled_mma = cute.make_tiled_mma(op, atom_layout_mnk=(2, 1, 1))
    atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, cutlass.BFloat16)
    s_layout = cute.tile_to_shape(atom, (BM, BK, STAGES), order=(0, 1, 2))  # A, B0 and B1 alike (128 rows)
    _launch(mX, mWg, mWu, mH, tiled_mma, s_layout, True, stream)
    _launch(mH, mWd, mWd, mOut, tiled_mma, s_layout, False, stream)


_COMPILED = {}


def _compiled_for(t, d, f):
    key = (t, d, f)
    fn = _COMPILED.get(key)
    if fn is None:
        def fake(shape):
            return make_fake_compact_tensor(cutlass.BFloat16, shape, stride_order=(1, 0), assumed_align=16)

        fn = cute.compile(_swiglu_mlp, fake((t, d)), fake((f, d)), fake((f, d)), fake((d, f)), fake((t, f)),
                          fake((t, d)), make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def _up(n, m):
    return (n + m - 1) // m * m


def _pad(w, rows, cols):
    if w.shape[0] == rows and w.shape[1] == cols:
        return w.contiguous()
    out = torch.zeros((rows, cols), dtype=w.dtype, device=w.device)
    out[: w.shape[0], : w.shape[1]] = w
    return out


def solve(x, w_gate_up, w_down):
    """Return bf16 out [T, D] = (bf16(silu(x @ Wg^T) * (x @ Wu^T))) @ w_down^T (bf16 GEMM outputs, as reference)."""
    t, d = x.shape
    f = w_down.shape[1]
    tp, dp, fp = _up(t, BM), _up(d, 2 * BH), _up(f, BH)
    xp = _pad(x, tp, dp)
    wg = _pad(w_gate_up[:f], fp, dp)  # row slices of a contiguous matrix: views, no copy at full scale
    wu = _pad(w_gate_up[f:], fp, dp)
    wd = _pad(w_down, dp, fp)
    h = torch.empty((tp, fp), dtype=x.dtype, device=x.device)
    out = torch.empty((tp, dp), dtype=x.dtype, device=x.device)
    if t > 0:
        _compiled_for(tp, dp, fp)(xp, wg, wu, wd, h, out)
    if tp != t or dp != d:
        out = out[:t, :d].contiguous()
    return out
