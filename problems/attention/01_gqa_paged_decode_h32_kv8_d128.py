"""One-token GQA decode attention over a paged KV cache with page size 1 (one cache slot per token).

Provenance: Llama-3.1-8B self-attention (config.json: num_attention_heads 32, num_key_value_heads 8,
hidden_size 4096 -> head_dim 128). Softmax scale 1/sqrt(128). Query head h reads kv head h // 4 (the
repeat_kv / repeat_interleave convention of the HF and vLLM Llama code).
Workload: a vLLM-style decode step of 64 running requests whose contexts (already in the cache, including the
token being decoded) range up to 4k tokens. Cache layout as vLLM's flash-attention backend:
[num_pages, page_size, num_kv_heads, head_dim], here with page_size 1, so block_table holds one slot per token.

Inputs
  q            [B, 32, 128] bf16      one query token per request (RoPE already applied)
  k_cache      [P, 1, 8, 128] bf16    pool of cache pages (more pages than in use)
  v_cache      [P, 1, 8, 128] bf16
  block_table  [B, 4096] int32        block_table[b, j] = page holding token j of request b, for j < seq_lens[b];
                                      entries at j >= seq_lens[b] are padding (0) and must not be used
  seq_lens     [B] int32              context length of each request (>= 1)
Output
  out          [B, 32, 128] bf16      softmax(q k^T / sqrt(128)) v per request and head, computed with fp32
                                      (or wider) accumulation and rounded to q.dtype once at the end.

Full scale: B = 64, seq_lens in [1, 4095] summing to exactly 131072 (mean 2048), P = 163840 pages (1.25x the
pages in use); max_blocks (block_table width) 4096. Small scale: B = 4, seq_lens in [4, 44] summing to 96,
P = 128, max_blocks 48.
Facts a kernel may rely on: head_dim 128; 32 query heads, 8 kv heads (4 query heads per kv head); page_size 1;
sum(seq_lens) is fixed (131072 at full scale); every request owns distinct pages, drawn at random from the pool
(no locality, any slot order); seq_lens[b] <= block_table.shape[1].
"""
import math

import torch

NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
PAGE_SIZE = 1


def reference(q, k_cache, v_cache, block_table, seq_lens):
    acc = torch.promote_types(q.dtype, torch.float32)
    B, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    G = H // KVH
    bt = block_table.long()
    N = bt.shape[1] * PS
    # Gather every request's pages (padded to the table width), then mask the positions past its length.
    k = k_cache[bt].reshape(B, N, KVH, D).to(acc)
    v = v_cache[bt].reshape(B, N, KVH, D).to(acc)
    qg = q.reshape(B, KVH, G, D).to(acc)
    s = torch.einsum("bhgd,bnhd->bhgn", qg, k) * (1.0 / math.sqrt(D))
    valid = torch.arange(N, device=q.device)[None, :] < seq_lens.long()[:, None]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("bhgn,bnhd->bhgd", p, v)
    return o.reshape(B, H, D).to(q.dtype)


def alt_reference(q, k_cache, v_cache, block_table, seq_lens):
    """Per-request loop over an explicit slot list, kv heads expanded to query heads, explicit logsumexp."""
    acc = torch.promote_types(q.dtype, torch.float32)
    B, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    k_flat = k_cache.reshape(-1, KVH, D)
    v_flat = v_cache.reshape(-1, KVH, D)
    out = torch.empty_like(q)
    for b in range(B):
        L = int(seq_lens[b])
        nb = (L + PS - 1) // PS
        slots = (block_table[b, :nb].long()[:, None] * PS + torch.arange(PS, device=q.device)).reshape(-1)[:L]
        k = k_flat[slots].to(acc).repeat_interleave(H // KVH, dim=1)  # [L, H, D]
        v = v_flat[slots].to(acc).repeat_interleave(H // KVH, dim=1)
        s = (k * q[b].to(acc)[None]).sum(-1) / math.sqrt(D)  # [L, H]
        w = torch.exp(s - torch.logsumexp(s, dim=0, keepdim=True))
        out[b] = (w[:, :, None] * v).sum(0).to(q.dtype)
    return out


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
        B, mean, half, max_blocks, num_pages = 64, 2048, 2047, 4096, 163840
    else:
        B, mean, half, max_blocks, num_pages = 4, 24, 20, 48, 128
    dt = torch.bfloat16
    seq_lens = _lengths(B, mean, half, device)
    num_blocks = (seq_lens + PAGE_SIZE - 1) // PAGE_SIZE
    block_table = _block_table(num_blocks, max_blocks, num_pages, device)
    # q ~ N(0, 1), k ~ N(0, 2^2): attention logits have std ~2 (peaked, as in trained models).
    q = torch.randn(B, NUM_HEADS, HEAD_DIM, device=device, dtype=dt)
    k_cache = (torch.randn(num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device) * 2.0).to(dt)
    v_cache = torch.randn(num_pages, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dt)
    return [q, k_cache, v_cache, block_table, seq_lens.to(torch.int32)]


def roofline(q, k_cache, v_cache, block_table, seq_lens):
    B, H, D = q.shape
    _, PS, KVH, _ = k_cache.shape
    lens = seq_lens.long()
    tokens = int(lens.sum())
    pages = int(((lens + PS - 1) // PS).sum())
    es = q.element_size()
    flops = 4 * H * D * tokens  # q.k and p.v
    bytes_ = (2 * q.numel() * es  # q in, out
              + 2 * pages * PS * KVH * D * k_cache.element_size()  # referenced k and v pages
              + pages * block_table.element_size() + seq_lens.numel() * seq_lens.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
