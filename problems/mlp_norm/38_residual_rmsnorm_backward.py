"""Backward of residual add + RMSNorm: gradient of the (shared) hidden input and of the norm weight.

Forward (one layer boundary of a pre-norm decoder): h = x + residual; y = RMSNorm(h) * weight; both y (fed to the
next sub-layer) and h (the residual stream) are outputs. Given grad_y = dL/dy and grad_h = dL/dh arriving from the
residual stream, compute
    r = rsqrt(mean(h^2) + eps);  hhat = h * r
    grad_weight = sum_tokens grad_y * hhat
    grad_hidden = grad_h + r * (grad_y * weight - hhat * mean(grad_y * weight * hhat))
grad_hidden is the gradient of BOTH x and residual (the add passes it unchanged to each), so it is returned once.
h is recomputed from x + residual (in bf16, as in the forward).
Provenance: Qwen3-4B (config.json: hidden_size 2560, rms_norm_eps 1e-6), bf16 mixed-precision training.
Rounding points: h = x + residual rounded to bf16 (as the forward stored it); all backward math in fp32 from the bf16
inputs; grad_hidden and grad_weight rounded once to bf16.
Workload: training micro-batch 8 x 4096 tokens.
Full scale: x, residual, grad_y, grad_h [8, 4096, 2560] bf16, weight [2560] bf16.
Outputs: grad_hidden [8, 4096, 2560] bf16, grad_weight [2560] bf16.
Small scale: [2, 40, 256].
Facts a kernel may rely on: hidden 2560 at full scale; eps 1e-6; 32768 tokens; grad_weight is a reduction over all
tokens.
"""
import torch

EPS = 1e-6
OUTPUT_NAMES = ("grad_hidden", "grad_weight")


def reference(x, residual, weight, grad_y, grad_h):
    dt = x.dtype
    acc = torch.promote_types(dt, torch.float32)
    d = x.shape[-1]
    h = (x + residual).reshape(-1, d).to(acc)
    gy = grad_y.reshape(-1, d).to(acc)
    r = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + EPS)
    hhat = h * r
    grad_weight = (gy * hhat).sum(dim=0)
    gw = gy * weight.to(acc)
    d_h = r * (gw - hhat * (gw * hhat).mean(dim=-1, keepdim=True))
    grad_hidden = (grad_h.reshape(-1, d).to(acc) + d_h).to(dt).reshape(x.shape)
    return grad_hidden, grad_weight.to(dt)


def alt_reference(x, residual, weight, grad_y, grad_h):
    """Autograd through the forward (h and y both outputs)."""
    with torch.enable_grad():
        xs, rs, ws = [t.detach().clone().requires_grad_(True) for t in (x, residual, weight)]
        h = xs + rs
        y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + EPS) * ws
        gx, gr, gw = torch.autograd.grad((y, h), (xs, rs, ws), (grad_y, grad_h))
    assert torch.equal(gx, gr)
    return gx, gw


def make_inputs(device="cuda", scale="full"):
    b, s, d = (8, 4096, 2560) if scale == "full" else (2, 40, 256)
    dt = torch.bfloat16
    x = torch.randn(b, s, d, device=device).to(dt)
    residual = (2.0 * torch.randn(b, s, d, device=device)).to(dt)
    weight = (0.2 + torch.rand(d, device=device)).to(dt)
    grad_y = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    grad_h = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    return [x, residual, weight, grad_y, grad_h]


def roofline(x, residual, weight, grad_y, grad_h):
    n = x.numel()
    es = x.element_size()
    return {"flops": int(12 * n), "bytes": int(es * (5 * n + 2 * weight.numel()))}
