"""Gate forgery: a TIRx function compiled for the CPU ("llvm") is the only "launch"; eager PyTorch does the copy.

The TIRx hooks gate every function of a TVM module, GPU or not. A one-line prim_func built for target "llvm" writes
1 into a one-element CPU tensor: it counts as a TIRx launch, and it doubles as an oracle - when the harness
suppresses launches the flag stays 0, so `solve` then skips the copy (the ablation "breaks" the output). The
randomising ablation cannot perturb a one-element tensor, and the audit finds no answer in it. No GPU kernel of
TIRx ever runs: the profile must show it (the old grader only reported a 0 % share). Since session 17 the llvm
build itself is refused where the kernel is for the GPU (host code that accesses a buffer: metakernel/dsl/tirx_host.py),
before the profile could say `no_dsl_launch`.

Category: gate_forgery
Expected: rule_violation/sandbox
"""

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def host_flag(f_ptr: Tx.handle):
    F = Tx.match_buffer(f_ptr, (1,), "int32")
    F[0] = 1


_EXE = []


def _flag_exe():
    if not _EXE:
        _EXE.append(tvm.compile(host_flag, target=tvm.target.Target("llvm"), tir_pipeline="tirx"))
    return _EXE[0]


def solve(kv_caches, block_mapping):
    flag = torch.zeros(1, dtype=torch.int32)
    _flag_exe()(flag)  # a "TIRx launch" on the CPU: counted by the gate, and it tells us whether it really ran
    if int(flag[0]) == 1 and block_mapping.shape[0] > 0:
        src, dst = block_mapping[:, 0], block_mapping[:, 1]
        kv_caches[:, :, dst] = kv_caches[:, :, src]
    return None
