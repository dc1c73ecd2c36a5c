"""Token route: eager PyTorch computes q_out and k_out and hands TIRx transposed copies, which TIRx transposes back.

The answer travels as `out.transpose(0, 1).contiguous()` ([H, T, 128]); the TIRx kernel writes it back in [T, H, 128]
order. The old audit reshaped each launch argument to the output's shape and compared: a transposed copy, reshaped,
is a different tensor, so it passed (and the ablation broke the outputs, as it should for a kernel that writes
them). The new audit also compares the sorted values of an argument with the answer's (a permutation of it).

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-6


@Tx.prim_func
def untranspose(a_ptr: Tx.handle, b_ptr: Tx.handle):
    H = Tx.int32()
    T = Tx.int32()
    A = Tx.match_buffer(a_ptr, (H, T, 128), "bfloat16")
    B = Tx.match_buffer(b_ptr, (T, H, 128), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(T * H * 128, 256)])
    tx = Tx.thread_id([256])
    idx: Tx.let = bx * 256 + tx
    if idx < T * H * 128:
        t: Tx.let = idx // (H * 128)
        hh: Tx.let = (idx // 128) % H
        d: Tx.let = idx % 128
        B[t, hh, d] = A[hh, t, d]


_EXE = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(untranspose, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    return _EXE[0]


def _eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def solve(q, k, q_norm_weight, k_norm_weight):
    outs = []
    for x, w in ((q, q_norm_weight), (k, k_norm_weight)):
        answer = _eager(x, w)
        out = torch.empty_like(x)
        _exe()(answer.transpose(0, 1).contiguous(), out)
        outs.append(out)
    return outs[0], outs[1]
