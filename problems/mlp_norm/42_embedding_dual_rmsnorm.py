"""MTP head input: masked embedding gather, RMSNorm of embeddings and of previous hidden states, concatenated.

Provenance: DeepSeek-V3 MTP module (config.json: hidden_size 7168, vocab_size 129280, rms_norm_eps 1e-6). As in
vLLM's DeepSeekMultiTokenPredictorLayer:
    e = embed_tokens(input_ids); e[positions == 0] = 0          # the first token of a sequence has no predecessor
    out = cat([enorm(e), hnorm(previous_hidden_states)], dim=-1)   # then fed to eh_proj (not part of this problem)
enorm and hnorm are RMSNorm(7168): statistics in fp32, normalised * weight rounded once to bf16. A zeroed embedding
row normalises to zero.
Workload: an 8192-token chunked-prefill batch of a random number of requests (token count fixed at 8192, request
boundaries random); some requests start at position 0, others continue a prefix (positions start at a random
offset); bf16.
Full scale: input_ids, positions [8192] int64; previous_hidden [8192, 7168] bf16; embed_table [129280, 7168] bf16
(1.85 GB, only the referenced rows are needed); enorm_weight, hnorm_weight [7168] bf16. Output [8192, 14336] bf16.
Small scale: 96 tokens, hidden 256, vocab 1000.
Facts a kernel may rely on: hidden 7168 at full scale; output columns [0, 7168) = normalised embeddings, [7168, 14336)
= normalised hidden states; 0 <= input_ids < vocab; positions >= 0; eps 1e-6.
"""
import torch
import torch.nn.functional as F

EPS = 1e-6


def _rms_norm(x, weight):
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (xf * inv * weight.to(xf.dtype)).to(x.dtype)


def reference(input_ids, positions, previous_hidden, embed_table, enorm_weight, hnorm_weight):
    e = F.embedding(input_ids, embed_table)
    e = torch.where((positions == 0)[:, None], torch.zeros_like(e), e)
    return torch.cat([_rms_norm(e, enorm_weight), _rms_norm(previous_hidden, hnorm_weight)], dim=-1)


def alt_reference(input_ids, positions, previous_hidden, embed_table, enorm_weight, hnorm_weight):
    """Dense form: the gather as a one-hot matmul (rows at position 0 get an all-zero one-hot), F.rms_norm."""
    acc = torch.promote_types(embed_table.dtype, torch.float32)
    onehot = F.one_hot(input_ids, embed_table.shape[0]).to(acc) * (positions != 0).to(acc)[:, None]
    e = (onehot @ embed_table.to(acc)).to(embed_table.dtype)
    d = embed_table.shape[1]
    en = F.rms_norm(e.to(acc), (d,), enorm_weight.to(acc), EPS).to(e.dtype)
    hn = F.rms_norm(previous_hidden.to(acc), (d,), hnorm_weight.to(acc), EPS).to(previous_hidden.dtype)
    return torch.cat([en, hn], dim=-1)


def _ragged_positions(t, mean_len, max_offset, device):
    """Positions of a token batch split into random requests (fixed total t)."""
    idx = torch.arange(t, device=device)
    starts = torch.rand(t, device=device) < (1.0 / mean_len)
    starts[0] = True
    seg_start = torch.cummax(idx * starts, dim=0).values          # index of each token's request start
    # half of the requests continue an existing prefix: their first position is a random offset
    offset = torch.randint(1, max_offset, (t,), device=device) * (torch.rand(t, device=device) < 0.5)
    return idx - seg_start + offset[seg_start]


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        t, d, v, mean_len, max_off = 8192, 7168, 129280, 1024, 8192
    else:
        t, d, v, mean_len, max_off = 96, 256, 1000, 16, 64
    dt = torch.bfloat16
    input_ids = torch.randint(0, v, (t,), device=device)
    positions = _ragged_positions(t, mean_len, max_off, device)
    previous_hidden = (torch.randn(t, d, device=device) * (0.5 + 2.0 * torch.rand(d, device=device))).to(dt)
    embed_table = (0.02 * torch.randn(v, d, device=device)).to(dt)
    enorm_weight = (0.2 + torch.rand(d, device=device)).to(dt)
    hnorm_weight = (0.2 + torch.rand(d, device=device)).to(dt)
    return [input_ids, positions, previous_hidden, embed_table, enorm_weight, hnorm_weight]


def roofline(input_ids, positions, previous_hidden, embed_table, enorm_weight, hnorm_weight):
    t, d = previous_hidden.shape
    es = previous_hidden.element_size()
    # distinct table rows referenced (upper bound min(tokens, vocab) where values are unknown, e.g. meta tensors)
    rows = min(input_ids.numel(), embed_table.shape[0]) if input_ids.is_meta else torch.unique(input_ids).numel()
    bytes_ = (input_ids.numel() * input_ids.element_size() + positions.numel() * positions.element_size()
              + es * (rows * d + previous_hidden.numel() + enorm_weight.numel() + hnorm_weight.numel() + 2 * t * d))
    return {"flops": int(8 * t * d), "bytes": int(bytes_)}
