"""Problem 41, QKV split + Gemma per-head RMSNorm (scale 1 + w, head_dim 256) of q and k, in CuTe DSL.

One kernel. One warp per head vector: each of the 32 lanes loads one 128-bit vector (8 bf16) of the head straight
from the fused qkv row, sums its squares in fp32, and a 5-step butterfly shuffle gives every lane the head's sum of
squares; out = x * rsqrt(sum / 256 + eps) * (1 + w) in fp32, rounded once to bf16, stored as one 128-bit vector.
Work item u = t * (Hq + Hk) + h enumerates the q and k heads of every token (v is never read): head h < Hq reads
qkv columns [256 h, 256 h + 256) and writes q[t, h] with q_norm_weight; h >= Hq reads the same column formula (the k
heads follow the q heads) and writes k[t, h - Hq] with k_norm_weight. The branch is uniform per warp. A CTA of 256
threads takes 8 work items; items past the end load zeros and store nothing. All sizes are compile-time constants
(one compile per shape, TVM-FFI, torch's current stream).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-6
HEAD_DIM = 256
VEC = 8  # bf16 elements per 128-bit access
THREADS = 256
HEADS_PER_CTA = THREADS // 32  # one warp per head vector


@cute.kernel
def _qk_norm_kernel(mQKV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
                    hq: cutlass.Constexpr, hk: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = mQKV.shape[0]
    lane = tidx % 32
    item = bidx * HEADS_PER_CTA + tidx // 32
    t = item // (hq + hk)
    h = item - t * (hq + hk)
    valid = t < tokens

    rX = cute.make_rmem_tensor(cute.make_layout(VEC), mQKV.element_type)
    rW = cute.make_rmem_tensor(cute.make_layout(VEC), mQW.element_type)
    rX.fill(0)
    rW.fill(0)
    if valid:
        cute.autovec_copy(cute.local_tile(mQKV, (1, VEC), (t, h * (HEAD_DIM // VEC) + lane))[0, None], rX)
        if h < hq:
            cute.autovec_copy(cute.local_tile(mQW, (VEC,), (lane,)), rW)
        else:
            cute.autovec_copy(cute.local_tile(mKW, (VEC,), (lane,)), rW)

    x = rX.load().to(cutlass.Float32)
    ss = (x * x).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart: the whole warp is one head
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> k)
    inv_rms = cute.math.rsqrt(ss / HEAD_DIM + EPS)

    rOut = cute.make_rmem_tensor(cute.make_layout(VEC), mQ.element_type)
    rOut.store((x * inv_rms * (1.0 + rW.load().to(cutlass.Float32))).to(mQ.element_type))
    if valid:
        if h < hq:
            cute.autovec_copy(rOut, cute.local_tile(mQ, (1, VEC), (t * hq + h, lane))[0, None])
        else:
            cute.autovec_copy(rOut, cute.local_tile(mK, (1, VEC), (t * hk + h - hq, lane))[0, None])


@cute.jit
def _qk_norm(mQKV: cute.Tensor, mQW: cute.Tensor, mKW: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor, stream,
             hq: cutlass.Constexpr, hk: cutlass.Constexpr):
    items = mQKV.shape[0] * (hq + hk)
    _qk_norm_kernel(mQKV, mQW, mKW, mQ, mK, hq, hk).launch(
        grid=[(items + HEADS_PER_CTA - 1) // HEADS_PER_CTA, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, width, hq, hk):
    key = (tokens, width)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16
        qkv = make_fake_compact_tensor(bf16, (tokens, width), stride_order=(1, 0), assumed_align=16)
        q = make_fake_compact_tensor(bf16, (tokens * hq, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        k = make_fake_compact_tensor(bf16, (tokens * hk, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        w = make_fake_compact_tensor(bf16, (HEAD_DIM,), assumed_align=16)
        fn = cute.compile(_qk_norm, qkv, w, w, q, k, make_fake_stream(use_tvm_ffi_env_stream=True), hq, hk,
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(qkv, q_norm_weight, k_norm_weight):
    """Return (q [T, Hq, 256], k [T, Hk, 256]) bf16, each head Gemma-RMS-normalised."""
    tokens, width = qkv.shape
    hk = width // HEAD_DIM // 4  # (Hq + 2 Hk) heads with Hq = 2 Hk
    hq = 2 * hk
    qkv = qkv.contiguous()
    q = torch.empty(tokens, hq, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, hk, HEAD_DIM, dtype=qkv.dtype, device=qkv.device)
    if tokens > 0:
        _compiled_for(tokens, width, hq, hk)(qkv, q_norm_weight.contiguous(), k_norm_weight.contiguous(),
                                             q.view(tokens * hq, HEAD_DIM), k.view(tokens * hk, HEAD_DIM))
    return q, k
