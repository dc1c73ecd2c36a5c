"""Fused gate/up projection of a block-fp8 MLP: fp8 e4m3 activations with per-(token, 128-group) scales times a
128x128 block-scaled fp8 e4m3 gate_up weight, then SiLU(gate) * up, bf16 out.

Provenance: Qwen3-8B-FP8 MLP (config.json: hidden_size 4096, intermediate_size 12288, hidden_act silu;
quantization_config: quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size [128, 128]).
vLLM merges gate_proj and up_proj into one [2 * 12288, 4096] weight (gate rows first, then up rows) with one fp32
dequantization scale per 128x128 block (weight_scale_inv), and the MLP input arrives already quantized by the fused
RMSNorm + per-token-group fp8 quant kernel that precedes it (one fp32 scale = amax / 448 per token per 128 channels).
The GEMM applies a_scale[t, kb] * w_scale[nb, kb] to every 128-deep partial product; SiLU-and-mul is its epilogue.
Workload: one chunked-prefill step of 4096 tokens.
Full scale: x_q [4096, 4096] float8_e4m3fn, x_scale [4096, 32] fp32, w_q [24576, 4096] float8_e4m3fn,
w_scale [192, 32] fp32 -> out [4096, 12288] bf16.
Small scale: x_q [48, 256], x_scale [48, 2], w_q [512, 256], w_scale [4, 2] -> out [48, 256].

Semantics:
    h[t, n]   = sum_k (x_q[t, k] * x_scale[t, k // 128]) * (w_q[n, k] * w_scale[n // 128, k // 128])
    out[t, j] = silu(h[t, j]) * h[t, I + j]        for j < I = N / 2 (I = 12288)
The reference dequantizes into bf16 and multiplies in bf16 (fp32 accumulation); the SiLU-and-mul runs in fp32.
Output dtype is bf16 (the float64 anchor keeps float64).
Facts a kernel may rely on: K = 4096 and I = 12288 are multiples of 128, so no 128x128 weight block straddles the
gate/up boundary; scales are row-major fp32; x_scale has K / 128 columns.
"""
import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128


def _dtypes(x_q):
    """(compute dtype, accumulation dtype): bf16/fp32 for fp8 inputs, float64 for the float64 anchor."""
    if x_q.dtype == torch.float64:
        return torch.float64, torch.float64
    return torch.bfloat16, torch.float32


def _dequant_act(x_q, x_scale, acc):
    T, K = x_q.shape
    return (x_q.to(acc).view(T, K // BLOCK, BLOCK) * x_scale.to(acc)[:, :, None]).view(T, K)


def _dequant_weight(w_q, w_scale, acc):
    N, K = w_q.shape
    blocks = w_q.to(acc).view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    return (blocks * w_scale.to(acc)[:, None, :, None]).view(N, K)


def reference(x_q, x_scale, w_q, w_scale):
    T, K = x_q.shape
    N = w_q.shape[0]
    cdt, acc = _dtypes(x_q)
    x = _dequant_act(x_q, x_scale, acc).to(cdt)
    w = _dequant_weight(w_q, w_scale, acc).to(cdt)
    h = (x @ w.t()).to(acc)
    gate, up = h[:, : N // 2], h[:, N // 2:]
    return (F.silu(gate) * up).to(cdt)


def alt_reference(x_q, x_scale, w_q, w_scale):
    """Blockwise-scaled accumulation over 128-deep K blocks (DeepGEMM form), separate gate and up GEMMs,
    SiLU written out as g / (1 + exp(-g))."""
    T, K = x_q.shape
    N = w_q.shape[0]
    cdt, acc = _dtypes(x_q)
    xq = x_q.to(acc)
    xs = x_scale.to(acc)
    ws = w_scale.to(acc).repeat_interleave(BLOCK, dim=0)[:N]  # [N, K/128]
    wq = w_q.to(acc)
    h = torch.zeros(T, N, dtype=acc, device=x_q.device)
    for kb in range(K // BLOCK):
        sl = slice(kb * BLOCK, (kb + 1) * BLOCK)
        h += (xq[:, sl] @ wq[:, sl].t()) * xs[:, kb:kb + 1] * ws[:, kb].unsqueeze(0)
    g = h[:, : N // 2]
    u = h[:, N // 2:]
    return (g / (1.0 + torch.exp(-g)) * u).to(cdt)


def _quant_weight_block(w):
    N, K = w.shape
    blocks = w.view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(N, K)
    return q, scale.view(N // BLOCK, K // BLOCK).contiguous()


def make_inputs(device="cuda", scale="full"):
    T, K, I = (4096, 4096, 12288) if scale == "full" else (48, 256, 256)
    N = 2 * I
    # post-RMSNorm hidden states, quantized per token per 128 channels (amax / 448, fp32 scales)
    x = torch.randn(T, K, device=device) * (0.5 + torch.rand(K, device=device))
    x = x.to(torch.bfloat16).float().view(T, K // BLOCK, BLOCK)
    x_scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / FP8_MAX
    x_q = (x / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(T, K)
    x_scale = x_scale.view(T, K // BLOCK).contiguous()
    w = torch.randn(N, K, device=device) * (1.0 / K ** 0.5)
    w_q, w_scale = _quant_weight_block(w)
    return [x_q, x_scale, w_q, w_scale]


def roofline(x_q, x_scale, w_q, w_scale):
    T, K = x_q.shape
    N = w_q.shape[0]
    return {"flops": int(2 * T * N * K + 4 * T * (N // 2)),
            "bytes": int(T * K + x_scale.numel() * 4 + N * K + w_scale.numel() * 4 + T * (N // 2) * 2)}
