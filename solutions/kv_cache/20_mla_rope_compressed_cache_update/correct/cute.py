"""Problem 20, MLA pre-attention epilogue (RMSNorm of c_kv, interleaved RoPE of k_pe and q_pe, concat_and_cache_mla),
in CuTe DSL.

One kernel, one CTA per token t (grid T), 32 + 32 * ceil((H + 1) * 8 / 32) threads. Warp 0 normalises the latent:
lane l loads the 128-bit vectors at channels 8l and 256 + 8l (16 bf16, coalesced), sums their squares in fp32, a
5-step butterfly over the warp gives the sum over all 512 channels, and n = x * rsqrt(ss / 512 + eps) * weight is
rounded once to bf16 and stored to cache row slot_mapping[t] (cache viewed as [num_blocks * page, 576]). The
remaining threads each rotate 8 channels (4 interleaved pairs (2i, 2i+1), so no data crosses threads): thread r = 0..7
takes k_pe channels 8r..8r+7 (written to cache channels 512 + 8r), thread r = 8 + 8h + l takes q_pe channels 8l..8l+7
of head h, read and written back in place in q (q viewed as [T, H * 192], q_pe at 128 inside each head). cos/sin of
the 4 pairs are one 128-bit load each from cos_sin_cache[pos]; rotation in fp32, rounded once to bf16. Slots are
distinct and each q element is owned by one thread: no conflicts. H and the page size are compile-time constants;
compiled once per shape (TVM-FFI, torch's stream). Returns None like the reference.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

KV_LORA_RANK = 512
ROPE_DIM = 64
NOPE_DIM = 128
ENTRY = KV_LORA_RANK + ROPE_DIM  # 576
QDIM = NOPE_DIM + ROPE_DIM  # 192
EPS = 1e-6
VEC = 8  # bf16 per 128-bit access
PAIRS = VEC // 2  # rotary pairs per thread
ROPE_LANES = ROPE_DIM // VEC  # 8 threads per 64-channel rope vector


@cute.jit
def _rope8(gSrc: cute.Tensor, gDst: cute.Tensor, gCos: cute.Tensor, gSin: cute.Tensor):
    rX = cute.make_fragment_like(gSrc)
    cute.autovec_copy(gSrc, rX)
    rC = cute.make_fragment_like(gCos)
    rS = cute.make_fragment_like(gSin)
    cute.autovec_copy(gCos, rC)
    cute.autovec_copy(gSin, rS)
    x = rX.load().to(cutlass.Float32)
    rF = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    rF.store(x)
    rO = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    for p in cutlass.range_constexpr(PAIRS):
        xe = rF[2 * p]
        xo = rF[2 * p + 1]
        rO[2 * p] = xe * rC[p] - xo * rS[p]
        rO[2 * p + 1] = xo * rC[p] + xe * rS[p]
    rY = cute.make_fragment_like(rX)
    rY.store(rO.load().to(rX.element_type))
    cute.autovec_copy(rY, gDst)


@cute.kernel
def _mla_epilogue_kernel(mQ: cute.Tensor, mKV: cute.Tensor, mW: cute.Tensor, mCS: cute.Tensor, mPos: cute.Tensor,
                         mSlot: cute.Tensor, mCache: cute.Tensor, heads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    slot = cutlass.Int32(mSlot[t])
    if tidx < 32:  # warp 0: RMSNorm of the 512-channel latent
        rX0 = cute.make_fragment_like(cute.local_tile(mKV, (1, VEC), (t, tidx))[0, None])
        rX1 = cute.make_fragment_like(rX0)
        cute.autovec_copy(cute.local_tile(mKV, (1, VEC), (t, tidx))[0, None], rX0)
        cute.autovec_copy(cute.local_tile(mKV, (1, VEC), (t, tidx + 32))[0, None], rX1)
        rW0 = cute.make_fragment_like(cute.local_tile(mW, (VEC,), (tidx,)))
        rW1 = cute.make_fragment_like(rW0)
        cute.autovec_copy(cute.local_tile(mW, (VEC,), (tidx,)), rW0)
        cute.autovec_copy(cute.local_tile(mW, (VEC,), (tidx + 32,)), rW1)
        x0 = rX0.load().to(cutlass.Float32)
        x1 = rX1.load().to(cutlass.Float32)
        ss = (x0 * x0).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
        ss = ss + (x1 * x1).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
        for k in cutlass.range_constexpr(5):  # xor 16, 8, 4, 2, 1: the whole warp
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> k)
        inv_rms = cute.math.rsqrt(ss / KV_LORA_RANK + EPS)
        rY0 = cute.make_fragment_like(rX0)
        rY1 = cute.make_fragment_like(rX1)
        rY0.store((x0 * inv_rms * rW0.load().to(cutlass.Float32)).to(mCache.element_type))
        rY1.store((x1 * inv_rms * rW1.load().to(cutlass.Float32)).to(mCache.element_type))
        cute.autovec_copy(rY0, cute.local_tile(mCache, (1, VEC), (slot, tidx))[0, None])
        cute.autovec_copy(rY1, cute.local_tile(mCache, (1, VEC), (slot, tidx + 32))[0, None])
    else:
        r = tidx - 32
        if r < (heads + 1) * ROPE_LANES:
            pos = cutlass.Int32(mPos[t])
            lane = r % ROPE_LANES
            gCos = cute.local_tile(mCS, (1, PAIRS), (pos, lane))[0, None]
            gSin = cute.local_tile(mCS, (1, PAIRS), (pos, lane + ROPE_LANES))[0, None]
            if r < ROPE_LANES:  # k_pe -> cache channels 512 + 8 * lane
                vcol = KV_LORA_RANK // VEC + lane
                _rope8(cute.local_tile(mKV, (1, VEC), (t, vcol))[0, None],
                       cute.local_tile(mCache, (1, VEC), (slot, vcol))[0, None], gCos, gSin)
            else:  # q_pe of head h, in place
                h = r // ROPE_LANES - 1
                qcol = h * (QDIM // VEC) + NOPE_DIM // VEC + lane
                gQ = cute.local_tile(mQ, (1, VEC), (t, qcol))[0, None]
                _rope8(gQ, gQ, gCos, gSin)


@cute.jit
def _mla_epilogue(mQ: cute.Tensor, mKV: cute.Tensor, mW: cute.Tensor, mCS: cute.Tensor, mPos: cute.Tensor,
                  mSlot: cute.Tensor, mCache: cute.Tensor, heads: cutlass.Constexpr, stream):
    rope_threads = (heads + 1) * ROPE_LANES
    threads = 32 + (rope_threads + 31) // 32 * 32
    _mla_epilogue_kernel(mQ, mKV, mW, mCS, mPos, mSlot, mCache, heads).launch(
        grid=[mKV.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, heads, max_pos, cache_rows):
    key = (tokens, heads, max_pos, cache_rows)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        q = make_fake_compact_tensor(bf16, (tokens, heads * QDIM), stride_order=(1, 0), assumed_align=16)
        kv = make_fake_compact_tensor(bf16, (tokens, ENTRY), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(bf16, (KV_LORA_RANK,), assumed_align=16)
        cs = make_fake_compact_tensor(cutlass.Float32, (max_pos, ROPE_DIM), stride_order=(1, 0), assumed_align=16)
        pos = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        slot = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        cache = make_fake_compact_tensor(bf16, (cache_rows, ENTRY), stride_order=(1, 0), assumed_align=16)
        fn = cute.compile(_mla_epilogue, q, kv, w, cs, pos, slot, cache, heads,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache):
    """Rotate q_pe in place in q and write [RMSNorm(c_kv) ; RoPE(k_pe)] into kv_cache rows slot_mapping; None."""
    tokens, heads = q.shape[:2]
    if not (q.is_contiguous() and kv_cache.is_contiguous()):
        raise ValueError("expects contiguous q and kv_cache (both are updated in place)")
    if tokens == 0:
        return None
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    _compiled_for(tokens, heads, cos_sin_cache.shape[0], rows)(
        q.view(tokens, heads * QDIM), kv_latent.contiguous(), kv_norm_weight.contiguous(),
        cos_sin_cache.contiguous(), positions.contiguous(), slot_mapping.contiguous(), kv_cache.view(rows, ENTRY))
    return None
