"""Qwen3-Next MoE front: router GEMM, softmax top-10 of 512 experts (renormalised), and the sigmoid-gated shared
expert.

Provenance: Qwen3-Next-80B-A3B sparse MoE block (config.json: hidden_size 2048, num_experts 512,
num_experts_per_tok 10, norm_topk_prob true, moe_intermediate_size 512, shared_expert_intermediate_size 512,
hidden_act silu; the block has gate [512, 2048], shared_expert (gate/up/down SwiGLU MLP) and
shared_expert_gate [1, 2048], all without bias). Everything that reads the block input x except the routed
experts themselves:
  logits       = x @ W_router^T                    (fp32 accumulation, kept in fp32 - router in fp32)
  probs        = softmax(logits)                   (fp32)
  topk_weights, topk_ids = top-10 of probs, weights renormalised to sum to 1
  shared_out   = sigmoid(x @ w_shared_gate^T) * ((silu(x @ W_gate^T) * (x @ W_up^T)) @ W_down^T)
The shared expert runs as bf16 GEMMs with fp32 accumulation, its intermediates rounded to bf16 as eager bf16
PyTorch does; the sigmoid gate is applied to the bf16 down-projection output and the product rounded to bf16.
Workload: an 8192-token chunked-prefill step on one GPU.

Inputs
  x                [T, 2048] bf16
  w_router         [512, 2048] bf16
  w_gate           [512, 2048] bf16    shared expert gate_proj
  w_up             [512, 2048] bf16    shared expert up_proj
  w_down           [2048, 512] bf16    shared expert down_proj
  w_shared_gate    [1, 2048] bf16      shared_expert_gate
Outputs
  topk_weights  [T, 10] fp32    aligned position by position with topk_ids
  topk_ids      [T, 10] int64   any order within a row (compared as a set through the router probabilities)
  shared_out    [T, 2048] bf16

Full scale: T = 8192. Small scale: T = 64, d = 128, E = 64, shared intermediate 64 (top-10 kept).
Routing is compared tie-aware: near-ties between the 10th and 11th expert may be broken either way, and since
the weights are the renormalised probabilities of the chosen experts, either choice gives the same weights to
within rounding.
Facts a kernel may rely on: 512 experts, top-10, hidden 2048, shared intermediate 512; weights are the top-10
softmax probabilities divided by their sum.
"""
import torch

TOP_K = 10

OUTPUT_NAMES = ("topk_weights", "topk_ids", "shared_out")


def router_probs(x, w_router, w_gate, w_up, w_down, w_shared_gate):
    """Router probabilities [T, E] in which the top-10 is taken."""
    ct = torch.promote_types(x.dtype, torch.float32)
    return torch.softmax(x.to(ct) @ w_router.to(ct).t(), dim=-1)


COMPARATORS = {
    "topk_ids": {"kind": "topk", "scores": "router_probs", "dim": -1},
    "topk_weights": {"kind": "topk_values", "indices": "topk_ids", "scores": "router_probs"},
}


def reference(x, w_router, w_gate, w_up, w_down, w_shared_gate):
    probs = router_probs(x, w_router, w_gate, w_up, w_down, w_shared_gate)
    top_p, topk_ids = probs.topk(TOP_K, dim=-1)
    topk_weights = top_p / top_p.sum(dim=-1, keepdim=True)
    h = torch.nn.functional.silu(x @ w_gate.t()) * (x @ w_up.t())
    shared_out = torch.sigmoid(x @ w_shared_gate.t()) * (h @ w_down.t())
    return topk_weights, topk_ids, shared_out


def alt_reference(x, w_router, w_gate, w_up, w_down, w_shared_gate):
    """Log-domain routing (log-softmax, sort) and an explicit SwiGLU with a per-token gate."""
    ct = torch.promote_types(x.dtype, torch.float32)
    logits = x.to(ct) @ w_router.to(ct).t()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    order = torch.sort(logp, dim=-1, descending=True).indices[:, :TOP_K]
    sel = logp.gather(1, order)
    topk_weights = torch.exp(sel - torch.logsumexp(sel, dim=-1, keepdim=True))
    g = x @ w_gate.t()
    h = g / (1 + torch.exp(-g)) * (x @ w_up.t())
    gate = 1 / (1 + torch.exp(-(x * w_shared_gate).sum(dim=-1, keepdim=True)))
    return topk_weights, order, gate * (h @ w_down.t())


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, d, E, inter = 8192, 2048, 512, 512
    else:
        T, d, E, inter = 64, 128, 64, 64
    dt = torch.bfloat16
    x = torch.randn(T, d, device=device).to(dt)
    # Router logits with std ~1.5 (a trained router's spread); projections at init scale 0.02 (HF initializer_range).
    w_router = (torch.randn(E, d, device=device) * (1.5 / d ** 0.5)).to(dt)
    w_gate = (torch.randn(inter, d, device=device) * 0.02).to(dt)
    w_up = (torch.randn(inter, d, device=device) * 0.02).to(dt)
    w_down = (torch.randn(d, inter, device=device) * 0.02).to(dt)
    w_shared_gate = (torch.randn(1, d, device=device) * 0.02).to(dt)
    return [x, w_router, w_gate, w_up, w_down, w_shared_gate]


def roofline(x, w_router, w_gate, w_up, w_down, w_shared_gate):
    T, d = x.shape
    E = w_router.shape[0]
    inter = w_gate.shape[0]
    flops = 2 * T * d * (E + 3 * inter + 1) + 5 * T * E + 4 * T * inter
    ins = sum(t.numel() * t.element_size() for t in (x, w_router, w_gate, w_up, w_down, w_shared_gate))
    outs = T * TOP_K * (4 + 8) + x.numel() * x.element_size()
    return {"flops": int(flops), "bytes": int(ins + outs)}
