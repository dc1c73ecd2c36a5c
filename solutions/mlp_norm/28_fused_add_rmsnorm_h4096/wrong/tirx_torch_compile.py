"""Wrong: lets torch.compile generate the kernels (Triton underneath) instead of writing TIRx.

Expected: rule_violation/static
"""

import torch
import tvm  # noqa: F401
from tvm.script import tirx as Tx  # noqa: F401


@torch.compile
def _fused(x, residual, weight):
    h = x + residual
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype), h


def solve(x, residual, weight):
    return _fused(x, residual, weight)
