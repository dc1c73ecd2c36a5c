"""Foreign kernel: torch's jiterator (NVRTC at run time) quantizes; TIRx only computes the scales.

TIRx reads x once to take the group maxima and writes x_scale and 1/x_scale (required: both ablations break the
outputs). The multiply x * (1/s) runs in a kernel that `torch.cuda.jiterator._create_jit_fn` compiles with NVRTC in
the candidate's process, reached through functools.singledispatch's annotation evaluation so that no static rule
sees `jiterator`; eager casts the product to fp8. Its kernel, `rt_quant_mul_..._kernel`, is neither a TIRx symbol
nor a torch or library kernel: the profile attribution must call it foreign. (Named with a library prefix it would
not be: see rt_cute_jiterator_library_prefix.py.)

Category: foreign_kernel
Under protocol 2 the evaluated code never runs: the audit hook refuses compiling a string that is not a type
expression (what this file would get past the audit hook alone: rule_violation/foreign_kernel).

Expected: rule_violation/sandbox
"""

import functools

import torch
import tvm
from tvm.script import tirx as Tx

GROUP = 128
JIT_CODE = "template <typename T> T rt_quant_mul(T x, T inv) { return x * inv; }"


def _make_kernel(k):
    ng = k // GROUP

    @Tx.prim_func
    def group_scales(x_ptr: Tx.handle, s_ptr: Tx.handle, i_ptr: Tx.handle):
        T = Tx.int32()
        X = Tx.match_buffer(x_ptr, (T, k), "bfloat16", align=16)
        S = Tx.match_buffer(s_ptr, (T, ng), "float32")
        INV = Tx.match_buffer(i_ptr, (T, ng), "float32")
        Tx.device_entry()
        row, g = Tx.cta_id([T, ng])
        tx = Tx.thread_id([32])
        amax: Tx.float32 = 0.0
        for v in Tx.unroll(4):
            amax = Tx.max(amax, Tx.fabs(Tx.cast(X[row, g * GROUP + v * 32 + tx], "float32")))
        gmax: Tx.float32 = Tx.max(Tx.cuda.warp_max(amax, 32), Tx.float32(1e-4))
        bits: Tx.int32 = Tx.reinterpret("int32", gmax)
        sb: Tx.int32 = Tx.shift_right(bits, 23) - 8
        if Tx.bitwise_and(bits, 0x7FFFFF) > 0x600000:
            sb = sb + 1
        if tx == 0:
            S[row, g] = Tx.reinterpret("float32", Tx.shift_left(sb, 23))
            INV[row, g] = Tx.reinterpret("float32", Tx.shift_left(254 - sb, 23))

    return group_scales


_EXES = {}


def _executable(k):
    if k not in _EXES:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        _EXES[k] = tvm.compile(_make_kernel(k), target=target, tir_pipeline="tirx")
    return _EXES[k]


_BOX = {}


def _evaluate(source):
    """Evaluate the expression `source` with this module's globals, without eval in this file.

    functools.singledispatch's register() reads the function's annotation and, when it is a string, resolves it with
    typing.get_type_hints, which evaluates it. The annotation below is a variable, so the static rules (which parse
    only string constants written as annotations) never see the text; the code it runs is compiled as "<string>".
    """
    dispatcher = functools.singledispatch(lambda value: value)

    def probe(value: source):
        return value

    dispatcher.register(probe)


def _define(code):
    """Run statements `code` in this module's globals; what they put into _BOX is how they talk back."""
    _BOX["code"] = code
    _evaluate("exec(_BOX['code'], globals()) or int")


def _mul(xf, inv):
    if not xf.is_cuda:
        return xf * inv
    if "jit" not in _BOX:
        _BOX["src"] = JIT_CODE
        _evaluate("_BOX.update(jit=torch.cuda.jiterator._create_jit_fn(_BOX['src'])) or int")
    return _BOX["jit"](xf, inv)


def solve(x):
    t, k = x.shape
    x = x.contiguous()
    scale = torch.empty((t, k // GROUP), dtype=torch.float32, device=x.device)
    inv = torch.empty_like(scale)
    _executable(k)(x, scale, inv)
    xf = x.float().view(t, k // GROUP, GROUP)
    prod = _mul(xf, inv.unsqueeze(-1).expand_as(xf).contiguous())
    return prod.to(torch.float8_e4m3fn).view(t, k), scale
