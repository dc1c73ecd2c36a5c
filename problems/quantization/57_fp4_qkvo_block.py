"""Llama attention block with NVFP4 (software-emulated, weight-only on Hopper) QKV and O projections around causal
GQA attention over a ragged prefill batch: FP4-dequant QKV GEMM, neox RoPE on q and k, per-request causal
attention, FP4-dequant O GEMM; bf16 out.

Provenance: Llama-3.1-8B-Instruct in NVFP4 (nvidia/Llama-3.1-8B-Instruct-FP4, ModelOpt; config.json:
hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128, rope_theta 500000, rope_scaling
llama3 with factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192).
NVFP4 weight format: e2m1 codes, two per uint8 (element 2i in the low nibble), one float8_e4m3fn scale per 16
consecutive input channels, one fp32 per-tensor scale; w = e2m1(code) * scale[n, k // 16] * global. q, k and v share
one global scale in the fused [6144, 4096] QKV weight (ModelOpt unifies the amax of fused projections). Hopper has
no FP4 tensor cores: vLLM runs these checkpoints weight-only (bf16 activations, weights dequantized in the GEMM),
which is the semantics here. Scales use the plain row-major [N, K/16] layout, not Blackwell's swizzled one.
Workload: a chunked-prefill batch of 4 fresh prompts with random lengths (each >= 1024) summing to exactly 8192
tokens; positions restart at 0 in every request.
Full scale: x [8192, 4096] bf16, cu_seqlens [5] int32, cos_sin_cache [8192, 128] fp32 (cos | sin halves),
wqkv_packed [6144, 2048] uint8, wqkv_scale [6144, 256] e4m3, wqkv_global [1] fp32, wo_packed [4096, 2048] uint8,
wo_scale [4096, 256] e4m3, wo_global [1] fp32 -> out [8192, 4096] bf16.
Small scale: 3 requests, 48 tokens, hidden 128, 8 q heads, 2 kv heads, head_dim 128.

Semantics (reference: codes * block scale dequantized exactly into bf16, bf16 GEMMs with fp32 accumulation, the
global scale applied to each GEMM output; RoPE in fp32; attention by scaled_dot_product_attention):
    qkv = (x @ Wqkv^T) * wqkv_global;  q | k | v = split(qkv, [32, 8, 8] heads of 128)
    q, k = rope_neox(q, k, cos_sin_cache[pos]) with pos = 0 .. len-1 inside each request
    o[request] = softmax(q k^T / sqrt(128) + causal mask) v   (q head h uses kv head h // 4)
    out = (o @ Wo^T) * wo_global
Facts a kernel may rely on: head_dim 128; 4 q heads per kv head; requests are contiguous, ordered, given by
cu_seqlens (int32, cu_seqlens[0] = 0, cu_seqlens[-1] = T); the total T is fixed per scale (8192 at full);
K dims (4096) are multiples of 16 and 128.
"""
import math

import torch
import torch.nn.functional as F

HEAD_DIM = 128
Q_PER_KV = 4
FP4_BLOCK = 16
FP8_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _dtypes(x):
    if x.dtype == torch.float64:
        return torch.float64, torch.float64
    return x.dtype, torch.float32


def _dequant_blocks(packed, scale, dtype):
    """NVFP4 codes * e4m3 block scale (exact in bf16); the global scale is applied by the caller."""
    N, half = packed.shape
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(N, 2 * half).long()
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=packed.device)
    vals = torch.cat([lut, -lut])[codes]
    return (vals.view(N, -1, FP4_BLOCK) * scale.to(dtype).unsqueeze(-1)).view(N, 2 * half)


def _fp4_linear(a, packed, scale, global_scale, cdt, acc):
    w = _dequant_blocks(packed, scale, cdt)
    return ((a @ w.t()).to(acc) * global_scale.to(acc)).to(cdt)


def _rope_neox(t, cos, sin, acc):
    """t [L, H, 128]; cos, sin [L, 64]."""
    tf = t.to(acc)
    half = HEAD_DIM // 2
    t1, t2 = tf[..., :half], tf[..., half:]
    c, s = cos.to(acc).unsqueeze(1), sin.to(acc).unsqueeze(1)
    return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1).to(t.dtype)


def _head_counts(wqkv_packed, wo_packed):
    n_q = wo_packed.shape[1] * 2 // HEAD_DIM
    n_kv = (wqkv_packed.shape[0] // HEAD_DIM - n_q) // 2
    return n_q, n_kv


def reference(x, cu_seqlens, cos_sin_cache, wqkv_packed, wqkv_scale, wqkv_global, wo_packed, wo_scale, wo_global):
    cdt, acc = _dtypes(x)
    T = x.shape[0]
    n_q, n_kv = _head_counts(wqkv_packed, wo_packed)
    qkv = _fp4_linear(x, wqkv_packed, wqkv_scale, wqkv_global, cdt, acc)
    q = qkv[:, : n_q * HEAD_DIM].view(T, n_q, HEAD_DIM)
    k = qkv[:, n_q * HEAD_DIM:(n_q + n_kv) * HEAD_DIM].view(T, n_kv, HEAD_DIM)
    v = qkv[:, (n_q + n_kv) * HEAD_DIM:].view(T, n_kv, HEAD_DIM)
    attn = torch.empty(T, n_q, HEAD_DIM, dtype=cdt, device=x.device)
    bounds = cu_seqlens.tolist()
    for r in range(len(bounds) - 1):
        s, e = bounds[r], bounds[r + 1]
        L = e - s
        cos = cos_sin_cache[:L, : HEAD_DIM // 2]
        sin = cos_sin_cache[:L, HEAD_DIM // 2:]
        qr = _rope_neox(q[s:e], cos, sin, acc).transpose(0, 1)
        kr = _rope_neox(k[s:e], cos, sin, acc).repeat_interleave(n_q // n_kv, dim=1).transpose(0, 1)
        vr = v[s:e].repeat_interleave(n_q // n_kv, dim=1).transpose(0, 1)
        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, scale=1.0 / math.sqrt(HEAD_DIM))
        attn[s:e] = o.transpose(0, 1)
    return _fp4_linear(attn.view(T, n_q * HEAD_DIM), wo_packed, wo_scale, wo_global, cdt, acc)


def _decode_e2m1_arith(code, dtype):
    sign = 1.0 - 2.0 * ((code >> 3) & 1).to(dtype)
    e = ((code >> 1) & 3).to(dtype)
    m = (code & 1).to(dtype)
    return sign * torch.where(e == 0, 0.5 * m, torch.pow(2.0, e - 1) * (1.0 + 0.5 * m))


def _dequant_full_alt(packed, scale, global_scale, dtype):
    N, half = packed.shape
    w = torch.empty(N, 2 * half, dtype=dtype, device=packed.device)
    w[:, 0::2] = _decode_e2m1_arith(packed.long() & 0xF, dtype)
    w[:, 1::2] = _decode_e2m1_arith(packed.long() >> 4, dtype)
    return w * scale.to(dtype).repeat_interleave(FP4_BLOCK, dim=1) * global_scale.to(dtype)


def alt_reference(x, cu_seqlens, cos_sin_cache, wqkv_packed, wqkv_scale, wqkv_global, wo_packed, wo_scale,
                  wo_global):
    """Dense formulation: bit-field FP4 decoding with all scales folded into the weights, RoPE as a rotation of
    complex pairs, and one masked softmax over all T tokens (same-request and causal mask), per q head."""
    cdt, acc = _dtypes(x)
    T = x.shape[0]
    n_q, n_kv = _head_counts(wqkv_packed, wo_packed)
    qkv = (x.to(acc) @ _dequant_full_alt(wqkv_packed, wqkv_scale, wqkv_global, acc).t()).to(cdt).to(acc)
    q = qkv[:, : n_q * HEAD_DIM].reshape(T, n_q, HEAD_DIM)
    k = qkv[:, n_q * HEAD_DIM:(n_q + n_kv) * HEAD_DIM].reshape(T, n_kv, HEAD_DIM)
    v = qkv[:, (n_q + n_kv) * HEAD_DIM:].reshape(T, n_kv, HEAD_DIM)
    seg = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1, device=x.device),
                                  (cu_seqlens[1:] - cu_seqlens[:-1]).long())
    pos = torch.arange(T, device=x.device) - cu_seqlens.long()[seg]
    half = HEAD_DIM // 2
    rot = torch.complex(cos_sin_cache[pos, :half].to(acc), cos_sin_cache[pos, half:].to(acc)).unsqueeze(1)

    def rope(t):
        tc = torch.complex(t[..., :half], t[..., half:]) * rot
        return torch.cat([tc.real, tc.imag], dim=-1).to(cdt).to(acc)

    q, k = rope(q), rope(k)
    idx = torch.arange(T, device=x.device)
    allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    o = torch.empty(T, n_q, HEAD_DIM, dtype=acc, device=x.device)
    for h in range(n_q):
        kh = h // (n_q // n_kv)
        scores = (q[:, h] @ k[:, kh].t()) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(~allowed, float("-inf"))
        o[:, h] = torch.softmax(scores, dim=-1) @ v[:, kh]
    o = o.to(cdt).to(acc).reshape(T, n_q * HEAD_DIM)
    return (o @ _dequant_full_alt(wo_packed, wo_scale, wo_global, acc).t()).to(cdt)


def _e2m1_codes(v):
    a = v.abs()
    mids = torch.tensor(E2M1_MIDPOINTS, dtype=v.dtype, device=v.device)
    lo = torch.bucketize(a, mids, right=False)
    hi = torch.bucketize(a, mids, right=True)
    code = torch.where(lo % 2 == 0, lo, hi)
    return (code + 8 * (v < 0).long()).to(torch.uint8)


def _quant_nvfp4(w):
    N, K = w.shape
    w_global = (w.abs().amax() / (6.0 * FP8_MAX)).reshape(1)
    blk = w.view(N, K // FP4_BLOCK, FP4_BLOCK)
    s = (blk.abs().amax(dim=-1) / (6.0 * w_global)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    sf = s.float().unsqueeze(-1) * w_global
    v = torch.where(sf > 0, blk / sf, torch.zeros_like(blk)).clamp(-6.0, 6.0)
    codes = _e2m1_codes(v).view(N, K)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), s, w_global


def _llama3_cos_sin(max_pos, device):
    theta, factor, low_ff, high_ff, orig = 500000.0, 8.0, 1.0, 4.0, 8192.0
    inv_freq = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM)
    wavelen = 2 * math.pi / inv_freq
    smooth = ((orig / wavelen - low_ff) / (high_ff - low_ff)).clamp(0.0, 1.0)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    inv_freq = torch.where(wavelen < orig / high_ff, inv_freq, torch.where(wavelen > orig / low_ff,
                                                                             inv_freq / factor, scaled))
    ang = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=-1)


def _ragged_lengths(total, n, min_len, device):
    extra = total - n * min_len
    w = torch.rand(n, device=device)
    alloc = torch.floor(w / w.sum() * extra).long()
    alloc[-1] += extra - alloc.sum()
    return alloc + min_len


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, n_req, min_len, hidden, n_kv = 8192, 4, 1024, 4096, 8
    else:
        T, n_req, min_len, hidden, n_kv = 48, 3, 8, 128, 2
    n_q = Q_PER_KV * n_kv
    lens = _ragged_lengths(T, n_req, min_len, device)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long, device=device), lens.cumsum(0)]).to(torch.int32)
    x = (torch.randn(T, hidden, device=device) * (0.5 + torch.rand(hidden, device=device))).to(torch.bfloat16)
    cos_sin_cache = _llama3_cos_sin(T, device)
    wqkv = torch.randn((n_q + 2 * n_kv) * HEAD_DIM, hidden, device=device) * (1.5 / hidden ** 0.5)
    wo = torch.randn(hidden, n_q * HEAD_DIM, device=device) * (1.0 / (n_q * HEAD_DIM) ** 0.5)
    wqkv_packed, wqkv_scale, wqkv_global = _quant_nvfp4(wqkv)
    wo_packed, wo_scale, wo_global = _quant_nvfp4(wo)
    return [x, cu_seqlens, cos_sin_cache, wqkv_packed, wqkv_scale, wqkv_global, wo_packed, wo_scale, wo_global]


def roofline(x, cu_seqlens, cos_sin_cache, wqkv_packed, wqkv_scale, wqkv_global, wo_packed, wo_scale, wo_global):
    T, hidden = x.shape
    n_q, n_kv = _head_counts(wqkv_packed, wo_packed)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    causal_pairs = int((lens * (lens + 1) // 2).sum().item())
    n_qkv = wqkv_packed.shape[0]
    flops = 2 * T * hidden * n_qkv + 4 * causal_pairs * n_q * HEAD_DIM + 2 * T * n_q * HEAD_DIM * hidden
    max_len = int(lens.max().item())
    bytes_ = (T * hidden * 2 + cu_seqlens.numel() * 4 + max_len * HEAD_DIM * 4
              + wqkv_packed.numel() + wqkv_scale.numel() + wo_packed.numel() + wo_scale.numel() + 8
              + T * hidden * 2)
    return {"flops": int(flops), "bytes": int(bytes_)}
