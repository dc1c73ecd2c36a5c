"""GQA paged decode attention (one query token per request), CuTe DSL: one CTA per (kv head, request).

Problem 02 (64 query heads, 8 kv heads, 16-token pages): the same kernel as problem 01, shape-generic.

Works for any page size, any query-heads-per-kv-head group G (4 in problem 01, 8 in problem 02) and head_dim 128.

CTA = 256 threads = 16 "workers" of 16 lanes. A worker handles one token at a time; each of its lanes owns 8
contiguous dims (one 16-byte bf16 vector) of the token's K and V row, so a worker reads a whole 256-byte row.
Worker w takes tokens w, w + 16, w + 32, ... (2 tokens per loop trip, all loads of a trip issued before use).
For each token and each of the G query heads of this kv head: a partial dot over the lane's 8 dims, a 4-step
butterfly over the 16 lanes (every lane then holds the full logit), then the online-softmax update in fp32
(running max m, running sum l, accumulator acc[8] per lane), all in base 2 (q is pre-scaled by log2(e)/sqrt(D)).
Tokens past seq_len (loop tail) read a valid token (clamped index) and get probability 0.
At the end the two workers of a warp merge through shuffles, the 8 warps merge through shared memory
(G * 128 fp32 per warp: 16 KB for G = 4, 32 KB for G = 8), and each thread writes G*128/256 contiguous outputs,
rounded to bf16 once.

Compiled once per shape from fake tensors (TVM-FFI route, torch's current stream).
"""

import math

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

HEAD_DIM = 128
VEC = 8  # bf16 per 16-byte vector = dims per lane
LANES = HEAD_DIM // VEC  # 16 lanes per worker
THREADS = 256
WARPS = THREADS // 32
WORKERS = THREADS // LANES  # 16
UNROLL = 2  # tokens per worker per loop trip
M_INIT = -1.0e30  # running max before any token (finite: exp2(M_INIT - x) = 0, never NaN)
S_MASKED = -1.0e38  # logit of a masked token: exp2(S_MASKED - m) = 0 for any m >= M_INIT


@cute.kernel
def _decode_kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBT: cute.Tensor, mLen: cute.Tensor,
                   mO: cute.Tensor, G: cutlass.Constexpr, KVH: cutlass.Constexpr, PS: cutlass.Constexpr,
                   qscale: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    kvh, b, _ = cute.arch.block_idx()
    warp = tidx // 32
    lane = tidx % 32
    worker = tidx // LANES
    sub = tidx % LANES  # which 8-dim slice of the head
    H = KVH * G
    seq_len = mLen[b]
    qrow0 = b * H + kvh * G  # first query head of this group, as a row of the (B*H, D) views

    rQ = cute.make_rmem_tensor(cute.make_layout((G, VEC), stride=(VEC, 1)), cutlass.Float32)
    rAcc = cute.make_rmem_tensor(cute.make_layout((G, VEC), stride=(VEC, 1)), cutlass.Float32)
    rM = cute.make_rmem_tensor(cute.make_layout(G), cutlass.Float32)
    rL = cute.make_rmem_tensor(cute.make_layout(G), cutlass.Float32)
    rK = cute.make_rmem_tensor(cute.make_layout((UNROLL, VEC), stride=(VEC, 1)), mK.element_type)
    rV = cute.make_rmem_tensor(cute.make_layout((UNROLL, VEC), stride=(VEC, 1)), mV.element_type)
    rAcc.fill(0.0)
    rL.fill(0.0)
    rM.fill(M_INIT)
    for g in cutlass.range_constexpr(G):
        qv = cute.local_tile(mQ, (1, VEC), (qrow0 + g, sub))[0, None].load().to(cutlass.Float32)
        rQ[g, None].store(qv * qscale)

    n_iter = (seq_len + WORKERS * UNROLL - 1) // (WORKERS * UNROLL)
    for it in cutlass.range(n_iter, unroll=1):
        # issue every load of this trip first
        for u in cutlass.range_constexpr(UNROLL):
            j = (it * UNROLL + u) * WORKERS + worker
            jc = cutlass.min(j, seq_len - 1)  # a real token of this request (its data is ignored when j >= len)
            page = mBT[b, jc // PS]
            row = (page * PS + jc % PS) * KVH + kvh
            rK[u, None].store(cute.local_tile(mK, (1, VEC), (row, sub))[0, None].load())
            rV[u, None].store(cute.local_tile(mV, (1, VEC), (row, sub))[0, None].load())
        for u in cutlass.range_constexpr(UNROLL):
            j = (it * UNROLL + u) * WORKERS + worker
            kf = rK[u, None].load().to(cutlass.Float32)
            vf = rV[u, None].load().to(cutlass.Float32)
            for g in cutlass.range_constexpr(G):
                s = (rQ[g, None].load() * kf).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0),
                                                     reduction_profile=0)
                for k in cutlass.range_constexpr(4):  # lanes 8, 4, 2, 1 apart: stays inside the 16-lane worker
                    s = s + cute.arch.shuffle_sync_bfly(s, offset=8 >> k)
                if j >= seq_len:
                    s = cutlass.Float32(S_MASKED)
                m_old = rM[g]
                m_new = cute.arch.fmax(m_old, s)
                corr = cute.math.exp2(m_old - m_new, fastmath=True)
                p = cute.math.exp2(s - m_new, fastmath=True)
                rM[g] = m_new
                rL[g] = rL[g] * corr + p
                rAcc[g, None].store(rAcc[g, None].load() * corr + vf * p)

    # merge the two workers of each warp (lanes l and l ^ 16 own the same dims)
    for g in cutlass.range_constexpr(G):
        m_a = rM[g]
        m_b = cute.arch.shuffle_sync_bfly(m_a, offset=16)
        l_b = cute.arch.shuffle_sync_bfly(rL[g], offset=16)
        m_x = cute.arch.fmax(m_a, m_b)
        c_a = cute.math.exp2(m_a - m_x, fastmath=True)
        c_b = cute.math.exp2(m_b - m_x, fastmath=True)
        rL[g] = rL[g] * c_a + l_b * c_b
        rM[g] = m_x
        for i in cutlass.range_constexpr(VEC):
            a_i = rAcc[g, i]
            b_i = cute.arch.shuffle_sync_bfly(a_i, offset=16)
            rAcc[g, i] = a_i * c_a + b_i * c_b

    smem = cutlass.memory.SmemAllocator()
    sAcc = smem.allocate_tensor(cutlass.Float32, cute.make_layout((WARPS, G, HEAD_DIM),
                                                                  stride=(G * HEAD_DIM, HEAD_DIM, 1)), 16)
    sM = smem.allocate_tensor(cutlass.Float32, cute.make_layout((WARPS, G), stride=(G, 1)), 16)
    sL = smem.allocate_tensor(cutlass.Float32, cute.make_layout((WARPS, G), stride=(G, 1)), 16)
    if lane < LANES:
        for g in cutlass.range_constexpr(G):
            for i in cutlass.range_constexpr(VEC):
                sAcc[warp, g, sub * VEC + i] = rAcc[g, i]
            if sub == 0:
                sM[warp, g] = rM[g]
                sL[warp, g] = rL[g]
    cute.arch.sync_threads()

    # each thread finishes EPT contiguous outputs of one query head
    EPT = G * HEAD_DIM // THREADS
    e0 = tidx * EPT
    g_out = e0 // HEAD_DIM
    d0 = e0 % HEAD_DIM
    m_all = cutlass.Float32(M_INIT)
    for w in cutlass.range_constexpr(WARPS):
        m_all = cute.arch.fmax(m_all, sM[w, g_out])
    den = cutlass.Float32(0.0)
    rOut = cute.make_rmem_tensor(cute.make_layout(EPT), cutlass.Float32)
    rOut.fill(0.0)
    for w in cutlass.range_constexpr(WARPS):
        c = cute.math.exp2(sM[w, g_out] - m_all, fastmath=True)
        den = den + sL[w, g_out] * c
        for i in cutlass.range_constexpr(EPT):
            rOut[i] = rOut[i] + sAcc[w, g_out, d0 + i] * c
    inv = 1.0 / den
    gO = cute.local_tile(mO, (1, EPT), (qrow0 + g_out, d0 // EPT))[0, None]
    gO.store((rOut.load() * inv).to(mO.element_type))


@cute.jit
def _decode(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBT: cute.Tensor, mLen: cute.Tensor,
            mO: cute.Tensor, G: cutlass.Constexpr, KVH: cutlass.Constexpr, PS: cutlass.Constexpr,
            qscale: cutlass.Constexpr, stream):
    B = mBT.shape[0]
    _decode_kernel(mQ, mK, mV, mBT, mLen, mO, G, KVH, PS, qscale).launch(
        grid=[KVH, B, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(B, H, P, PS, KVH, MB):
    key = (B, H, P, PS, KVH, MB)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        G = H // KVH
        qscale = math.log2(math.e) / math.sqrt(HEAD_DIM)
        q = make_fake_compact_tensor(bf16, (B * H, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        k = make_fake_compact_tensor(bf16, (P * PS * KVH, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        v = make_fake_compact_tensor(bf16, (P * PS * KVH, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        bt = make_fake_compact_tensor(cutlass.Int32, (B, MB), stride_order=(1, 0), assumed_align=4)
        lens = make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4)
        o = make_fake_compact_tensor(bf16, (B * H, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        fn = cute.compile(_decode, q, k, v, bt, lens, o, G, KVH, PS, qscale,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


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
    _compiled_for(B, H, P, PS, KVH, MB)(q2, k2, v2, block_table.contiguous(), seq_lens.contiguous(), out)
    return out.view(B, H, D)
