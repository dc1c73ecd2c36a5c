"""Mamba-2 SSD selective scan forward with dt bias + softplus, grouped B/C, D skip and the final state.

Semantics of mamba_chunk_scan_combined (dt_softplus, D, no z).

Provenance: Nemotron-H-8B Mamba-2 mixer (config.json: mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128,
n_groups 8; hidden 4096), the scan between the causal conv1d and the gated RMSNorm.
Inputs: x [B, T, 128, 64] (bf16), dt [B, T, 128] (bf16, raw), A [128] (fp32, = -exp(A_log)), Bm, Cm
[B, T, 8, 128] (bf16), D [128] (fp32), dt_bias [128] (fp32). Head h uses group h // 16.
Semantics per (batch, head), state h [P=64, N=128] starting at zero:
    d_t = softplus(dt_t + dt_bias);  h <- exp(d_t A) h + d_t x_t Bm_t^T;  y_t = h Cm_t + D x_t
Returns (y [B, T, 128, 64] in x's dtype, final_state [B, 128, 64, 128] fp32).
The reference is chunked (chunk 128): per chunk the intra-chunk quadratic form (Cm Bm^T * exp(segment decays) * d)
x plus the carried state's contribution, then the state update. alt_reference is the token-by-token recurrence.

Workload: prefill of 4 sequences x 4096 tokens through one Mamba-2 layer of Nemotron-H-8B.
Full scale: B 4, T 4096; small scale: B 1, T 256, 4 heads / 2 groups (same P, N).
Facts a kernel may rely on: P = 64, N = 128; H / G heads per group (16 at full scale); T is a multiple of 256;
A < 0; softplus(dt + dt_bias) is in about [1e-3, 0.3].
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 128



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _prep(x, dt, A, Bm, Cm, D, dt_bias):
    ct = torch.promote_types(x.dtype, torch.float32)
    H, G = x.shape[2], Bm.shape[2]
    d = F.softplus(dt.to(ct) + dt_bias.to(ct))                               # [B, T, H]
    Bh = _tr(Bm.to(ct).repeat_interleave(H // G, dim=2))                      # [B, H, T, N]
    Ch = _tr(Cm.to(ct).repeat_interleave(H // G, dim=2))
    return _tr(x.to(ct)), _tr(d), A.to(ct), Bh, Ch, D.to(ct)


def reference(x, dt, A, Bm, Cm, D, dt_bias):
    xh, d, A_, Bh, Ch, D_ = _prep(x, dt, A, Bm, Cm, D, dt_bias)
    Bsz, H, T, P = xh.shape
    N = Bh.shape[-1]
    C = CHUNK
    dA = d * A_[:, None]                                                     # [B, H, T]
    incl = torch.ones(C, C, dtype=torch.bool, device=x.device).tril()
    h = xh.new_zeros(Bsz, H, P, N)
    ys = []
    for s in range(0, T, C):
        xc, dc, Bc, Cc = xh[:, :, s:s + C], d[:, :, s:s + C], Bh[:, :, s:s + C], Ch[:, :, s:s + C]
        cs = dA[:, :, s:s + C].cumsum(-1)
        L = (cs[..., :, None] - cs[..., None, :]).masked_fill(~incl, float("-inf")).exp()
        M = (Cc @ Bc.transpose(-1, -2)) * L * dc[..., None, :]
        y = M @ xc + (Cc @ h.transpose(-1, -2)) * cs.exp()[..., None]
        ys.append(y)
        w = (cs[..., -1:] - cs).exp() * dc
        h = h * cs[..., -1].exp()[..., None, None] + (xc * w[..., None]).transpose(-1, -2) @ Bc
    y = torch.cat(ys, 2) + xh * D_[:, None, None]
    return y.transpose(1, 2).to(x.dtype), h


def alt_reference(x, dt, A, Bm, Cm, D, dt_bias):
    xh, d, A_, Bh, Ch, D_ = _prep(x, dt, A, Bm, Cm, D, dt_bias)
    Bsz, H, T, P = xh.shape
    h = xh.new_zeros(Bsz, H, P, Bh.shape[-1])
    ys = []
    for t in range(T):
        dt_t = d[:, :, t]
        h = h * (dt_t * A_).exp()[..., None, None] + (dt_t[..., None] * xh[:, :, t])[..., None] * Bh[:, :, t, None, :]
        ys.append((h * Ch[:, :, t, None, :]).sum(-1) + D_[:, None] * xh[:, :, t])
    return torch.stack(ys, 2).transpose(1, 2).to(x.dtype), h


def make_inputs(device="cuda", scale="full"):
    B, T, H, G = (4, 4096, 128, 8) if scale == "full" else (1, 256, 4, 2)
    P, N = 64, 128
    bf = torch.bfloat16
    x = torch.randn(B, T, H, P, device=device).to(bf)
    dt_init = torch.exp(torch.empty(H, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt_init + torch.log(-torch.expm1(-dt_init))                   # inverse softplus
    dt = (torch.randn(B, T, H, device=device) * 0.5).to(bf)
    A = -torch.empty(H, device=device).uniform_(1, 16)
    Bm = torch.randn(B, T, G, N, device=device).to(bf)
    Cm = torch.randn(B, T, G, N, device=device).to(bf)
    D = torch.ones(H, device=device) + 0.1 * torch.randn(H, device=device)
    return [x, dt, A, Bm, Cm, D, dt_bias]


def roofline(x, dt, A, Bm, Cm, D, dt_bias):
    B, T, H, P = x.shape
    G, N = Bm.shape[2], Bm.shape[3]
    C = CHUNK
    # per chunk and head: C Bm^T (shared per group), M x, C h^T, state update
    flops = B * (T // C) * (G * 2 * C * C * N + H * (2 * C * C * P + 4 * C * P * N))
    in_bytes = sum(t.numel() * t.element_size() for t in (x, dt, A, Bm, Cm, D, dt_bias))
    out_bytes = x.numel() * x.element_size() + B * H * P * N * 4
    return {"flops": int(flops), "bytes": int(in_bytes + out_bytes)}
