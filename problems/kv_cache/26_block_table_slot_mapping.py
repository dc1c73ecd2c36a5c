"""Build the per-token attention metadata of one scheduler step: positions, per-request sequence lengths, and one cache slot mapping per KV-cache group from that group's block table.

Provenance: vLLM v1 `GPUModelRunner._prepare_inputs` + `MultiGroupBlockTable.compute_slot_mapping`. A hybrid model
keeps one block table per KV-cache group; here a Gemma-3-style model with a full-attention group and a
sliding-window group (each group has its own pages; in the sliding-window table, pages that fell out of the window
were released and point at the null block 0). For a batch of requests with query_start_loc (exclusive prefix sum of
scheduled tokens) and num_computed_tokens (tokens already in the cache):
  req(i) = the request owning flattened token i, positions[i] = num_computed_tokens[req] + i - query_start_loc[req],
  slot_g[i] = block_table_g[req, positions[i] // 16] * 16 + positions[i] % 16 for each group g,
  seq_lens[r] = num_computed_tokens[r] + (query_start_loc[r + 1] - query_start_loc[r]).
Workload: a mixed step of 512 requests (vLLM max_num_seqs), 16384 scheduled tokens in total (FIXED; the
max_num_batched_tokens of a large-batch deployment): 448 decode requests with 1 token and 64 prefill chunks sharing
the rest; cached contexts of 0-65536 tokens; page size 16 in both groups.
Full scale: query_start_loc [513] int32, num_computed_tokens [512] int32, block_table_full and block_table_swa
[512, 4174] int32. Small scale: 12 requests (8 decodes), 96 tokens, contexts up to 100, tables [12, 14].

Outputs: positions [T] int64, slot_mapping_full [T] int64, slot_mapping_swa [T] int64, seq_lens [R] int32 (all exact).

Facts a kernel may rely on: page size 16 in both groups; T = query_start_loc[-1] (16384 at full scale) and
query_start_loc[0] = 0; every request schedules >= 1 token; requests are ordered, so tokens of one request are
contiguous; positions // 16 < table width; block ids fit in int32 and slot ids in int64.
"""
import torch

BLOCK_SIZE = 16
SLIDING_WINDOW = 1024


def reference(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    qsl = query_start_loc.long()
    num_sched = qsl[1:] - qsl[:-1]
    total = int(qsl[-1])
    req = torch.repeat_interleave(torch.arange(num_sched.shape[0], device=qsl.device), num_sched, output_size=total)
    positions = num_computed_tokens.long()[req] + torch.arange(total, device=qsl.device) - qsl[:-1][req]
    page_idx = positions // BLOCK_SIZE
    offset = positions % BLOCK_SIZE
    slot_full = block_table_full[req, page_idx].long() * BLOCK_SIZE + offset
    slot_swa = block_table_swa[req, page_idx].long() * BLOCK_SIZE + offset
    seq_lens = (num_computed_tokens.long() + num_sched).to(torch.int32)
    return positions, slot_full, slot_swa, seq_lens


def alt_reference(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    """Request-by-request form with Python integers."""
    pos, sf, ss, sl = [], [], [], []
    for r in range(num_computed_tokens.shape[0]):
        start, end, ctx = int(query_start_loc[r]), int(query_start_loc[r + 1]), int(num_computed_tokens[r])
        for p in range(ctx, ctx + end - start):
            pos.append(p)
            sf.append(int(block_table_full[r, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE)
            ss.append(int(block_table_swa[r, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE)
        sl.append(ctx + end - start)
    dev = query_start_loc.device
    return (torch.tensor(pos, dtype=torch.int64, device=dev), torch.tensor(sf, dtype=torch.int64, device=dev),
            torch.tensor(ss, dtype=torch.int64, device=dev), torch.tensor(sl, dtype=torch.int32, device=dev))


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        num_decode, num_prefill, total, max_ctx, num_blocks = 448, 64, 16384, 65536, 400000
    else:
        num_decode, num_prefill, total, max_ctx, num_blocks = 8, 4, 96, 100, 400
    num_reqs = num_decode + num_prefill
    prefill_total = total - num_decode
    w = torch.rand(num_prefill, device=device) + 0.25
    chunk = (w / w.sum() * (prefill_total - num_prefill)).floor().long() + 1
    chunk[-1] += prefill_total - chunk.sum()  # FIXED total of scheduled tokens
    num_sched = torch.cat([torch.ones(num_decode, dtype=torch.long, device=device), chunk])
    order = torch.randperm(num_reqs, device=device)  # decodes and prefills interleaved in the batch
    num_sched = num_sched[order]
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cumsum(num_sched, 0)])
    num_computed = torch.randint(0, max_ctx + 1, (num_reqs,), device=device)
    max_prefill = 5 * prefill_total // num_prefill + 1  # >= any chunk (weights lie in [0.25, 1.25])
    width = (max_ctx + max_prefill + BLOCK_SIZE - 1) // BLOCK_SIZE
    block_table_full = torch.randint(1, num_blocks, (num_reqs, width), device=device)
    block_table_swa = torch.randint(1, num_blocks, (num_reqs, width), device=device)
    # Sliding-window group: pages entirely before (computed - window) were freed -> null block 0.
    first_live_page = (num_computed - SLIDING_WINDOW).clamp(min=0) // BLOCK_SIZE
    freed = torch.arange(width, device=device).unsqueeze(0) < first_live_page.unsqueeze(1)
    block_table_swa = torch.where(freed, torch.zeros_like(block_table_swa), block_table_swa)
    return [query_start_loc.to(torch.int32), num_computed.to(torch.int32),
            block_table_full.to(torch.int32), block_table_swa.to(torch.int32)]


OUTPUT_NAMES = ("positions", "slot_mapping_full", "slot_mapping_swa", "seq_lens")


def roofline(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    T = int(query_start_loc[-1])
    R = num_computed_tokens.shape[0]
    flops = 6 * T
    bytes_ = ((R + 1) * 4 + R * 4  # query_start_loc, num_computed_tokens
              + 2 * T * 4  # one block-table entry per token per group (upper bound on distinct pages)
              + 3 * T * 8 + R * 4)  # outputs
    return {"flops": int(flops), "bytes": int(bytes_)}
