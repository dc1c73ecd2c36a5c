"""Chunked Mamba-2 SSD in the segment-sum form, all chunks at once, with a given initial and returned final state.

Steps: exp(segsum) intra-chunk decay matrices, chunk states, an inter-chunk state recurrence (itself a segsum over
chunk boundaries), off-diagonal outputs.

Provenance: Granite-4.0-H-Small Mamba-2 layers (config.json: mamba_n_heads 128, mamba_d_head 64, mamba_d_state 128,
mamba_n_groups 1, mamba_chunk_size 256; hidden 4096); the algorithm is the "minimal discrete SSD" listing of the
Mamba-2 paper, with a given initial state (chunked prefill continuing a cached state).
Inputs (already discretised): X [B, T, 128, 64] (bf16, = x * dt), A [B, T, 128] (fp32, = dt * A_head < 0),
Bm, Cm [B, T, 1, 128] (bf16, one group shared by all heads), initial_state [B, 128, 64, 128] (fp32).
Semantics per (batch, head), state h [P=64, N=128] starting at initial_state:
    h <- exp(A_t) h + X_t Bm_t^T;  Y_t = h Cm_t
Returns (Y [B, T, 128, 64] in X's dtype, final_state [B, 128, 64, 128] in initial_state's dtype).
segsum(a)[i, j] = a_{j+1} + ... + a_i for j <= i (computed as a masked cumulative sum, not as a difference of
prefix sums), -inf above the diagonal. alt_reference is the token-by-token recurrence.

Workload: prefill of 2 sequences x 4096 tokens through one Granite-4.0-H-Small Mamba-2 layer.
Full scale: B 2, T 4096, H 128; small scale: B 1, T 512, H 2 (same P, N, chunk).
Facts a kernel may rely on: P = 64, N = 128, one B/C group; T is a multiple of 256; A < 0, about [-1.6, -1e-3] per
token; initial_state fp32.
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 256


def _segsum(a):
    """Map a [..., L] to [..., L, L] with out[i, j] = sum_{j < k <= i} a_k (j <= i), -inf elsewhere."""
    L = a.shape[-1]
    strict = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1)
    rep = a[..., :, None].expand(*a.shape, L).masked_fill(~strict, 0)      # rep[i, j] = a_i if j < i
    incl = strict | torch.eye(L, dtype=torch.bool, device=a.device)
    return rep.cumsum(-2).masked_fill(~incl, float("-inf"))


def reference(X, A, Bm, Cm, initial_state):
    ct = torch.promote_types(X.dtype, torch.float32)
    Bsz, T, H, P = X.shape
    N = Bm.shape[-1]
    C = CHUNK
    nc = T // C
    Xc = X.to(ct).reshape(Bsz, nc, C, H, P).permute(0, 1, 3, 2, 4)          # [B, c, H, l, P]
    Bc = Bm.to(ct).reshape(Bsz, nc, C, N)                                    # single group: [B, c, l, N]
    Cc = Cm.to(ct).reshape(Bsz, nc, C, N)
    Ac = A.to(ct).reshape(Bsz, nc, C, H).permute(0, 3, 1, 2)                 # [B, H, c, l]
    Acs = Ac.cumsum(-1)
    # 1. intra-chunk (diagonal blocks)
    Lmat = _segsum(Ac).exp()                                                 # [B, H, c, l, s]
    CB = Cc @ Bc.transpose(-1, -2)                                           # [B, c, l, s]
    Y = (CB[:, :, None] * Lmat.transpose(1, 2)) @ Xc                         # [B, c, H, l, P]
    # 2. state of every chunk from its own inputs
    decay_states = (Acs[..., -1:] - Acs).exp().transpose(1, 2)               # [B, c, H, l]
    states = (Xc * decay_states[..., None]).transpose(-1, -2) @ Bc[:, :, None]  # [B, c, H, P, N]
    # 3. inter-chunk recurrence over chunk boundaries
    states = torch.cat([initial_state.to(ct)[:, None], states], 1)           # [B, c+1, H, P, N]
    decay_chunk = _segsum(F.pad(Acs[..., -1], (1, 0))).exp()                 # [B, H, c+1, c+1]
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    # 4. contribution of the state entering each chunk
    state_decay_out = Acs.exp().transpose(1, 2)                              # [B, c, H, l]
    Y = Y + (Cc[:, :, None] @ states.transpose(-1, -2)) * state_decay_out[..., None]
    Y = Y.permute(0, 1, 3, 2, 4).reshape(Bsz, T, H, P)
    return Y.to(X.dtype), final_state.to(initial_state.dtype)


def alt_reference(X, A, Bm, Cm, initial_state):
    ct = torch.promote_types(X.dtype, torch.float32)
    Xf, Af, Bf, Cf = X.to(ct), A.to(ct), Bm.to(ct)[:, :, 0], Cm.to(ct)[:, :, 0]
    h = initial_state.to(ct)
    ys = []
    for t in range(X.shape[1]):
        h = h * Af[:, t].exp()[..., None, None] + Xf[:, t, :, :, None] * Bf[:, t, None, None, :]
        ys.append((h * Cf[:, t, None, None, :]).sum(-1))
    return torch.stack(ys, 1).to(X.dtype), h.to(initial_state.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (2, 4096, 128) if scale == "full" else (1, 512, 2)
    P, N = 64, 128
    bf = torch.bfloat16
    dt_init = torch.exp(torch.empty(H, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt_init + torch.log(-torch.expm1(-dt_init))
    dt = F.softplus(torch.randn(B, T, H, device=device) * 0.5 + dt_bias)
    A_head = -torch.empty(H, device=device).uniform_(1, 16)
    x = torch.randn(B, T, H, P, device=device)
    X = (x * dt[..., None]).to(bf)
    A = dt * A_head
    Bm = torch.randn(B, T, 1, N, device=device).to(bf)
    Cm = torch.randn(B, T, 1, N, device=device).to(bf)
    initial_state = torch.randn(B, H, P, N, device=device) * 0.1
    return [X, A, Bm, Cm, initial_state]


def roofline(X, A, Bm, Cm, initial_state):
    B, T, H, P = X.shape
    N = Bm.shape[-1]
    C = CHUNK
    flops = B * (T // C) * (2 * C * C * N + H * (2 * C * C * P + 4 * C * P * N))
    in_bytes = sum(t.numel() * t.element_size() for t in (X, A, Bm, Cm, initial_state))
    out_bytes = X.numel() * X.element_size() + initial_state.numel() * initial_state.element_size()
    return {"flops": int(flops), "bytes": int(in_bytes + out_bytes)}
