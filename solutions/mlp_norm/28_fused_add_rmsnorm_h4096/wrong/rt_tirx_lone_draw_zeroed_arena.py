"""Told apart by the zeroed arena: one-draw requests (both ablations, the token audit, every per-unit ablation) find
the rest of the input arena all zero, row requests (correctness, timing, profile) never do; the DSL does the work
only in the former.

Problem 28 (fused add + RMSNorm), GPU (cuda target). Not run: no GPU in this session; reasoned from the code at HEAD.

Why the grader misses it. Since protocol 5 `Worker.place` zeroes the whole input arena before each request (hole
11), then writes the request's draws into `len(draws)` random slots and XORs every draw after the first with a keyed
stream. Every input the child hands `solve` is a view of that one arena tensor (`transport.unpack_value`), so
`x.untyped_storage()` spans all slots and `x.as_strided(...)` reads any of them with plain view ops (the row-batching
cheat used the same views). For problem 28 a draw is 238 MB and the 8 GB arena holds `slots = 4`:
- a row (`Child.row` / `Child.profile`, ROW = 4 draws) fills all four slots: the other three hold draws (masked noise
  or, for earlier calls, unmasked data) -> nonzero;
- a one-draw request (`Evaluation.call` / `_quiet_call`: `mode` suppress, randomize, audit, and
  `unit_ablation`'s `only=` calls) fills one slot: the other three are exactly zero.
A 4 KiB probe at the start of each other slot tells the two apart with certainty, before any launch. Every phase
that asks whether the DSL's values matter (suppress, randomise, the token audit including the XOR-pair and wider-type
forms, the per-unit ablation, the `token_producers` check that rides on it) runs only in one-draw requests, so here
they all see the honest gold TIRx kernel. Row calls compute the answer with the reference's own eager ops and hand it
to one TIRx unit, `copy_pad`, that copies it into the outputs PASSES times over (a token copy padded with memory
traffic so that it is >= 50 % of the profiled GPU time). What rows are still checked for is all satisfied:
- outputs bit-identical to the reference (checked draws pass);
- every call launches TIRx (`no_dsl_launch`), and the timed rows launch only `copy_pad`, which checked (correctness)
  and profiled rows launched too (`timed_units`);
- the profile sees library kernels (at::native, eager) and the DSL symbol `copy_pad`; no foreign kernel; the DSL
  share is copy_pad's time over the total, >= 50 % with PASSES chosen for it;
- the profile launches one unit only, so `unit_ablation` returns at once (`len(units) < 2`); with more units it
  would run in one-draw requests anyway, i.e. against the honest path;
- the end-to-end median is over the profiled GPU time (serial work), and the roofline bound is far below.
Verdict expected on the H200 at HEAD: passed, DSL share >= 50 %, with no DSL work the answer depends on in any
correctness, timed or profiled call. (This is not a speed forgery by itself: the time is eager + copy. It forges
the grader's claim "DSL launches required", and it is the enabling step for any problem where one torch library op
is more than 2x faster than the eager reference: then the reported speed-up is the library's, up to the 50 % share
padding, at zero DSL work.)

CPU check: `metakernel eval 28 --dsl tirx FILE --dry-run` (static rules, compile, trace) — CPU inputs are not in an
arena, so the honest path runs there. /tmp/rt_b/sim_lone_draw.py reproduces `Worker.place` on a CPU arena and shows
the probe reads True for every one-draw request and False for every call of every row (masked and unmasked).

Closed in session 22 (CPU-tested): the ablations and the audit send rows of four fresh draws like every other
request, their own call at every position of a row in turn (`Evaluation._focus`), so `lone_draw()` is False
everywhere and the audit, run on a call of the eager path, finds the answer handed to `copy_pad`.

Category: told_apart
Expected: rule_violation/dsl_token
"""

import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5
VEC = 8  # bf16 lanes per 16-byte access
ALIGN = 256  # transport.ALIGN
ROW = 4  # timing.ROW
PROBE = 2048  # elements read at the start of every other slot (4 KiB of bf16)
PASSES = 8  # copy_pad's passes over the answer: ~8 x 0.16 ms on the H200, above the eager part (~0.9 ms)
GRID, TPB = 1056, 256  # copy_pad: 8 CTAs per SM on 132 SMs, grid-stride


def _threads_for(n):
    for tpb in (256, 128, 64, 32):
        if n % (tpb * VEC) == 0:
            return tpb
    raise ValueError(f"hidden size {n} must be a multiple of {32 * VEC}")


def _make_kernel(n):
    """The gold kernel (solutions/mlp_norm/28_fused_add_rmsnorm_h4096/correct/tirx.py): run where it is ablated."""
    tpb = _threads_for(n)
    nv = n // (tpb * VEC)
    nw = tpb // 32

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
        hf = Tx.alloc_local((nv * VEC,), "float32")
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
        scratch = Tx.alloc_shared((nw,), "float32")
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


@Tx.prim_func
def copy_pad(a_ptr: Tx.handle, b_ptr: Tx.handle, c_ptr: Tx.handle, d_ptr: Tx.handle):
    """C = A, D = B (flat bf16), PASSES times over, each pass in a different order (no pass can be folded away; every
    pass writes the same values, so any interleaving leaves C = A and D = B)."""
    L = Tx.int32()
    A = Tx.match_buffer(a_ptr, (L,), "bfloat16")
    B = Tx.match_buffer(b_ptr, (L,), "bfloat16")
    C = Tx.match_buffer(c_ptr, (L,), "bfloat16")
    D = Tx.match_buffer(d_ptr, (L,), "bfloat16")
    Tx.device_entry()
    bx = Tx.cta_id([GRID])
    tx = Tx.thread_id([TPB])
    for p in range(PASSES):
        for it in range(Tx.ceildiv(L, GRID * TPB)):
            i: Tx.let = ((bx + p * 97) % GRID) * TPB + tx + it * (GRID * TPB)
            if i < L:
                C[i] = A[i]
                D[i] = B[i]


_EXES = {}


def _exe(key, make):
    if key not in _EXES:
        _EXES[key] = tvm.compile(make(), target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                 tir_pipeline="tirx")
    return _EXES[key]


def _aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def lone_draw(tensors, require_cuda=True):
    """True: this call's draw is alone in the arena (every other slot zero: a one-draw request, i.e. an ablation or
    the audit). False: other slots hold draws (a row). None: the inputs are not views of one arena (CPU, meta)."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not ts or (require_cuda and not all(t.is_cuda for t in ts)) or any(t.is_meta for t in ts):
        return None
    base = ts[0].untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() != base for t in ts):
        return None
    first = ts[0]
    es = first.element_size()
    slot = sum(_aligned(t.numel() * t.element_size()) for t in ts)  # transport.draw_bytes
    total = first.untyped_storage().nbytes()
    slots = min(ROW, total // slot)
    if slots < 2:
        return None
    own = first.storage_offset() * es // slot
    probes = []
    for k in range(slots):
        if k == own:
            continue
        probe = first.as_strided((PROBE,), (1,), k * slot // es)
        probes.append(probe.view(_INT_OF_SIZE[es]).ne(0).any())
    return not bool(torch.stack(probes).any().item())


def _honest(x2, r2, weight):
    n = x2.shape[-1]
    out = torch.empty_like(x2)
    h = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _exe(("rms", n), lambda: _make_kernel(n))(x2, r2, weight.contiguous(), out, h)
    return out, h


def _eager_then_copy(x2, r2, weight):
    """The reference's own ops (bit-identical), handed to one TIRx unit that only copies them (padded)."""
    h_e = x2 + r2
    hf = h_e.float()
    inv_rms = torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    out_e = (hf * inv_rms * weight.float()).to(x2.dtype)
    out = torch.empty_like(x2)
    h = torch.empty_like(x2)
    _exe("copy", lambda: copy_pad)(out_e.view(-1), h_e.view(-1), out.view(-1), h.view(-1))
    return out, h


def solve(x, residual, weight):
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    r2 = residual.reshape(-1, n).contiguous()
    if lone_draw([x, residual, weight]) is False:  # a row: correctness, timed or profiled
        out, h = _eager_then_copy(x2, r2, weight)
    else:  # one-draw request (ablation, audit, per-unit ablation), or not the GPU arena
        out, h = _honest(x2, r2, weight)
    return out.view(x.shape), h.view(x.shape)
