"""Wrong: the CuTe gold dual cache insert with the padding tokens parked in slot 0 instead of skipped.

Instead of a CTA whose slot_mapping[t] is -1 writing nothing, the kernel clamps the slot to 0 ("the null slot";
vLLM's block pool reserves block 0, so writes there are assumed harmless) and writes the padding token's [c_kv ;
k_pe], fp8 indexer key and scale into cache row 0. Here page 0 is an ordinary page of the pool (in use by a
request about half the time), and the caches are mutated inputs compared in full: every entry the problem does not
write must stay unchanged.

Expected: wrong/mismatch
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

KV_LORA_RANK = 512
ROPE_DIM = 64
ENTRY = KV_LORA_RANK + ROPE_DIM  # 576
INDEX_HEAD_DIM = 128
VEC = 8  # bf16 per 128-bit access
LATENT_VECS = KV_LORA_RANK // VEC  # 64
ENTRY_VECS = ENTRY // VEC  # 72
LANES = INDEX_HEAD_DIM // VEC  # 16 threads hold the indexer key
THREADS = 128
QUANT_WARP_START = 96


@cute.kernel
def _dual_insert_kernel(mKVC: cute.Tensor, mKPE: cute.Tensor, mIK: cute.Tensor, mSlot: cute.Tensor,
                        mCache: cute.Tensor, mIKC: cute.Tensor, mIKS: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    slot = cutlass.Int32(mSlot[t])
    if slot < 0:  # padding token: park it in the null slot 0
        slot = cutlass.Int32(0)
    if tidx < LATENT_VECS:
        cute.autovec_copy(cute.local_tile(mKVC, (1, VEC), (t, tidx))[0, None],
                          cute.local_tile(mCache, (1, VEC), (slot, tidx))[0, None])
    elif tidx < ENTRY_VECS:
        cute.autovec_copy(cute.local_tile(mKPE, (1, VEC), (t, tidx - LATENT_VECS))[0, None],
                          cute.local_tile(mCache, (1, VEC), (slot, tidx))[0, None])
    elif tidx >= QUANT_WARP_START:  # warp 3: both halves compute, lanes 0..15 store
        lane = tidx % LANES
        gX = cute.local_tile(mIK, (1, VEC), (t, lane))[0, None]
        rX = cute.make_fragment_like(gX)
        cute.autovec_copy(gX, rX)
        x = rX.load().to(cutlass.Float32)
        amax = abs(x).reduce(cute.ReductionOp.MAX, cutlass.Float32(0.0), reduction_profile=0)
        for k in cutlass.range_constexpr(4):
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=8 >> k))
        amax = cute.arch.fmax(amax, cutlass.Float32(1e-4))
        bits = cutlass.Float32(amax).bitcast(cutlass.Int32)
        biased_e = bits >> 23  # sign bit is 0
        mant = bits & 0x7FFFFF
        sb = biased_e - 8
        if mant > 0x600000:  # 1.m > 1.75
            sb = biased_e - 7
        scale = cutlass.Int32(sb << 23).bitcast(cutlass.Float32)
        inv_scale = cutlass.Int32((254 - sb) << 23).bitcast(cutlass.Float32)
        gQ = cute.local_tile(mIKC, (1, VEC), (slot, lane))[0, None]
        rQ = cute.make_fragment_like(gQ)
        rQ.store((x * inv_scale).to(mIKC.element_type))
        if tidx < QUANT_WARP_START + LANES:
            cute.autovec_copy(rQ, gQ)
            if lane == 0:
                mIKS[slot] = scale


@cute.jit
def _dual_insert(mKVC: cute.Tensor, mKPE: cute.Tensor, mIK: cute.Tensor, mSlot: cute.Tensor, mCache: cute.Tensor,
                 mIKC: cute.Tensor, mIKS: cute.Tensor, stream):
    _dual_insert_kernel(mKVC, mKPE, mIK, mSlot, mCache, mIKC, mIKS).launch(
        grid=[mKVC.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, rows):
    key = (tokens, rows)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        kvc = make_fake_compact_tensor(bf16, (tokens, KV_LORA_RANK), stride_order=(1, 0), assumed_align=16)
        kpe = make_fake_compact_tensor(bf16, (tokens, ROPE_DIM), stride_order=(1, 0), assumed_align=16)
        ik = make_fake_compact_tensor(bf16, (tokens, INDEX_HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        slot = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        cache = make_fake_compact_tensor(bf16, (rows, ENTRY), stride_order=(1, 0), assumed_align=16)
        ikc = make_fake_compact_tensor(cutlass.Float8E4M3FN, (rows, INDEX_HEAD_DIM), stride_order=(1, 0),
                                       assumed_align=16)
        iks = make_fake_compact_tensor(cutlass.Float32, (rows,), assumed_align=4)
        fn = cute.compile(_dual_insert, kvc, kpe, ik, slot, cache, ikc, iks,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(kv_c, k_pe, index_k, slot_mapping, kv_cache, index_k_cache, index_k_scale):
    """Write [kv_c ; k_pe] and the e4m3 indexer key + power-of-two scale at slot_mapping (>= 0), in place; None."""
    tokens = kv_c.shape[0]
    for c in (kv_cache, index_k_cache, index_k_scale):
        if not c.is_contiguous():
            raise ValueError("expects contiguous caches (they are updated in place)")
    if tokens == 0:
        return None
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    _compiled_for(tokens, rows)(
        kv_c.contiguous(), k_pe.contiguous(), index_k.contiguous(), slot_mapping.contiguous(),
        kv_cache.view(rows, ENTRY), index_k_cache.view(rows, INDEX_HEAD_DIM), index_k_scale.view(rows))
    return None
