"""Output-embedding (LM head) projection with an NVFP4 weight, emulated on Hopper as weight-only FP4: unpack e2m1
codes (two per uint8), scale each 16-value block by its e4m3 scale and the per-tensor fp32 global scale, multiply by
the bf16 final hidden states; bf16 logits.

Provenance: Llama-3.1-8B LM head (config.json: hidden_size 4096, vocab_size 128256, tie_word_embeddings false).
Format: NVFP4 as written by NVIDIA ModelOpt / consumed by vLLM and TensorRT-LLM: e2m1 values
{0, 0.5, 1, 1.5, 2, 3, 4, 6} x sign, two per byte (element 2i in the low nibble, 2i+1 in the high nibble), one
float8_e4m3fn scale per 16 consecutive values along K (weight_scale), one fp32 per-tensor scale (weight_scale_2):
    w[n, k] = e2m1(code[n, k]) * weight_scale[n, k // 16] * weight_scale_2.
Blackwell has FP4 tensor cores; on Hopper vLLM runs NVFP4 checkpoints weight-only (dequantize to bf16 inside the
GEMM, Marlin-style), which is what this problem asks for. Scales are in plain row-major [N, K/16] layout (not the
Blackwell swizzled layout). ModelOpt's own checkpoints usually keep lm_head in bf16; quantizing the LM head (the
largest single weight of the model, 0.5 G parameters) to FP4 is this problem's choice.
Workload: one decode step of a 256-request batch (logits for the last token of every request).
Full scale: x [256, 4096] bf16, w_packed [128256, 2048] uint8, w_scale [128256, 256] float8_e4m3fn,
w_global [1] fp32 -> logits [256, 128256] bf16.
Small scale: x [8, 256], vocab 1000 -> w_packed [1000, 128], w_scale [1000, 16].

Semantics (the reference dequantizes to codes * block scale, which is exact in bf16, multiplies in bf16 with fp32
accumulation, and applies the global scale to the product, as an NVFP4 GEMM applies alpha):
    logits[m, n] = (sum_k x[m, k] * e2m1(code[n, k]) * weight_scale[n, k // 16]) * weight_scale_2
Facts a kernel may rely on: K = 4096 (multiple of 16 and of 128); vocab 128256 = 1002 * 128; block scales are
positive e4m3 values (never NaN); the global scale is a one-element fp32 tensor.
"""
import torch

FP4_BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
FP8_MAX = 448.0


def _dtypes(x):
    if x.dtype == torch.float64:
        return torch.float64, torch.float64
    return x.dtype, torch.float32


def _unpack_codes(packed):
    """uint8 [N, K/2] -> int64 codes [N, K]; element 2i is the low nibble."""
    N, half = packed.shape
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).view(N, 2 * half).long()


def _dequant_blocks(packed, scale, dtype):
    """codes * block scale (exact in bf16), without the global scale."""
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=packed.device)
    lut = torch.cat([lut, -lut])
    vals = lut[_unpack_codes(packed)]
    N, K = vals.shape
    return (vals.view(N, K // FP4_BLOCK, FP4_BLOCK) * scale.to(dtype).unsqueeze(-1)).view(N, K)


def reference(x, w_packed, w_scale, w_global):
    cdt, acc = _dtypes(x)
    w = _dequant_blocks(w_packed, w_scale, cdt)
    return ((x @ w.t()).to(acc) * w_global.to(acc)).to(cdt)


def _decode_e2m1_arith(code, dtype):
    """e2m1 bit fields: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    sign = 1.0 - 2.0 * ((code >> 3) & 1).to(dtype)
    e = ((code >> 1) & 3).to(dtype)
    m = (code & 1).to(dtype)
    mag = torch.where(e == 0, 0.5 * m, torch.pow(2.0, e - 1) * (1.0 + 0.5 * m))
    return sign * mag


def alt_reference(x, w_packed, w_scale, w_global):
    """Bit-field decoding instead of a table, scales folded into the weight, accumulation in the output loop."""
    cdt, acc = _dtypes(x)
    N, half = w_packed.shape
    lo = _decode_e2m1_arith(w_packed.long() & 0xF, acc)
    hi = _decode_e2m1_arith(w_packed.long() >> 4, acc)
    w = torch.empty(N, 2 * half, dtype=acc, device=x.device)
    w[:, 0::2] = lo
    w[:, 1::2] = hi
    w = w * w_scale.to(acc).repeat_interleave(FP4_BLOCK, dim=1) * w_global.to(acc)
    return (x.to(acc) @ w.t()).to(cdt)


def _e2m1_codes(v):
    """Round v (|v| <= 6 after scaling) to the nearest e2m1 value, ties to even code; returns uint8 codes 0-15."""
    a = v.abs()
    mids = torch.tensor(E2M1_MIDPOINTS, dtype=v.dtype, device=v.device)
    lo = torch.bucketize(a, mids, right=False)   # ties resolved downwards
    hi = torch.bucketize(a, mids, right=True)    # ties resolved upwards
    code = torch.where(lo % 2 == 0, lo, hi)
    return (code + 8 * (v < 0).long()).to(torch.uint8)


def _quant_nvfp4(w, rows_per_chunk=8192):
    """fp32 [N, K] -> (packed uint8 [N, K/2], e4m3 block scales [N, K/16], fp32 global scale [1])."""
    N, K = w.shape
    w_global = (w.abs().amax() / (6.0 * FP8_MAX)).reshape(1)
    packed = torch.empty(N, K // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(N, K // FP4_BLOCK, dtype=torch.float8_e4m3fn, device=w.device)
    for r in range(0, N, rows_per_chunk):
        blk = w[r:r + rows_per_chunk].view(-1, K // FP4_BLOCK, FP4_BLOCK)
        s = (blk.abs().amax(dim=-1) / (6.0 * w_global)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
        sf = s.float().unsqueeze(-1) * w_global
        v = torch.where(sf > 0, blk / sf, torch.zeros_like(blk)).clamp(-6.0, 6.0)
        codes = _e2m1_codes(v).view(-1, K)
        packed[r:r + rows_per_chunk] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        scales[r:r + rows_per_chunk] = s
    return packed, scales, w_global


def make_inputs(device="cuda", scale="full"):
    M, K, V = (256, 4096, 128256) if scale == "full" else (8, 256, 1000)
    # final-norm hidden states (norm weight folded in): unit scale with a few larger channels
    x = (torch.randn(M, K, device=device) * (0.5 + torch.rand(K, device=device))).to(torch.bfloat16)
    w = torch.randn(V, K, device=device) * 0.02
    w_packed, w_scale, w_global = _quant_nvfp4(w)
    return [x, w_packed, w_scale, w_global]


def roofline(x, w_packed, w_scale, w_global):
    M, K = x.shape
    V = w_packed.shape[0]
    return {"flops": int(2 * M * V * K),
            "bytes": int(M * K * 2 + w_packed.numel() + w_scale.numel() + 4 + M * V * 2)}
