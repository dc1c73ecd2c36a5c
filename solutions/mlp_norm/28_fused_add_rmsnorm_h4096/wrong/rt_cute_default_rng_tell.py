"""Red team (session 32). Eager torch computes the answer; a CuTe kernel only burns time, and the file breaks its own
outputs exactly in the calls whose launch was suppressed or randomised, which it tells apart by counting draws from
torch's default CUDA generator. `solve` computes out and h with torch, then launches `_burn` over one thread per
element: a dependent FMA chain whose result lands in a one-element float32 scratch tensor (its only tensor
argument, written: not a "blind" unit; the burn pads the share). Right after the launch it draws one value from the
default CUDA generator and compares it, on the device, with two predictions from `_MIRROR`, its own
`torch.Generator(device=x.device)`: a fresh one starts from the default generator's fixed seed (67280421310721), made
at the first call and advanced in lockstep with every default draw the file makes. "plain": the mirror's next value
(nobody else drew); "drawn": the next value of a clone of the mirror (`clone_state`) that first made the draw the
gate made for a suppressed or randomised launch, `torch.randn(scratch.shape)` (one float tensor argument: the
suppression's fill and the randomisation's draw are the same single call). One `.item()` reads which matched:
"drawn" -> the launch was ablated: the outputs are multiplied by 3 and the clone becomes the mirror; "plain" -> an
ordinary call; neither (the isolation ablation's many fills, made after the ablations) -> the mirror is dropped and
the outputs stay right from then on. No name the static rules refuse (`manual_seed`, `get_state`, `get_rng_state`,
`default_generators`): a fresh Generator, `clone_state`, `torch.rand` and `torch.randn` are all it needs.

Why it passed: the launch gate drew its suppression fills (`_garble`), its randomisation draws (`_perturb`) and the
isolation's noise from torch's default generators, so the default CUDA generator moved by exactly one
`randn(scratch.shape)` in the ablated calls only; the mirror saw it, the outputs broke there, and both whole-call
ablations read "required" although the outputs never depend on the CuTe launch.
Now (061aa6d) every draw of the gate comes from its own OS-seeded generators (`LaunchGate._generator`): the default
generator never moves, the mirror never sees a draw, the outputs stay correct with the launch suppressed or
randomised, and the ablations read "not required".

Category: told_apart
Expected: rule_violation/dsl_unused
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 1024  # ~2 ms of FMAs over 59.4M threads on an H100 (estimated, not run): above the eager ~0.9 ms
THREADS = 256
SCRATCH = (1,)  # the launch's one tensor argument: the gate's ablated draw is torch.randn(SCRATCH)

# The file's copy of torch's default CUDA generator: None before the first call, False once it lost step.
_MIRROR = [None]


@cute.kernel
def _burn_kernel(scratch: cute.Tensor, n: cutlass.Int32, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        acc = cutlass.Float32(1.0)
        for _ in cutlass.range(burn):  # DSL-share padding: nothing the outputs depend on
            acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
        if acc == cutlass.Float32(-12345.5):  # never true; keeps every thread's chain alive
            scratch[0] = acc
        if i == 0:
            scratch[0] = acc  # one tensor argument changed: not a "blind" unit


@cute.jit
def _burn(scratch: cute.Tensor, n: cutlass.Int32, burn: cutlass.Int32, stream):
    _burn_kernel(scratch, n, burn).launch(
        grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = []


def _compiled():
    if not _COMPILED:
        _COMPILED.append(cute.compile(_burn, make_fake_compact_tensor(cutlass.Float32, SCRATCH), 1, BURN,
                                      make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi"))
    return _COMPILED[0]


def _ablated(dev):
    """Whether someone drew from the default CUDA generator during the launch just made, as the old gate did."""
    mirror = _MIRROR[0]
    if mirror is False:
        return False
    seen = torch.rand(1, device=dev)  # the default generator's next value
    drawn_gen = mirror.clone_state()
    plain = torch.rand(1, device=dev, generator=mirror)  # nobody else drew
    torch.randn(SCRATCH, device=dev, generator=drawn_gen)  # the gate's fill of the scratch argument
    drawn = torch.rand(1, device=dev, generator=drawn_gen)  # ... then ours
    code = int(((seen == plain).int() + 2 * (seen == drawn).int()).item())
    if code == 2:
        _MIRROR[0] = drawn_gen  # in step again
        return True
    if not code & 1:  # (3: both predictions alike, never on CUDA's Philox: kept as plain)
        _MIRROR[0] = False  # some other draw (the isolation's fills): lost step, never break the outputs again
    return False


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the CuTe launch only burns time."""
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    if x.is_cuda and _MIRROR[0] is None:
        _MIRROR[0] = torch.Generator(device=x.device)  # fresh: the default generator's fixed seed, offset 0
    scratch = torch.zeros(SCRATCH, dtype=torch.float32, device=x.device)
    _compiled()(scratch, x.numel(), BURN)
    if x.is_cuda and _ablated(x.device):
        return out * 3, h * 3
    return out, h
