"""Mamba-2 mixer tail in NVFP4 (W4A4, software-emulated on Hopper): grouped gated RMSNorm of the SSM output,
dynamic NVFP4 quantization of the normalised activation (e2m1 values, e4m3 scale per 16 values, static fp32 global
input scale), and the out_proj GEMM against an NVFP4 weight; bf16 out.

Provenance: NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4 (ModelOpt; Mamba GEMMs away from attention layers are NVFP4,
weights and inputs). Base config (config.json of NVIDIA-Nemotron-3-Nano-30B-A3B): hidden_size 2688,
mamba_num_heads 64, mamba_head_dim 64 (d_inner 4096), n_groups 8, layer_norm_epsilon 1e-5. The mixer output is
out_proj(MambaRMSNormGated(y, z)) with group_size = d_inner / n_groups = 512 and norm_before_gate=False:
    g = y * silu(z);  g_n = g / sqrt(mean_over_group(g ** 2) + 1e-5) * norm_w.
NVFP4 activation quantization (as vLLM's scaled_fp4_quant with the checkpoint's static input_scale =
calibration amax / (6 * 448)): per 16 consecutive values, s = e4m3(min(amax16 / (6 * input_scale), 448)),
code = e2m1_rne(clamp(g_n / (s * input_scale), -6, 6)). The weight uses the same format with its own per-tensor
scale (weight_scale_2). The GEMM multiplies (code * s) operands and applies alpha = input_scale * weight_scale_2 to
the product, as the Blackwell FP4 GEMM does. Blackwell has FP4 tensor cores; on Hopper the product must be
emulated (e.g. dequantize to bf16 / fp8 and use those tensor cores); here the gated norm feeds the quantizer
straight from fp32 (a fused norm + quant kernel; no bf16 round trip in between). Scales are in plain row-major
[rows, K/16] layout, not Blackwell's swizzled layout. Weight codes: two per uint8, element 2i in the low nibble.
Workload: one chunked-prefill step of 8192 tokens through a Mamba-2 layer.
Full scale: y, z [8192, 4096] bf16, norm_w [4096] bf16, input_scale [1] fp32, w_packed [2688, 2048] uint8,
w_scale [2688, 256] float8_e4m3fn, w_global [1] fp32 -> out [8192, 2688] bf16.
Small scale: y, z [24, 1024] (2 norm groups of 512), out_proj 1024 -> 256.

Facts a kernel may rely on: norm group 512 = 32 quantization blocks of 16 (a block never straddles groups);
d_inner = 4096 and hidden 2688 = 21 * 128 are multiples of 128; input_scale and w_global are one-element fp32
tensors; blocks whose e4m3 scale is 0 quantize to zero.
"""
import torch
import torch.nn.functional as F

FP4_BLOCK = 16
NORM_GROUP = 512
EPS = 1e-5
FP8_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _dtypes(y):
    if y.dtype == torch.float64:
        return torch.float64, torch.float64
    return y.dtype, torch.float32


def _gated_rms_norm(y, z, norm_w, acc):
    T, D = y.shape
    g = (y.to(acc) * F.silu(z.to(acc))).view(T, D // NORM_GROUP, NORM_GROUP)
    g = g * torch.rsqrt(g.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return g.view(T, D) * norm_w.to(acc)


def _e2m1_codes(v):
    """Nearest e2m1 value of v (|v| <= 6), ties to the even code; uint8 codes with the sign in bit 3."""
    a = v.abs()
    mids = torch.tensor(E2M1_MIDPOINTS, dtype=v.dtype, device=v.device)
    lo = torch.bucketize(a, mids, right=False)
    hi = torch.bucketize(a, mids, right=True)
    code = torch.where(lo % 2 == 0, lo, hi)
    return (code + 8 * (v < 0).long()).to(torch.uint8)


def _quant_nvfp4_rows(a, global_scale):
    """a [R, K] (fp32/fp64) -> codes uint8 [R, K], e4m3 block scales [R, K/16]."""
    R, K = a.shape
    blk = a.view(R, K // FP4_BLOCK, FP4_BLOCK)
    gs = global_scale.to(a.dtype)
    s = (blk.abs().amax(dim=-1) / (6.0 * gs)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    sf = s.to(a.dtype).unsqueeze(-1) * gs
    v = torch.where(sf > 0, blk / sf, torch.zeros_like(blk)).clamp(-6.0, 6.0)
    return _e2m1_codes(v).view(R, K), s


def _codes_times_scale(codes, scale, dtype):
    """e2m1(code) * e4m3 block scale: exact in bf16."""
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    vals = torch.cat([lut, -lut])[codes.long()]
    R, K = vals.shape
    return (vals.view(R, K // FP4_BLOCK, FP4_BLOCK) * scale.to(dtype).unsqueeze(-1)).view(R, K)


def _unpack(packed):
    N, half = packed.shape
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(N, 2 * half)


def reference(y, z, norm_w, input_scale, w_packed, w_scale, w_global):
    cdt, acc = _dtypes(y)
    g_n = _gated_rms_norm(y, z, norm_w, acc)
    a_codes, a_scale = _quant_nvfp4_rows(g_n, input_scale)
    a = _codes_times_scale(a_codes, a_scale, cdt)
    w = _codes_times_scale(_unpack(w_packed), w_scale, cdt)
    alpha = input_scale.to(acc) * w_global.to(acc)
    return ((a @ w.t()).to(acc) * alpha).to(cdt)


def _round_e2m1_values(v):
    """Round-to-nearest-even on the e2m1 grid written per binade: step 0.5 below 2, 1 in [2, 4), 2 in [4, 6]."""
    a = v.abs()
    r = torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), 2 * torch.round(a / 2)))
    return torch.copysign(r, v)


def _decode_e2m1_arith(code, dtype):
    sign = 1.0 - 2.0 * ((code >> 3) & 1).to(dtype)
    e = ((code >> 1) & 3).to(dtype)
    m = (code & 1).to(dtype)
    return sign * torch.where(e == 0, 0.5 * m, torch.pow(2.0, e - 1) * (1.0 + 0.5 * m))


def alt_reference(y, z, norm_w, input_scale, w_packed, w_scale, w_global):
    """Same math with a per-group loop for the norm, value-domain e2m1 rounding, bit-field weight decoding and
    all scales folded into the operands."""
    cdt, acc = _dtypes(y)
    T, D = y.shape
    g = y.to(acc) * (z.to(acc) / (1.0 + torch.exp(-z.to(acc))))
    g_n = torch.empty_like(g)
    for j in range(D // NORM_GROUP):
        sl = slice(j * NORM_GROUP, (j + 1) * NORM_GROUP)
        ms = (g[:, sl] * g[:, sl]).sum(dim=-1, keepdim=True) / NORM_GROUP
        g_n[:, sl] = g[:, sl] / torch.sqrt(ms + EPS) * norm_w[sl].to(acc)
    gs = input_scale.to(acc)
    blk = g_n.reshape(T, D // FP4_BLOCK, FP4_BLOCK)
    s = torch.clamp(blk.abs().max(dim=-1).values / (6.0 * gs), max=FP8_MAX).to(torch.float8_e4m3fn).to(acc)
    denom = (s * gs).unsqueeze(-1)
    q = _round_e2m1_values(torch.clamp(torch.where(denom > 0, blk / denom, torch.zeros_like(blk)), -6.0, 6.0))
    a = (q * denom).reshape(T, D)
    N, half = w_packed.shape
    w = torch.empty(N, 2 * half, dtype=acc, device=y.device)
    w[:, 0::2] = _decode_e2m1_arith(w_packed.long() & 0xF, acc)
    w[:, 1::2] = _decode_e2m1_arith(w_packed.long() >> 4, acc)
    w = w * w_scale.to(acc).repeat_interleave(FP4_BLOCK, dim=1) * w_global.to(acc)
    return (a @ w.t()).to(cdt)


def make_inputs(device="cuda", scale="full"):
    T, D, H = (8192, 4096, 2688) if scale == "full" else (24, 1024, 256)
    # SSM output (with the D skip term) and the z gate of in_proj
    y = (torch.randn(T, D, device=device) * (0.3 + torch.rand(D, device=device))).to(torch.bfloat16)
    z = (torch.randn(T, D, device=device) * 1.5 + 0.5).to(torch.bfloat16)
    norm_w = (1.0 + 0.25 * torch.randn(D, device=device)).to(torch.bfloat16)
    # static NVFP4 input scale from calibration: amax ~ 12 over calibration tokens
    input_scale = torch.full((1,), 12.0 / (6.0 * FP8_MAX), device=device)
    w = torch.randn(H, D, device=device) * (1.0 / D ** 0.5)
    w_global = (w.abs().amax() / (6.0 * FP8_MAX)).reshape(1)
    codes, w_scale = _quant_nvfp4_rows(w, w_global)
    w_packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return [y, z, norm_w, input_scale, w_packed, w_scale, w_global]


def roofline(y, z, norm_w, input_scale, w_packed, w_scale, w_global):
    T, D = y.shape
    H = w_packed.shape[0]
    return {"flops": int(2 * T * H * D + 12 * T * D),
            "bytes": int(2 * T * D * 2 + D * 2 + 8 + w_packed.numel() + w_scale.numel() + T * H * 2)}
