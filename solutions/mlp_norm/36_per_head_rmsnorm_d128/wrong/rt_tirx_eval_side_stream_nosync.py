"""Timer tamper: the child's device-wide sync is neutered and the kernel runs on a side stream nobody waits for.

The gold TIRx kernel, launched on a side stream that `solve` leaves set as torch's C++ current stream (so the
harness's copy or IPC hand-over of the outputs is still ordered after the kernel, and the values stay right).
Code evaluated through functools.singledispatch (compiled as "<string>", so the audit hook's candidate-only
refusals of frame access do not apply) neuters what the harness synchronises with: the new child's bound
`self.b.sync`, found by walking the stack with sys._getframe, and, for the old child, `torch._C._cuda_synchronize`
plus `torch.cuda.current_stream` (the old child's bound Event.record looked both up by name). The bracket then
closes right after the launch: the reported time is host launch time only. The new child's Child.export_outputs
(a class attribute, reassigned without an audit event) is wrapped to wait for the side stream first, so the
copied outputs are complete. The GPU-only time the profiler
measures, or the roofline bound, must expose it.

Category: timer_tamper
Under protocol 2 the evaluated code never runs: the audit hook refuses compiling a string that is not a type
expression (what this file would get past the audit hook alone: rule_violation/implausible_time).

Expected: rule_violation/sandbox
"""

import functools

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-6
HEAD_DIM = 128
VEC = 8  # bf16 lanes per 16-byte access
LANES = HEAD_DIM // VEC  # 16 threads per head vector
TPB = 256
ROWS_PER_CTA = TPB // LANES  # 16


@Tx.prim_func
def head_rmsnorm(x_ptr: Tx.handle, w_ptr: Tx.handle, o_ptr: Tx.handle):
    M = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, HEAD_DIM), "bfloat16", align=16)
    W = Tx.match_buffer(w_ptr, (HEAD_DIM,), "bfloat16", align=16)
    Y = Tx.match_buffer(o_ptr, (M, HEAD_DIM), "bfloat16", align=16)
    Tx.device_entry()
    bx = Tx.cta_id([Tx.ceildiv(M, ROWS_PER_CTA)])
    tx = Tx.thread_id([TPB])
    xv = Tx.alloc_local((VEC,), "bfloat16")
    wv = Tx.alloc_local((VEC,), "bfloat16")
    ov = Tx.alloc_local((VEC,), "bfloat16")
    xf = Tx.alloc_local((VEC,), "float32")
    row: Tx.let = bx * ROWS_PER_CTA + tx // LANES
    col: Tx.let = (tx % LANES) * VEC
    for v in Tx.vectorized(VEC):
        wv[v] = W[col + v]
    for v in Tx.unroll(VEC):
        xv[v] = Tx.bfloat16(0.0)
    if row < M:
        for v in Tx.vectorized(VEC):
            xv[v] = X[row, col + v]
    sq: Tx.float32 = 0.0
    for v in Tx.unroll(VEC):
        xf[v] = Tx.cast(xv[v], "float32")
        sq = sq + xf[v] * xf[v]
    for s in Tx.unroll(4):  # xor offsets 8, 4, 2, 1: stays inside each 16-lane group
        sq = sq + Tx.tvm_warp_shuffle_xor(0xFFFFFFFF, sq, 8 >> s, 32, 32)
    inv_rms: Tx.float32 = Tx.rsqrt(sq / Tx.float32(HEAD_DIM) + Tx.float32(EPS))
    for v in Tx.unroll(VEC):
        ov[v] = Tx.cast(xf[v] * inv_rms * Tx.cast(wv[v], "float32"), "bfloat16")
    if row < M:
        for v in Tx.vectorized(VEC):
            Y[row, col + v] = ov[v]


_EXE = None


def _executable():
    global _EXE
    if _EXE is None:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        _EXE = tvm.compile(head_rmsnorm, target=target, tir_pipeline="tirx")
    return _EXE


def _norm(x, weight):
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"head_dim must be {HEAD_DIM}, got {x.shape[-1]}")
    x2 = x.contiguous().view(-1, HEAD_DIM)
    out = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _executable()(x2, weight.contiguous(), out)
    return out.view(x.shape)

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
NOSYNC = '''
import sys
import torch

def neuter_sync(side):
    done = []
    frame = sys._getframe(1)
    while frame is not None:  # the new child keeps its sync on a bound-callables object: self.b.sync
        me = frame.f_locals.get("self")
        bound = getattr(me, "b", None)
        if bound is not None and hasattr(bound, "sync"):
            bound.sync = lambda: None
            done.append("bound sync")
            cls = type(me)
            if hasattr(cls, "export_outputs"):  # outputs are copied out after the bracket: let the side stream
                original = cls.export_outputs   # finish first, so the values stay right and only the clock lies

                def export_outputs(self, *args, **kwargs):
                    side.synchronize()
                    return original(self, *args, **kwargs)

                cls.export_outputs = export_outputs
                done.append("export waits")
            break
        frame = frame.f_back
    torch._C._cuda_synchronize = lambda: None  # the old child's torch.cuda.synchronize calls this by name
    default = torch.cuda.default_stream
    torch.cuda.current_stream = lambda device=None: default(device)  # ... and its Event.record this one
    done.append("torch names")
    return done

_BOX["neuter"] = neuter_sync
_BOX["set_stream"] = torch.cuda.set_stream
'''

_STATE = {}


def solve(q, k, q_norm_weight, k_norm_weight):
    """Return (q_out, k_out), computed on a stream the harness no longer waits for."""
    if q.is_cuda:
        if "side" not in _STATE:
            _define(NOSYNC)
            _STATE["side"] = torch.cuda.Stream(device=q.device)
            _STATE["done"] = _BOX["neuter"](_STATE["side"])
        _BOX["set_stream"](_STATE["side"])
    return _norm(q, q_norm_weight), _norm(k, k_norm_weight)
