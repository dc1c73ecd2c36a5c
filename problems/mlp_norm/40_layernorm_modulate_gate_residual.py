"""DiT adaLN-Zero glue between sub-layers: gated residual add, then modulated LayerNorm for the next sub-layer.

Provenance: DiT-XL/2 block (hidden_size 1152, LayerNorm(elementwise_affine=False, eps=1e-6), adaLN-Zero):
    x = x + gate_msa[:, None] * attn_out                  # residual stream update
    h = LayerNorm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]   # input of the MLP
This is the fusion serving engines implement as one kernel (e.g. SGLang's diffusion
"scale residual -> LayerNorm -> scale shift"). The per-sample vectors gate/shift/scale come from the adaLN
modulation GEMM and are inputs here.
Rounding points (bf16 serving): all arithmetic in fp32 from the bf16 inputs; residual_out and out rounded once each
(LayerNorm statistics from the unrounded fp32 residual).
Workload: 32 images of 512x512 with classifier-free guidance (batch 64); 64x64 latents, patch 2 -> 1024 tokens per
sample; bf16.
Full scale: residual, branch_out [64, 1024, 1152] bf16; gate, shift, scale [64, 1152] bf16.
Outputs: out [64, 1024, 1152], residual_out [64, 1024, 1152] bf16.
Small scale: [3, 40, 96].
Facts a kernel may rely on: modulation vectors are per sample (constant over tokens); hidden 1152 (= 9 x 128) at
full scale; eps 1e-6; LayerNorm has no affine parameters.
"""
import torch
import torch.nn.functional as F

EPS = 1e-6
OUTPUT_NAMES = ("out", "residual_out")


def reference(residual, branch_out, gate, shift, scale):
    dt = residual.dtype
    acc = torch.promote_types(dt, torch.float32)
    r = residual.to(acc) + gate.to(acc)[:, None, :] * branch_out.to(acc)
    h = F.layer_norm(r, (r.shape[-1],), eps=EPS)
    out = h * (1.0 + scale.to(acc)[:, None, :]) + shift.to(acc)[:, None, :]
    return out.to(dt), r.to(dt)


def alt_reference(residual, branch_out, gate, shift, scale):
    """Explicit mean / variance instead of F.layer_norm."""
    dt = residual.dtype
    acc = torch.promote_types(dt, torch.float32)
    r = torch.addcmul(residual.to(acc), gate.to(acc).unsqueeze(1), branch_out.to(acc))
    mu = r.mean(dim=-1, keepdim=True)
    var = (r - mu).pow(2).mean(dim=-1, keepdim=True)
    h = (r - mu) / torch.sqrt(var + EPS)
    out = torch.addcmul(shift.to(acc).unsqueeze(1), h, 1.0 + scale.to(acc).unsqueeze(1))
    return out.to(dt), r.to(dt)


def make_inputs(device="cuda", scale="full"):
    b, l, d = (64, 1024, 1152) if scale == "full" else (3, 40, 96)
    dt = torch.bfloat16
    residual = (torch.randn(b, l, d, device=device) * (0.5 + 2.0 * torch.rand(d, device=device))).to(dt)
    branch_out = torch.randn(b, l, d, device=device).to(dt)
    gate = (0.5 * torch.randn(b, d, device=device)).to(dt)
    shift = (0.5 * torch.randn(b, d, device=device)).to(dt)
    scale_ = (0.5 * torch.randn(b, d, device=device)).to(dt)
    return [residual, branch_out, gate, shift, scale_]


def roofline(residual, branch_out, gate, shift, scale):
    n = residual.numel()
    es = residual.element_size()
    return {"flops": int(12 * n), "bytes": int(es * (4 * n + gate.numel() + shift.numel() + scale.numel()))}
