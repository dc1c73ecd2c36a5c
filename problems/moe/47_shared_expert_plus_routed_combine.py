"""Shared-expert SwiGLU MLP plus the weighted combine (un-permute) of the routed experts' outputs.

Provenance: the MoE block of ERNIE-4.5-21B-A3B (config.json: hidden_size 2560, moe_num_experts 64, moe_k 6,
moe_intermediate_size 1536, moe_num_shared_experts 2 -> one shared SwiGLU MLP of intermediate size 2 * 1536 = 3072,
hidden_act silu, no biases). The block output is
  out[t] = shared_mlp(x[t]) + sum_j topk_weights[t, j] * expert_out[row_idx[t, j]]
  shared_mlp(x) = (silu(x @ W_gate^T) * (x @ W_up^T)) @ W_down^T
This is the tail of the MoE layer that serving engines fuse (the shared expert runs beside the routed grouped
GEMM; its down projection's epilogue, or a separate reduction kernel, adds the weighted routed outputs).
Precision: the shared MLP runs as bf16 GEMMs with fp32 accumulation - the gate/up projections and the SwiGLU
product are rounded to the input dtype as eager bf16 PyTorch does; the routed combine and the final add are
accumulated in fp32 and rounded to bf16 once.
Workload: a 4096-token prefill batch on one GPU (routed experts already applied by the grouped GEMM).

Inputs
  x             [T, 2560] bf16      MoE block input (post-norm hidden states)
  w_gate        [3072, 2560] bf16   shared expert gate_proj
  w_up          [3072, 2560] bf16   shared expert up_proj
  w_down        [2560, 3072] bf16   shared expert down_proj
  expert_out    [T*6, 2560] bf16    routed expert outputs in permuted (expert-grouped) row order
  topk_weights  [T, 6] fp32         routing weights (softmax top-6, renormalised: each row sums to 1)
  row_idx       [T, 6] int64        permuted row of each (token, choice) pair
Output
  out           [T, 2560] bf16

Full scale: T = 4096. Small scale: T = 48, d = 128, shared intermediate 192, k = 6, E = 8.
Facts a kernel may rely on: k = 6; row_idx is a permutation of 0..T*k-1 (rows grouped by expert in ascending
expert order, tokens ascending within an expert); topk_weights rows are positive and sum to 1.
"""
import torch


def reference(x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx):
    h = torch.nn.functional.silu(x @ w_gate.t()) * (x @ w_up.t())
    shared = h @ w_down.t()
    ct = torch.promote_types(x.dtype, torch.float32)
    routed = (topk_weights.to(ct)[:, :, None] * expert_out.to(ct)[row_idx]).sum(dim=1)
    return (shared.to(ct) + routed).to(x.dtype)


def alt_reference(x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx):
    """Scatter form: walk the permuted rows and add each one, weighted, into its token's output."""
    ct = torch.promote_types(x.dtype, torch.float32)
    T, k = row_idx.shape
    gate = x @ w_gate.t()
    h = gate * torch.sigmoid(gate) * (x @ w_up.t())
    acc = (h @ w_down.t()).to(ct)
    token_of_row = torch.arange(T, device=x.device).repeat_interleave(k)
    weight_of_row = topk_weights.reshape(-1).to(ct)
    flat_rows = row_idx.reshape(-1)
    for i in range(T * k):
        acc[token_of_row[i]] += weight_of_row[i] * expert_out[flat_rows[i]].to(ct)
    return acc.to(x.dtype)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, d, inter, E, k = 4096, 2560, 3072, 64, 6
    else:
        T, d, inter, E, k = 48, 128, 192, 8, 6
    dt = torch.bfloat16
    x = torch.randn(T, d, device=device).to(dt)
    w_gate = (torch.randn(inter, d, device=device) * 0.02).to(dt)
    w_up = (torch.randn(inter, d, device=device) * 0.02).to(dt)
    w_down = (torch.randn(d, inter, device=device) * 0.02).to(dt)
    # Routing: softmax over E experts, top-k, renormalised (as ERNIE-4.5's gate does).
    probs = torch.softmax(torch.randn(T, E, device=device) * 1.5, dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    topk_weights = (top_p / top_p.sum(dim=-1, keepdim=True)).float()
    order = torch.sort(top_e.reshape(-1), stable=True).indices
    row_idx = torch.empty(T * k, dtype=torch.int64, device=device)
    row_idx[order] = torch.arange(T * k, device=device)
    expert_out = (torch.randn(T * k, d, device=device) * 0.5).to(dt)
    return [x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx.reshape(T, k)]


def roofline(x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx):
    T, d = x.shape
    inter = w_gate.shape[0]
    k = row_idx.shape[1]
    flops = 2 * T * d * inter * 3 + 4 * T * inter + 2 * T * k * d
    ins = sum(t.numel() * t.element_size() for t in (x, w_gate, w_up, w_down, expert_out, topk_weights, row_idx))
    return {"flops": int(flops), "bytes": int(ins + x.numel() * x.element_size())}
