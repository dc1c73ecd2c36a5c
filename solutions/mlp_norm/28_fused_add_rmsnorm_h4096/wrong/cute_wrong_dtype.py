"""Wrong: a CuTe kernel computes h = x + residual, but the normalised output is returned in float32, not bf16.

Expected: wrong/structure
"""

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 8
THREADS = 256


@cute.kernel
def add_kernel(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    nvec = mA.shape[1] // VEC
    i = bidx * THREADS + tidx
    if i < mA.shape[0] * nvec:
        row = i // nvec
        col = i - row * nvec
        a = cute.local_tile(mA, (1, VEC), (row, col))[0, None].load().to(cutlass.Float32)
        b = cute.local_tile(mB, (1, VEC), (row, col))[0, None].load().to(cutlass.Float32)
        cute.local_tile(mC, (1, VEC), (row, col))[0, None].store((a + b).to(mC.element_type))


@cute.jit
def add(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream):
    total = mA.shape[0] * (mA.shape[1] // VEC)
    add_kernel(mA, mB, mC).launch(grid=[(total + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                  stream=stream)


_FNS = {}


def _compiled(n):
    if n not in _FNS:
        fake = make_fake_compact_tensor(cutlass.BFloat16, (cute.sym_int(), n), stride_order=(1, 0), assumed_align=16)
        _FNS[n] = cute.compile(add, fake, fake, fake, make_fake_stream(use_tvm_ffi_env_stream=True),
                               options="--enable-tvm-ffi")
    return _FNS[n]


def solve(x, residual, weight):
    h = torch.empty_like(x)
    _compiled(x.shape[1])(x, residual, h)
    hf = h.float()
    out = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out, h  # out stays float32: the reference returns bf16
