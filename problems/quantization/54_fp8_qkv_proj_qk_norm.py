"""Block-fp8 fused QKV projection followed by Qwen3's per-head RMSNorm on q and k: dynamic per-(token, 128-group)
fp8 e4m3 activation quantization, GEMM with a 128x128 block-scaled fp8 e4m3 weight, split into q / k / v heads,
RMSNorm (over head_dim, learned weight) on every q and k head; bf16 outputs.

Provenance: Qwen3-32B-FP8 self-attention (config.json: hidden_size 5120, num_attention_heads 64,
num_key_value_heads 8, head_dim 128, rms_norm_eps 1e-6; quantization_config: quant_method fp8, fmt e4m3,
activation_scheme dynamic, weight_block_size [128, 128]). vLLM's QKVParallelLinear stacks the q, k and v weights
into one [(64 + 8 + 8) * 128, 5120] = [10240, 5120] fp8 weight with one fp32 scale per 128x128 block; Qwen3Attention
then applies q_norm / k_norm (Qwen3RMSNorm over head_dim: fp32 statistics, result cast back to bf16, times the bf16
weight) before RoPE. RoPE and the attention itself are not part of this problem.
Workload: one chunked-prefill step of 4096 tokens.
Full scale: x [4096, 5120] bf16, w_q [10240, 5120] float8_e4m3fn, w_scale [80, 40] fp32, q_norm_w [128] bf16,
k_norm_w [128] bf16 -> q [4096, 64, 128], k [4096, 8, 128], v [4096, 8, 128] bf16.
Small scale: x [16, 256], 16 q heads, 2 kv heads, head_dim 128 -> w_q [2560, 256], w_scale [20, 2].

Semantics:
    a_scale[t, g] = max(max_{i in g} |x[t, i]|, 1e-10) / 448 (fp32);  x_q = e4m3_rne(clamp(x / a_scale, +-448))
    h = (x_q * a_scale) @ (w_q * w_scale)^T             (block-expanded scales; reference: bf16 operands, fp32 acc)
    q, k, v = split(h, [64 * 128, 8 * 128, 8 * 128]) viewed as [T, heads, 128]
    q = q_norm_w * bf16(q / sqrt(mean(q ** 2, -1) + 1e-6))   (statistics in fp32), same for k with k_norm_w
Facts a kernel may rely on: head_dim 128 = one weight scale block, so each output head lies in exactly one
128-row block of w_scale; K = 5120 is a multiple of 128; 8 q heads per kv head.
"""
import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
HEAD_DIM = 128
EPS = 1e-6

Q_PER_KV = 8  # Qwen3-32B: 64 q heads over 8 kv heads; head counts follow from w_q's rows and this ratio

OUTPUT_NAMES = ("q", "k", "v")


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _quant_act_per_token_group(x, acc):
    T, K = x.shape
    xg = x.to(acc).view(T, K // BLOCK, BLOCK)
    a_scale = xg.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10) / FP8_MAX
    x_q = (xg / a_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x_q, a_scale


def _dequant_weight(w_q, w_scale, acc):
    N, K = w_q.shape
    blocks = w_q.to(acc).view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    return (blocks * w_scale.to(acc)[:, None, :, None]).view(N, K)


def _rms_norm_head(h, weight, acc):
    """Qwen3RMSNorm over the last dim: fp32 statistics, cast back to the input dtype, times the weight."""
    hf = h.to(acc)
    hf = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return weight * hf.to(h.dtype)


def _split_heads(h, n_q, n_kv):
    T = h.shape[0]
    q = h[:, : n_q * HEAD_DIM].reshape(T, n_q, HEAD_DIM)
    k = h[:, n_q * HEAD_DIM:(n_q + n_kv) * HEAD_DIM].reshape(T, n_kv, HEAD_DIM)
    v = h[:, (n_q + n_kv) * HEAD_DIM:].reshape(T, n_kv, HEAD_DIM)
    return q, k, v


def _head_counts(n_out, n_q_over_kv):
    n_kv = n_out // HEAD_DIM // (n_q_over_kv + 2)
    return n_q_over_kv * n_kv, n_kv


def reference(x, w_q, w_scale, q_norm_w, k_norm_w):
    T, K = x.shape
    N = w_q.shape[0]
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act_per_token_group(x, acc)
    x_dq = (x_q.to(acc) * a_scale).view(T, K).to(x.dtype)
    w_dq = _dequant_weight(w_q, w_scale, acc).to(x.dtype)
    h = x_dq @ w_dq.t()
    n_q, n_kv = _head_counts(N, Q_PER_KV)
    q, k, v = _split_heads(h, n_q, n_kv)
    return _rms_norm_head(q, q_norm_w, acc), _rms_norm_head(k, k_norm_w, acc), v.contiguous()


def alt_reference(x, w_q, w_scale, q_norm_w, k_norm_w):
    """Blockwise-scaled accumulation per 128-deep K block; norms written with torch.linalg.vector_norm."""
    T, K = x.shape
    N = w_q.shape[0]
    acc = _acc_dtype(x.dtype)
    x_q, a_scale = _quant_act_per_token_group(x, acc)
    xq = x_q.to(acc)
    wq = w_q.to(acc)
    ws = w_scale.to(acc).repeat_interleave(BLOCK, dim=0)[:N]
    h = torch.zeros(T, N, dtype=acc, device=x.device)
    for kb in range(K // BLOCK):
        h += (xq[:, kb, :] @ wq[:, kb * BLOCK:(kb + 1) * BLOCK].t()) * a_scale[:, kb, :] * ws[:, kb].unsqueeze(0)
    h = h.to(x.dtype)
    n_q, n_kv = _head_counts(N, Q_PER_KV)
    q, k, v = _split_heads(h, n_q, n_kv)

    def norm(t, w):
        tf = t.to(acc)
        rms = torch.linalg.vector_norm(tf, dim=-1, keepdim=True) / HEAD_DIM ** 0.5
        return w * (tf / torch.sqrt(rms * rms + EPS)).to(t.dtype)

    return norm(q, q_norm_w), norm(k, k_norm_w), v.contiguous()


def _quant_weight_block(w):
    N, K = w.shape
    blocks = w.view(N // BLOCK, BLOCK, K // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(N, K)
    return q, scale.view(N // BLOCK, K // BLOCK).contiguous()


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        T, K, n_kv = 4096, 5120, 8
    else:
        T, K, n_kv = 16, 256, 2
    n_q = Q_PER_KV * n_kv
    N = (n_q + 2 * n_kv) * HEAD_DIM
    # post-RMSNorm hidden states
    x = (torch.randn(T, K, device=device) * (0.5 + torch.rand(K, device=device))).to(torch.bfloat16)
    w = torch.randn(N, K, device=device) * (1.0 / K ** 0.5)
    w_q, w_scale = _quant_weight_block(w)
    q_norm_w = (1.0 + 0.3 * torch.randn(HEAD_DIM, device=device)).to(torch.bfloat16)
    k_norm_w = (1.0 + 0.3 * torch.randn(HEAD_DIM, device=device)).to(torch.bfloat16)
    return [x, w_q, w_scale, q_norm_w, k_norm_w]


def roofline(x, w_q, w_scale, q_norm_w, k_norm_w):
    T, K = x.shape
    N = w_q.shape[0]
    return {"flops": int(2 * T * N * K + 4 * T * N),
            "bytes": int(T * K * 2 + N * K + w_scale.numel() * 4 + 2 * HEAD_DIM * 2 + T * N * 2)}
