"""One-token GQA decode attention with head_dim 256 over a paged KV cache with 64-token pages.

Provenance: the full-attention layers of Qwen3-Next-80B-A3B (config.json: num_attention_heads 16,
num_key_value_heads 2, head_dim 256, full_attention_interval 4 -- every 4th layer is softmax attention, the rest
gated DeltaNet). Softmax scale 1/sqrt(256). Query head h reads kv head h // 8. The model's sigmoid output gate
and o_proj come after this op and are not part of it.
Workload: long-context decode, the regime this hybrid model is built for: 32 running requests with 1k-31k cached
tokens (mean 16k). Page size 64 (large pages, as used for long contexts by FlashInfer/SGLang-style caches).
Cache layout: [num_pages, page_size, num_kv_heads, head_dim].

Inputs
  q            [B, 16, 256] bf16       one query token per request (RoPE already applied)
  k_cache      [P, 64, 2, 256] bf16    pool of cache pages (more pages than in use)
  v_cache      [P, 64, 2, 256] bf16
  block_table  [B, 512] int32          block_table[b, j] = page holding tokens 64j .. 64j+63 of request b, for
                                       j < ceil(seq_lens[b] / 64); later entries are padding (0), not to be used.
                                       Slots of the last page past seq_lens[b] hold stale data and must be masked.
  seq_lens     [B] int32               context length of each request (>= 1)
Output
  out          [B, 16, 256] bf16       softmax(q k^T / sqrt(256)) v per request and head, fp32 (or wider)
                                       accumulation, rounded to q.dtype once at the end.

Full scale: B = 32, seq_lens in [1024, 31744] summing to exactly 524288 (mean 16384), P = 10240 pages (1.25x the
tokens in use), block_table width 512 (32768 tokens). Small scale: B = 3, seq_lens in [10, 190] summing to 300,
P = 12, block_table width 3.
Facts a kernel may rely on: head_dim 256; 16 query heads, 2 kv heads (8 query heads per kv head); page_size 64;
sum(seq_lens) is fixed (524288 at full scale); every request owns distinct pages drawn at random from the pool
(any page order); ceil(seq_lens[b] / 64) <= block_table.shape[1].
"""
import math

import torch

NUM_HEADS = 16
NUM_KV_HEADS = 2
HEAD_DIM = 256
PAGE_SIZE = 64


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
        B, mean, half, max_blocks, num_pages = 32, 16384, 15360, 512, 10240
    else:
        B, mean, half, max_blocks, num_pages = 3, 100, 90, 3, 12
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
