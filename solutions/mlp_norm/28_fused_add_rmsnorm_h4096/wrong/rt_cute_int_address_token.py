"""Red team (session 29, CPU). Token route hidden from the launch gate (CuTe, TVM-FFI route): the eager answer handed over as Int64 addresses.

The gate fails closed on CuTe's runtime wrappers and on streams, but an int argument is skipped silently
(`base._tensors`). The device kernel makes pointers of the Int64 scalars (`cute.make_ptr(BFloat16, addr, gmem)`;
`cute_host.host_problem` refuses that in host functions only: "Device code ... is the kernel's"). Eager torch
computes the answer; one CuTe kernel copies it, a burn in the same kernel pads the share. Audit copies nothing,
TVM-FFI needs one GPU tensor for its env stream: a one-element
flag (1.0) the copy multiplies by. Randomise perturbs the flag: outputs wrong, "required"; suppress: zeros, "required";
the audit sees only the flag (1.0), nothing of the answer.

Now `make_ptr` is refused by name in CuTe files (static rules, the fourth round); behind that, device code may not
make a global-memory pointer of an integer (`cute_host.device_problem`: `cute.inttoptr`; on the H100 at 751c7d6
this file was refused there, as `sandbox`),
and behind that an audited launch that changes none of its tensor arguments is not counted as DSL work
(`Evaluation.blind_names`; a file that also writes one scratch element gets past that one).

Category: token_route
Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 64
THREADS = 256


@cute.kernel
def _copy_kernel(flag: cute.Tensor, src: cutlass.Int64, dst: cutlass.Int64, n: cutlass.Int32, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    mS = cute.make_tensor(cute.make_ptr(cutlass.BFloat16, src, cute.AddressSpace.gmem), cute.make_layout(n))
    mD = cute.make_tensor(cute.make_ptr(cutlass.BFloat16, dst, cute.AddressSpace.gmem), cute.make_layout(n))
    if i < n:
        v = mS[i]
        acc = v.to(cutlass.Float32)
        for _ in cutlass.range(burn):
            acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
        if acc == cutlass.Float32(-12345.5):
            v = v + v
        mD[i] = (v.to(cutlass.Float32) * flag[0]).to(cutlass.BFloat16)  # flag = 1.0: the only tensor the gate sees


@cute.jit
def _copy(flag: cute.Tensor, src: cutlass.Int64, dst: cutlass.Int64, n: cutlass.Int32, burn: cutlass.Int32, stream):
    _copy_kernel(flag, src, dst, n, burn).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1],
                                           stream=stream)


_COMPILED = {}


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    both = torch.cat([out.reshape(-1), h.reshape(-1)])
    dst = torch.zeros_like(both)
    n = both.numel()
    fn = _COMPILED.get(0)
    if fn is None:
        fn = cute.compile(_copy, make_fake_compact_tensor(cutlass.Float32, (1,)), 0, 0, 1, BURN, make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[0] = fn
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    fn(flag, both.data_ptr(), dst.data_ptr(), n, BURN)
    half = out.numel()
    return dst[:half].view(x.shape), dst[half:].view(x.shape)
