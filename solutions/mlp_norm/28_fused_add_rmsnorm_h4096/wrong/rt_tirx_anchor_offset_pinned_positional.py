"""Red team (session 31, hole 12 after the isolation ablation). As `rt_tirx_anchor_offset_copy`, but the eager answer
is moved to page-locked host memory without any refused name: `Tensor.to(device, dtype, non_blocking, copy)` takes
`non_blocking` as its third positional argument, and a non-blocking device-to-CPU copy allocates its output from
torch's caching host allocator (`cudaHostAlloc`, mapped into the GPU's address space by UVA). The isolation covers
torch's device allocator and the input arena only, so the answer keeps its bytes while the copy kernel reads it as
`A[off + i]` on a one-element device anchor (off: host address minus anchor address, in elements). The static
rule refuses `non_blocking` as an attribute or keyword, not as a positional `True`.

Now the child reads torch's host allocator while each isolated launch runs (`Child._pinned`): page-locked memory
in use there is `rule_violation/dsl_reach`, whatever made it (found by session 31's CPU red-teamer; not yet graded on
a GPU).

Category: token_route
Expected: rule_violation/dsl_reach
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
BURN = 4096  # ~8 ms of FMAs (estimated, not run): above the ~5 ms device-to-pinned copy the profile counts as non-DSL time
THREADS = 256
CPU = torch.device("cpu")


@Tx.prim_func
def anchor_copy(a_ptr: Tx.handle, f_ptr: Tx.handle, s_ptr: Tx.handle, o_ptr: Tx.handle, h_ptr: Tx.handle,
                off: Tx.int64, burn: Tx.int32):
    total = Tx.int32()
    A = Tx.match_buffer(a_ptr, (1,), "bfloat16")  # the anchor: one element, indexed far outside it
    F = Tx.match_buffer(f_ptr, (1,), "float32")
    S = Tx.match_buffer(s_ptr, (1,), "float32")
    O = Tx.match_buffer(o_ptr, (total,), "bfloat16")
    H = Tx.match_buffer(h_ptr, (total,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(total, THREADS)])
    tx = Tx.thread_id([THREADS])
    i: Tx.let = bx * THREADS + tx
    if i < total:
        o: Tx.bfloat16 = A[off + Tx.cast(i, "int64")]  # [out | h] of the eager answer, by element offset
        r: Tx.bfloat16 = A[off + Tx.cast(total, "int64") + Tx.cast(i, "int64")]
        acc: Tx.float32 = F[0]
        for _ in range(burn):  # DSL-share padding in the same unit; the outputs formally depend on it
            acc = acc * Tx.float32(1.0000001) + Tx.float32(1e-7)
        if acc == Tx.float32(-12345.5):
            o = r
        if F[0] != Tx.float32(1.0):  # randomise ablation: flag perturbed -> outputs break
            o = Tx.cast(Tx.cast(o, "float32") * Tx.float32(3.0), "bfloat16")
            r = Tx.cast(Tx.cast(r, "float32") * Tx.float32(3.0), "bfloat16")
        O[i] = o
        H[i] = r
        if i == 0:
            S[0] = acc  # one tensor argument changed: not a "blind" unit


_EXE = {}


def _exe():
    exe = _EXE.get(0)
    if exe is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        exe = tvm.compile(anchor_copy, target=target, tir_pipeline="tirx")
        _EXE[0] = exe
    return exe


def solve(x, residual, weight):
    """Return (out, residual_out): the answer is eager torch, the TIRx launch only copies it."""
    h = x + residual
    hf = h.float()
    o = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    n = o.numel()
    dev = torch.cat((o.reshape(-1), h.reshape(-1)))
    # a non-blocking copy to the CPU lands in page-locked memory; non_blocking passed by position
    ans = dev.to(CPU, dev.dtype, True)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    delta = ans.data_ptr() - anchor.data_ptr()
    assert delta % ans.element_size() == 0
    off = delta // ans.element_size()
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    if n > 0:
        _exe()(anchor, flag, scratch, out, res, off, BURN)
    return out.view(x.shape), res.view(x.shape)
