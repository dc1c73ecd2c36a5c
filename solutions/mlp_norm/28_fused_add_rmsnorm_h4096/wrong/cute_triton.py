"""Wrong: writes the kernel in Triton and only imports CuTe for show.

Expected: rule_violation/static
"""

import torch
import cutlass  # noqa: F401
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, r_ptr, w_ptr, o_ptr, h_ptr, n: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, n)
    h = (tl.load(x_ptr + row * n + cols).to(tl.float32) + tl.load(r_ptr + row * n + cols).to(tl.float32))
    h = h.to(tl.bfloat16).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n + 1e-5)
    tl.store(h_ptr + row * n + cols, h.to(tl.bfloat16))
    tl.store(o_ptr + row * n + cols, (h * inv * tl.load(w_ptr + cols).to(tl.float32)).to(tl.bfloat16))


def solve(x, residual, weight):
    out, h = torch.empty_like(x), torch.empty_like(x)
    _rmsnorm[(x.shape[0],)](x, residual, weight, out, h, n=x.shape[1])
    return out, h
