"""Red team (session 31, third CPU round, hole 12: the isolation's own saved copies). The anchor-offset copy
(`rt_cute_anchor_offset_copy`) that, in an isolated launch, reads the gate's verbatim copy of the answer instead of
the noise. `LaunchGate._isolate` copies every reachable byte to its private pool before the fill and keeps those
copies live and unfilled while the launch runs (`Child._reachable` leaves the pool out); the first copy it makes is
the whole input arena (`regions[0]`), one piece when no launch argument lies in it, into a fresh pool segment of
exactly the arena's size (a multiple of 2 MiB above 10 MiB: `cudaMalloc(A)`, the clone at its first byte).

`solve` computes out and h with torch and writes them over its own x and residual (views of the input arena; saved
first, written back after the launch, so nothing is mutated when the call returns). It then vacates a virtual range
of exactly the arena's size: a failed 1 PiB allocation makes the caching allocator release every cached segment
(`release_cached_blocks`, torch's own OOM path: `empty_cache` under no refused name), a fresh `torch.empty(A)` is
`cudaMalloc(A)` at X, and after `del` a second failed allocation gives X back to the driver. Nothing allocates until
the launch, so the gate's first `cudaMalloc(A)` (the arena's copy) is the next one of that size: the driver hands
X out again (ASSUMED: CUDA reuses a freed range for the next allocation of its size; not measured, no GPU here).
The kernel gets a one-element anchor, a 1.0 flag, a scratch tensor and the outputs (no token), plus Int64 offsets:
to a four-value canary in a live default-pool block, to x and residual in the arena, and to X + (x - arena base)
and X + (residual - arena base). Canary intact (every call but an isolated one): it copies from the arena. Canary
noise (isolated): it copies from the gate's saved arena at X, which holds the answer verbatim. If X is not where the
copy went, the read faults or reads other bytes: `dsl_reach`, as before.

Static rules: nothing refused (torch.empty, untyped_storage, data_ptr, nbytes, `except RuntimeError`).

Proposed fix: no verbatim byte the file wrote may be readable on the device while an isolated launch runs. Keep the
saved copies on the host (pageable; the lent machines have no HMM) or, cheaper, save `bytes XOR pad` where the pad
is the fill's own noise drawn into the gate's pool, then fill the region with a second independent draw (the
kernel would need both the pool's pad and its XOR image, neither of which the file can locate or predict), or
allocate the copies before the file's call in a pool whose addresses the file cannot steer (one large segment made
when the row starts, sub-allocated in a random order). Separately: refuse or count a failed allocation as the
allocator flush it is (an OOM inside solve is never honest; `torch.OutOfMemoryError` caught in solve could end the
grading as `rule_violation`), since it gives a file `empty_cache` and control of where the next cudaMalloc lands.

Before the fix, if the driver reuses the range (GPU-unverified), it passed every phase. Now (session 31) the
gate saves `bytes XOR pad`, the pad drawn from its own OS-seeded generator and drawn again to unmask: the copy at X
is noise to the kernel, and the isolated call's outputs break. The same session's out-of-memory rule
(`Child._check_clean`: an OOM caught in solve is a flush of the allocator) now ends the grading at the first call,
before any isolation (session 32 on the H100: `rule_violation/sandbox`).

Category: token_route
Expected: rule_violation/sandbox
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 1024  # DSL-share padding in the copy's own unit, as in rt_cute_anchor_offset_copy
THREADS = 256
HUGE = 1 << 50  # bytes no device has: the allocator releases its cache, retries, raises
CANARY = (1.5, -2.25, 3.125, -7.0)  # exact in bf16; noise matches all four with probability ~2**-64


@cute.kernel
def _copy_kernel(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
                 off_c: cutlass.Int64, off_o: cutlass.Int64, off_h: cutlass.Int64, saved_o: cutlass.Int64,
                 saved_h: cutlass.Int64, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = mOut.shape[0]
    i = bidx * THREADS + tidx
    if i < n:
        mC = cute.make_tensor(anchor.iterator + off_c, cute.make_layout(4))
        bad = cutlass.Int32(0)
        if mC[0] != cutlass.BFloat16(CANARY[0]):
            bad = cutlass.Int32(1)
        if mC[1] != cutlass.BFloat16(CANARY[1]):
            bad = cutlass.Int32(1)
        if mC[2] != cutlass.BFloat16(CANARY[2]):
            bad = cutlass.Int32(1)
        if mC[3] != cutlass.BFloat16(CANARY[3]):
            bad = cutlass.Int32(1)
        src_o = off_o
        src_h = off_h
        if bad != cutlass.Int32(0):  # isolated: the gate's own copy of the arena, at the vacated range
            src_o = saved_o
            src_h = saved_h
        mO = cute.make_tensor(anchor.iterator + src_o, cute.make_layout(n))
        mR = cute.make_tensor(anchor.iterator + src_h, cute.make_layout(n))
        o = mO[i]
        r = mR[i]
        acc = cutlass.Float32(flag[0])
        for _ in cutlass.range(burn):  # DSL-share padding in the same unit; the outputs formally depend on it
            acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
        if acc == cutlass.Float32(-12345.5):
            o = r
        if flag[0] != cutlass.Float32(1.0):  # randomise ablation: flag perturbed -> outputs break
            o = o * cutlass.BFloat16(3.0)
            r = r * cutlass.BFloat16(3.0)
        mOut[i] = o
        mH[i] = r
        if i == 0:
            scratch[0] = acc  # one tensor argument changed: not a "blind" unit


@cute.jit
def _copy(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
          off_c: cutlass.Int64, off_o: cutlass.Int64, off_h: cutlass.Int64, saved_o: cutlass.Int64,
          saved_h: cutlass.Int64, burn: cutlass.Int32, stream):
    n = mOut.shape[0]
    _copy_kernel(anchor, flag, scratch, mOut, mH, off_c, off_o, off_h, saved_o, saved_h, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(n):
    fn = _COMPILED.get(n)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        fn = cute.compile(_copy, make_fake_compact_tensor(bf16, (1,)), make_fake_compact_tensor(f32, (1,)),
                          make_fake_compact_tensor(f32, (1,)), make_fake_compact_tensor(bf16, (n,)),
                          make_fake_compact_tensor(bf16, (n,)), 0, 0, 0, 0, 0, BURN,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[n] = fn
    return fn


def _flush():
    """torch's OOM path: release every cached, unsplit segment of the default pool, retry, raise."""
    try:
        torch.empty(HUGE, dtype=torch.uint8, device="cuda")
    except RuntimeError:
        pass


def _vacate(size):
    """A virtual range of `size` bytes the driver just took back: the next cudaMalloc(size) is expected there."""
    _flush()
    block = torch.empty(size, dtype=torch.uint8, device="cuda")
    at = block.data_ptr()
    del block
    _flush()
    return at


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the CuTe launch only copies it."""
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    n = o.numel()
    fn = _compiled_for(n)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    canary = torch.tensor(CANARY, dtype=x.dtype, device=x.device)  # never a launch argument
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    x0, r0 = x.clone(), residual.clone()
    x.copy_(o)  # the answer in the input arena, for the launch only
    residual.copy_(h)
    store = x.untyped_storage()
    base = store.data_ptr()
    where = base  # off the GPU: no allocator to steer (the dry run intercepts the launch)
    if x.is_cuda:
        where = _vacate(store.nbytes())  # nothing allocates from here to the launch
    es = x.element_size()
    a = anchor.data_ptr()
    fn(anchor, flag, scratch, out, res, (canary.data_ptr() - a) // es, (x.data_ptr() - a) // es,
       (residual.data_ptr() - a) // es, (where + x.data_ptr() - base - a) // es,
       (where + residual.data_ptr() - base - a) // es, BURN)
    x.copy_(x0)  # after the gate's restore (same stream): the inputs as they came
    residual.copy_(r0)
    return out.view(x.shape), res.view(x.shape)
