"""Problem 19, Qwen3 QK-RMSNorm + NeoX RoPE + paged KV-cache write (reshape_and_cache_flash), in CuTe DSL.

One kernel. Grid (T, 3), CTA of 256 threads = 16 head vectors of one token: blockIdx.y 0 and 1 take q heads 0-15
and 16-31, blockIdx.y 2 takes the 8 k heads and the 8 v heads (head h = 16 * y + tid // 16 of the 48 in qkv's row).
Sixteen threads own one head vector, each one 128-bit vector (8 bf16, channels 8l..8l+7 for lane l). For q and k:
sum of squares in fp32, butterfly over the 16 lanes (xor 8, 4, 2, 1), n = x * rsqrt(ss / 128 + eps) * weight (fp32).
NeoX pairs channel c with c +- 64, which is held by lane l ^ 8: one xor-8 shuffle per value fetches the partner's
normed value; with i = c mod 64, out = n * cos[pos, i] + sgn * partner * sin[pos, i] (sgn = -1 in the first half,
+1 in the second), rounded once to bf16. q goes to the output [T, 32*128]; k to k_cache row slot_mapping[t]
(cache viewed as [num_blocks * 16, 8 * 128]); v is copied unchanged to v_cache at the same row. Slots are distinct,
so no two CTAs write the same bytes. Head type is uniform per warp (2 heads per warp), and every lane of every warp
runs the shuffles. All sizes are compile-time constants; compiled once per shape (TVM-FFI, torch's stream).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
HALF = HEAD_DIM // 2
EPS = 1e-6
VEC = 8  # bf16 per 128-bit access
LANES = HEAD_DIM // VEC  # 16 threads per head vector
THREADS = 256
HEADS_PER_CTA = THREADS // LANES  # 16


@cute.kernel
def _qk_norm_rope_kernel(mQKV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor, mCS: cute.Tensor,
                         mPos: cute.Tensor, mSlot: cute.Tensor, mKC: cute.Tensor, mVC: cute.Tensor,
                         mOut: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    t, y, _ = cute.arch.block_idx()
    lane = tidx % LANES
    head = y * HEADS_PER_CTA + tidx // LANES  # 0..47 in [q | k | v]
    col = head * LANES + lane  # vector index inside the qkv row

    rX = cute.make_fragment_like(cute.local_tile(mQKV, (1, VEC), (t, col))[0, None])
    cute.autovec_copy(cute.local_tile(mQKV, (1, VEC), (t, col))[0, None], rX)
    slot = cutlass.Int32(mSlot[t])
    if head >= NUM_Q_HEADS + NUM_KV_HEADS:  # v: raw copy into the cache
        vcol = (head - NUM_Q_HEADS - NUM_KV_HEADS) * LANES + lane
        cute.autovec_copy(rX, cute.local_tile(mVC, (1, VEC), (slot, vcol))[0, None])

    rW = cute.make_fragment_like(cute.local_tile(mQW, (VEC,), (lane,)))
    if head < NUM_Q_HEADS:
        cute.autovec_copy(cute.local_tile(mQW, (VEC,), (lane,)), rW)
    else:
        cute.autovec_copy(cute.local_tile(mKW, (VEC,), (lane,)), rW)

    x = rX.load().to(cutlass.Float32)
    ss = (x * x).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    for k in cutlass.range_constexpr(4):  # xor 8, 4, 2, 1: inside the 16 lanes of one head
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=8 >> k)
    inv_rms = cute.math.rsqrt(ss / HEAD_DIM + EPS)

    rN = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    rN.store(x * inv_rms * rW.load().to(cutlass.Float32))
    rP = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    for i in cutlass.range_constexpr(VEC):  # partner channel c +- 64 lives in lane l ^ 8
        rP[i] = cute.arch.shuffle_sync_bfly(rN[i], offset=8)

    pos = cutlass.Int32(mPos[t])
    fcol = lane % (LANES // 2)  # frequency vector index: channels i = 8 * fcol .. 8 * fcol + 7 (mod 64)
    rC = cute.make_fragment_like(cute.local_tile(mCS, (1, VEC), (pos, fcol))[0, None])
    rS = cute.make_fragment_like(rC)
    cute.autovec_copy(cute.local_tile(mCS, (1, VEC), (pos, fcol))[0, None], rC)
    cute.autovec_copy(cute.local_tile(mCS, (1, VEC), (pos, fcol + HALF // VEC))[0, None], rS)
    sgn = cutlass.Float32(1.0)
    if lane < LANES // 2:
        sgn = cutlass.Float32(-1.0)
    rO = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    for i in cutlass.range_constexpr(VEC):
        rO[i] = rN[i] * rC[i] + sgn * (rP[i] * rS[i])
    rY = cute.make_fragment_like(rX)
    rY.store(rO.load().to(mOut.element_type))
    if head < NUM_Q_HEADS:
        cute.autovec_copy(rY, cute.local_tile(mOut, (1, VEC), (t, col))[0, None])
    elif head < NUM_Q_HEADS + NUM_KV_HEADS:
        kcol = (head - NUM_Q_HEADS) * LANES + lane
        cute.autovec_copy(rY, cute.local_tile(mKC, (1, VEC), (slot, kcol))[0, None])


@cute.jit
def _qk_norm_rope(mQKV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor, mCS: cute.Tensor, mPos: cute.Tensor,
                  mSlot: cute.Tensor, mKC: cute.Tensor, mVC: cute.Tensor, mOut: cute.Tensor, stream):
    heads = NUM_Q_HEADS + 2 * NUM_KV_HEADS
    _qk_norm_rope_kernel(mQKV, mQW, mKW, mCS, mPos, mSlot, mKC, mVC, mOut).launch(
        grid=[mQKV.shape[0], heads // HEADS_PER_CTA, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, max_pos, cache_rows):
    key = (tokens, max_pos, cache_rows)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
        qkv = make_fake_compact_tensor(bf16, (tokens, width), stride_order=(1, 0), assumed_align=16)
        qw = make_fake_compact_tensor(bf16, (HEAD_DIM,), assumed_align=16)
        kw = make_fake_compact_tensor(bf16, (HEAD_DIM,), assumed_align=16)
        cs = make_fake_compact_tensor(cutlass.Float32, (max_pos, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        pos = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        slot = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        kc = make_fake_compact_tensor(bf16, (cache_rows, NUM_KV_HEADS * HEAD_DIM), stride_order=(1, 0),
                                      assumed_align=16)
        vc = make_fake_compact_tensor(bf16, (cache_rows, NUM_KV_HEADS * HEAD_DIM), stride_order=(1, 0),
                                      assumed_align=16)
        out = make_fake_compact_tensor(bf16, (tokens, NUM_Q_HEADS * HEAD_DIM), stride_order=(1, 0),
                                       assumed_align=16)
        fn = cute.compile(_qk_norm_rope, qkv, qw, kw, cs, pos, slot, kc, vc, out,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, slot_mapping, k_cache, v_cache):
    """Return q [T, 32, 128] (normed + roped); write normed + roped k and raw v into the paged caches in place."""
    tokens = qkv.shape[0]
    num_blocks, block_size = k_cache.shape[:2]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("expects contiguous caches")
    q_out = torch.empty((tokens, NUM_Q_HEADS * HEAD_DIM), dtype=qkv.dtype, device=qkv.device)
    if tokens > 0:
        rows = num_blocks * block_size
        kc = k_cache.view(rows, NUM_KV_HEADS * HEAD_DIM)  # views: writes land in k_cache / v_cache
        vc = v_cache.view(rows, NUM_KV_HEADS * HEAD_DIM)
        _compiled_for(tokens, cos_sin_cache.shape[0], rows)(
            qkv.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(), cos_sin_cache.contiguous(),
            positions.contiguous(), slot_mapping.contiguous(), kc, vc, q_out)
    return q_out.view(tokens, NUM_Q_HEADS, HEAD_DIM)
