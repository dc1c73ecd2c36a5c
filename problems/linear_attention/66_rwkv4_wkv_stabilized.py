"""RWKV-4 WKV forward with max-stabilised exponentials (the wkv_forward CUDA kernel's semantics), bf16 k/v.

Provenance: RWKV-4 7B (BlinkDL RWKV-4-Pile/Raven 7B: n_embd 4096, ctx_len 1024 for the Pile models); the time-mix
block computes w = -exp(time_decay), u = time_first (fp32, per channel) and calls wkv(B, T, C, w, u, k, v).
Semantics per (batch, channel):
    y_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{(t-1-i) w + k_i} + e^{u + k_t})
evaluated as the kernel does, with a running maximum exponent p: state (a, b, p) starts at (0, 0, -1e38);
per token: q = max(p, u + k_t); y_t = (e^{p-q} a + e^{u+k_t-q} v_t) / (e^{p-q} b + e^{u+k_t-q});
then q' = max(p + w, k_t); a <- e^{p+w-q'} a + e^{k_t-q'} v_t; b <- e^{p+w-q'} b + e^{k_t-q'}; p <- q'.
Returns y [B, T, C] in v's dtype.
The reference is chunked (32 tokens): inside a chunk all pairwise exponents are formed and max-stabilised like a
softmax together with the carried (a, b, p) state; the state is then advanced by a whole chunk. alt_reference is
the token-by-token recurrence above.

Workload: one RWKV-4 7B time-mix layer of a training step, 8 sequences x 1024 tokens.
Full scale: B 8, T 1024, C 4096; small scale: B 2, T 128, C 64.
Facts a kernel may rely on: T is a multiple of 32; time_decay and time_first are fp32 [C] (w = -exp(time_decay) is
in about [-e^4, -e^-6]); k and v are bf16 with |k| up to about 10, so unstabilised exponentials overflow fp32 only
after accumulation over long spans; all math in fp32 or wider.
"""
import math

import torch

CHUNK = 32


def reference(time_decay, time_first, k, v):
    ct = torch.promote_types(v.dtype, torch.float32)
    w = -time_decay.to(ct).exp()                                             # [C]
    u = time_first.to(ct)
    kf, vf = k.to(ct), v.to(ct)
    B, T, C = kf.shape
    L = CHUNK
    j = torch.arange(L, device=k.device, dtype=ct)
    lower = (j[:, None] > j[None, :])                                        # l < j
    diag = torch.eye(L, dtype=torch.bool, device=k.device)
    rel = (j[:, None] - 1 - j[None, :])[..., None] * w                       # [L, L, C]: (j-1-l) w
    to_end = (L - 1 - j)[:, None] * w                                        # [L, C]: (L-1-l) w
    a = kf.new_zeros(B, C)
    b = kf.new_zeros(B, C)
    p = kf.new_full((B, C), -1e38)
    ys = []
    for s in range(0, T, L):
        kc, vc = kf[:, s:s + L], vf[:, s:s + L]                               # [B, L, C]
        inner = rel + kc[:, None, :, :]                                      # [B, L(j), L(l), C]
        inner = torch.where(diag[..., None], (u + kc)[:, :, None, :], inner)
        inner = inner.masked_fill(~(lower | diag)[..., None], float("-inf"))
        ps = p[:, None, :] + j[:, None] * w                                  # state exponent at each query
        m = torch.maximum(inner.amax(2), ps)
        e = (inner - m[:, :, None, :]).exp()
        es = (ps - m).exp()
        num = es * a[:, None] + (e * vc[:, None]).sum(2)
        den = es * b[:, None] + e.sum(2)
        ys.append(num / den)
        upd = to_end + kc                                                    # [B, L, C]
        pw = p + L * w
        p_new = torch.maximum(pw, upd.amax(1))
        eu = (upd - p_new[:, None]).exp()
        ep = (pw - p_new).exp()
        a = ep * a + (eu * vc).sum(1)
        b = ep * b + eu.sum(1)
        p = p_new
    return torch.cat(ys, 1).to(v.dtype)


def alt_reference(time_decay, time_first, k, v):
    ct = torch.promote_types(v.dtype, torch.float32)
    w = -time_decay.to(ct).exp()
    u = time_first.to(ct)
    kf, vf = k.to(ct), v.to(ct)
    B, T, C = kf.shape
    a = kf.new_zeros(B, C)
    b = kf.new_zeros(B, C)
    p = kf.new_full((B, C), -1e38)
    ys = []
    for t in range(T):
        kt, vt = kf[:, t], vf[:, t]
        ww = u + kt
        q = torch.maximum(p, ww)
        e1, e2 = (p - q).exp(), (ww - q).exp()
        ys.append((e1 * a + e2 * vt) / (e1 * b + e2))
        ww = p + w
        q = torch.maximum(ww, kt)
        e1, e2 = (ww - q).exp(), (kt - q).exp()
        a = e1 * a + e2 * vt
        b = e1 * b + e2
        p = q
    return torch.stack(ys, 1).to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, T, C = (8, 1024, 4096) if scale == "full" else (2, 128, 64)
    ratio = 0.5  # a layer in the middle of the stack, as in RWKV-4's initialisation
    h = torch.arange(C, device=device, dtype=torch.float32)
    time_decay = -5 + 8 * (h / (C - 1)) ** (0.7 + 1.3 * ratio) + 0.5 * torch.randn(C, device=device)
    zigzag = ((h + 1) % 3 - 1) * 0.5
    time_first = math.log(0.3) + zigzag + 0.5 * torch.randn(C, device=device)
    k = (torch.randn(B, T, C, device=device) * 2.5).clamp(-10, 10).to(torch.bfloat16)
    v = torch.randn(B, T, C, device=device).to(torch.bfloat16)
    return [time_decay, time_first, k, v]


def roofline(time_decay, time_first, k, v):
    B, T, C = k.shape
    flops = B * T * C * 20  # the sequential kernel: ~4 exp, ~16 mul/add/max per token and channel
    in_bytes = sum(x.numel() * x.element_size() for x in (time_decay, time_first, k, v))
    return {"flops": int(flops), "bytes": int(in_bytes + v.numel() * v.element_size())}
