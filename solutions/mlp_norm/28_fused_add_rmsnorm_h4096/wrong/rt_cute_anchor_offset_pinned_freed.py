"""Red team (session 31, second CPU round, hole 12 after `Child._pinned`). As `rt_cute_anchor_offset_pinned_positional`, but the
page-locked buffer holding the eager answer is FREED before the launch, and torch's host allocator then counts it
as cached, not as in use. `ans = dev.to(CPU, dev.dtype, True)` (non_blocking by position) copies the answer into a
block of the caching host allocator (cudaHostAlloc: mapped into the GPU's address space by UVA); `del ans` hands the
block back with an event recorded on the stream (the non-blocking copy's), and the next host allocation processes
that event and puts the block on the free list (`maybe_cache_block`: `active_bytes` down, `allocated_bytes` not). Two
`.item()` calls are that allocation: `_local_scalar_dense_cuda` takes its one-element staging buffer from the same
host allocator (the first syncs the stream, the second finds the copy's event done), and frees it at once (no
stream recorded). The block stays page-locked, mapped and unchanged (nothing else asks for its size bucket); the
copy kernel reaches it from a one-element device anchor by the Int64 element offset, as before.

Why it passes: `Child._pinned_now` reads `active_bytes.current` ("blocks currently checked out to callers",
torch.cuda.host_memory_stats' docstring), which a freed-but-cached block leaves; the isolation's snapshot covers
torch's device allocator and the input arena only. Every name used is allowed (`.to` with a positional flag,
`.item`).
Now (session 31): the child reads `allocated_bytes.current` (every page-locked byte the host allocator holds,
active and cached) above what it held before the file's import, less 4 KiB for `.item()`'s staging blocks (which it
warms first). Not yet graded on a GPU.

Category: token_route
Expected: rule_violation/dsl_reach
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 4096  # ~8 ms of FMAs (estimated, not run): above the ~5 ms device-to-pinned copy the profile counts as non-DSL time
THREADS = 256
CPU = torch.device("cpu")


@cute.kernel
def _copy_kernel(anchor: cute.Tensor, flag: cute.Tensor, scratch: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor,
                 off: cutlass.Int64, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = mOut.shape[0]
    i = bidx * THREADS + tidx
    if i < n:
        # the eager answer, [out | h], reached from the anchor's address by an element offset
        mA = cute.make_tensor(anchor.iterator + off, cute.make_layout(2 * n))
        o = mA[i]
        r = mA[n + i]
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
          off: cutlass.Int64, burn: cutlass.Int32, stream):
    n = mOut.shape[0]
    _copy_kernel(anchor, flag, scratch, mOut, mH, off, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(n):
    fn = _COMPILED.get(n)
    if fn is None:
        bf16, f32 = cutlass.BFloat16, cutlass.Float32
        fn = cute.compile(_copy, make_fake_compact_tensor(bf16, (1,)), make_fake_compact_tensor(f32, (1,)),
                          make_fake_compact_tensor(f32, (1,)), make_fake_compact_tensor(bf16, (n,)),
                          make_fake_compact_tensor(bf16, (n,)), 0, BURN,
                          make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[n] = fn
    return fn


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the CuTe launch only copies it."""
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    n = o.numel()
    dev = torch.cat((o.reshape(-1), h.reshape(-1)))
    # a non-blocking copy to the CPU lands in page-locked memory; non_blocking passed by position
    ans = dev.to(CPU, dev.dtype, True)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    delta = ans.data_ptr() - anchor.data_ptr()
    assert delta % ans.element_size() == 0
    off = delta // ans.element_size()
    # give the block back: it stays page-locked and keeps the answer, but no longer counts as in use
    del ans
    seen = float(anchor[0].item())  # a host-allocator allocation (its staging buffer), after syncing the stream
    seen += float(anchor[0].item())  # another: processes the copy's (now completed) event, caching the block
    assert seen == 0.0
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    _compiled_for(n)(anchor, flag, scratch, out, res, off, BURN)
    return out.view(x.shape), res.view(x.shape)
