"""Wrong: the CuTe gold gated-DeltaNet decode step with the decay applied after the delta update, not before.

The gated delta rule decays the old state first and then corrects it: S <- exp(g) S; u = beta (v - S^T k);
S <- S + k u^T. This kernel loads the state column undecayed, computes the delta u = beta (v - S_old^T k) against the
undecayed state and multiplies the updated state by exp(g) at the end: S <- exp(g) (S_old + k u^T). Both the
returned o and the written-back state differ wherever exp(g) is not ~1 (g in about [-1.6, 0) here).

Expected: wrong/mismatch
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

DK = 128  # key head dim (fact of the problem)
DV = 128  # value head dim (fact of the problem); one thread per value column
NACC = 4  # interleaved partial sums for the length-128 dot products


@cute.jit
def _warp_sum(value):
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    return value


@cute.kernel
def _gdn_decode_kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                       mAlog: cute.Tensor, mDt: cute.Tensor, mPool: cute.Tensor, mIdx: cute.Tensor,
                       mO: cute.Tensor, rep: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    h, r, _ = cute.arch.block_idx()
    hk = h // rep
    lane = tidx % 32

    smem = cutlass.memory.SmemAllocator()
    sQn = smem.allocate_tensor(cutlass.Float32, cute.make_layout(DK))
    sKn = smem.allocate_tensor(cutlass.Float32, cute.make_layout(DK))

    # gate scalars in fp64, rounded once to fp32
    x = mA[r, h].to(cutlass.Float64) + mDt[h].to(cutlass.Float64)
    softplus = cute.math.max(x, cutlass.Float64(0.0)) + cute.math.log1p(cute.math.exp(-cute.math.abs(x)))
    g = -cute.math.exp(mAlog[h].to(cutlass.Float64)) * softplus
    decay = cute.math.exp(g).to(cutlass.Float32)
    beta = (cutlass.Float64(1.0) / (cutlass.Float64(1.0) + cute.math.exp(-mB[r, h].to(cutlass.Float64)))
            ).to(cutlass.Float32)
    vv = mV[r, h, tidx].to(cutlass.Float32)
    slot = mIdx[r]

    # this thread's state column in registers (loads issued before the norm work)
    rS = cute.make_rmem_tensor(cute.make_layout(DK), cutlass.Float32)
    for i in cutlass.range_constexpr(DK):
        rS[i] = mPool[slot, h, i, tidx]

    # L2 norms of q and k: every warp computes both (lane holds elements lane + 32 j), fp64 sums of the exact
    # squares of bf16 values, butterfly-reduced; thread tid then normalises element tid, rounded once to fp32.
    ssq_q = cutlass.Float64(0.0)
    ssq_k = cutlass.Float64(0.0)
    for j in cutlass.range_constexpr(DK // 32):
        qj = mQ[r, hk, lane + 32 * j].to(cutlass.Float64)
        kj = mK[r, hk, lane + 32 * j].to(cutlass.Float64)
        ssq_q = ssq_q + qj * qj
        ssq_k = ssq_k + kj * kj
    ssq_q = _warp_sum(ssq_q)
    ssq_k = _warp_sum(ssq_k)
    inv_q = cutlass.Float64(DK ** -0.5) / cute.math.sqrt(ssq_q + cutlass.Float64(1e-6))
    inv_k = cutlass.Float64(1.0) / cute.math.sqrt(ssq_k + cutlass.Float64(1e-6))
    sQn[tidx] = (mQ[r, hk, tidx].to(cutlass.Float64) * inv_q).to(cutlass.Float32)
    sKn[tidx] = (mK[r, hk, tidx].to(cutlass.Float64) * inv_k).to(cutlass.Float32)
    cute.arch.sync_threads()

    acc = cute.make_rmem_tensor(cute.make_layout(NACC), cutlass.Float32)
    acc.fill(0.0)
    for i in cutlass.range_constexpr(DK):
        acc[i % NACC] = acc[i % NACC] + sKn[i] * rS[i]
    ks = (acc[0] + acc[1]) + (acc[2] + acc[3])
    u = beta * (vv - ks)

    acc.fill(0.0)
    for i in cutlass.range_constexpr(DK):
        s = (rS[i] + sKn[i] * u) * decay
        acc[i % NACC] = acc[i % NACC] + sQn[i] * s
        mPool[slot, h, i, tidx] = s
    o = (acc[0] + acc[1]) + (acc[2] + acc[3])
    mO[r, h, tidx] = o.to(mO.element_type)


@cute.jit
def _gdn_decode(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                mAlog: cute.Tensor, mDt: cute.Tensor, mPool: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor,
                stream):
    batch = mV.shape[0]
    hv = mV.shape[1]
    rep = mV.shape[1] // mK.shape[1]
    _gdn_decode_kernel(mQ, mK, mV, mA, mB, mAlog, mDt, mPool, mIdx, mO, rep).launch(
        grid=[hv, batch, 1], block=[DV, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(batch, hk, hv, slots):
    key = (batch, hk, hv, slots)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32

        def fake(dtype, shape):
            return make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                            assumed_align=16)

        fn = cute.compile(
            _gdn_decode,
            fake(bf16, (batch, hk, DK)), fake(bf16, (batch, hk, DK)), fake(bf16, (batch, hv, DV)),
            make_fake_compact_tensor(bf16, (batch, hv), stride_order=(1, 0), assumed_align=4),
            make_fake_compact_tensor(bf16, (batch, hv), stride_order=(1, 0), assumed_align=4),
            make_fake_compact_tensor(f32, (hv,), assumed_align=4),
            make_fake_compact_tensor(f32, (hv,), assumed_align=4),
            fake(f32, (slots, hv, DK, DV)),
            make_fake_compact_tensor(cutlass.Int32, (batch,), assumed_align=4),
            fake(bf16, (batch, hv, DV)),
            make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices):
    """Return o [B, HV, 128] (bf16); state_pool [slots, HV, 128, 128] fp32 is updated in place."""
    batch, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    slots = state_pool.shape[0]
    if dk != DK or dv != DV or hv % hk != 0 or not state_pool.is_contiguous():
        raise ValueError("expected K = V = 128, HV a multiple of HK and a contiguous state pool")
    o = torch.empty_like(v)
    if batch == 0:
        return o
    _compiled_for(batch, hk, hv, slots)(q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(),
                                        b.contiguous(), A_log.contiguous(), dt_bias.contiguous(), state_pool,
                                        state_indices.contiguous(), o)
    return o
