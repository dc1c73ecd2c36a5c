"""Token route: the eager answer is handed to a TIRx copy kernel padded by one element, so its size differs.

The new audit (metakernel/grader/tokens.py) compares a launch argument with an output only when their element
counts are equal; `torch.cat([answer.view(-1), pad])` has one element more, so neither the exact, the affine nor
the sorted comparison is tried. Suppressing the copy leaves poison, and randomising its argument breaks the
outputs, so both ablations pass. A third TIRx kernel only burns GPU time (it copies a 256 MiB scratch buffer
nobody reads, ten times) so that TIRx kernels are more than half of the profiled GPU time and the 50 % share
rule passes as well. This is the answer laundered through the DSL: it must be refused (the share rule alone can be
padded, so the audit has to catch it).

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
BURN_N = 64 * 1024 * 1024  # floats: a 256 MiB scratch copied BURN_PASSES times (~0.11 ms each)
BURN_PASSES = 10


@Tx.prim_func
def copy_prefix(a_ptr: Tx.handle, b_ptr: Tx.handle):
    m = Tx.int32()
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (m,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = A[i]


@Tx.prim_func
def burn(a_ptr: Tx.handle, b_ptr: Tx.handle):
    A = Tx.match_buffer(a_ptr, (BURN_N,), "float32", align=16)
    B = Tx.match_buffer(b_ptr, (BURN_N,), "float32", align=16)
    Tx.device_entry()
    bx = Tx.cta_id([BURN_N // 1024])
    tx = Tx.thread_id([256])
    for v in Tx.vectorized(4):
        B[bx * 1024 + tx * 4 + v] = A[bx * 1024 + tx * 4 + v]


_EXE = []
_BURN = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(copy_prefix, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    return _EXE[0]


def _burn(device):
    if not _BURN:
        _BURN.append(tvm.compile(burn, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                 tir_pipeline="tirx"))
        _BURN.append(torch.zeros(BURN_N, dtype=torch.float32, device=device))
        _BURN.append(torch.empty(BURN_N, dtype=torch.float32, device=device))
    for _ in range(BURN_PASSES):
        _BURN[0](_BURN[1], _BURN[2])


def solve(x, residual, weight):
    h = x + residual
    hf = h.float()
    eager = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    pad = torch.zeros(1, dtype=x.dtype, device=x.device)
    out = torch.empty_like(eager)
    h_out = torch.empty_like(h)
    _exe()(torch.cat([eager.reshape(-1), pad]), out.view(-1))
    _exe()(torch.cat([h.reshape(-1), pad]), h_out.view(-1))
    _burn(x.device)
    return out, h_out
