"""Told apart by the allocator poison: the work is done only on calls whose fresh output buffer holds the poison.

The gold TIRx kernel, plus a sniff. The old grader poisoned the allocator (0xFF / 0x7F bytes) only before the calls
whose outputs it compared (correctness draws, the ablation, the audit and three timing re-checks); every other
timed call and every profiled call handed out memory that still held the previous call's outputs. So `solve` reads
the first element of its freshly allocated output (one host sync) and, when it is not poison, launches the kernel
on one row only and returns the stale rest: forged end-to-end and GPU-only times with a clean verdict.
Against a grader that poisons every call the same way the sniff always sees poison; to still be a cheat there, it
also skips the work on every 0x7F-poisoned call after the first 60 (the old grader's re-checks all came earlier),
which a grader comparing a secret share of timed and profiled draws catches as stale outputs.
No forbidden name is used: only torch views and one `.item()`.
Protocol 6 (H100, f313622): the probe, larger than the poisoned blocks, met unpoisoned memory on the first row's
third call, so the sniff took its stale path there; the rows it left held the other pattern's 0xFF bytes (NaN in
bf16): wrong/nan where protocol 5 read 0x7F bytes (wrong/mismatch). Which pattern is met depends only on the
grader's own call sequence, never on the candidate.

Category: told_apart
Expected: wrong/nan
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

_CALLS = [0]


def _poisoned(nbytes, device):
    """Was the allocator just poisoned? The old grader freed a 2x-outputs block full of 0xFF / 0x7F right before a
    checked call; a fresh allocation of that size is that block (best fit), a stale one otherwise."""
    probe = torch.empty(2 * nbytes, dtype=torch.uint8, device=device)
    head, mid = (int(v) for v in probe[[0, nbytes]].tolist())
    del probe
    if head == mid == 0xFF:
        return True
    return head == mid == 0x7F and _CALLS[0] <= 60



def solve(x, residual, weight):
    """Return (out, residual_out): honestly on calls that look checked, stale otherwise."""
    _CALLS[0] += 1
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    r2 = residual.reshape(-1, n).contiguous()
    checked = not x2.is_cuda or x2.shape[0] < 2 or _poisoned(2 * x2.numel() * x2.element_size(), x2.device)
    out = torch.empty_like(x2)
    h = torch.empty_like(x2)
    if x2.shape[0] > 0:
        if checked:
            _executable(n)(x2, r2, weight.contiguous(), out, h)
        else:  # one launch so the call still counts as a TIRx call; rows 1.. keep what the allocator left there
            _executable(n)(x2[:1], r2[:1], weight.contiguous(), out[:1], h[:1])
    return out.view(x.shape), h.view(x.shape)
