"""MLA decode attention (weight-absorbed form) over a paged compressed latent KV cache with page size 1.

Scores q_nope . c_kv + q_pe . k_pe, softmax, output = P . c_kv (the latent output, before the V up-projection).

Provenance: DeepSeek-V3 multi-head latent attention (config.json: num_attention_heads 128, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; rope_scaling yarn factor 40, mscale_all_dim 1.0).
One GPU's slice under tensor parallelism 8: 16 query heads, all sharing the single 576-wide latent KV row.
Softmax scale = (128 + 64)^-0.5 * mscale^2 with mscale = 0.1 * ln(40) + 1 (as in the HF/vLLM DeepSeek code),
about 0.1352. The absorbed query q_nope [.., 512] = q_nope_128 @ W_UK is an input (computed upstream).
Workload: a decode step of 64 requests with contexts drawn uniformly in [1024, 8192] tokens; page size 1
(SGLang / FlashInfer MLA layout: separate ckv and kpe caches, a token-granular page table).
Full scale: q_nope [64, 16, 512], q_pe [64, 16, 64] bf16; ckv_cache [524288, 1, 512], kpe_cache [524288, 1, 64]
bf16 (a fixed pool of 64 * 8192 pages); block_table [64, 8192] int32; seq_lens [64] int32.
Small scale: 4 requests, contexts in [16, 96], block_table [4, 96], pool of 384 pages.
Semantics, for request b, head h: the context is pages block_table[b, :seq_lens[b]] (token order);
s_t = scale * (q_nope[b,h] . ckv[page_t] + q_pe[b,h] . kpe[page_t]); out[b,h] = sum_t softmax(s)_t ckv[page_t].
Entries block_table[b, seq_lens[b]:] are valid page ids that belong to request b but must be ignored.
Precision: the two score matmuls in the input dtype (bf16 operands, fp32 accumulate), summed and softmaxed
in fp32, P rounded to bf16 before P . c_kv. Output bf16 [B, 16, 512].
Facts a kernel may rely on: 16 heads; latent 512 + rope 64; page size 1; block_table rows are distinct page
ids (a random permutation of the pool, no page shared between requests); 1 <= seq_lens[b] <= block_table.shape[1].
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


def reference(q_nope, q_pe, ckv_cache, kpe_cache, block_table, seq_lens):
    dt = q_nope.dtype
    acc = _acc_dtype(dt)
    max_len = block_table.shape[1]
    pages = block_table.long()
    ckv = ckv_cache[:, 0][pages]                                   # [B, L, 512]
    kpe = kpe_cache[:, 0][pages]                                   # [B, L, 64]
    s = (_mm(q_nope, ckv.transpose(1, 2)).to(acc)
         + _mm(q_pe, kpe.transpose(1, 2)).to(acc)) * SOFTMAX_SCALE    # [B, 16, L]
    past_end = torch.arange(max_len, device=s.device)[None, :] >= seq_lens[:, None]
    s = s.masked_fill(past_end[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(dt)
    return _mm(p, ckv)                                            # [B, 16, 512]


def alt_reference(q_nope, q_pe, ckv_cache, kpe_cache, block_table, seq_lens):
    """Per-request loop over exactly the used pages, with the 576-wide concatenated q and k."""
    out = torch.empty_like(q_nope)
    for b in range(q_nope.shape[0]):
        pages = block_table[b, : int(seq_lens[b])].long()
        kv = torch.cat([ckv_cache[pages, 0], kpe_cache[pages, 0]], dim=-1)       # [n, 576]
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1)                                # [16, 576]
        p = torch.softmax(q @ kv.t() * SOFTMAX_SCALE, dim=-1)
        out[b] = p @ ckv_cache[pages, 0]
    return out


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, min_len, max_len = 64, 1024, 8192
    else:
        B, min_len, max_len = 4, 16, 96
    H, R, P = 16, 512, 64
    dt = torch.bfloat16
    num_pages = B * max_len
    seq_lens = torch.randint(min_len, max_len + 1, (B,), device=device, dtype=torch.int32)
    block_table = torch.randperm(num_pages, device=device).view(B, max_len).to(torch.int32)
    # c_kv is RMS-normalised in the model (entries O(1)); k_pe is a rotated projection, O(1) as well.
    ckv_cache = torch.randn(num_pages, 1, R, device=device).to(dt)
    kpe_cache = torch.randn(num_pages, 1, P, device=device).to(dt)
    # absorbed queries: scaled so that the logits are O(1) after SOFTMAX_SCALE
    q_nope = (torch.randn(B, H, R, device=device) * 0.3).to(dt)
    q_pe = (torch.randn(B, H, P, device=device) * 0.3).to(dt)
    return [q_nope, q_pe, ckv_cache, kpe_cache, block_table, seq_lens]


def roofline(q_nope, q_pe, ckv_cache, kpe_cache, block_table, seq_lens):
    B, H, R = q_nope.shape
    P = q_pe.shape[-1]
    tokens = int(seq_lens.long().sum().item())
    flops = 2 * H * tokens * (R + P) + 2 * H * tokens * R
    es = q_nope.element_size()
    nbytes = (q_nope.numel() * es + q_pe.numel() * es
              + tokens * (R + P) * es                            # only the referenced cache rows
              + tokens * block_table.element_size()              # their page ids
              + seq_lens.numel() * seq_lens.element_size()
              + B * H * R * es)                                  # out
    return {"flops": int(flops), "bytes": int(nbytes)}
