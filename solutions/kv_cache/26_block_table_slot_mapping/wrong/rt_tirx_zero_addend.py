"""DSL unused: eager PyTorch computes all four outputs; TIRx only zeroes a buffer that is then added to them.

The buffer starts filled with 12345 (eager), so suppressing the TIRx launch leaves +12345 in every output and the
old ablation saw wrong outputs; the old audit saw a constant buffer, not an answer. The new dependency ablation
overwrites (shuffles, for integers) the TIRx launch's tensor arguments before it runs: the kernel zeroes the
buffer anyway, the outputs stay right, so the TIRx values are not what the answer depends on.

Category: token_route
Expected: rule_violation/dsl_unused
"""

import torch
import tvm
from tvm.script import tirx as Tx

BLOCK_SIZE = 16


@Tx.prim_func
def zero_i64(z_ptr: Tx.handle):
    n = Tx.int32()
    Z = Tx.match_buffer(z_ptr, (n,), "int64")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        Z[i] = Tx.int64(0)


_EXE = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(zero_i64, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx"))
    return _EXE[0]


def _eager(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    qsl = query_start_loc.long()
    num_sched = qsl[1:] - qsl[:-1]
    total = int(qsl[-1])
    req = torch.repeat_interleave(torch.arange(num_sched.shape[0], device=qsl.device), num_sched, output_size=total)
    positions = num_computed_tokens.long()[req] + torch.arange(total, device=qsl.device) - qsl[:-1][req]
    page, off = positions // BLOCK_SIZE, positions % BLOCK_SIZE
    slot_full = block_table_full[req, page].long() * BLOCK_SIZE + off
    slot_swa = block_table_swa[req, page].long() * BLOCK_SIZE + off
    seq_lens = (num_computed_tokens.long() + num_sched).to(torch.int32)
    return positions, slot_full, slot_swa, seq_lens


def solve(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    positions, slot_full, slot_swa, seq_lens = _eager(query_start_loc, num_computed_tokens, block_table_full,
                                                      block_table_swa)
    zeros = torch.full((positions.numel(),), 12345, dtype=torch.int64, device=positions.device)
    _exe()(zeros)
    return positions + zeros, slot_full + zeros, slot_swa + zeros, seq_lens + zeros[: seq_lens.numel()].int()
