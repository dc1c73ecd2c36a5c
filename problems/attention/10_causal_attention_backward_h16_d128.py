"""Backward pass of causal softmax attention: dQ, dK, dV from Q, K, V and the output gradient dO.

Provenance: a GPT-NeoX-style 1.4B decoder in training (Pythia-1.4B, config.json: hidden_size 2048,
num_attention_heads 16, so head_dim 128; multi-head attention, one K/V head per Q head).
Softmax scale 1/sqrt(128).
Workload: one micro-batch of 4 sequences x 2048 tokens (Pythia's context length), bf16 training.
Full scale: q, k, v, dout [4, 16, 2048, 128] bf16; small scale: [2, 4, 256, 128].
Semantics (FlashAttention-2 backward, recomputing the forward):
    S = scale * Q K^T (causal: key j <= query i), P = softmax(S), O = P V,
    Dsum_i = sum_d dO_id O_id, dS = P * (dO V^T - Dsum), dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO.
Precision pipeline of the reference: matmuls take operands in the input dtype (bf16 tensor cores, fp32
accumulate, result rounded to bf16), softmax and dS are formed in fp32, P and dS are rounded to bf16 before
they feed the next matmul (as FlashAttention does). Outputs are bf16.
Facts a kernel may rely on: layout [batch, heads, seq, head_dim], contiguous; head_dim 128; 16 heads (4 at
small scale); every sequence is exactly T tokens long (T a multiple of 128 at both scales); no dropout, no padding.
The out / logsumexp of the forward are NOT inputs: recompute them.
"""
import math

import torch

OUTPUT_NAMES = ("dq", "dk", "dv")


def _acc_dtype(dtype):
    # at least fp32 for softmax and elementwise math; float64 stays float64 (the grader's anchor)
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def reference(q, k, v, dout):
    dt = q.dtype
    acc = _acc_dtype(dt)
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)

    s = _mm(q, k.transpose(-1, -2)).to(acc) * scale   # [B, H, T, T]
    s = s.masked_fill(future, float("-inf"))
    p = torch.softmax(s, dim=-1)                                      # acc dtype
    p_lo = p.to(dt)
    o = _mm(p_lo, v)   # forward output, input dtype

    dsum = (dout.to(acc) * o.to(acc)).sum(dim=-1, keepdim=True)        # [B, H, T, 1]
    dv = _mm(p_lo.transpose(-1, -2), dout)
    dp = _mm(dout, v.transpose(-1, -2)).to(acc)
    ds = (p * (dp - dsum) * scale).to(dt)
    dq = _mm(ds, k)
    dk = _mm(ds.transpose(-1, -2), q)
    return dq, dk, dv


def _forward(q, k, v):
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def alt_reference(q, k, v, dout):
    """Autograd through the plain forward (independent of the hand-derived backward)."""
    with torch.enable_grad():
        qq = q.detach().clone().requires_grad_(True)
        kk = k.detach().clone().requires_grad_(True)
        vv = v.detach().clone().requires_grad_(True)
        o = _forward(qq, kk, vv)
        dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), grad_outputs=dout)
    return dq, dk, dv


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, H, T, D = 4, 16, 2048, 128
    else:
        B, H, T, D = 2, 4, 256, 128
    dt = torch.bfloat16
    # q, k of unit-variance entries (post-projection activations); scale 1/sqrt(D) makes logits O(1)
    q = torch.randn(B, H, T, D, device=device).to(dt)
    k = torch.randn(B, H, T, D, device=device).to(dt)
    v = torch.randn(B, H, T, D, device=device).to(dt)
    dout = (torch.randn(B, H, T, D, device=device) * 1e-2).to(dt)
    return [q, k, v, dout]


def roofline(q, k, v, dout):
    B, H, T, D = q.shape
    pairs = T * (T + 1) // 2                        # causal (query, key) pairs per head
    # recompute S = QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: 5 matmuls over the pairs
    flops = 5 * 2 * B * H * pairs * D
    elems = B * H * T * D
    nbytes = 4 * elems * q.element_size() + 3 * elems * q.element_size()
    return {"flops": int(flops), "bytes": int(nbytes)}
