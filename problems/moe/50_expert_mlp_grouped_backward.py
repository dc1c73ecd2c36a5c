"""Backward of the per-expert SwiGLU MLPs over expert-grouped (permuted) tokens: gradients of the inputs and of
both grouped weight tensors, forward activations recomputed.

Provenance: the routed experts of Qwen3-30B-A3B (config.json: hidden_size 2048, moe_intermediate_size 768,
num_experts 128, num_experts_per_tok 8, hidden_act silu, no biases) trained with expert parallelism 8, so each GPU
holds 16 experts (the grouped-GEMM MLP of Megatron-style MoE training). Expert e owns rows
[offsets[e], offsets[e+1]) of the permuted token matrix, offsets = exclusive cumsum of tokens_per_expert.
Forward of expert e on its rows X (what is differentiated):
  h = X @ W_gate_up[e]^T          [n, 2I]   (first I columns: gate, last I columns: up)
  a = silu(gate) * up             [n, I]
  Y = a @ W_down[e]^T             [n, d]
Backward given grad_y (dY):
  grad_W_down[e] = dY^T @ a,   da = dY @ W_down[e]
  dgate = da * up * silu'(gate),  dup = da * silu(gate),  dh = [dgate, dup]
  grad_W_gate_up[e] = dh^T @ X,  grad_x = dh @ W_gate_up[e]
Precision: GEMMs in the input dtype with fp32 accumulation (outputs rounded to bf16, as eager bf16 GEMMs do);
the SwiGLU forward/backward element-wise math in fp32, with a and dh rounded to bf16 once before their GEMMs.
Workload: one MoE layer's expert backward on one GPU of an EP-8 training step, 2048 tokens per GPU x top-8 =
16384 routed rows arriving at this GPU's 16 experts, split unevenly.

Inputs
  x_perm             [N, 2048] bf16       expert inputs, rows grouped by expert (expert 0 first)
  tokens_per_expert  [16] int64           rows of each expert (>= 0, sum N)
  w_gate_up          [16, 1536, 2048] bf16
  w_down             [16, 2048, 768] bf16
  grad_y             [N, 2048] bf16       gradient of the expert outputs (same row order)
Outputs
  grad_x_perm        [N, 2048] bf16
  grad_w_gate_up     [16, 1536, 2048] bf16
  grad_w_down        [16, 2048, 768] bf16

Full scale: N = 16384 (fixed), E = 16, d = 2048, I = 768. Small scale: N = 192, E = 4, d = 64, I = 32.
tokens_per_expert are uniform random spacings of [0, N] (very uneven: some experts get a few rows, some several
thousand; an expert may get 0, and then its weight gradients are 0).
Facts a kernel may rely on: sum(tokens_per_expert) = N (16384 at full scale); E = 16, d = 2048, I = 768;
gate/up halves are contiguous blocks of w_gate_up's rows.
"""
import torch

OUTPUT_NAMES = ("grad_x_perm", "grad_w_gate_up", "grad_w_down")


def reference(x_perm, tokens_per_expert, w_gate_up, w_down, grad_y):
    dt = x_perm.dtype
    ct = torch.promote_types(dt, torch.float32)
    E, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    grad_x = torch.empty_like(x_perm)
    grad_w_gate_up = torch.empty_like(w_gate_up)
    grad_w_down = torch.empty_like(w_down)
    ends = torch.cumsum(tokens_per_expert, 0).tolist()
    start = 0
    for e in range(E):
        end = ends[e]
        xs, gy = x_perm[start:end], grad_y[start:end]
        h = (xs @ w_gate_up[e].t()).to(ct)
        gate, up = h[:, :inter], h[:, inter:]
        sig = torch.sigmoid(gate)
        silu = gate * sig
        a = (silu * up).to(dt)
        grad_w_down[e] = gy.t() @ a
        da = (gy @ w_down[e]).to(ct)
        dgate = da * up * (sig * (1 + gate * (1 - sig)))
        dup = da * silu
        dh = torch.cat([dgate, dup], dim=1).to(dt)
        grad_w_gate_up[e] = dh.t() @ xs
        grad_x[start:end] = dh @ w_gate_up[e]
        start = end
    return grad_x, grad_w_gate_up, grad_w_down


def alt_reference(x_perm, tokens_per_expert, w_gate_up, w_down, grad_y):
    """torch.autograd through the grouped forward (split by expert, per-expert SwiGLU MLP)."""
    with torch.enable_grad():
        x = x_perm.detach().clone().requires_grad_(True)
        wgu = w_gate_up.detach().clone().requires_grad_(True)
        wd = w_down.detach().clone().requires_grad_(True)
        inter = wgu.shape[1] // 2
        outs = []
        for e, xs in enumerate(torch.split(x, tokens_per_expert.tolist(), dim=0)):
            gate, up = (xs @ wgu[e].t()).split(inter, dim=1)
            outs.append((torch.nn.functional.silu(gate) * up) @ wd[e].t())
        y = torch.cat(outs, dim=0)
        gx, gwgu, gwd = torch.autograd.grad(y, (x, wgu, wd), grad_outputs=grad_y)
    return gx, gwgu, gwd


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        N, E, d, inter = 16384, 16, 2048, 768
    else:
        N, E, d, inter = 192, 4, 64, 32
    dt = torch.bfloat16
    cuts = torch.sort(torch.randint(0, N + 1, (E - 1,), device=device)).values
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), cuts,
                        torch.full((1,), N, dtype=torch.int64, device=device)])
    tokens_per_expert = bounds[1:] - bounds[:-1]
    x_perm = torch.randn(N, d, device=device).to(dt)
    w_gate_up = (torch.randn(E, 2 * inter, d, device=device) * 0.02).to(dt)
    w_down = (torch.randn(E, d, inter, device=device) * 0.02).to(dt)
    grad_y = (torch.randn(N, d, device=device) * 1e-3).to(dt)
    return [x_perm, tokens_per_expert, w_gate_up, w_down, grad_y]


def roofline(x_perm, tokens_per_expert, w_gate_up, w_down, grad_y):
    N, d = x_perm.shape
    inter = w_down.shape[2]
    # h recompute (2NdI*2), grad_W_down and da (2NdI each), grad_W_gate_up and grad_x (2Nd*2I each)
    flops = 16 * N * d * inter + 10 * N * inter
    tensors = (x_perm, tokens_per_expert, w_gate_up, w_down, grad_y)
    ins = sum(t.numel() * t.element_size() for t in tensors)
    outs = sum(t.numel() * t.element_size() for t in (x_perm, w_gate_up, w_down))
    return {"flops": int(flops), "bytes": int(ins + outs)}
