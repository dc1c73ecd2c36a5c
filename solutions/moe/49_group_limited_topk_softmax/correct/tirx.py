"""Problem 49 (DeepSeek-V2 group-limited top-6 of 160 softmax router), TIRx: one warp per token.

The selection is done on the logits (softmax is monotonic, so the order of the scores is the order of the logits,
and the logits are compared exactly): lane l holds experts l, l+32, ..., l+128 (5 coalesced fp32 loads per lane).
 1. group maxima: for each of the 8 groups of 20 consecutive experts, a masked max per lane + a butterfly max;
 2. the 3 kept groups: every lane ranks the 8 group maxima (ties broken by the lower group id);
 3. top-6: six rounds of a butterfly arg-max over (logit, expert id) among the experts of the kept groups; the
    winner is struck out; lane k keeps the k-th winner;
 4. weights: the softmax denominator sum(exp(x - max)) over all 160 experts in float64 (a butterfly sum), and
    lane k (< 6) writes 16 * exp(x_k - max) / sum rounded once to fp32, plus its expert id (int64).
The row max is the largest group maximum. float64 for the normaliser makes the weights correctly rounded up to a
few float64 ulps: far inside the fp32 tolerance.

CTA = 4 warps = 4 tokens (128 threads); grid = ceil(T / 4). The token count is symbolic: one executable,
compiled once per process.
"""

import torch
import tvm
from tvm.script import tirx as Tx

NUM_EXPERTS = 160
N_GROUP = 8
PER_GROUP = NUM_EXPERTS // N_GROUP  # 20
TOPK_GROUP = 3
TOP_K = 6
SCALE = 16.0
PER_LANE = NUM_EXPERTS // 32  # 5 experts per lane
WARPS = 4
THREADS = WARPS * 32
FULL = 0xFFFFFFFF


@Tx.prim_func
def group_limited_topk_softmax(x_ptr: Tx.handle, w_ptr: Tx.handle, i_ptr: Tx.handle):
    T = Tx.int32()
    X = Tx.match_buffer(x_ptr, (T, NUM_EXPERTS), "float32", align=16)
    W = Tx.match_buffer(w_ptr, (T, TOP_K), "float32")
    I = Tx.match_buffer(i_ptr, (T, TOP_K), "int64")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(T, WARPS)])
    tx = Tx.thread_id([THREADS])
    xo = Tx.alloc_local((PER_LANE,), "float32")  # this lane's logits
    xm = Tx.alloc_local((PER_LANE,), "float32")  # the same, -inf outside the kept groups / once picked
    gs = Tx.alloc_local((N_GROUP,), "float32")  # group maxima (same in every lane)
    kept = Tx.alloc_local((N_GROUP,), "int32")
    m = Tx.alloc_local((1,), "float32")
    rank = Tx.alloc_local((1,), "int32")
    bv = Tx.alloc_local((1,), "float32")
    bi = Tx.alloc_local((1,), "int32")
    ov = Tx.alloc_local((1,), "float32")
    oi = Tx.alloc_local((1,), "int32")
    my_id = Tx.alloc_local((1,), "int32")
    part = Tx.alloc_local((1,), "float64")
    row_max = Tx.alloc_local((1,), "float32")
    lane: Tx.let = tx % 32
    row: Tx.let = bx * WARPS + tx // 32
    if row < T:  # warp-uniform
        for j in Tx.unroll(PER_LANE):
            xo[j] = X[row, j * 32 + lane]

        # 1. group maxima
        for g in Tx.unroll(N_GROUP):
            m[0] = Tx.float32("-inf")
            for j in Tx.unroll(PER_LANE):
                if (j * 32 + lane) // PER_GROUP == g:
                    m[0] = Tx.max(m[0], xo[j])
            for s in Tx.unroll(5):  # xor offsets 16, 8, 4, 2, 1
                m[0] = Tx.max(m[0], Tx.tvm_warp_shuffle_xor(FULL, m[0], 16 >> s, 32, 32))
            gs[g] = m[0]
        row_max[0] = gs[0]
        for g in Tx.unroll(N_GROUP - 1):
            row_max[0] = Tx.max(row_max[0], gs[g + 1])

        # 2. the top-3 groups: rank = number of groups ahead of g (ties go to the lower group id)
        for g in Tx.unroll(N_GROUP):
            rank[0] = 0
            for h in Tx.unroll(N_GROUP):
                if (h < g and gs[h] >= gs[g]) or (h > g and gs[h] > gs[g]):
                    rank[0] = rank[0] + 1
            kept[g] = Tx.if_then_else(rank[0] < TOPK_GROUP, 1, 0)
        for j in Tx.unroll(PER_LANE):
            xm[j] = Tx.float32("-inf")
            for g in Tx.unroll(N_GROUP):  # compile-time group ids keep `kept` in registers
                if (j * 32 + lane) // PER_GROUP == g and kept[g] != 0:
                    xm[j] = xo[j]

        # 3. top-6 among the kept experts, one butterfly arg-max per pick
        my_id[0] = 0
        for k in Tx.unroll(TOP_K):
            bv[0] = xm[0]
            bi[0] = lane
            for j in Tx.unroll(PER_LANE - 1):
                if xm[j + 1] > bv[0]:
                    bv[0] = xm[j + 1]
                    bi[0] = (j + 1) * 32 + lane
            for s in Tx.unroll(5):
                ov[0] = Tx.tvm_warp_shuffle_xor(FULL, bv[0], 16 >> s, 32, 32)
                oi[0] = Tx.tvm_warp_shuffle_xor(FULL, bi[0], 16 >> s, 32, 32)
                if ov[0] > bv[0] or (ov[0] == bv[0] and oi[0] < bi[0]):
                    bv[0] = ov[0]
                    bi[0] = oi[0]
            for j in Tx.unroll(PER_LANE):
                if j * 32 + lane == bi[0]:
                    xm[j] = Tx.float32("-inf")
            if lane == k:
                my_id[0] = bi[0]

        # 4. softmax normaliser over all 160 logits in float64, then the 6 weights
        part[0] = Tx.float64(0.0)
        for j in Tx.unroll(PER_LANE):
            part[0] = part[0] + Tx.exp(Tx.cast(xo[j], "float64") - Tx.cast(row_max[0], "float64"))
        for s in Tx.unroll(5):
            part[0] = part[0] + Tx.tvm_warp_shuffle_xor(FULL, part[0], 16 >> s, 32, 32)
        if lane < TOP_K:
            W[row, lane] = Tx.cast(
                Tx.exp(Tx.cast(X[row, my_id[0]], "float64") - Tx.cast(row_max[0], "float64")) / part[0]
                * Tx.float64(SCALE), "float32")
            I[row, lane] = Tx.cast(my_id[0], "int64")


_EXE = {}


def _executable():
    exe = _EXE.get("main")
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(group_limited_topk_softmax, target=target, tir_pipeline="tirx")
        _EXE["main"] = exe
    return exe


def solve(router_logits):
    """Return (topk_weights [T, 6] fp32, topk_ids [T, 6] int64)."""
    x = router_logits.contiguous()
    tokens, experts = x.shape
    if experts != NUM_EXPERTS:
        raise ValueError(f"expected {NUM_EXPERTS} experts, got {experts}")
    weights = torch.empty((tokens, TOP_K), dtype=torch.float32, device=x.device)
    ids = torch.empty((tokens, TOP_K), dtype=torch.int64, device=x.device)
    if tokens > 0:
        _executable()(x, weights, ids)
    return weights, ids
