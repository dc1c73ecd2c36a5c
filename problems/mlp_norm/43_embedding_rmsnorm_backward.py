"""Backward through embedding lookup + RMSNorm: dense embedding-table gradient (scatter-add) and norm-weight gradient.

The table gradient is the scatter-add of per-token gradients into the rows of their token ids.

Forward (start of a pre-norm decoder): e = embed_table[input_ids]; n = RMSNorm(e) * weight feeds the first
attention block, and e itself is the residual stream. Given grad_normed = dL/dn and grad_residual = dL/de arriving
along the residual stream:
    r = rsqrt(mean(e^2) + eps);  ehat = e * r
    grad_norm_weight = sum_tokens grad_normed * ehat
    d_e = grad_residual + r * (grad_normed * weight - ehat * mean(grad_normed * weight * ehat))
    grad_table[v] = sum over tokens with input_ids == v of d_e     (zero for rows never referenced)
Provenance: Llama-3.2-1B (config.json: vocab_size 128256, hidden_size 2048, rms_norm_eps 1e-5), bf16
mixed-precision training.
Rounding points: all math in fp32 from the bf16 inputs, the per-row sums accumulated in fp32 (here with a
sort-based deterministic index_put_ accumulate), both outputs rounded once to bf16.
Workload: training micro-batch 8 x 2048 tokens. Token ids follow a skewed (Zipf-like) distribution, so many ids
repeat (up to hundreds of times) and most vocabulary rows receive no gradient.
Full scale: input_ids [8, 2048] int64; embed_table [128256, 2048] bf16; norm_weight [2048] bf16;
grad_normed, grad_residual [8, 2048, 2048] bf16. Outputs: grad_table [128256, 2048] bf16 (dense),
grad_norm_weight [2048] bf16.
Small scale: vocab 500, hidden 64, [2, 48] tokens.
Facts a kernel may rely on: 0 <= input_ids < vocab; hidden 2048 at full scale; eps 1e-5; the output table gradient
is dense and must be fully written (zeros where no token refers to the row).
"""
import torch
import torch.nn.functional as F

EPS = 1e-5
OUTPUT_NAMES = ("grad_table", "grad_norm_weight")


def reference(input_ids, embed_table, norm_weight, grad_normed, grad_residual):
    dt = embed_table.dtype
    acc = torch.promote_types(dt, torch.float32)
    v, d = embed_table.shape
    ids = input_ids.reshape(-1)
    e = F.embedding(ids, embed_table).to(acc)
    gn = grad_normed.reshape(-1, d).to(acc)
    r = torch.rsqrt(e.pow(2).mean(dim=-1, keepdim=True) + EPS)
    ehat = e * r
    grad_norm_weight = (gn * ehat).sum(dim=0)
    gw = gn * norm_weight.to(acc)
    d_e = grad_residual.reshape(-1, d).to(acc) + r * (gw - ehat * (gw * ehat).mean(dim=-1, keepdim=True))
    grad_table = torch.zeros(v, d, dtype=acc, device=embed_table.device)
    grad_table.index_put_((ids,), d_e, accumulate=True)
    return grad_table.to(dt), grad_norm_weight.to(dt)


def alt_reference(input_ids, embed_table, norm_weight, grad_normed, grad_residual):
    """Autograd through the forward (embedding backward does the scatter-add)."""
    with torch.enable_grad():
        tab = embed_table.detach().clone().requires_grad_(True)
        w = norm_weight.detach().clone().requires_grad_(True)
        e = F.embedding(input_ids, tab)
        n = e * torch.rsqrt(e.pow(2).mean(dim=-1, keepdim=True) + EPS) * w
        g_tab, g_w = torch.autograd.grad((n, e), (tab, w), (grad_normed, grad_residual))
    return g_tab, g_w


def make_inputs(device="cuda", scale="full"):
    b, s, v, d = (8, 2048, 128256, 2048) if scale == "full" else (2, 48, 500, 64)
    dt = torch.bfloat16
    # skewed ids: P(id < k) = (k / v) ** (1/3), so low ids (frequent tokens) repeat often
    input_ids = (torch.rand(b, s, device=device).pow(3) * v).long().clamp_(max=v - 1)
    embed_table = (0.02 * torch.randn(v, d, device=device)).to(dt)
    norm_weight = (0.2 + torch.rand(d, device=device)).to(dt)
    grad_normed = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    grad_residual = (0.01 * torch.randn(b, s, d, device=device)).to(dt)
    return [input_ids, embed_table, norm_weight, grad_normed, grad_residual]


def roofline(input_ids, embed_table, norm_weight, grad_normed, grad_residual):
    v, d = embed_table.shape
    t = input_ids.numel()
    es = embed_table.element_size()
    # distinct table rows referenced (upper bound min(tokens, vocab) where values are unknown, e.g. meta tensors)
    rows = min(input_ids.numel(), embed_table.shape[0]) if input_ids.is_meta else torch.unique(input_ids).numel()
    bytes_ = (input_ids.numel() * input_ids.element_size()
              + es * (rows * d + 2 * t * d + 2 * norm_weight.numel() + v * d))   # rows read; full table written
    return {"flops": int(14 * t * d), "bytes": int(bytes_)}
