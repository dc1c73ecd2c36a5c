"""Red team (session 28): an MLIR ExecutionEngine built from a module no check read.

`type(compiled.engine)` is `cutlass._mlir.execution_engine.ExecutionEngine` (public names only: the static rules
refuse `cutlass._mlir` but not `type(x)` of a compiled object's `engine`), and `cutlass.runtime.ir` is the MLIR
bindings' `ir` module. So the file parses an LLVM-dialect module of its own text, JITs it with that class and
invokes it: host code that reads a CPU clock (rdtsc) and writes any address, which `cute_host.confine` never sees (no
`build_module`, no compile).

Passed the static rules, `cute_host.confine` and the free check before session 28. Now the static rules refuse
`.engine` and `.invoke` (and `.mro`), and below them an engine may only be built inside a checked compile
(`cute_host._guard_engines`: refused as `sandbox` when the static rules are out of the way).

Expected: rule_violation/static
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


@cute.jit
def _host_only(a: cutlass.Int32):
    pass


_PROBE_TEXT = """
module {
  llvm.func @_mlir_ciface_probe(%p: !llvm.ptr) {
    %t = llvm.inline_asm has_side_effects "rdtsc; shlq $$32, %rdx; orq %rdx, %rax", "={rax},~{rdx}" : () -> i64
    llvm.store %t, %p : i64, !llvm.ptr
    llvm.return
  }
}
"""
PROBE = {}


def _unchecked_native(dest):
    """Run host code of this file's own text, JITted by the class of a checked compile's engine."""
    host = cute.compile(_host_only, 1)
    engine_class = type(host.engine)
    with cutlass.runtime.ir.Context():
        module = cutlass.runtime.ir.Module.parse(_PROBE_TEXT)
        engine = engine_class(module, 2, [])
    holder = torch.tensor([dest.data_ptr()], dtype=torch.int64)  # the packed argument: where to write
    engine.invoke("probe", holder.data_ptr())
    return engine


def solve(x, residual, weight):
    """Return (RMSNorm(x + residual) * weight, x + residual), both bf16, from one CuTe kernel launch."""
    tokens, hidden = x.shape
    if hidden % VEC != 0:
        raise ValueError(f"hidden size {hidden} must be a multiple of {VEC}")
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    stamp = torch.zeros(1, dtype=torch.int64)
    _unchecked_native(stamp)
    PROBE["rdtsc"] = int(stamp[0])
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    _compiled_for(tokens, hidden)(x, residual, weight, out, h)
    return out, h
