"""Red team (session 31, second CPU round, hole 12: the isolation made inconclusive by one argument). The anchor-offset copy
(`rt_cute_anchor_offset_copy`) with one more tensor argument the kernel never reads: a one-byte tensor expanded to
110000 x 110000 (strides 0, 0; 12.1 G elements, no memory). `LaunchGate._isolate` gathers a strided argument's
elements through `_elements`, whose flat int64 index has one entry per element: 97 GB, which fits neither attempt
(the index is built on the argument's device both times; only the saved pieces move to the host). Both attempts
fail, and with the file's own memory under `room` the gate records -2 ("the machine's fault"): nothing is isolated
for the rest of the call, and the phase reads "not conclusive" instead of rejecting. The audit's copies of the
shield (12 GB before and after, in the gate's pool) fit an H100; the randomise and suppress ablations raise on it
(randperm / copy_ into an expanded view), which counts as "required".

Now (session 31): a stride-0 dimension is cut to one element before the gate copies a strided argument's
elements (`_distinct`), and an argument whose distinct dimensions overlap is the file's failure (`dsl_reach`); the
shield costs one byte, the launch is isolated, and the copy reads noise. (Found by session 31's second CPU
red-team round; not yet graded on a GPU.)

The red-teamer's proposed fix: a strided argument's elements are a set of byte ranges, not an index per element: merge them into spans from
the sizes and strides (an expanded or overlapping view covers few bytes), or refuse a launch argument whose
elements overlap (stride 0 / `torch._debug_has_internal_overlap`) or whose numel exceeds its storage; and a failure
to isolate that the launch's own arguments caused (anything but the saved copies) is the file's (-1), not -2.

Category: token_route
Expected: rule_violation/dsl_reach
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

EPS = 1e-5
BURN = 1024  # ~2 ms of FMAs over 59.4M threads on an H100 (estimated, not run): above the eager ~0.9 ms
THREADS = 256
SHIELD = 110000  # the shield's side: 12.1 G elements, 97 GB of int64 index in `_elements`


@cute.kernel
def _copy_kernel(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
                 shield: cute.Tensor, off: cutlass.Int64, burn: cutlass.Int32):
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
          shield: cute.Tensor, off: cutlass.Int64, burn: cutlass.Int32, stream):
    n = mOut.shape[0]
    _copy_kernel(anchor, flag, scratch, mOut, mH, shield, off, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(n):
    fn = _COMPILED.get(n)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        fn = cute.compile(_copy, make_fake_compact_tensor(bf16, (1,)), make_fake_compact_tensor(f32, (1,)),
                          make_fake_compact_tensor(f32, (1,)), make_fake_compact_tensor(bf16, (n,)),
                          make_fake_compact_tensor(bf16, (n,)),
                          make_fake_tensor(cutlass.Uint8, (SHIELD, SHIELD), (0, 0)), 0, BURN,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[n] = fn
    return fn


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the CuTe launch only copies it."""
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    n = o.numel()
    ans = torch.empty(2 * n, dtype=x.dtype, device=x.device)  # never a launch argument
    ans[:n] = o.reshape(-1)
    ans[n:] = h.reshape(-1)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    delta = ans.data_ptr() - anchor.data_ptr()
    assert delta % ans.element_size() == 0
    off = delta // ans.element_size()
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    # never read by the kernel: a strided argument whose per-element index the isolation cannot build
    shield = torch.zeros(1, dtype=torch.uint8, device=x.device).expand(SHIELD, SHIELD)
    _compiled_for(n)(anchor, flag, scratch, out, res, shield, off, BURN)
    return out.view(x.shape), res.view(x.shape)
