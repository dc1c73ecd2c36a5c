"""Token route for integer outputs: the eager answer + 7 is handed to TIRx, which subtracts 7 into the outputs.

metakernel/grader/tokens.py tests a launch argument against an output exactly (same dtype), affinely (only when
both are floating point) or as a permutation (same dtype, equal sorted values). All four outputs of problem 26
are integers, and `answer + 7` is none of those: the affine test is skipped for integers and the sorted values
differ by 7. Suppressing the kernel leaves poison; shuffling its (integer) argument scrambles the outputs; so the
ablations pass too. (The share rule happens to refuse it, eager being most of the GPU time; with a burn kernel
nothing would.) This is the answer laundered through the DSL.

Category: token_route
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx

BLOCK_SIZE = 16
SHIFT = 7


@Tx.prim_func
def unshift(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "int64")
    B = Tx.match_buffer(b_ptr, (n,), "int64")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(n, 256)])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    if i < n:
        B[i] = A[i] - Tx.int64(SHIFT)


_EXE = []


def _exe():
    if not _EXE:
        _EXE.append(tvm.compile(unshift, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
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
    seq_lens = num_computed_tokens.long() + num_sched
    return positions, slot_full, slot_swa, seq_lens


def _through(value):
    out = torch.empty_like(value)
    _exe()(value + SHIFT, out)
    return out


def solve(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    positions, slot_full, slot_swa, seq_lens = _eager(query_start_loc, num_computed_tokens, block_table_full,
                                                      block_table_swa)
    return _through(positions), _through(slot_full), _through(slot_swa), _through(seq_lens).to(torch.int32)
