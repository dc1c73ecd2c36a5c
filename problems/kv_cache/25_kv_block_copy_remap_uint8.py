"""Copy whole KV-cache blocks of every layer from source to destination block ids given as (src, dst) pairs, as raw bytes.

Provenance: vLLM's `copy_blocks(key_caches, value_caches, block_mapping)` (block_mapping [num_pairs, 2] int64 of
(src, dst)), used for copy-on-write of a shared prefix block when a sequence group forks (parallel sampling / beam
search) and for prefix-cache block reuse; the copy is byte-exact, so an fp8 cache is moved as uint8. Here all layers'
K and V caches are one tensor [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] of raw bytes (vLLM
keeps a list of per-layer tensors with the same per-block contents). Cache geometry of Llama-3.1-8B with an fp8 cache
(config.json: num_hidden_layers 32, num_key_value_heads 8, head_dim 128), page size 16 -> 16 KiB per block per
layer per K/V.
Workload: one scheduler step that forks 256 blocks: 128 distinct source blocks (a source may be copied to several
destinations, as when one prompt is forked into several samples), 256 distinct destination blocks.
Full scale: kv_caches [32, 2, 2048, 16, 8, 128] uint8 (2.1 GB), block_mapping [256, 2] int64.
Small scale: [2, 2, 24, 16, 8, 128] uint8, 6 pairs.

Semantics: for every pair (s, d): kv_caches[:, :, d] = kv_caches[:, :, s] (all layers, K and V); every other block
is unchanged. Output: the mutated kv_caches (compared exactly).

Facts a kernel may rely on: destination ids are distinct and never appear as a source (so the pairs may be copied
in any order or in parallel); ids are in [0, num_blocks); each block is 16384 contiguous bytes per (layer, K/V).
"""
import torch


def reference(kv_caches, block_mapping):
    src = block_mapping[:, 0]
    dst = block_mapping[:, 1]
    kv_caches[:, :, dst] = kv_caches[:, :, src]
    return None


def alt_reference(kv_caches, block_mapping):
    """Pair-by-pair copies."""
    for s, d in block_mapping.tolist():
        kv_caches[:, :, d].copy_(kv_caches[:, :, s])
    return None


def make_inputs(device="cuda", scale="full"):
    if scale == "full":
        layers, num_blocks, num_pairs = 32, 2048, 256
    else:
        layers, num_blocks, num_pairs = 2, 24, 6
    kv_caches = torch.randint(0, 256, (layers, 2, num_blocks, 16, 8, 128), dtype=torch.uint8, device=device)
    perm = torch.randperm(num_blocks, device=device)
    dst = perm[:num_pairs]
    sources = perm[num_pairs:num_pairs + num_pairs // 2]
    src = sources[torch.randint(0, sources.shape[0], (num_pairs,), device=device)]
    block_mapping = torch.stack([src, dst], dim=1)
    return [kv_caches, block_mapping]


MUTATES = ("kv_caches",)


def roofline(kv_caches, block_mapping):
    block_bytes = kv_caches[0, 0, 0].numel() * kv_caches.element_size()
    moved = block_mapping.shape[0] * kv_caches.shape[0] * kv_caches.shape[1] * block_bytes
    return {"flops": 0, "bytes": int(2 * moved + block_mapping.numel() * block_mapping.element_size())}
