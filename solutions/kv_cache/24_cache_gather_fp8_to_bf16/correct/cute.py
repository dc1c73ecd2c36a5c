"""Problem 24, context-parallel shard gather of an fp8 paged K/V cache (per-(token, head) scales) into contiguous bf16
K and V plus global positions (rank 1 of CP_WORLD 4, interleave 16), in CuTe DSL.

One kernel. Grid (max_pages, R) with max_pages = block_table.shape[1]; CTA (p, b) of 256 threads handles local page
p of request b. Each CTA derives its request's local length n = (L // 64) * 16 + clamp(L % 64 - 16, 0, 16) from
the global length L = seq_lens[b], and its first output row as the sum of the previous requests' local lengths
(R is a compile-time constant); CTAs with p * 16 >= n exit at once. Warps 0-3 move K, warps 4-7 move V; inside a
half, thread r takes token parity r // 64 and 16-byte chunk r % 64 of the token's 1024 fp8 codes (head
(r % 64) // 8): for the local tokens j = 2i + parity < cnt of the page it loads the 16 codes (one 128-bit load of
cache row block_table[b, p] * 16 + j, cache viewed as [num_blocks * 16, 1024]) and the (token, head) fp32 scale,
multiplies in fp32, rounds once to bf16, and stores 32 bytes (two 128-bit stores) to output row row0 + j. Threads
0..cnt-1 write positions[row0 + j] = p * 64 + 16 + j (int64). Every output element has one writer. Extents of the
cache and table are compile-time; the output row count (read on the host to allocate, as the reference does) is
symbolic; compiled once per shape (TVM-FFI, torch's stream).
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

NUM_KV_HEADS = 8
HEAD_DIM = 128
WIDTH = NUM_KV_HEADS * HEAD_DIM  # 1024 values per token
CP_WORLD = 4
CP_RANK = 1
CP_INTERLEAVE = 16
RUN = CP_WORLD * CP_INTERLEAVE  # 64
PAGE = 16
VEC = 16  # fp8 codes per 128-bit load
CHUNKS = WIDTH // VEC  # 64 threads per token
THREADS = 256
TOKENS_PER_PASS = (THREADS // 2) // CHUNKS  # 2


@cute.jit
def _local_len(L):
    rem = L % RUN - CP_RANK * CP_INTERLEAVE
    if rem < 0:
        rem = 0
    if rem > CP_INTERLEAVE:
        rem = CP_INTERLEAVE
    return (L // RUN) * CP_INTERLEAVE + rem


@cute.jit
def _dequant_token(mC: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor, e, row, chunk):
    gC = cute.local_tile(mC, (1, VEC), (e, chunk))[0, None]
    rC = cute.make_fragment_like(gC)
    cute.autovec_copy(gC, rC)
    scale = mS[e, chunk // (HEAD_DIM // VEC)]
    gO = cute.local_tile(mO, (1, VEC), (row, chunk))[0, None]
    rO = cute.make_fragment_like(gO)
    rO.store((rC.load().to(cutlass.Float32) * scale).to(mO.element_type))
    cute.autovec_copy(rO, gO)


@cute.kernel
def _cp_gather_kernel(mKC: cute.Tensor, mVC: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor, mBT: cute.Tensor,
                      mLens: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mPos: cute.Tensor,
                      reqs: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    p, b, _ = cute.arch.block_idx()
    n = _local_len(mLens[b])
    first = p * PAGE
    if first < n:  # uniform per CTA
        start = cutlass.Int32(0)
        for q in cutlass.range_constexpr(reqs):
            if q < b:
                start = start + _local_len(mLens[q])
        cnt = n - first
        if cnt > PAGE:
            cnt = PAGE
        blk = mBT[b, p]
        row0 = start + first
        if tidx < cnt:
            mPos[row0 + tidx] = cutlass.Int64(p * RUN + CP_RANK * CP_INTERLEAVE + tidx)
        half = tidx // (THREADS // 2)  # 0: K (warps 0-3), 1: V (warps 4-7)
        r = tidx % (THREADS // 2)
        parity = r // CHUNKS
        chunk = r % CHUNKS
        for i in cutlass.range_constexpr(PAGE // TOKENS_PER_PASS):
            j = i * TOKENS_PER_PASS + parity
            if j < cnt:
                if half == 0:
                    _dequant_token(mKC, mKS, mK, blk * PAGE + j, row0 + j, chunk)
                else:
                    _dequant_token(mVC, mVS, mV, blk * PAGE + j, row0 + j, chunk)


@cute.jit
def _cp_gather(mKC: cute.Tensor, mVC: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor, mBT: cute.Tensor,
               mLens: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mPos: cute.Tensor, reqs: cutlass.Constexpr,
               stream):
    _cp_gather_kernel(mKC, mVC, mKS, mVS, mBT, mLens, mK, mV, mPos, reqs).launch(
        grid=[mBT.shape[1], mBT.shape[0], 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(rows, reqs, width):
    key = (rows, reqs, width)
    fn = _COMPILED.get(key)
    if fn is None:
        total = cute.sym_int()

        def cache():
            return make_fake_compact_tensor(cutlass.Float8E4M3FN, (rows, WIDTH), stride_order=(1, 0),
                                            assumed_align=16)

        def scales():
            return make_fake_compact_tensor(cutlass.Float32, (rows, NUM_KV_HEADS), stride_order=(1, 0),
                                            assumed_align=16)

        def out():
            return make_fake_compact_tensor(cutlass.BFloat16, (total, WIDTH), stride_order=(1, 0), assumed_align=16)

        bt = make_fake_compact_tensor(cutlass.Int32, (reqs, width), stride_order=(1, 0), assumed_align=4)
        lens = make_fake_compact_tensor(cutlass.Int32, (reqs,), assumed_align=4)
        pos = make_fake_compact_tensor(cutlass.Int64, (total,), assumed_align=8)
        fn = cute.compile(_cp_gather, cache(), cache(), scales(), scales(), bt, lens, out(), out(), pos, reqs,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(k_cache, v_cache, k_scale_cache, v_scale_cache, block_table, seq_lens):
    """Return (k [N, 8, 128] bf16, v [N, 8, 128] bf16, positions [N] int64) of this rank's local shard."""
    num_blocks, page = k_cache.shape[:2]
    if page != PAGE:
        raise ValueError(f"page size must be {PAGE}")
    for c in (k_cache, v_cache, k_scale_cache, v_scale_cache):
        if not c.is_contiguous():
            raise ValueError("expects contiguous caches")
    # output size: the global lengths are read on the host (one small copy; the reference also syncs here)
    total = sum((L // RUN) * CP_INTERLEAVE + min(max(L % RUN - CP_RANK * CP_INTERLEAVE, 0), CP_INTERLEAVE)
                for L in seq_lens.tolist())
    dev = k_cache.device
    k = torch.empty((total, NUM_KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, device=dev)
    v = torch.empty((total, NUM_KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, device=dev)
    positions = torch.empty((total,), dtype=torch.int64, device=dev)
    if total == 0:
        return k, v, positions
    rows = num_blocks * page
    reqs, width = block_table.shape
    _compiled_for(rows, reqs, width)(
        k_cache.view(rows, WIDTH), v_cache.view(rows, WIDTH), k_scale_cache.view(rows, NUM_KV_HEADS),
        v_scale_cache.view(rows, NUM_KV_HEADS), block_table.contiguous(), seq_lens.contiguous(),
        k.view(total, WIDTH), v.view(total, WIDTH), positions)
    return k, v, positions
