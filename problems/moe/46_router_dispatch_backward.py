"""Backward of softmax top-k routing with renormalised weights, token permutation and weighted un-permute
(combine): gradients for the hidden states, the router weight and the expert outputs.

Provenance: the MoE block of Qwen3-30B-A3B (config.json: hidden_size 2048, num_experts 128, num_experts_per_tok 8,
norm_topk_prob true) in a Megatron-style training step (router in fp32, permuted-token layout grouped by expert).
Forward whose gradients are computed (k = 8, E = 128):
  logits = x @ W^T (fp32 or wider)      probs = softmax(logits)     p = probs[t, topk_idx[t, j]]
  w[t, j] = p[t, j] / sum_j p[t, j]                                  (renormalised top-k weights)
  x_perm[row_idx[t, j]] = x[t]                                       (permute tokens into expert-grouped rows)
  out[t] = sum_j w[t, j] * expert_out[row_idx[t, j]]                 (un-permute and combine)
The expert MLPs between the permute and the combine run elsewhere: their backward delivers grad_x_perm, the gradient
with respect to x_perm. topk_idx and row_idx are the routing decisions saved by the forward (integer inputs).
Gradients (what the reference returns):
  grad_expert_out[row_idx[t, j]] = w[t, j] * grad_out[t]
  dw[t, j]  = <grad_out[t], expert_out[row_idx[t, j]]>
  dp        = (dw - sum_j w dw) / sum_j p ;   dprobs = dp scattered to topk_idx
  dlogits   = probs * (dprobs - sum_e probs dprobs)
  grad_x    = sum_j grad_x_perm[row_idx[t, j]] + dlogits @ W
  grad_W    = dlogits^T @ x
Router math in fp32 (or wider); outputs rounded once to their dtypes (x / W / expert_out dtypes).
Workload: one MoE layer of a training micro-batch of 8192 tokens (2 sequences of 4096) per GPU.

Inputs
  x            [T, 2048] bf16        router input (post-attention-norm hidden states)
  router_w     [128, 2048] bf16      router weight W
  topk_idx     [T, 8] int64          experts chosen by the forward (the top-8 of probs; distinct per row)
  row_idx      [T, 8] int64          permuted row of each (token, choice) pair
  expert_out   [T*8, 2048] bf16      expert outputs in permuted order
  grad_out     [T, 2048] bf16        gradient of the MoE block output
  grad_x_perm  [T*8, 2048] bf16      gradient w.r.t. the permuted expert inputs
Outputs
  grad_x           [T, 2048] bf16
  grad_router_w    [128, 2048] bf16
  grad_expert_out  [T*8, 2048] bf16

Full scale: T = 8192, d = 2048, E = 128, k = 8. Small scale: T = 96, d = 64, E = 16, k = 4.
Facts a kernel may rely on: row_idx is a permutation of 0..T*k-1 that groups rows by expert in ascending expert
order and, within an expert, by ascending token (a stable sort of topk_idx.flatten()); topk_idx rows hold k
distinct experts; k = 8 and E = 128 at full scale.
"""
import torch

OUTPUT_NAMES = ("grad_x", "grad_router_w", "grad_expert_out")


def reference(x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm):
    ct = torch.promote_types(x.dtype, torch.float32)
    T, d = x.shape
    k = topk_idx.shape[1]
    xf, wf = x.to(ct), router_w.to(ct)
    probs = torch.softmax(xf @ wf.t(), dim=-1)  # [T, E]
    p = probs.gather(1, topk_idx)
    s = p.sum(dim=-1, keepdim=True)
    w = p / s
    go = grad_out.to(ct)
    y = expert_out.to(ct)[row_idx]  # [T, k, d] expert outputs of each (token, choice)
    dw = (y * go[:, None, :]).sum(dim=-1)  # [T, k]
    dp = (dw - (w * dw).sum(dim=-1, keepdim=True)) / s
    dprobs = torch.zeros_like(probs).scatter(1, topk_idx, dp)
    dlogits = probs * (dprobs - (probs * dprobs).sum(dim=-1, keepdim=True))
    grad_x = grad_x_perm.to(ct)[row_idx].sum(dim=1) + dlogits @ wf
    grad_w = dlogits.t() @ xf
    grad_expert_out = torch.empty_like(expert_out)
    grad_expert_out[row_idx.reshape(-1)] = (w[:, :, None] * go[:, None, :]).reshape(T * k, d).to(expert_out.dtype)
    return grad_x.to(x.dtype), grad_w.to(router_w.dtype), grad_expert_out


def _forward_surrogate(x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm):
    """Scalar whose gradients are the problem's outputs: <out, grad_out> + <x_perm, grad_x_perm>."""
    T, d = x.shape
    k = topk_idx.shape[1]
    probs = torch.softmax(x @ router_w.t(), dim=-1)
    p = probs.gather(1, topk_idx)
    w = p / p.sum(dim=-1, keepdim=True)
    token_of_row = torch.empty(T * k, dtype=torch.int64, device=x.device)
    token_of_row[row_idx.reshape(-1)] = torch.arange(T, device=x.device).repeat_interleave(k)
    x_perm = x[token_of_row]
    weight_of_row = torch.empty(T * k, dtype=w.dtype, device=x.device)
    weight_of_row = weight_of_row.index_put((row_idx.reshape(-1),), w.reshape(-1))
    out = torch.zeros(T, d, dtype=x.dtype, device=x.device).index_add(
        0, token_of_row, weight_of_row[:, None] * expert_out)
    return (out * grad_out).sum() + (x_perm * grad_x_perm).sum()


def alt_reference(x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm):
    """torch.autograd through the forward (permute by index, combine by index_add)."""
    ct = torch.promote_types(x.dtype, torch.float32)
    with torch.enable_grad():
        xs = x.detach().to(ct).requires_grad_(True)
        ws = router_w.detach().to(ct).requires_grad_(True)
        ys = expert_out.detach().to(ct).requires_grad_(True)
        loss = _forward_surrogate(xs, ws, topk_idx, row_idx, ys, grad_out.to(ct), grad_x_perm.to(ct))
        gx, gw, gy = torch.autograd.grad(loss, (xs, ws, ys))
    return gx.to(x.dtype), gw.to(router_w.dtype), gy.to(expert_out.dtype)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, d, E, k = 8192, 2048, 128, 8
    else:
        T, d, E, k = 96, 64, 16, 4
    dt = torch.bfloat16
    x = torch.randn(T, d, device=device).to(dt)
    # Router weight scaled so logits have std ~1 (a trained router's spread); the forward's routing decision.
    router_w = (torch.randn(E, d, device=device) / d ** 0.5).to(dt)
    logits = x.float() @ router_w.float().t()
    topk_idx = torch.softmax(logits, dim=-1).topk(k, dim=-1).indices
    order = torch.sort(topk_idx.reshape(-1), stable=True).indices  # row r holds pair order[r]
    row_idx = torch.empty(T * k, dtype=torch.int64, device=device)
    row_idx[order] = torch.arange(T * k, device=device)
    row_idx = row_idx.reshape(T, k)
    expert_out = (torch.randn(T * k, d, device=device) * 0.5).to(dt)
    grad_out = (torch.randn(T, d, device=device) * 1e-2).to(dt)
    grad_x_perm = (torch.randn(T * k, d, device=device) * 1e-2).to(dt)
    return [x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm]


def roofline(x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm):
    T, d = x.shape
    E = router_w.shape[0]
    k = topk_idx.shape[1]
    flops = (3 * 2 * T * d * E  # logits recompute, dlogits @ W, dlogits^T @ x
             + 2 * T * k * d  # dw dot products
             + T * k * d  # grad_expert_out scaling
             + T * k * d)  # un-permute sum of grad_x_perm
    ins = sum(t.numel() * t.element_size() for t in (x, router_w, topk_idx, row_idx, expert_out, grad_out, grad_x_perm))
    outs = (x.numel() * x.element_size() + router_w.numel() * router_w.element_size()
            + expert_out.numel() * expert_out.element_size())
    return {"flops": int(flops), "bytes": int(ins + outs)}
