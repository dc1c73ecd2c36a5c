"""Static bypass of the functional-Enum rule: the Enum class called through a name of the file's own.

`_Checker._call` refuses the functional Enum API only when the callee is syntactically `enum.X` (or a class
statement of the file derived from one). `_E = enum.Enum` then `_E("_R", [(U + "reduce_ex" + U, f), ("a", 1)])`
(or `functools.partial(enum.Enum, "_R")(...)`, or `type(member)` of an empty enum) is the same call under a
plain local name, which `_enum_class` does not follow: the class gets a `__reduce_ex__` with no dunder in the
source, and `dataclasses.copy.copy(_R.a)` again applies attacker-chosen state to an attacker-chosen object from
copy.py's frame (session 21's route, rt_tirx_copy_reduce_json_clock). Here the state goes to a module reached as
an allowed attribute (`tvm.script`) only to show the write happens; any object the
file can name is a target (combined with a reference such as the one rt_tirx_lr_scheduler_dict_send gets, the
transport's `send`).

Observed on the CPU: check_source(..., "tirx") passes; importing the file in-process adds the global
`forged_by_candidate` to the tvm.script module.

Category: static
Expected: rule_violation/static
"""
import dataclasses
import enum

import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def fused(x_ptr: Tx.handle, r_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle, h_ptr: Tx.handle):
    M = Tx.int32()
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, N), "bfloat16")
    R = Tx.match_buffer(r_ptr, (M, N), "bfloat16")
    W = Tx.match_buffer(w_ptr, (N,), "bfloat16")
    Y = Tx.match_buffer(o_ptr, (M, N), "bfloat16")
    H = Tx.match_buffer(h_ptr, (M, N), "bfloat16")
    acc = Tx.alloc_buffer((1,), "float32")
    for i in Tx.serial(M):
        acc[0] = Tx.float32(0.0)
        for j in Tx.serial(N):
            H[i, j] = Tx.cast(Tx.cast(X[i, j], "float32") + Tx.cast(R[i, j], "float32"), "bfloat16")
            acc[0] = acc[0] + Tx.cast(H[i, j], "float32") * Tx.cast(H[i, j], "float32")
        acc[0] = Tx.rsqrt(acc[0] / Tx.cast(N, "float32") + Tx.float32(1e-5))
        for j in Tx.serial(N):
            Y[i, j] = Tx.cast(Tx.cast(H[i, j], "float32") * acc[0] * Tx.cast(W[j], "float32"), "bfloat16")


_EXE = {}


def exe():
    if "k" not in _EXE:
        _EXE["k"] = tvm.compile(fused, target="llvm", tir_pipeline="tirx")
    return _EXE["k"]


def solve(x, residual, weight):
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    exe()(x, residual, weight, out, h)
    return out, h


U = "_" + "_"
_TARGET = {}


def _give(*args):
    return _TARGET["obj"]


def _reduce(me, proto):
    return (_give, (), _TARGET["state"])


_E = enum.Enum
_R = _E("_R", [(U + "reduce_ex" + U, _reduce), (U + "copy" + U, None), ("a", 1)])


def write(obj, state):
    _TARGET["obj"] = obj
    _TARGET["state"] = state
    dataclasses.copy.copy(_R.a)


write(tvm.script, {"forged_by_candidate": True})
