"""Backward of a Linear-GELU-Linear MLP (exact erf GELU, with biases): gradients of the input, weights and biases.

Forward: out = fc2(GELU(fc1(x))), GELU(h) = h * Phi(h) = 0.5 * h * (1 + erf(h / sqrt(2))).
Given grad_out = dL/d(out), compute grad_x, grad_w1, grad_b1, grad_w2, grad_b2. fc1 is recomputed inside the
backward (activation checkpointing), so the inputs are the forward's inputs plus grad_out:
    h = x @ w1^T + b1;  a = GELU(h)
    grad_w2 = grad_out^T @ a;  grad_b2 = sum_tokens grad_out
    d_h = (grad_out @ w2) * (Phi(h) + h * phi(h))
    grad_w1 = d_h^T @ x;  grad_b1 = sum_tokens d_h;  grad_x = d_h @ w1
Provenance: ViT-L/16 MLP block (hidden 1024, mlp_dim 4096, nn.GELU() exact, biases), 224x224 images -> 196 patches
+ 1 class token = 197 tokens per image. bf16 mixed-precision training.
Rounding points: GEMM outputs in bf16 (fp32 accumulation); GELU and its derivative in fp32 from the bf16 h; a and d_h
rounded to bf16 before the GEMMs that consume them; bias reductions in fp32; outputs rounded once to bf16.
Workload: per-GPU training batch of 64 images -> 64 x 197 = 12608 tokens (not a multiple of 128).
Full scale: x, grad_out [64, 197, 1024] bf16; w1 [4096, 1024], b1 [4096], w2 [1024, 4096], b2 [1024].
Outputs: grad_x [64, 197, 1024], grad_w1 [4096, 1024], grad_b1 [4096], grad_w2 [1024, 4096], grad_b2 [1024], bf16.
Small scale: x [3, 17, 64], inner 256.
Facts a kernel may rely on: hidden 1024, inner 4096 at full scale; 197 tokens per image; exact (erf) GELU;
nn.Linear layout [out_features, in_features].
"""
import math

import torch
import torch.nn.functional as F

OUTPUT_NAMES = ("grad_x", "grad_w1", "grad_b1", "grad_w2", "grad_b2")


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, w1, b1, w2, b2, grad_out):
    dt = x.dtype
    acc = _acc(dt)
    d = x.shape[-1]
    xm = x.reshape(-1, d)
    g = grad_out.reshape(-1, d)
    h = F.linear(xm, w1, b1).to(acc)                          # recomputed fc1
    cdf = 0.5 * (1.0 + torch.erf(h * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * h * h) * (1.0 / math.sqrt(2.0 * math.pi))
    a = (h * cdf).to(dt)
    grad_w2 = g.t() @ a
    grad_b2 = g.to(acc).sum(dim=0)
    d_h = ((g @ w2).to(acc) * (cdf + h * pdf)).to(dt)
    grad_w1 = d_h.t() @ xm
    grad_b1 = d_h.to(acc).sum(dim=0)
    grad_x = (d_h @ w1).reshape(x.shape)
    return grad_x, grad_w1, grad_b1.to(dt), grad_w2, grad_b2.to(dt)


def alt_reference(x, w1, b1, w2, b2, grad_out):
    """Autograd through the forward."""
    with torch.enable_grad():
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, w1, b1, w2, b2)]
        xs, w1s, b1s, w2s, b2s = leaves
        out = F.linear(F.gelu(F.linear(xs, w1s, b1s)), w2s, b2s)
        grads = torch.autograd.grad(out, leaves, grad_out)
    return tuple(grads)


def make_inputs(device="cuda", scale="full"):
    b, s, d, f = (64, 197, 1024, 4096) if scale == "full" else (3, 17, 64, 256)
    dt = torch.bfloat16
    x = torch.randn(b, s, d, device=device).to(dt)
    w1 = (torch.randn(f, d, device=device) / math.sqrt(d)).to(dt)
    b1 = (0.05 * torch.randn(f, device=device)).to(dt)
    w2 = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    b2 = (0.05 * torch.randn(d, device=device)).to(dt)
    grad_out = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    return [x, w1, b1, w2, b2, grad_out]


def roofline(x, w1, b1, w2, b2, grad_out):
    d = x.shape[-1]
    t = x.numel() // d
    f = w1.shape[0]
    # fc1 recompute, grad_w2, grad_out @ w2, grad_w1, grad_x: five t x d x f GEMMs
    flops = 5 * 2 * t * d * f + 20 * t * f
    es = x.element_size()
    params = w1.numel() + b1.numel() + w2.numel() + b2.numel()
    bytes_ = es * (3 * x.numel() + 2 * params)
    return {"flops": int(flops), "bytes": int(bytes_)}
