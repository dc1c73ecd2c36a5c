"""Gather one context-parallel rank's shard of every request's K/V from an fp8 paged cache into contiguous bf16 K and V (per-block scales), with the shard's global token positions.

Provenance: long-context prefill with context parallelism in vLLM-style serving: the KV of each request is spread
over CP_WORLD ranks in runs of CP_INTERLEAVE tokens (vLLM's cp_kv_cache_interleave_size): global token p lives on
rank (p // CP_INTERLEAVE) % CP_WORLD, at local index (p // (CP_INTERLEAVE * CP_WORLD)) * CP_INTERLEAVE
+ p % CP_INTERLEAVE of that rank's paged cache. Before ring/all-gather attention over the cached context, each rank
gathers its local shard into contiguous bf16 buffers (the role of vLLM's gather_and_maybe_dequant_cache /
cp_gather_cache) and tags every row with its global position (for the causal mask and for merging shards).
The cache is fp8 e4m3 with one fp32 scale per 128-value block = one (token, kv head) vector (the layout problem 21
writes). Head layout of Llama-3.1-8B (config.json: num_key_value_heads 8, head_dim 128).
Workload: this problem is rank 1 of CP_WORLD = 4 with CP_INTERLEAVE = 16; 4 requests whose global context lengths
sum to 262144 tokens (FIXED global total; the local total is about 65536 and depends on the lengths); page size 16.
Full scale: k_cache, v_cache [20488, 16, 8, 128] float8_e4m3fn; k_scale_cache, v_scale_cache [20488, 16, 8, 1] fp32;
block_table [4, 5121] int32 (local pages; entries past a request's last local page are valid but unused);
seq_lens [4] int32 (GLOBAL lengths). Outputs k, v [N_local, 8, 128] bf16, positions [N_local] int64.
Small scale: 3 requests, 640 global tokens.

Semantics: local length of a request with global length L is n = (L // 64) * 16 + clamp(L % 64 - 16, 0, 16); rows
are request-major (request b's rows start at the sum of the previous local lengths); row for local index j of
request b reads page block_table[b, j // 16], offset j % 16; k = bf16(fp32(k_cache) * k_scale_cache) (same for v;
the product in fp32, rounded once to bf16); positions = (j // 16) * 64 + 1 * 16 + j % 16.

Facts a kernel may rely on: CP_WORLD 4, CP_RANK 1, CP_INTERLEAVE 16, page size 16 (so each local page holds one
interleave run), 8 kv heads x 128; block ids are in range and distinct; scales are positive and finite.
"""
import torch

NUM_KV_HEADS = 8
HEAD_DIM = 128
CP_WORLD = 4
CP_RANK = 1
CP_INTERLEAVE = 16


def _local_lens(seq_lens):
    run = CP_INTERLEAVE * CP_WORLD
    L = seq_lens.long()
    return (L // run) * CP_INTERLEAVE + (L % run - CP_RANK * CP_INTERLEAVE).clamp(0, CP_INTERLEAVE)


def _gather(cache, blocks, offsets):
    # Advanced indexing on raw bytes for 1-byte cache dtypes (fp8), directly otherwise.
    if cache.element_size() == 1:
        return cache.view(torch.uint8)[blocks, offsets].view(cache.dtype)
    return cache[blocks, offsets]


def reference(k_cache, v_cache, k_scale_cache, v_scale_cache, block_table, seq_lens):
    page = k_cache.shape[1]
    n = _local_lens(seq_lens)
    total = int(n.sum())
    req = torch.repeat_interleave(torch.arange(n.shape[0], device=n.device), n, output_size=total)
    j = torch.arange(total, device=n.device) - (torch.cumsum(n, 0) - n)[req]
    blocks = block_table[req, j // page].long()
    offsets = j % page
    outs = []
    for cache, scale in ((k_cache, k_scale_cache), (v_cache, v_scale_cache)):
        cdt = torch.promote_types(scale.dtype, torch.float32)
        x = _gather(cache, blocks, offsets).to(cdt) * scale[blocks, offsets].to(cdt)
        outs.append(x.to(torch.bfloat16))
    positions = (j // CP_INTERLEAVE) * (CP_INTERLEAVE * CP_WORLD) + CP_RANK * CP_INTERLEAVE + j % CP_INTERLEAVE
    return outs[0], outs[1], positions


def alt_reference(k_cache, v_cache, k_scale_cache, v_scale_cache, block_table, seq_lens):
    """Forward form: walk each request's global positions, keep those owned by this rank, count local slots."""
    page = k_cache.shape[1]
    ks, vs, ps = [], [], []
    for b in range(seq_lens.shape[0]):
        p = torch.arange(int(seq_lens[b]), device=seq_lens.device)
        p = p[(p // CP_INTERLEAVE) % CP_WORLD == CP_RANK]
        j = torch.arange(p.shape[0], device=p.device)  # local order = global order
        blk = block_table[b].long()[j // page]
        for cache, scale, acc in ((k_cache, k_scale_cache, ks), (v_cache, v_scale_cache, vs)):
            cdt = torch.promote_types(scale.dtype, torch.float32)
            rows = torch.stack([_gather(cache, blk[i:i + 1], (j[i:i + 1] % page))[0] for i in range(j.shape[0])]) \
                if j.shape[0] else cache.new_empty(0, NUM_KV_HEADS, HEAD_DIM)
            acc.append((rows.to(cdt) * scale[blk, j % page].to(cdt)).to(torch.bfloat16))
        ps.append(p)
    return torch.cat(ks), torch.cat(vs), torch.cat(ps)


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        num_reqs, total, page = 4, 262144, 16
    else:
        num_reqs, total, page = 3, 640, 16
    w = torch.rand(num_reqs, device=device) + 0.25
    seq_lens = (w / w.sum() * (total - num_reqs)).floor().long() + 1
    seq_lens[-1] += total - seq_lens.sum()  # FIXED global total
    max_local = 5 * total // num_reqs // CP_WORLD + CP_INTERLEAVE  # >= any local length
    max_blocks = (max_local + page - 1) // page
    num_blocks = num_reqs * max_blocks + 4
    block_table = torch.randperm(num_blocks, device=device)[:num_reqs * max_blocks].view(num_reqs, max_blocks)
    shape = (num_blocks, page, NUM_KV_HEADS, HEAD_DIM)
    # Cache entries as a per-(token, head) amax/448 quantizer leaves them: codes span the e4m3 range.
    k_cache = (torch.randn(shape, device=device) * 150).clamp(-448, 448).to(torch.float8_e4m3fn)
    v_cache = (torch.randn(shape, device=device) * 150).clamp(-448, 448).to(torch.float8_e4m3fn)
    k_scale_cache = torch.rand(num_blocks, page, NUM_KV_HEADS, 1, device=device) * 0.02 + 0.002
    v_scale_cache = torch.rand(num_blocks, page, NUM_KV_HEADS, 1, device=device) * 0.01 + 0.002
    return [k_cache, v_cache, k_scale_cache, v_scale_cache, block_table.to(torch.int32), seq_lens.to(torch.int32)]


OUTPUT_NAMES = ("k", "v", "positions")


def roofline(k_cache, v_cache, k_scale_cache, v_scale_cache, block_table, seq_lens):
    page = k_cache.shape[1]
    n = _local_lens(seq_lens)
    total = int(n.sum())
    pages = int(((n + page - 1) // page).sum())
    per_tok = NUM_KV_HEADS * HEAD_DIM
    flops = 2 * total * per_tok
    bytes_ = (2 * total * per_tok * k_cache.element_size() + 2 * total * NUM_KV_HEADS * k_scale_cache.element_size()
              + pages * block_table.element_size() + seq_lens.numel() * seq_lens.element_size()
              + 2 * total * per_tok * 2 + total * 8)
    return {"flops": int(flops), "bytes": int(bytes_)}
