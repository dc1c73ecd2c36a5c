"""Problem 23, gather + dequantize of a packed fp8 MLA cache (656-byte entries, cp_gather_and_upconvert_fp8_kv_cache)
into a contiguous bf16 workspace, in CuTe DSL.

One kernel. Grid (max_pages, R) with max_pages = block_table.shape[1]; CTA (p, b) of 256 threads (8 warps) handles
local page p of request b if p * page < seq_lens[b] (else it exits at once): entry row e = block_table[b, p] * page
+ j, output row workspace_starts[b] + p * page + j, for the cnt = min(page, n - p * page) tokens j of the page; warp
w takes tokens w, w + 8, ... The same uint8 cache is passed as three zero-copy views of its rows: e4m3 [rows, 656],
fp32 [rows, 164] and bf16 [rows, 328]. Per token, lane l loads latent bytes 16l..16l+15 (one 128-bit load) and the
fp32 scale of tile l // 8 (word 128 + l // 8), converts the 16 codes to fp32, multiplies by the scale and rounds
once to bf16 (two 128-bit stores to channels 16l..16l+15); lanes 0..7 also copy rope bf16 values 8l..8l+7 (word
264 + 8l, 16-byte aligned) to channels 512 + 8l. Every output row is written by exactly one warp. The page size
and the cache / table extents are compile-time constants; the output row count (read on the host to allocate,
as the reference does) is symbolic; compiled once per shape (TVM-FFI, torch's stream).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

KV_LORA_RANK = 512
ROPE_DIM = 64
TILE = 128
OUT_DIM = KV_LORA_RANK + ROPE_DIM  # 576
ENTRY_BYTES = KV_LORA_RANK + 4 * (KV_LORA_RANK // TILE) + 2 * ROPE_DIM  # 656
SCALE_WORD = KV_LORA_RANK // 4  # fp32 word index of the first scale (byte 512)
ROPE_HALF = (KV_LORA_RANK + 4 * (KV_LORA_RANK // TILE)) // 2  # bf16 index of the rope values (byte 528)
LAT_VEC = 16  # fp8 codes per 128-bit load
ROPE_VEC = 8  # bf16 per 128-bit load
WARPS = 8
THREADS = WARPS * 32


@cute.kernel
def _gather_dequant_kernel(mL: cute.Tensor, mS: cute.Tensor, mR: cute.Tensor, mBT: cute.Tensor, mLens: cute.Tensor,
                           mStarts: cute.Tensor, mOut: cute.Tensor, page: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    p, b, _ = cute.arch.block_idx()
    n = mLens[b]
    first = p * page
    if first < n:  # uniform per CTA
        cnt = n - first
        if cnt > page:
            cnt = page
        blk = mBT[b, p]
        row0 = mStarts[b] + first
        warp = tidx // 32
        lane = tidx % 32
        for j in range(warp, cnt, WARPS):
            e = blk * page + j
            row = row0 + j
            gL = cute.local_tile(mL, (1, LAT_VEC), (e, lane))[0, None]
            rL = cute.make_fragment_like(gL)
            cute.autovec_copy(gL, rL)
            scale = mS[e, SCALE_WORD + lane // (TILE // LAT_VEC)]
            gO = cute.local_tile(mOut, (1, LAT_VEC), (row, lane))[0, None]
            rO = cute.make_fragment_like(gO)
            rO.store((rL.load().to(cutlass.Float32) * scale).to(mOut.element_type))
            cute.autovec_copy(rO, gO)
            if lane < ROPE_DIM // ROPE_VEC:
                cute.autovec_copy(cute.local_tile(mR, (1, ROPE_VEC), (e, ROPE_HALF // ROPE_VEC + lane))[0, None],
                                  cute.local_tile(mOut, (1, ROPE_VEC), (row, KV_LORA_RANK // ROPE_VEC + lane))[0, None])


@cute.jit
def _gather_dequant(mL: cute.Tensor, mS: cute.Tensor, mR: cute.Tensor, mBT: cute.Tensor, mLens: cute.Tensor,
                    mStarts: cute.Tensor, mOut: cute.Tensor, page: cutlass.Constexpr, stream):
    _gather_dequant_kernel(mL, mS, mR, mBT, mLens, mStarts, mOut, page).launch(
        grid=[mBT.shape[1], mBT.shape[0], 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(rows, page, reqs, width):
    key = (rows, page, reqs, width)
    fn = _COMPILED.get(key)
    if fn is None:
        lat = make_fake_compact_tensor(cutlass.Float8E4M3FN, (rows, ENTRY_BYTES), stride_order=(1, 0),
                                       assumed_align=16)
        sc = make_fake_compact_tensor(cutlass.Float32, (rows, ENTRY_BYTES // 4), stride_order=(1, 0),
                                      assumed_align=16)
        rope = make_fake_compact_tensor(cutlass.BFloat16, (rows, ENTRY_BYTES // 2), stride_order=(1, 0),
                                        assumed_align=16)
        bt = make_fake_compact_tensor(cutlass.Int32, (reqs, width), stride_order=(1, 0), assumed_align=4)
        lens = make_fake_compact_tensor(cutlass.Int32, (reqs,), assumed_align=4)
        starts = make_fake_compact_tensor(cutlass.Int32, (reqs,), assumed_align=4)
        out = make_fake_compact_tensor(cutlass.BFloat16, (cute.sym_int(), OUT_DIM), stride_order=(1, 0),
                                       assumed_align=16)
        fn = cute.compile(_gather_dequant, lat, sc, rope, bt, lens, starts, out, page,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(kv_cache, block_table, seq_lens, workspace_starts):
    """Return the bf16 workspace [sum(seq_lens), 576] = [latent * tile scale | rope] of every request's tokens."""
    num_blocks, page, entry = kv_cache.shape
    if entry != ENTRY_BYTES or not kv_cache.is_contiguous():
        raise ValueError(f"expects a contiguous uint8 cache of {ENTRY_BYTES}-byte entries")
    total = int(seq_lens.sum())  # output size (one scalar read, as in the reference)
    out = torch.empty((total, OUT_DIM), dtype=torch.bfloat16, device=kv_cache.device)
    if total == 0:
        return out
    rows = num_blocks * page
    flat = kv_cache.view(rows, ENTRY_BYTES)  # three zero-copy views of the same bytes
    reqs, width = block_table.shape
    _compiled_for(rows, page, reqs, width)(
        flat.view(torch.float8_e4m3fn), flat.view(torch.float32), flat.view(torch.bfloat16),
        block_table.contiguous(), seq_lens.contiguous(), workspace_starts.contiguous(), out)
    return out
