"""GroupNorm (32 groups, affine) followed by SiLU on an NCHW activation, as at the start of a UNet ResNet block.

Provenance: Stable Diffusion 1.5 UNet (diffusers UNet2DConditionModel: norm_num_groups 32, norm_eps 1e-5,
block_out_channels [320, 640, 1280, 1280], act_fn "silu"). Every ResnetBlock2D begins with
norm1 = GroupNorm(32, C, eps=1e-5, affine=True) -> SiLU. This is the first down block at 64x64 latent resolution
(C = 320, i.e. 10 channels per group).
Workload: 16 images of 512x512 with classifier-free guidance (batch 32), fp16 as SD 1.5 is usually served.
Group statistics are computed in fp32 (F.group_norm), the normalised affine value is rounded to fp16, then SiLU.
Full scale: x [32, 320, 64, 64] fp16, weight, bias [320] fp16; out [32, 320, 64, 64] fp16.
Small scale: x [2, 64, 8, 8].
Facts a kernel may rely on: 32 groups; contiguous NCHW; C divisible by 32; each (sample, group) statistic covers
C/32 * H * W = 40960 elements at full scale.
"""
import torch
import torch.nn.functional as F

GROUPS = 32
EPS = 1e-5


def reference(x, weight, bias):
    return F.silu(F.group_norm(x, GROUPS, weight, bias, EPS))


def alt_reference(x, weight, bias):
    """Explicit two-pass group statistics (independent of F.group_norm)."""
    n, c, h, w = x.shape
    acc = torch.promote_types(x.dtype, torch.float32)
    xg = x.to(acc).reshape(n, GROUPS, -1)
    mean = xg.mean(dim=-1, keepdim=True)
    var = (xg - mean).pow(2).mean(dim=-1, keepdim=True)
    y = ((xg - mean) * torch.rsqrt(var + EPS)).reshape(n, c, h, w)
    y = y * weight.to(acc).view(1, c, 1, 1) + bias.to(acc).view(1, c, 1, 1)
    y = y.to(x.dtype)
    return F.silu(y)


def make_inputs(device="cuda", scale="full"):
    n, c, hw = (32, 320, 64) if scale == "full" else (2, 64, 8)
    dt = torch.float16
    # per-channel offsets and scales, as in real UNet activations
    x = (torch.randn(n, c, hw, hw, device=device) * (0.5 + torch.rand(1, c, 1, 1, device=device))
         + 0.5 * torch.randn(1, c, 1, 1, device=device)).to(dt)
    weight = (1.0 + 0.2 * torch.randn(c, device=device)).to(dt)
    bias = (0.2 * torch.randn(c, device=device)).to(dt)
    return [x, weight, bias]


def roofline(x, weight, bias):
    n = x.numel()
    es = x.element_size()
    return {"flops": int(12 * n), "bytes": int(es * (2 * n + weight.numel() + bias.numel()))}
