"""Told apart by counting calls: honest for the first 60 calls of the process, then the copy is skipped.

A module-level counter is the whole trick: no forbidden name, nothing the harness can see. The old grader made 5
correctness calls, one ablation, one audit and 3 warm-up calls, then compared 3 random draws among the first 50
timed ones; calls 61 onwards (the rest of the timing phase and every profiled call) were never checked. From call
61 `solve` copies one pair of one layer (a CuTe launch, so the call still counts) and leaves the cache as it was:
forged end-to-end and GPU-only times. A grader that compares a secret share of every phase catches it.

Category: told_apart
Expected: wrong/mismatch
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

_CALLS = [0]


def solve(kv_caches, block_mapping):
    """kv_caches[:, :, dst] = kv_caches[:, :, src] - for the first 60 calls."""
    _CALLS[0] += 1
    layers, kv, num_blocks = kv_caches.shape[:3]
    block_bytes = kv_caches[0, 0, 0].numel() * kv_caches.element_size()
    pairs = block_mapping.shape[0]
    if pairs == 0:
        return None
    words = block_bytes // 4
    kv_words = kv_caches.view(torch.uint8).view(layers * kv, num_blocks, block_bytes).view(torch.int32)
    mapping = block_mapping.contiguous()
    if _CALLS[0] <= 60 or not kv_caches.is_cuda:
        _compiled_for(layers * kv, num_blocks, words, pairs)(kv_words, mapping)
    else:
        _compiled_for(1, num_blocks, words, 1)(kv_words[:1], mapping[:1])
    return None
