"""Decoder half-layer: residual add + RMSNorm + SwiGLU MLP; returns the MLP output and the updated residual.

Provenance: Llama-3-8B decoder layer, post-attention half (config.json: hidden_size 4096, intermediate_size 14336,
rms_norm_eps 1e-5, hidden_act "silu", no MLP bias):
    residual = attn_out + residual
    h = RMSNorm(residual) * post_attention_layernorm.weight
    out = down_proj(SiLU(gate_proj(h)) * up_proj(h))
gate_proj/up_proj stacked into w_gate_up [2 * 14336, 4096] (gate rows first), as in vLLM.
Rounding points (bf16 serving): the residual add in bf16; RMSNorm statistics in fp32, normalised * weight rounded
once to bf16; SiLU(gate) * up computed in fp32 and rounded once to bf16.
Workload: a 2048-token chunked-prefill step (vLLM default max_num_batched_tokens 2048), bf16.
Full scale: attn_out, residual [2048, 4096] bf16; norm_weight [4096]; w_gate_up [28672, 4096]; w_down [4096, 14336].
Outputs: out [2048, 4096], residual_out [2048, 4096] bf16.
Small scale: [48, 128], intermediate 320.
Facts a kernel may rely on: hidden 4096, intermediate 14336 at full scale; eps 1e-5; gate rows before up rows;
nn.Linear layout; no biases.
"""
import math

import torch
import torch.nn.functional as F

EPS = 1e-5
OUTPUT_NAMES = ("out", "residual_out")


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(attn_out, residual, norm_weight, w_gate_up, w_down):
    acc = _acc(attn_out.dtype)
    res = attn_out + residual
    rf = res.to(acc)
    h = (rf * torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + EPS) * norm_weight.to(acc)).to(res.dtype)
    gate, up = F.linear(h, w_gate_up).chunk(2, dim=-1)
    act = (F.silu(gate.to(acc)) * up.to(acc)).to(res.dtype)
    return F.linear(act, w_down), res


def make_inputs(device="cuda", scale="full"):
    t, d, f = (2048, 4096, 14336) if scale == "full" else (48, 128, 320)
    dt = torch.bfloat16
    attn_out = (0.5 * torch.randn(t, d, device=device)).to(dt)
    residual = (2.0 * torch.randn(t, d, device=device)).to(dt)
    norm_weight = (0.2 + torch.rand(d, device=device)).to(dt)
    w_gate_up = (torch.randn(2 * f, d, device=device) / math.sqrt(d)).to(dt)
    w_down = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    return [attn_out, residual, norm_weight, w_gate_up, w_down]


def roofline(attn_out, residual, norm_weight, w_gate_up, w_down):
    t, d = attn_out.shape
    f = w_down.shape[1]
    flops = 2 * t * d * (2 * f) + 2 * t * f * d + 6 * t * f + 6 * t * d
    es = attn_out.element_size()
    bytes_ = es * (4 * attn_out.numel() + norm_weight.numel() + w_gate_up.numel() + w_down.numel())
    return {"flops": int(flops), "bytes": int(bytes_)}
