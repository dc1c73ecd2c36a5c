"""Token route through a MUTATES input: eager writes the copied blocks XOR-masked, TIRx only unmasks them in place.

Eager PyTorch does the whole copy, `kv[:, :, dst] = kv[:, :, src] ^ 0x5A`, and a TIRx kernel XORs the destination
blocks with 0x5A again. Suppress it and the destinations are masked (wrong); randomise its arguments and the cache
is shuffled (wrong); the audit skips MUTATES inputs (a cache handed to the kernel that updates it is the normal
case) and XOR is neither affine nor a permutation anyway. Only the share rule sees it: eager's gather, XOR and
scatter move about three times the bytes of the TIRx pass.

Category: token_route
Expected: rule_violation/dsl_share
"""

import torch
import tvm
from tvm.script import tirx as Tx

TPB = 256
VEC = 4
MASK = 0x5A


def _make_kernel(rows, num_blocks, words, pairs):
    nv = words // (TPB * VEC)

    @Tx.prim_func
    def unmask_dst(kv_ptr: Tx.handle, map_ptr: Tx.handle):
        KV = Tx.match_buffer(kv_ptr, (rows, num_blocks, words), "int32", align=16)
        MAP = Tx.match_buffer(map_ptr, (pairs, 2), "int64")
        Tx.device_entry()
        pair, lk = Tx.cta_id([pairs, rows])
        tx = Tx.thread_id([TPB])
        dst: Tx.let = Tx.cast(MAP[pair, 1], "int32")
        for c in Tx.unroll(nv):
            for v in Tx.vectorized(VEC):
                KV[lk, dst, c * (TPB * VEC) + tx * VEC + v] = Tx.bitwise_xor(
                    KV[lk, dst, c * (TPB * VEC) + tx * VEC + v], Tx.int32(0x5A5A5A5A))

    return unmask_dst


_EXES = {}


def _executable(rows, num_blocks, words, pairs):
    key = (rows, num_blocks, words, pairs)
    if key not in _EXES:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        _EXES[key] = tvm.compile(_make_kernel(*key), target=target, tir_pipeline="tirx")
    return _EXES[key]


def solve(kv_caches, block_mapping):
    layers, kv, num_blocks = kv_caches.shape[:3]
    block_bytes = kv_caches[0, 0, 0].numel() * kv_caches.element_size()
    pairs = block_mapping.shape[0]
    if pairs == 0:
        return None
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    kv_caches[:, :, dst] = kv_caches[:, :, src] ^ MASK  # eager: the whole copy, masked
    kv_words = kv_caches.view(torch.uint8).view(layers * kv, num_blocks, block_bytes).view(torch.int32)
    _executable(layers * kv, num_blocks, block_bytes // 4, pairs)(kv_words, block_mapping.contiguous())
    return None
