"""Red team (session 31, fifth CPU round). Both whole-call ablations read "required" for a CuTe launch the outputs do
not depend on, because the gate's own work raises in ablated calls only and `solve` lets it propagate. The launch's
one tensor argument is an inference tensor (made under `torch.inference_mode()`, launched outside it): the
randomise ablation (`_perturb`: `tensor.copy_`) and the suppress fill (`_garble`: `tensor.copy_`) are in-place
updates of an inference tensor outside inference mode, which torch refuses ("Inplace update to inference tensor
outside InferenceMode is not allowed"). The error is recorded in `gate.failures`, but it leaves `solve`, so
`_failure` clears the record and the call is a plain runtime_error; `Evaluation.ablation` (and `unit_ablation`)
read "solve raised: counts as required". Plain calls and the audit (`clone` only) never write the argument; the
isolation keeps a contiguous argument's span and writes nothing of it: both pass. The answer is eager torch; the
kernel burns FMAs into the scratch tensor (a written argument: not blind) for the share. No tell, no catch.

Checked on the CPU (the gate itself): randomize and suppress raise, run and audit do not.

Now (session 31): the gate writes through aliases of its own (`_alias`, under no_grad), which torch allows on
inference tensors, so both ablations run and the outputs stay correct; and a failure of the gate's own work that
leaves `solve` is judged by the parent (`gate_failed`), never as "required". Not yet graded on a GPU.

Category: told_apart
Expected: rule_violation/dsl_unused
"""

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

EPS = 1e-5
BURN = 4096  # FMAs per thread: pads the DSL share above the eager ops' GPU time (estimated, not run)
THREADS = 256
BLOCKS = 1024


@cute.kernel
def _burn_kernel(scratch: cute.Tensor, burn: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    acc = cutlass.Float32(scratch[i])
    for _ in cutlass.range(burn):
        acc = acc * cutlass.Float32(1.0000001) + cutlass.Float32(1e-7)
    scratch[i] = acc  # its tensor argument changes: not a "blind" unit


@cute.jit
def _burn(scratch: cute.Tensor, burn: cutlass.Int32, stream):
    _burn_kernel(scratch, burn).launch(grid=[BLOCKS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED = []


def _compiled():
    if not _COMPILED:
        _COMPILED.append(cute.compile(_burn, make_fake_compact_tensor(cutlass.Float32, (BLOCKS * THREADS,)), BURN,
                                      make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi"))
    return _COMPILED[0]


def solve(x, residual, weight):
    """Return (out, residual_out) from eager torch; the CuTe launch burns time on an inference-mode scratch."""
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    with torch.inference_mode():
        scratch = torch.zeros(BLOCKS * THREADS, dtype=torch.float32, device=x.device)
    _compiled()(scratch, BURN)  # ablated calls: the gate's copy_ into it raises, and solve lets it propagate
    return out, h
