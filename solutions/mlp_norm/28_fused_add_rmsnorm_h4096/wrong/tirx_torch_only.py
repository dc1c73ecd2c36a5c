"""Wrong: imports TIRx but computes everything in eager PyTorch; no TIRx kernel is ever launched.

Expected: rule_violation/no_dsl_launch
"""

import torch
import tvm  # noqa: F401 - imported, never used
from tvm.script import tirx as Tx  # noqa: F401


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return out, h
