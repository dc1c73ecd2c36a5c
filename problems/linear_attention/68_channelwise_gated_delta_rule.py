"""Chunked Kimi Delta Attention (KDA) forward: the gated delta rule with a per-key-channel (not per-head) decay gate.

Provenance: Kimi-Linear-48B-A3B KDA layers (config.json linear_attn_config: num_heads 32, head_dim 128,
short_conv_kernel_size 4; fla's chunk_kda with use_qk_l2norm_in_kernel). The gate is per head AND key channel:
g = -exp(A_log[h]) * softplus(f + dt_bias[h, d]) (fp32, log decay), beta = sigmoid(b) (bf16).
Semantics per (batch, head), state S [K=128, V=128] starting at initial_state:
    S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (q_t * 128**-0.5)
with q, k L2-normalised (eps 1e-6). Returns (o [B, T, 32, 128] in v's dtype, final_state [B, 32, 128, 128] in
initial_state's dtype).
The reference works chunkwise (chunk 64): within a chunk the pairwise decay exp(G_i - G_j) (G = in-chunk cumsum of
g) is materialised per key channel as a [64, 64, 128] tensor (never a factorised exp(G_i) exp(-G_j), which would
overflow), A = strictly_lower(beta_i sum_d k_id k_jd exp(G_id - G_jd)), T = (I + A)^-1 by a triangular solve,
U = T (beta v), W = T (beta k exp(G)), then S is carried across chunks. alt_reference is the token recurrence.

Workload: prefill of 2 sequences x 2048 tokens through one KDA layer.
Full scale: B 2, T 2048, H 32; small scale: B 1, T 128, H 2 (same head dims).
Facts a kernel may rely on: K = V = 128; T is a multiple of 64; g < 0 per (token, head, key channel), fp32, about
[-1.6, -1e-3] per token (in-chunk cumulative decays reach about -100, so exp(-G) overflows fp32);
beta in (0, 1); initial_state fp32.
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 64



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, g, beta, initial_state):
    ct = torch.promote_types(v.dtype, torch.float32)
    q = _l2norm(q.to(ct)) * (q.shape[-1] ** -0.5)
    k = _l2norm(k.to(ct))
    return _tr(q), _tr(k), _tr(v.to(ct)), _tr(g.to(ct)), _tr(beta.to(ct)), initial_state.to(ct)


def _chunk_kda(q, k, v, g, beta, S, chunk=CHUNK):
    """q, k, g [B, H, T, K]; v [B, H, T, V]; beta [B, H, T]; S [B, H, K, V]."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # inert padding: k = 0, beta = 0, g = 0
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // chunk
    q, k, v, g = (x.reshape(B, H, N, chunk, x.shape[-1]) for x in (q, k, v, g))
    beta = beta.reshape(B, H, N, chunk)
    gc = g.cumsum(-2)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    outs = []
    for n in range(N):
        qn, kn, vn, bn, gn = q[:, :, n], k[:, :, n], v[:, :, n], beta[:, :, n], gc[:, :, n]
        # kdk[i, j, :] = exp(G_i - G_j) * k_j for j <= i, else 0 (one [B, H, C, C, K] buffer, updated in place)
        kdk = gn[:, :, :, None, :] - gn[:, :, None, :, :]
        kdk.masked_fill_(~incl[:, :, None], float("-inf")).exp_().mul_(kn[:, :, None, :, :])
        A = (kdk @ kn[..., None])[..., 0] * bn[..., None]                    # sum_d k_id exp(G_id - G_jd) k_jd
        A = A.masked_fill(~incl.tril(-1), 0)
        QK = (kdk @ qn[..., None])[..., 0]
        Tinv = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False)
        u = Tinv @ (vn * bn[..., None]) - (Tinv @ (kn * bn[..., None] * gn.exp())) @ S
        outs.append((qn * gn.exp()) @ S + QK @ u)
        glast = gn[:, :, -1]
        S = S * glast.exp()[..., None] + (kn * (glast[:, :, None] - gn).exp()).transpose(-1, -2) @ u
    return torch.stack(outs, 2).reshape(B, H, N * chunk, V)[:, :, :T], S


def reference(q, k, v, g, beta, initial_state):
    o, S = _chunk_kda(*_prep(q, k, v, g, beta, initial_state))
    return o.transpose(1, 2).to(v.dtype), S.to(initial_state.dtype)


def alt_reference(q, k, v, g, beta, initial_state):
    qh, kh, vh, gh, bh, S = _prep(q, k, v, g, beta, initial_state)
    outs = []
    for t in range(qh.shape[2]):
        S = S * gh[:, :, t].exp()[..., None]
        kt = kh[:, :, t]
        u = bh[:, :, t, None] * (vh[:, :, t] - (kt[..., None] * S).sum(-2))
        S = S + kt[..., None] * u[..., None, :]
        outs.append((qh[:, :, t, :, None] * S).sum(-2))
    return torch.stack(outs, 2).transpose(1, 2).to(v.dtype), S.to(initial_state.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (2, 2048, 32) if scale == "full" else (1, 128, 2)
    K = V = 128
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=device).to(bf)
    k = torch.randn(B, T, H, K, device=device).to(bf)
    v = torch.randn(B, T, H, V, device=device).to(bf)
    A_log = torch.empty(H, device=device).uniform_(1, 16).log()
    dt = torch.exp(torch.empty(H, K, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus, per head and key channel
    g = -A_log.exp()[:, None] * F.softplus(torch.randn(B, T, H, K, device=device) * 0.5 + dt_bias)
    beta = torch.sigmoid(torch.randn(B, T, H, device=device)).to(bf)
    initial_state = torch.randn(B, H, K, V, device=device) * 0.1
    return [q, k, v, g, beta, initial_state]


def roofline(q, k, v, g, beta, initial_state):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = CHUNK
    per_chunk = C * C * (8 * K + 4 * V) + 6 * C * K * V + C * C * C // 3
    flops = B * H * (T // C) * per_chunk
    in_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, g, beta, initial_state))
    out_bytes = v.numel() * v.element_size() + initial_state.numel() * initial_state.element_size()
    return {"flops": int(flops), "bytes": int(in_bytes + out_bytes)}
