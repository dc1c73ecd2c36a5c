"""Mamba-2 SSD intra-chunk (diagonal-block) output: the SSD output with the state reset at every 256-token chunk.

Within each chunk, Y = (Cm Bm^T * exp(segment decay) * dt) X.

Provenance: Mamba-2 2.7B (state-spaces/mamba2-2.7b config: d_model 2560, expand 2, headdim 64 so 80 heads,
d_state 128, ngroups 1, chunk_size 256). This is the diagonal-block part of the chunked SSD kernels
(chunk cumsum of dt*A, the C.B^T chunk product, and the masked decay-weighted product with x); the state passing and
off-diagonal blocks are separate kernels.
Inputs: x [B, T, 80, 64] (bf16), dt [B, T, 80] (fp32, after softplus), A [80] (fp32, < 0), Bm, Cm [B, T, 1, 128]
(bf16, one group shared by all heads).
Semantics: for token i in chunk c (chunks of 256 tokens) and head h,
    Y_i = sum_{j in c, j <= i} (Cm_i . Bm_j) exp(sum_{j < k <= i} dt_k A_h) dt_j x_j
Returns Y [B, T, 80, 64] in x's dtype. alt_reference runs the SSM recurrence token by token with the state reset at
every chunk start.

Workload: prefill of 4 sequences x 4096 tokens through one Mamba-2 2.7B layer.
Full scale: B 4, T 4096, H 80; small scale: B 1, T 512, H 4 (same P, N, chunk).
Facts a kernel may rely on: P = 64, N = 128, one B/C group, chunk 256 (part of the semantics); T is a multiple of
256; A < 0; dt in about [1e-3, 0.3].
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 256


def reference(x, dt, A, Bm, Cm):
    ct = torch.promote_types(x.dtype, torch.float32)
    Bsz, T, H, P = x.shape
    C = CHUNK
    xh = x.to(ct).transpose(1, 2)                                            # [B, H, T, P]
    d = dt.to(ct).transpose(1, 2)                                            # [B, H, T]
    dA = d * A.to(ct)[:, None]
    Bf, Cf = Bm.to(ct)[:, :, 0], Cm.to(ct)[:, :, 0]                          # [B, T, N]
    incl = torch.ones(C, C, dtype=torch.bool, device=x.device).tril()
    ys = []
    for s in range(0, T, C):
        cs = dA[:, :, s:s + C].cumsum(-1)
        L = (cs[..., :, None] - cs[..., None, :]).masked_fill(~incl, float("-inf")).exp()
        CB = Cf[:, s:s + C] @ Bf[:, s:s + C].transpose(-1, -2)              # [B, l, s]
        M = CB[:, None] * L * d[:, :, None, s:s + C]
        ys.append(M @ xh[:, :, s:s + C])
    return torch.cat(ys, 2).transpose(1, 2).to(x.dtype)


def alt_reference(x, dt, A, Bm, Cm):
    ct = torch.promote_types(x.dtype, torch.float32)
    xf, d, Af = x.to(ct), dt.to(ct), A.to(ct)
    Bf, Cf = Bm.to(ct)[:, :, 0], Cm.to(ct)[:, :, 0]
    Bsz, T, H, P = x.shape
    ys = []
    for t in range(T):
        if t % CHUNK == 0:
            h = xf.new_zeros(Bsz, H, P, Bf.shape[-1])
        inp = (d[:, t, :, None] * xf[:, t])[..., None] * Bf[:, t, None, None, :]
        h = h * (d[:, t] * Af).exp()[..., None, None] + inp
        ys.append((h * Cf[:, t, None, None, :]).sum(-1))
    return torch.stack(ys, 1).to(x.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (4, 4096, 80) if scale == "full" else (1, 512, 4)
    P, N = 64, 128
    bf = torch.bfloat16
    dt_init = torch.exp(torch.empty(H, device=device).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt_init + torch.log(-torch.expm1(-dt_init))
    dt = F.softplus(torch.randn(B, T, H, device=device) * 0.5 + dt_bias)
    A = -torch.empty(H, device=device).uniform_(1, 16)
    x = torch.randn(B, T, H, P, device=device).to(bf)
    Bm = torch.randn(B, T, 1, N, device=device).to(bf)
    Cm = torch.randn(B, T, 1, N, device=device).to(bf)
    return [x, dt, A, Bm, Cm]


def roofline(x, dt, A, Bm, Cm):
    B, T, H, P = x.shape
    N = Bm.shape[-1]
    C = CHUNK
    flops = B * (T // C) * (2 * C * C * N + H * (C * C * P + 3 * C * C // 2))  # causal half of M x
    in_bytes = sum(t.numel() * t.element_size() for t in (x, dt, A, Bm, Cm))
    return {"flops": int(flops), "bytes": int(in_bytes + x.numel() * x.element_size())}
