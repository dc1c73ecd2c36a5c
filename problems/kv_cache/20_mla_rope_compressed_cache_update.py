"""MLA pre-attention epilogue: RMSNorm the compressed KV latent, RoPE k_pe and q_pe (interleaved, YaRN), write [c_kv ; k_pe] into the paged cache.

Provenance: DeepSeek-V3 multi-head latent attention (config.json: kv_lora_rank 512, qk_nope_head_dim 128,
qk_rope_head_dim 64, num_attention_heads 128, rms_norm_eps 1e-6, rope_theta 10000, rope_scaling yarn with factor
40, original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 1.0, so the YaRN
attention factor on cos/sin is exactly 1; max_position_embeddings 163840). kv_a_proj_with_mqa produces, per token,
576 values = [c_kv (512) | k_pe (64)]; c_kv goes through kv_a_layernorm (an RMSNorm), k_pe and the rope part of every
query head get the rotary embedding in the interleaved (GPT-J, vLLM is_neox_style=False) form, and vLLM's
`concat_and_cache_mla` writes [c_kv ; k_pe] (576 values) into one cache entry per token. The rotary embedding of q
is done in place on the last 64 channels of each q head, as in vLLM.
Workload: one chunked-prefill step on one GPU of a TP8 deployment (128 heads / 8 = 16 local heads): 8 requests
whose new tokens sum to 16384, each continuing a random cached prefix of 0-32768 tokens; FlashMLA page size 64.
Full scale: q [16384, 16, 192] bf16; kv_latent [16384, 576] bf16; kv_cache [4369, 64, 576] bf16 (num_blocks =
8 * (32768 // 64 + 2) + 16384 // 64 + 1); cos_sin_cache [163840, 64] fp32. Small scale: 3 requests, 48 new tokens,
prefixes up to 80 tokens, 2 local heads, page size 16, cache positions up to 4096.

Inputs: q [T, H, 192] = [q_nope (128) | q_pe (64)] per head (mutated: q_pe is rotated in place, q_nope unchanged);
kv_latent [T, 576]; kv_norm_weight [512]; cos_sin_cache [max_pos, 64] = [cos | sin] of the 32 rotary frequencies
(fp32, YaRN-scaled, vLLM's layout); positions [T] int64; slot_mapping [T] int64; kv_cache [num_blocks, page, 576]
(mutated). Returns nothing: the outputs are the updated q and kv_cache.
Interleaved rotary: channel pair (2i, 2i+1) rotates by positions * inv_freq[i]:
out[2i] = x[2i] cos - x[2i+1] sin, out[2i+1] = x[2i+1] cos + x[2i] sin.

Facts a kernel may rely on: latent 512 + rope 64 = 576 values per cache entry; 192 = 128 + 64 per q head;
the RMSNorm covers exactly the first 512 values of kv_latent; all slots are >= 0 and distinct; positions index
cos_sin_cache in range; T = 16384 and 16 heads at full scale.
"""
import math

import torch

KV_LORA_RANK = 512
ROPE_DIM = 64
NOPE_DIM = 128
RMS_EPS = 1e-6


def _compute_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)


def _rms_norm(x, weight, eps):
    xf = x.to(_compute_dtype(x))
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xf * inv * weight.to(xf.dtype)


def _rope_interleaved(x, cos, sin):
    # x [..., 64]; cos, sin broadcastable to [..., 32].
    pairs = x.unflatten(-1, (-1, 2))
    xe, xo = pairs[..., 0], pairs[..., 1]
    return torch.stack([xe * cos - xo * sin, xo * cos + xe * sin], dim=-1).flatten(-2)


def reference(q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache):
    cdt = _compute_dtype(q)
    cos, sin = cos_sin_cache[positions].to(cdt).chunk(2, dim=-1)  # [T, 32] each
    q_pe = q[..., NOPE_DIM:].to(cdt)
    q[..., NOPE_DIM:] = _rope_interleaved(q_pe, cos.unsqueeze(1), sin.unsqueeze(1)).to(q.dtype)
    c_kv, k_pe = kv_latent.split([KV_LORA_RANK, ROPE_DIM], dim=-1)
    c_kv = _rms_norm(c_kv, kv_norm_weight, RMS_EPS)
    k_pe = _rope_interleaved(k_pe.to(cdt), cos, sin)
    entry = torch.cat([c_kv, k_pe], dim=-1).to(kv_cache.dtype)
    kv_cache.view(-1, KV_LORA_RANK + ROPE_DIM)[slot_mapping] = entry
    return None


def alt_reference(q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache):
    """Independent form: torch's rms_norm, RoPE as complex multiplication of channel pairs, per-token writes."""
    cdt = _compute_dtype(q)
    half = ROPE_DIM // 2
    cs = cos_sin_cache[positions].to(cdt)
    rot = torch.complex(cs[:, :half], cs[:, half:])  # [T, 32]

    def rope(x, r):
        z = torch.view_as_complex(x.to(cdt).contiguous().unflatten(-1, (half, 2))) * r
        return torch.view_as_real(z).flatten(-2)

    q[..., NOPE_DIM:] = rope(q[..., NOPE_DIM:], rot.unsqueeze(1)).to(q.dtype)
    c_kv = torch.nn.functional.rms_norm(kv_latent[:, :KV_LORA_RANK].to(cdt), (KV_LORA_RANK,),
                                        kv_norm_weight.to(cdt), RMS_EPS)
    k_pe = rope(kv_latent[:, KV_LORA_RANK:], rot)
    page = kv_cache.shape[1]
    for i in range(kv_latent.shape[0]):
        s = int(slot_mapping[i])
        kv_cache[s // page, s % page, :KV_LORA_RANK] = c_kv[i].to(kv_cache.dtype)
        kv_cache[s // page, s % page, KV_LORA_RANK:] = k_pe[i].to(kv_cache.dtype)
    return None


def _yarn_cos_sin_cache(max_pos, device, base=10000.0, factor=40.0, orig_max=4096, beta_fast=32, beta_slow=1):
    """DeepSeek-V3's YaRN rotary table [max_pos, 64] = [cos | sin] (mscale ratio is 1 for V3)."""
    dim = ROPE_DIM
    pos_freqs = base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(num_rotations):
        return dim * math.log(orig_max / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, device=device, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    keep_extrapolated = 1.0 - ramp
    inv_freq = interpolation * (1 - keep_extrapolated) + extrapolation * keep_extrapolated
    angles = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


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
        num_reqs, num_tokens, max_ctx, heads, page, max_pos = 8, 16384, 32768, 16, 64, 163840
    else:
        num_reqs, num_tokens, max_ctx, heads, page, max_pos = 3, 48, 80, 2, 16, 4096
    positions, slot_mapping, num_blocks = _ragged_slots(num_reqs, num_tokens, max_ctx, page, device)
    q = torch.randn(num_tokens, heads, NOPE_DIM + ROPE_DIM, device=device).to(torch.bfloat16)
    kv_latent = torch.randn(num_tokens, KV_LORA_RANK + ROPE_DIM, device=device).to(torch.bfloat16)
    kv_norm_weight = (1.0 + 0.1 * torch.randn(KV_LORA_RANK, device=device)).to(torch.bfloat16)
    cos_sin_cache = _yarn_cos_sin_cache(max_pos, device)
    kv_cache = torch.randn(num_blocks, page, KV_LORA_RANK + ROPE_DIM, device=device).to(torch.bfloat16)
    return [q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache]


MUTATES = ("q", "kv_cache")


def roofline(q, kv_latent, kv_norm_weight, cos_sin_cache, positions, slot_mapping, kv_cache):
    T, H = q.shape[:2]
    flops = T * H * ROPE_DIM * 3 + T * (KV_LORA_RANK * 4 + ROPE_DIM * 3)
    bytes_ = (2 * T * H * ROPE_DIM * q.element_size()  # q_pe read + written back
              + kv_latent.numel() * kv_latent.element_size() + KV_LORA_RANK * kv_norm_weight.element_size()
              + T * ROPE_DIM * cos_sin_cache.element_size()
              + positions.numel() * positions.element_size() + slot_mapping.numel() * slot_mapping.element_size()
              + T * (KV_LORA_RANK + ROPE_DIM) * kv_cache.element_size())
    return {"flops": int(flops), "bytes": int(bytes_)}
