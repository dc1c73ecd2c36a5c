"""A microsecond host clock through TVM's pass instrumentation: `tvm.ir.instrument.PassTimingInstrument`.

Primitive. `tvm.ir.transform.module_pass(fn)` wraps any Python callable as an IR pass; run inside
`tvm.ir.transform.PassContext(instruments=[PassTimingInstrument()])`, TVM's C++ timer brackets the pass, and
`render()` returns its duration in microseconds ("stopwatch: 289105us ..."). Whatever `fn` does is timed: a launch,
`torch.cuda.synchronize()`, the rest of `solve`. None of `ir`, `instrument`, `PassTimingInstrument`, `transform`,
`module_pass`, `PassContext`, `render` is refused (the timer patterns are Timer / timer_ / clock / perf_counter /
Event / elapsed_time / profil; "Timing" is none of them), the module is reached as an attribute of the allowed
`tvm.ir`, and running a pass raises no audit event. The reachability walks look for modules and for Python code
touching __dict__ / setattr / frames, not for clocks in C++.

What a clock gives here: the gate's audit mode syncs the device and clones every argument around each launch, so
a probe launch of a large argument takes far longer in the audit's focus call than anywhere else (and suppress
skips the launch: far shorter); the first call of a row (after the parent's pause) is told apart; the profiler's
per-op overhead tells profiled rows from timed ones. This file uses it like rt_tirx_gate_mode_probe (honest only
where the gate is not in "run"), with the clock in place of the allocator probe.

Observed (CPU grading at 83e160e, grader == fe59590): with REPORT = True the child raises at its 7th call with the
clock's readings of each call's probe launch: [32778, 49, 21, 11, 92, 14, 11] us (the first is the compile).
Closed the same session: the static rules refuse the pass infrastructure (`module_pass`, `PassContext`, ...) and
any name with "timing" or "instrument" in it.

Category: timer_tamper
Expected: rule_violation/static
"""
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


@Tx.prim_func
def copy_bf16(a_ptr: Tx.handle, b_ptr: Tx.handle):
    n = Tx.int32()
    A = Tx.match_buffer(a_ptr, (n,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (n,), "bfloat16")
    for i in Tx.serial(n):
        B[i] = A[i]


@Tx.prim_func
def probe(s_ptr: Tx.handle, d_ptr: Tx.handle):
    n = Tx.int32()
    S = Tx.match_buffer(s_ptr, (n,), "float32")
    D = Tx.match_buffer(d_ptr, (1,), "float32")
    D[0] = S[0]


_EXE = {}
PN = 4_000_000  # 16 MB: cloned twice by the audit, ~ms on any machine
REPORT = True  # raise with the clock's readings at call 7 (the observation); False: the cheat
_SEEN = []
_CLOCK = {}


def exe(name, f):
    if name not in _EXE:
        _EXE[name] = tvm.compile(f, target="llvm", tir_pipeline="tirx")
    return _EXE[name]


def _body(mod, ctx):
    _CLOCK["fn"]()
    return mod


_PASS = tvm.ir.transform.module_pass(_body, opt_level=0, name="stopwatch")


def stopwatch_us(fn):
    """Microseconds `fn()` takes, timed by TVM's pass timer."""
    timing = tvm.ir.instrument.PassTimingInstrument()
    _CLOCK["fn"] = fn
    with tvm.ir.transform.PassContext(instruments=[timing]):
        _PASS(tvm.IRModule({}))
        text = timing.render()
    return int(text.split(":")[1].split("us")[0])


_HELD = {}


def _probe_us(device):
    if "src" not in _HELD or _HELD["src"].device != device:
        _HELD["src"] = torch.zeros(PN, dtype=torch.float32, device=device)
        _HELD["dst"] = torch.zeros(1, dtype=torch.float32, device=device)
    return stopwatch_us(lambda: exe("probe", probe)(_HELD["src"], _HELD["dst"]))


def honest(x, residual, weight):
    out = torch.empty_like(x)
    h = torch.empty_like(x)
    exe("fused", fused)(x, residual, weight, out, h)
    return out, h


def solve(x, residual, weight):
    took = _probe_us(x.device)
    _SEEN.append(took)
    if REPORT and len(_SEEN) == 7:
        raise RuntimeError(f"probe launch, us per call: {_SEEN}")
    typical = sorted(_SEEN)[len(_SEEN) // 2]
    if REPORT or took > 4 * typical + 50 or took * 4 < typical:
        return honest(x, residual, weight)
    h = x + residual
    hf = h.float()
    eager = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    out = torch.empty_like(eager)
    exe("copy", copy_bf16)(eager.view(-1), out.view(-1))
    return out, h
