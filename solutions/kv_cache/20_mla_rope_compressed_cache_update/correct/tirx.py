"""Problem 20 (MLA pre-attention epilogue: RMSNorm of c_kv, interleaved RoPE of k_pe and q_pe, concat_and_cache_mla),
TIRx: one CTA per token.

Grid T, 32 + 32 * ceil((H + 1) * 8 / 32) threads. Warp 0 normalises the latent: lane l loads the 16-byte vectors at
channels 8l and 256 + 8l (coalesced), sums their squares in fp32, a 5-step butterfly shuffle over the warp gives the
sum over all 512 channels, and n = x * rsqrt(ss / 512 + eps) * weight is rounded once to bf16 and stored to cache row
slot_mapping[t] (cache viewed as [num_blocks * page, 576]). The other threads rotate 8 channels each (4 interleaved
pairs (2i, 2i+1) inside one thread): r = 0..7 takes k_pe channels 8r..8r+7 (to cache channels 512 + 8r);
r = 8 + 8h + l takes q_pe channels 8l..8l+7 of head h, read and written back in place (q viewed as [T, H * 192]).
cos/sin of the 4 pairs are one 16-byte load each from cos_sin_cache[pos]; rotation in fp32, one bf16 rounding.
Slots are distinct and each q element has one owner: no conflicts. H, the page size and all extents are
compile-time constants; one executable per shape. Returns None like the reference.
"""

import tvm
from tvm.script import tirx as Tx

KV_LORA_RANK = 512
ROPE_DIM = 64
NOPE_DIM = 128
ENTRY = KV_LORA_RANK + ROPE_DIM  # 576
QDIM = NOPE_DIM + ROPE_DIM  # 192
EPS = 1e-6
VEC = 8  # bf16 per 16-byte access
PAIRS = VEC // 2
ROPE_LANES = ROPE_DIM // VEC  # 8 threads per 64-channel rope vector
FULL = 0xFFFFFFFF


def _make_kernel(tokens, heads, max_pos, cache_rows):
    rope_threads = (heads + 1) * ROPE_LANES
    tpb = 32 + (rope_threads + 31) // 32 * 32

    @Tx.prim_func
    def mla_rope_cache(q_ptr: Tx.handle, kv_ptr: Tx.handle, w_ptr: Tx.handle, cs_ptr: Tx.handle,
                       pos_ptr: Tx.handle, slot_ptr: Tx.handle, c_ptr: Tx.handle):
        Q = Tx.match_buffer(q_ptr, (tokens, heads * QDIM), "bfloat16", align=16)
        KV = Tx.match_buffer(kv_ptr, (tokens, ENTRY), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (KV_LORA_RANK,), "bfloat16", align=16)
        CS = Tx.match_buffer(cs_ptr, (max_pos, ROPE_DIM), "float32", align=16)
        POS = Tx.match_buffer(pos_ptr, (tokens,), "int64")
        SLOT = Tx.match_buffer(slot_ptr, (tokens,), "int64")
        C = Tx.match_buffer(c_ptr, (cache_rows, ENTRY), "bfloat16", align=16)
        Tx.device_entry()
        t = Tx.cta_id([tokens])
        tx = Tx.thread_id([tpb])
        x0 = Tx.alloc_local((VEC,), "bfloat16")
        x1 = Tx.alloc_local((VEC,), "bfloat16")
        w0 = Tx.alloc_local((VEC,), "bfloat16")
        w1 = Tx.alloc_local((VEC,), "bfloat16")
        y0 = Tx.alloc_local((VEC,), "bfloat16")
        y1 = Tx.alloc_local((VEC,), "bfloat16")
        f0 = Tx.alloc_local((VEC,), "float32")
        f1 = Tx.alloc_local((VEC,), "float32")
        cv = Tx.alloc_local((PAIRS,), "float32")
        sv = Tx.alloc_local((PAIRS,), "float32")
        slot: Tx.let = Tx.cast(SLOT[t], "int32")
        if tx < 32:  # warp 0: RMSNorm of the latent
            for v in Tx.vectorized(VEC):
                x0[v] = KV[t, tx * VEC + v]
            for v in Tx.vectorized(VEC):
                x1[v] = KV[t, 256 + tx * VEC + v]
            for v in Tx.vectorized(VEC):
                w0[v] = W[tx * VEC + v]
            for v in Tx.vectorized(VEC):
                w1[v] = W[256 + tx * VEC + v]
            ss: Tx.float32 = 0.0
            for v in Tx.unroll(VEC):
                f0[v] = Tx.cast(x0[v], "float32")
                f1[v] = Tx.cast(x1[v], "float32")
                ss = ss + f0[v] * f0[v] + f1[v] * f1[v]
            for s in Tx.unroll(5):  # xor 16, 8, 4, 2, 1
                ss = ss + Tx.tvm_warp_shuffle_xor(FULL, ss, 16 >> s, 32, 32)
            inv_rms: Tx.float32 = Tx.rsqrt(ss / Tx.float32(KV_LORA_RANK) + Tx.float32(EPS))
            for v in Tx.unroll(VEC):
                y0[v] = Tx.cast(f0[v] * inv_rms * Tx.cast(w0[v], "float32"), "bfloat16")
                y1[v] = Tx.cast(f1[v] * inv_rms * Tx.cast(w1[v], "float32"), "bfloat16")
            for v in Tx.vectorized(VEC):
                C[slot, tx * VEC + v] = y0[v]
            for v in Tx.vectorized(VEC):
                C[slot, 256 + tx * VEC + v] = y1[v]
        elif tx - 32 < rope_threads:
            r: Tx.let = tx - 32
            lane: Tx.let = r % ROPE_LANES
            pos: Tx.let = Tx.cast(POS[t], "int32")
            for v in Tx.vectorized(PAIRS):
                cv[v] = CS[pos, lane * PAIRS + v]
            for v in Tx.vectorized(PAIRS):
                sv[v] = CS[pos, ROPE_DIM // 2 + lane * PAIRS + v]
            if r < ROPE_LANES:  # k_pe -> cache channels 512 + 8 * lane
                for v in Tx.vectorized(VEC):
                    x0[v] = KV[t, KV_LORA_RANK + lane * VEC + v]
            else:  # q_pe of head h (read here, written back below)
                for v in Tx.vectorized(VEC):
                    x0[v] = Q[t, (r // ROPE_LANES - 1) * QDIM + NOPE_DIM + lane * VEC + v]
            for v in Tx.unroll(VEC):
                f0[v] = Tx.cast(x0[v], "float32")
            for p in Tx.unroll(PAIRS):
                y0[2 * p] = Tx.cast(f0[2 * p] * cv[p] - f0[2 * p + 1] * sv[p], "bfloat16")
                y0[2 * p + 1] = Tx.cast(f0[2 * p + 1] * cv[p] + f0[2 * p] * sv[p], "bfloat16")
            if r < ROPE_LANES:
                for v in Tx.vectorized(VEC):
                    C[slot, KV_LORA_RANK + lane * VEC + v] = y0[v]
            else:
                for v in Tx.vectorized(VEC):
                    Q[t, (r // ROPE_LANES - 1) * QDIM + NOPE_DIM + lane * VEC + v] = y0[v]

    return mla_rope_cache


_EXES = {}


def _executable(tokens, heads, max_pos, cache_rows):
    key = (tokens, heads, max_pos, cache_rows)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(*key), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


def solve(q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache):
    """Rotate q_pe in place in q and write [RMSNorm(c_kv) ; RoPE(k_pe)] into kv_cache rows slot_mapping; None."""
    tokens, heads = q.shape[:2]
    if not (q.is_contiguous() and kv_cache.is_contiguous()):
        raise ValueError("expects contiguous q and kv_cache (both are updated in place)")
    if tokens == 0:
        return None
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    _executable(tokens, heads, cos_sin_cache.shape[0], rows)(
        q.view(tokens, heads * QDIM), kv_latent.contiguous(), kv_norm_weight.contiguous(),
        cos_sin_cache.contiguous(), positions.contiguous(), slot_mapping.contiguous(), kv_cache.view(rows, ENTRY))
    return None
