"""Wrong: eager PyTorch computes the answer; a token TIRx kernel only copies it into the outputs.

Ablation cannot catch this (suppress the copy and the outputs are unwritten), so the grader audits the arguments of
every DSL launch: here the copy kernel is handed the finished outputs before it runs.
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def copy_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([(n + 255) // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = A[i]


_EXE = []


def solve(x, residual, weight):
    if not _EXE:
        _EXE.append(tvm.compile(copy_bf16, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    h = x + residual
    hf = h.float()
    eager = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    out = torch.empty_like(eager)
    _EXE[0](eager.view(-1), out.view(-1))
    return out, h
