"""Static: a CUDA graph reached through torch.cuda.__dict__, replaying the slot-mapping work with no launch cost.

The old rules matched the chains `torch.cuda.graph`, `torch.cuda.CUDAGraph` and imports of torch.cuda.graphs, but
not `torch.cuda.__dict__["CUDA" + "Graph"]`. The graph (captured once, on static copies of the inputs) replays the
gold CuTe kernel for positions and slot mappings without the gate seeing it; a direct CuTe launch computes seq_lens
each call, so every call counts one CuTe launch and suppressing it breaks seq_lens. Host overhead goes down, the
gate is bypassed for most of the work. The new rules refuse dunder attributes and anything named like a graph.

Category: static
Expected: rule_violation/static
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
BLOCK_SIZE = 16


@cute.kernel
def _slot_mapping_kernel(mQsl: cute.Tensor, mCtx: cute.Tensor, mBtFull: cute.Tensor, mBtSwa: cute.Tensor,
                         mPos: cute.Tensor, mSlotFull: cute.Tensor, mSlotSwa: cute.Tensor, mSeqLens: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    r, _, _ = cute.arch.block_idx()
    start = mQsl[r]
    end = mQsl[r + 1]
    ctx = mCtx[r]
    if tidx == 0:
        mSeqLens[r] = ctx + (end - start)
    for t in range(start + tidx, end, THREADS):
        pos = ctx + (t - start)  # >= 0
        page = pos // BLOCK_SIZE
        off = pos - page * BLOCK_SIZE
        blk_full = mBtFull[r, page]
        blk_swa = mBtSwa[r, page]
        mPos[t] = cutlass.Int64(pos)
        mSlotFull[t] = cutlass.Int64(blk_full) * BLOCK_SIZE + cutlass.Int64(off)
        mSlotSwa[t] = cutlass.Int64(blk_swa) * BLOCK_SIZE + cutlass.Int64(off)


@cute.jit
def _slot_mapping(mQsl: cute.Tensor, mCtx: cute.Tensor, mBtFull: cute.Tensor, mBtSwa: cute.Tensor,
                  mPos: cute.Tensor, mSlotFull: cute.Tensor, mSlotSwa: cute.Tensor, mSeqLens: cute.Tensor,
                  stream):
    _slot_mapping_kernel(mQsl, mCtx, mBtFull, mBtSwa, mPos, mSlotFull, mSlotSwa, mSeqLens).launch(
        grid=[mCtx.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(reqs, width):
    key = (reqs, width)
    fn = _COMPILED.get(key)
    if fn is None:
        i32, i64 = cutlass.Int32, cutlass.Int64
        tokens = cute.sym_int()
        qsl = make_fake_compact_tensor(i32, (reqs + 1,), assumed_align=4)
        ctx = make_fake_compact_tensor(i32, (reqs,), assumed_align=4)
        bt_full = make_fake_compact_tensor(i32, (reqs, width), stride_order=(1, 0), assumed_align=4)
        bt_swa = make_fake_compact_tensor(i32, (reqs, width), stride_order=(1, 0), assumed_align=4)
        pos = make_fake_compact_tensor(i64, (tokens,), assumed_align=8)
        slot_full = make_fake_compact_tensor(i64, (tokens,), assumed_align=8)
        slot_swa = make_fake_compact_tensor(i64, (tokens,), assumed_align=8)
        seq_lens = make_fake_compact_tensor(i32, (reqs,), assumed_align=4)
        fn = cute.compile(_slot_mapping, qsl, ctx, bt_full, bt_swa, pos, slot_full, slot_swa, seq_lens,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn

_G = {}


def _graph_for(qsl, ctx, bt_full, bt_swa, total):
    key = (tuple(bt_full.shape), total)
    if _G.get("key") != key:
        static = [qsl.clone(), ctx.clone(), bt_full.clone(), bt_swa.clone()]
        outs = [torch.empty(total, dtype=torch.int64, device=qsl.device) for _ in range(3)]
        lens = torch.empty(ctx.shape[0], dtype=torch.int32, device=qsl.device)
        fn = _compiled_for(ctx.shape[0], bt_full.shape[1])
        fn(*static, *outs, lens)  # warm up outside the capture
        graph = torch.cuda.__dict__["CUDA" + "Graph"]()
        with torch.cuda.__dict__["gr" + "aph"](graph):
            fn(*static, *outs, lens)
        _G.update(key=key, graph=graph, static=static, outs=outs)
    return _G


def solve(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    reqs = num_computed_tokens.shape[0]
    width = block_table_full.shape[1]
    total = int(query_start_loc[-1])
    dev = query_start_loc.device
    seq_lens = torch.empty(reqs, dtype=torch.int32, device=dev)
    scratch = [torch.empty(total, dtype=torch.int64, device=dev) for _ in range(3)]
    if dev.type != "cuda":
        _compiled_for(reqs, width)(query_start_loc, num_computed_tokens, block_table_full, block_table_swa,
                                   *scratch, seq_lens)
        return scratch[0], scratch[1], scratch[2], seq_lens
    g = _graph_for(query_start_loc, num_computed_tokens, block_table_full, block_table_swa, total)
    for dst, src in zip(g["static"], (query_start_loc, num_computed_tokens, block_table_full, block_table_swa)):
        dst.copy_(src)
    g["graph"].replay()  # not a gated launch: the DSL hooks never see it
    # seq_lens through a direct (counted) launch; its other outputs go to scratch
    _compiled_for(reqs, width)(query_start_loc, num_computed_tokens, block_table_full, block_table_swa,
                               scratch[0], scratch[1], scratch[2], seq_lens)
    return g["outs"][0].clone(), g["outs"][1].clone(), g["outs"][2].clone(), seq_lens
