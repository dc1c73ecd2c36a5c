"""Chunked Gated Linear Attention (GLA) forward with data-dependent per-key-channel decay.

Provenance: GLA 1.3B (fla-hub/gla-1.3B: hidden_size 2048, num_heads 4, expand_k 0.5, expand_v 1, so per head
K = 256 and V = 512; gate_low_rank_dim 16, gate_logit_normalizer 16: gk = logsigmoid(gate logits) / 16).
fla's chunk_gla with scale K**-0.5, no initial state (training forward).
Semantics per (batch, head), state S [K, V] starting at zero:
    S <- diag(exp(gk_t)) S + k_t v_t^T;  o_t = S^T (q_t * K**-0.5)
Returns o [B, T, 4, 512] in v's dtype.
The reference works chunkwise (chunk 64): intra-chunk scores sum_d q_id k_jd exp(G_id - G_jd) (G = in-chunk cumsum
of gk) from a materialised [64, 64, K] decay tensor, inter-chunk (q exp(G)) S, and S carried across chunks.
alt_reference is the token-by-token recurrence.

Workload: one GLA layer of a training step, 8 sequences x 2048 tokens (GLA's training context).
Full scale: B 8, T 2048, H 4; small scale: B 1, T 128, H 2 (same head dims).
Facts a kernel may rely on: K = 256, V = 512; T is a multiple of 64; gk < 0 (fp32, logsigmoid(x)/16 with
x ~ N(0, 1), so about -0.05 per token); q, k, v are bf16.
"""
import torch
import torch.nn.functional as F

CHUNK = 64



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _prep(q, k, v, gk):
    ct = torch.promote_types(v.dtype, torch.float32)
    return _tr(q.to(ct) * (q.shape[-1] ** -0.5)), _tr(k.to(ct)), _tr(v.to(ct)), _tr(gk.to(ct))


def _chunk_gla(q, k, v, gk, chunk=CHUNK):
    """q, k, gk [B, H, T, K]; v [B, H, T, V]; zero initial state."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:
        q, k, v, gk = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, gk))
    N = (T + pad) // chunk
    q, k, v, gk = (x.reshape(B, H, N, chunk, x.shape[-1]) for x in (q, k, v, gk))
    gc = gk.cumsum(-2)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    S = q.new_zeros(B, H, K, V)
    outs = []
    for n in range(N):
        qn, kn, vn, gn = q[:, :, n], k[:, :, n], v[:, :, n], gc[:, :, n]
        # kdk[i, j, :] = exp(G_i - G_j) * k_j for j <= i, else 0 (one [B, H, C, C, K] buffer, updated in place)
        kdk = gn[:, :, :, None, :] - gn[:, :, None, :, :]
        kdk.masked_fill_(~incl[:, :, None], float("-inf")).exp_().mul_(kn[:, :, None, :, :])
        P = (kdk @ qn[..., None])[..., 0]                                     # [B, H, C, C]
        outs.append((qn * gn.exp()) @ S + P @ vn)
        glast = gn[:, :, -1]
        S = S * glast.exp()[..., None] + (kn * (glast[:, :, None] - gn).exp()).transpose(-1, -2) @ vn
    return torch.stack(outs, 2).reshape(B, H, N * chunk, V)[:, :, :T]


def reference(q, k, v, gk):
    return _chunk_gla(*_prep(q, k, v, gk)).transpose(1, 2).to(v.dtype)


def alt_reference(q, k, v, gk):
    qh, kh, vh, gh = _prep(q, k, v, gk)
    B, H, T, K = kh.shape
    S = qh.new_zeros(B, H, K, vh.shape[-1])
    outs = []
    for t in range(T):
        S = S * gh[:, :, t].exp()[..., None] + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outs.append((qh[:, :, t, :, None] * S).sum(-2))
    return torch.stack(outs, 2).transpose(1, 2).to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (8, 2048, 4) if scale == "full" else (1, 128, 2)
    K, V = 256, 512
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=device).to(bf)
    k = torch.randn(B, T, H, K, device=device).to(bf)
    v = torch.randn(B, T, H, V, device=device).to(bf)
    gk = F.logsigmoid(torch.randn(B, T, H, K, device=device)) / 16
    return [q, k, v, gk]


def roofline(q, k, v, gk):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = CHUNK
    per_chunk = C * C * (3 * K + 2 * V) + 4 * C * K * V
    flops = B * H * (T // C) * per_chunk
    in_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, gk))
    return {"flops": int(flops), "bytes": int(in_bytes + v.numel() * v.element_size())}
