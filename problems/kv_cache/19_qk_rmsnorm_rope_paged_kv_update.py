"""Split a fused QKV projection, apply per-head RMSNorm and NeoX RoPE to q and k, and scatter k, v into a paged cache.

Provenance: Qwen3-8B self-attention (config.json: num_attention_heads 32, num_key_value_heads 8, head_dim 128,
rms_norm_eps 1e-6, rope_theta 1e6, rope_scaling null, max_position_embeddings 40960). Qwen3 applies an RMSNorm
over each head's 128 channels of q and k (q_norm / k_norm, one weight vector shared by all heads) before rotary
embedding; the rotary embedding is the NeoX ("rotate half") form. vLLM then stores k and v into its paged cache
with `reshape_and_cache_flash` (layout [num_blocks, block_size, num_kv_heads, head_dim], slot = block * block_size
+ offset). This problem is that whole pre-attention epilogue fused: qkv_proj output -> (q for attention, cache).
Workload: one chunked-prefill step of a vLLM server (max_num_batched_tokens 8192): 24 requests whose new tokens
sum to 8192, each continuing a random cached prefix of 0-8192 tokens; page size 16.
Full scale: qkv [8192, 6144] bf16; k_cache/v_cache [num_blocks, 16, 8, 128] bf16 with num_blocks = 24 * (8192 // 16
+ 2) + 8192 // 16 + 1 = 12849; cos_sin_cache [40960, 128] fp32. Small scale: 4 requests, 64 new tokens, prefixes
up to 48 tokens, same head layout.

Inputs: qkv [T, (32 + 2 * 8) * 128] = [q | k | v]; q_norm_weight, k_norm_weight [128]; cos_sin_cache
[max_pos, 128] = [cos | sin] of the 64 rotary frequencies (fp32, vLLM's layout); positions [T] int64;
slot_mapping [T] int64; k_cache, v_cache (updated in place).
Output: q after RMSNorm + RoPE, [T, 32, 128] in qkv's dtype; k_cache / v_cache hold the normed+roped k and the raw
v at the slots in slot_mapping (stored in the cache dtype), everything else unchanged.
Intermediate precision: the reference keeps norm and rotary math in fp32 and rounds once at the end (Qwen3's HF
code rounds the normed value to bf16 before the weight multiply; either is within tolerance).

Facts a kernel may rely on: 32 q heads, 8 kv heads, head_dim 128 (the RMSNorm is over exactly 128 channels), rotary
dim 128 (the whole head), page size 16; all slots in slot_mapping are >= 0 and distinct (no write conflicts);
positions[i] < cos_sin_cache.shape[0]; T = 8192 tokens at full scale.
"""
import torch

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
RMS_EPS = 1e-6
ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 40960


def _compute_dtype(x):
    # fp32 for bf16/fp16/fp32 inputs, fp64 when the grader upcasts everything to float64.
    return torch.promote_types(x.dtype, torch.float32)


def _rms_norm(x, weight, eps):
    xf = x.to(_compute_dtype(x))
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xf * inv * weight.to(xf.dtype)


def _rope_neox(x, cos, sin):
    # x [T, H, D]; cos, sin [T, D/2]. Pairs (i, i + D/2) rotate by the angle of frequency i.
    x1, x2 = x.chunk(2, dim=-1)
    c = cos.unsqueeze(1)
    s = sin.unsqueeze(1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def reference(qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, slot_mapping, k_cache, v_cache):
    T = qkv.shape[0]
    q, k, v = qkv.split([NUM_Q_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM], dim=-1)
    q = _rms_norm(q.reshape(T, NUM_Q_HEADS, HEAD_DIM), q_norm_weight, RMS_EPS)
    k = _rms_norm(k.reshape(T, NUM_KV_HEADS, HEAD_DIM), k_norm_weight, RMS_EPS)
    cos, sin = cos_sin_cache[positions].to(q.dtype).chunk(2, dim=-1)
    q = _rope_neox(q, cos, sin)
    k = _rope_neox(k, cos, sin)
    num_blocks, block_size = k_cache.shape[:2]
    k_cache.view(num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM)[slot_mapping] = (
        v.reshape(T, NUM_KV_HEADS, HEAD_DIM).to(v_cache.dtype))
    return q.to(qkv.dtype)


def alt_reference(qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, slot_mapping, k_cache, v_cache):
    """Independent form: torch's rms_norm, RoPE as complex multiplication, cache writes token by token."""
    T = qkv.shape[0]
    x = qkv.to(_compute_dtype(qkv)).view(T, NUM_Q_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM)
    q = torch.nn.functional.rms_norm(x[:, :NUM_Q_HEADS], (HEAD_DIM,), q_norm_weight.to(x.dtype), RMS_EPS)
    k = torch.nn.functional.rms_norm(x[:, NUM_Q_HEADS:NUM_Q_HEADS + NUM_KV_HEADS], (HEAD_DIM,),
                                     k_norm_weight.to(x.dtype), RMS_EPS)
    v = x[:, NUM_Q_HEADS + NUM_KV_HEADS:]
    half = HEAD_DIM // 2
    cs = cos_sin_cache[positions].to(x.dtype)
    rot = torch.complex(cs[:, :half], cs[:, half:]).unsqueeze(1)  # e^{i * angle}

    def rope(t):
        z = torch.complex(t[..., :half], t[..., half:]) * rot
        return torch.cat([z.real, z.imag], dim=-1)

    q, k = rope(q), rope(k)
    block_size = k_cache.shape[1]
    for i in range(T):
        s = int(slot_mapping[i])
        k_cache[s // block_size, s % block_size] = k[i].to(k_cache.dtype)
        v_cache[s // block_size, s % block_size] = v[i].to(v_cache.dtype)
    return q.to(qkv.dtype)


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
        num_reqs, num_tokens, max_ctx = 24, 8192, 8192
    else:
        num_reqs, num_tokens, max_ctx = 4, 64, 48
    block_size = 16
    positions, slot_mapping, num_blocks = _ragged_slots(num_reqs, num_tokens, max_ctx, block_size, device)
    width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    qkv = torch.randn(num_tokens, width, device=device).to(torch.bfloat16)
    q_norm_weight = (1.0 + 0.1 * torch.randn(HEAD_DIM, device=device)).to(torch.bfloat16)
    k_norm_weight = (1.0 + 0.1 * torch.randn(HEAD_DIM, device=device)).to(torch.bfloat16)
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM))
    angles = torch.outer(torch.arange(MAX_POSITIONS, device=device, dtype=torch.float32), inv_freq)
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    cache_shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(cache_shape, device=device).to(torch.bfloat16)
    v_cache = torch.randn(cache_shape, device=device).to(torch.bfloat16)
    return [qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, slot_mapping, k_cache, v_cache]


MUTATES = ("k_cache", "v_cache")
OUTPUT_NAMES = ("q",)


def roofline(qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, slot_mapping, k_cache, v_cache):
    T = qkv.shape[0]
    nq, nk = T * NUM_Q_HEADS * HEAD_DIM, T * NUM_KV_HEADS * HEAD_DIM
    flops = (nq + nk) * (4 + 3)  # RMSNorm: square, sum, scale, weight; RoPE: 2 mul + 1 add per element
    el = qkv.element_size()
    bytes_ = (qkv.numel() * el + 2 * HEAD_DIM * q_norm_weight.element_size()
              + T * cos_sin_cache.shape[1] * cos_sin_cache.element_size()
              + positions.numel() * positions.element_size() + slot_mapping.numel() * slot_mapping.element_size()
              + nq * el  # q out
              + 2 * nk * k_cache.element_size())  # k, v written into the cache
    return {"flops": int(flops), "bytes": int(bytes_)}
