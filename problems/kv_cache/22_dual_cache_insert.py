"""Insert new tokens into both caches of a sparse-attention layer: [c_kv ; k_pe] into the MLA cache and the fp8-quantized indexer key (power-of-two scale) into the index cache.

Provenance: DeepSeek-V3.2 sparse attention (config.json: kv_lora_rank 512, qk_rope_head_dim 64, index_head_dim 128,
index_n_heads 64, index_topk 2048). Every layer keeps two paged caches with the same page table: the MLA latent cache
(576 values per token, bf16 here = vLLM kv_cache_dtype "auto") and the lightning-indexer key cache, whose 128-dim
key is stored as fp8 e4m3 with one power-of-two ("ue8m0") fp32 scale per token. vLLM writes them back to back with
`concat_and_cache_mla` and `indexer_k_quant_and_cache` (quant_block_size 128, scale_fmt "ue8m0"); this problem is
the two writes fused. vLLM packs the indexer values and scales into one uint8 page; here they are two tensors
(index_k_cache, index_k_scale) with the same [num_blocks, page] addressing.
Workload: one chunked-prefill step: 8 requests whose token slots sum to 16384, each continuing a random cached
prefix of 0-32768 tokens; page size 64; the last 1-127 token slots are padding (slot -1, not written).
Full scale: kv_c [16384, 512], k_pe [16384, 64], index_k [16384, 128] bf16; kv_cache [4369, 64, 576] bf16;
index_k_cache [4369, 64, 128] float8_e4m3fn; index_k_scale [4369, 64, 1] fp32 (num_blocks = 8 * (32768 // 64 + 2)
+ 16384 // 64 + 1). Small scale: 3 requests, 48 token slots (1-7 padding), prefixes up to 80 tokens, page 16.

Semantics for token t with slot s = slot_mapping[t] >= 0 (page s // page_size, offset s % page_size):
kv_cache[page, offset] = [kv_c[t] ; k_pe[t]]; for the index key (in fp32) amax = max |index_k[t]|,
scale = 2^ceil(log2(max(amax, 1e-4) / 448)) (the smallest power of two >= max(amax, 1e-4) / 448),
index_k_cache[page, offset] = e4m3(index_k[t] / scale) (round to nearest even; |value| <= 448 by construction),
index_k_scale[page, offset, 0] = scale. Slots < 0 write nothing; all other entries stay unchanged.
Outputs (all mutated inputs): kv_cache, index_k_cache (compared dequantized with index_k_scale), index_k_scale.

Facts a kernel may rely on: 512 + 64 = 576 values per MLA entry; index head_dim 128 = one scale block; scales are
exact powers of two (so x / scale is exact before the fp8 rounding); non-negative slots are distinct; negative
slots are -1 and only at the tail; 16384 token slots at full scale.
"""
import torch

KV_LORA_RANK = 512
ROPE_DIM = 64
INDEX_HEAD_DIM = 128
FP8_MAX = 448.0
MIN_AMAX = 1e-4


def _compute_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)


def _pow2_ceil(x):
    # Smallest power of two >= x (x > 0), exact in any float dtype: x = m * 2^e with m in [0.5, 1).
    m, e = torch.frexp(x)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(x), e)


def _store(cache, rows, values):
    """cache.view(-1, *values.shape[1:])[rows] = values in the cache dtype (1-byte dtypes written as raw bytes)."""
    values = values.to(cache.dtype)
    if cache.element_size() == 1:
        cache, values = cache.view(torch.uint8), values.view(torch.uint8)
    cache.view(-1, *values.shape[1:])[rows] = values


def reference(kv_c, k_pe, index_k, slot_mapping, kv_cache, index_k_cache, index_k_scale):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    _store(kv_cache, slots, torch.cat([kv_c[valid], k_pe[valid]], dim=-1))
    k = index_k[valid].to(_compute_dtype(index_k))
    scale = _pow2_ceil(k.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX)
    _store(index_k_cache, slots, (k / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))
    _store(index_k_scale, slots, scale)
    return None


def alt_reference(kv_c, k_pe, index_k, slot_mapping, kv_cache, index_k_cache, index_k_scale):
    """Token-by-token form; the power-of-two scale found with log2/ceil on Python floats."""
    import math
    page = kv_cache.shape[1]
    for t in range(kv_c.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        b, o = s // page, s % page
        kv_cache[b, o, :KV_LORA_RANK] = kv_c[t].to(kv_cache.dtype)
        kv_cache[b, o, KV_LORA_RANK:] = k_pe[t].to(kv_cache.dtype)
        k = index_k[t].to(torch.float64)
        sc = 2.0 ** math.ceil(math.log2(max(float(k.abs().max()), MIN_AMAX) / FP8_MAX))
        q = (k / sc).to(torch.float8_e4m3fn)
        index_k_cache[b, o] = q.to(index_k_cache.dtype) if index_k_cache.element_size() != 1 else q
        index_k_scale[b, o, 0] = sc
    return None


def _ragged_slots(num_reqs, num_tokens, max_ctx, block_size, device):
    """Requests with a FIXED total of new tokens, each continuing a random cached prefix; every request owns
    pages drawn from one random permutation of the cache. Returns positions, slot_mapping, num_blocks."""
    w = torch.rand(num_reqs, device=device) + 0.25
    new = (w / w.sum() * (num_tokens - num_reqs)).floor().long() + 1
    new[-1] += num_tokens - new.sum()
    ctx = torch.randint(0, max_ctx + 1, (num_reqs,), device=device)
    pages = (ctx + new + block_size - 1) // block_size
    num_blocks = num_reqs * (max_ctx // block_size + 2) + num_tokens // block_size + 1  # >= sum(pages)
    perm = torch.randperm(num_blocks, device=device)
    page_start = torch.cumsum(pages, 0) - pages
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), new, output_size=num_tokens)
    first_tok = torch.cumsum(new, 0) - new
    positions = ctx[req] + torch.arange(num_tokens, device=device) - first_tok[req]
    slots = perm[page_start[req] + positions // block_size] * block_size + positions % block_size
    return positions, slots, num_blocks


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        num_reqs, num_tokens, max_ctx, page, max_pad = 8, 16384, 32768, 64, 127
    else:
        num_reqs, num_tokens, max_ctx, page, max_pad = 3, 48, 80, 16, 7
    _, slot_mapping, num_blocks = _ragged_slots(num_reqs, num_tokens, max_ctx, page, device)
    num_pad = torch.randint(1, max_pad + 1, (1,), device=device)
    padded = torch.arange(num_tokens, device=device) >= num_tokens - num_pad
    slot_mapping = torch.where(padded, torch.full_like(slot_mapping, -1), slot_mapping)
    kv_c = torch.randn(num_tokens, KV_LORA_RANK, device=device).to(torch.bfloat16)
    k_pe = torch.randn(num_tokens, ROPE_DIM, device=device).to(torch.bfloat16)
    # Indexer keys after LayerNorm + Hadamard rotation: O(1) entries, per-token spread in magnitude.
    token_gain = torch.exp(0.5 * torch.randn(num_tokens, 1, device=device))
    index_k = (torch.randn(num_tokens, INDEX_HEAD_DIM, device=device) * token_gain).to(torch.bfloat16)
    kv_cache = torch.randn(num_blocks, page, KV_LORA_RANK + ROPE_DIM, device=device).to(torch.bfloat16)
    index_k_cache = (torch.randn(num_blocks, page, INDEX_HEAD_DIM, device=device) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    index_k_scale = torch.exp2(torch.randint(-9, -5, (num_blocks, page, 1), device=device).float())
    return [kv_c, k_pe, index_k, slot_mapping, kv_cache, index_k_cache, index_k_scale]


MUTATES = ("kv_cache", "index_k_cache", "index_k_scale")
COMPARATORS = {
    "index_k_cache": {"kind": "quantized", "scale": "index_k_scale", "block": [1, 1, 0], "format": "float8_e4m3fn"},
}


def roofline(kv_c, k_pe, index_k, slot_mapping, kv_cache, index_k_cache, index_k_scale):
    T = kv_c.shape[0]
    flops = T * INDEX_HEAD_DIM * 3
    bytes_ = (kv_c.numel() * kv_c.element_size() + k_pe.numel() * k_pe.element_size()
              + index_k.numel() * index_k.element_size() + slot_mapping.numel() * slot_mapping.element_size()
              + T * (KV_LORA_RANK + ROPE_DIM) * kv_cache.element_size()
              + T * INDEX_HEAD_DIM * index_k_cache.element_size() + T * index_k_scale.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
