"""Problem 25, KV-cache block copy (copy-on-write fork), in CuTe DSL: one CTA per (pair, layer x K/V) block.

The cache [L, 2, NB, 16, 8, 128] uint8 is viewed (no copy) as 32-bit words [L*2, NB, 4096]: one block of one
(layer, K/V) is 16384 contiguous bytes = 4096 words, and every word index stays far below 2^31 even for the 2.1 GB
full-scale cache. Grid (num_pairs, L*2); CTA (p, lk) reads block_mapping[p] = (src, dst) and moves row (lk, src) to
row (lk, dst) with 128-bit loads/stores: 256 threads x 4 vectors of 16 bytes, all four loads issued before the
stores. Destinations are distinct and never sources, so the CTAs do not race. The time is pure HBM traffic
(256 pairs x 64 rows x 16 KiB read + written = 1 GiB moved at full scale).

Compiled once per shape from fake tensors with the TVM-FFI option; the launch goes to torch's current stream.
The cache is mutated in place; like the reference, solve returns None.
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
WORD_VEC = 4  # 32-bit words per 128-bit access


@cute.kernel
def _block_copy_kernel(mKV: cute.Tensor, mMap: cute.Tensor, copy: cute.TiledCopy):
    tidx, _, _ = cute.arch.thread_idx()
    pair, lk, _ = cute.arch.block_idx()
    words = mKV.shape[2]  # words per block (compile-time)
    src = cutlass.Int32(mMap[pair, 0])
    dst = cutlass.Int32(mMap[pair, 1])

    gS = cute.local_tile(mKV, tiler=(1, 1, words), coord=(lk, src, 0))[0, 0, None]
    gD = cute.local_tile(mKV, tiler=(1, 1, words), coord=(lk, dst, 0))[0, 0, None]
    part = copy.get_slice(tidx)
    tS = part.partition_S(gS)
    tD = part.partition_D(gD)
    rV = cute.make_fragment_like(tS)
    cute.copy(copy, tS, rV)  # every load first
    cute.copy(copy, rV, tD)  # then every store


@cute.jit
def _block_copy(mKV: cute.Tensor, mMap: cute.Tensor, stream):
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mKV.element_type, num_bits_per_copy=128)
    copy = cute.make_tiled_copy_tv(atom, cute.make_layout(THREADS), cute.make_layout(WORD_VEC))
    _block_copy_kernel(mKV, mMap, copy).launch(
        grid=[mMap.shape[0], mKV.shape[0], 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(rows, num_blocks, words, pairs):
    key = (rows, num_blocks, words, pairs)
    fn = _COMPILED.get(key)
    if fn is None:
        kv = make_fake_compact_tensor(cutlass.Int32, (rows, num_blocks, words), stride_order=(2, 1, 0),
                                      assumed_align=16)
        mapping = make_fake_compact_tensor(cutlass.Int64, (pairs, 2), stride_order=(1, 0), assumed_align=8)
        fn = cute.compile(_block_copy, kv, mapping, make_fake_stream(use_tvm_ffi_env_stream=True),
                          options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


def solve(kv_caches, block_mapping):
    """kv_caches[:, :, dst] = kv_caches[:, :, src] for every (src, dst) row of block_mapping, in place."""
    layers, kv, num_blocks = kv_caches.shape[:3]
    block_bytes = kv_caches[0, 0, 0].numel() * kv_caches.element_size()
    if not kv_caches.is_contiguous() or block_bytes % (THREADS * 16) != 0:
        raise ValueError("expects a contiguous cache whose blocks are a multiple of 4096 bytes")
    pairs = block_mapping.shape[0]
    if pairs == 0:
        return None
    words = block_bytes // 4
    # a view of the same storage: writes through it mutate kv_caches
    kv_words = kv_caches.view(torch.uint8).view(layers * kv, num_blocks, block_bytes).view(torch.int32)
    _compiled_for(layers * kv, num_blocks, words, pairs)(kv_words, block_mapping.contiguous())
    return None
