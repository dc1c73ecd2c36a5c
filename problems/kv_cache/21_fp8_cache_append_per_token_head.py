"""Dynamically quantize new K and V to fp8 e4m3 with one scale per (token, kv head) and append values and scales to a paged cache.

Provenance: fp8 KV-cache serving with dynamic per-token-per-head scales (the granularity of LMDeploy's online KV
quantization, which is asymmetric int8/int4; here symmetric e4m3, Hopper's native fp8), in vLLM's paged layout: values [num_blocks, block_size,
num_kv_heads, head_dim], one fp32 scale per cached (token, head) next to it; padded tokens carry slot -1 and are
skipped, as in vLLM's `reshape_and_cache_flash`. Head layout of Llama-3.1-8B (config.json: num_key_value_heads 8,
head_dim 128 = hidden_size 4096 / 32 heads).
Workload: one mixed chunked-prefill step of 16384 token slots from 32 requests (each continuing a random cached
prefix of 0-16384 tokens), page size 16; the last 1-127 token slots are padding (slot -1).
Full scale: key, value [16384, 8, 128] bf16; k_cache, v_cache [33857, 16, 8, 128] float8_e4m3fn; k_scale_cache,
v_scale_cache [33857, 16, 8, 1] fp32 (num_blocks = 32 * (16384 // 16 + 2) + 16384 // 16 + 1).
Small scale: 4 requests, 64 token slots (1-7 padding), prefixes up to 48 tokens, same head layout.

Quantization, per token t and kv head h (in fp32): amax = max_d |x[t, h, d]|; scale = max(amax, 1e-6) / 448;
q = clamp(x / scale, -448, 448) rounded to e4m3 (round to nearest even). The cache slot slot_mapping[t] receives q
and scale; slots < 0 are not written; every other cache entry stays as it was.
Outputs (all mutated inputs): k_cache, v_cache (compared after dequantization with their scale caches, tolerance
1 e4m3 ulp) and k_scale_cache, v_scale_cache.

Facts a kernel may rely on: 8 kv heads x head_dim 128; page size 16; the scale block is one head vector (128 values);
non-negative slots are distinct (no write conflicts); negative slots only occur at the tail (padding) and are -1;
16384 token slots at full scale.
"""
import torch

NUM_KV_HEADS = 8
HEAD_DIM = 128
FP8_MAX = 448.0
MIN_AMAX = 1e-6


def _compute_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)


def _quantize_per_head(x):
    xf = x.to(_compute_dtype(x))
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _store(cache, rows, values):
    """cache.view(-1, *values.shape[1:])[rows] = values in the cache dtype (1-byte dtypes written as raw bytes)."""
    values = values.to(cache.dtype)
    if cache.element_size() == 1:
        cache, values = cache.view(torch.uint8), values.view(torch.uint8)
    cache.view(-1, *values.shape[1:])[rows] = values


def reference(key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    for x, cache, scale_cache in ((key, k_cache, k_scale_cache), (value, v_cache, v_scale_cache)):
        q, scale = _quantize_per_head(x[valid])
        _store(cache, slots, q)
        _store(scale_cache, slots, scale)
    return None


def alt_reference(key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache):
    """Token-by-token, head-by-head form with explicit block/offset addressing."""
    block_size = k_cache.shape[1]
    for t in range(key.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        b, o = s // block_size, s % block_size
        for x, cache, scale_cache in ((key, k_cache, k_scale_cache), (value, v_cache, v_scale_cache)):
            for h in range(NUM_KV_HEADS):
                v = x[t, h].to(_compute_dtype(x))
                sc = max(float(v.abs().max()), MIN_AMAX) / FP8_MAX
                q = torch.clamp(v / sc, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
                cache[b, o, h] = q.to(cache.dtype) if cache.element_size() != 1 else q.view(torch.uint8).view(cache.dtype)
                scale_cache[b, o, h, 0] = sc
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
        num_reqs, num_tokens, max_ctx, max_pad = 32, 16384, 16384, 127
    else:
        num_reqs, num_tokens, max_ctx, max_pad = 4, 64, 48, 7
    block_size = 16
    _, slot_mapping, num_blocks = _ragged_slots(num_reqs, num_tokens, max_ctx, block_size, device)
    num_pad = torch.randint(1, max_pad + 1, (1,), device=device)
    padded = torch.arange(num_tokens, device=device) >= num_tokens - num_pad
    slot_mapping = torch.where(padded, torch.full_like(slot_mapping, -1), slot_mapping)
    # Post-RoPE keys have a few large channels; values are plain activations.
    channel_gain = 1.0 + 3.0 * torch.rand(NUM_KV_HEADS, HEAD_DIM, device=device).pow(8)
    key = (torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=device) * channel_gain).to(torch.bfloat16)
    value = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=device).to(torch.bfloat16)
    cache_shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = (torch.randn(cache_shape, device=device) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    v_cache = (torch.randn(cache_shape, device=device) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    k_scale_cache = torch.rand(num_blocks, block_size, NUM_KV_HEADS, 1, device=device) * 0.02 + 0.002
    v_scale_cache = torch.rand(num_blocks, block_size, NUM_KV_HEADS, 1, device=device) * 0.01 + 0.002
    return [key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache]


MUTATES = ("k_cache", "v_cache", "k_scale_cache", "v_scale_cache")
COMPARATORS = {
    "k_cache": {"kind": "quantized", "scale": "k_scale_cache", "block": [1, 1, 1, 0], "format": "float8_e4m3fn"},
    "v_cache": {"kind": "quantized", "scale": "v_scale_cache", "block": [1, 1, 1, 0], "format": "float8_e4m3fn"},
}


def roofline(key, value, slot_mapping, k_cache, v_cache, k_scale_cache, v_scale_cache):
    T = key.shape[0]
    n = 2 * T * NUM_KV_HEADS * HEAD_DIM
    flops = n * 3  # |x| + max, divide, clamp
    bytes_ = (n * key.element_size() + slot_mapping.numel() * slot_mapping.element_size()
              + n * k_cache.element_size() + 2 * T * NUM_KV_HEADS * k_scale_cache.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
