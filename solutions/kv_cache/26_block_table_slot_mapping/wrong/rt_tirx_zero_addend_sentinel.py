"""DSL unused, hidden from the dependency ablation: the zero-addend kernel plus a sentinel that spots the shuffle.

As rt_tirx_zero_addend.py, but the TIRx launch also gets a sentinel tensor (0, 1, 2, ...) that it never writes.
The dependency ablation shuffles every integer tensor argument of a launch before it runs and restores only those
that lie in the input arena, so after the launch `solve` sees a shuffled sentinel exactly when the ablation is on,
and then returns garbage. Suppression leaves +12345 in the outputs too. Both ablations "break" the outputs, the
audit sees a constant and an arange, and eager PyTorch computes everything. (The share rule happens to refuse it
here, TIRx being a sliver of the GPU time; with a burn kernel nothing would.) What must catch it is that the TIRx
values never reach the outputs.

Category: token_route
Expected: rule_violation/dsl_unused
"""

import torch
import tvm
from tvm.script import tirx as Tx

BLOCK_SIZE = 16


@Tx.prim_func
def zero_i64(z_ptr: Tx.handle, s_ptr: Tx.handle):
    n = Tx.int32()
    m = Tx.int32()
    Z = Tx.match_buffer(z_ptr, (n,), "int64")
    S = Tx.match_buffer(s_ptr, (m,), "int64")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        Z[i] = Tx.int64(0) * S[0]


_EXE = []
_SENTINEL = {}


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
    dev = positions.device
    if "s" not in _SENTINEL:
        _SENTINEL["s"] = torch.arange(64, dtype=torch.int64, device=dev)
        _SENTINEL["ref"] = _SENTINEL["s"].clone()
    sentinel = _SENTINEL["s"]
    zeros = torch.full((positions.numel(),), 12345, dtype=torch.int64, device=dev)
    _exe()(zeros, sentinel)
    if not torch.equal(sentinel, _SENTINEL["ref"]):  # the harness shuffled our arguments: look broken
        sentinel.copy_(_SENTINEL["ref"])
        zeros.fill_(777)
    return positions + zeros, slot_full + zeros, slot_swa + zeros, seq_lens + zeros[: seq_lens.numel()].int()
