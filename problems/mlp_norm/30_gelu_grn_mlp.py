"""ConvNeXt-V2 block MLP: Linear(C -> 4C) - GELU - Global Response Normalization - Linear(4C -> C), channels-last.

Provenance: ConvNeXt-V2-Base (dims [128, 256, 512, 1024], depths [3, 3, 27, 3]), a block of stage 3 (C = 512 at
stride 16, i.e. 14x14 for 224x224 inputs; 27 of the model's 36 blocks are here). The block runs
dwconv -> LayerNorm -> pwconv1 (Linear C->4C) -> GELU (exact) -> GRN(4C) -> pwconv2 (Linear 4C->C) on NHWC tensors;
this problem is the pwconv1 .. pwconv2 span (input = the LayerNorm output).
GRN (ConvNeXt-V2 paper / official code): Gx = ||X||_2 over the spatial dims (H, W) per sample and channel;
Nx = Gx / (mean over channels of Gx + 1e-6); GRN(X) = gamma * (X * Nx) + beta + X. The GRN arithmetic is done in
fp32 and rounded once to the activation dtype before pwconv2.
Workload: batch 128 of 224x224 images (inference or the forward of training), bf16.
Full scale: x [128, 14, 14, 512] bf16, w1 [2048, 512], w2 [512, 2048]; out [128, 14, 14, 512].
Small scale: x [3, 7, 7, 32], 4C = 128.
Facts a kernel may rely on: the spatial L2 norm couples all H*W positions of one sample (a reduction over 196
positions per channel at full scale) before the second GEMM; C = 512, 4C = 2048 at full scale; weights in nn.Linear
layout [out_features, in_features].
"""
import math

import torch
import torch.nn.functional as F

GRN_EPS = 1e-6


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, w1, b1, grn_gamma, grn_beta, w2, b2):
    h = F.gelu(F.linear(x, w1, b1))                                   # [N, H, W, 4C]
    hf = h.to(_acc(h.dtype))
    gx = torch.linalg.vector_norm(hf, ord=2, dim=(1, 2), keepdim=True)  # [N, 1, 1, 4C]
    nx = gx / (gx.mean(dim=-1, keepdim=True) + GRN_EPS)
    g = grn_gamma.to(hf.dtype) * (hf * nx) + grn_beta.to(hf.dtype) + hf
    return F.linear(g.to(x.dtype), w2, b2)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        n, hw, c = 128, 14, 512
    else:
        n, hw, c = 3, 7, 32
    f = 4 * c
    dt = torch.bfloat16
    x = torch.randn(n, hw, hw, c, device=device).to(dt)
    w1 = (torch.randn(f, c, device=device) / math.sqrt(c)).to(dt)
    b1 = (0.05 * torch.randn(f, device=device)).to(dt)
    grn_gamma = (0.5 * torch.randn(f, device=device)).to(dt)
    grn_beta = (0.1 * torch.randn(f, device=device)).to(dt)
    w2 = (torch.randn(c, f, device=device) / math.sqrt(f)).to(dt)
    b2 = (0.05 * torch.randn(c, device=device)).to(dt)
    return [x, w1, b1, grn_gamma, grn_beta, w2, b2]


def roofline(x, w1, b1, grn_gamma, grn_beta, w2, b2):
    t = x.numel() // x.shape[-1]
    c, f = x.shape[-1], w1.shape[0]
    flops = 4 * t * c * f + 20 * t * f
    es = x.element_size()
    bytes_ = es * (2 * x.numel() + w1.numel() + b1.numel() + w2.numel() + b2.numel()
                   + grn_gamma.numel() + grn_beta.numel())
    return {"flops": int(flops), "bytes": int(bytes_)}
