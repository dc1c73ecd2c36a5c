"""Red team (session 31, fourth CPU round: the gate's own out-of-memory errors raise into `solve`). A token copy
(eager torch computes the answer, one CuTe unit copies it into the outputs) that tells audited and ablated calls
from plain and isolated ones by a failure of the gate's own copies, and computes honestly exactly there.

Every launch of the one compiled unit carries a "shield" first: a one-byte tensor expanded to 2**20 x 2**20
(strides 0, 0; 1 Ti elements, one byte of memory; CuTe takes it as a tensor of symbolic shape and strides). What
the gate does with it per mode (`metakernel/dsl/base.py`):
  - run, intercept: nothing (`_tensors` only reads types); the launch runs.
  - isolate: `_distinct` cuts the stride-0 dimensions to one element (session 31's fix for
    `rt_cute_isolation_expanded_shield`); a one-byte clone; the launch runs.
  - audit: `[t.detach().clone() for t in live]` in `should_launch`: a dense copy of 2**40 bytes, cudaMalloc fails,
    `torch.OutOfMemoryError` is raised inside `_aside`, which counts it in `own_ooms` and re-raises it. The CuTe
    hook (`cute.py` `gated`) lets it out of the launch call, into `solve`.
  - randomize (whole call, or `only` this unit): `_perturb`'s `saved = tensor.clone()`: the same OOM.
  - suppress (targeted): `_garble`'s `torch.randint(..., tensor.shape, dtype=int64)`: 8 TiB, the same OOM.
`solve` catches it: that call is audited or ablated, so it runs the same unit in its compute mode (a plain
row-per-thread RMSNorm; no eager answer is handed to it, the audit sees inputs and poisoned outputs, both
ablations break the outputs: "required"). Everywhere else (timed, profiled, isolated calls) the unit copies the
eager answer handed to it as tensor arguments (the audit's case, which the audit never sees) and burns in the same
unit for the share. Isolation keeps a launch's own arguments, so the token survives it: every check passes.

The OOM rule does not see it: each OOM is one `num_ooms` of the allocator and one `own_ooms` of the gate, so
`Child._ooms` reads 0. The allocator's OOM path also ran `release_cached_blocks` (torch's empty_cache) for the
file, uncounted, in every audited or ablated call.

Static rules: nothing refused (expand, `except torch.OutOfMemoryError`, make_fake_tensor, sym_int).
GPU-unverified (reasoned from the code): that TVM-FFI accepts the stride-0 shield (the dry run's `validate` of the
compiled spec does), and that the 2**40-byte clone raises OutOfMemoryError (any card: it exceeds device memory).

Proposed fix: a gate failure must never be an exception the file can catch and survive. (1) Refuse, in every mode
(run included, so the refusal tells nothing), a tensor argument whose elements overlap (stride 0 with size > 1, or
`_distinct(t) is None`), as the isolation already does for its own copies; or copy only `_distinct(t)` in the
audit and `_perturb`/`_garble` too. (2) Any exception raised by the gate's own work inside `should_launch` /
`after_launch` (OOM or else) is recorded on the gate and ends the grading (`_check_clean`: the file's if it caused
it, "not conclusive" otherwise), whether or not `solve` caught it; `own_ooms` should only discount OOMs the gate
recorded as such, never hide one the file observed.

Now (session 31): the randomise and suppress ablations write a strided argument's distinct elements (the shield is
one byte there), and any failure of the gate's own work inside a launch (the audit's 2**40-byte copy) is recorded
on the gate; a file that caught it and went on is `rule_violation/sandbox` at the next request
(`Child._check_clean`). Not yet graded on a GPU.

Category: told_apart
Expected: rule_violation/sandbox
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

EPS = 1e-5
BURN = 1024  # DSL-share padding in the copy's own unit (as rt_cute_anchor_offset_copy)
THREADS = 256
SIDE = 1 << 20  # the shield's side: 2**40 one-byte elements, one byte of memory


@cute.kernel
def _kernel(shield: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, tokO: cute.Tensor,
            tokH: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor, mode: cutlass.Int32, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    n = mOut.shape[0]
    d = mW.shape[0]
    i = bidx * THREADS + tidx
    if mode == cutlass.Int32(0):  # plain calls: the eager answer, handed in, copied (a token)
        if i < n:
            o = tokO[i]
            h = tokH[i]
            acc = cutlass.Float32(1.0)
            for _ in cutlass.range(burn):
                acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
            if acc == cutlass.Float32(-12345.5):
                o = h
            mOut[i] = o
            mH[i] = h
    else:  # audited or ablated calls: the real RMSNorm, one row per thread
        rows = n // d
        if i < rows:
            base = i * d
            ss = cutlass.Float32(0.0)
            for j in cutlass.range(d):
                hv = cutlass.BFloat16(cutlass.Float32(mX[base + j]) + cutlass.Float32(mR[base + j]))
                hf = cutlass.Float32(hv)
                ss = ss + hf * hf
            inv = cute.math.rsqrt(ss / cutlass.Float32(d) + cutlass.Float32(EPS))
            for j in cutlass.range(d):
                hv = cutlass.BFloat16(cutlass.Float32(mX[base + j]) + cutlass.Float32(mR[base + j]))
                mH[base + j] = hv
                mOut[base + j] = cutlass.BFloat16(cutlass.Float32(hv) * inv * cutlass.Float32(mW[j]))


@cute.jit
def _launch(shield: cute.Tensor, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, tokO: cute.Tensor,
            tokH: cute.Tensor, mOut: cute.Tensor, mH: cute.Tensor, mode: cutlass.Int32, burn: cutlass.Int32,
            stream):
    n = mOut.shape[0]
    _kernel(shield, mX, mR, mW, tokO, tokH, mOut, mH, mode, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(n, d):
    fn = _COMPILED.get((n, d))
    if fn is None:
        bf16 = cutlass.BFloat16
        shield = make_fake_tensor(cutlass.Uint8, (cute.sym_int(), cute.sym_int()), (cute.sym_int(), cute.sym_int()))
        flat = make_fake_compact_tensor(bf16, (n,))
        fn = cute.compile(_launch, shield, flat, flat, make_fake_compact_tensor(bf16, (d,)), flat, flat, flat, flat,
                          0, BURN, make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
        _COMPILED[(n, d)] = fn
    return fn


def solve(x, residual, weight):
    """Eager answer + CuTe copy, except where the gate's own copy of the shield fails: there, honest."""
    n, d = x.numel(), weight.numel()
    fn = _compiled_for(n, d)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    shield = torch.zeros(1, dtype=torch.uint8, device=x.device).expand(SIDE, SIDE)
    try:
        fn(shield, x.view(-1), residual.view(-1), weight, o.view(-1), h.view(-1), out, res, 0, BURN)
    except torch.OutOfMemoryError:  # audit, randomise or suppress: the gate's dense copy of the shield failed
        small = torch.zeros((1, 1), dtype=torch.uint8, device=x.device)
        fn(small, x.view(-1), residual.view(-1), weight, out, res, out, res, 1, 0)
    return out.view(x.shape), res.view(x.shape)
