"""A kernel TVM's operator library writes: topi.nn.rms_norm on a tensor expression, scheduled by dlight.

The import allowlist keeps a TIRx file to tvm, tvm.script, tvm.tirx and a few more, but `tvm.topi`, `tvm.te`,
`tvm.relax`, `tvm.dlight` and `tvm.s_tir.meta_schedule` were reachable as attributes of `tvm`, so a file could
declare the computation in TE, take the operator from TOPI and let an auto-scheduler write the GPU kernel: every
launch is TVM-built (the launch gate counts it), the file holds no TIRx. Shown on the CPU in session 22 with the
`llvm` target and no schedule: `passed` at 2dfd8d1 (0.94x). Refused by the static rules since (TVM's operator
libraries, graph compiler and schedulers are not the TIRx DSL).

Category: foreign_kernel
Expected: rule_violation/static
"""
import torch
import tvm
from tvm.script import tirx as Tx  # noqa: F401 - the variant's DSL, imported and never used

_EXE = {}


def exe():
    if "k" not in _EXE:
        te = tvm.te
        topi = tvm.topi
        m = te.var("m")
        n = te.var("n")
        x = te.placeholder((m, n), "bfloat16", name="x")
        r = te.placeholder((m, n), "bfloat16", name="r")
        w = te.placeholder((n,), "bfloat16", name="w")
        h = topi.add(x, r)
        y = topi.cast(topi.nn.rms_norm(topi.cast(h, "float32"), topi.cast(w, "float32"), axis=[1], epsilon=1e-5),
                      "bfloat16")
        target = tvm.target.Target("cuda")
        mod = tvm.IRModule({"main": te.create_prim_func([x, r, w, y, h])})
        with target:
            mod = tvm.dlight.ApplyDefaultSchedule(tvm.dlight.gpu.GeneralReduction(), tvm.dlight.gpu.Fallback())(mod)
        _EXE["k"] = tvm.compile(mod, target=target)
    return _EXE["k"]


def solve(x, residual, weight):
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    exe()(x, residual, weight, out, h)
    return out, h
