"""Chunked DeltaNet forward (delta rule, WY / UT-transform form) with the SiLU + L2-norm q/k feature map fused in.

Provenance: DeltaNet 1.3B (fla-hub/delta_net-1.3B: hidden_size 2048, num_heads 16, expand_k = expand_v = 1, so head
dims K = V = 128; qk_activation "silu", qk_norm "l2", use_beta with sigmoid beta). fla's chunk_delta_rule.
Semantics per (batch, head), state S [K, V] starting at zero:
    q_t, k_t <- l2norm(silu(.)) (eps 1e-6);  u_t = beta_t * (v_t - S^T k_t);  S <- S + k_t u_t^T;
    o_t = S^T (q_t * K**-0.5)
Returns o [B, T, H, V] in v's dtype (training forward: no initial or final state).
The reference works chunkwise (chunk 64): T = (I + strictly_lower(beta k k^T))^-1 by a triangular solve,
U = T (beta v), W = T (beta k), then a sequential pass over chunks carrying S. alt_reference is the naive
token-by-token recurrence.

Workload: one DeltaNet layer of a training step, 8 sequences x 2048 tokens (the 1.3B model's training context).
Full scale: B 8, T 2048, H 16; small scale: B 2, T 128, H 2 (same head dims).
Facts a kernel may rely on: K = V = 128; T is a multiple of 64; beta in (0, 1); q, k, v, beta are bf16.
"""
import torch
import torch.nn.functional as F

CHUNK = 64



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _featmap(x, eps=1e-6):
    x = F.silu(x)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, beta):
    ct = torch.promote_types(v.dtype, torch.float32)
    q = _featmap(q.to(ct)) * (q.shape[-1] ** -0.5)
    k = _featmap(k.to(ct))
    return _tr(q), _tr(k), _tr(v.to(ct)), _tr(beta.to(ct))


def _chunk_delta(q, k, v, beta, chunk=CHUNK):
    """q, k [B, H, T, K]; v [B, H, T, V]; beta [B, H, T]; zero initial state. Returns o [B, H, T, V]."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # padded tokens have k = 0 and beta = 0: no effect on the state
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // chunk
    q, k, v = (x.reshape(B, H, N, chunk, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(B, H, N, chunk)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)).masked_fill(~incl.tril(-1), 0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    Tinv = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False)
    U = Tinv @ (v * beta[..., None])
    W = Tinv @ kb
    QK = (q @ k.transpose(-1, -2)).masked_fill(~incl, 0)
    S = q.new_zeros(B, H, K, V)
    outs = []
    for n in range(N):
        u = U[:, :, n] - W[:, :, n] @ S
        outs.append(q[:, :, n] @ S + QK[:, :, n] @ u)
        S = S + k[:, :, n].transpose(-1, -2) @ u
    return torch.stack(outs, 2).reshape(B, H, N * chunk, V)[:, :, :T]


def reference(q, k, v, beta):
    o = _chunk_delta(*_prep(q, k, v, beta))
    return o.transpose(1, 2).to(v.dtype)


def alt_reference(q, k, v, beta):
    qh, kh, vh, bh = _prep(q, k, v, beta)
    B, H, T, K = kh.shape
    S = qh.new_zeros(B, H, K, vh.shape[-1])
    outs = []
    for t in range(T):
        kt = kh[:, :, t]
        u = bh[:, :, t, None] * (vh[:, :, t] - (kt[..., None] * S).sum(-2))
        S = S + kt[..., None] * u[..., None, :]
        outs.append((qh[:, :, t, :, None] * S).sum(-2))
    return torch.stack(outs, 2).transpose(1, 2).to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (8, 2048, 16) if scale == "full" else (2, 128, 2)
    K = V = 128
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=device).to(bf)
    k = torch.randn(B, T, H, K, device=device).to(bf)
    v = torch.randn(B, T, H, V, device=device).to(bf)
    beta = torch.sigmoid(torch.randn(B, T, H, device=device)).to(bf)
    return [q, k, v, beta]


def roofline(q, k, v, beta):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = CHUNK
    per_chunk = C * C * (6 * K + 4 * V) + 4 * C * K * V + C * C * C // 3
    flops = B * H * (T // C) * per_chunk
    in_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, beta))
    return {"flops": int(flops), "bytes": int(in_bytes + v.numel() * v.element_size())}
