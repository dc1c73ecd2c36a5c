"""Bidirectional T5 encoder attention with a bucketed relative-position bias table and a key-padding mask.

Provenance: T5-base / Flan-T5-base encoder self-attention (config.json: d_model 768, num_heads 12, d_kv 64,
relative_attention_num_buckets 32, relative_attention_max_distance 128). T5 does NOT scale q.k by 1/sqrt(d)
(the scale is folded into the weight initialisation); the bias is added to the raw logits.
Workload: encoder pass over a padded batch of 32 sequences x 512 tokens (T5's input length), true lengths
random in [128, 512] (the first one always full length); bf16 inference.
Full scale: q, k, v [32, 12, 512, 64] bf16, rel_bias_table [32, 12] bf16 (the nn.Embedding(num_buckets,
n_heads) weight), seq_lens [32] int32; small scale: [2, 12, 96, 64], seq_lens in [24, 96].
Semantics, for batch b, head h, query i, key j (positions 0..L-1):
    rel = j - i; bucket = (16 if rel > 0 else 0) + (|rel| if |rel| < 8 else
          min(15, 8 + floor(log(|rel| / 8) / log(128 / 8) * 8)))                      (T5, bidirectional)
    s[b,h,i,j] = q[b,h,i] . k[b,h,j] + rel_bias_table[bucket, h]   for j < seq_lens[b], -inf otherwise
    out[b,h,i] = softmax_j(s) @ v[b,h]
The bucket formula is evaluated exactly in integers (8 + #{e in 1..7 : |rel|^2 >= 64 * 2^e}), which equals
T5's float formula for every distance (no rounding hazard at |rel| = 16, 32, 64). Rows of padded queries
(i >= seq_lens[b]) are computed the same way (they attend the valid keys) and are compared too.
Precision: QK^T in the input dtype (bf16 operands, fp32 accumulate), bias add and softmax in fp32, P rounded
to the input dtype before PV (HF T5 style). Output bf16 [B, 12, L, 64].
Facts a kernel may rely on: layout [batch, heads, seq, d_kv], contiguous; 12 heads, d_kv 64; 32 buckets,
max distance 128; 1 <= seq_lens[b] <= L; L = 512 (full) / 96 (small).
"""
import math

import torch

NUM_BUCKETS = 32
MAX_DISTANCE = 128


def _acc_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def _mm(a, b):
    """a @ b with fp32 accumulation and the result in a's dtype (the semantics of a bf16 GEMM on the GPU).
    CPUs lack a fast bf16 GEMM, so there the same product is formed in fp32 and rounded once at the end."""
    if a.device.type == "cpu" and a.dtype in (torch.bfloat16, torch.float16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


def _bucket_of_offset(L, device):
    """T5 bidirectional bucket of every offset rel = j - i in [-(L-1), L-1], exactly, in integer arithmetic."""
    rel = torch.arange(-(L - 1), L, device=device)
    half = NUM_BUCKETS // 2                    # 16: the sign of rel picks one half
    max_exact = half // 2                      # 8: exact buckets for |rel| < 8
    bucket = (rel > 0).long() * half
    n = rel.abs()
    n2 = n * n
    large = torch.full_like(n, max_exact)
    # floor(log(n/8)/log(128/8) * 8) >= e  <=>  n^2 >= 64 * 2^e   (8 log buckets over [8, 128))
    for e in range(1, half - max_exact):
        large = large + (n2 >= (max_exact * max_exact) << e).long()
    return bucket + torch.where(n < max_exact, n, large)


def _position_bias(rel_bias_table, L, bucket_of_offset):
    i = torch.arange(L, device=rel_bias_table.device)
    offset = i[None, :] - i[:, None] + (L - 1)           # [L(query), L(key)] -> index of j - i
    bias = rel_bias_table[bucket_of_offset[offset]]      # [L, L, H]
    return bias.permute(2, 0, 1)                          # [H, L, L]


def reference(q, k, v, rel_bias_table, seq_lens):
    dt = q.dtype
    acc = _acc_dtype(dt)
    L = q.shape[2]
    bias = _position_bias(rel_bias_table, L, _bucket_of_offset(L, q.device)).to(acc)
    key_pad = torch.arange(L, device=q.device)[None, :] >= seq_lens[:, None]   # [B, L]
    s = _mm(q, k.transpose(-1, -2)).to(acc) + bias
    s = s.masked_fill(key_pad[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(dt)
    return _mm(p, v)


def _t5_bucket_float(rel):
    """T5's own float formula, for one integer offset (used only by alt_reference)."""
    half = NUM_BUCKETS // 2
    max_exact = half // 2
    ret = half if rel > 0 else 0
    n = abs(rel)
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(MAX_DISTANCE / max_exact) * (half - max_exact))
    return ret + min(large, half - 1)


def alt_reference(q, k, v, rel_bias_table, seq_lens):
    """Per-(batch, query row) loop, buckets from T5's float formula, padding by slicing the keys."""
    B, H, L, D = q.shape
    out = torch.empty_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        for i in range(L):
            buckets = torch.tensor([_t5_bucket_float(j - i) for j in range(n)], device=q.device)
            s = torch.einsum("hd,hjd->hj", q[b, :, i], k[b, :, :n]) + rel_bias_table[buckets].t()
            out[b, :, i] = torch.einsum("hj,hjd->hd", torch.softmax(s, dim=-1), v[b, :, :n])
    return out


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        B, L = 32, 512
    else:
        B, L = 2, 96
    H, D = 12, 64
    dt = torch.bfloat16
    # raw T5 projections are unscaled; draw q, k with std d^-1/4 so q.k is O(1), like a trained model
    q = (torch.randn(B, H, L, D, device=device) * D ** -0.25).to(dt)
    k = (torch.randn(B, H, L, D, device=device) * D ** -0.25).to(dt)
    v = torch.randn(B, H, L, D, device=device).to(dt)
    rel_bias_table = torch.randn(NUM_BUCKETS, H, device=device).to(dt)
    seq_lens = torch.randint(L // 4, L + 1, (B,), device=device, dtype=torch.int32)
    seq_lens[0] = L          # at least one unpadded sequence
    return [q, k, v, rel_bias_table, seq_lens]


def roofline(q, k, v, rel_bias_table, seq_lens):
    B, H, L, D = q.shape
    valid_keys = int(seq_lens.long().sum().item())
    pairs = valid_keys * L                               # every query row attends its sequence's valid keys
    flops = 2 * 2 * H * pairs * D
    es = q.element_size()
    nbytes = (B * H * L * D * es                         # q
              + 2 * H * valid_keys * D * es              # valid k, v rows
              + rel_bias_table.numel() * rel_bias_table.element_size()
              + seq_lens.numel() * seq_lens.element_size()
              + B * H * L * D * es)                      # out
    return {"flops": int(flops), "bytes": int(nbytes)}
