"""SmoothQuant W8A8 linear: per-channel smoothing of the bf16 activation, dynamic per-token symmetric int8
quantization, int8 x int8 GEMM with exact int32 accumulation, dequantization by the per-token activation scale and
the per-output-channel weight scale, bf16 out.

Provenance: SmoothQuant (Xiao et al., 2023) W8A8 as served by vLLM's compressed-tensors "W8A8 int8" scheme for
checkpoints like RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8 (weights int8 per output channel, activations
int8 per token, dynamic). Layer: Llama-3.1-8B self_attn qkv_proj (config.json: hidden_size 4096,
num_attention_heads 32, num_key_value_heads 8, head_dim 128, so qkv maps 4096 -> (32 + 2 * 8) * 128 = 6144).
SmoothQuant migrates activation outliers into the weight with a per-input-channel factor s (alpha = 0.5): the
stored weight is already W * s; here the division x / s is kept as an explicit runtime step fused into the
quantizer instead of being folded into the preceding RMSNorm weight.
Workload: one chunked-prefill step of 4096 tokens.
Full scale: x [4096, 4096] bf16, smooth [4096] fp32, w_q [6144, 4096] int8, w_scale [6144] fp32 -> out [4096, 6144]
bf16.  Small scale: x [32, 256], w_q [384, 256].

Semantics (the reference computes the activation quantization in fp32):
    xs[t, k]   = x[t, k] / smooth[k]
    a_scale[t] = max(max_k |xs[t, k]|, 1e-10) / 127
    x_q[t, k]  = clamp(round_half_to_even(xs[t, k] / a_scale[t]), -128, 127)      (int8)
    acc[t, n]  = sum_k x_q[t, k] * w_q[n, k]                                        (exact int32)
    out[t, n]  = bf16(acc[t, n] * a_scale[t] * w_scale[n])
Facts a kernel may rely on: K = 4096 and N = 6144 are multiples of 128; |acc| < 2**31 always (K * 128 * 127);
w_q values lie in [-127, 127]; smooth > 0.
"""
import torch

QMAX = 127.0


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _quant_act(x, smooth, acc):
    xs = x.to(acc) / smooth.to(acc)
    a_scale = xs.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / QMAX
    x_q = torch.round(xs / a_scale).clamp(-128, 127).to(torch.int8)
    return x_q, a_scale


def reference(x, smooth, w_q, w_scale):
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act(x, smooth, acc)
    acc_i32 = torch._int_mm(x_q, w_q.t())  # int8 x int8 -> int32, exact
    return (acc_i32.to(acc) * a_scale * w_scale.to(acc)).to(x.dtype)


def alt_reference(x, smooth, w_q, w_scale):
    """Integer accumulation emulated exactly in float64 (|partial sums| < 2**53), no _int_mm."""
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act(x, smooth, acc)
    acc_f64 = x_q.to(torch.float64) @ w_q.to(torch.float64).t()
    return (acc_f64.to(acc) * a_scale * w_scale.to(acc)).to(x.dtype)


def make_inputs(device="cuda", scale="full"):
    T, K, N = (4096, 4096, 6144) if scale == "full" else (32, 256, 384)
    # activations with SmoothQuant-style outlier channels: log-normal channel magnitudes, ~1% channels 20x larger
    gain = torch.exp(0.5 * torch.randn(K, device=device))
    gain = gain * (1.0 + 19.0 * (torch.rand(K, device=device) < 0.01).float())
    x = (torch.randn(T, K, device=device) * gain).to(torch.bfloat16)
    w = torch.randn(N, K, device=device) * (1.0 / K ** 0.5)
    # alpha = 0.5 smoothing factors from the (calibration) activation and weight channel ranges
    w_absmax = w.abs().amax(dim=0)
    smooth = ((3.0 * gain).sqrt() / w_absmax.sqrt()).clamp_min(1e-5)
    w_smoothed = w * smooth
    w_scale = w_smoothed.abs().amax(dim=1).clamp_min(1e-10) / QMAX
    w_q = torch.round(w_smoothed / w_scale[:, None]).clamp(-127, 127).to(torch.int8)
    return [x, smooth.float(), w_q, w_scale.float()]


def roofline(x, smooth, w_q, w_scale):
    T, K = x.shape
    N = w_q.shape[0]
    return {"flops": int(2 * T * N * K),
            "bytes": int(T * K * 2 + K * 4 + N * K + N * 4 + T * N * 2)}
