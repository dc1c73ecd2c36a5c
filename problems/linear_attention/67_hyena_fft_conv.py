"""Order-2 Hyena operator core: gate, causal long convolution by FFT with a bias (skip) term, second gate.

Provenance: HyenaDNA (d_model 256, order-2 Hyena operator, implicit long filters with exponential-decay modulation;
the 160k / 450k / 1M-token checkpoints). After the in-projection and short depthwise conv the activations split
into x0, x1, v ([B, D, L]); the operator computes
    u = x1 * v;   z = causal_conv(u, h) + bias * u;   y = x0 * z
with causal_conv(u, h)[t] = sum_{s <= t} h[s] u[t - s] per channel, evaluated as in the reference fftconv:
irfft(rfft(u, 2L) * rfft(h, 2L), 2L)[:L] in fp32. Returns y [B, D, L] in v's dtype.
alt_reference evaluates the same convolution directly (grouped conv1d with the flipped filter).

Workload: a HyenaDNA layer over 4 sequences of 131072 nucleotides (the 160k checkpoint's range).
Full scale: B 4, D 256, L 131072; small scale: B 2, D 8, L 512.
Facts a kernel may rely on: the filter h is fp32 [D, L] (as long as the sequence, decaying along L); bias is fp32
[D]; x0, x1, v are bf16 [B, D, L] contiguous; L is a power of two.
"""
import math

import torch
import torch.nn.functional as F


def _gates(x0, x1, v, bias):
    ct = torch.promote_types(v.dtype, torch.float32)
    u = x1.to(ct) * v.to(ct)
    return x0.to(ct), u, bias.to(ct)


def reference(x0, x1, v, h, bias):
    g0, u, b = _gates(x0, x1, v, bias)
    L = u.shape[-1]
    n = 2 * L
    hf = torch.fft.rfft(h.to(u.dtype), n=n)
    uf = torch.fft.rfft(u, n=n)
    z = torch.fft.irfft(uf * hf, n=n)[..., :L] + b[:, None] * u
    return (g0 * z).to(v.dtype)


def alt_reference(x0, x1, v, h, bias):
    g0, u, b = _gates(x0, x1, v, bias)
    D, L = h.shape
    w = h.to(u.dtype).flip(-1)[:, None, :]                                   # [D, 1, L]
    z = F.conv1d(F.pad(u, (L - 1, 0)), w, groups=D) + b[:, None] * u
    return (g0 * z).to(v.dtype)


def make_inputs(device="cuda", scale="full"):
    B, D, L = (4, 256, 131072) if scale == "full" else (2, 8, 512)
    bf = torch.bfloat16
    x0 = torch.randn(B, D, L, device=device).to(bf)
    x1 = torch.randn(B, D, L, device=device).to(bf)
    v = torch.randn(B, D, L, device=device).to(bf)
    # implicit filter: MLP features times the ExponentialModulation window exp(-t |delta_d|), t in [0, 1]
    t = torch.linspace(0, 1, L, device=device)
    delta = torch.linspace(math.log(1e-2) / 0.3, math.log(1e-2) / 1.5, D, device=device).abs()
    h = torch.randn(D, L, device=device) * 0.02 * torch.exp(-t[None, :] * delta[:, None])
    bias = torch.randn(D, device=device)
    return [x0, x1, v, h, bias]


def roofline(x0, x1, v, h, bias):
    B, D, L = v.shape
    n = 2 * L
    fft = 5 * n * max(1, n.bit_length() - 1) // 2                            # one real FFT of length n
    flops = B * D * (2 * fft + 6 * (n // 2 + 1) + 4 * L) + D * fft            # filter FFT once per channel
    in_bytes = sum(x.numel() * x.element_size() for x in (x0, x1, v, h, bias))
    return {"flops": int(flops), "bytes": int(in_bytes + v.numel() * v.element_size())}
