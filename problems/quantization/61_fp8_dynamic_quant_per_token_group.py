"""Dynamic per-(token, 128-channel group) fp8 e4m3 activation quantization with power-of-two (UE8M0) scales.

Provenance: DeepSeek-V3.1 fp8 inference (config.json: hidden_size 7168; quantization_config: fmt e4m3,
activation_scheme dynamic, weight_block_size [128, 128], scale_fmt "ue8m0"). Every fp8 linear layer quantizes its
bf16 input on the fly at a granularity of one scale per token per 128 channels ("act_quant" in DeepSeek's
inference/kernel.py, per_token_group_quant_fp8 with UE8M0 scales in vLLM/SGLang). With scale_fmt ue8m0 the scale is
rounded UP to a power of two: s = 2 ** ceil(log2(max(amax, 1e-4) / 448)), so x / s is exact and the stored scale is
a pure exponent (what DeepGEMM consumes).
Workload: one chunked-prefill step of 16384 tokens entering a 7168-wide fp8 projection (e.g. the dense MLP or the
MoE expert input of a DeepSeek-V3.1 layer).
Full scale: x [16384, 7168] bf16 -> x_q [16384, 7168] float8_e4m3fn, x_scale [16384, 56] float32.
Small scale: x [48, 512] bf16 -> x_q [48, 512], x_scale [48, 4].

Semantics, per row t and group g (columns 128*g ... 128*g+127):
    amax = max(max_i |x[t, i]|, 1e-4)                    (exact: a max of bf16 values)
    s    = smallest power of two >= amax / 448            (= 2 ** ceil(log2(amax / 448)); amax * (1/448) gives the
                                                           same power of two for every bf16 amax)
    x_q  = e4m3(x / s)  with round-to-nearest-even        (|x / s| <= 448, x / s is exact, no saturation occurs)
Both outputs are compared bit for bit (comparator "exact"), the sign of zero included (tiny negative values round
to -0.0, as the hardware conversion does).

Facts a kernel may rely on: K = 7168 = 56 groups of 128 (K is a multiple of 128); x is contiguous row-major;
scales are powers of two stored as float32, one per (token, group), row-major [T, K/128].
"""
import torch

GROUP = 128
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4

OUTPUT_NAMES = ("x_q", "x_scale")
COMPARATORS = {"x_q": "exact", "x_scale": "exact"}


def _pow2_ceil(v):
    """Smallest power of two >= v (v > 0), computed exactly: v = m * 2**e with m in [0.5, 1)."""
    m, _ = torch.frexp(v)
    # m == 0.5 means v is already a power of two; otherwise v / m == 2**e exactly.
    return torch.where(m == 0.5, v, v / m)


def reference(x):
    T, K = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xg = x.to(acc).view(T, K // GROUP, GROUP)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR)
    scale = _pow2_ceil(amax / FP8_MAX)
    x_q = (xg / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(T, K)
    return x_q, scale.view(T, K // GROUP).to(torch.float32)


def alt_reference(x):
    """Same math through log2/ceil and an explicit exponent search (independent of frexp)."""
    T, K = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xg = x.to(acc).reshape(T, K // GROUP, GROUP)
    amax = torch.maximum(xg.abs().max(dim=-1).values, torch.full((), AMAX_FLOOR, dtype=acc, device=x.device))
    e = torch.ceil(torch.log2(amax / FP8_MAX))
    scale = torch.pow(torch.full((), 2.0, dtype=acc, device=x.device), e)
    # guard the transcendental path: step the exponent so that scale is the smallest power of two >= amax / 448
    scale = torch.where(scale * FP8_MAX < amax, scale * 2, scale)
    scale = torch.where(scale * (FP8_MAX / 2) >= amax, scale / 2, scale)
    x_q = torch.clamp(xg / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(T, K)
    return x_q, scale.to(torch.float32)


def make_inputs(device="cuda", scale="full"):
    T, K = (16384, 7168) if scale == "full" else (48, 512)
    # hidden states after RMSNorm: unit-scale entries with a few outlier channels, as seen in LLM activations
    x = torch.randn(T, K, device=device)
    outlier_gain = 1.0 + 9.0 * (torch.rand(K, device=device) < 0.01).float()
    x = (x * outlier_gain).to(torch.bfloat16)
    return [x]


def roofline(x):
    T, K = x.shape
    return {"flops": int(3 * T * K), "bytes": int(T * K * 2 + T * K * 1 + T * (K // GROUP) * 4)}
