"""DeepSeek-V3 router: sigmoid scores plus correction bias, group-limited top-8 of 256 experts, renormalised x 2.5.

Provenance: DeepSeek-V3 / R1 MoE gate (config.json: n_routed_experts 256, num_experts_per_tok 8, n_group 8,
topk_group 4, scoring_func "sigmoid", topk_method "noaux_tc", norm_topk_prob true, routed_scaling_factor 2.5;
the gate holds an fp32 e_score_correction_bias[256]). This is the fused routing kernel that serving engines run
on the router GEMM's fp32 output (vLLM/SGLang `grouped_topk` with `e_score_correction_bias`, TRT-LLM noaux_tc):
  scores  = sigmoid(logits)                          [T, 256]
  choice  = scores + bias                            selection scores (bias steers load balance only)
  group   = sum of the top-2 choice values in each of the 8 groups of 32 consecutive experts
  keep the top-4 groups; experts of the other groups get choice 0.0 (the HF DeepSeek-V3 fill value; every
  choice value is > 0 here, so a masked expert is never selected)
  ids     = top-8 experts by choice among the kept groups
  weights = scores[ids] / sum(scores[ids]) * 2.5    (weights use the UNBIASED sigmoid scores)
Arithmetic in fp32 (or wider: the float64 anchor runs the same code in float64).
Workload: one MoE layer of a 32k-token prefill step (e.g. four 8192-token chunked-prefill requests).

Inputs
  gating_output            [T, 256] fp32   router logits (hidden @ gate.weight^T, computed in fp32 upstream)
  e_score_correction_bias  [256] fp32
Outputs
  topk_weights  [T, 8] fp32    routing weights, aligned position by position with topk_ids
  topk_ids      [T, 8] int32   selected experts (any order within a row; compared as a set through the scores)

Full scale: T = 32768. Small scale: T = 256 (same 256 experts, 8 groups).
Inputs are drawn so that every selection decision has a clear margin: per token the biased scores take distinct
values on a 2^-10 grid plus a per-group offset (group g adds g * 2^-14), and the logits are the exact inverse
sigmoid of (choice - bias) rounded to fp32. So the choice values of two experts differ by >= 9 * 2^-14 (5.5e-4)
and two group scores by >= 2^-13 (1.2e-4) - far above fp32 rounding (~1e-7) - and any correct fp32 kernel
selects exactly the reference's experts.
The choice values lie in [0.2, 0.8], the bias in [-0.15, 0.15] (so sigmoid scores lie in [0.05, 0.95]).
Facts a kernel may rely on: 256 experts in 8 groups of 32 consecutive ids; top-4 groups; top-8 experts;
routed_scaling_factor 2.5.
"""
import torch

NUM_EXPERTS = 256
N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
ROUTED_SCALING_FACTOR = 2.5

GRID_STEP = 2.0 ** -10
GROUP_OFFSET = GRID_STEP / 16


def routing_scores(gating_output, e_score_correction_bias):
    """Selection scores [T, 256] in which the top-8 is taken: sigmoid + bias, 0.0 outside the 4 kept groups."""
    ct = torch.promote_types(gating_output.dtype, torch.float32)
    T, E = gating_output.shape
    choice = torch.sigmoid(gating_output.to(ct)) + e_score_correction_bias.to(ct)[None, :]
    group_scores = choice.view(T, N_GROUP, E // N_GROUP).topk(2, dim=-1).values.sum(dim=-1)  # [T, 8]
    group_idx = group_scores.topk(TOPK_GROUP, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    expert_mask = group_mask[:, :, None].expand(T, N_GROUP, E // N_GROUP).reshape(T, E)
    return choice.masked_fill(~expert_mask, 0.0)


def reference(gating_output, e_score_correction_bias):
    ct = torch.promote_types(gating_output.dtype, torch.float32)
    scores = torch.sigmoid(gating_output.to(ct))
    masked_choice = routing_scores(gating_output, e_score_correction_bias)
    topk_ids = masked_choice.topk(TOP_K, dim=-1).indices
    weights = scores.gather(1, topk_ids)
    weights = weights / weights.sum(dim=-1, keepdim=True) * ROUTED_SCALING_FACTOR
    return weights, topk_ids.to(torch.int32)


def alt_reference(gating_output, e_score_correction_bias):
    """Explicit per-token loop: rank groups, then pick experts greedily from the union of the kept groups."""
    ct = torch.promote_types(gating_output.dtype, torch.float32)
    T, E = gating_output.shape
    per = E // N_GROUP
    scores = torch.sigmoid(gating_output.to(ct))
    choice = scores + e_score_correction_bias.to(ct)[None, :]
    weights = torch.empty(T, TOP_K, dtype=ct, device=gating_output.device)
    ids = torch.empty(T, TOP_K, dtype=torch.int32, device=gating_output.device)
    for t in range(T):
        c = choice[t]
        gs = torch.stack([torch.sort(c[g * per:(g + 1) * per], descending=True).values[:2].sum()
                          for g in range(N_GROUP)])
        kept = torch.sort(gs, descending=True).indices[:TOPK_GROUP]
        cand = torch.cat([torch.arange(int(g) * per, (int(g) + 1) * per, device=c.device) for g in kept])
        order = torch.sort(c[cand], descending=True).indices[:TOP_K]
        sel = cand[order]
        w = scores[t, sel]
        weights[t] = w / w.sum() * ROUTED_SCALING_FACTOR
        ids[t] = sel.to(torch.int32)
    return weights, ids


OUTPUT_NAMES = ("topk_weights", "topk_ids")
COMPARATORS = {
    "topk_ids": {"kind": "topk", "scores": "routing_scores", "dim": -1},
    "topk_weights": {"kind": "topk_values", "indices": "topk_ids", "scores": "routing_scores"},
}


def _distinct_grid_indices(rows, n_grid, m, device):
    """m distinct grid indices per row (Gumbel top-k: sampling without replacement, bell-shaped weights),
    returned in random column order."""
    pos = torch.arange(n_grid, device=device, dtype=torch.float32)
    log_w = -0.5 * ((pos - (n_grid - 1) / 2) / (n_grid / 5)) ** 2
    gumbel = -torch.log(-torch.log(torch.rand(rows, n_grid, device=device).clamp_(1e-12, 1 - 1e-7)))
    picked = (log_w[None, :] + gumbel).topk(m, dim=-1).indices
    shuffle = torch.rand(rows, m, device=device).argsort(dim=-1)
    return picked.gather(1, shuffle)


def make_inputs(device="cuda", scale="full"):
    T = 32768 if scale == "full" else 256
    E = NUM_EXPERTS
    bias = ((torch.rand(E, device=device) * 2 - 1) * 0.15).float()
    lo = 0.2
    n_grid = int(round((0.8 - lo) / GRID_STEP))  # 614 grid points for 256 distinct values per token
    grid = _distinct_grid_indices(T, n_grid, E, device).double()
    group_of = torch.arange(E, device=device) // (E // N_GROUP)
    choice = lo + grid * GRID_STEP + group_of.double()[None, :] * GROUP_OFFSET
    s = choice - bias.double()[None, :]  # sigmoid scores in [0.05, 0.95]
    logits = (torch.log(s) - torch.log1p(-s)).float()
    return [logits, bias]


def roofline(gating_output, e_score_correction_bias):
    T, E = gating_output.shape
    # sigmoid + bias + group sums + top-k selections + renormalisation: ~8 flops per logit, a few per output
    flops = 8 * T * E + 4 * T * TOP_K
    bytes_ = (gating_output.numel() * gating_output.element_size()
              + e_score_correction_bias.numel() * e_score_correction_bias.element_size()
              + T * TOP_K * (4 + 4))
    return {"flops": int(flops), "bytes": int(bytes_)}
