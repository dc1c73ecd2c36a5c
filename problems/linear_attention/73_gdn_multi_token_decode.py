"""Gated DeltaNet decode over 4 speculative tokens per request, storing the state after every token in the pool.

MTP verification: each token's state goes to its own slot so that rejected tokens can be rolled back.

Provenance: Qwen3-Next-80B-A3B gated DeltaNet layers (config.json: linear_num_key_heads 16, linear_num_value_heads
32, linear_key_head_dim 128, linear_value_head_dim 128) under vLLM speculative decoding with the MTP head
(num_speculative_tokens 3, so 4 tokens per request: the accepted one plus 3 drafts). vLLM's recurrent GDN kernel
reads the initial state from slot state_indices[r, num_accepted_tokens[r] - 1] (the state after the last token
accepted in the previous step) and writes the state after token t to slot state_indices[r, t].
Inputs: q, k [B, 4, 16, 128], v [B, 4, 32, 128] (bf16), g [B, 4, 32] (fp32, log decay), beta [B, 4, 32] (bf16).
q and k are L2-normalised (eps 1e-6) and repeated to the value heads (value head h uses key head h // 2); q is
scaled by 128**-0.5. Per request and value head, starting from S (fp32 [K=128, V=128]):
    S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t;  pool[idx[r, t]] <- S
The initial state is read before any write. Returns o [B, 4, 32, 128] (v's dtype); state_pool updated in place.
alt_reference computes the 4 tokens at once in the WY form (one 4x4 triangular solve per request and head).

Workload: a decode batch of 128 requests x 4 tokens; pool of 640 slots (5 per request).
Full scale: B 128, pool 640 slots (1.34 GB fp32); small: B 3, 2 key / 4 value heads, pool 16 slots.
Facts a kernel may rely on: K = V = 128; 4 tokens per request; 2 value heads per key head; the 4*B entries of
state_indices (int32 [B, 4]) are distinct; num_accepted_tokens is int32 in [1, 4]; the pool is fp32
[slots, 32, 128, 128] (layout [slot, head, K, V]); slots not referenced stay unchanged; g < 0; beta in (0, 1).
"""
import math

import torch
import torch.nn.functional as F

MUTATES = ("state_pool",)



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, g, beta):
    ct = torch.promote_types(v.dtype, torch.float32)
    rep = v.shape[2] // k.shape[2]
    q = _l2norm(q.to(ct)).repeat_interleave(rep, dim=2) * (q.shape[-1] ** -0.5)
    k = _l2norm(k.to(ct)).repeat_interleave(rep, dim=2)
    return q, k, v.to(ct), g.to(ct), beta.to(ct)


def _initial(state_pool, state_indices, num_accepted_tokens, dtype):
    rows = torch.arange(state_indices.shape[0], device=state_indices.device)
    src = state_indices.long()[rows, num_accepted_tokens.long() - 1]
    return state_pool[src].to(dtype)


def reference(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens):
    q, k, vc, g, beta = _prep(q, k, v, g, beta)
    S = _initial(state_pool, state_indices, num_accepted_tokens, q.dtype)     # [B, H, K, V]
    outs = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (vc[:, t] - (k[:, t, :, :, None] * S).sum(-2))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append((q[:, t, :, :, None] * S).sum(-2))
        state_pool[state_indices[:, t].long()] = S.to(state_pool.dtype)
    return torch.stack(outs, 1).to(v.dtype)


def alt_reference(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens):
    q, k, vc, g, beta = _prep(q, k, v, g, beta)
    S0 = _initial(state_pool, state_indices, num_accepted_tokens, q.dtype)
    q, k, vc, g, beta = _tr(q), _tr(k), _tr(vc), _tr(g), _tr(beta)
    L = q.shape[2]
    gc = g.cumsum(-1)                                                         # [B, H, L]
    incl = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)
    A = (beta[..., None] * kk * decay).masked_fill(~incl.tril(-1), 0)
    eye = torch.eye(L, dtype=q.dtype, device=q.device)
    rhs = beta[..., None] * (vc - (k * gc.exp()[..., None]) @ S0)
    U = torch.linalg.solve_triangular(A + eye, rhs, upper=False)              # [B, H, L, V]
    o = (q * gc.exp()[..., None]) @ S0 + ((q @ k.transpose(-1, -2)) * decay) @ U
    for t in range(L):
        St = S0 * gc[..., t, None, None].exp() + (k * decay[..., t, :, None]).transpose(-1, -2) @ U
        state_pool[state_indices[:, t].long()] = St.to(state_pool.dtype)
    return o.transpose(1, 2).to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, HK, HV, slots = (128, 16, 32, 640) if scale == "full" else (3, 2, 4, 16)
    L, K, V = 4, 128, 128
    bf = torch.bfloat16
    q = torch.randn(B, L, HK, K, device=device).to(bf)
    k = torch.randn(B, L, HK, K, device=device).to(bf)
    v = torch.randn(B, L, HV, V, device=device).to(bf)
    A_log = torch.empty(HV, device=device).uniform_(1, 16).log()
    dt = torch.exp(torch.empty(HV, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    g = -A_log.exp() * F.softplus(torch.randn(B, L, HV, device=device) * 0.5 + dt_bias)
    beta = torch.sigmoid(torch.randn(B, L, HV, device=device)).to(bf)
    state_pool = torch.randn(slots, HV, K, V, device=device) * 0.1
    state_indices = torch.randperm(slots, device=device)[: B * L].reshape(B, L).to(torch.int32)
    num_accepted_tokens = torch.randint(1, L + 1, (B,), device=device, dtype=torch.int32)
    return [q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens]


def roofline(q, k, v, g, beta, state_pool, state_indices, num_accepted_tokens):
    B, L, HV, V = v.shape
    K = k.shape[-1]
    flops = B * L * HV * K * V * 7
    state = HV * K * V * state_pool.element_size()
    small = sum(x.numel() * x.element_size() for x in (q, k, v, g, beta, state_indices, num_accepted_tokens))
    return {"flops": int(flops), "bytes": int(small + v.numel() * v.element_size() + B * state + B * L * state)}
