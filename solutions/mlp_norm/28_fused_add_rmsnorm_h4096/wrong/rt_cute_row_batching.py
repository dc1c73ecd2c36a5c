"""Row batching: the first call of a timed request also computes the request's later draws, and the later calls return them.

Problem 28 is purely functional (the reference returns new tensors and mutates nothing), so a later draw can be
computed early without any observable effect on its inputs. Under timing protocol 3 a timed request places all
TIMED_CHUNK = 4 fresh draws in the child's input arena before the first call (`Worker.place`: draw k at
k * in_slot, each tensor at `aligned(...)` offsets), and every input `solve` receives is a view of that one arena
tensor (`transport.unpack_value`). So `x.untyped_storage()` spans every draw of the request and
`x.storage_offset() == 0` says the call is the first of its request. This file rebuilds the layout from the
current draw's own offsets (in_slot = weight's byte offset + aligned(weight bytes) + ALIGN, as `Worker.__init__`
sizes a slot from `draw_bytes`), reaches draw k with `x.as_strided(shape, stride, storage_offset)` on the same
storage, queues the gold CuTe kernel's launches for draws 1..k back to back right after draw 0's (no device-wide
sync between them, so their launch latency and host cost overlap GPU work) and caches the outputs, keyed by the
exact storage pointer, byte offset, shape and stride of all three inputs. A later call whose key matches pops its
entry and returns it at almost no cost; any miss computes normally. The cache is cleared on every offset-0 call
(the first draw of each request), so an entry is only ever used within the request that computed it, whatever
stale data the arena's later slots hold. How many later draws to compute is predicted from the previous request
(calls seen between two offset-0 calls, at most 3): 0 through correctness, ablation and audit (1-draw requests,
so nothing extra runs there), 3 in timed requests after the first warm-up, 2 in profile requests after the first
(which would otherwise profile a stale fourth draw and inflate the GPU-only time).

Every output is correct, the inputs are untouched, GPU-only time is unchanged, but a timed request's total holds
one call's host overhead instead of four: a forged end-to-end speed-up. Passed at protocol 3 on the H200 (aa838d1:
5.88x, where the gold CuTe kernel reads 5.34x). Since protocol 4 every draw after the first of a row is masked in
the arena (XOR with a keyed stream) until the child unmasks it right before its own call (docs/integrity.md hole
9), so what the first call precomputes belongs to noise; and a cache hit launches no CuTe kernel, which every call
of a row must: the correctness phase's second row (its predecessor had four calls) ends the grading there.

Category: row_batching
Expected: rule_violation/no_dsl_launch
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
VEC = 8  # bf16 elements per 128-bit access
MAX_THREADS = 256


def _threads_for(hidden):
    vectors = hidden // VEC
    return max(32, min(MAX_THREADS, (vectors + 31) // 32 * 32))


@cute.jit
def _warp_allreduce_sum(value):
    for k in cutlass.range_constexpr(5):  # 16, 8, 4, 2, 1 lanes apart
        value = value + cute.arch.shuffle_sync_bfly(value, offset=16 >> k)
    return value


@cute.kernel
def _add_rmsnorm_kernel(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
                        copy: cute.TiledCopy, threads: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    hidden = mX.shape[1]
    warps = threads // 32
    vectors = hidden // VEC

    part = copy.get_slice(tidx)
    # this CTA's row, as a (hidden,) tensor, split into this thread's ((VEC), n_iter) vectors
    tX = part.partition_S(cute.local_tile(mX, tiler=(1, hidden), coord=(row, 0))[0, None])
    tR = part.partition_S(cute.local_tile(mR, tiler=(1, hidden), coord=(row, 0))[0, None])
    tW = part.partition_S(mW)
    tOut = part.partition_D(cute.local_tile(mOut, tiler=(1, hidden), coord=(row, 0))[0, None])
    tH = part.partition_D(cute.local_tile(mH, tiler=(1, hidden), coord=(row, 0))[0, None])

    rX = cute.make_fragment_like(tX)
    rR = cute.make_fragment_like(tR)
    rW = cute.make_fragment_like(tW)
    rX.fill(0)
    rR.fill(0)
    rW.fill(0)
    n_iter = cute.size(tX, mode=[1])
    for i in cutlass.range_constexpr(n_iter):
        if i * threads + tidx < vectors:  # the whole vector is inside the row
            cute.autovec_copy(tX[None, i], rX[None, i])
            cute.autovec_copy(tR[None, i], rR[None, i])
            cute.autovec_copy(tW[None, i], rW[None, i])

    # new residual stream: rounded to bf16 once, exactly like `x + residual` in bf16
    rH = cute.make_fragment_like(tH)
    rH.store((rX.load().to(cutlass.Float32) + rR.load().to(cutlass.Float32)).to(mH.element_type))
    h = rH.load().to(cutlass.Float32)  # statistics come from the rounded sum
    sq = (h * h).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), reduction_profile=0)
    sq = _warp_allreduce_sum(sq)

    smem = cutlass.memory.SmemAllocator()
    partial = smem.allocate_tensor(cutlass.Float32, cute.make_layout(warps + 1))
    warp = tidx // 32
    lane = tidx % 32
    if lane == 0:
        partial[warp] = sq
    cute.arch.sync_threads()
    if warp == 0:
        v = cutlass.Float32(0.0)
        if lane < warps:
            v = partial[lane]
        v = _warp_allreduce_sum(v)
        if lane == 0:
            partial[warps] = v
    cute.arch.sync_threads()
    inv_rms = cute.math.rsqrt(partial[warps] / hidden + EPS)

    rOut = cute.make_fragment_like(tOut)
    rOut.store((h * inv_rms * rW.load().to(cutlass.Float32)).to(mOut.element_type))
    for i in cutlass.range_constexpr(n_iter):
        if i * threads + tidx < vectors:
            cute.autovec_copy(rH[None, i], tH[None, i])
            cute.autovec_copy(rOut[None, i], tOut[None, i])


@cute.jit
def _add_rmsnorm(mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor, stream):
    threads = _threads_for(mX.shape[1])
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mX.element_type, num_bits_per_copy=128)
    copy = cute.make_tiled_copy_tv(atom, cute.make_layout(threads), cute.make_layout(VEC))
    _add_rmsnorm_kernel(mX, mR, mW, mOut, mH, copy, threads).launch(
        grid=[mX.shape[0], 1, 1], block=[threads, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(tokens, hidden):
    key = (tokens, hidden)
    fn = _COMPILED.get(key)
    if fn is None:
        bf16 = cutlass.BFloat16

        def matrix():
            return make_fake_compact_tensor(bf16, (tokens, hidden), stride_order=(1, 0), assumed_align=16)

        vector = make_fake_compact_tensor(bf16, (hidden,), assumed_align=16)
        fn = cute.compile(_add_rmsnorm, matrix(), matrix(), vector, matrix(), matrix(),
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[key] = fn
    return fn


ALIGN = 256  # transport.ALIGN: every arena tensor starts at a multiple of it
MAX_AHEAD = 3  # TIMED_CHUNK - 1: later draws one request can hold
_AHEAD = {}  # key of a later draw's inputs -> its (out, h), made by the first call of the current request
_SEEN = {"calls": 0, "previous": 0}  # calls since the last offset-0 call; calls of the request before


def _aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(t):
    return t.numel() * t.element_size()


def _key(tensors):
    return tuple((t.untyped_storage().data_ptr(), t.storage_offset() * t.element_size(), tuple(t.shape), t.stride())
                 for t in tensors)


def _launch(x, residual, weight):
    tokens, hidden = x.shape
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    _compiled_for(tokens, hidden)(x, residual, weight, out, h)
    return out, h


def _later_draws(x, residual, weight):
    """Views of the request's later draws, laid out as `Worker.place` puts them (empty if the layout is not it)."""
    if not (x.is_cuda and residual.is_cuda and weight.is_cuda):
        return []
    storage = x.untyped_storage()
    base = storage.data_ptr()
    if residual.untyped_storage().data_ptr() != base or weight.untyped_storage().data_ptr() != base:
        return []
    if not (x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        return []
    r_at = residual.storage_offset() * residual.element_size()
    w_at = weight.storage_offset() * weight.element_size()
    if x.storage_offset() != 0 or r_at != _aligned(_nbytes(x)) or w_at != r_at + _aligned(_nbytes(residual)):
        return []
    draw = w_at + _aligned(_nbytes(weight))  # transport.draw_bytes of one draw
    slot = draw + ALIGN  # Worker.in_slot
    ahead = min(MAX_AHEAD, _SEEN["previous"] - 1)
    views = []
    for k in range(1, ahead + 1):
        at = k * slot
        if at + draw > storage.nbytes():
            break
        views.append([t.as_strided(t.shape, t.stride(), (at + off) // t.element_size())
                      for t, off in ((x, 0), (residual, r_at), (weight, w_at))])
    return views


def solve(x, residual, weight):
    """Return (RMSNorm(x + residual) * weight, x + residual); the first call of a request computes its later draws."""
    tokens, hidden = x.shape
    if hidden % VEC != 0:
        raise ValueError(f"hidden size {hidden} must be a multiple of {VEC}")
    first = not x.is_cuda or x.storage_offset() == 0
    if first:  # a new request: nothing computed before it may be returned
        _AHEAD.clear()
        _SEEN["previous"] = _SEEN["calls"]
        _SEEN["calls"] = 1
    else:
        _SEEN["calls"] = _SEEN["calls"] + 1
        hit = _AHEAD.pop(_key((x, residual, weight)), None)
        if hit is not None:
            return hit
    result = _launch(x, residual, weight)
    if first:
        for later in _later_draws(x, residual, weight):  # queued behind draw 0's launch, no sync in between
            _AHEAD[_key(later)] = _launch(*later)
    return result
