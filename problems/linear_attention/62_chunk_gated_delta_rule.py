"""Chunked gated delta rule forward (WY / UT-transform form), GQA key sharing, L2-normalised q/k, carried state.

Provenance: Qwen3-Next-80B-A3B gated DeltaNet layers (config.json: linear_num_key_heads 16, linear_num_value_heads
32, linear_key_head_dim 128, linear_value_head_dim 128). In the HF/fla code q and k are repeated to the 32 value
heads (value head h uses key head h // 2), L2-normalised inside the kernel (use_qk_l2norm_in_kernel, eps 1e-6) and
scaled by 128**-0.5; g = -exp(A_log) * softplus(a + dt_bias) (fp32, log of the per-head decay) and
beta = sigmoid(b) (bf16) come from the projections.
Semantics per (batch, value head), state S [K=128, V=128] starting at initial_state:
    S <- exp(g_t) * S;  u_t = beta_t * (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (q_t * 128**-0.5)
Returns (o [B, T, 32, 128] in v's dtype, final_state [B, 32, 128, 128] in initial_state's dtype).
The reference evaluates it chunkwise (chunk 64): per chunk, T = (I + strictly_lower(beta k k^T * decay))^-1
(a triangular solve), U = T (beta v), W = T (beta k exp(gcum)), then a sequential pass over chunks carrying S.
alt_reference is the naive token-by-token recurrence.

Workload: prefill of 4 sequences x 4096 tokens through one GDN layer (chunked-prefill / training shape).
Full scale: B 4, T 4096; small scale: B 1, T 128, 2 key / 4 value heads (same head dims).
Facts a kernel may rely on: K = V = 128; 2 value heads per key head (repeat_interleave order); T is a multiple of
64; g < 0 (per token, per value head, fp32, in about [-1.6, -1e-3]); beta in (0, 1); initial_state is fp32.
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
    """Upcast, normalise, repeat key heads to value heads, move heads before time: [B, H, T, D]."""
    ct = torch.promote_types(v.dtype, torch.float32)
    hv, hk = v.shape[2], k.shape[2]
    q = _l2norm(q.to(ct)).repeat_interleave(hv // hk, dim=2) * (q.shape[-1] ** -0.5)
    k = _l2norm(k.to(ct)).repeat_interleave(hv // hk, dim=2)
    return _tr(q), _tr(k), _tr(v.to(ct)), _tr(g.to(ct)), _tr(beta.to(ct)), initial_state.to(ct)


def _chunk_gated_delta(q, k, v, g, beta, S, chunk=CHUNK):
    """q, k [B, H, T, K]; v [B, H, T, V]; g, beta [B, H, T]; S [B, H, K, V]. Returns o [B, H, T, V], S."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # padded tokens: k = 0, beta = 0, g = 0 leave the state untouched
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // chunk
    q, k, v = (x.reshape(B, H, N, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(B, H, N, chunk) for x in (g, beta))
    gc = g.cumsum(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = incl.tril(-1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")).exp()
    kb = k * beta[..., None]
    A = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    Tinv = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False)
    U = Tinv @ (v * beta[..., None])
    W = Tinv @ (kb * gc.exp()[..., None])
    QK = (q @ k.transpose(-1, -2)) * decay
    qg = q * gc.exp()[..., None]
    kd = k * (gc[..., -1:] - gc).exp()[..., None]
    glast = gc[..., -1].exp()
    outs = []
    for n in range(N):
        u = U[:, :, n] - W[:, :, n] @ S
        outs.append(qg[:, :, n] @ S + QK[:, :, n] @ u)
        S = S * glast[:, :, n, None, None] + kd[:, :, n].transpose(-1, -2) @ u
    o = torch.stack(outs, 2).reshape(B, H, N * chunk, V)[:, :, :T]
    return o, S


def reference(q, k, v, g, beta, initial_state):
    qh, kh, vh, gh, bh, S = _prep(q, k, v, g, beta, initial_state)
    o, S = _chunk_gated_delta(qh, kh, vh, gh, bh, S)
    return o.transpose(1, 2).to(v.dtype), S.to(initial_state.dtype)


def alt_reference(q, k, v, g, beta, initial_state):
    qh, kh, vh, gh, bh, S = _prep(q, k, v, g, beta, initial_state)
    outs = []
    for t in range(qh.shape[2]):
        S = S * gh[:, :, t].exp()[..., None, None]
        kt = kh[:, :, t]
        u = bh[:, :, t, None] * (vh[:, :, t] - (kt[..., None] * S).sum(-2))
        S = S + kt[..., None] * u[..., None, :]
        outs.append((qh[:, :, t, :, None] * S).sum(-2))
    o = torch.stack(outs, 2)
    return o.transpose(1, 2).to(v.dtype), S.to(initial_state.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, HK, HV = (4, 4096, 16, 32) if scale == "full" else (1, 128, 2, 4)
    K = V = 128
    bf = torch.bfloat16
    q = torch.randn(B, T, HK, K, device=device).to(bf)
    k = torch.randn(B, T, HK, K, device=device).to(bf)
    v = torch.randn(B, T, HV, V, device=device).to(bf)
    # Mamba-style gate parameters: A in [1, 16], dt in [1e-3, 1e-1] (log-uniform) per head.
    A_log = torch.empty(HV, device=device).uniform_(1, 16).log()
    dt = torch.exp(torch.empty(HV, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    a = torch.randn(B, T, HV, device=device) * 0.5
    g = -A_log.exp() * F.softplus(a + dt_bias)
    beta = torch.sigmoid(torch.randn(B, T, HV, device=device)).to(bf)
    initial_state = torch.randn(B, HV, K, V, device=device) * 0.1
    return [q, k, v, g, beta, initial_state]


def roofline(q, k, v, g, beta, initial_state):
    B, T, HK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    C = CHUNK
    per_chunk = C * C * (6 * K + 4 * V) + 6 * C * K * V + C * C * C // 3
    flops = B * HV * (T // C) * per_chunk
    out_bytes = B * T * HV * V * v.element_size() + initial_state.numel() * initial_state.element_size()
    in_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, g, beta, initial_state))
    return {"flops": int(flops), "bytes": int(in_bytes + out_bytes)}
