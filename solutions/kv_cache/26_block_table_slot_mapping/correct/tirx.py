"""Problem 26 (per-token positions, two block-table slot mappings and seq_lens of one scheduler step), TIRx.

One kernel, one CTA per request r (grid R, 256 threads). The CTA reads start = query_start_loc[r],
end = query_start_loc[r + 1] and ctx = num_computed_tokens[r]; thread 0 writes seq_lens[r] = ctx + end - start; the
threads stride over the request's tokens t in [start, end) (256 apart, so stores are coalesced):
  pos = ctx + t - start, page = pos // 16, off = pos % 16 (pos >= 0),
  positions[t] = pos, slot_full[t] = block_table_full[r, page] * 16 + off in int64, slot_swa likewise.
Requests own disjoint, contiguous token ranges, so every output element is written exactly once. The time goes to
the per-token block-table gathers and the three int64 stores; a decode request is one token, a prefill chunk takes
up to ~5 passes of the CTA.

The token count T = query_start_loc[-1] sizes the outputs, so solve reads that one scalar on the host (as the
reference does). One executable per (R, table width) with T symbolic, compiled once per process.
"""

import torch
import tvm
from tvm.script import tirx as Tx

TPB = 256  # threads per CTA
BLOCK_SIZE = 16


def _make_kernel(reqs, width):
    @Tx.prim_func
    def slot_mapping(qsl_ptr: Tx.handle, ctx_ptr: Tx.handle, btf_ptr: Tx.handle, bts_ptr: Tx.handle,
                     pos_ptr: Tx.handle, sf_ptr: Tx.handle, ss_ptr: Tx.handle, sl_ptr: Tx.handle):
        T = Tx.int32()
        QSL = Tx.match_buffer(qsl_ptr, (reqs + 1,), "int32")
        CTX = Tx.match_buffer(ctx_ptr, (reqs,), "int32")
        BTF = Tx.match_buffer(btf_ptr, (reqs, width), "int32")
        BTS = Tx.match_buffer(bts_ptr, (reqs, width), "int32")
        POS = Tx.match_buffer(pos_ptr, (T,), "int64")
        SF = Tx.match_buffer(sf_ptr, (T,), "int64")
        SS = Tx.match_buffer(ss_ptr, (T,), "int64")
        SL = Tx.match_buffer(sl_ptr, (reqs,), "int32")
        Tx.device_entry()
        r = Tx.cta_id([reqs])
        tx = Tx.thread_id([TPB])
        start: Tx.let = QSL[r]
        end: Tx.let = QSL[r + 1]
        ctx: Tx.let = CTX[r]
        if tx == 0:
            SL[r] = ctx + (end - start)
        for it in range((end - start + (TPB - 1)) // TPB):
            t: Tx.let = start + it * TPB + tx
            if t < end:
                pos: Tx.let = ctx + (t - start)
                page: Tx.let = pos // BLOCK_SIZE
                off: Tx.let = pos - page * BLOCK_SIZE
                POS[t] = Tx.cast(pos, "int64")
                SF[t] = Tx.cast(BTF[r, page], "int64") * Tx.int64(BLOCK_SIZE) + Tx.cast(off, "int64")
                SS[t] = Tx.cast(BTS[r, page], "int64") * Tx.int64(BLOCK_SIZE) + Tx.cast(off, "int64")

    return slot_mapping


_EXES = {}


def _executable(reqs, width):
    key = (reqs, width)
    exe = _EXES.get(key)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(reqs, width), target=target, tir_pipeline="tirx")
        _EXES[key] = exe
    return exe


def solve(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    """Return (positions, slot_mapping_full, slot_mapping_swa, seq_lens) from one TIRx kernel launch."""
    reqs = num_computed_tokens.shape[0]
    width = block_table_full.shape[1]
    total = int(query_start_loc[-1])  # output size (one scalar read, as in the reference)
    dev = query_start_loc.device
    positions = torch.empty(total, dtype=torch.int64, device=dev)
    slot_full = torch.empty(total, dtype=torch.int64, device=dev)
    slot_swa = torch.empty(total, dtype=torch.int64, device=dev)
    seq_lens = torch.empty(reqs, dtype=torch.int32, device=dev)
    _executable(reqs, width)(query_start_loc.contiguous(), num_computed_tokens.contiguous(),
                             block_table_full.contiguous(), block_table_swa.contiguous(),
                             positions, slot_full, slot_swa, seq_lens)
    return positions, slot_full, slot_swa, seq_lens
