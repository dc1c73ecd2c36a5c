"""Timer tamper on a host-bound problem: the harness's clock runs at half speed, and no plausibility check notices.

The gold CuTe kernel plus the clock patch of rt_tirx_eval_halve_clock.py (the child module's `_perf`, and the old
child's bound CUDA-event timer, multiplied by 0.5, from code evaluated through functools.singledispatch). Problem
26's call is mostly host time (one scalar read, allocations, the launch) and its GPU time is a few microseconds,
so half the end-to-end time is still far above the GPU-only time and the roofline bound, and the reported times
still add up to less than the parent's wall clock: the forged 2x speedup survives every implausible-time rule.
A child-side clock that the candidate can reach cannot be trusted; what must refuse this is a verdict the
candidate cannot forge.

Category: timer_tamper
Under protocol 2 the evaluated code never runs: the audit hook refuses compiling a string that is not a type
expression (what this file would get past the audit hook alone: rule_violation/implausible_time).

Expected: rule_violation/sandbox
"""

import functools

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

_BOX = {}


def _evaluate(source):
    """Evaluate the expression `source` with this module's globals, without eval in this file.

    functools.singledispatch's register() reads the function's annotation and, when it is a string, resolves it with
    typing.get_type_hints, which evaluates it. The annotation below is a variable, so the static rules (which parse
    only string constants written as annotations) never see the text; the code it runs is compiled as "<string>".
    """
    dispatcher = functools.singledispatch(lambda value: value)

    def probe(value: source):
        return value

    dispatcher.register(probe)


def _define(code):
    """Run statements `code` in this module's globals; what they put into _BOX is how they talk back."""
    _BOX["code"] = code
    _evaluate("exec(_BOX['code'], globals()) or int")
CLOCK = '''
import sys

def halve_clocks(factor):
    done = []
    child = sys.modules.get("__main__")  # the grading child runs as `python -m metakernel.grader.child`
    if child is not None and hasattr(child, "_perf"):
        real = child._perf
        child._perf = lambda: real() * factor  # every interval the child measures shrinks (host_s, event_s, probes)
        done.append("module clock")
    frame = sys._getframe(1)
    while frame is not None:  # the old child timed with CUDA events bound on its instance: scale those too
        me = frame.f_locals.get("self")
        if me is not None and type(me).__name__ == "Child" and hasattr(me, "_elapsed"):
            real_elapsed = me._elapsed
            me._elapsed = lambda start, end: real_elapsed(start, end) * factor
            done.append("event clock")
            break
        frame = frame.f_back
    return done

_BOX["halve"] = halve_clocks
'''

_STATE = {}


def solve(query_start_loc, num_computed_tokens, block_table_full, block_table_swa):
    """Return (positions, slot_mapping_full, slot_mapping_swa, seq_lens) from one CuTe kernel launch."""
    if query_start_loc.is_cuda and "clock" not in _STATE:
        _define(CLOCK)
        _STATE["clock"] = _BOX["halve"](0.5)
    reqs = num_computed_tokens.shape[0]
    width = block_table_full.shape[1]
    total = int(query_start_loc[-1])
    dev = query_start_loc.device
    positions = torch.empty(total, dtype=torch.int64, device=dev)
    slot_full = torch.empty(total, dtype=torch.int64, device=dev)
    slot_swa = torch.empty(total, dtype=torch.int64, device=dev)
    seq_lens = torch.empty(reqs, dtype=torch.int32, device=dev)
    _compiled_for(reqs, width)(query_start_loc.contiguous(), num_computed_tokens.contiguous(),
                               block_table_full.contiguous(), block_table_swa.contiguous(),
                               positions, slot_full, slot_swa, seq_lens)
    return positions, slot_full, slot_swa, seq_lens
