"""Problem 45 (GShard top-2 gating with capacity, fairseq/NLLB-MoE), TIRx: four kernels, no atomics.

Tokens are cut into chunks of 128 (one CTA each); the slot of an assignment is a per-expert exclusive prefix count,
so it splits into (count in earlier chunks) + (rank inside the chunk):
 1. route (grid = chunks, 256 threads): a group of LPT = min(8, E/4) lanes per token loads the E fp32 logits as
    coalesced 16-byte vectors; each lane keeps its top-2 (value, expert), visited in ascending expert order with
    strict `>` (ties -> lowest id), and a butterfly merge over the group gives e1, e2 exactly as torch.argmax does.
    It also sums exp(x - max) and stores b = exp(x2 - x1) and g2 = b / sum (fp32). e1/e2 go to shared memory,
    then thread j < 2E walks the chunk in token order for (choice j // E, expert j % E), writing each matching
    token's in-chunk rank and finally the chunk count cnt[chunk, j].
 2. scan (1 CTA, 2E threads): column j of cnt becomes its exclusive prefix over chunks; tot[j] = column total.
 3. finalize (grid = chunks, 128 threads, one per token): s1 = cnt[c, e1] + rank1, s2 = tot[e2] + cnt[c, E + e2]
    + rank2 (all first choices of an expert precede its second choices); kept iff slot < C. Weights after dropping:
    both kept -> 1 / (1 + b), b / (1 + b) (= g1 / (g1 + g2) exactly, the softmax normaliser cancels); only the
    first -> 1 (g1 >= 1/E > eps); only the second -> g2 / max(g2, eps); none -> 0. Kept pairs write src[e, s] = t.
 4. copy (one 16-byte vector per thread over dispatched [E*C, d]): expert e's slots 0..min(tot[e] + tot[E+e], C)-1
    are exactly the filled ones, so row (e, s) copies hidden[src[e, s]] there and zeros elsewhere: every output
    byte is written once, coalesced.
T, E, d, C are compile-time constants (four executables compiled once per shape; launches on torch's stream).
"""

import math

import torch
import tvm
from tvm.script import tirx as Tx

CHUNK = 128  # tokens per chunk (route / finalize CTA)
THREADS = 256  # route CTA
VEC = 8  # bf16 per 16-byte vector in the copy
COPY_THREADS = 256
EPS = float(torch.finfo(torch.float32).eps)
FULL = 0xFFFFFFFF


def _make_route(T, E, nch, lpt):
    nq = E // 4 // lpt  # float4 vectors per lane
    tpp = THREADS // lpt  # tokens per pass
    log_lpt = lpt.bit_length() - 1

    @Tx.prim_func
    def route(l_ptr: Tx.handle, ids_ptr: Tx.handle, sl_ptr: Tx.handle, w_ptr: Tx.handle, cnt_ptr: Tx.handle):
        L = Tx.match_buffer(l_ptr, (T, E), "float32", align=16)
        IDS = Tx.match_buffer(ids_ptr, (T, 2), "int64")
        SL = Tx.match_buffer(sl_ptr, (T, 2), "int64")
        W = Tx.match_buffer(w_ptr, (T, 2), "float32")
        CNT = Tx.match_buffer(cnt_ptr, (nch, 2 * E), "int32")
        Tx.device_entry()
        bx = Tx.cta_id([nch])
        tx = Tx.thread_id([THREADS])
        sE = Tx.alloc_shared((2 * CHUNK,), "int32")
        xs = Tx.alloc_local((nq * 4,), "float32")
        v1 = Tx.alloc_local((1,), "float32")
        i1 = Tx.alloc_local((1,), "int32")
        v2 = Tx.alloc_local((1,), "float32")
        i2 = Tx.alloc_local((1,), "int32")
        b1 = Tx.alloc_local((1,), "float32")
        bi1 = Tx.alloc_local((1,), "int32")
        b2 = Tx.alloc_local((1,), "float32")
        bi2 = Tx.alloc_local((1,), "int32")
        s = Tx.alloc_local((1,), "float32")
        bb = Tx.alloc_local((1,), "float32")
        cnt = Tx.alloc_local((1,), "int32")
        grp: Tx.let = tx // lpt
        sub: Tx.let = tx % lpt
        for p in Tx.unroll(CHUNK // tpp):
            li: Tx.let = p * tpp + grp  # token inside the chunk
            t: Tx.let = bx * CHUNK + li
            tr: Tx.let = Tx.min(t, T - 1)  # tail: compute on a valid row, write nothing
            for r in Tx.unroll(nq):
                for c in Tx.vectorized(4):
                    xs[r * 4 + c] = L[tr, (sub + lpt * r) * 4 + c]
            v1[0] = Tx.float32("-inf")
            i1[0] = E
            v2[0] = Tx.float32("-inf")
            i2[0] = E
            for r in Tx.unroll(nq):
                for c in Tx.unroll(4):
                    if xs[r * 4 + c] > v1[0]:
                        v2[0] = v1[0]
                        i2[0] = i1[0]
                        v1[0] = xs[r * 4 + c]
                        i1[0] = (sub + lpt * r) * 4 + c
                    elif xs[r * 4 + c] > v2[0]:
                        v2[0] = xs[r * 4 + c]
                        i2[0] = (sub + lpt * r) * 4 + c
            for k in Tx.unroll(log_lpt):  # xor offsets lpt/2, ..., 1 (inside the token's lane group)
                b1[0] = Tx.tvm_warp_shuffle_xor(FULL, v1[0], (lpt // 2) >> k, 32, 32)
                bi1[0] = Tx.tvm_warp_shuffle_xor(FULL, i1[0], (lpt // 2) >> k, 32, 32)
                b2[0] = Tx.tvm_warp_shuffle_xor(FULL, v2[0], (lpt // 2) >> k, 32, 32)
                bi2[0] = Tx.tvm_warp_shuffle_xor(FULL, i2[0], (lpt // 2) >> k, 32, 32)
                if v1[0] > b1[0] or (v1[0] == b1[0] and i1[0] < bi1[0]):
                    if b1[0] > v2[0] or (b1[0] == v2[0] and bi1[0] < i2[0]):
                        v2[0] = b1[0]
                        i2[0] = bi1[0]
                else:
                    if v1[0] > b2[0] or (v1[0] == b2[0] and i1[0] < bi2[0]):
                        v2[0] = v1[0]
                        i2[0] = i1[0]
                    else:
                        v2[0] = b2[0]
                        i2[0] = bi2[0]
                    v1[0] = b1[0]
                    i1[0] = bi1[0]
            s[0] = Tx.float32(0.0)
            for j in Tx.unroll(nq * 4):
                s[0] = s[0] + Tx.exp(xs[j] - v1[0])
            for k in Tx.unroll(log_lpt):
                s[0] = s[0] + Tx.tvm_warp_shuffle_xor(FULL, s[0], (lpt // 2) >> k, 32, 32)
            bb[0] = Tx.exp(v2[0] - v1[0])
            if sub == 0:
                if t < T:
                    IDS[t, 0] = Tx.cast(i1[0], "int64")
                    IDS[t, 1] = Tx.cast(i2[0], "int64")
                    W[t, 0] = bb[0]
                    W[t, 1] = bb[0] / s[0]
                    sE[li] = i1[0]
                    sE[CHUNK + li] = i2[0]
                else:
                    sE[li] = -1
                    sE[CHUNK + li] = -1
        Tx.cuda.cta_sync()
        if tx < 2 * E:
            cnt[0] = 0
            for i in range(CHUNK):
                if sE[(tx // E) * CHUNK + i] == tx % E:
                    SL[bx * CHUNK + i, tx // E] = Tx.cast(cnt[0], "int64")
                    cnt[0] = cnt[0] + 1
            CNT[bx, tx] = cnt[0]

    return route


def _make_scan(E, nch):
    @Tx.prim_func
    def scan(cnt_ptr: Tx.handle, tot_ptr: Tx.handle):
        CNT = Tx.match_buffer(cnt_ptr, (nch, 2 * E), "int32")
        TOT = Tx.match_buffer(tot_ptr, (2 * E,), "int32")
        Tx.device_entry()
        bx = Tx.cta_id([1])  # noqa: F841
        tx = Tx.thread_id([2 * E])
        vals = Tx.alloc_local((nch,), "int32")
        run = Tx.alloc_local((1,), "int32")
        for c in Tx.unroll(nch):
            vals[c] = CNT[c, tx]
        run[0] = 0
        for c in Tx.unroll(nch):
            CNT[c, tx] = run[0]
            run[0] = run[0] + vals[c]
        TOT[tx] = run[0]

    return scan


def _make_finalize(T, E, nch, C):
    @Tx.prim_func
    def finalize(ids_ptr: Tx.handle, sl_ptr: Tx.handle, w_ptr: Tx.handle, cnt_ptr: Tx.handle, tot_ptr: Tx.handle,
                 src_ptr: Tx.handle):
        IDS = Tx.match_buffer(ids_ptr, (T, 2), "int64")
        SL = Tx.match_buffer(sl_ptr, (T, 2), "int64")
        W = Tx.match_buffer(w_ptr, (T, 2), "float32")
        CNT = Tx.match_buffer(cnt_ptr, (nch, 2 * E), "int32")
        TOT = Tx.match_buffer(tot_ptr, (2 * E,), "int32")
        SRC = Tx.match_buffer(src_ptr, (E * C,), "int32")
        Tx.device_entry()
        bx = Tx.cta_id([nch])
        tx = Tx.thread_id([CHUNK])
        w1 = Tx.alloc_local((1,), "float32")
        w2 = Tx.alloc_local((1,), "float32")
        o1 = Tx.alloc_local((1,), "int64")
        o2 = Tx.alloc_local((1,), "int64")
        t: Tx.let = bx * CHUNK + tx
        if t < T:
            e1: Tx.let = Tx.cast(IDS[t, 0], "int32")
            e2: Tx.let = Tx.cast(IDS[t, 1], "int32")
            s1: Tx.let = CNT[bx, e1] + Tx.cast(SL[t, 0], "int32")
            s2: Tx.let = TOT[e2] + CNT[bx, E + e2] + Tx.cast(SL[t, 1], "int32")
            b: Tx.let = W[t, 0]
            g2: Tx.let = W[t, 1]
            w1[0] = Tx.float32(0.0)
            w2[0] = Tx.float32(0.0)
            o1[0] = Tx.int64(-1)
            o2[0] = Tx.int64(-1)
            if s1 < C:
                o1[0] = Tx.cast(s1, "int64")
                SRC[e1 * C + s1] = t
                if s2 < C:
                    w1[0] = Tx.float32(1.0) / (Tx.float32(1.0) + b)
                    w2[0] = b / (Tx.float32(1.0) + b)
                else:
                    w1[0] = Tx.float32(1.0)
            if s2 < C:
                o2[0] = Tx.cast(s2, "int64")
                SRC[e2 * C + s2] = t
                if s1 >= C:
                    w2[0] = g2 / Tx.max(g2, Tx.float32(EPS))
            W[t, 0] = w1[0]
            W[t, 1] = w2[0]
            SL[t, 0] = o1[0]
            SL[t, 1] = o2[0]

    return finalize


def _make_copy(T, E, d, C):
    vpr = d // VEC
    total = E * C * vpr

    @Tx.prim_func
    def copy(h_ptr: Tx.handle, src_ptr: Tx.handle, tot_ptr: Tx.handle, d_ptr: Tx.handle):
        H = Tx.match_buffer(h_ptr, (T, d), "bfloat16", align=16)
        SRC = Tx.match_buffer(src_ptr, (E * C,), "int32")
        TOT = Tx.match_buffer(tot_ptr, (2 * E,), "int32")
        D = Tx.match_buffer(d_ptr, (E * C, d), "bfloat16", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([(total + COPY_THREADS - 1) // COPY_THREADS])
        tx = Tx.thread_id([COPY_THREADS])
        frag = Tx.alloc_local((VEC,), "bfloat16")
        i: Tx.let = bx * COPY_THREADS + tx
        if i < total:
            row: Tx.let = i // vpr
            v: Tx.let = i % vpr
            e: Tx.let = row // C
            if row % C < TOT[e] + TOT[E + e]:
                src: Tx.let = SRC[row]
                for k in Tx.vectorized(VEC):
                    frag[k] = H[src, v * VEC + k]
            else:
                for k in Tx.vectorized(VEC):
                    frag[k] = Tx.cast(Tx.float32(0.0), "bfloat16")
            for k in Tx.vectorized(VEC):
                D[row, v * VEC + k] = frag[k]

    return copy


_EXES = {}


def _executables(T, E, d, C):
    key = (T, E, d, C)
    exes = _EXES.get(key)
    if exes is None:
        nch = (T + CHUNK - 1) // CHUNK
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        funcs = (_make_route(T, E, nch, min(8, E // 4)), _make_scan(E, nch), _make_finalize(T, E, nch, C),
                 _make_copy(T, E, d, C))
        exes = tuple(tvm.compile(f, target=target, tir_pipeline="tirx") for f in funcs)
        _EXES[key] = exes
    return exes


def solve(hidden_states, router_logits):
    """Return (dispatched [E, C, d] bf16, combine_weights [T, 2] fp32, expert_ids [T, 2] i64, slots [T, 2] i64)."""
    h = hidden_states.contiguous()
    logits = router_logits.contiguous().float()
    T, E = logits.shape
    d = h.shape[1]
    C = 2 * math.ceil(T / E)
    if E % 4 != 0 or 2 * E > THREADS or d % VEC != 0:
        raise ValueError("unsupported shape")
    dev = h.device
    nch = (T + CHUNK - 1) // CHUNK
    dispatched = torch.empty((E, C, d), dtype=h.dtype, device=dev)
    combine = torch.empty((T, 2), dtype=torch.float32, device=dev)
    expert_ids = torch.empty((T, 2), dtype=torch.int64, device=dev)
    slots = torch.empty((T, 2), dtype=torch.int64, device=dev)
    cnt = torch.empty((nch, 2 * E), dtype=torch.int32, device=dev)
    tot = torch.empty((2 * E,), dtype=torch.int32, device=dev)
    src = torch.empty((E * C,), dtype=torch.int32, device=dev)
    route, scan, finalize, copy = _executables(T, E, d, C)
    route(logits, expert_ids, slots, combine, cnt)
    scan(cnt, tot)
    finalize(expert_ids, slots, combine, cnt, tot, src)
    copy(h, src, tot, dispatched.view(E * C, d))
    return dispatched, combine, expert_ids, slots
