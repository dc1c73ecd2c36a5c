"""Per-head RMSNorm of queries and keys (QK-norm): each 128-wide head vector of q and k is RMS-normalised and scaled.

Provenance: Qwen3-30B-A3B attention (config.json: num_attention_heads 32, num_key_value_heads 4, head_dim 128,
rms_norm_eps 1e-6). Qwen3 applies q_norm = RMSNorm(128) to every query head and k_norm = RMSNorm(128) to every key
head (one weight vector shared by all heads of q, another by all heads of k) before RoPE.
Statistics in fp32 over each head's 128 values; normalised * weight rounded once to bf16.
Workload: a 16384-token prefill batch (e.g. 8 requests x 2048 tokens), bf16.
Full scale: q [16384, 32, 128], k [16384, 4, 128] bf16, q_norm_weight, k_norm_weight [128] bf16.
Outputs: q_out [16384, 32, 128], k_out [16384, 4, 128] bf16.
Small scale: q [64, 4, 128], k [64, 2, 128].
Facts a kernel may rely on: head_dim 128; 32 q heads and 4 k heads at full scale; q and k contiguous; eps 1e-6.
"""
import torch
import torch.nn.functional as F

EPS = 1e-6
OUTPUT_NAMES = ("q_out", "k_out")


def _rms_norm(x, weight):
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (xf * inv * weight.to(xf.dtype)).to(x.dtype)


def reference(q, k, q_norm_weight, k_norm_weight):
    return _rms_norm(q, q_norm_weight), _rms_norm(k, k_norm_weight)


def alt_reference(q, k, q_norm_weight, k_norm_weight):
    """Same math through torch's fused F.rms_norm."""
    def norm(x, w):
        acc = torch.promote_types(x.dtype, torch.float32)
        return F.rms_norm(x.to(acc), (x.shape[-1],), w.to(acc), EPS).to(x.dtype)
    return norm(q, q_norm_weight), norm(k, k_norm_weight)


def make_inputs(device="cuda", scale="full"):
    t, hq, hk, d = (16384, 32, 4, 128) if scale == "full" else (64, 4, 2, 128)
    dt = torch.bfloat16
    # projection outputs: per-channel magnitudes differ (as after a real q/k projection)
    q = (torch.randn(t, hq, d, device=device) * (0.5 + 2.0 * torch.rand(hq, d, device=device))).to(dt)
    k = (torch.randn(t, hk, d, device=device) * (0.5 + 2.0 * torch.rand(hk, d, device=device))).to(dt)
    q_norm_weight = (0.5 + torch.rand(d, device=device)).to(dt)
    k_norm_weight = (0.5 + torch.rand(d, device=device)).to(dt)
    return [q, k, q_norm_weight, k_norm_weight]


def roofline(q, k, q_norm_weight, k_norm_weight):
    n = q.numel() + k.numel()
    es = q.element_size()
    return {"flops": int(4 * n), "bytes": int(es * (2 * n + q_norm_weight.numel() + k_norm_weight.numel()))}
