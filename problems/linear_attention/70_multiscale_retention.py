"""RetNet multi-scale retention (chunkwise) with rotary q/k, per-head decay, RMS group norm and swish output gate.

Everything between the projections: rotary ("theta shift") on q and k, retention with a fixed per-head decay,
per-head RMS group norm, swish gate.

Provenance: RetNet 1.3B (torchscale retnet_1_3b: embed dim 2048, value embed dim 4096, 8 retention heads, so per
head K = 256, V = 512). Per head h the decay is gamma_h = 1 - 2^(-5-h); k is scaled by K**-0.5; q and k are
rotated by theta_shift with angle_i = 10000^(-i/(K/2-1)) (i < K/2, each repeated for a pair of channels,
rotate-every-two convention) at position t. Per (batch, head), state S [K, V] from zero:
    S <- gamma_h S + k_t v_t^T;  r_t = S^T q_t;  y_t = rmsnorm(r_t) (over V, eps 1e-6, no affine);
    out_t = silu(gate_t) * y_t
torchscale's extra per-row normalisations of the retention scores (decay-mask sqrt normalisation and |scores| sum
clamping) rescale r_t by a positive per-(token, head) scalar, which the group norm cancels, so they are omitted.
Returns out [B, T, H*V] in v's dtype.
The reference computes retention chunkwise (chunk 64: intra-chunk decay-masked q k^T, inter-chunk via the carried
state). alt_reference runs the recurrence token by token.

Workload: one RetNet-1.3B retention layer of a training step, 8 sequences x 2048 tokens.
Full scale: B 8, T 2048, H 8; small scale: B 1, T 128, H 2 (same head dims).
Facts a kernel may rely on: K = 256, V = 512; T is a multiple of 64; decays are the fixed constants above;
positions are 0..T-1 for every sequence; q, k, v, gate are bf16.
"""
import torch
import torch.nn.functional as F

CHUNK = 64



def _tr(x):
    """Swap the token and head dims."""
    return x.transpose(1, 2)

def _rotary(x, t0=0):
    """theta_shift with rotate-every-two; x [B, T, H, K]."""
    T, K = x.shape[1], x.shape[-1]
    angle = 1.0 / (10000 ** torch.linspace(0, 1, K // 2, dtype=x.dtype, device=x.device))
    angle = angle.repeat_interleave(2)
    pos = torch.arange(t0, t0 + T, dtype=x.dtype, device=x.device)
    ang = pos[:, None] * angle[None, :]                                      # [T, K]
    sin, cos = ang.sin()[:, None], ang.cos()[:, None]
    rot = torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
    return x * cos + rot * sin


def _prep(q, k, v):
    ct = torch.promote_types(v.dtype, torch.float32)
    H, K = q.shape[2], q.shape[3]
    qr = _rotary(q.to(ct))
    kr = _rotary(k.to(ct) * K ** -0.5)
    log_gamma = torch.log(1 - 2.0 ** (-5 - torch.arange(H, dtype=ct, device=q.device)))
    return _tr(qr), _tr(kr), _tr(v.to(ct)), log_gamma


def _finish(r, gate, v):
    """Map r [B, H, T, V] to rmsnorm per head, swish gate, [B, T, H*V]."""
    r = r.transpose(1, 2)
    y = r * torch.rsqrt((r * r).mean(-1, keepdim=True) + 1e-6)
    B, T, H, V = y.shape
    return (F.silu(gate.to(y.dtype)) * y.reshape(B, T, H * V)).to(v.dtype)


def reference(q, k, v, gate):
    qh, kh, vh, lg = _prep(q, k, v)
    B, H, T, K = qh.shape
    V = vh.shape[-1]
    C = CHUNK
    N = T // C
    qh, kh, vh = (x.reshape(B, H, N, C, x.shape[-1]) for x in (qh, kh, vh))
    i = torch.arange(C, dtype=qh.dtype, device=q.device)
    dmask = (i[:, None] - i[None, :])[None] * lg[:, None, None]
    dmask = dmask.masked_fill(i[:, None] < i[None, :], float("-inf")).exp()   # [H, C, C]: gamma^(i-j), j <= i
    qdec = ((i + 1)[None] * lg[:, None]).exp()                               # [H, C]: gamma^(i+1)
    kdec = ((C - 1 - i)[None] * lg[:, None]).exp()                           # [H, C]: gamma^(C-1-j)
    cdec = (C * lg).exp()                                                    # [H]
    intra = ((qh @ kh.transpose(-1, -2)) * dmask[None, :, None]) @ vh        # [B, H, N, C, V]
    S = qh.new_zeros(B, H, K, V)
    outs = []
    for n in range(N):
        outs.append(intra[:, :, n] + (qh[:, :, n] * qdec[None, :, :, None]) @ S)
        S = S * cdec[None, :, None, None] + (kh[:, :, n] * kdec[None, :, :, None]).transpose(-1, -2) @ vh[:, :, n]
    r = torch.stack(outs, 2).reshape(B, H, T, V)
    return _finish(r, gate, v)


def alt_reference(q, k, v, gate):
    qh, kh, vh, lg = _prep(q, k, v)
    B, H, T, K = qh.shape
    gamma = lg.exp()[None, :, None, None]
    S = qh.new_zeros(B, H, K, vh.shape[-1])
    outs = []
    for t in range(T):
        S = gamma * S + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outs.append((qh[:, :, t, :, None] * S).sum(-2))
    return _finish(torch.stack(outs, 2), gate, v)


def make_inputs(device="cuda", scale="full"):
    B, T, H = (8, 2048, 8) if scale == "full" else (1, 128, 2)
    K, V = 256, 512
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=device).to(bf)
    k = torch.randn(B, T, H, K, device=device).to(bf)
    v = torch.randn(B, T, H, V, device=device).to(bf)
    gate = torch.randn(B, T, H * V, device=device).to(bf)
    return [q, k, v, gate]


def roofline(q, k, v, gate):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = CHUNK
    flops = B * H * T * (C * K + C * V + 4 * K * V + 8 * K) + 6 * B * T * H * V  # causal halves of the chunk GEMMs
    in_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, gate))
    return {"flops": int(flops), "bytes": int(in_bytes + gate.numel() * gate.element_size())}
