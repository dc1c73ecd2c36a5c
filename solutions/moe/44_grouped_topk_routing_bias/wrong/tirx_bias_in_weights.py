"""Wrong: the TIRx gold noaux_tc router with the correction bias kept in the routing weights.

The expert choice is right (sigmoid + e_score_correction_bias, group-limited top-8), but the weights of the eight
picks are renormalised from the BIASED score sigmoid(logit) + bias of each pick instead of the plain sigmoid score.
In DeepSeek-V3's noaux_tc routing the bias only steers the selection (load balancing) and must not reach the
weights; with biases in [-0.15, 0.15] against scores around 0.5 nearly every weight is off by percents. topk_ids
still match, so only topk_weights fails.

Expected: wrong/mismatch
"""

import torch
import tvm
from tvm.script import tirx as Tx

NUM_EXPERTS = 256
N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
SCALE = 2.5
PER_LANE = NUM_EXPERTS // 32  # 8 experts per lane; register j is in group j
WARPS = 4
THREADS = WARPS * 32
FULL = 0xFFFFFFFF


@Tx.prim_func
def grouped_topk_routing_bias(x_ptr: Tx.handle, b_ptr: Tx.handle, w_ptr: Tx.handle, i_ptr: Tx.handle):
    T = Tx.int32()
    X = Tx.match_buffer(x_ptr, (T, NUM_EXPERTS), "float32", align=16)
    B = Tx.match_buffer(b_ptr, (NUM_EXPERTS,), "float32", align=16)
    W = Tx.match_buffer(w_ptr, (T, TOP_K), "float32")
    I = Tx.match_buffer(i_ptr, (T, TOP_K), "int32")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(T, WARPS)])
    tx = Tx.thread_id([THREADS])
    ch = Tx.alloc_local((PER_LANE,), "float32")  # choice = sigmoid + bias (then masked / struck out)
    gs = Tx.alloc_local((N_GROUP,), "float32")  # group scores (same in every lane)
    a1 = Tx.alloc_local((1,), "float32")
    a2 = Tx.alloc_local((1,), "float32")
    b1 = Tx.alloc_local((1,), "float32")
    b2 = Tx.alloc_local((1,), "float32")
    rank = Tx.alloc_local((1,), "int32")
    bv = Tx.alloc_local((1,), "float32")
    bi = Tx.alloc_local((1,), "int32")
    ov = Tx.alloc_local((1,), "float32")
    oi = Tx.alloc_local((1,), "int32")
    my_id = Tx.alloc_local((1,), "int32")
    score = Tx.alloc_local((1,), "float64")
    total = Tx.alloc_local((1,), "float64")
    lane: Tx.let = tx % 32
    row: Tx.let = bx * WARPS + tx // 32
    if row < T:  # warp-uniform
        for j in Tx.unroll(PER_LANE):
            ch[j] = Tx.float32(1.0) / (Tx.float32(1.0) + Tx.exp(Tx.float32(0.0) - X[row, j * 32 + lane])) \
                + B[j * 32 + lane]

        # 1. group scores: top-2 sum of the 32 choices of group g (= register g of every lane)
        for g in Tx.unroll(N_GROUP):
            a1[0] = ch[g]
            a2[0] = Tx.float32("-inf")
            for s in Tx.unroll(5):  # xor offsets 16, 8, 4, 2, 1
                b1[0] = Tx.tvm_warp_shuffle_xor(FULL, a1[0], 16 >> s, 32, 32)
                b2[0] = Tx.tvm_warp_shuffle_xor(FULL, a2[0], 16 >> s, 32, 32)
                a2[0] = Tx.max(Tx.min(a1[0], b1[0]), Tx.max(a2[0], b2[0]))
                a1[0] = Tx.max(a1[0], b1[0])
            gs[g] = a1[0] + a2[0]

        # 2. the top-4 groups: rank = number of groups ahead of g; the others are struck out
        for g in Tx.unroll(N_GROUP):
            rank[0] = 0
            for h in Tx.unroll(N_GROUP):
                if (h < g and gs[h] >= gs[g]) or (h > g and gs[h] > gs[g]):
                    rank[0] = rank[0] + 1
            if rank[0] >= TOPK_GROUP:
                ch[g] = Tx.float32("-inf")

        # 3. top-8 among the kept experts, one butterfly arg-max per pick
        my_id[0] = 0
        for k in Tx.unroll(TOP_K):
            bv[0] = ch[0]
            bi[0] = lane
            for j in Tx.unroll(PER_LANE - 1):
                if ch[j + 1] > bv[0]:
                    bv[0] = ch[j + 1]
                    bi[0] = (j + 1) * 32 + lane
            for s in Tx.unroll(5):
                ov[0] = Tx.tvm_warp_shuffle_xor(FULL, bv[0], 16 >> s, 32, 32)
                oi[0] = Tx.tvm_warp_shuffle_xor(FULL, bi[0], 16 >> s, 32, 32)
                if ov[0] > bv[0] or (ov[0] == bv[0] and oi[0] < bi[0]):
                    bv[0] = ov[0]
                    bi[0] = oi[0]
            for j in Tx.unroll(PER_LANE):
                if j * 32 + lane == bi[0]:
                    ch[j] = Tx.float32("-inf")
            if lane == k:
                my_id[0] = bi[0]

        # 4. renormalised selection scores of the 8 picks, in float64
        score[0] = Tx.float64(0.0)
        if lane < TOP_K:
            score[0] = Tx.float64(1.0) / (Tx.float64(1.0) + Tx.exp(Tx.float64(0.0)
                                                                   - Tx.cast(X[row, my_id[0]], "float64"))) \
                + Tx.cast(B[my_id[0]], "float64")  # the pick's selection score
        total[0] = score[0]
        for s in Tx.unroll(5):
            total[0] = total[0] + Tx.tvm_warp_shuffle_xor(FULL, total[0], 16 >> s, 32, 32)
        if lane < TOP_K:
            W[row, lane] = Tx.cast(score[0] / total[0] * Tx.float64(SCALE), "float32")
            I[row, lane] = my_id[0]


_EXE = {}


def _executable():
    exe = _EXE.get("main")
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(grouped_topk_routing_bias, target=target, tir_pipeline="tirx")
        _EXE["main"] = exe
    return exe


def solve(gating_output, e_score_correction_bias):
    """Return (topk_weights [T, 8] fp32, topk_ids [T, 8] int32)."""
    x = gating_output.contiguous()
    bias = e_score_correction_bias.contiguous()
    tokens, experts = x.shape
    if experts != NUM_EXPERTS:
        raise ValueError(f"expected {NUM_EXPERTS} experts, got {experts}")
    weights = torch.empty((tokens, TOP_K), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, TOP_K), dtype=torch.int32, device=x.device)
    if tokens > 0:
        _executable()(x, bias, weights, ids)
    return weights, ids
