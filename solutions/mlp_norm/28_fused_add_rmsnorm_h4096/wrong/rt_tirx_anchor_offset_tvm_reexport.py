"""Red team (session 31, second CPU round, hole 12: the static rule on TVM's tensors, by another spelling). As
`rt_tirx_anchor_offset_tvm_tensor`, but TVM's tensor and device are reached through the `tvm` module that
`tvm.ir.expr` re-exports: `tvm.ir.expr.tvm.runtime.tensor(host, tvm.ir.expr.tvm.cuda(0))`. The rule that refuses
`tensor`, `empty`, `cuda`, `device`, ... applies only where the chain IS `tvm` or `tvm.runtime`
(`_attribute_reason`: `origin.path in ("tvm", "tvm.runtime")`); here the chains are `tvm.ir.expr.tvm` and
`tvm.ir.expr.tvm.runtime`, and `.tvm` itself is no refused attribute (only `.torch` is, among the allowlisted
roots). The module-as-value rule does not fire either: no module is bound to a name.
The answer ([out | h], bf16 viewed as int16 for NumPy) goes to the host and back into memory of TVM's own allocator
(cudaMalloc through TVM's CUDA device API), which the isolation never overwrites; the copy kernel reads it as
`A[off + i]` on a one-element torch anchor, as before.

Now (session 31): `.tvm` and `.cutlass` are refused as attributes, as `.torch` is: a DSL package is reached only
from its own import.

Category: token_route
Expected: rule_violation/static
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
BURN = 32768  # ~64 ms of FMAs (estimated, not run): above the two pageable 238 MB copies (non-DSL time in the profile)
THREADS = 256


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
    host = torch.cat((o.reshape(-1), h.reshape(-1))).view(torch.int16).cpu()
    dev = tvm.ir.expr.tvm.cuda(0) if x.is_cuda else tvm.ir.expr.tvm.cpu(0)  # `tvm`, re-exported by tvm.ir.expr
    ans = tvm.ir.expr.tvm.runtime.tensor(host, dev)  # TVM's allocator; filled inside TVM (np.asarray + its own copy)
    anchor = torch.zeros(1, dtype=x.dtype, device=x.device)
    delta = ans.data_ptr() - anchor.data_ptr()
    assert delta % 2 == 0
    off = delta // 2
    flag = torch.ones(1, dtype=torch.float32, device=x.device)
    scratch = torch.zeros(1, dtype=torch.float32, device=x.device)
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    res = torch.empty(n, dtype=x.dtype, device=x.device)
    if n > 0:
        _exe()(anchor, flag, scratch, out, res, off, BURN)
    return out.view(x.shape), res.view(x.shape)
