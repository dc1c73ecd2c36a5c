"""Gather each request's tokens from a packed fp8 MLA cache (656-byte entries) by block table and dequantize them into a contiguous bf16 workspace.

Provenance: DeepSeek-V3.2 sparse-MLA prefill in vLLM with kv_cache_dtype "fp8_ds_mla" (kv_lora_rank 512,
qk_rope_head_dim 64 from DeepSeek-V3.2's config.json). Each cached token is one 656-byte entry:
bytes [0, 512) = 512 float8_e4m3fn latent values, bytes [512, 528) = 4 little-endian fp32 scales (one per
128-value tile of the latent), bytes [528, 656) = 64 bf16 rope values. Before the prefill kernel runs, vLLM's
`cp_gather_and_upconvert_fp8_kv_cache` gathers every request's cached tokens through its block table into a bf16
workspace [total_tokens, 576] = [latent * scale | rope].
Workload: 8 requests whose cached lengths sum to 65536 tokens (FIXED total), page size 64 (FlashMLA).
Full scale: kv_cache [5136, 64, 656] uint8 (num_blocks = 8 * max_blocks + 8, max_blocks = 641), block_table
[8, 641] int32, seq_lens [8] int32, workspace_starts [8] int32; output [65536, 576] bf16.
Small scale: 3 requests, 144 tokens, page size 16.

Semantics: for request b and token j < seq_lens[b], entry = kv_cache[block_table[b, j // page], j % page];
out[workspace_starts[b] + j] = [bf16(fp32(e4m3 value_i) * scale_{i // 128}) for i < 512] ++ [rope bf16 copied].
The product is taken in fp32 and rounded once to bf16 (round to nearest even).

Facts a kernel may rely on: entry layout above (656 bytes, scales 4-byte aligned at byte 512, rope 2-byte aligned at
byte 528); page size 64; workspace_starts is the exclusive prefix sum of seq_lens (output rows are request-major);
sum(seq_lens) = 65536 at full scale; every referenced block id is in range; cached fp8 bytes are finite (no NaN
codes); block_table entries past a request's last page are valid but unused.
"""
import torch

KV_LORA_RANK = 512
ROPE_DIM = 64
TILE = 128
ENTRY_BYTES = KV_LORA_RANK + 4 * (KV_LORA_RANK // TILE) + 2 * ROPE_DIM  # 656
SCALE_OFFSET = KV_LORA_RANK
ROPE_OFFSET = KV_LORA_RANK + 4 * (KV_LORA_RANK // TILE)


def reference(kv_cache, block_table, seq_lens, workspace_starts):
    page = kv_cache.shape[1]
    lens = seq_lens.long()
    total = int(lens.sum())
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens, output_size=total)
    first = torch.cumsum(lens, 0) - lens
    j = torch.arange(total, device=lens.device) - first[req]
    entries = kv_cache[block_table[req, j // page].long(), j % page]  # [total, 656] uint8
    latent = entries[:, :KV_LORA_RANK].view(torch.float8_e4m3fn).to(torch.float32)
    scales = entries[:, SCALE_OFFSET:ROPE_OFFSET].view(torch.float32)  # [total, 4]
    rope = entries[:, ROPE_OFFSET:].view(torch.bfloat16)  # [total, 64]
    latent = (latent.view(total, -1, TILE) * scales.unsqueeze(-1)).view(total, KV_LORA_RANK)
    out = torch.empty(total, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16, device=kv_cache.device)
    rows = workspace_starts.long()[req] + j
    out[rows] = torch.cat([latent.to(torch.bfloat16), rope], dim=-1)
    return out


def _decode_e4m3(b):
    """Bit-level e4m3fn decode of uint8 codes to fp32 (finite codes only)."""
    b = b.to(torch.int32)
    sign = torch.where((b >> 7) == 1, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).to(torch.float32)
    normal = (1.0 + man / 8.0) * torch.exp2((exp - 7).to(torch.float32))
    subnormal = (man / 8.0) * 2.0 ** -6
    return sign * torch.where(exp == 0, subnormal, normal)


def alt_reference(kv_cache, block_table, seq_lens, workspace_starts):
    """Request-by-request, page-by-page form with a bit-level fp8 decode and byte-assembled fp32 scales."""
    page = kv_cache.shape[1]
    total = int(seq_lens.long().sum())
    out = torch.empty(total, KV_LORA_RANK + ROPE_DIM, dtype=torch.bfloat16, device=kv_cache.device)
    for b in range(seq_lens.shape[0]):
        n, row = int(seq_lens[b]), int(workspace_starts[b])
        for p in range((n + page - 1) // page):
            cnt = min(page, n - p * page)
            e = kv_cache[int(block_table[b, p]), :cnt]
            sb = e[:, SCALE_OFFSET:ROPE_OFFSET].to(torch.int64).view(cnt, -1, 4)
            bits = sb[..., 0] | (sb[..., 1] << 8) | (sb[..., 2] << 16) | (sb[..., 3] << 24)
            scales = bits.to(torch.int32).view(torch.float32)  # reinterpret the assembled little-endian word
            latent = _decode_e4m3(e[:, :KV_LORA_RANK]).view(cnt, -1, TILE) * scales.unsqueeze(-1)
            out[row + p * page: row + p * page + cnt, :KV_LORA_RANK] = latent.view(cnt, -1).to(torch.bfloat16)
            out[row + p * page: row + p * page + cnt, KV_LORA_RANK:] = (
                e[:, ROPE_OFFSET:].contiguous().view(torch.bfloat16))
    return out


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        num_reqs, total, page = 8, 65536, 64
    else:
        num_reqs, total, page = 3, 144, 16
    w = torch.rand(num_reqs, device=device) + 0.25
    seq_lens = (w / w.sum() * (total - num_reqs)).floor().long() + 1
    seq_lens[-1] += total - seq_lens.sum()  # FIXED total
    workspace_starts = torch.cumsum(seq_lens, 0) - seq_lens
    max_len = 5 * total // num_reqs + 1  # >= any seq_len (weights lie in [0.25, 1.25])
    max_blocks = (max_len + page - 1) // page
    num_blocks = num_reqs * max_blocks + num_reqs
    block_table = torch.randperm(num_blocks, device=device)[:num_reqs * max_blocks].view(num_reqs, max_blocks)
    # Cache contents as concat_and_cache_ds_mla writes them: per-tile amax/448 scales, e4m3 values, bf16 rope.
    latent = torch.randn(num_blocks, page, KV_LORA_RANK // TILE, TILE, device=device)
    tile_scale = latent.abs().amax(dim=-1) / 448.0
    codes = (latent / tile_scale.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    rope = torch.randn(num_blocks, page, ROPE_DIM, device=device).to(torch.bfloat16)
    kv_cache = torch.cat([codes.view(torch.uint8).view(num_blocks, page, KV_LORA_RANK),
                          tile_scale.view(torch.uint8).view(num_blocks, page, -1),
                          rope.view(torch.uint8).view(num_blocks, page, -1)], dim=-1)
    return [kv_cache, block_table.to(torch.int32), seq_lens.to(torch.int32), workspace_starts.to(torch.int32)]


def roofline(kv_cache, block_table, seq_lens, workspace_starts):
    page = kv_cache.shape[1]
    total = int(seq_lens.long().sum())
    pages = int(((seq_lens.long() + page - 1) // page).sum())
    flops = total * KV_LORA_RANK
    bytes_ = (total * ENTRY_BYTES + pages * block_table.element_size()
              + seq_lens.numel() * 4 + workspace_starts.numel() * 4 + total * (KV_LORA_RANK + ROPE_DIM) * 2)
    return {"flops": int(flops), "bytes": int(bytes_)}
