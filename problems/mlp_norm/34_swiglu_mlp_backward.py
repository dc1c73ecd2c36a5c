"""Backward of the SwiGLU MLP: gradients w.r.t. the input and the gate/up and down weights.

Forward (problem 32): gate, up = (x @ w_gate_up^T).chunk(2); act = SiLU(gate) * up; out = act @ w_down^T.
Given grad_out = dL/d(out), compute grad_x, grad_w_gate_up, grad_w_down. The forward GEMM x @ w_gate_up^T is
recomputed inside the backward (activation checkpointing, as Megatron-LM's recompute of the MLP), so the inputs are
exactly the forward's inputs plus grad_out:
    s = sigmoid(gate); act = gate * s * up
    grad_w_down = grad_out^T @ act
    d_act = grad_out @ w_down
    d_up = d_act * gate * s;  d_gate = d_act * up * s * (1 + gate * (1 - s))
    grad_x = [d_gate, d_up] @ w_gate_up;  grad_w_gate_up = [d_gate, d_up]^T @ x
Provenance: Llama-3.1-8B MLP (hidden_size 4096, intermediate_size 14336, no bias), bf16 mixed-precision training.
Rounding points: GEMM outputs in bf16 (fp32 accumulation); the elementwise SiLU / gating math in fp32 from the bf16
GEMM outputs, act and [d_gate, d_up] rounded once to bf16 before the GEMMs that consume them.
Workload: one 4096-token training sequence (micro-batch 1 x 4096).
Full scale: x [4096, 4096], w_gate_up [28672, 4096], w_down [4096, 14336], grad_out [4096, 4096], all bf16.
Outputs: grad_x [4096, 4096], grad_w_gate_up [28672, 4096], grad_w_down [4096, 14336], bf16.
Small scale: x [64, 128], intermediate 320.
Facts a kernel may rely on: hidden 4096 and intermediate 14336 at full scale; gate rows before up rows; nn.Linear
layout [out_features, in_features]; no biases.
"""
import math

import torch
import torch.nn.functional as F

OUTPUT_NAMES = ("grad_x", "grad_w_gate_up", "grad_w_down")


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, w_gate_up, w_down, grad_out):
    dt = x.dtype
    acc = _acc(dt)
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)      # recomputed forward GEMM
    g, u = gate.to(acc), up.to(acc)
    s = torch.sigmoid(g)
    act = (g * s * u).to(dt)
    grad_w_down = grad_out.t() @ act                          # [d, f]
    d_act = (grad_out @ w_down).to(acc)                       # [t, f]
    d_up = d_act * g * s
    d_gate = d_act * u * s * (1.0 + g * (1.0 - s))
    d_gu = torch.cat([d_gate, d_up], dim=-1).to(dt)           # [t, 2f]
    grad_x = d_gu @ w_gate_up                                 # [t, d]
    grad_w_gate_up = d_gu.t() @ x                             # [2f, d]
    return grad_x, grad_w_gate_up, grad_w_down


def alt_reference(x, w_gate_up, w_down, grad_out):
    """Autograd through the forward."""
    with torch.enable_grad():
        xs = x.detach().clone().requires_grad_(True)
        wgu = w_gate_up.detach().clone().requires_grad_(True)
        wd = w_down.detach().clone().requires_grad_(True)
        gate, up = F.linear(xs, wgu).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, wd)
        gx, ggu, gd = torch.autograd.grad(out, (xs, wgu, wd), grad_out)
    return gx, ggu, gd


def make_inputs(device="cuda", scale="full"):
    t, d, f = (4096, 4096, 14336) if scale == "full" else (64, 128, 320)
    dt = torch.bfloat16
    x = torch.randn(t, d, device=device).to(dt)
    w_gate_up = (torch.randn(2 * f, d, device=device) / math.sqrt(d)).to(dt)
    w_down = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    grad_out = (0.01 * torch.randn(t, d, device=device)).to(dt)
    return [x, w_gate_up, w_down, grad_out]


def roofline(x, w_gate_up, w_down, grad_out):
    t, d = x.shape
    f = w_down.shape[1]
    # recompute x@Wgu^T, grad_w_down, d_act, grad_x, grad_w_gate_up
    flops = 2 * t * d * (2 * f) * 3 + 2 * t * d * f * 2 + 16 * t * f
    es = x.element_size()
    bytes_ = es * (2 * (x.numel() + w_gate_up.numel() + w_down.numel()) + grad_out.numel())
    return {"flops": int(flops), "bytes": int(bytes_)}
