"""Red team (session 33, CPU round). A probe tells the two whole-call ablations from every other call, and `solve`
raises there, which the grader read as "the DSL's values are required".

The only TIRx kernel computes `probe[0] = 2 * seed[0] + 1` from a one-element seed the file fills with 3.0 (7.0 in
every plain, audited, isolated, timed or profiled call), and burns time copying a scratch buffer in the same kernel
(one compiled unit, so no per-unit ablation) for the 50 % DSL share. A suppressed launch leaves the probe garbled, a
randomised one computes it from a random seed: `solve` reads the probe back and raises when it is not 7.0. Every
other call returns eager PyTorch's answer. The audit sees no token (one-element arguments and scratch), the probe
writes its argument (not blind), the isolation leaves the eager outputs correct. No DSL implementation of the
problem exists in the file; on a GPU it would pass at about half the eager speed.

Now (session 33): a failure in an ablated call is no evidence; the position is ablated in the other mode too, and
failing both ways is `dsl_unused`. Shown on the CPU with the llvm twin of this file
(`tests/test_grader_cpu.py::test_a_file_that_fails_when_ablated_shows_no_dependence`).

Category: gate_forgery
Expected: rule_violation/dsl_unused
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
BURN_ELEMENTS = 64 * 1024 * 1024  # fp32: 256 MiB copied per call, about the eager ops' GPU time


@Tx.prim_func
def probe_and_burn(s_ptr: Tx.handle, p_ptr: Tx.handle, a_ptr: Tx.handle, b_ptr: Tx.handle):
    S = Tx.match_buffer(s_ptr, (1,), "float32")
    P = Tx.match_buffer(p_ptr, (1,), "float32")
    A = Tx.match_buffer(a_ptr, (BURN_ELEMENTS,), "float32")
    B = Tx.match_buffer(b_ptr, (BURN_ELEMENTS,), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([BURN_ELEMENTS // 256])
    tx = Tx.thread_id([256])
    i: Tx.let = bx * 256 + tx
    B[i] = A[i]
    if i == 0:
        P[0] = S[0] * Tx.float32(2.0) + Tx.float32(1.0)


_EXE = {}
_SCRATCH = {}


def _exe():
    if "k" not in _EXE:
        _EXE["k"] = tvm.compile(probe_and_burn, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx")
    return _EXE["k"]


def solve(x, residual, weight):
    if "a" not in _SCRATCH:
        _SCRATCH["a"] = torch.ones(BURN_ELEMENTS, device=x.device)
        _SCRATCH["b"] = torch.empty_like(_SCRATCH["a"])
    seed = torch.full((1,), 3.0, dtype=torch.float32, device=x.device)
    probe = torch.empty(1, dtype=torch.float32, device=x.device)
    _exe()(seed, probe, _SCRATCH["a"], _SCRATCH["b"])
    if x.is_cuda and probe.item() != 7.0:
        raise RuntimeError("ablated")
    h = x + residual
    hf = h.float()
    out = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    return out, h
