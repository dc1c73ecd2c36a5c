"""A GPU clock through the generic LLVM intrinsic call: `cute.arch.nvvm_wrappers.llvm.call_intrinsic`.

Primitive. `cute.arch.nvvm_wrappers.llvm` is the MLIR llvm dialect module; its `call_intrinsic(result_type, name,
args, [], [])` emits one `llvm.call_intrinsic` op naming any LLVM intrinsic by string. With
"llvm.nvvm.read.ptx.sreg.globaltimer" (or ".clock64", or the target-neutral "llvm.readcyclecounter" /
"llvm.readsteadycounter", which NVPTX lowers to %clock64 / %globaltimer) device code reads a GPU clock.
Why the rules miss it: static refuses `clock`, `clock64`, `globaltimer*`, `timer_*`, `call_intrin` and the other
exact intrinsic-call names, but not `call_intrinsic`, `nvvm_wrappers`, `llvm` or `mlir_type`; the intrinsic's name
is a plain string. The IR check added in 71147a9 (`cute_host.device_problem`) matches the clock pattern against
each device op's *name* and an inline_asm's `asm_string` only: this op's name is "llvm.call_intrinsic" and the
register sits in its `intrin` attribute.
Use: the kernel writes the timer to a one-element output; `solve` tells the first call of a row (after the
parent's pause), the audit's synchronising copies, and its own duration.

Observed: static check clean (not run: no GPU; the dry run was not tried for lack of time). Reasoned from
metakernel/dsl/cute_host.py at 71147a9. Closed the same session: `call_intrinsic` and the cycle / steady counter
names are refused, and `device_problem` matches the clock pattern against every attribute of every device op.

Category: timer_tamper
Expected: rule_violation/static
"""
import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack


@cute.kernel
def stamp_kernel(out: cute.Tensor):
    t = cute.arch.nvvm_wrappers.llvm.call_intrinsic(cutlass.Int64.mlir_type, "llvm.nvvm.read.ptx.sreg.globaltimer",
                                                    [], [], [])
    out[0] = cutlass.Int64(t)


@cute.jit
def stamp(out: cute.Tensor):
    stamp_kernel(out).launch(grid=(1, 1, 1), block=(1, 1, 1))


_EXE = {}


def now_ns(device):
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    t = from_dlpack(buf)
    if "k" not in _EXE:
        _EXE["k"] = cute.compile(stamp, t)
    _EXE["k"](t)
    return int(buf.item())


def solve(x, residual, weight):
    start = now_ns(x.device)
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    _EXE["last"] = now_ns(x.device) - start
    return out, h
