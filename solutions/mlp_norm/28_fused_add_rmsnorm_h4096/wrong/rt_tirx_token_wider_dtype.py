"""Token route: eager PyTorch computes the answer in fp32 and a TIRx kernel only narrows it into the bf16 outputs.

The audit looked only at launch arguments about the byte size of an output, so the answer handed over at twice
that size (fp32 for a bf16 output) was never compared (docs/integrity.md hole 7); suppressing or randomising the
narrowing launch leaves the outputs unwritten, so the ablations pass too. The reference rounds its fp32 result to
bf16 exactly as the kernel does, so every output is bit-exact. Protocol 5's audit also copies arguments of two
and four times an output's size and compares them narrowed to the output's dtype.

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5


@Tx.prim_func
def narrow_to_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "float32")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = Tx.cast(A[i], "bfloat16")


_EXE = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(narrow_to_bf16, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    return _EXE[0]


def solve(x, residual, weight):
    hf = x.float() + residual.float()
    h = hf.to(x.dtype)
    hr = h.float()
    eager = hr * torch.rsqrt(hr.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()
    out = torch.empty(eager.shape, dtype=x.dtype, device=x.device)
    h_out = torch.empty_like(h)
    _exe()(eager.reshape(-1), out.view(-1))
    _exe()(hf.reshape(-1), h_out.view(-1))
    return out, h_out
