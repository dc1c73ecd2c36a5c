"""Attention output projection of a block-fp8 checkpoint: dynamic per-(token, 128-group) fp8 e4m3 activation
quantization, then a GEMM with a 128x128 block-scaled fp8 e4m3 weight, bf16 out.

Provenance: Qwen3-VL-32B-Instruct-FP8 language model, self_attn.o_proj (text_config: hidden_size 5120,
num_attention_heads 64, head_dim 128, so o_proj maps 64 * 128 = 8192 -> 5120; quantization_config: quant_method fp8,
fmt e4m3, activation_scheme dynamic, weight_block_size [128, 128]). vLLM serves such checkpoints with the
"W8A8 block fp8" path: the bf16 attention output is quantized on the fly with one fp32 scale per token per 128 input
channels (amax / 448), the weight carries one fp32 dequantization scale per 128x128 block (weight_scale_inv), and the
GEMM applies a_scale[t, kb] * w_scale[nb, kb] to each 128-deep partial product (DeepGEMM / CUTLASS blockwise
semantics). "Per-token" activation quantization in the slate is realised in the per-token-group form the block-fp8
checkpoint requires.
Workload: one chunked-prefill step of 8192 tokens (an image-heavy multimodal prompt; vLLM's default token budget).
Full scale: x [8192, 8192] bf16, w_q [5120, 8192] float8_e4m3fn, w_scale [40, 64] fp32 -> out [8192, 5120] bf16.
Small scale: x [64, 512], w_q [384, 512], w_scale [3, 4] -> out [64, 384].

Semantics (real-number definition; the reference dequantizes then multiplies in the activation dtype):
    a_scale[t, g] = max(max_{i in group g} |x[t, i]|, 1e-10) / 448        (computed in fp32)
    x_q[t, i]     = e4m3_rne(clamp(x[t, i] / a_scale[t, g(i)], -448, 448))
    out[t, n]     = sum_i (x_q[t, i] * a_scale[t, g(i)]) * (w_q[n, i] * w_scale[n // 128, i // 128])
Facts a kernel may rely on: K = 8192 and N = 5120 are multiples of 128; one activation scale per (token, 128 input
channels); weight scale blocks are 128 x 128 aligned to the origin; fp32 accumulation is expected.
"""
import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _quant_act_per_token_group(x, acc):
    """bf16 [T, K] -> fp8 codes [T, K/128, 128] and fp32-math scales [T, K/128, 1]."""
    T, K = x.shape
    xg = x.to(acc).view(T, K // BLOCK, BLOCK)
    a_scale = xg.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / FP8_MAX
    x_q = (xg / a_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x_q, a_scale


def _dequant_weight(w_q, w_scale, acc):
    N, K = w_q.shape
    blocks = w_q.to(acc).view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    return (blocks * w_scale.to(acc)[:, None, :, None]).view(N, K)


def reference(x, w_q, w_scale):
    T, K = x.shape
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act_per_token_group(x, acc)
    x_dq = (x_q.to(acc) * a_scale).view(T, K).to(x.dtype)
    w_dq = _dequant_weight(w_q, w_scale, acc).to(x.dtype)
    return x_dq @ w_dq.t()


def alt_reference(x, w_q, w_scale):
    """Blockwise-scaled accumulation, as a DeepGEMM-style kernel computes it: per 128-deep K block, an unscaled
    product of fp8 codes, scaled by a_scale[t, kb] * w_scale[nb, kb] and summed over K blocks."""
    T, K = x.shape
    N = w_q.shape[0]
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act_per_token_group(x, acc)
    xq = x_q.to(acc)
    wq = w_q.to(acc)
    ws = w_scale.to(acc).repeat_interleave(BLOCK, dim=0)[:N]  # [N, K/128]
    out = torch.zeros(T, N, dtype=acc, device=x.device)
    for kb in range(K // BLOCK):
        part = xq[:, kb, :] @ wq[:, kb * BLOCK:(kb + 1) * BLOCK].t()
        out += part * a_scale[:, kb, :] * ws[:, kb].unsqueeze(0)
    return out.to(x.dtype)


def _quant_weight_block(w):
    """fp32 [N, K] -> (fp8 codes [N, K], fp32 scales [ceil(N/128), K/128]) with amax/448 per 128x128 block."""
    N, K = w.shape
    nb = (N + BLOCK - 1) // BLOCK
    wp = torch.zeros(nb * BLOCK, K, device=w.device, dtype=w.dtype)
    wp[:N] = w
    blocks = wp.view(nb, BLOCK, K // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(nb * BLOCK, K)[:N].contiguous()
    return q, scale.view(nb, K // BLOCK).contiguous()


def make_inputs(device="cuda", scale="full"):
    T, K, N = (8192, 8192, 5120) if scale == "full" else (64, 512, 384)
    # attention output (softmax-weighted sums of values): roughly unit scale, some heavier channels
    x = torch.randn(T, K, device=device) * (0.5 + torch.rand(K, device=device))
    x = x.to(torch.bfloat16)
    w = torch.randn(N, K, device=device) * (1.0 / K ** 0.5)
    w_q, w_scale = _quant_weight_block(w)
    return [x, w_q, w_scale]


def roofline(x, w_q, w_scale):
    T, K = x.shape
    N = w_q.shape[0]
    return {"flops": int(2 * T * N * K),
            "bytes": int(T * K * 2 + N * K + w_scale.numel() * 4 + T * N * 2)}
