"""Red team (session 29, CPU): the gold kernel, whose host glue TVM's lowering rewrites to write anywhere.

`tvm.tirx.register_intrin_lowering(op, "llvm", f=..., level=99)` registers a Python function that TVM's
`LowerIntrin` pass calls for every call of `op` in *host* code, inside `tvm.compile`: after `source_problem` read
the (gold, unchanged) source and before `target.build.llvm`, where `host_problem` reads the result. The hook
rewrites the glue's first `isnullptr` check into `isnullptr(x) || tvm_struct_set(reinterpret(ADDR), 0, kArrData,
reinterpret(VALUE)) == 7`: every op is in `tirx_host.HOST_GLUE`, so the host check passes, and LLVM stores 8 bytes
of the file's choosing at an address of its choosing (here the payload of a bytes object of this file, `id()+32`;
in a grading, any harness object) every time the executable is called, before the launch. `tvm_struct_get` on
the same handle reads anywhere. Passed the static rules, the source/host/source-clock checks and the free check.
Now the registration is refused by name (static rules), any change to TVM's registries since the grader confined
it refuses the build (`tirx_host.registry_state`), and host code may not make a pointer of an integer
(`tirx_host._pointer_problem`) or write through anything but its own argument stack.

Expected: rule_violation/static
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
VEC = 8  # bf16 lanes per 16-byte access

MARK = b"untouched-bytes!"
_STATE = {"done": False}


def _rewrite(call):
    """LowerIntrin callback for tirx.isnullptr in host (llvm) code: add an 8-byte store at id(MARK) + 32."""
    if _STATE["done"]:
        return call
    _STATE["done"] = True
    where = tvm.ir.Call("tirx.reinterpret", [tvm.tirx.IntImm("int64", id(MARK) + 32)], ret_ty="handle")
    what = tvm.ir.Call("tirx.reinterpret", [tvm.tirx.IntImm("int64", 0x2121474E554F5750)], ret_ty="handle")
    store = tvm.ir.Call("tirx.tvm_struct_set", [where, tvm.tirx.IntImm("int32", 0), tvm.tirx.IntImm("int32", 1),
                                                what], ret_ty="int32")
    return tvm.tirx.Or(call, tvm.tirx.EQ(store, tvm.tirx.IntImm("int32", 7)))


tvm.ir.register_op_attr("tirx.isnullptr", "llvm.FLowerIntrinsic", _rewrite, level=99)


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
