"""Split a fused QKV projection output and apply Gemma-style per-head RMSNorm (scale 1 + weight) to q and k.

Provenance: Gemma-3-12B attention (config.json text_config: num_attention_heads 16, num_key_value_heads 8,
head_dim 256, rms_norm_eps 1e-6). The fused qkv_proj output [T, (16 + 8 + 8) * 256] is split into q [T, 16, 256],
k [T, 8, 256] and v [T, 8, 256]; q_norm and k_norm are Gemma3RMSNorm(256): x * rsqrt(mean(x^2) + eps) * (1 + w),
computed in fp32 and rounded once to bf16 (one weight vector shared by all q heads, another by all k heads).
v passes through untouched (a view of qkv in the serving engine), so it is not an output here.
Workload: a 16384-token prefill batch (e.g. 4 requests x 4096 tokens), bf16.
Full scale: qkv [16384, 8192] bf16, q_norm_weight, k_norm_weight [256] bf16.
Outputs: q [16384, 16, 256], k [16384, 8, 256] bf16 (contiguous).
Small scale: qkv [48, (4 + 2 + 2) * 256].
Facts a kernel may rely on: head_dim 256; 16 q heads and 8 kv heads at full scale; column layout of qkv is
[q heads | k heads | v heads], each head 256 contiguous values; the v columns are never needed; eps 1e-6;
q heads = 2 x kv heads at every scale (the reference derives both counts from the qkv width).
"""
import torch
import torch.nn.functional as F

EPS = 1e-6
OUTPUT_NAMES = ("q", "k")
HEAD_DIM = 256


def _gemma_rms_norm(x, weight):
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (xf * inv * (1.0 + weight.to(xf.dtype))).to(x.dtype)


def _num_heads(qkv):
    # (hq + 2 * hkv) * 256 columns with hq = 2 * hkv (Gemma-3-12B ratio) -> 4 * hkv heads in total
    total = qkv.shape[-1] // HEAD_DIM
    hkv = total // 4
    return 2 * hkv, hkv


def reference(qkv, q_norm_weight, k_norm_weight):
    t = qkv.shape[0]
    hq, hkv = _num_heads(qkv)
    q, k, _v = qkv.split([hq * HEAD_DIM, hkv * HEAD_DIM, hkv * HEAD_DIM], dim=-1)
    q = _gemma_rms_norm(q.reshape(t, hq, HEAD_DIM), q_norm_weight)
    k = _gemma_rms_norm(k.reshape(t, hkv, HEAD_DIM), k_norm_weight)
    return q, k


def alt_reference(qkv, q_norm_weight, k_norm_weight):
    """Per-head slicing by index arithmetic and torch's fused F.rms_norm with weight 1 + w."""
    t = qkv.shape[0]
    hq, hkv = _num_heads(qkv)
    acc = torch.promote_types(qkv.dtype, torch.float32)
    heads = qkv.to(acc).reshape(t, hq + 2 * hkv, HEAD_DIM)
    q = F.rms_norm(heads[:, :hq], (HEAD_DIM,), 1.0 + q_norm_weight.to(acc), EPS)
    k = F.rms_norm(heads[:, hq:hq + hkv], (HEAD_DIM,), 1.0 + k_norm_weight.to(acc), EPS)
    return q.to(qkv.dtype), k.to(qkv.dtype)


def make_inputs(device="cuda", scale="full"):
    t, hq, hkv = (16384, 16, 8) if scale == "full" else (48, 4, 2)
    dt = torch.bfloat16
    width = (hq + 2 * hkv) * HEAD_DIM
    qkv = (torch.randn(t, width, device=device) * (0.5 + 2.0 * torch.rand(width, device=device))).to(dt)
    # Gemma stores the norm weight as an offset from 1 (zero-initialised, small trained values of either sign)
    q_norm_weight = (0.3 * torch.randn(HEAD_DIM, device=device)).to(dt)
    k_norm_weight = (0.3 * torch.randn(HEAD_DIM, device=device)).to(dt)
    return [qkv, q_norm_weight, k_norm_weight]


def roofline(qkv, q_norm_weight, k_norm_weight):
    hq, hkv = _num_heads(qkv)
    n = qkv.shape[0] * (hq + hkv) * HEAD_DIM   # q and k columns only; v is never read
    es = qkv.element_size()
    return {"flops": int(5 * n), "bytes": int(es * (2 * n + q_norm_weight.numel() + k_norm_weight.numel()))}
