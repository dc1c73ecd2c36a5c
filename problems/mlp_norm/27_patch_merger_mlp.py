"""Qwen2-VL vision patch merger: LayerNorm per patch, 2x2 spatial merge (4 patches -> 1 token), Linear-GELU-Linear.

Provenance: Qwen2-VL-7B-Instruct, vision tower `merger` (PatchMerger). Config values: vision_config.embed_dim 1280,
spatial_merge_size 2, LLM hidden_size 3584. Modules: ln_q = LayerNorm(1280, eps=1e-6) with affine weight/bias;
mlp = Linear(5120, 5120, bias) -> GELU (exact, erf form) -> Linear(5120, 3584, bias), 5120 = 1280 * 2 * 2.
The Qwen2-VL image processor emits patches window-major: the 4 patches of each 2x2 spatial window are consecutive
rows (order inside a window: (0,0), (0,1), (1,0), (1,1)), so the spatial merge is a row-major reshape of the
normalised [N, 1280] patches into [N/4, 5120]; LayerNorm is applied per patch BEFORE the merge.
Workload: 4 images of 896x896 pixels (14-pixel patches -> 64x64 = 4096 patches each) = 16384 patches -> 4096 merged
visual tokens fed to the LLM, bf16.
Full scale: x [16384, 1280] bf16, w1 [5120, 5120], w2 [3584, 5120]; out [4096, 3584] bf16.
Small scale: same structure with embed 64 (merged 256), out 192, 256 patches -> 64 tokens.
Facts a kernel may rely on: N divisible by 4; embed 1280, merged width 5120, out 3584 at full scale; weights are in
nn.Linear layout [out_features, in_features]; LayerNorm statistics are per 1280-wide patch row (not per merged row).
"""
import math

import torch
import torch.nn.functional as F

LN_EPS = 1e-6
MERGE = 4  # spatial_merge_size ** 2


def reference(x, ln_weight, ln_bias, w1, b1, w2, b2):
    c = x.shape[-1]
    h = F.layer_norm(x, (c,), ln_weight, ln_bias, LN_EPS)   # per patch
    h = h.reshape(-1, MERGE * c)                              # 2x2 window -> one row of 4*c
    h = F.gelu(F.linear(h, w1, b1))                           # exact GELU
    return F.linear(h, w2, b2)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        n, c, d_out = 16384, 1280, 3584
    else:
        n, c, d_out = 256, 64, 192
    dt = torch.bfloat16
    d = MERGE * c
    x = torch.randn(n, c, device=device).to(dt)
    ln_weight = (1.0 + 0.1 * torch.randn(c, device=device)).to(dt)
    ln_bias = (0.1 * torch.randn(c, device=device)).to(dt)
    w1 = (torch.randn(d, d, device=device) / math.sqrt(d)).to(dt)
    b1 = (0.02 * torch.randn(d, device=device)).to(dt)
    w2 = (torch.randn(d_out, d, device=device) / math.sqrt(d)).to(dt)
    b2 = (0.02 * torch.randn(d_out, device=device)).to(dt)
    return [x, ln_weight, ln_bias, w1, b1, w2, b2]


def roofline(x, ln_weight, ln_bias, w1, b1, w2, b2):
    n, c = x.shape
    m = n // MERGE
    d = MERGE * c
    d_out = w2.shape[0]
    flops = 2 * m * d * d + 2 * m * d * d_out + 8 * n * c + 10 * m * d
    es = x.element_size()
    bytes_ = es * (x.numel() + ln_weight.numel() + ln_bias.numel() + w1.numel() + b1.numel()
                   + w2.numel() + b2.numel() + m * d_out)
    return {"flops": int(flops), "bytes": int(bytes_)}
