"""One-token gated DeltaNet decode step with fused gating over a pool of recurrent states.

Gate and beta come from the raw projections; each request's state is read from and written back to its pool slot.

Provenance: Qwen3-Next-80B-A3B gated DeltaNet layers (config.json: linear_num_key_heads 16, linear_num_value_heads
32, linear_key_head_dim 128, linear_value_head_dim 128) in vLLM's decode path (fused sigmoid-gating delta-rule
update): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), q and k L2-normalised (eps 1e-6) and repeated
to the value heads (value head h uses key head h // 2), q scaled by 128**-0.5. Per request r and value head h with
S = state_pool[state_indices[r], h] ([K=128, V=128], fp32):
    S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q;  state_pool[state_indices[r], h] <- S
Returns o [B, 32, 128] (v's dtype); state_pool is updated in place (MUTATES).
alt_reference applies the same step as an explicit transition matrix: S' = exp(g) (I - beta k k^T) S + beta k v^T.

Workload: a decode batch of 256 requests (vLLM max_num_seqs 256) against a pool of 512 state slots.
Full scale: B 256, pool 512 slots (1.07 GB fp32); small: B 4, 2 key / 4 value heads, pool 8 slots.
Facts a kernel may rely on: K = V = 128; 2 value heads per key head; state_indices int32 distinct; the pool is
fp32 [slots, 32, 128, 128] (layout [slot, head, K, V]); slots not referenced stay unchanged; A_log and dt_bias
are fp32 per value head; q, k, v, a, b are bf16.
"""
import math

import torch
import torch.nn.functional as F

MUTATES = ("state_pool",)


def _l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prep(q, k, v, a, b, A_log, dt_bias):
    ct = torch.promote_types(v.dtype, torch.float32)
    rep = v.shape[1] // k.shape[1]
    q = _l2norm(q.to(ct)).repeat_interleave(rep, dim=1) * (q.shape[-1] ** -0.5)
    k = _l2norm(k.to(ct)).repeat_interleave(rep, dim=1)
    g = -A_log.to(ct).exp() * F.softplus(a.to(ct) + dt_bias.to(ct))
    beta = torch.sigmoid(b.to(ct))
    return q, k, v.to(ct), g, beta


def reference(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices):
    q, k, vc, g, beta = _prep(q, k, v, a, b, A_log, dt_bias)
    idx = state_indices.long()
    S = state_pool[idx].to(q.dtype) * g.exp()[..., None, None]          # [B, H, K, V]
    u = beta[..., None] * (vc - (k[..., None] * S).sum(-2))
    S = S + k[..., None] * u[..., None, :]
    o = (q[..., None] * S).sum(-2)
    state_pool[idx] = S.to(state_pool.dtype)
    return o.to(v.dtype)


def alt_reference(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices):
    q, k, vc, g, beta = _prep(q, k, v, a, b, A_log, dt_bias)
    idx = state_indices.long()
    S = state_pool[idx].to(q.dtype)
    eye = torch.eye(k.shape[-1], dtype=q.dtype, device=q.device)
    M = g.exp()[..., None, None] * (eye - beta[..., None, None] * k[..., :, None] * k[..., None, :])
    S = M @ S + beta[..., None, None] * k[..., :, None] * vc[..., None, :]
    o = (S.transpose(-1, -2) @ q[..., None])[..., 0]
    state_pool[idx] = S.to(state_pool.dtype)
    return o.to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, HK, HV, slots = (256, 16, 32, 512) if scale == "full" else (4, 2, 4, 8)
    K = V = 128
    bf = torch.bfloat16
    q = torch.randn(B, HK, K, device=device).to(bf)
    k = torch.randn(B, HK, K, device=device).to(bf)
    v = torch.randn(B, HV, V, device=device).to(bf)
    a = (torch.randn(B, HV, device=device) * 0.5).to(bf)
    b = torch.randn(B, HV, device=device).to(bf)
    A_log = torch.empty(HV, device=device).uniform_(1, 16).log()
    dt = torch.exp(torch.empty(HV, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    state_pool = torch.randn(slots, HV, K, V, device=device) * 0.1
    state_indices = torch.randperm(slots, device=device)[:B].to(torch.int32)
    return [q, k, v, a, b, A_log, dt_bias, state_pool, state_indices]


def roofline(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices):
    B, HV, V = v.shape
    K = k.shape[-1]
    flops = B * HV * K * V * 7  # decay, k^T S, rank-1 update, q^T S
    state_bytes = B * HV * K * V * state_pool.element_size()
    small = sum(x.numel() * x.element_size() for x in (q, k, v, a, b, A_log, dt_bias, state_indices))
    return {"flops": int(flops), "bytes": int(small + v.numel() * v.element_size() + 2 * state_bytes)}
