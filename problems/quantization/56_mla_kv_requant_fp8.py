"""MLA latent-KV path of DeepSeek-V3.1 in fp8: block-fp8 kv_a_proj_with_mqa GEMM (fp8 activations with UE8M0
per-token-group scales, 128x128 block-scaled fp8 weight), RMSNorm of the 512-wide latent, and requantization of the
normalised latent to fp8 e4m3 with one fp32 scale per token (the form written into an fp8 latent cache); the
64-wide rope key part is returned in bf16.

Provenance: DeepSeek-V3.1 (config.json: hidden_size 7168, kv_lora_rank 512, qk_rope_head_dim 64,
rms_norm_eps 1e-6; quantization_config: fmt e4m3, weight_block_size [128, 128], scale_fmt "ue8m0").
kv_a_proj_with_mqa maps 7168 -> 512 + 64 = 576; its fp8 weight has ceil(576 / 128) = 5 x 56 block scales (the last
row block covers rows 512-575 only). Its input is the attention-norm output, already quantized by act_quant with
power-of-two (UE8M0) scales, one per token per 128 channels. kv_a_layernorm (DeepseekV3RMSNorm: fp32 statistics,
result cast to bf16, times the bf16 weight) normalises the latent, which is then quantized per token
(amax / 448, fp32 scale) for the fp8 MLA cache. RoPE on k_pe and the cache write itself are not part of this problem.
Workload: one chunked-prefill step of 8192 tokens.
Full scale: x_q [8192, 7168] float8_e4m3fn, x_scale [8192, 56] fp32, w_q [576, 7168] float8_e4m3fn,
w_scale [5, 56] fp32, kv_norm_w [512] bf16 -> kv_c_fp8 [8192, 512] float8_e4m3fn, kv_c_scale [8192, 1] fp32,
k_pe [8192, 64] bf16.
Small scale: T = 40, hidden 256 (the 576 = 512 + 64 output split is kept).

Semantics:
    h      = (x_q * x_scale) @ (w_q * w_scale)^T        (block-expanded scales; reference: fp32 operands and
                                                         accumulation, result rounded to bf16 like the layer output)
    c, k_pe = h[:, :512], h[:, 512:]
    c_n    = kv_norm_w * bf16(c / sqrt(mean(c ** 2, -1) + 1e-6))   (statistics in fp32)
    kv_c_scale[t] = max(max_i |c_n[t, i]|, 1e-10) / 448  (fp32);  kv_c_fp8 = e4m3_rne(clamp(c_n / kv_c_scale, +-448))
kv_c_fp8 is compared dequantized ("quantized" comparator, 1 e4m3 ulp of slack); the scale and k_pe by the float rule.
Facts a kernel may rely on: N = 576 (4.5 weight row blocks, last one half full), K = 7168 = 56 x 128; x_scale
entries are powers of two; the latent norm needs the full 512-wide row of the GEMM output.
"""
import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
KV_LORA = 512
ROPE_DIM = 64
EPS = 1e-6

OUTPUT_NAMES = ("kv_c_fp8", "kv_c_scale", "k_pe")
COMPARATORS = {"kv_c_fp8": {"kind": "quantized", "scale": "kv_c_scale", "block": [1, 0],
                            "format": "float8_e4m3fn"}}


def _dtypes(ref):
    if ref.dtype == torch.float64:
        return torch.float64, torch.float64
    return ref.dtype, torch.float32


def _dequant_act(x_q, x_scale, acc):
    T, K = x_q.shape
    return (x_q.to(acc).view(T, K // BLOCK, BLOCK) * x_scale.to(acc)[:, :, None]).view(T, K)


def _dequant_weight(w_q, w_scale, acc):
    N, K = w_q.shape
    row_scale = w_scale.to(acc).repeat_interleave(BLOCK, dim=0)[:N]  # [N, K/128]
    return (w_q.to(acc).view(N, K // BLOCK, BLOCK) * row_scale[:, :, None]).view(N, K)


def _quant_per_token(c_n, acc):
    amax = c_n.to(acc).abs().amax(dim=-1, keepdim=True).clamp_min(1e-10)
    scale = (amax / FP8_MAX).to(torch.float32)
    q = (c_n.to(acc) / scale.to(acc)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def reference(x_q, x_scale, w_q, w_scale, kv_norm_w):
    cdt, acc = _dtypes(kv_norm_w)
    x = _dequant_act(x_q, x_scale, acc)
    w = _dequant_weight(w_q, w_scale, acc)
    h = (x @ w.t()).to(cdt)  # fp32 GEMM: the requantized latent must not inherit bf16-operand noise
    c, k_pe = h[:, :KV_LORA], h[:, KV_LORA:]
    cf = c.to(acc)
    c_n = kv_norm_w * (cf * torch.rsqrt(cf.pow(2).mean(dim=-1, keepdim=True) + EPS)).to(cdt)
    kv_c_fp8, kv_c_scale = _quant_per_token(c_n, acc)
    return kv_c_fp8, kv_c_scale, k_pe.contiguous()


def alt_reference(x_q, x_scale, w_q, w_scale, kv_norm_w):
    """Blockwise-scaled accumulation per 128-deep K block (DeepGEMM form); norm via vector_norm."""
    cdt, acc = _dtypes(kv_norm_w)
    T, K = x_q.shape
    N = w_q.shape[0]
    xq = x_q.to(acc)
    wq = w_q.to(acc)
    xs = x_scale.to(acc)
    ws = w_scale.to(acc).repeat_interleave(BLOCK, dim=0)[:N]
    h = torch.zeros(T, N, dtype=acc, device=x_q.device)
    for kb in range(K // BLOCK):
        sl = slice(kb * BLOCK, (kb + 1) * BLOCK)
        h += (xq[:, sl] @ wq[:, sl].t()) * xs[:, kb:kb + 1] * ws[:, kb].unsqueeze(0)
    h = h.to(cdt)
    c = h[:, :KV_LORA].to(acc)
    rms = torch.linalg.vector_norm(c, dim=-1, keepdim=True) / KV_LORA ** 0.5
    c_n = kv_norm_w * (c / torch.sqrt(rms * rms + EPS)).to(cdt)
    scale = (c_n.to(acc).abs().max(dim=-1, keepdim=True).values.clamp_min(1e-10) / FP8_MAX).to(torch.float32)
    q = torch.clamp(c_n.to(acc) / scale.to(acc), -FP8_MAX, FP8_MAX).to(FP8)
    return q, scale, h[:, KV_LORA:].contiguous()


def _pow2_ceil(v):
    m, _ = torch.frexp(v)
    return torch.where(m == 0.5, v, v / m)


def make_inputs(device="cuda", scale="full"):
    T, K = (8192, 7168) if scale == "full" else (40, 256)
    N = KV_LORA + ROPE_DIM
    # attention-norm output, quantized by act_quant with UE8M0 (power-of-two) scales per token per 128 channels
    x = (torch.randn(T, K, device=device) * (0.5 + torch.rand(K, device=device))).to(torch.bfloat16).float()
    xg = x.view(T, K // BLOCK, BLOCK)
    x_scale = _pow2_ceil(xg.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / FP8_MAX)
    x_q = (xg / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(T, K)
    x_scale = x_scale.view(T, K // BLOCK).contiguous()
    # kv_a_proj_with_mqa weight, quantized in 128x128 blocks (rows padded to 640 for the scale computation)
    nb = (N + BLOCK - 1) // BLOCK
    w = torch.zeros(nb * BLOCK, K, device=device)
    w[:N] = torch.randn(N, K, device=device) * (1.0 / K ** 0.5)
    blocks = w.view(nb, BLOCK, K // BLOCK, BLOCK)
    w_scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / FP8_MAX
    w_q = (blocks / w_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(nb * BLOCK, K)[:N].contiguous()
    w_scale = w_scale.view(nb, K // BLOCK).contiguous()
    kv_norm_w = (1.0 + 0.2 * torch.randn(KV_LORA, device=device)).to(torch.bfloat16)
    return [x_q, x_scale, w_q, w_scale, kv_norm_w]


def roofline(x_q, x_scale, w_q, w_scale, kv_norm_w):
    T, K = x_q.shape
    N = w_q.shape[0]
    return {"flops": int(2 * T * N * K + 8 * T * KV_LORA),
            "bytes": int(T * K + x_scale.numel() * 4 + N * K + w_scale.numel() * 4 + KV_LORA * 2
                         + T * KV_LORA + T * 4 + T * ROPE_DIM * 2)}
