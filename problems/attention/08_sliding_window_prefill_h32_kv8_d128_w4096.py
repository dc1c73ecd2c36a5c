"""Causal sliding-window GQA prefill attention over ragged Q, K, V: each token sees itself and the previous window-1 tokens.

Provenance: Mistral-7B-v0.1 self-attention (config.json: num_attention_heads 32, num_key_value_heads 8,
hidden_size 4096 -> head_dim 128, sliding_window 4096). Softmax scale 1/sqrt(128). Query head h reads kv head
h // 4. Window semantics as the Hugging Face sliding-window mask: query position i sees key positions j with
i - window < j <= i (exactly `window` keys once i >= window - 1).
Workload: prefill of long prompts (Mistral-7B-v0.1 was trained on 8k-token sequences): 2 prompts of 4096-8192
tokens packed into 12288 tokens (flash_attn_varlen_func layout with window_size=(4095, 0)), so the window is
active for a large part of every sequence.

Inputs
  q           [T, 32, 128] bf16   packed queries (RoPE applied), sequence-major
  k           [T, 8, 128] bf16    packed keys
  v           [T, 8, 128] bf16    packed values
  cu_seqlens  [B+1] int32         sequence b occupies tokens cu_seqlens[b] .. cu_seqlens[b+1]-1
  window      [] int32 (0-dim)    the sliding window, 4096 at full scale (24 at small scale, so that the
                                  window also bites on CPU-sized inputs); a kernel may read it on the device
Output
  out         [T, 32, 128] bf16   per sequence: sliding-window causal softmax(q k^T / sqrt(128)) v, fp32 (or
                                  wider) accumulation, rounded to q.dtype once at the end.

Full scale: B = 2, lengths in [4096, 8192] summing to T = 12288, window 4096. Small scale: B = 3, lengths in
[16, 80] summing to 144, window 24.
Facts a kernel may rely on: head_dim 128; 32 query heads, 8 kv heads (4 per kv head); T is fixed (12288 at full
scale); window is 4096 at full scale and 24 at small scale (always >= 1); lengths are random (no tile alignment).
"""
import math

import torch

NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128


def reference(q, k, v, cu_seqlens, window):
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    KVH = k.shape[1]
    G = H // KVH
    W = int(window)
    cu = cu_seqlens.tolist()
    out = torch.empty_like(q)
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        L = s1 - s0
        pos = torch.arange(L, device=q.device)
        dist = pos[:, None] - pos[None, :]  # query position - key position
        hidden = (dist < 0) | (dist >= W)
        for h in range(KVH):  # one kv head (and its query-head group) at a time keeps the [G, L, L] scores small
            qh = q[s0:s1, h * G:(h + 1) * G].to(acc).transpose(0, 1)  # [G, L, D]
            kh = k[s0:s1, h].to(acc)  # [L, D]
            s = torch.matmul(qh, kh.t()) * (1.0 / math.sqrt(D))
            p = torch.softmax(s.masked_fill(hidden, float("-inf")), dim=-1)
            out[s0:s1, h * G:(h + 1) * G] = torch.matmul(p, v[s0:s1, h].to(acc)).transpose(0, 1).to(q.dtype)
    return out


def alt_reference(q, k, v, cu_seqlens, window):
    """Banded form: each block of 8 queries gathers only the keys inside its window span."""
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    G = H // k.shape[1]
    W = int(window)
    kx = k.to(acc).repeat_interleave(G, dim=1)  # [T, H, D]
    vx = v.to(acc).repeat_interleave(G, dim=1)
    out = torch.empty_like(q)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        for i0 in range(s0, s1, 8):
            i1 = min(i0 + 8, s1)
            j0 = max(s0, i0 - W + 1)  # first key any query of the block can see
            qi = torch.arange(i0, i1, device=q.device)
            kj = torch.arange(j0, i1, device=q.device)
            ok = (kj[None, :] <= qi[:, None]) & (kj[None, :] > qi[:, None] - W)
            s = torch.einsum("qhd,khd->hqk", q[i0:i1].to(acc), kx[j0:i1]) / math.sqrt(D)
            s = torch.where(ok, s, torch.tensor(float("-inf"), dtype=acc, device=q.device))
            p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
            out[i0:i1] = torch.einsum("hqk,khd->qhd", p, vx[j0:i1]).to(q.dtype)
    return out


def _lengths(n, mean, half, device):
    """n random lengths in [mean - half, mean + half] whose sum is exactly n * mean."""
    x = torch.randint(0, half + 1, (n,), device=device)
    return mean + x - x[torch.randperm(n, device=device)]


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, mean, half, W = 2, 6144, 2048, 4096
    else:
        B, mean, half, W = 3, 48, 32, 24
    dt = torch.bfloat16
    lens = _lengths(B, mean, half, device)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lens, 0), (1, 0)).to(torch.int32)
    T = B * mean
    # q ~ N(0, 1), k ~ N(0, 2^2): attention logits have std ~2 (peaked, as in trained models).
    q = torch.randn(T, NUM_HEADS, HEAD_DIM, device=device, dtype=dt)
    k = (torch.randn(T, NUM_KV_HEADS, HEAD_DIM, device=device) * 2.0).to(dt)
    v = torch.randn(T, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dt)
    window = torch.tensor(W, dtype=torch.int32, device=device)
    return [q, k, v, cu_seqlens, window]


def roofline(q, k, v, cu_seqlens, window):
    T, H, D = q.shape
    W = int(window)
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    # query i sees min(i + 1, W) keys: sum over i < L = W(W+1)/2 + (L - W) W when L >= W, else L(L+1)/2
    m = torch.clamp(lens, max=W)
    pairs = int((m * (m + 1) // 2 + (lens - m) * W).sum())
    flops = 4 * H * D * pairs
    bytes_ = (2 * q.numel() * q.element_size() + k.numel() * k.element_size() + v.numel() * v.element_size()
              + cu_seqlens.numel() * cu_seqlens.element_size() + window.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
