"""The CuTe floor through the older from_dlpack route: y = x + 1, one CTA, tensors converted on every call."""
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

N = 1024


@cute.kernel
def _plus_one_kernel(mX: cute.Tensor, mY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    mY[tidx] = mX[tidx] + cutlass.Float32(1.0)


@cute.jit
def _plus_one(mX: cute.Tensor, mY: cute.Tensor, stream: cuda.CUstream):
    _plus_one_kernel(mX, mY).launch(grid=[1, 1, 1], block=[N, 1, 1], stream=stream)


_FN = []


def solve(x):
    y = torch.empty_like(x)
    mx, my = from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    if not _FN:
        _FN.append(cute.compile(_plus_one, mx, my, stream))
    _FN[0](mx, my, stream)
    return y
