"""Causal multi-query (one kv head) prefill attention with head_dim 256 over ragged (cu_seqlens-packed) Q, K, V.

Provenance: Gemma-2B self-attention (config.json of google/gemma-2b: num_attention_heads 8,
num_key_value_heads 1, head_dim 256, hidden_size 2048, max_position_embeddings 8192). Softmax scale
head_dim^-0.5 = 1/16. All 8 query heads share the single kv head (MQA).
Workload: the varlen prefill call of a serving engine (flash_attn_varlen_func layout): 8 prompts of 256-3840
tokens packed into 16384 tokens, no KV cache involved; each sequence attends causally to itself only.

Inputs
  q           [T, 8, 256] bf16    packed queries (RoPE applied), sequence-major
  k           [T, 1, 256] bf16    packed keys (one kv head)
  v           [T, 1, 256] bf16    packed values
  cu_seqlens  [B+1] int32         sequence b occupies tokens cu_seqlens[b] .. cu_seqlens[b+1]-1
Output
  out         [T, 8, 256] bf16    per sequence: causal softmax(q k^T / 16) v, fp32 (or wider) accumulation,
                                  rounded to q.dtype once at the end.

Full scale: B = 8, lengths in [256, 3840] summing to T = 16384. Small scale: B = 3, lengths in [8, 56], T = 96.
Facts a kernel may rely on: head_dim 256; 8 query heads, 1 kv head; T is fixed (16384 at full scale); every
length >= 1 and <= 3840 at full scale; cu_seqlens[0] = 0, cu_seqlens[B] = T; sequence lengths are random (no
alignment to any tile size).
"""
import math

import torch

NUM_HEADS = 8
NUM_KV_HEADS = 1
HEAD_DIM = 256


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
        B, mean, half = 8, 2048, 1792
    else:
        B, mean, half = 3, 32, 24
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
