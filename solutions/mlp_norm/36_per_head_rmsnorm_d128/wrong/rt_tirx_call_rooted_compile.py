"""Static: torch.compile reached through a chain rooted at a call, `(lambda: torch)().compile`; Triton normalises q.

The old static rules resolved dotted chains that start at a name (`torch.compile`, `t.compile` after
`import torch as t`); a chain rooted at a call, `(lambda: torch)().compile`, resolved to nothing and was never
checked. TIRx normalises k (required: suppress it and k_out is poison); Inductor generates the Triton kernels for q.
The new rules check attributes by name on any chain (`compile` is allowed only on the DSL's own chains).

Category: static
Expected: rule_violation/static
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-6
HEAD_DIM = 128
VEC = 8  # bf16 lanes per 16-byte access
LANES = HEAD_DIM // VEC  # 16 threads per head vector
TPB = 256
ROWS_PER_CTA = TPB // LANES  # 16


@Tx.prim_func
def head_rmsnorm(x_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle):
    M = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, HEAD_DIM), "bfloat16", align=16)
    W = Tx.match_buffer(w_ptr, (HEAD_DIM,), "bfloat16", align=16)
    Y = Tx.match_buffer(o_ptr, (M, HEAD_DIM), "bfloat16", align=16)
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(M, ROWS_PER_CTA)])
    tx = Tx.thread_id([TPB])
    xv = Tx.alloc_local((VEC,), "bfloat16")
    wv = Tx.alloc_local((VEC,), "bfloat16")
    ov = Tx.alloc_local((VEC,), "bfloat16")
    xf = Tx.alloc_local((VEC,), "float32")
    row: Tx.let = bx * ROWS_PER_CTA + tx // LANES
    col: Tx.let = (tx % LANES) * VEC
    for v in Tx.vectorized(VEC):
        wv[v] = W[col + v]
    for v in Tx.unroll(VEC):
        xv[v] = Tx.bfloat16(0.0)
    if row < M:
        for v in Tx.vectorized(VEC):
            xv[v] = X[row, col + v]
    sq: Tx.float32 = 0.0
    for v in Tx.unroll(VEC):
        xf[v] = Tx.cast(xv[v], "float32")
        sq = sq + xf[v] * xf[v]
    for s in Tx.unroll(4):  # xor offsets 8, 4, 2, 1: stays inside each 16-lane group
        sq = sq + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sq, 8 >> s, 32, 32)
    inv_rms: Tx.float32 = Tx.rsqrt(sq / Tx.float32(HEAD_DIM) + Tx.float32(EPS))
    for v in Tx.unroll(VEC):
        ov[v] = Tx.cast(xf[v] * inv_rms * Tx.cast(wv[v], "float32"), "bfloat16")
    if row < M:
        for v in Tx.vectorized(VEC):
            Y[row, col + v] = ov[v]


_EXE = None


def _executable():
    global _EXE
    if _EXE is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        _EXE = tvm.compile(head_rmsnorm, target=target, tir_pipeline="tirx")
    return _EXE


def _norm(x, weight):
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"head_dim must be {HEAD_DIM}, got {x.shape[-1]}")
    x2 = x.contiguous().view(-1, HEAD_DIM)
    out = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _executable()(x2, weight.contiguous(), out)
    return out.view(x.shape)


def _q_norm(q, w):
    qf = q.float()
    return (qf * torch.rsqrt(qf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(q.dtype)


_FN = {}


def solve(q, k, q_norm_weight, k_norm_weight):
    if "q" not in _FN:
        _FN["q"] = (lambda: torch)().compile(_q_norm) if q.is_cuda else _q_norm
    return _FN["q"](q, q_norm_weight), _norm(k, k_norm_weight)
