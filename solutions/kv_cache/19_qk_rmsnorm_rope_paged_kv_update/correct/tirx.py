"""Problem 19 (Qwen3 QK-RMSNorm + NeoX RoPE + paged KV-cache write), TIRx: sixteen threads per head vector.

One kernel. Grid (T, 3), CTA of 256 threads = 16 head vectors of one token: cta y = 0, 1 take q heads 0-15 and
16-31, y = 2 the 8 k heads and the 8 v heads (head h = 16 * y + tx // 16 of the 48 in qkv's row). Lane l of a head
loads channels 8l..8l+7 as one 16-byte vector. For q and k: sum of squares in fp32, butterfly shuffles 8, 4, 2, 1
lanes apart (inside the 16-lane group), n = x * rsqrt(ss / 128 + eps) * weight in fp32. NeoX pairs channel c with
c +- 64, held by lane l ^ 8: one xor-8 shuffle per value brings the partner's normed value; with i = c mod 64,
out = n * cos[pos, i] + sgn * partner * sin[pos, i] (sgn = -1 for the first half, +1 for the second), rounded
once to bf16. q goes to the output, k to k_cache row slot_mapping[t] (cache viewed as [num_blocks * 16, 1024]), and
v is copied unchanged to v_cache at the same row. Slots are distinct: no write conflicts. Head type is uniform per
warp; every lane runs the shuffles. All sizes are compile-time constants; one executable per shape.
"""

import torch
import tvm
from tvm.script import tirx as Tx

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
HALF = HEAD_DIM // 2
EPS = 1e-6
VEC = 8  # bf16 per 16-byte access
LANES = HEAD_DIM // VEC  # 16 threads per head vector
TPB = 256
HEADS_PER_CTA = TPB // LANES  # 16
FULL = 0xFFFFFFFF


def _make_kernel(tokens, max_pos, cache_rows):
    width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    kv_width = NUM_KV_HEADS * HEAD_DIM
    n_y = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) // HEADS_PER_CTA

    @Tx.prim_func
    def qk_norm_rope_cache(qkv_ptr: Tx.handle, qw_ptr: Tx.handle, kw_ptr: Tx.handle, cs_ptr: Tx.handle,
                           pos_ptr: Tx.handle, slot_ptr: Tx.handle, kc_ptr: Tx.handle, vc_ptr: Tx.handle,
                           out_ptr: Tx.handle):
        QKV = Tx.match_buffer(qkv_ptr, (tokens, width), "bfloat16", align=16)
        QW = Tx.match_buffer(qw_ptr, (HEAD_DIM,), "bfloat16", align=16)
        KW = Tx.match_buffer(kw_ptr, (HEAD_DIM,), "bfloat16", align=16)
        CS = Tx.match_buffer(cs_ptr, (max_pos, HEAD_DIM), "float32", align=16)
        POS = Tx.match_buffer(pos_ptr, (tokens,), "int64")
        SLOT = Tx.match_buffer(slot_ptr, (tokens,), "int64")
        KC = Tx.match_buffer(kc_ptr, (cache_rows, kv_width), "bfloat16", align=16)
        VC = Tx.match_buffer(vc_ptr, (cache_rows, kv_width), "bfloat16", align=16)
        OUT = Tx.match_buffer(out_ptr, (tokens, NUM_Q_HEADS * HEAD_DIM), "bfloat16", align=16)
        Tx.device_entry()
        t, y = Tx.cta_id([tokens, n_y])
        tx = Tx.thread_id([TPB])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        wv = Tx.alloc_local((VEC,), "bfloat16")
        cv = Tx.alloc_local((VEC,), "float32")
        sv = Tx.alloc_local((VEC,), "float32")
        nv = Tx.alloc_local((VEC,), "float32")
        pv = Tx.alloc_local((VEC,), "float32")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        lane: Tx.let = tx % LANES
        head: Tx.let = y * HEADS_PER_CTA + tx // LANES
        col: Tx.let = head * HEAD_DIM + lane * VEC
        slot: Tx.let = Tx.cast(SLOT[t], "int32")
        pos: Tx.let = Tx.cast(POS[t], "int32")
        fcol: Tx.let = (lane % (LANES // 2)) * VEC  # first of this lane's 8 frequencies (channel mod 64)
        for v in Tx.vectorized(VEC):
            xv[v] = QKV[t, col + v]
        if head >= NUM_Q_HEADS + NUM_KV_HEADS:  # v: raw copy into the cache
            for v in Tx.vectorized(VEC):
                VC[slot, (head - NUM_Q_HEADS - NUM_KV_HEADS) * HEAD_DIM + lane * VEC + v] = xv[v]
        if head < NUM_Q_HEADS:
            for v in Tx.vectorized(VEC):
                wv[v] = QW[lane * VEC + v]
        else:
            for v in Tx.vectorized(VEC):
                wv[v] = KW[lane * VEC + v]
        ss: Tx.float32 = 0.0
        for v in Tx.unroll(VEC):
            nv[v] = Tx.cast(xv[v], "float32")
            ss = ss + nv[v] * nv[v]
        for s in Tx.unroll(4):  # xor 8, 4, 2, 1: stays inside each 16-lane group
            ss = ss + Tx.tvm_warp_shuffle_xor(FULL, ss, 8 >> s, 32, 32)
        inv_rms: Tx.float32 = Tx.rsqrt(ss / Tx.float32(HEAD_DIM) + Tx.float32(EPS))
        for v in Tx.unroll(VEC):
            nv[v] = nv[v] * inv_rms * Tx.cast(wv[v], "float32")
        for v in Tx.unroll(VEC):  # partner channel c +- 64 lives in lane l ^ 8
            pv[v] = Tx.tvm_warp_shuffle_xor(FULL, nv[v], 8, 32, 32)
        for c in Tx.unroll(2):  # 8 fp32 each: two 16-byte loads
            for v in Tx.vectorized(4):
                cv[c * 4 + v] = CS[pos, fcol + c * 4 + v]
            for v in Tx.vectorized(4):
                sv[c * 4 + v] = CS[pos, HALF + fcol + c * 4 + v]
        sgn: Tx.float32 = 1.0
        if lane < LANES // 2:
            sgn = Tx.float32(-1.0)
        for v in Tx.unroll(VEC):
            ov[v] = Tx.cast(nv[v] * cv[v] + sgn * (pv[v] * sv[v]), "bfloat16")
        if head < NUM_Q_HEADS:
            for v in Tx.vectorized(VEC):
                OUT[t, col + v] = ov[v]
        elif head < NUM_Q_HEADS + NUM_KV_HEADS:
            for v in Tx.vectorized(VEC):
                KC[slot, (head - NUM_Q_HEADS) * HEAD_DIM + lane * VEC + v] = ov[v]

    return qk_norm_rope_cache


_EXES = {}


def _executable(tokens, max_pos, cache_rows):
    key = (tokens, max_pos, cache_rows)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(*key), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


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
        _executable(tokens, cos_sin_cache.shape[0], rows)(
            qkv.contiguous(), q_norm_weight.contiguous(), k_norm_weight.contiguous(), cos_sin_cache.contiguous(),
            positions.contiguous(), slot_mapping.contiguous(), kc, vc, q_out)
    return q_out.view(tokens, NUM_Q_HEADS, HEAD_DIM)
