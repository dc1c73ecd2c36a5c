"""Causal multi-head attention with ALiBi linear position biases (per-head slopes), batched prefill.

Provenance: MPT-7B (config.json: d_model 4096, n_heads 32 -> head_dim 128, max_seq_len 2048, attn_config.alibi
true, alibi_bias_max 8); BLOOM uses the same slopes. With 32 heads (a power of two) the slope of head h
(0-based) is m_h = 2^(-8 (h + 1) / 32) = 2^(-(h + 1) / 4), from 0.84 down to 2^-8. Softmax scale 1/sqrt(128).
Workload: prefill of 4 prompts x 2048 tokens (MPT's full context), bf16.
Full scale: q, k, v [4, 32, 2048, 128] bf16; small scale: [2, 32, 128, 128].
Semantics: s[b,h,i,j] = q[b,h,i] . k[b,h,j] / sqrt(128) - m_h * (i - j) for j <= i, -inf for j > i;
out = softmax_j(s) @ v. (MPT/BLOOM add m_h * j instead, which differs by a per-row constant and gives the same
softmax; alt_reference uses that form.)
Precision: QK^T in the input dtype (bf16 operands, fp32 accumulate), bias and softmax in fp32, P rounded to the
input dtype before PV. Output bf16 [B, 32, T, 128].
Facts a kernel may rely on: layout [batch, heads, seq, head_dim], contiguous; 32 heads (slopes above, not an
input); head_dim 128; all sequences exactly T tokens (T = 2048 full / 128 small), no padding.
"""
import math

import torch


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def _alibi_slopes(n_heads, device, dtype):
    # n_heads is a power of two here: m_h = 2^(-8 (h+1) / n_heads)
    h = torch.arange(1, n_heads + 1, device=device, dtype=dtype)
    return torch.pow(2.0, -8.0 * h / n_heads)


def reference(q, k, v):
    dt = q.dtype
    acc = _acc_dtype(dt)
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D)
    pos = torch.arange(T, device=q.device)
    dist = (pos[:, None] - pos[None, :]).to(acc)                      # i - j
    bias = -_alibi_slopes(H, q.device, acc)[:, None, None] * dist     # [H, T, T]
    bias = bias.masked_fill(dist < 0, float("-inf"))                  # causal
    s = _mm(q, k.transpose(-1, -2)).to(acc) * scale + bias
    p = torch.softmax(s, dim=-1).to(dt)
    return _mm(p, v)


def alt_reference(q, k, v):
    """BLOOM/MPT form: bias m_h * j (key position only), per-head loop."""
    B, H, T, D = q.shape
    slopes = [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
    j = torch.arange(T, device=q.device, dtype=q.dtype)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    out = torch.empty_like(q)
    for h in range(H):
        s = torch.matmul(q[:, h], k[:, h].transpose(-1, -2)) / math.sqrt(D) + slopes[h] * j
        s = s.masked_fill(future, float("-inf"))
        out[:, h] = torch.matmul(torch.softmax(s, dim=-1), v[:, h])
    return out


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, T = 4, 2048
    else:
        B, T = 2, 128
    H, D = 32, 128
    dt = torch.bfloat16
    q = torch.randn(B, H, T, D, device=device).to(dt)
    k = torch.randn(B, H, T, D, device=device).to(dt)
    v = torch.randn(B, H, T, D, device=device).to(dt)
    return [q, k, v]


def roofline(q, k, v):
    B, H, T, D = q.shape
    pairs = T * (T + 1) // 2
    flops = 2 * 2 * B * H * pairs * D
    nbytes = 4 * q.numel() * q.element_size()
    return {"flops": int(flops), "bytes": int(nbytes)}
