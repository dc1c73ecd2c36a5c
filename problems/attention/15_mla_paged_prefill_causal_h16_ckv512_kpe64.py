"""Causal MLA chunked prefill (weight-absorbed form) over a paged compressed latent KV cache with page size 1.

New tokens on top of a cached prefix; scores q_nope . c_kv + q_pe . k_pe, causal softmax, output = P . c_kv.

Provenance: DeepSeek-V3 multi-head latent attention (config.json: num_attention_heads 128, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64; rope_scaling yarn factor 40, mscale_all_dim 1.0), one GPU's slice
under tensor parallelism 8: 16 query heads sharing the single 576-wide latent KV row. Softmax scale
(128 + 64)^-0.5 * (0.1 * ln(40) + 1)^2 ~= 0.1352. The absorbed query q_nope = q_nope_128 @ W_UK is an input.
Workload: one chunked-prefill step of 8 requests, 8192 new tokens in total (a usual max_num_batched_tokens),
each request's chunk a random share (372-2465 tokens, mostly 600-1500), on top of a cached prefix of 0-4096
tokens. The new tokens' latent rows
are already written to the cache (last kv_lens[r] - q_len[r] .. kv_lens[r] - 1 positions of the request).
Full scale: q_nope [8192, 16, 512], q_pe [8192, 16, 64] bf16; ckv_cache [52488, 1, 512], kpe_cache
[52488, 1, 64] bf16 (a fixed pool of 8 * 6561 pages); block_table [8, 6561] int32; qo_indptr [9] int32;
kv_lens [8] int32. Small scale: 3 requests, 48 new tokens, prefixes of 0-32 tokens.
Semantics, for request r with q_len = qo_indptr[r+1] - qo_indptr[r], kv_len = kv_lens[r] and its i-th new token
(absolute position kv_len - q_len + i), head h: keys are pages block_table[r, t] for t <= kv_len - q_len + i;
s_t = scale * (q_nope . ckv[page_t] + q_pe . kpe[page_t]); out = sum_t softmax(s)_t ckv[page_t].
Precision: score matmuls in bf16 (fp32 accumulate), sum and softmax in fp32, P rounded to bf16 before P . c_kv.
Output bf16 [8192, 16, 512].
Facts a kernel may rely on: 16 heads; latent 512 + rope 64; page size 1; block_table rows are distinct page ids
(a random permutation of the pool); total new tokens 8192 (full) / 48 (small) = qo_indptr[-1]; qo_indptr[0] = 0;
q_len[r] <= kv_lens[r] <= block_table.shape[1]; 8 requests (full) / 3 (small).
"""
import math

import torch

SOFTMAX_SCALE = (128 + 64) ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def reference(q_nope, q_pe, ckv_cache, kpe_cache, block_table, qo_indptr, kv_lens):
    dt = q_nope.dtype
    acc = _acc_dtype(dt)
    out = torch.empty_like(q_nope)
    starts = qo_indptr.tolist()
    lens = kv_lens.tolist()
    for r in range(len(lens)):
        q0, q1, kv_len = starts[r], starts[r + 1], lens[r]
        q_len = q1 - q0
        pages = block_table[r, :kv_len].long()
        ckv = ckv_cache[pages, 0]                                      # [kv_len, 512]
        kpe = kpe_cache[pages, 0]                                      # [kv_len, 64]
        qn = q_nope[q0:q1].transpose(0, 1)                             # [16, q_len, 512]
        qp = q_pe[q0:q1].transpose(0, 1)                               # [16, q_len, 64]
        s = (_mm(qn, ckv.t()).to(acc) + _mm(qp, kpe.t()).to(acc)) * SOFTMAX_SCALE   # [16, q_len, kv_len]
        q_pos = torch.arange(kv_len - q_len, kv_len, device=s.device)
        future = torch.arange(kv_len, device=s.device)[None, :] > q_pos[:, None]
        s = s.masked_fill(future, float("-inf"))
        p = torch.softmax(s, dim=-1).to(dt)
        out[q0:q1] = _mm(p, ckv).transpose(0, 1)
    return out


def alt_reference(q_nope, q_pe, ckv_cache, kpe_cache, block_table, qo_indptr, kv_lens):
    """One dense masked attention over all requests: every query against the concatenated contexts of all
    requests, masked to (same request) and (key position <= query position)."""
    R = kv_lens.shape[0]
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).long()
    kvl = kv_lens.long()
    q_req = torch.repeat_interleave(torch.arange(R, device=q_nope.device), q_lens)
    q_pos = torch.cat([torch.arange(int(kvl[r] - q_lens[r]), int(kvl[r]), device=q_nope.device) for r in range(R)])
    k_req = torch.repeat_interleave(torch.arange(R, device=q_nope.device), kvl)
    k_pos = torch.cat([torch.arange(int(kvl[r]), device=q_nope.device) for r in range(R)])
    pages = block_table.long()[k_req, k_pos]
    kv = torch.cat([ckv_cache[pages, 0], kpe_cache[pages, 0]], dim=-1)          # [sum kv, 576]
    q = torch.cat([q_nope, q_pe], dim=-1)                                        # [T, 16, 576]
    s = torch.einsum("thc,kc->htk", q, kv) * SOFTMAX_SCALE
    ok = (q_req[:, None] == k_req[None, :]) & (k_pos[None, :] <= q_pos[:, None])
    s = s.masked_fill(~ok, float("-inf"))
    return torch.einsum("htk,kc->thc", torch.softmax(s, dim=-1), ckv_cache[pages, 0])


def _split_total(n_parts, total, device):
    """Random positive integer parts summing exactly to total (weights in [0.5, 1.5))."""
    w = 0.5 + torch.rand(n_parts, device=device)
    parts = torch.floor(w / w.sum() * total).long().clamp(min=1)
    parts[-1] = total - parts[:-1].sum()
    return parts


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        R, total_q, max_prefix = 8, 8192, 4096
    else:
        R, total_q, max_prefix = 3, 48, 32
    H, C, P = 16, 512, 64
    dt = torch.bfloat16
    q_lens = _split_total(R, total_q, device)
    prefix = torch.randint(0, max_prefix + 1, (R,), device=device)
    kv_lens = (prefix + q_lens).to(torch.int32)
    qo_indptr = torch.zeros(R + 1, dtype=torch.int32, device=device)
    qo_indptr[1:] = torch.cumsum(q_lens, 0).to(torch.int32)
    # a chunk is at most 1.5 / (1.5 + 0.5 (R - 1)) = 3 / (R + 2) of the total (+ R from the rounding)
    max_pages = max_prefix + (3 * total_q) // (R + 2) + R
    num_pages = R * max_pages
    block_table = torch.randperm(num_pages, device=device).view(R, max_pages).to(torch.int32)
    ckv_cache = torch.randn(num_pages, 1, C, device=device).to(dt)
    kpe_cache = torch.randn(num_pages, 1, P, device=device).to(dt)
    q_nope = (torch.randn(total_q, H, C, device=device) * 0.3).to(dt)
    q_pe = (torch.randn(total_q, H, P, device=device) * 0.3).to(dt)
    return [q_nope, q_pe, ckv_cache, kpe_cache, block_table, qo_indptr, kv_lens]


def roofline(q_nope, q_pe, ckv_cache, kpe_cache, block_table, qo_indptr, kv_lens):
    T, H, C = q_nope.shape
    P = q_pe.shape[-1]
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).long()
    kvl = kv_lens.long()
    prefix = kvl - q_lens
    # causal pairs: query i of request r sees prefix + i + 1 keys
    pairs = int((q_lens * prefix + q_lens * (q_lens + 1) // 2).sum().item())
    flops = 2 * H * pairs * (C + P) + 2 * H * pairs * C
    es = q_nope.element_size()
    tokens = int(kvl.sum().item())
    nbytes = (q_nope.numel() * es + q_pe.numel() * es
              + tokens * (C + P) * es + tokens * block_table.element_size()
              + qo_indptr.numel() * 4 + kv_lens.numel() * 4
              + T * H * C * es)
    return {"flops": int(flops), "bytes": int(nbytes)}
