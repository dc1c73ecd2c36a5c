"""Sparse MLA decode: each query attends only to its 2048 selected tokens of a paged latent KV cache.

DeepSeek Sparse Attention, absorbed form: the tokens come as flat slot indices (-1 = no token); out = P . c_kv.

Provenance: DeepSeek-V3.2-Exp (config.json: num_attention_heads 128, kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, index_topk 2048; rope_scaling yarn factor 40, mscale_all_dim 1.0). The lightning indexer
(problem 18) picks the top-2048 tokens per query; FlashMLA's sparse kernels then attend to exactly those rows of
the 576-wide latent cache ([c_kv 512 ; k_pe 64], page size 64). One GPU's slice under tensor parallelism 8:
16 query heads. Softmax scale (128 + 64)^-0.5 * (0.1 * ln(40) + 1)^2 ~= 0.1352. The cache is bf16 here (the
production decode path stores it in fp8 with scales; the quantization family covers that).
Workload: a decode step of 128 requests holding 1,048,576 context tokens in total (lengths random, ~750 to
~83k, mostly 1.4k-15k); requests shorter than 2048 tokens select all their tokens and pad with -1.
Full scale: q [128, 16, 576] bf16, kv_cache [16512, 64, 576] bf16 (a pool of 16384 + 128 pages), indices
[128, 2048] int32. Small scale: 3 requests, 24 selected tokens each, 96 context tokens in total, page size 64.
Semantics, for request b, head h: rows = kv_cache.view(-1, 576)[indices[b, j]] for the j with indices[b, j] >= 0;
s_j = scale * q[b,h] . row_j (all 576 dims); out[b,h] = sum_j softmax(s)_j row_j[:512].
Precision: QK^T in bf16 (fp32 accumulate), softmax in fp32, P rounded to bf16 before P . c_kv.
Output bf16 [B, 16, 512].
Facts a kernel may rely on: 16 heads; 576 = 512 + 64 with the output taken from the first 512 columns; page
size 64; every row of indices has at least one valid entry, no repeated slot, and its valid entries point at
distinct tokens of the request's own pages; -1 entries may sit anywhere in the row; indices.shape[1] = 2048
(full) / 24 (small).
"""
import math

import torch

SOFTMAX_SCALE = (128 + 64) ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2
PAGE = 64


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def reference(q, kv_cache, indices):
    dt = q.dtype
    acc = _acc_dtype(dt)
    D, R = q.shape[-1], 512
    rows = kv_cache.reshape(-1, D)
    valid = indices >= 0
    kv = rows[indices.clamp(min=0).long()]                           # [B, K, 576]
    s = _mm(q, kv.transpose(1, 2)).to(acc) * SOFTMAX_SCALE            # [B, 16, K]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(dt)
    return _mm(p, kv[..., :R])                                       # [B, 16, 512]


def alt_reference(q, kv_cache, indices):
    """Per-request loop over the valid indices only."""
    rows = kv_cache.reshape(-1, q.shape[-1])
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    for b in range(q.shape[0]):
        sel = indices[b][indices[b] >= 0].long()
        kv = rows[sel]
        p = torch.softmax(q[b] @ kv.t() * SOFTMAX_SCALE, dim=-1)
        out[b] = p @ kv[:, :512]
    return out


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, total_ctx, topk = 128, 1 << 20, 2048
    else:
        B, total_ctx, topk = 3, 96, 24
    H, D = 16, 576
    dt = torch.bfloat16
    # context lengths: random shares (weights 0.1 + U[0, 1)) of a fixed total
    w = 0.1 + torch.rand(B, device=device)
    ctx = torch.floor(w / w.sum() * total_ctx).long().clamp(min=1)
    ctx[-1] = total_ctx - ctx[:-1].sum()
    n_pages = (ctx + PAGE - 1) // PAGE
    pool = total_ctx // PAGE + B                                   # >= sum of n_pages
    first_page = torch.cumsum(n_pages, 0) - n_pages                # each request owns a run of the permutation
    perm = torch.randperm(pool, device=device)
    # the selected positions: a random subset of min(ctx, topk) positions of each request, in random order
    width = total_ctx                                              # static bound on any context length
    r = torch.rand(B, width, device=device)
    r = r.masked_fill(torch.arange(width, device=device)[None, :] >= ctx[:, None], -1.0)
    val, pos = torch.topk(r, topk, dim=-1)
    shuffle = torch.argsort(torch.rand(B, topk, device=device), dim=-1)
    val, pos = torch.gather(val, 1, shuffle), torch.gather(pos, 1, shuffle)
    pos = torch.where(val >= 0, pos, torch.zeros_like(pos))       # padding picks (-1 below) may lie past ctx
    page = perm[first_page[:, None] + pos // PAGE]
    slots = page * PAGE + pos % PAGE
    indices = torch.where(val >= 0, slots, torch.full_like(slots, -1)).to(torch.int32)
    kv_cache = torch.randn(pool, PAGE, D, device=device).to(dt)
    q = (torch.randn(B, H, D, device=device) * 0.3).to(dt)
    return [q, kv_cache, indices]


def roofline(q, kv_cache, indices):
    B, H, D = q.shape
    n = int((indices >= 0).sum().item())
    flops = 2 * H * n * D + 2 * H * n * 512
    es = q.element_size()
    nbytes = q.numel() * es + n * D * es + indices.numel() * indices.element_size() + B * H * 512 * es
    return {"flops": int(flops), "bytes": int(nbytes)}
