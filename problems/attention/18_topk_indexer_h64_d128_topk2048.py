"""DeepSeek-V3.2 lightning indexer at decode: fp8 index scores over a paged key cache, then the top-2048 positions.

Score of token s: k_scale_s * sum_h w_h * ReLU(q_h . k_s) over the request's paged fp8 key cache.

Provenance: DeepSeek-V3.2-Exp (config.json: index_n_heads 64, index_head_dim 128, index_topk 2048). Its
reference inference code quantizes the indexer queries and the cached indexer keys to fp8 e4m3 with one fp32
scale per 128 values (here: per (token, head) for q, per token for k), folds the q scales, the head weights,
n_heads^-0.5 and head_dim^-0.5 into one fp32 weight per (token, head), and computes
    index_score[s] = k_scale[s] * sum_h weights[h] * ReLU(q_fp8[h] . k_fp8[s])       (fp32 accumulation)
then takes topk(index_score, 2048) over the request's context; DeepGEMM's fp8_paged_mqa_logits does the score
part over a paged cache (page size 64). The selected positions feed sparse MLA (problem 17).
Workload: a decode step of 64 requests with contexts uniform in [4096, 65536] tokens (long-context serving, the
regime the sparse path exists for).
Full scale: q_fp8 [64, 64, 128] float8_e4m3fn, weights [64, 64] fp32, k_cache [65536, 64, 128] float8_e4m3fn,
k_scale [65536, 64] fp32 (a pool of 64 * 1024 pages of 64 tokens), block_table [64, 1024] int32, seq_lens [64]
int32. Small scale: 3 requests, contexts in [2048, 4096], block_table [3, 64], pool of 192 pages.
Output: topk_idx [B, 2048] int32, positions t in [0, seq_lens[b]) of the selected tokens (token t of request b
lives at page block_table[b, t // 64], row t % 64). Order within a row does not matter; the comparator is
tie-aware ("topk" through index_scores) and allows about 3x the reference's own fp32 score error at the
cut-off, so the scores need genuine fp32 accumulation (fp8 e4m3 values are exact in bf16, and products of two
are exact in fp32).
Facts a kernel may rely on: 64 heads, head_dim 128, page size 64, top-k 2048; seq_lens[b] >= 2048 so every
row has 2048 valid picks; block_table rows hold distinct pages (a random permutation of the pool); entries past
ceil(seq_lens[b] / 64) are valid page ids that must be ignored.
"""
import torch

PAGE = 64
TOPK = 2048
FP8_MAX = 448.0

COMPARATORS = {"topk_idx": {"kind": "topk", "scores": "index_scores", "dim": -1}}
OUTPUT_NAMES = ("topk_idx",)


def index_scores(q_fp8, weights, k_cache, k_scale, block_table, seq_lens):
    """[B, max_pages * 64] fp32 index scores (-inf past each request's context): the scores the top-k is taken in."""
    acc = torch.float64 if q_fp8.dtype == torch.float64 else torch.float32
    B, n_pages = block_table.shape
    L = n_pages * PAGE
    pages = block_table.long()
    k = k_cache[pages].reshape(B, L, -1).to(acc)                       # [B, L, 128] (fp8 values, exact)
    ks = k_scale[pages].reshape(B, L).to(acc)                          # [B, L]
    logits = torch.matmul(q_fp8.to(acc), k.transpose(1, 2))            # [B, 64, L]
    score = (torch.relu(logits) * weights.to(acc)[:, :, None]).sum(dim=1) * ks
    past_end = torch.arange(L, device=score.device)[None, :] >= seq_lens[:, None]
    return score.masked_fill(past_end, float("-inf"))


def reference(q_fp8, weights, k_cache, k_scale, block_table, seq_lens):
    score = index_scores(q_fp8, weights, k_cache, k_scale, block_table, seq_lens)
    return torch.topk(score, TOPK, dim=-1).indices.to(torch.int32)


def alt_reference(q_fp8, weights, k_cache, k_scale, block_table, seq_lens):
    """Per-request, per-head loop over exactly the request's context tokens."""
    B, H, D = q_fp8.shape
    out = torch.empty(B, TOPK, dtype=torch.int32, device=q_fp8.device)
    for b in range(B):
        n = int(seq_lens[b])
        pages = block_table[b, : (n + PAGE - 1) // PAGE].long()
        k = k_cache[pages].reshape(-1, D)[:n]
        ks = k_scale[pages].reshape(-1)[:n]
        score = torch.zeros(n, dtype=k.dtype, device=k.device)
        for h in range(H):
            score = score + weights[b, h] * torch.relu(k @ q_fp8[b, h])
        out[b] = torch.topk(score * ks, TOPK).indices.to(torch.int32)
    return out


def _quant_fp8(x):
    """Per-row (last dim) absmax fp8 e4m3 quantization: (values, fp32 scale)."""
    scale = x.abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX
    return (x / scale[..., None]).to(torch.float8_e4m3fn), scale


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, min_len, max_len = 64, 4096, 65536
    else:
        B, min_len, max_len = 3, 2048, 4096
    H, D = 64, 128
    n_pages = max_len // PAGE
    pool = B * n_pages
    seq_lens = torch.randint(min_len, max_len + 1, (B,), device=device, dtype=torch.int32)
    block_table = torch.randperm(pool, device=device).view(B, n_pages).to(torch.int32)
    # keys: LayerNorm-ed, rotated projections (O(1) entries), quantized per token
    k_cache, k_scale = _quant_fp8(torch.randn(pool, PAGE, D, device=device))
    # queries quantized per (token, head); their scales folded into the fp32 head weights
    q_fp8, q_scale = _quant_fp8(torch.randn(B, H, D, device=device))
    weights = torch.randn(B, H, device=device) * H ** -0.5 * D ** -0.5 * q_scale
    return [q_fp8, weights, k_cache, k_scale, block_table, seq_lens]


def roofline(q_fp8, weights, k_cache, k_scale, block_table, seq_lens):
    B, H, D = q_fp8.shape
    tokens = int(seq_lens.long().sum().item())
    pages_used = int(((seq_lens.long() + PAGE - 1) // PAGE).sum().item())
    flops = 2 * H * D * tokens + 3 * H * tokens                      # dots, then relu / weight / head-sum
    nbytes = (q_fp8.numel() * 1 + weights.numel() * 4
              + tokens * (D * 1 + 4)                                 # fp8 keys + fp32 scale of used tokens
              + pages_used * block_table.element_size() + B * 4
              + B * TOPK * 4)                                        # int32 output
    return {"flops": int(flops), "bytes": int(nbytes)}
