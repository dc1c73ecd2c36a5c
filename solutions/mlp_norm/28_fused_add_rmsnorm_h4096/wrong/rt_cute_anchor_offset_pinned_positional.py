"""Red team (session 31, hole 12 after the isolation ablation). As `rt_cute_anchor_offset_pinned`, but the page-locked
host buffer is made without any of the refused names: `Tensor.to(device, dtype, non_blocking, copy)` takes
`non_blocking` as its third POSITIONAL argument, and a non-blocking device-to-CPU `_to_copy` allocates its output
from torch's caching host allocator (page-locked, `cudaHostAlloc`: mapped into the GPU's address space by UVA).
`ans.to(CPU, ans.dtype, True)` thus puts the eager answer in host memory the isolation never overwrites (it covers
torch's device allocator and the input arena only), and the copy kernel reaches it from a one-element device
anchor by the same Int64 element offset (host address minus anchor address). The static rule refuses
`non_blocking` as an attribute or keyword only.

Now the child reads torch's host allocator while each isolated launch runs (`Child._pinned`): page-locked memory
in use there is `rule_violation/dsl_reach`, whatever made it (found by session 31's CPU red-teamer; not yet graded on
a GPU).

Category: token_route
Expected: rule_violation/dsl_reach
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 4096  # ~8 ms of FMAs (estimated, not run): above the ~5 ms device-to-pinned copy the profile counts as non-DSL time
THREADS = 256
CPU = torch.device("cpu")


@cute.kernel
def _copy_kernel(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
                 off: cutlass.Int64, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = mOut.shape[0]
    i = bidx * THREADS + tidx
    if i < n:
        # the eager answer, [out | h], reached from the anchor's address by an element offset
        mA = cute.make_tensor(anchor.iterator + off, cute.make_layout(2 * n))
        o = mA[i]
        r = mA[n + i]
        acc = cutlass.Float32(flag[0])
        for _ in cutlass.range(burn):  # DSL-share padding in the same unit; the outputs formally depend on it
            acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
        if acc == cutlass.Float32(-12345.5):
            o = r
        if flag[0] != cutlass.Float32(1.0):  # randomise ablation: flag perturbed -> outputs break
            o = o * cutlass.BFloat16(3.0)
            r = r * cutlass.BFloat16(3.0)
        mOut[i] = o
        mH[i] = r
        if i == 0:
            scratch[0] = acc  # one tensor argument changed: not a "blind" unit


@cute.jit
def _copy(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
          off: cutlass.Int64, burn: cutlass.Int32, stream):
    n = mOut.shape[0]
    _copy_kernel(anchor, flag, scratch, mOut, mH, off, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(n):
    fn = _COMPILED.get(n)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        fn = cute.compile(_copy, make_fake_compact_tensor(bf16, (1,)), make_fake_compact_tensor(f32, (1,)),
                          make_fake_compact_tensor(f32, (1,)), make_fake_compact_tensor(bf16, (n,)),
                          make_fake_compact_tensor(bf16, (n,)), 0, BURN,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[n] = fn
    return fn


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the CuTe launch only copies it."""
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    n = o.numel()
    dev = torch.cat((o.reshape(-1), h.reshape(-1)))
    # a non-blocking copy to the CPU lands in page-locked memory; non_blocking passed by position
    ans = dev.to(CPU, dev.dtype, True)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    delta = ans.data_ptr() - anchor.data_ptr()
    assert delta % ans.element_size() == 0
    off = delta // ans.element_size()
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    _compiled_for(n)(anchor, flag, scratch, out, res, off, BURN)
    return out.view(x.shape), res.view(x.shape)
