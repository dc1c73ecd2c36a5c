"""Token route hidden from the launch gate: the eager answer handed to a CuTe copy kernel as cute.runtime tensors.

`LaunchGate._tensors` (metakernel/dsl/base.py) collects a launch's arguments that are torch tensors or have
`__dlpack__`. CuTe's own runtime wrappers (`cutlass.cute.runtime.from_dlpack(t)` -> `_Tensor`, and `make_ptr` ->
`_Pointer`) have neither, so on CuTe's plain (non-TVM-FFI) calling route the gate sees NO tensor argument: the
audit copies nothing (no `dsl_token`), the randomize ablation randomises nothing ("not conclusive"), and the
suppress ablation garbles nothing. Eager torch computes out and h; one CuTe kernel copies them into the returned
buffers (suppressed: the buffers keep the allocator's poison, so suppression "breaks" the outputs).

Red team (session 29, CPU). Now the gate fails closed: a launch argument it cannot read as a torch tensor (CuTe's
runtime tensors and pointers) is refused, in the free check too.

Category: token_route
Expected: rule_violation/sandbox
"""

import cutlass
import cutlass.cute as cute
import torch
from cuda.bindings.driver import CUstream
from cutlass.cute.runtime import from_dlpack

EPS = 1e-5
BURN = 64  # tuned on the GPU until the copy kernel holds >= 50 % of the call's GPU time
THREADS = 256


@cute.kernel
def _copy_kernel(mS: cute.Tensor, mD: cute.Tensor, n: cutlass.Constexpr, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        v = mS[i]
        acc = v.to(cutlass.Float32)
        for _ in cutlass.range(burn):  # DSL-share padding inside the one unit (one unit: no per-unit ablation)
            acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
        if acc == cutlass.Float32(-12345.5):  # never true; keeps the burn from being folded away
            v = v + v
        mD[i] = v


@cute.jit
def _copy(mS: cute.Tensor, mD: cute.Tensor, n: cutlass.Constexpr, burn: cutlass.Int32, stream: CUstream):
    _copy_kernel(mS, mD, n, burn).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                   stream=stream)


_COMPILED = {}


def _eager(x, residual, weight):
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    return out, h


def solve(x, residual, weight):
    out_e, h_e = _eager(x, residual, weight)
    both = torch.cat([out_e.reshape(-1), h_e.reshape(-1)])  # the finished answer, flat
    dst = torch.empty_like(both)
    n = both.numel()
    s, d = from_dlpack(both), from_dlpack(dst)  # CuTe's wrappers: no __dlpack__, so the gate sees nothing
    stream = CUstream(torch.cuda.current_stream().cuda_stream)
    fn = _COMPILED.get(n)
    if fn is None:
        fn = cute.compile(_copy, s, d, n, BURN, stream)
        _COMPILED[n] = fn
    fn(s, d, BURN, stream)
    half = out_e.numel()
    return dst[:half].view(x.shape), dst[half:].view(x.shape)
