"""FP8 causal GQA attention (FlashAttention-3 fp8 interface): fp8 e4m3 Q, K, V with per-(batch, kv-head) descale
factors; scores Q K^T * q_descale * k_descale / sqrt(d), softmax in fp32, then P V with V * v_descale; bf16 out.

Provenance: FlashAttention-3's FP8 forward (flash_attn_func(q, k, v, causal=True, q_descale=..., k_descale=...,
v_descale=...), descale tensors of shape [batch, num_heads_k]), as used by vLLM's FA3 backend with an fp8 KV cache
and fp8 queries, on the Llama-3.1-8B attention shape (config.json: num_attention_heads 32, num_key_value_heads 8,
head_dim 128). The q descale of a q head is the one of its kv head (h // 4), as in FA3.
Workload: prefill of a batch of 4 sequences of 4096 tokens (FA3's fp8 benchmark regime).
Full scale: q [4, 4096, 32, 128], k [4, 4096, 8, 128], v [4, 4096, 8, 128] float8_e4m3fn; q_descale, k_descale,
v_descale [4, 8] fp32 -> out [4, 4096, 32, 128] bf16.
Small scale: q [2, 64, 8, 128], k / v [2, 64, 2, 128], descales [2, 2].

Semantics (real numbers; the reference dequantizes Q, K, V into bf16 and calls scaled_dot_product_attention, whose
softmax runs in fp32):
    s[b, h, i, j] = (q[b, i, h] * q_descale[b, h // 4]) . (k[b, j, h // 4] * k_descale[b, h // 4]) / sqrt(128)
    p = softmax_j(s masked to j <= i)            (in fp32)
    out[b, i, h] = sum_j p[b, h, i, j] * v[b, j, h // 4] * v_descale[b, h // 4]
The slate's "fp8 Q K^T scores + fp32 softmax" is kept whole, and the probabilities are consumed by P V in the same
problem, as FA3 does (it never materialises the [L, L] scores), so the output is the attention output.
P is not requantized to fp8 in this definition (a kernel that rounds P to fp8 for the second GEMM must still meet
the tolerance). Facts a kernel may rely on: head_dim 128; 4 q heads per kv head; seqlen_q == seqlen_k, causal
aligned at the top-left; all sequences of a batch have the same length; tensors are contiguous [B, L, H, D].
"""
import math

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
HEAD_DIM = 128
Q_PER_KV = 4


def _dtypes(q):
    if q.dtype == torch.float64:
        return torch.float64, torch.float64
    return torch.bfloat16, torch.float32


def _dequant(t, descale, group, cdt, acc):
    """t [L, H, D] (one batch entry), descale [Hkv] -> [H, L, D] in cdt."""
    s = descale.to(acc).repeat_interleave(group)[None, :, None]
    return (t.to(acc) * s).to(cdt).transpose(0, 1)


def reference(q, k, v, q_descale, k_descale, v_descale):
    cdt, acc = _dtypes(q)
    B, L, Hq, D = q.shape
    Hkv = k.shape[2]
    group = Hq // Hkv
    out = torch.empty(B, L, Hq, D, dtype=cdt, device=q.device)
    for b in range(B):
        qb = _dequant(q[b], q_descale[b], group, cdt, acc)
        kb = _dequant(k[b], k_descale[b], 1, cdt, acc).repeat_interleave(group, dim=0)
        vb = _dequant(v[b], v_descale[b], 1, cdt, acc).repeat_interleave(group, dim=0)
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=1.0 / math.sqrt(D))
        out[b] = o.transpose(0, 1)
    return out


def alt_reference(q, k, v, q_descale, k_descale, v_descale):
    """Explicit scores from the raw fp8 codes with the descales applied to the score / output, masked softmax."""
    cdt, acc = _dtypes(q)
    B, L, Hq, D = q.shape
    Hkv = k.shape[2]
    group = Hq // Hkv
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    out = torch.empty(B, L, Hq, D, dtype=cdt, device=q.device)
    for b in range(B):
        for h in range(Hq):
            g = h // group
            s = (q[b, :, h].to(acc) @ k[b, :, g].to(acc).t()) * (q_descale[b, g].to(acc) * k_descale[b, g].to(acc)
                                                                  / math.sqrt(D))
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            out[b, :, h] = ((p @ v[b, :, g].to(acc)) * v_descale[b, g].to(acc)).to(cdt)
    return out


def _quant_per_batch_kv_head(t, group):
    """t [B, L, H, D] fp32 -> fp8 codes and descale [B, H / group] (amax over each kv head's group / 448)."""
    B, L, H, D = t.shape
    tg = t.view(B, L, H // group, group, D)
    descale = tg.abs().amax(dim=(1, 3, 4)).clamp_min(1e-8) / FP8_MAX
    codes = (tg / descale[:, None, :, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(B, L, H, D)
    return codes, descale


def make_inputs(device="cuda", scale="full"):
    B, L, n_kv = (4, 4096, 8) if scale == "full" else (2, 64, 2)
    n_q = Q_PER_KV * n_kv
    # post-RoPE queries / keys with head-dependent scale (logit std ~2-4), values ~unit
    q_gain = 1.0 + torch.rand(1, 1, n_q, 1, device=device)
    k_gain = 1.0 + torch.rand(1, 1, n_kv, 1, device=device)
    q = torch.randn(B, L, n_q, HEAD_DIM, device=device) * q_gain
    k = torch.randn(B, L, n_kv, HEAD_DIM, device=device) * k_gain
    v = torch.randn(B, L, n_kv, HEAD_DIM, device=device)
    q, q_descale = _quant_per_batch_kv_head(q, Q_PER_KV)
    k, k_descale = _quant_per_batch_kv_head(k, 1)
    v, v_descale = _quant_per_batch_kv_head(v, 1)
    return [q, k, v, q_descale, k_descale, v_descale]


def roofline(q, k, v, q_descale, k_descale, v_descale):
    B, L, Hq, D = q.shape
    pairs = L * (L + 1) // 2
    return {"flops": int(4 * B * Hq * pairs * D),
            "bytes": int(q.numel() + k.numel() + v.numel() + 3 * q_descale.numel() * 4 + q.numel() * 2)}
