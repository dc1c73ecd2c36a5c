"""gpt-oss MoE layer body: top-4 of 32 routing with softmax over the chosen logits, per-expert clamped SwiGLU
MLPs with biases (alpha 1.702, limit 7), weighted combine.

Provenance: gpt-oss-20b MLP block (config.json: hidden_size 2880, intermediate_size 2880, num_local_experts 32,
num_experts_per_tok 4, swiglu_limit 7.0; alpha 1.702 in the reference implementation; experts and router have
biases). Expert layout as in the HF GptOss code: gate_up_proj [E, d, 2I] with gate and up INTERLEAVED along the
last dim (gate = columns 0, 2, 4, ..., up = columns 1, 3, 5, ...), gate_up_proj_bias [E, 2I],
down_proj [E, I, d], down_proj_bias [E, d]. Per token t:
  ids   = top-4 of router_logits[t];   w = softmax(router_logits[t, ids])       (fp32)
  for each chosen expert e:
    h     = x[t] @ gate_up_proj[e] + gate_up_proj_bias[e]
    gate  = min(h[0::2], 7);  up = clamp(h[1::2], -7, 7)
    a     = (up + 1) * gate * sigmoid(1.702 * gate)
    y_e   = a @ down_proj[e] + down_proj_bias[e]
  out[t] = sum over the 4 chosen experts of w_e * y_e
Precision: the expert GEMMs run in the input dtype (bf16) with fp32 accumulation, h and a rounded to bf16 as eager
bf16 PyTorch does (the activation math itself in fp32); y_e is rounded to bf16, and the weighted combine is
accumulated in fp32 and rounded to bf16 once.
The released checkpoint stores the expert weights in MXFP4 (a Blackwell-native block format); here they are
given already dequantized to bf16 (the dense-weight deployment path on Hopper).
Workload: a 512-token decode/serving batch on one GPU (every expert active, ~64 rows each): the layer is bound by
reading the 1.6 GB of expert weights. The router GEMM (2880 -> 32) runs upstream in fp32.

Inputs
  x                   [T, 2880] bf16
  router_logits       [T, 32] fp32
  gate_up_proj        [32, 2880, 5760] bf16
  gate_up_proj_bias   [32, 5760] bf16
  down_proj           [32, 2880, 2880] bf16
  down_proj_bias      [32, 2880] bf16
Output
  out                 [T, 2880] bf16

Full scale: T = 512. Small scale: T = 24, E = 8, d = I = 64 (top-4 kept).
Every logit row holds 32 DISTINCT values on a 2^-5 grid (std ~2), so the top-4 choice has no ties and a clear
margin. Weights are scaled so h has std ~3.5 (the 7.0 clamps are active on a few percent of the entries).
Facts a kernel may rely on: top-4 of 32; d = I = 2880; interleaved gate/up columns; logits within [-8, 8).
"""
import torch

TOP_K = 4
ALPHA = 1.702
LIMIT = 7.0


def _expert(xs, w_gu, b_gu, w_down, b_down):
    """One expert on its rows: clamped SwiGLU MLP with biases (returns rows in the input dtype)."""
    dt = xs.dtype
    ct = torch.promote_types(dt, torch.float32)
    h = (xs @ w_gu + b_gu).to(ct)
    gate = h[:, 0::2].clamp(max=LIMIT)
    up = h[:, 1::2].clamp(min=-LIMIT, max=LIMIT)
    a = ((up + 1) * gate * torch.sigmoid(ALPHA * gate)).to(dt)
    return a @ w_down + b_down


def reference(x, router_logits, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias):
    ct = torch.promote_types(x.dtype, torch.float32)
    T = x.shape[0]
    E = gate_up_proj.shape[0]
    top_vals, top_ids = router_logits.to(ct).topk(TOP_K, dim=-1)
    weights = torch.softmax(top_vals, dim=-1)  # [T, 4]
    # Per-(token, choice) expert outputs gathered into a [T, 4, d] buffer, summed in a fixed order.
    y = torch.zeros(T, TOP_K, x.shape[1], dtype=ct, device=x.device)
    for e in range(E):
        tok, slot = torch.nonzero(top_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        ye = _expert(x[tok], gate_up_proj[e], gate_up_proj_bias[e], down_proj[e], down_proj_bias[e])
        y[tok, slot] = ye.to(ct) * weights[tok, slot][:, None]
    return y.sum(dim=1).to(x.dtype)


def alt_reference(x, router_logits, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias):
    """Dense form: every expert on every token, then a [T, E] weight matrix that is zero off the top-4."""
    ct = torch.promote_types(x.dtype, torch.float32)
    T = x.shape[0]
    E = gate_up_proj.shape[0]
    logits = router_logits.to(ct)
    order = torch.sort(logits, dim=-1, descending=True).indices[:, :TOP_K]
    sel = logits.gather(1, order)
    w = torch.exp(sel - sel.max(dim=-1, keepdim=True).values)
    w = w / w.sum(dim=-1, keepdim=True)
    dense_w = torch.zeros(T, E, dtype=ct, device=x.device).scatter(1, order, w)
    out = torch.zeros(T, x.shape[1], dtype=ct, device=x.device)
    for e in range(E):
        h = (x @ gate_up_proj[e] + gate_up_proj_bias[e]).to(ct)
        gate = torch.where(h[:, 0::2] > LIMIT, LIMIT, h[:, 0::2])
        up = torch.where(h[:, 1::2] > LIMIT, LIMIT, torch.where(h[:, 1::2] < -LIMIT, -LIMIT, h[:, 1::2]))
        a = ((up + 1) * gate / (1 + torch.exp(-ALPHA * gate))).to(x.dtype)
        out += dense_w[:, e:e + 1] * (a @ down_proj[e] + down_proj_bias[e]).to(ct)
    return out.to(x.dtype)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, E, d, inter = 512, 32, 2880, 2880
    else:
        T, E, d, inter = 24, 8, 64, 64
    dt = torch.bfloat16
    x = torch.randn(T, d, device=device).to(dt)
    step, lo, n_grid = 2.0 ** -5, -8.0, 512  # grid points lo + i * step cover [-8, 8)
    pos = torch.arange(n_grid, device=device, dtype=torch.float32)
    log_w = -0.5 * ((lo + pos * step) / 2.0) ** 2
    gumbel = -torch.log(-torch.log(torch.rand(T, n_grid, device=device).clamp_(1e-12, 1 - 1e-7)))
    picked = (log_w[None, :] + gumbel).topk(E, dim=-1).indices  # E distinct grid points per token
    shuffle = torch.rand(T, E, device=device).argsort(dim=-1)
    router_logits = lo + picked.gather(1, shuffle).float() * step
    gate_up_proj = (torch.randn(E, d, 2 * inter, device=device) * (3.5 / d ** 0.5)).to(dt)
    gate_up_proj_bias = (torch.randn(E, 2 * inter, device=device) * 0.5).to(dt)
    down_proj = (torch.randn(E, inter, d, device=device) * (1.0 / inter ** 0.5)).to(dt)
    down_proj_bias = (torch.randn(E, d, device=device) * 0.1).to(dt)
    return [x, router_logits, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias]


def roofline(x, router_logits, gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias):
    T, d = x.shape
    E, _, two_i = gate_up_proj.shape
    inter = two_i // 2
    flops = T * TOP_K * (2 * d * two_i + 2 * inter * d + 8 * inter + 2 * d)
    # Only experts that receive a token need their weights read.
    used = int(torch.unique(router_logits.topk(TOP_K, dim=-1).indices).numel()) if router_logits.device.type != "meta" else E
    per_expert = (gate_up_proj[0].numel() + gate_up_proj_bias[0].numel() + down_proj[0].numel()
                  + down_proj_bias[0].numel()) * gate_up_proj.element_size()
    bytes_ = (2 * x.numel() * x.element_size() + router_logits.numel() * router_logits.element_size()
              + used * per_expert)
    return {"flops": int(flops), "bytes": int(bytes_)}
