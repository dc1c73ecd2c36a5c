"""GShard top-2 gating with a per-expert capacity: softmax gates, capacity-limited slots, tokens copied into
expert buffers, dropped assignments marked.

Provenance: the top-2 gate of fairseq's MoE layer (GShard-style `top2gating`, second_expert_policy "all", no
gate noise) as used by NLLB-MoE 54B (config.json: d_model 2048, num_experts 128, top-2 routing, router in fp32).
Training-time capacity C = 2 * ceil(T / E) slots per expert (capacity factor 1 per routing choice).
Semantics, for T tokens and E experts:
  gates = softmax(router_logits)                         (fp32 or wider)
  e1 = argmax of the logits; e2 = argmax of the logits with e1 excluded.  Selection is on the logits (the same
       experts as on the gates, since softmax is monotonic); ties go to the LOWEST expert id (torch.argmax).
  slot of a first choice  = number of earlier tokens whose first choice is the same expert
  slot of a second choice = (number of tokens whose FIRST choice is that expert) + (number of earlier tokens whose
                            second choice is that expert)        -- first choices take priority over second ones
  an assignment whose slot >= C is dropped.
  combine weights: g1 = gates[e1] if kept else 0, g2 = gates[e2] if kept else 0; both divided by
                   max(g1 + g2, eps) with eps = finfo(fp32).eps (fairseq normalises after dropping).
  dispatched[e, s, :] = hidden[t] for every kept assignment (t -> expert e, slot s); unused slots are zero.
Workload: one MoE layer of an NLLB-MoE training step, 16384 tokens per GPU (e.g. 16 sequences of 1024).

Inputs
  hidden_states  [T, 2048] bf16
  router_logits  [T, 128] fp32    (hidden @ router.weight^T, computed upstream in fp32)
Outputs
  dispatched       [128, C, 2048] bf16   expert input buffers (zero where no token was placed)
  combine_weights  [T, 2] fp32           normalised gate weights of (first, second) choice, 0 if dropped
  expert_ids       [T, 2] int64          (e1, e2)
  slots            [T, 2] int64          slot in the expert buffer, -1 if the assignment was dropped

Full scale: T = 16384, E = 128, d = 2048, C = 256. Small scale: T = 512, E = 16, d = 64, C = 64.
The logits carry a per-expert popularity offset (N(0, 0.2^2) per expert) on top of N(0, 1) per token, so loads are
uneven (an imbalanced router early in training): about 20 % of the assignments overflow, mostly second choices,
some first choices too, and about 1 % of the tokens lose both (their combine weights are 0).
Facts a kernel may rely on: top-2; C = 2 * ceil(T / E); e1 != e2; first choices are placed before all second
choices of the same expert, each in token order.
"""
import math

import torch

TOP_K = 2

OUTPUT_NAMES = ("dispatched", "combine_weights", "expert_ids", "slots")


def _capacity(num_tokens, num_experts):
    return 2 * math.ceil(num_tokens / num_experts)


def reference(hidden_states, router_logits):
    ct = torch.promote_types(router_logits.dtype, torch.float32)
    T, E = router_logits.shape
    d = hidden_states.shape[1]
    C = _capacity(T, E)
    logits = router_logits.to(ct)
    gates = torch.softmax(logits, dim=-1)
    e1 = logits.argmax(dim=-1)
    mask1 = torch.nn.functional.one_hot(e1, E)
    e2 = logits.masked_fill(mask1.bool(), float("-inf")).argmax(dim=-1)
    mask2 = torch.nn.functional.one_hot(e2, E)
    loc1 = torch.cumsum(mask1, dim=0) - 1
    loc2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)
    s1 = loc1.gather(1, e1[:, None])[:, 0]
    s2 = loc2.gather(1, e2[:, None])[:, 0]
    keep1 = s1 < C
    keep2 = s2 < C
    g1 = torch.where(keep1, gates.gather(1, e1[:, None])[:, 0], 0.0)
    g2 = torch.where(keep2, gates.gather(1, e2[:, None])[:, 0], 0.0)
    denom = (g1 + g2).clamp(min=torch.finfo(torch.float32).eps)
    combine = torch.stack([g1 / denom, g2 / denom], dim=1)
    expert_ids = torch.stack([e1, e2], dim=1)
    keep = torch.stack([keep1, keep2], dim=1)
    slots = torch.where(keep, torch.stack([s1, s2], dim=1), -1)
    dispatched = hidden_states.new_zeros(E, C, d)
    tok = torch.arange(T, device=hidden_states.device)[:, None].expand(T, TOP_K)
    dispatched[expert_ids[keep], slots[keep]] = hidden_states[tok[keep]]
    return dispatched, combine, expert_ids, slots


def alt_reference(hidden_states, router_logits):
    """Sequential form: walk the first choices in token order, then the second choices, with per-expert counters."""
    ct = torch.promote_types(router_logits.dtype, torch.float32)
    T, E = router_logits.shape
    d = hidden_states.shape[1]
    C = _capacity(T, E)
    logits = router_logits.to(ct)
    gates = torch.exp(logits - torch.logsumexp(logits, dim=-1, keepdim=True))
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    expert_ids = order[:, :TOP_K].clone()
    fill = [0] * E
    slots = torch.full((T, TOP_K), -1, dtype=torch.int64, device=hidden_states.device)
    for j in range(TOP_K):
        for t, e in enumerate(expert_ids[:, j].tolist()):
            if fill[e] < C:
                slots[t, j] = fill[e]
            fill[e] += 1
    dispatched = hidden_states.new_zeros(E, C, d)
    combine = torch.zeros(T, TOP_K, dtype=ct, device=hidden_states.device)
    for t in range(T):
        g = [float(gates[t, expert_ids[t, j]]) if slots[t, j] >= 0 else 0.0 for j in range(TOP_K)]
        den = max(sum(g), torch.finfo(torch.float32).eps)
        for j in range(TOP_K):
            combine[t, j] = g[j] / den
            if slots[t, j] >= 0:
                dispatched[expert_ids[t, j], slots[t, j]] = hidden_states[t]
    return dispatched, combine, expert_ids, slots


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, E, d = 16384, 128, 2048
    else:
        T, E, d = 512, 16, 64
    hidden = torch.randn(T, d, device=device).to(torch.bfloat16)
    popularity = torch.randn(E, device=device) * 0.2
    logits = (torch.randn(T, E, device=device) + popularity[None, :]).float()
    return [hidden, logits]


def roofline(hidden_states, router_logits):
    T, E = router_logits.shape
    d = hidden_states.shape[1]
    C = _capacity(T, E)
    es = hidden_states.element_size()
    flops = 6 * T * E  # softmax + two argmax passes
    bytes_ = (T * d * es + router_logits.numel() * router_logits.element_size()  # inputs
              + E * C * d * es  # dispatched buffers (every slot written: token or zero)
              + T * TOP_K * (4 + 8 + 8))  # combine weights, expert ids, slots
    return {"flops": int(flops), "bytes": int(bytes_)}
