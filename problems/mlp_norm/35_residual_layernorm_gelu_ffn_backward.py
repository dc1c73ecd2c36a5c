"""Backward of a pre-LN transformer FFN sub-layer with its residual: out = x + fc2(GELU_tanh(fc1(LayerNorm(x)))).

Provenance: GPT-2 medium MLP sub-layer (n_embd 1024, n_inner 4 * 1024 = 4096, layer_norm_epsilon 1e-5, activation
"gelu_new" = tanh-approximated GELU, LayerNorm with affine weight/bias, both Linear layers with bias). Weights are
given in nn.Linear layout [out_features, in_features] (HF GPT-2 stores Conv1D [in, out]; the transpose is a
storage detail).
Given grad_out = dL/d(out), compute the gradients of x, the LayerNorm weight/bias and fc1/fc2 weights/biases. The
forward (LayerNorm, fc1, GELU) is recomputed inside the backward, so the inputs are the forward's inputs plus
grad_out. grad_x includes the residual path (grad_out) plus the LayerNorm input gradient.
Rounding points (bf16 mixed-precision training): LayerNorm statistics in fp32, its output rounded to bf16; GEMM
outputs in bf16 (fp32 accumulation); GELU and its derivative in fp32 from the bf16 pre-activation; the GELU output
and d(pre-activation) are rounded to bf16 before the GEMMs that consume them; bias and LayerNorm-parameter
reductions over tokens in fp32; every output rounded once to bf16.
Workload: training micro-batch 8 x 1024 tokens (GPT-2 context 1024).
Full scale: x, grad_out [8, 1024, 1024] bf16; w1 [4096, 1024], w2 [1024, 4096].
Outputs: grad_x [8, 1024, 1024], grad_ln_weight [1024], grad_ln_bias [1024], grad_w1 [4096, 1024], grad_b1 [4096],
grad_w2 [1024, 4096], grad_b2 [1024], all bf16.
Small scale: x [2, 24, 64], inner 256.
Facts a kernel may rely on: hidden 1024, inner 4096 at full scale; 8192 tokens; eps 1e-5; tanh GELU
(0.5 * h * (1 + tanh(sqrt(2/pi) * (h + 0.044715 h^3)))).
"""
import math

import torch
import torch.nn.functional as F

EPS = 1e-5
OUTPUT_NAMES = ("grad_x", "grad_ln_weight", "grad_ln_bias", "grad_w1", "grad_b1", "grad_w2", "grad_b2")


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, ln_weight, ln_bias, w1, b1, w2, b2, grad_out):
    dt = x.dtype
    acc = _acc(dt)
    d = x.shape[-1]
    xf = x.reshape(-1, d).to(acc)
    g = grad_out.reshape(-1, d)
    # recomputed forward
    mu = xf.mean(dim=-1, keepdim=True)
    xc = xf - mu
    rstd = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + EPS)
    xhat = xc * rstd
    n = (xhat * ln_weight.to(acc) + ln_bias.to(acc)).to(dt)
    h = F.linear(n, w1, b1).to(acc)
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (h + 0.044715 * h.pow(3)))
    a = (0.5 * h * (1.0 + t)).to(dt)
    # fc2
    grad_w2 = g.t() @ a
    grad_b2 = g.to(acc).sum(dim=0)
    d_a = (g @ w2).to(acc)
    # GELU (tanh) derivative
    dgelu = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * h * h)
    d_h = (d_a * dgelu).to(dt)
    # fc1
    grad_w1 = d_h.t() @ n
    grad_b1 = d_h.to(acc).sum(dim=0)
    d_n = (d_h @ w1).to(acc)
    # LayerNorm
    grad_ln_weight = (d_n * xhat).sum(dim=0)
    grad_ln_bias = d_n.sum(dim=0)
    d_xhat = d_n * ln_weight.to(acc)
    d_x = rstd * (d_xhat - d_xhat.mean(dim=-1, keepdim=True) - xhat * (d_xhat * xhat).mean(dim=-1, keepdim=True))
    grad_x = (g.to(acc) + d_x).to(dt).reshape(x.shape)
    return (grad_x, grad_ln_weight.to(dt), grad_ln_bias.to(dt), grad_w1, grad_b1.to(dt), grad_w2, grad_b2.to(dt))


def alt_reference(x, ln_weight, ln_bias, w1, b1, w2, b2, grad_out):
    """Autograd through the forward."""
    with torch.enable_grad():
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, ln_weight, ln_bias, w1, b1, w2, b2)]
        xs, lw, lb, w1s, b1s, w2s, b2s = leaves
        n = F.layer_norm(xs, (xs.shape[-1],), lw, lb, EPS)
        out = xs + F.linear(F.gelu(F.linear(n, w1s, b1s), approximate="tanh"), w2s, b2s)
        grads = torch.autograd.grad(out, leaves, grad_out)
    return tuple(grads)


def make_inputs(device="cuda", scale="full"):
    b, s, d, f = (8, 1024, 1024, 4096) if scale == "full" else (2, 24, 64, 256)
    dt = torch.bfloat16
    x = (torch.randn(b, s, d, device=device) + 0.3 * torch.randn(b, s, 1, device=device)).to(dt)
    ln_weight = (1.0 + 0.2 * torch.randn(d, device=device)).to(dt)
    ln_bias = (0.1 * torch.randn(d, device=device)).to(dt)
    w1 = (torch.randn(f, d, device=device) / math.sqrt(d)).to(dt)
    b1 = (0.05 * torch.randn(f, device=device)).to(dt)
    w2 = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    b2 = (0.05 * torch.randn(d, device=device)).to(dt)
    grad_out = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    return [x, ln_weight, ln_bias, w1, b1, w2, b2, grad_out]


def roofline(x, ln_weight, ln_bias, w1, b1, w2, b2, grad_out):
    d = x.shape[-1]
    t = x.numel() // d
    f = w1.shape[0]
    # fc1 recompute, grad_w2, d_a, grad_w1, d_n: five t x d x f GEMMs
    flops = 5 * 2 * t * d * f + 30 * t * f + 30 * t * d
    es = x.element_size()
    params = ln_weight.numel() + ln_bias.numel() + w1.numel() + b1.numel() + w2.numel() + b2.numel()
    bytes_ = es * (3 * x.numel() + 2 * params)   # x, grad_out in, grad_x out; params in, grads out
    return {"flops": int(flops), "bytes": int(bytes_)}
