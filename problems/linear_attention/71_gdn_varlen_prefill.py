"""Gated DeltaNet prefill over ragged (cu_seqlens-packed) requests, reading/writing per-request states in a pool.

Provenance: Qwen3-Next-80B-A3B gated DeltaNet layers (config.json: linear_num_key_heads 16, linear_num_value_heads
32, linear_key_head_dim 128, linear_value_head_dim 128), as served by vLLM: the chunked-prefill batch packs all
prefill tokens into one [T_total, heads, dim] tensor with cu_seqlens; each request owns a slot of the recurrent
state pool; requests continuing an earlier chunk start from their slot's state, new ones start from zero, and
every request's final state is written back to its slot. The pool is bf16 (vLLM's default
--mamba-ssm-cache-dtype auto = model dtype): states are read as bf16, computed in fp32, and rounded to bf16 on
the store (that rounding is part of the semantics). q and k are L2-normalised (eps 1e-6) and repeated to
the value heads (value head h uses key head h // 2); q is scaled by 128**-0.5; g = -exp(A_log)*softplus(a+dt_bias)
(fp32) and beta = sigmoid(b) (bf16) are given.
Semantics per request and value head (S [K=128, V=128]):
    S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t
Returns o [T_total, 32, 128] (v's dtype); state_pool is updated in place (MUTATES) at state_indices.
The reference runs each request chunkwise (chunk 64, WY form with a triangular solve; the last partial chunk is
padded with inert tokens). alt_reference is the token-by-token recurrence.

Workload: a vLLM chunked-prefill step of 8 requests, 16384 tokens in total (max_num_batched_tokens 16384), random
lengths; a pool of 64 state slots.
Full scale: T_total 16384, 8 requests, pool 64 slots; small: T_total 256, 3 requests, 2 key / 4 value heads, 6 slots.
Facts a kernel may rely on: K = V = 128; 2 value heads per key head; T_total is fixed (16384 full, 256 small);
request lengths are random (>= 1, any alignment), cu_seqlens int32 starts at 0 and ends at T_total; state_indices
int32 are distinct; has_initial_state is bool; g < 0; beta in (0, 1); the pool is bf16 [slots, 32, 128, 128]
(layout [slot, head, K, V]); slots not referenced stay unchanged.
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 64
MUTATES = ("state_pool",)



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(0, 1)

def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, g, beta):
    """Upcast, normalise, repeat key heads; returns [H, T, D] / [H, T] tensors."""
    ct = torch.promote_types(v.dtype, torch.float32)
    hv, hk = v.shape[1], k.shape[1]
    q = _l2norm(q.to(ct)).repeat_interleave(hv // hk, dim=1) * (q.shape[-1] ** -0.5)
    k = _l2norm(k.to(ct)).repeat_interleave(hv // hk, dim=1)
    return _tr(q), _tr(k), _tr(v.to(ct)), _tr(g.to(ct)), _tr(beta.to(ct))


def _chunk_gated_delta(q, k, v, g, beta, S, chunk=CHUNK):
    """q, k [H, T, K]; v [H, T, V]; g, beta [H, T]; S [H, K, V]. Returns o [H, T, V], final S."""
    H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # padded tokens: k = 0, beta = 0, g = 0 leave the state untouched
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // chunk
    q, k, v = (x.reshape(H, N, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(H, N, chunk) for x in (g, beta))
    gc = g.cumsum(-1)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")).exp()
    kb = k * beta[..., None]
    A = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~incl.tril(-1), 0)
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
        u = U[:, n] - W[:, n] @ S
        outs.append(qg[:, n] @ S + QK[:, n] @ u)
        S = S * glast[:, n, None, None] + kd[:, n].transpose(-1, -2) @ u
    return torch.stack(outs, 1).reshape(H, N * chunk, V)[:, :T], S


def _recurrent(q, k, v, g, beta, S):
    outs = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[:, None, None]
        u = beta[:, t, None] * (v[:, t] - (k[:, t, :, None] * S).sum(-2))
        S = S + k[:, t, :, None] * u[:, None, :]
        outs.append((q[:, t, :, None] * S).sum(-2))
    return torch.stack(outs, 1), S


def _run(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, core):
    qh, kh, vh, gh, bh = _prep(q, k, v, g, beta)
    o = torch.empty(v.shape[1], v.shape[0], v.shape[2], dtype=qh.dtype, device=v.device)
    cu = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        s, e = cu[i], cu[i + 1]
        S0 = state_pool[slot].to(qh.dtype)
        if not bool(has_initial_state[i]):
            S0 = torch.zeros_like(S0)
        o[:, s:e], S = core(qh[:, s:e], kh[:, s:e], vh[:, s:e], gh[:, s:e], bh[:, s:e], S0)
        state_pool[slot] = S.to(state_pool.dtype)
    return o.transpose(0, 1).to(v.dtype)


def reference(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state):
    return _run(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, _chunk_gated_delta)


def alt_reference(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state):
    return _run(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, _recurrent)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, N, HK, HV, slots = 16384, 8, 16, 32, 64
    else:
        T, N, HK, HV, slots = 256, 3, 2, 4, 6
    K = V = 128
    bf = torch.bfloat16
    cuts = torch.sort(torch.randperm(T - 1, device=device)[: N - 1] + 1).values
    zero = torch.zeros(1, dtype=cuts.dtype, device=device)
    total = torch.full((1,), T, dtype=cuts.dtype, device=device)
    cu_seqlens = torch.cat([zero, cuts, total]).to(torch.int32)
    q = torch.randn(T, HK, K, device=device).to(bf)
    k = torch.randn(T, HK, K, device=device).to(bf)
    v = torch.randn(T, HV, V, device=device).to(bf)
    A_log = torch.empty(HV, device=device).uniform_(1, 16).log()
    dt = torch.exp(torch.empty(HV, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    g = -A_log.exp() * F.softplus(torch.randn(T, HV, device=device) * 0.5 + dt_bias)
    beta = torch.sigmoid(torch.randn(T, HV, device=device)).to(bf)
    state_pool = (torch.randn(slots, HV, K, V, device=device) * 0.1).to(bf)
    state_indices = torch.randperm(slots, device=device)[:N].to(torch.int32)
    has_initial_state = torch.rand(N, device=device) < 0.5
    return [q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state]


def roofline(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state):
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = state_indices.numel()
    C = CHUNK
    per_token = C * (6 * K + 4 * V) + 6 * K * V + C * C // 3  # chunked form, amortised per token
    flops = T * HV * per_token
    state_bytes = N * HV * K * V * state_pool.element_size()
    small = (q, k, v, g, beta, cu_seqlens, state_indices, has_initial_state)
    in_bytes = sum(x.numel() * x.element_size() for x in small)
    out_bytes = T * HV * V * v.element_size()
    return {"flops": int(flops), "bytes": int(in_bytes + out_bytes + 2 * state_bytes)}
