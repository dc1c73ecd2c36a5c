"""Wrong: patches torch.cuda.Event.elapsed_time so every call looks instantaneous.

Expected: rule_violation/static
"""

import torch
import tvm  # noqa: F401
from tvm.script import tirx as Tx  # noqa: F401

torch.cuda.Event.elapsed_time = lambda self, other: 0.001


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype), h
