"""Problem 21 (dynamic fp8 e4m3 quantization of new K/V, one scale per (token, kv head), paged-cache append), TIRx.

One kernel. Grid (T, 2): cta y = 0 quantizes key, 1 value; CTA of 128 threads = the 8 head vectors of one token,
16 threads per head, each loading one 16-byte vector (8 bf16, channels 8l..8l+7). A CTA whose slot_mapping[t] is
negative (padding) writes nothing (the test is uniform per CTA, so the shuffles stay converged). Otherwise: max |x|
of the 8 values in fp32, a butterfly max over the head's 16 lanes (xor 8, 4, 2, 1), amax = max(amax, 1e-6),
scale = amax / 448, q = clamp(x / scale, -448, 448) cast to e4m3 (round to nearest even, 8 bytes stored as one
vector) into cache row slot (cache viewed as [num_blocks * 16, 1024]); lane 0 of each head writes the fp32 scale
(scale cache viewed as [num_blocks * 16, 8]). TVM builds CUDA with --use_fast_math, so the two divisions are the
approximate fp32 divide (<= 2 ulp), far inside the comparator's 1-e4m3-ulp / scale tolerance. Valid slots are
distinct: no conflicts. All extents compile-time constants; one executable per shape; returns None.
"""

import tvm
from tvm.script import tirx as Tx

NUM_KV_HEADS = 8
HEAD_DIM = 128
WIDTH = NUM_KV_HEADS * HEAD_DIM
FP8_MAX = 448.0
MIN_AMAX = 1e-6
VEC = 8  # bf16 per 16-byte load
LANES = HEAD_DIM // VEC  # 16 threads per head vector
TPB = NUM_KV_HEADS * LANES  # 128
FULL = 0xFFFFFFFF


def _make_kernel(tokens, cache_rows):
    @Tx.prim_func
    def fp8_cache_append(k_ptr: Tx.handle, v_ptr: Tx.handle, slot_ptr: Tx.handle, kc_ptr: Tx.handle,
                         vc_ptr: Tx.handle, ks_ptr: Tx.handle, vs_ptr: Tx.handle):
        K = Tx.match_buffer(k_ptr, (tokens, WIDTH), "bfloat16", align=16)
        V = Tx.match_buffer(v_ptr, (tokens, WIDTH), "bfloat16", align=16)
        SLOT = Tx.match_buffer(slot_ptr, (tokens,), "int64")
        KC = Tx.match_buffer(kc_ptr, (cache_rows, WIDTH), "float8_e4m3fn", align=16)
        VC = Tx.match_buffer(vc_ptr, (cache_rows, WIDTH), "float8_e4m3fn", align=16)
        KS = Tx.match_buffer(ks_ptr, (cache_rows, NUM_KV_HEADS), "float32", align=16)
        VS = Tx.match_buffer(vs_ptr, (cache_rows, NUM_KV_HEADS), "float32", align=16)
        Tx.device_entry()
        t, kv = Tx.cta_id([tokens, 2])
        tx = Tx.thread_id([TPB])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        xf = Tx.alloc_local((VEC,), "float32")
        qv = Tx.alloc_local((VEC,), "float8_e4m3fn")
        slot: Tx.let = Tx.cast(SLOT[t], "int32")
        head: Tx.let = tx // LANES
        col: Tx.let = tx * VEC  # = head * 128 + lane * 8
        if slot >= 0:  # uniform per CTA
            if kv == 0:
                for v in Tx.vectorized(VEC):
                    xv[v] = K[t, col + v]
            else:
                for v in Tx.vectorized(VEC):
                    xv[v] = V[t, col + v]
            amax: Tx.float32 = 0.0
            for v in Tx.unroll(VEC):
                xf[v] = Tx.cast(xv[v], "float32")
                amax = Tx.max(amax, Tx.fabs(xf[v]))
            for s in Tx.unroll(4):  # xor 8, 4, 2, 1: within the head's 16 lanes
                amax = Tx.max(amax, Tx.tvm_warp_shuffle_xor(FULL, amax, 8 >> s, 32, 32))
            scale: Tx.float32 = Tx.max(amax, Tx.float32(MIN_AMAX)) / Tx.float32(FP8_MAX)
            for v in Tx.unroll(VEC):
                qv[v] = Tx.cast(Tx.min(Tx.max(xf[v] / scale, Tx.float32(-FP8_MAX)), Tx.float32(FP8_MAX)),
                                "float8_e4m3fn")
            if kv == 0:
                for v in Tx.vectorized(VEC):
                    KC[slot, col + v] = qv[v]
                if tx % LANES == 0:
                    KS[slot, head] = scale
            else:
                for v in Tx.vectorized(VEC):
                    VC[slot, col + v] = qv[v]
                if tx % LANES == 0:
                    VS[slot, head] = scale

    return fp8_cache_append


_EXES = {}


def _executable(tokens, cache_rows):
    key = (tokens, cache_rows)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(*key), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


def solve(key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache):
    """Quantize key/value per (token, head) to e4m3 and write values + scales at slot_mapping (>= 0); None."""
    tokens = key.shape[0]
    for c in (k_cache, v_cache, k_scale_cache, v_scale_cache):
        if not c.is_contiguous():
            raise ValueError("expects contiguous caches (they are updated in place)")
    if tokens == 0:
        return None
    rows = k_cache.shape[0] * k_cache.shape[1]
    _executable(tokens, rows)(
        key.contiguous().view(tokens, WIDTH), value.contiguous().view(tokens, WIDTH), slot_mapping.contiguous(),
        k_cache.view(rows, WIDTH), v_cache.view(rows, WIDTH),
        k_scale_cache.view(rows, NUM_KV_HEADS), v_scale_cache.view(rows, NUM_KV_HEADS))
    return None
