"""Flux single-stream block minus attention: adaLN modulation, modulated LayerNorm, MLP, gated output projection.

Computed: SiLU(vec) -> shift/scale/gate; modulated LayerNorm; GELU-tanh MLP branch; concat with the given attention
output; gated output projection plus residual.

Provenance: FLUX.1-dev SingleStreamBlock (hidden_size 3072, mlp_ratio 4.0 -> mlp_hidden 12288, 24 heads x 128):
    shift, scale, gate = Modulation(vec) = Linear(3072, 3 * 3072)(SiLU(vec)).chunk(3)     (per sample)
    x_mod = (1 + scale) * LayerNorm(x; no affine, eps 1e-6) + shift
    qkv, mlp = linear1(x_mod).split([3 * 3072, 12288])
    out = x + gate * linear2(cat(attention(qkv), GELU_tanh(mlp)))
The attention itself is not part of this problem: its output `attn` [B, L, 3072] (heads merged) is an input, and
only the MLP rows of linear1 (rows 9216..21503 of the real [21504, 3072] weight) are given as w_mlp, b_mlp.
w_out = linear2.weight [3072, 3072 + 12288] whose first 3072 input columns multiply attn.
Rounding points (bf16): the modulation vector in bf16 (GEMM output); LayerNorm statistics and modulation in fp32,
x_mod rounded once to bf16; GELU in fp32 from the bf16 GEMM output, rounded to bf16; the gate * projection + residual
in fp32, rounded once.
Workload: batch 2 of 768x768 images: 48x48 = 2304 image tokens + 512 T5 text tokens = 2816 tokens per sample, bf16.
Full scale: x, attn [2, 2816, 3072]; vec [2, 3072]; w_mod [9216, 3072]; w_mlp [12288, 3072]; w_out [3072, 15360];
biases accordingly; out [2, 2816, 3072] bf16.
Small scale: hidden 64, mlp 256, [2, 24, 64].
Facts a kernel may rely on: shift/scale/gate are constant over the tokens of a sample; chunk order shift, scale,
gate; hidden 3072, mlp 12288 at full scale; nn.Linear layout [out_features, in_features].
"""
import math

import torch
import torch.nn.functional as F

LN_EPS = 1e-6


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, vec, attn, w_mod, b_mod, w_mlp, b_mlp, w_out, b_out):
    dt = x.dtype
    acc = _acc(dt)
    mod = F.linear(F.silu(vec), w_mod, b_mod)                         # [B, 3D]
    shift, scale, gate = (m.to(acc)[:, None, :] for m in mod.chunk(3, dim=-1))
    xf = x.to(acc)
    x_mod = ((1.0 + scale) * F.layer_norm(xf, (x.shape[-1],), eps=LN_EPS) + shift).to(dt)
    mlp = F.gelu(F.linear(x_mod, w_mlp, b_mlp).to(acc), approximate="tanh").to(dt)
    proj = F.linear(torch.cat([attn, mlp], dim=-1), w_out, b_out)
    return (xf + gate * proj.to(acc)).to(dt)


def make_inputs(device="cuda", scale="full"):
    b, l, d, f = (2, 2816, 3072, 12288) if scale == "full" else (2, 24, 64, 256)
    dt = torch.bfloat16
    x = (torch.randn(b, l, d, device=device) * (0.5 + torch.rand(d, device=device))).to(dt)
    vec = torch.randn(b, d, device=device).to(dt)
    attn = torch.randn(b, l, d, device=device).to(dt)
    w_mod = (0.5 * torch.randn(3 * d, d, device=device) / math.sqrt(d)).to(dt)
    b_mod = (0.1 * torch.randn(3 * d, device=device)).to(dt)
    w_mlp = (torch.randn(f, d, device=device) / math.sqrt(d)).to(dt)
    b_mlp = (0.05 * torch.randn(f, device=device)).to(dt)
    w_out = (torch.randn(d, d + f, device=device) / math.sqrt(d + f)).to(dt)
    b_out = (0.05 * torch.randn(d, device=device)).to(dt)
    return [x, vec, attn, w_mod, b_mod, w_mlp, b_mlp, w_out, b_out]


def roofline(x, vec, attn, w_mod, b_mod, w_mlp, b_mlp, w_out, b_out):
    bsz, l, d = x.shape
    t = bsz * l
    f = w_mlp.shape[0]
    flops = 2 * bsz * d * 3 * d + 2 * t * d * f + 2 * t * (d + f) * d + 10 * t * d + 10 * t * f
    es = x.element_size()
    bytes_ = es * (3 * x.numel() + vec.numel() + w_mod.numel() + b_mod.numel() + w_mlp.numel() + b_mlp.numel()
                   + w_out.numel() + b_out.numel())  # x, attn in; out written
    return {"flops": int(flops), "bytes": int(bytes_)}
