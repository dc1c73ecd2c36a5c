"""Flux transformer-block feed-forward: Linear(3072 -> 12288) - GELU(tanh approximation) - Linear(12288 -> 3072).

Provenance: FLUX.1-dev / FLUX.1-schnell double-stream block, image-stream MLP `img_mlp` (hidden_size 3072,
mlp_ratio 4.0 -> 12288; nn.GELU(approximate="tanh"); both Linear layers have bias).
Workload: one 1024x1024 image: 128x128 VAE latent, 2x2 patchified -> 4096 image tokens; batch 1, bf16.
Full scale: x [1, 4096, 3072] bf16, w1 [12288, 3072], b1 [12288], w2 [3072, 12288], b2 [3072]; out [1, 4096, 3072].
Small scale: x [1, 64, 128], hidden 512.
Facts a kernel may rely on: hidden 3072 and 12288 at full scale; 4096 tokens (multiple of 128); weights are in
nn.Linear layout [out_features, in_features].
"""
import math

import torch
import torch.nn.functional as F


def reference(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    return F.linear(h, w2, b2)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        b, l, d, f = 1, 4096, 3072, 12288
    else:
        b, l, d, f = 1, 64, 128, 512
    dt = torch.bfloat16
    x = torch.randn(b, l, d, device=device).to(dt)
    w1 = (torch.randn(f, d, device=device) / math.sqrt(d)).to(dt)
    b1 = (0.05 * torch.randn(f, device=device)).to(dt)
    w2 = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    b2 = (0.05 * torch.randn(d, device=device)).to(dt)
    return [x, w1, b1, w2, b2]


def roofline(x, w1, b1, w2, b2):
    t = x.numel() // x.shape[-1]
    d, f = x.shape[-1], w1.shape[0]
    flops = 4 * t * d * f + 10 * t * f
    es = x.element_size()
    bytes_ = es * (2 * x.numel() + w1.numel() + b1.numel() + w2.numel() + b2.numel())
    return {"flops": int(flops), "bytes": int(bytes_)}
