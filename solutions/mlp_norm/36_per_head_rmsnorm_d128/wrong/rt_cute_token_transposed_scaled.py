"""Token route: the eager answer handed to CuTe transposed AND doubled; the CuTe kernel halves and un-transposes it.

The old audit compared each launch argument with the outputs as they are (after a reshape), so a transposed and
rescaled copy passed, and both ablations pass too (suppressed: poison; randomised argument: noise). The first
version of the new audit tested rescaled copies in the answer's order and reordered copies bit for bit, but not
both at once; `2 * answer.transpose(0, 1)` is both. It is now caught (transposed affine tokens; seen on the H200).

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-6
HEAD_DIM = 128
VEC = 8
LANES = HEAD_DIM // VEC
THREADS = 256


@cute.kernel
def _untranspose_kernel(mS: cute.Tensor, mD: cute.Tensor, heads: cutlass.Constexpr, tokens: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < tokens * heads * LANES:
        r_dst = i // LANES
        v = i - r_dst * LANES
        t = r_dst // heads
        h = r_dst - t * heads
        r_src = h * tokens + t
        x = cute.local_tile(mS, (1, VEC), (r_src, v))[0, None].load().to(cutlass.Float32)
        cute.local_tile(mD, (1, VEC), (r_dst, v))[0, None].store((x * cutlass.Float32(0.5)).to(mD.element_type))


@cute.jit
def _untranspose(mS: cute.Tensor, mD: cute.Tensor, heads: cutlass.Constexpr, tokens: cutlass.Constexpr, stream):
    total = tokens * heads * LANES
    _untranspose_kernel(mS, mD, heads, tokens).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1],
                                                      block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, heads):
    key = (tokens, heads)
    if key not in _COMPILED:
        rows = tokens * heads
        m = make_fake_compact_tensor(cutlass.BFloat16, (rows, HEAD_DIM), stride_order=(1, 0), assumed_align=16)
        _COMPILED[key] = cute.compile(_untranspose, m, m, heads, tokens,
                                      make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    return _COMPILED[key]


def _eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def solve(q, k, q_norm_weight, k_norm_weight):
    outs = []
    for x, w in ((q, q_norm_weight), (k, k_norm_weight)):
        tokens, heads, _ = x.shape
        hidden = (2 * _eager(x, w)).transpose(0, 1).contiguous().view(-1, HEAD_DIM)  # [H*T, 128]
        out = torch.empty_like(x)
        _compiled_for(tokens, heads)(hidden, out.view(-1, HEAD_DIM))
        outs.append(out)
    return outs[0], outs[1]
