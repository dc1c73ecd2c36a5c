"""SwiGLU MLP: merged gate/up projection, SiLU(gate) * up, down projection.

Provenance: Llama-3.1-8B MLP (config.json: hidden_size 4096, intermediate_size 14336, hidden_act "silu", no bias).
Weights in the serving-engine layout: gate_proj and up_proj stacked into one [2 * 14336, 4096] matrix (rows
0..14335 = gate, 14336..28671 = up, as vLLM's MergedColumnParallelLinear), down_proj [4096, 14336].
The activation SiLU(gate) * up is computed in fp32 from the bf16 GEMM output and rounded once to bf16 before the down
projection (as vLLM's silu_and_mul).
Workload: one 4096-token chunked-prefill step (vLLM max_num_batched_tokens 4096), bf16.
Full scale: x [4096, 4096] bf16, w_gate_up [28672, 4096], w_down [4096, 14336]; out [4096, 4096] bf16.
Small scale: x [64, 128], intermediate 320.
Facts a kernel may rely on: hidden 4096, intermediate 14336 at full scale; gate rows come before up rows in
w_gate_up; nn.Linear layout [out_features, in_features]; no biases.
"""
import math

import torch
import torch.nn.functional as F


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def reference(x, w_gate_up, w_down):
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    acc = _acc(x.dtype)
    act = (F.silu(gate.to(acc)) * up.to(acc)).to(x.dtype)
    return F.linear(act, w_down)


def make_inputs(device="cuda", scale="full"):
    t, d, f = (4096, 4096, 14336) if scale == "full" else (64, 128, 320)
    dt = torch.bfloat16
    x = torch.randn(t, d, device=device).to(dt)
    w_gate_up = (torch.randn(2 * f, d, device=device) / math.sqrt(d)).to(dt)
    w_down = (torch.randn(d, f, device=device) / math.sqrt(f)).to(dt)
    return [x, w_gate_up, w_down]


def roofline(x, w_gate_up, w_down):
    t, d = x.shape
    f = w_down.shape[1]
    flops = 2 * t * d * (2 * f) + 2 * t * f * d + 6 * t * f
    es = x.element_size()
    bytes_ = es * (2 * x.numel() + w_gate_up.numel() + w_down.numel())
    return {"flops": int(flops), "bytes": int(bytes_)}
