"""Red team (session 32, CPU). The randomise ablation's restore, defeated by passing one tensor twice: eager torch
computes the whole answer and the only CuTe kernel is a burn whose values nothing reads, yet both whole-call
ablations read "required", with no tell of any kind.

`LaunchGate._perturb` saves and randomises each tensor argument in turn, and `after_launch` restores them in the
same order, each with `where(view == perturbed, saved, view)`. With `k` passed twice, the first entry saves k's true
values and draws r1, the second saves r1 (what the first left) and draws r2; after the launch the first entry finds
r2, not r1, and keeps it as "written by the launch", the second puts back r1. `k` is left random. (Two overlapping
views do the same on their overlap.) Shown on the CPU with the real gate: /tmp/rt32/gate_alias_restore.py.

So: `k = torch.ones(hidden)` is handed twice to the burn (with a scratch the burn writes, so the unit is not
"blind"), and the eager answer is multiplied by `k` after the launch (exact in a plain call). Randomised: k stays
random, the outputs break, "required". Suppressed: the gate garbles k (not a problem input), the outputs break,
"required". Audit: k is ones of hidden x 4 bytes, neither the answer nor an output's size. Isolation: the burn reads
its own arguments. One unit, so no per-unit ablation; the burn pads the DSL share over 50 %. The same works on a
problem input passed twice (inputs are protected from the suppress fill, not from `_perturb`).
Bound: hole 4's (the burn must be half the GPU time: at best half as fast as the eager ops it runs); what is new is
that the whole-call ablations need no dependency on the DSL's values at all, not even a folded checksum.

Fix: restore in reverse order (each entry then finds exactly what it drew), or perturb each distinct storage span
once. Either keeps honest in-place kernels (an argument that is both input and output) "required".

Category: gate_forgery
Expected: rule_violation/dsl_unused
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
THREADS = 256
BURN = 4096  # FMAs per thread: tuned on the GPU to take more than the eager ops (estimated, not run)


@cute.kernel
def _burn_kernel(mK: cute.Tensor, mK2: cute.Tensor, scratch: cute.Tensor, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    acc = cutlass.Float32(1.0)
    for _ in cutlass.range(burn):
        acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
    if i == 0:
        scratch[0] = acc + mK[0] - mK2[0]  # one tensor argument written: not a "blind" unit


@cute.jit
def _burn(mK: cute.Tensor, mK2: cute.Tensor, scratch: cute.Tensor, burn: cutlass.Int32, stream):
    _burn_kernel(mK, mK2, scratch, burn).launch(grid=[132, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = {}


def _compiled_for(hidden):
    fn = _COMPILED.get(hidden)
    if fn is None:
        f32 = cutlass.Float32
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(_burn, make_fake_compact_tensor(f32, (hidden,)), make_fake_compact_tensor(f32, (hidden,)),
                          make_fake_compact_tensor(f32, (1,)), BURN, stream, options="--enable-tvm-ffi")
        _COMPILED[hidden] = fn
    return fn


def solve(x, residual, weight):
    """Return (RMSNorm(x + residual) * weight, x + residual), all of it eager; the CuTe launch only burns."""
    tokens, hidden = x.shape
    burn = _compiled_for(hidden)
    k = torch.ones(hidden, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    burn(k, k, scratch, BURN)  # the same tensor twice: the randomise ablation leaves it random
    hf = x.float() + residual.float()
    h = (hf * k).to(x.dtype)
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float() * k).to(x.dtype)
    return out, h
