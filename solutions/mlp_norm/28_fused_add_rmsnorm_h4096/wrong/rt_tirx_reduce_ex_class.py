"""Lazy output: a torch.Tensor subclass whose __reduce_ex__ runs the real TIRx kernel when the harness serialises it.

`solve` launches the gold kernel on one row only (so the call counts as a TIRx launch and its time is tiny) and
returns the two outputs wrapped in `_Lazy`. The old grader's child pickled outputs (CUDA IPC through torch's
ForkingPickler) only after the timed window, and only on calls whose outputs it compared; pickling a subclass calls
its `__reduce_ex__`, which launches the full kernel and then hands over a plain tensor. Timed calls that were not
re-checked and every profiled call never materialised: forged end-to-end and GPU-only times, and a pass. With
launches suppressed (the ablation) the lazy launch is suppressed too, so the outputs break as they should.
The new static rules refuse a subclass of torch.Tensor and the dunder method; at run time the exact-type check
of outputs would refuse it too.

Category: lazy_output
Expected: rule_violation/static
"""

from torch.multiprocessing.reductions import reduce_tensor

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

_PENDING = {}


def _materialise(ptr):
    job = _PENDING.pop(ptr, None)
    if job is not None:
        n, x2, r2, w, out, h = job
        _PENDING.pop(h.data_ptr(), None)
        _PENDING.pop(out.data_ptr(), None)
        _executable(n)(x2, r2, w, out, h)


class _Lazy(torch.Tensor):
    def __reduce_ex__(self, protocol):
        plain = self.as_subclass(torch.Tensor)
        _materialise(plain.data_ptr())
        return reduce_tensor(plain)


def solve(x, residual, weight):
    """Return (out, residual_out) whose values appear only when they are serialised."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    r2 = residual.reshape(-1, n).contiguous()
    w = weight.contiguous()
    out = torch.empty_like(x2)
    h = torch.empty_like(x2)
    if x2.shape[0] == 0:
        return out.view(x.shape), h.view(x.shape)
    if not x2.is_cuda:  # the CPU dry run never pickles: be honest there
        _executable(n)(x2, r2, w, out, h)
        return out.view(x.shape), h.view(x.shape)
    _PENDING.clear()
    _executable(n)(x2[:1], r2[:1], w, out[:1], h[:1])
    job = (n, x2, r2, w, out, h)
    _PENDING[out.data_ptr()] = job
    _PENDING[h.data_ptr()] = job
    return out.view(x.shape).as_subclass(_Lazy), h.view(x.shape).as_subclass(_Lazy)
