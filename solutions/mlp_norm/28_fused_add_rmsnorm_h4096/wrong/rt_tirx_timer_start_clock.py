"""A GPU wall clock under names the static rules allow: `Tx.cuda.timer_init` / `timer_start` / `timer_end`.

Problem 28, GPU (cuda target). Not run on a GPU (none in this session); the static check passes
(`check_source`: no violation) and `stamp` compiles for sm_90a with `%globaltimer` in its CUDA source (checked here).

The static rules refuse timers by attribute name (`clock`, `clock64`, `globaltimer`, `Event`, `elapsed_time`, `Timer`,
...), but TIRx's profiler intrinsics `Tx.cuda.timer_init`, `timer_start`, `timer_end`, `timer_finalize`
(tvm/backend/cuda/script.py, cpp/instrument.py) are not on the list, and `timer_start` / `timer_end` write
`%globaltimer_lo` (ns, tvm/backend/cuda/codegen/header.py `tvm_builtin_get_timestamp`) into a buffer the kernel is
handed. `solve` launches a one-thread `stamp` kernel beside its real work and reads the stamp back on its next call:
the GPU time since the previous call. That is the "split by timing" hole 10 names as open, made concrete: a row's
calls 2-4 follow the previous call within tens of microseconds (only the unmask in between), while the first call of
every request and every one-draw request follow the parent's pause (milliseconds); profiled calls carry the profiler's
per-launch overhead. It also hands the kernel its own duration, which the host gate (a probe right after the row) can
be steered by: a row that ran slow can be followed by cache-thrashing work that makes `probe_after` read >15 % slow,
so the gate drops it (a biased median). This file only records the clock (honest gold work otherwise); the cheats it
enables are those of hole 10 and the lone-draw file (rt_tirx_lone_draw_zeroed_arena.py).

Fix: refuse `timer_init`, `timer_start`, `timer_end`, `timer_finalize` (and any TIRx/CuTe intrinsic whose codegen
reads `%globaltimer`/`%clock`, found by grepping the DSLs' codegen for the special registers, not by name lists), or
check the generated PTX/cubin for `globaltimer`/`clock` reads before a kernel may launch.

Category: told_apart
Expected: rule_violation/static
"""

import enum

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




class _Ev(enum.Enum):
    CALL = 1


@Tx.prim_func
def stamp(buf_ptr: Tx.handle, tag_ptr: Tx.handle, off_ptr: Tx.handle):
    """buf[1 + block] <- (tag | event) and buf[...] <- globaltimer_lo (TVM's profiler record layout)."""
    P = Tx.match_buffer(buf_ptr, (64,), "uint64")
    G = Tx.match_buffer(tag_ptr, (1,), "uint64")
    O = Tx.match_buffer(off_ptr, (1,), "uint32")
    Tx.device_entry()
    bx = Tx.cta_id([1])
    tx = Tx.thread_id([32])
    Tx.cuda.timer_init(P.data, G.data, O.data, 1, 0)
    Tx.cuda.timer_start(_Ev.CALL, P.data, G.data, O.data, 1, tx == 0)


_CLOCK = {}


def solve(x, residual, weight):
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    r2 = residual.reshape(-1, n).contiguous()
    if x.is_cuda:
        if "buf" not in _CLOCK:
            _CLOCK["buf"] = torch.zeros(64, dtype=torch.uint64, device=x.device)
            _CLOCK["tag"] = torch.zeros(1, dtype=torch.uint64, device=x.device)
            _CLOCK["off"] = torch.zeros(1, dtype=torch.uint32, device=x.device)
        _exe("stamp", lambda: stamp)(_CLOCK["buf"], _CLOCK["tag"], _CLOCK["off"])
    out, h = _honest(x2, r2, weight)
    return out.view(x.shape), h.view(x.shape)
