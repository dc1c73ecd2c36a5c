"""Problem 21, dynamic fp8 e4m3 quantization of new K/V with one scale per (token, kv head), appended to a paged
cache, in CuTe DSL.

One kernel. Grid (T, 2): blockIdx.y = 0 quantizes key, 1 value; CTA of 128 threads = the 8 head vectors of one
token, 16 threads per head, each thread one 128-bit vector (8 bf16, channels 8l..8l+7). A CTA whose
slot_mapping[t] is negative (padding) returns at once (uniform per CTA). Otherwise: max |x| of the 8 values in fp32,
a 4-step butterfly max over the head's 16 lanes (xor 8, 4, 2, 1), amax = max(amax, 1e-6), scale = amax / 448 (IEEE
fp32 division, as the reference), q = clamp(x / scale, -448, 448) converted to e4m3 (round to nearest even). The 8
fp8 bytes go out as one 64-bit store to cache row slot (cache viewed as [num_blocks * 16, 8 * 128]) and lane 0 of
each head writes the fp32 scale to scale row slot, column head (scale cache viewed as [num_blocks * 16, 8]).
Valid slots are distinct: no write conflicts. All sizes compile-time constants; compiled once per shape (TVM-FFI,
torch's stream). The four caches are updated in place; returns None like the reference.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

NUM_KV_HEADS = 8
HEAD_DIM = 128
FP8_MAX = 448.0
MIN_AMAX = 1e-6
VEC = 8  # bf16 per 128-bit load
LANES = HEAD_DIM // VEC  # 16 threads per head vector
THREADS = NUM_KV_HEADS * LANES  # 128


@cute.jit
def _quant_head(mX: cute.Tensor, mC: cute.Tensor, mS: cute.Tensor, t, slot, head, lane):
    col = head * LANES + lane
    gX = cute.local_tile(mX, (1, VEC), (t, col))[0, None]
    rX = cute.make_fragment_like(gX)
    cute.autovec_copy(gX, rX)
    x = rX.load().to(cutlass.Float32)
    amax = abs(x).reduce(cute.ReductionOp.MAX, cutlass.Float32(0.0), reduction_profile=0)
    for k in cutlass.range_constexpr(4):  # xor 8, 4, 2, 1: within the head's 16 lanes
        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=8 >> k))
    scale = cute.arch.fmax(amax, cutlass.Float32(MIN_AMAX)) / cutlass.Float32(FP8_MAX)
    rF = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    rF.store(x)
    rQ = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float32)
    for i in cutlass.range_constexpr(VEC):
        rQ[i] = cute.arch.fmin(cute.arch.fmax(rF[i] / scale, cutlass.Float32(-FP8_MAX)), cutlass.Float32(FP8_MAX))
    gC = cute.local_tile(mC, (1, VEC), (slot, col))[0, None]
    rC = cute.make_fragment_like(gC)
    rC.store(rQ.load().to(mC.element_type))
    cute.autovec_copy(rC, gC)
    if lane == 0:
        mS[slot, head] = scale


@cute.kernel
def _fp8_append_kernel(mK: cute.Tensor, mV: cute.Tensor, mSlot: cute.Tensor, mKC: cute.Tensor, mVC: cute.Tensor,
                       mKS: cute.Tensor, mVS: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    t, kv, _ = cute.arch.block_idx()
    slot = cutlass.Int32(mSlot[t])
    if slot >= 0:  # negative slots are padding: nothing is written
        head = tidx // LANES
        lane = tidx % LANES
        if kv == 0:
            _quant_head(mK, mKC, mKS, t, slot, head, lane)
        else:
            _quant_head(mV, mVC, mVS, t, slot, head, lane)


@cute.jit
def _fp8_append(mK: cute.Tensor, mV: cute.Tensor, mSlot: cute.Tensor, mKC: cute.Tensor, mVC: cute.Tensor,
                mKS: cute.Tensor, mVS: cute.Tensor, stream):
    _fp8_append_kernel(mK, mV, mSlot, mKC, mVC, mKS, mVS).launch(
        grid=[mK.shape[0], 2, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, cache_rows):
    key = (tokens, cache_rows)
    fn = _COMPILED.get(key)
    if fn is None:
        width = NUM_KV_HEADS * HEAD_DIM

        def src():
            return make_fake_compact_tensor(cutlass.BFloat16, (tokens, width), stride_order=(1, 0), assumed_align=16)

        def cache():
            return make_fake_compact_tensor(cutlass.Float8E4M3FN, (cache_rows, width), stride_order=(1, 0),
                                            assumed_align=16)

        def scales():
            return make_fake_compact_tensor(cutlass.Float32, (cache_rows, NUM_KV_HEADS), stride_order=(1, 0),
                                            assumed_align=16)

        slot = make_fake_compact_tensor(cutlass.Int64, (tokens,), assumed_align=8)
        fn = cute.compile(_fp8_append, src(), src(), slot, cache(), cache(), scales(), scales(),
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache):
    """Quantize key/value per (token, head) to e4m3 and write values + scales at slot_mapping (>= 0); None."""
    tokens = key.shape[0]
    for c in (k_cache, v_cache, k_scale_cache, v_scale_cache):
        if not c.is_contiguous():
            raise ValueError("expects contiguous caches (they are updated in place)")
    if tokens == 0:
        return None
    rows = k_cache.shape[0] * k_cache.shape[1]
    width = NUM_KV_HEADS * HEAD_DIM
    _compiled_for(tokens, rows)(
        key.contiguous().view(tokens, width), value.contiguous().view(tokens, width), slot_mapping.contiguous(),
        k_cache.view(rows, width), v_cache.view(rows, width),
        k_scale_cache.view(rows, NUM_KV_HEADS), v_scale_cache.view(rows, NUM_KV_HEADS))
    return None
