"""Causal GQA prefill attention over a paged KV cache (page size 1) for a batch of variable-length requests.

Provenance: Llama-3.1-8B self-attention (config.json: num_attention_heads 32, num_key_value_heads 8,
hidden_size 4096 -> head_dim 128). Softmax scale 1/sqrt(128). Query head h reads kv head h // 4.
Workload: one chunked-prefill step of a vLLM/FlashInfer server: 8 requests, each bringing 512-2048 new tokens on
top of 0-2048 tokens already cached (prefix-cache hits / earlier chunks). The new tokens' k/v have already been
written to the cache, so request b's keys are its kv_lens[b] cached tokens; its query tokens are the LAST
q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] of them (bottom-right aligned causal mask: query i of request b,
at position kv_lens[b] - q_len_b + i, sees keys 0 .. kv_lens[b] - q_len_b + i).
Cache layout as vLLM's flash-attention backend: [num_pages, page_size, num_kv_heads, head_dim], page_size 1.

Inputs
  q             [T, 32, 128] bf16     packed query tokens of all requests (RoPE applied), request-major
  k_cache       [P, 1, 8, 128] bf16   pool of cache pages (more pages than in use)
  v_cache       [P, 1, 8, 128] bf16
  block_table   [B, 4096] int32       block_table[b, j] = page of token j of request b, j < kv_lens[b];
                                      later entries are padding (0) and must not be used
  cu_seqlens_q  [B+1] int32           query offsets into q (cu_seqlens_q[0] = 0, cu_seqlens_q[B] = T)
  kv_lens       [B] int32             cached length of each request, including its new tokens (>= its q_len)
Output
  out           [T, 32, 128] bf16     causal softmax(q k^T / sqrt(128)) v, fp32 (or wider) accumulation,
                                      rounded to q.dtype once at the end.

Full scale: B = 8; q_len in [512, 2048] with T = 10240 (mean 1280); cached prefix (kv_len - q_len) in [0, 2048]
summing to 8192, so sum(kv_lens) = 18432; P = 24576 pages. Small scale: B = 3, q_len in [8, 56] (T = 96),
prefix in [0, 32] (sum 48), P = 192, block_table width 88.
Facts a kernel may rely on: head_dim 128; 32 query heads, 8 kv heads (4 per kv head); page_size 1; T and
sum(kv_lens) are fixed (10240 and 18432 at full scale); kv_lens[b] >= q_len_b >= 1; every request owns distinct
pages drawn at random from the pool (any order).
"""
import math

import torch

NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
PAGE_SIZE = 1


def reference(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens):
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    G = H // KVH
    k_flat = k_cache.reshape(-1, KVH, D)
    v_flat = v_cache.reshape(-1, KVH, D)
    cu = cu_seqlens_q.tolist()
    lens = kv_lens.tolist()
    out = torch.empty_like(q)
    for b in range(len(lens)):
        q0, q1, Lk = cu[b], cu[b + 1], lens[b]
        Lq = q1 - q0
        nb = (Lk + PS - 1) // PS
        slots = (block_table[b, :nb].long()[:, None] * PS + torch.arange(PS, device=q.device)).reshape(-1)[:Lk]
        k = k_flat[slots].to(acc)  # [Lk, KVH, D]
        v = v_flat[slots].to(acc)
        qb = q[q0:q1].to(acc).reshape(Lq, KVH, G, D)
        s = torch.einsum("qhgd,khd->hgqk", qb, k) * (1.0 / math.sqrt(D))
        q_pos = torch.arange(Lq, device=q.device) + (Lk - Lq)
        visible = torch.arange(Lk, device=q.device)[None, :] <= q_pos[:, None]  # [Lq, Lk]
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hgqk,khd->qhgd", p, v)
        out[q0:q1] = o.reshape(Lq, H, D).to(q.dtype)
    return out


def alt_reference(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens):
    """All requests at once: pages gathered densely through the block table, queries padded, one 4-D mask."""
    acc = torch.promote_types(q.dtype, torch.float32)
    T, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    B = kv_lens.shape[0]
    dev = q.device
    bt = block_table.long()
    N = bt.shape[1] * PS
    k = k_cache[bt].reshape(B, N, KVH, D).to(acc).repeat_interleave(H // KVH, dim=2)  # [B, N, H, D]
    v = v_cache[bt].reshape(B, N, KVH, D).to(acc).repeat_interleave(H // KVH, dim=2)
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    Mq = int(q_lens.max())
    col = torch.arange(Mq, device=dev)
    q_valid = col[None, :] < q_lens[:, None]  # [B, Mq]
    qp = q[(cu[:-1, None] + col[None, :]).clamp(max=T - 1)].to(acc)  # [B, Mq, H, D]
    s = torch.einsum("bqhd,bkhd->bhqk", qp, k) / math.sqrt(D)
    q_pos = (kv_lens.long() - q_lens)[:, None] + col[None, :]  # [B, Mq]
    allowed = torch.arange(N, device=dev)[None, None, :] <= q_pos[:, :, None]  # [B, Mq, N]
    s = torch.where(allowed[:, None], s, torch.tensor(float("-inf"), dtype=acc, device=dev))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o[q_valid].to(q.dtype)


def _lengths(n, mean, half, device):
    """n random lengths in [mean - half, mean + half] whose sum is exactly n * mean."""
    x = torch.randint(0, half + 1, (n,), device=device)
    return mean + x - x[torch.randperm(n, device=device)]


def _block_table(num_blocks, max_blocks, num_pages, device):
    """Distinct random pages for every request (a random permutation of the pool); padding entries are 0."""
    perm = torch.randperm(num_pages, device=device)
    start = torch.cumsum(num_blocks, 0) - num_blocks
    col = torch.arange(max_blocks, device=device)
    idx = (start[:, None] + col[None, :]).clamp(max=num_pages - 1)
    return torch.where(col[None, :] < num_blocks[:, None], perm[idx], 0).to(torch.int32)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, q_mean, q_half, pre_mean, pre_half, max_blocks, num_pages = 8, 1280, 768, 1024, 1024, 4096, 24576
    else:
        B, q_mean, q_half, pre_mean, pre_half, max_blocks, num_pages = 3, 32, 24, 16, 16, 88, 192
    dt = torch.bfloat16
    q_lens = _lengths(B, q_mean, q_half, device)
    kv_lens = q_lens + _lengths(B, pre_mean, pre_half, device)
    cu_seqlens_q = torch.nn.functional.pad(torch.cumsum(q_lens, 0), (1, 0)).to(torch.int32)
    block_table = _block_table((kv_lens + PAGE_SIZE - 1) // PAGE_SIZE, max_blocks, num_pages, device)
    T = B * q_mean
    # q ~ N(0, 1), k ~ N(0, 2^2): attention logits have std ~2 (peaked, as in trained models).
    q = torch.randn(T, NUM_HEADS, HEAD_DIM, device=device, dtype=dt)
    k_cache = (torch.randn(num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device) * 2.0).to(dt)
    v_cache = torch.randn(num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dt)
    return [q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens.to(torch.int32)]


def roofline(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens):
    T, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    cu = cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    lk = kv_lens.long()
    pairs = int((q_lens * (lk - q_lens) + q_lens * (q_lens + 1) // 2).sum())  # visible (query, key) pairs
    pages = int(((lk + PS - 1) // PS).sum())
    flops = 4 * H * D * pairs
    bytes_ = (2 * q.numel() * q.element_size()
              + 2 * pages * PS * KVH * D * k_cache.element_size()
              + pages * block_table.element_size()
              + cu_seqlens_q.numel() * cu_seqlens_q.element_size() + kv_lens.numel() * kv_lens.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
