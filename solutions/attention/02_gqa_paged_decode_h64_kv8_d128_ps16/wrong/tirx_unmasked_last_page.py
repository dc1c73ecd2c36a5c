"""Wrong: the TIRx gold decode kernel with the sequence length rounded up to whole pages.

The loop bound and the mask use ceil(seq_len / 16) * 16 tokens ("the tokens the request's pages hold"), so the
stale slots of each request's last, partly filled page are attended as if they were context. The problem says
they hold stale data and must be masked; here the pool is random, so every request whose length is not a multiple
of 16 gets up to 15 extra random keys and values in its softmax.

Expected: wrong/mismatch
"""

import math

import torch
import tvm
from tvm.script import tirx as Tx

HEAD_DIM = 128
VEC = 8  # bf16 per 16-byte vector = dims per lane
LANES = HEAD_DIM // VEC  # 16 lanes per worker
THREADS = 256
WARPS = THREADS // 32
WORKERS = THREADS // LANES  # 16
UNROLL = 2  # tokens per worker per loop trip
M_INIT = -1.0e30  # running max before any token (finite: exp2(M_INIT - x) = 0, never NaN)
S_MASKED = -1.0e38  # logit of a masked token: exp2(S_MASKED - m) = 0 for any m >= M_INIT
QSCALE = math.log2(math.e) / math.sqrt(HEAD_DIM)


def _make_kernel(B, H, KVH, PS, P, MB):
    G = H // KVH
    ROWS = P * PS * KVH  # rows of the (P * PS * KVH, D) K / V views
    EPT = G * HEAD_DIM // THREADS  # outputs per thread in the epilogue
    D = HEAD_DIM

    @Tx.prim_func
    def gqa_paged_decode(q_ptr: Tx.handle, k_ptr: Tx.handle, v_ptr: Tx.handle, bt_ptr: Tx.handle,
                         len_ptr: Tx.handle, o_ptr: Tx.handle):
        Q = Tx.match_buffer(q_ptr, (B * H, D), "bfloat16", align=16)
        K = Tx.match_buffer(k_ptr, (ROWS, D), "bfloat16", align=16)
        V = Tx.match_buffer(v_ptr, (ROWS, D), "bfloat16", align=16)
        BT = Tx.match_buffer(bt_ptr, (B, MB), "int32")
        LEN = Tx.match_buffer(len_ptr, (B,), "int32")
        O = Tx.match_buffer(o_ptr, (B * H, D), "bfloat16", align=16)
        Tx.device_entry()
        bid = Tx.cta_id([B * KVH])
        tx = Tx.thread_id([THREADS])
        b: Tx.let = bid // KVH
        kvh: Tx.let = bid % KVH
        warp: Tx.let = tx // 32
        lane: Tx.let = tx % 32
        worker: Tx.let = tx // LANES
        sub: Tx.let = tx % LANES
        qrow0: Tx.let = b * H + kvh * G
        seq_len: Tx.let = (LEN[b] + (PS - 1)) // PS * PS  # tokens held by the request's pages
        n_iter: Tx.let = (seq_len + (WORKERS * UNROLL - 1)) // (WORKERS * UNROLL)

        qb = Tx.alloc_local((VEC,), "bfloat16")
        kb = Tx.alloc_local((UNROLL * VEC,), "bfloat16")
        vb = Tx.alloc_local((UNROLL * VEC,), "bfloat16")
        rq = Tx.alloc_local((G * VEC,), "float32")
        acc = Tx.alloc_local((G * VEC,), "float32")
        rm = Tx.alloc_local((G,), "float32")
        rl = Tx.alloc_local((G,), "float32")
        kf = Tx.alloc_local((VEC,), "float32")
        vf = Tx.alloc_local((VEC,), "float32")
        sc = Tx.alloc_local((4,), "float32")  # scratch scalars: logit, new max, correction, probability
        ob = Tx.alloc_local((EPT,), "bfloat16")
        of = Tx.alloc_local((EPT,), "float32")

        for g in Tx.unroll(G):
            for v in Tx.vectorized(VEC):
                qb[v] = Q[qrow0 + g, sub * VEC + v]
            for v in Tx.unroll(VEC):
                rq[g * VEC + v] = Tx.cast(qb[v], "float32") * Tx.float32(QSCALE)
                acc[g * VEC + v] = Tx.float32(0.0)
            rm[g] = Tx.float32(M_INIT)
            rl[g] = Tx.float32(0.0)

        for it in range(n_iter):
            # issue every load of this trip first
            for u in Tx.unroll(UNROLL):
                j: Tx.let = (it * UNROLL + u) * WORKERS + worker
                jc: Tx.let = Tx.min(j, seq_len - 1)  # a real token of this request (ignored when j >= len)
                page: Tx.let = BT[b, jc // PS]
                row: Tx.let = (page * PS + jc % PS) * KVH + kvh
                for v in Tx.vectorized(VEC):
                    kb[u * VEC + v] = K[row, sub * VEC + v]
                for v in Tx.vectorized(VEC):
                    vb[u * VEC + v] = V[row, sub * VEC + v]
            for u in Tx.unroll(UNROLL):
                j2: Tx.let = (it * UNROLL + u) * WORKERS + worker
                for v in Tx.unroll(VEC):
                    kf[v] = Tx.cast(kb[u * VEC + v], "float32")
                    vf[v] = Tx.cast(vb[u * VEC + v], "float32")
                for g in Tx.unroll(G):
                    sc[0] = Tx.float32(0.0)
                    for v in Tx.unroll(VEC):
                        sc[0] = sc[0] + rq[g * VEC + v] * kf[v]
                    for k in Tx.unroll(4):  # lanes 8, 4, 2, 1 apart: stays inside the 16-lane worker
                        sc[0] = sc[0] + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sc[0], 8 >> k, 32, 32)
                    sc[0] = Tx.if_then_else(j2 < seq_len, sc[0], Tx.float32(S_MASKED))
                    sc[1] = Tx.max(rm[g], sc[0])
                    sc[2] = Tx.exp2(rm[g] - sc[1])
                    sc[3] = Tx.exp2(sc[0] - sc[1])
                    rm[g] = sc[1]
                    rl[g] = rl[g] * sc[2] + sc[3]
                    for v in Tx.unroll(VEC):
                        acc[g * VEC + v] = acc[g * VEC + v] * sc[2] + vf[v] * sc[3]

        # merge the two workers of each warp (lanes l and l ^ 16 own the same dims)
        for g in Tx.unroll(G):
            sc[0] = Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, rm[g], 16, 32, 32)  # other worker's max
            sc[3] = Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, rl[g], 16, 32, 32)  # other worker's sum
            sc[1] = Tx.max(rm[g], sc[0])
            sc[2] = Tx.exp2(rm[g] - sc[1])  # own correction
            sc[0] = Tx.exp2(sc[0] - sc[1])  # other's correction
            rl[g] = rl[g] * sc[2] + sc[3] * sc[0]
            rm[g] = sc[1]
            for v in Tx.unroll(VEC):
                acc[g * VEC + v] = (acc[g * VEC + v] * sc[2]
                                    + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, acc[g * VEC + v], 16, 32, 32) * sc[0])

        s_acc = Tx.alloc_shared((WARPS * G * D,), "float32")
        s_m = Tx.alloc_shared((WARPS * G,), "float32")
        s_l = Tx.alloc_shared((WARPS * G,), "float32")
        if lane < LANES:
            for g in Tx.unroll(G):
                for v in Tx.unroll(VEC):
                    s_acc[(warp * G + g) * D + sub * VEC + v] = acc[g * VEC + v]
                if sub == 0:
                    s_m[warp * G + g] = rm[g]
                    s_l[warp * G + g] = rl[g]
        Tx.cuda.cta_sync()

        # each thread finishes EPT contiguous outputs of one query head
        g_out: Tx.let = (tx * EPT) // D
        d0: Tx.let = (tx * EPT) % D
        sc[1] = Tx.float32(M_INIT)
        for w in Tx.unroll(WARPS):
            sc[1] = Tx.max(sc[1], s_m[w * G + g_out])
        sc[3] = Tx.float32(0.0)  # denominator
        for e in Tx.unroll(EPT):
            of[e] = Tx.float32(0.0)
        for w in Tx.unroll(WARPS):
            sc[2] = Tx.exp2(s_m[w * G + g_out] - sc[1])
            sc[3] = sc[3] + s_l[w * G + g_out] * sc[2]
            for e in Tx.unroll(EPT):
                of[e] = of[e] + s_acc[(w * G + g_out) * D + d0 + e] * sc[2]
        sc[0] = Tx.float32(1.0) / sc[3]
        for e in Tx.unroll(EPT):
            ob[e] = Tx.cast(of[e] * sc[0], "bfloat16")
        for e in Tx.vectorized(EPT):
            O[qrow0 + g_out, d0 + e] = ob[e]

    return gqa_paged_decode


_EXES = {}


def _executable(B, H, KVH, PS, P, MB):
    key = (B, H, KVH, PS, P, MB)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(B, H, KVH, PS, P, MB), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


def solve(q, k_cache, v_cache, block_table, seq_lens):
    B, H, D = q.shape
    P, PS, KVH, _ = k_cache.shape
    MB = block_table.shape[1]
    if D != HEAD_DIM or H % KVH != 0 or ((H // KVH) * HEAD_DIM) % THREADS != 0:
        raise ValueError(f"unsupported shape: H={H}, KVH={KVH}, D={D}")
    q2 = q.contiguous().view(B * H, D)
    k2 = k_cache.contiguous().view(P * PS * KVH, D)
    v2 = v_cache.contiguous().view(P * PS * KVH, D)
    out = torch.empty_like(q2)
    _executable(B, H, KVH, PS, P, MB)(q2, k2, v2, block_table.contiguous(), seq_lens.contiguous(), out)
    return out.view(B, H, D)
