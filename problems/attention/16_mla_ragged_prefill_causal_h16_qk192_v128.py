"""Causal MLA prefill in the decompressed form (qk 192 = 128 + 64, v 128) over ragged packed sequences.

Provenance: DeepSeek-V3 multi-head latent attention (config.json: num_attention_heads 128, qk_nope_head_dim 128,
qk_rope_head_dim 64, v_head_dim 128, kv_lora_rank 512; rope_scaling yarn factor 40, mscale_all_dim 1.0). For
prefill, vLLM / SGLang / FlashMLA up-project c_kv to per-head k_nope and v and run ordinary varlen attention with
k = [k_nope ; k_pe] (k_pe broadcast to every head upstream). One GPU's slice under tensor parallelism 8: 16
heads. Softmax scale (128 + 64)^-0.5 * (0.1 * ln(40) + 1)^2 ~= 0.1352.
Workload: a prefill batch of 8 fresh prompts, 16384 tokens in total (lengths random, 745-4922 tokens,
mostly 1200-3000).
Full scale: q, k [16384, 16, 192], v [16384, 16, 128] bf16, cu_seqlens [9] int32; small scale: 3 prompts,
160 tokens in total.
Semantics: for token t of a sequence and head h: out[t,h] = sum_{u <= t, same sequence}
softmax_u(scale * q[t,h] . k[u,h]) v[u,h].
Precision: QK^T in bf16 (fp32 accumulate), softmax in fp32, P rounded to bf16 before PV. Output bf16
[16384, 16, 128].
Facts a kernel may rely on: layout [tokens, heads, dim], contiguous; 16 heads; qk dim 192, v dim 128 (different);
total tokens 16384 (full) / 160 (small) = cu_seqlens[-1]; cu_seqlens[0] = 0; 8 sequences (full) / 3 (small).
"""
import math

import torch

SOFTMAX_SCALE = (128 + 64) ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2


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
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=dt, device=q.device)
    bounds = cu_seqlens.tolist()
    for i in range(len(bounds) - 1):
        s0, s1 = bounds[i], bounds[i + 1]
        L = s1 - s0
        qi = q[s0:s1].transpose(0, 1)                     # [16, L, 192]
        ki = k[s0:s1].transpose(0, 1)
        vi = v[s0:s1].transpose(0, 1)                     # [16, L, 128]
        s = _mm(qi, ki.transpose(-1, -2)).to(acc) * SOFTMAX_SCALE
        future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
        p = torch.softmax(s, dim=-1).to(dt)
        out[s0:s1] = _mm(p, vi).transpose(0, 1)
    return out


def alt_reference(q, k, v, cu_seqlens):
    """Dense attention over the whole packed batch, mask = same sequence and key index <= query index."""
    pos = torch.arange(q.shape[0], device=q.device)
    seg = torch.bucketize(pos, cu_seqlens[1:].long(), right=True)
    ok = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    s = torch.einsum("qhd,khd->hqk", q, k) * SOFTMAX_SCALE
    s = s.masked_fill(~ok, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)


def _split_total(n_parts, total, device):
    """Random positive integer parts summing exactly to total (weights in [0.5, 1.5))."""
    w = 0.5 + torch.rand(n_parts, device=device)
    parts = torch.floor(w / w.sum() * total).long().clamp(min=1)
    parts[-1] = total - parts[:-1].sum()
    return parts


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        n_seq, total = 8, 16384
    else:
        n_seq, total = 3, 160
    H, DQK, DV = 16, 192, 128
    dt = torch.bfloat16
    lens = _split_total(n_seq, total, device)
    cu_seqlens = torch.zeros(n_seq + 1, dtype=torch.int32, device=device)
    cu_seqlens[1:] = torch.cumsum(lens, 0).to(torch.int32)
    # unit-variance q, k: logits scale * q.k have std ~0.135 * sqrt(192) ~ 1.9
    q = torch.randn(total, H, DQK, device=device).to(dt)
    k = torch.randn(total, H, DQK, device=device).to(dt)
    v = torch.randn(total, H, DV, device=device).to(dt)
    return [q, k, v, cu_seqlens]


def roofline(q, k, v, cu_seqlens):
    H, DQK, DV = q.shape[1], q.shape[2], v.shape[2]
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    pairs = int((lens * (lens + 1) // 2).sum().item())
    flops = 2 * H * pairs * (DQK + DV)
    es = q.element_size()
    nbytes = (q.numel() + k.numel() + v.numel()) * es + cu_seqlens.numel() * 4 + q.shape[0] * H * DV * es
    return {"flops": int(flops), "bytes": int(nbytes)}
