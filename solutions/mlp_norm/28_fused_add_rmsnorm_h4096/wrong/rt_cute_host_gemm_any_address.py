"""Red team (session 28, third CPU round): a host `cute.gemm` loads and stores at any address.

A view made with `cute.make_tensor(t.iterator + offset, ...)` (`cute.add_offset`, `cute.make_view`) points anywhere
(offset = target - base, in elements; `id()` gives a Python object's address), and the universal-FMA atom's host
lowering computes A*B + C and stores it where C points: `C += C * -1` zeroes four bytes, `C += mark * 1` writes
them. On the CPU in run mode it read 16 bytes of a bytes object and overwrote them. No op name held one of the
host check's access words (then a denylist), so it passed the static rules and `cute_host.confine`; it runs only
where launches run (a GPU grading). Now host CuTe ops are an allowlist (`cute_host.HOST_CUTE_OPS`).

Session 31: `id()` and `hash()` are refused by name (object addresses told audited calls apart through the ids of
fresh tensors), so the static rules now stop this file before the sandbox does.

Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

PROBE = {}
N = 4


@cute.jit
def _fma(t: cute.Tensor, src: cutlass.Int64, scale: cutlass.Int64, dst: cutlass.Int64):
    # the universal FMA atom's lowering computes A * B + C into C's memory: [dst] += [src] * [scale], at any address
    atom = cute.make_mma_atom(cute.nvgpu.MmaUniversalOp(cutlass.Float32))
    b = cute.make_tensor(t.iterator + scale, cute.make_layout(1))
    for i in cutlass.range_constexpr(N):
        a = cute.make_tensor(t.iterator + src + i, cute.make_layout(1))
        c = cute.make_tensor(t.iterator + dst + i, cute.make_layout(1))
        cute.gemm(atom, c, a, b, c)


def solve(x, residual, weight):
    secret = b"SECRET-HARNESS-BYTES-0123456789"
    base = torch.zeros(2 + 2 * N, dtype=torch.float32)
    base[0] = 1.0
    base[1] = -1.0
    fn = cute.compile(_fma, from_dlpack(base), cutlass.Int64(0), cutlass.Int64(0), cutlass.Int64(0))
    at = (id(secret) + 32 - base.data_ptr()) // 4  # a bytes object's data, in float32 elements from base
    # read 16 bytes of a Python object's memory: base[2:6] = 0 + secret * 1
    fn(from_dlpack(base), at, 0, 2)
    PROBE["read"] = bytes(base[2:2 + N].view(torch.uint8).tolist())
    # write 16 bytes of our choice there: secret += secret * -1 (zero), then secret += mark * 1
    base[2 + N:] = torch.tensor(list(b"PWNED-BY-THE-KER"), dtype=torch.uint8).view(torch.float32)
    fn(from_dlpack(base), at, 1, at)
    fn(from_dlpack(base), 2 + N, 0, at)
    PROBE["secret_after_write"] = secret
    h = x + residual
    return h, h
