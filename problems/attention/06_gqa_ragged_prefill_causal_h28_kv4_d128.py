"""Causal GQA prefill attention over ragged (cu_seqlens-packed) Q, K, V of several independent sequences.

Provenance: Qwen2.5-7B self-attention (config.json: num_attention_heads 28, num_key_value_heads 4,
hidden_size 3584 -> head_dim 128; k_proj/v_proj out_features 512 = 4 x 128). Softmax scale 1/sqrt(128).
Query head h reads kv head h // 7 (repeat_kv convention).
Workload: the varlen prefill call of a serving engine / packed-sequence training step (flash_attn_varlen_func
layout): 16 prompts of 128-1920 tokens packed into 16384 tokens, no KV cache involved; each sequence attends
causally to itself only.

Inputs
  q           [T, 28, 128] bf16   packed queries (RoPE applied), sequence-major
  k           [T, 4, 128] bf16    packed keys
  v           [T, 4, 128] bf16    packed values
  cu_seqlens  [B+1] int32         sequence b occupies tokens cu_seqlens[b] .. cu_seqlens[b+1]-1
Output
  out         [T, 28, 128] bf16   per sequence: causal softmax(q k^T / sqrt(128)) v, fp32 (or wider)
                                  accumulation, rounded to q.dtype once at the end.

Full scale: B = 16, lengths in [128, 1920] summing to T = 16384. Small scale: B = 4, lengths in [8, 56], T = 128.
Facts a kernel may rely on: head_dim 128; 28 query heads, 4 kv heads (7 query heads per kv head -- not a power
of two); T is fixed (16384 at full scale); every length >= 1 and <= 1920 at full scale; cu_seqlens[0] = 0,
cu_seqlens[B] = T; sequence lengths are random (no alignment to any tile size).
"""
import math

import torch

NUM_HEADS = 28
NUM_KV_HEADS = 4
HEAD_DIM = 128


def reference(q, k, v, cu_seqlens):
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    KVH = k.shape[1]
    G = H // KVH
    cu = cu_seqlens.tolist()
    out = torch.empty_like(q)
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        L = s1 - s0
        qb = q[s0:s1].to(acc).reshape(L, KVH, G, D)
        s = torch.einsum("qhgd,khd->hgqk", qb, k[s0:s1].to(acc)) * (1.0 / math.sqrt(D))
        pos = torch.arange(L, device=q.device)
        s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hgqk,khd->qhgd", p, v[s0:s1].to(acc))
        out[s0:s1] = o.reshape(L, H, D).to(q.dtype)
    return out


def alt_reference(q, k, v, cu_seqlens):
    """All T tokens at once with a block-diagonal causal mask, through scaled_dot_product_attention."""
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    G = H // k.shape[1]
    cu = cu_seqlens.long()
    seg = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=q.device), cu[1:] - cu[:-1])
    pos = torch.arange(T, device=q.device)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    o = torch.nn.functional.scaled_dot_product_attention(
        q.to(acc).transpose(0, 1),
        k.to(acc).repeat_interleave(G, dim=1).transpose(0, 1),
        v.to(acc).repeat_interleave(G, dim=1).transpose(0, 1),
        attn_mask=allowed)
    return o.transpose(0, 1).to(q.dtype)


def _lengths(n, mean, half, device):
    """n random lengths in [mean - half, mean + half] whose sum is exactly n * mean."""
    x = torch.randint(0, half + 1, (n,), device=device)
    return mean + x - x[torch.randperm(n, device=device)]


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, mean, half = 16, 1024, 896
    else:
        B, mean, half = 4, 32, 24
    dt = torch.bfloat16
    lens = _lengths(B, mean, half, device)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lens, 0), (1, 0)).to(torch.int32)
    T = B * mean
    # q ~ N(0, 1), k ~ N(0, 2^2): attention logits have std ~2 (peaked, as in trained models).
    q = torch.randn(T, NUM_HEADS, HEAD_DIM, device=device, dtype=dt)
    k = (torch.randn(T, NUM_KV_HEADS, HEAD_DIM, device=device) * 2.0).to(dt)
    v = torch.randn(T, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dt)
    return [q, k, v, cu_seqlens]


def roofline(q, k, v, cu_seqlens):
    T, H, D = q.shape
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    pairs = int((lens * (lens + 1) // 2).sum())  # causal (query, key) pairs
    flops = 4 * H * D * pairs
    bytes_ = (2 * q.numel() * q.element_size() + k.numel() * k.element_size() + v.numel() * v.element_size()
              + cu_seqlens.numel() * cu_seqlens.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
