"""Problem 43 (backward through embedding lookup + RMSNorm: dense grad_table, grad_norm_weight), TIRx.

Deterministic, no atomics. Index prep in torch (16K ids): a stable sort of the token ids (`order`, `sorted_ids`)
and each vocabulary row's segment start seg[v] = #tokens with id < v (searchsorted). Three kernels:
K1, CTA b takes sorted positions [32 b, 32 b + 32): for position p (token order[p], row sorted_ids[p]) its threads
  (one 16-byte vector of 8 bf16 each: 256 threads at hidden 2048, 32 at small scale) load e = table[row], gn, gr,
  reduce sum(e^2) and sum(gn * w * e) together (warp xor-shuffles + one shared-memory exchange in which every thread
  adds the per-warp partials; a second barrier before the next position reuses the buffer), then
  r = rsqrt(sum(e^2)/d + eps), m = r * sum(gn*w*e)/d, d_e = gr + r * (gn*w - e*r*m) in fp32, stored to row p of an
  fp32 scratch in sorted order; the CTA's fp32 partial of sum(gn * e * r) goes to row b of a [CTAs, d] scratch.
K2, one CTA per vocabulary row v: adds the contiguous scratch rows seg[v] .. seg[v+1]-1 in fp32 (4 independent row
  loads per step), writes the row once as bf16 (zeros where no token refers to v: the dense gradient is written
  exactly once, no memset). Frequent low ids have the longest segments and the lowest block indices.
K3, grad_norm_weight: fixed-order column sum of K1's partials (32 warps x 32 columns per CTA), rounded to bf16.
Hidden size is a compile-time constant (token, vocabulary and CTA counts symbolic; vocab * d < 2^31 assumed for
int32 indexing, true at both scales).
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
VEC = 8  # bf16 lanes per 16-byte access
MAX_THREADS = 512
ROWS_PER_CTA = 32
RED_WARPS = 32
UNROLL = 4


def _layout(n):
    vectors = n // VEC
    tpb = max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))
    return vectors, tpb, (vectors + tpb - 1) // tpb, tpb // 32


def _make_token_kernel(n):
    vectors, tpb, nv, nw = _layout(n)

    @Tx.prim_func
    def token_grad(order_ptr: Tx.handle, sorted_ptr: Tx.handle, e_ptr: Tx.handle, w_ptr: Tx.handle,
                   gn_ptr: Tx.handle, gr_ptr: Tx.handle, de_ptr: Tx.handle, p_ptr: Tx.handle):
        T = Tx.int32()
        V = Tx.int32()
        P = Tx.int32()
        ORDER = Tx.match_buffer(order_ptr, (T,), "int64")
        SORTED = Tx.match_buffer(sorted_ptr, (T,), "int64")
        E = Tx.match_buffer(e_ptr, (V, n), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (n,), "bfloat16", align=16)
        GN = Tx.match_buffer(gn_ptr, (T, n), "bfloat16", align=16)
        GR = Tx.match_buffer(gr_ptr, (T, n), "bfloat16", align=16)
        DE = Tx.match_buffer(de_ptr, (T, n), "float32", align=16)
        PART = Tx.match_buffer(p_ptr, (P, n), "float32", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([P])
        tx = Tx.thread_id([tpb])
        wv = Tx.alloc_local((VEC,), "bfloat16")
        ev = Tx.alloc_local((VEC,), "bfloat16")
        gnv = Tx.alloc_local((VEC,), "bfloat16")
        grv = Tx.alloc_local((VEC,), "bfloat16")
        dv = Tx.alloc_local((VEC,), "float32")
        wf = Tx.alloc_local((nv * VEC,), "float32")
        ef = Tx.alloc_local((nv * VEC,), "float32")
        gnf = Tx.alloc_local((nv * VEC,), "float32")
        grf = Tx.alloc_local((nv * VEC,), "float32")
        acc = Tx.alloc_local((nv * VEC,), "float32")
        red = Tx.alloc_shared((2 * nw,), "float32")
        for c in Tx.unroll(nv):
            for v in Tx.unroll(VEC):
                wf[c * VEC + v] = Tx.float32(0.0)
                acc[c * VEC + v] = Tx.float32(0.0)
            if c * tpb + tx < vectors:
                for v in Tx.vectorized(VEC):
                    wv[v] = W[(c * tpb + tx) * VEC + v]
                for v in Tx.unroll(VEC):
                    wf[c * VEC + v] = Tx.cast(wv[v], "float32")
        for k in range(ROWS_PER_CTA):
            p: Tx.let = bx * ROWS_PER_CTA + k
            if p < T:  # uniform over the CTA
                tok: Tx.let = Tx.cast(ORDER[p], "int32")
                row: Tx.let = Tx.cast(SORTED[p], "int32")
                s_ee: Tx.float32 = 0.0
                s_ge: Tx.float32 = 0.0
                for c in Tx.unroll(nv):
                    for v in Tx.unroll(VEC):
                        ef[c * VEC + v] = Tx.float32(0.0)
                        gnf[c * VEC + v] = Tx.float32(0.0)
                        grf[c * VEC + v] = Tx.float32(0.0)
                    if c * tpb + tx < vectors:
                        col: Tx.let = (c * tpb + tx) * VEC
                        for v in Tx.vectorized(VEC):
                            ev[v] = E[row, col + v]
                        for v in Tx.vectorized(VEC):
                            gnv[v] = GN[tok, col + v]
                        for v in Tx.vectorized(VEC):
                            grv[v] = GR[tok, col + v]
                        for v in Tx.unroll(VEC):
                            ef[c * VEC + v] = Tx.cast(ev[v], "float32")
                            gnf[c * VEC + v] = Tx.cast(gnv[v], "float32")
                            grf[c * VEC + v] = Tx.cast(grv[v], "float32")
                    for v in Tx.unroll(VEC):
                        s_ee = s_ee + ef[c * VEC + v] * ef[c * VEC + v]
                        s_ge = s_ge + gnf[c * VEC + v] * wf[c * VEC + v] * ef[c * VEC + v]
                for s in Tx.unroll(5):  # xor 16, 8, 4, 2, 1
                    s_ee = s_ee + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, s_ee, 16 >> s, 32, 32)
                    s_ge = s_ge + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, s_ge, 16 >> s, 32, 32)
                if tx % 32 == 0:
                    red[tx // 32] = s_ee
                    red[nw + tx // 32] = s_ge
                Tx.cuda.cta_sync()
                t_ee: Tx.float32 = 0.0
                t_ge: Tx.float32 = 0.0
                for q in Tx.unroll(nw):
                    t_ee = t_ee + red[q]
                    t_ge = t_ge + red[nw + q]
                Tx.cuda.cta_sync()  # all reads done before the next position overwrites `red`
                rr: Tx.float32 = Tx.rsqrt(t_ee / Tx.float32(n) + Tx.float32(EPS))
                m: Tx.float32 = rr * t_ge / Tx.float32(n)
                for c in Tx.unroll(nv):
                    if c * tpb + tx < vectors:
                        for v in Tx.unroll(VEC):
                            ehat: Tx.float32 = ef[c * VEC + v] * rr
                            gw: Tx.float32 = gnf[c * VEC + v] * wf[c * VEC + v]
                            dv[v] = grf[c * VEC + v] + rr * (gw - ehat * m)
                            acc[c * VEC + v] = acc[c * VEC + v] + gnf[c * VEC + v] * ehat
                        for v in Tx.vectorized(VEC):
                            DE[p, (c * tpb + tx) * VEC + v] = dv[v]
        for c in Tx.unroll(nv):
            if c * tpb + tx < vectors:
                for v in Tx.vectorized(VEC):
                    PART[bx, (c * tpb + tx) * VEC + v] = acc[c * VEC + v]

    return token_grad


def _make_table_kernel(n):
    vectors, tpb, nv, _ = _layout(n)

    @Tx.prim_func
    def table_grad(seg_ptr: Tx.handle, de_ptr: Tx.handle, gt_ptr: Tx.handle):
        T = Tx.int32()
        V = Tx.int32()
        S = Tx.int32()  # V + 1 segment bounds (its own variable: no shape expression to bind)
        SEG = Tx.match_buffer(seg_ptr, (S,), "int32")
        DE = Tx.match_buffer(de_ptr, (T, n), "float32", align=16)
        GT = Tx.match_buffer(gt_ptr, (V, n), "bfloat16", align=16)
        Tx.device_entry()
        vr = Tx.cta_id([V])
        tx = Tx.thread_id([tpb])
        dv = Tx.alloc_local((UNROLL * nv * VEC,), "float32")
        acc = Tx.alloc_local((nv * VEC,), "float32")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        start: Tx.let = SEG[vr]
        count: Tx.let = SEG[vr + 1] - SEG[vr]
        for i in Tx.unroll(nv * VEC):
            acc[i] = Tx.float32(0.0)
        for g in range(count // UNROLL):
            for u in Tx.unroll(UNROLL):
                for c in Tx.unroll(nv):
                    if c * tpb + tx < vectors:
                        for v in Tx.vectorized(VEC):
                            dv[(u * nv + c) * VEC + v] = DE[start + g * UNROLL + u, (c * tpb + tx) * VEC + v]
            for u in Tx.unroll(UNROLL):
                for i in Tx.unroll(nv * VEC):
                    acc[i] = acc[i] + dv[u * nv * VEC + i]
        for q in range(count % UNROLL):
            for c in Tx.unroll(nv):
                if c * tpb + tx < vectors:
                    for v in Tx.vectorized(VEC):
                        dv[c * VEC + v] = DE[start + count // UNROLL * UNROLL + q, (c * tpb + tx) * VEC + v]
            for i in Tx.unroll(nv * VEC):
                acc[i] = acc[i] + dv[i]
        for c in Tx.unroll(nv):
            if c * tpb + tx < vectors:
                for v in Tx.unroll(VEC):
                    ov[v] = Tx.cast(acc[c * VEC + v], "bfloat16")
                for v in Tx.vectorized(VEC):
                    GT[vr, (c * tpb + tx) * VEC + v] = ov[v]

    return table_grad


def _make_colsum_kernel(n):
    @Tx.prim_func
    def column_sum(p_ptr: Tx.handle, g_ptr: Tx.handle):
        P = Tx.int32()
        PART = Tx.match_buffer(p_ptr, (P, n), "float32", align=16)
        GW = Tx.match_buffer(g_ptr, (n,), "bfloat16", align=16)
        Tx.device_entry()
        bx = Tx.cta_id([(n + 31) // 32])
        tx = Tx.thread_id([32 * RED_WARPS])
        red = Tx.alloc_shared((RED_WARPS * 32,), "float32")
        col: Tx.let = bx * 32 + tx % 32
        acc: Tx.float32 = 0.0
        if col < n:
            for p in range((P + RED_WARPS - 1) // RED_WARPS):
                if p * RED_WARPS + tx // 32 < P:
                    acc = acc + PART[p * RED_WARPS + tx // 32, col]
        red[tx] = acc
        Tx.cuda.cta_sync()
        if tx < 32:
            total: Tx.float32 = 0.0
            for q in Tx.unroll(RED_WARPS):
                total = total + red[q * 32 + tx]
            if col < n:
                GW[col] = Tx.cast(total, "bfloat16")

    return column_sum


_EXES = {}


def _executables(n):
    exes = _EXES.get(n)
    if exes is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exes = tuple(tvm.compile(make(n), target=target, tir_pipeline="tirx")
                     for make in (_make_token_kernel, _make_table_kernel, _make_colsum_kernel))
        _EXES[n] = exes
    return exes


def solve(input_ids, embed_table, norm_weight, grad_normed, grad_residual):
    """Return (grad_table [V, d] bf16, grad_norm_weight [d] bf16)."""
    vocab, d = embed_table.shape
    if d % VEC != 0:
        raise ValueError(f"hidden size {d} must be a multiple of {VEC}")
    ids = input_ids.reshape(-1)
    tokens = ids.numel()
    gn = grad_normed.reshape(-1, d).contiguous()
    gr = grad_residual.reshape(-1, d).contiguous()
    # index prep (glue): stable sort of the ids and each vocabulary row's segment of the sorted order
    sorted_ids, order = torch.sort(ids, stable=True)
    seg = torch.searchsorted(sorted_ids, torch.arange(vocab + 1, device=ids.device), out_int32=True)
    parts = (tokens + ROWS_PER_CTA - 1) // ROWS_PER_CTA
    d_e = torch.empty(tokens, d, dtype=torch.float32, device=ids.device)
    partial = torch.empty(parts, d, dtype=torch.float32, device=ids.device)
    grad_table = torch.empty_like(embed_table)
    grad_weight = torch.empty(d, dtype=embed_table.dtype, device=ids.device)
    token_exe, table_exe, colsum_exe = _executables(d)
    token_exe(order, sorted_ids.contiguous(), embed_table.contiguous(), norm_weight.contiguous(), gn, gr, d_e,
              partial)
    table_exe(seg, d_e, grad_table)
    colsum_exe(partial, grad_weight)
    return grad_table, grad_weight
