"""Non-causal (bidirectional) attention over a packed batch of images of different patch counts (cu_seqlens).

Provenance: Qwen2-VL vision tower (vision_config: embed_dim 1280, num_heads 16 -> head_dim 80, patch_size 14,
spatial_merge_size 2, depth 32). Each vision block runs full attention within each image only; the HF/vLLM
implementations pass cu_seqlens (one segment per image / video frame) to a varlen attention kernel.
Softmax scale 1/sqrt(80).
Workload: the vision encoder pass of a multimodal serving batch: 8 images packed into 16384 patches (e.g.
images from ~380x380 to ~1000x1000 pixels). Image lengths are random multiples of 4 (a 14-px patch grid with
even height and width, as the 2x2 spatial merge requires), each between 744 and 4920 patches
(mostly 1200-3000).
Full scale: q, k, v [16384, 16, 80] bf16, cu_seqlens [9] int32; small scale: 3 images, 384 patches in total.
Semantics: out[t] = softmax(q[t] k[seg]^T / sqrt(80)) v[seg] over the keys of t's own image (no mask inside).
Precision: QK^T and PV in the input dtype (bf16 operands, fp32 accumulation), softmax in fp32, P rounded to
the input dtype before PV (HF eager attention). Output bf16 [total, 16, 80].
Facts a kernel may rely on: layout [tokens, heads, head_dim], contiguous; head_dim 80 (not a power of two);
16 heads; total tokens 16384 (full) / 384 (small) = cu_seqlens[-1]; cu_seqlens[0] = 0; every image length is a
multiple of 4 and >= 4; 8 images (full) / 3 images (small).
"""
import math

import torch


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def reference(q, k, v, cu_seqlens):
    dt = q.dtype
    acc = _acc_dtype(dt)
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for i in range(len(bounds) - 1):
        s0, s1 = bounds[i], bounds[i + 1]
        qi = q[s0:s1].transpose(0, 1)                 # [H, L, D]
        ki = k[s0:s1].transpose(0, 1)
        vi = v[s0:s1].transpose(0, 1)
        s = _mm(qi, ki.transpose(-1, -2)).to(acc) * scale
        p = torch.softmax(s, dim=-1).to(dt)
        out[s0:s1] = _mm(p, vi).transpose(0, 1)
    return out


def alt_reference(q, k, v, cu_seqlens):
    """Dense attention over the whole packed batch with a block-diagonal (same-image) mask."""
    total = q.shape[0]
    pos = torch.arange(total, device=q.device)
    seg = torch.bucketize(pos, cu_seqlens[1:].long(), right=True)   # image id of every token
    same = seg[:, None] == seg[None, :]
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    s = s.masked_fill(~same, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)


def _split_total(n_parts, total_units, device):
    """Random positive integer parts summing exactly to total_units (weights in [0.5, 1.5))."""
    w = 0.5 + torch.rand(n_parts, device=device)
    parts = torch.floor(w / w.sum() * total_units).long().clamp(min=1)
    parts[-1] = total_units - parts[:-1].sum()
    return parts


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        n_img, total = 8, 16384
    else:
        n_img, total = 3, 384
    H, D = 16, 80
    lens = 4 * _split_total(n_img, total // 4, device)      # multiples of 4 (even x even patch grids)
    cu_seqlens = torch.zeros(n_img + 1, dtype=torch.int32, device=device)
    cu_seqlens[1:] = torch.cumsum(lens, 0).to(torch.int32)
    dt = torch.bfloat16
    q = torch.randn(total, H, D, device=device).to(dt)
    k = torch.randn(total, H, D, device=device).to(dt)
    v = torch.randn(total, H, D, device=device).to(dt)
    return [q, k, v, cu_seqlens]


def roofline(q, k, v, cu_seqlens):
    H, D = q.shape[1], q.shape[2]
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pairs = int((lens * lens).sum().item())
    flops = 2 * 2 * H * pairs * D                          # QK^T and PV
    nbytes = 4 * q.numel() * q.element_size() + cu_seqlens.numel() * cu_seqlens.element_size()
    return {"flops": int(flops), "bytes": int(nbytes)}
