"""Told apart: timed calls run the eager reference (cuBLAS GEMMs) and launch no TIRx kernel; checked calls run TIRx.

`Evaluation.timing` (evaluate.py, the `one()` closure) checks a sample of the timed outputs but never looks at the
timed replies' `launches` or `units`: whether the DSL ran, the kernel attribution, the DSL share and the ablations
all come from the correctness, ablation and audit requests (one draw each) and the profile requests
(PROFILE_CHUNK = 3 draws each), while a timed request carries TIMED_CHUNK = 4 draws. Every input `solve` receives
is a view of the child's one input arena tensor (`transport.unpack_value`; `Worker.place` puts draw k at
k * in_slot), so `x.storage_offset() == 0` marks the first call of a request, and the calls counted between two
offset-0 calls give the size of the previous request (after the layout is checked: all three inputs on the same
storage, contiguous, at the aligned offsets `transport.place` uses). A request whose predecessor had 4 calls is
taken to be timed: from the second timing warm-up request on, every call computes F.linear / silu / F.linear
exactly as the reference does (so it matches the comparator bit for bit, whatever the sampled recheck) and
launches nothing of TIRx. Every other request runs the honest TIRx gold kernel (two tensor-core GEMMs, SwiGLU fused
into the first), so correctness, ablations, audit and the DSL share (at least 90 % of the profiled time: only the
first profile request, whose predecessor was timed, runs eager, 3 of the 24-48 profiled draws) all see the gold
kernel. CPU and meta inputs (the free check's dry run and full-scale trace) always take the honest path. The
reported end-to-end time is cuBLAS's (about 2x faster than this TIRx gold on the H200): a forged speed-up with
every output correct.

On the H200 at aa838d1 (protocol 3) it was rejected, but only as implausible_time: its cuBLAS timed median (2638
us) fell under 0.8 x the TIRx GPU time the profile measured (4861 us); a DSL path within 20 % of the library's
would have passed. Since protocol 4 every phase sends rows of four and every call must launch the DSL, so the
second correctness row (its predecessor had 4 calls) takes the eager path: rule_violation/no_dsl_launch. That check alone would
still not catch the stronger variant: a trivial TIRx launch (one tiny kernel, e.g. copying a few bytes, or the
gate/up kernel on a single 128-row tile) beside the eager cuBLAS work in timed calls, so that `launches` is
non-zero and even the same unit names appear. The next fix needs the timed calls' own DSL share (or their launched
units' GPU time, sampled with the profiler on random timed requests), not just the presence of a launch.

Category: told_apart
Expected: rule_violation/no_dsl_launch
"""

import torch
import torch.nn.functional as F
import tvm
from tvm.script import tirx as Tx

BM, BN, BK = 128, 128, 32  # CTA tile; the K slice one pipeline stage holds
WM, WN = 64, 32  # warp tile: 8 warps as 2 (M) x 4 (N)
MI, NJ = WM // 16, WN // 8  # per warp 4 x 4 mma tiles of m16 x n8
NS, PAD, NT = 3, 8, 256  # pipeline stages; shared row padding (bf16); threads
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
LDSM = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
CP16 = "cp.async.cg.shared.global"


def _make_gemm(n_out, k, swiglu):
    """C [M, n_out] = A [M, k] @ B^T. swiglu: B = w_gate_up [2 n_out, k] and C = bf16(SiLU(gate) * up), 64 output
    columns per CTA; else B [n_out, k], 128 output columns per CTA."""
    cols = BN // 2 if swiglu else BN  # output columns per CTA
    n_b = 2 * n_out if swiglu else n_out

    @Tx.prim_func
    def gemm(a_ptr: Tx.handle, b_ptr: Tx.handle, c_ptr: Tx.handle):
        M = Tx.int32()
        A = Tx.match_buffer(a_ptr, (M, k), "bfloat16", align=16)
        B = Tx.match_buffer(b_ptr, (n_b, k), "bfloat16", align=16)
        C = Tx.match_buffer(c_ptr, (M, n_out), "bfloat16", align=16)
        Tx.device_entry()
        bm, bn = Tx.cta_id([Tx.ceildiv(M, BM), n_out // cols])
        tid = Tx.thread_id([NT])
        S = Tx.alloc_buffer((NS, BM + BN, BK + PAD), "bfloat16", scope="shared.dyn")  # per stage: A rows, B rows
        af = Tx.alloc_local((MI, 4), "uint32")
        bf = Tx.alloc_local((NJ, 2), "uint32")
        acc = Tx.alloc_local((MI, NJ, 4), "float32")
        out = Tx.alloc_local((2,), "bfloat16")
        lane: Tx.let = tid % 32
        wm: Tx.let = tid // 32 // (BN // WN)
        wn: Tx.let = tid // 32 % (BN // WN)

        @Tx.inline
        def load_stage(kt, s):  # K slice kt of the A and B tiles into stage s: 2 + 2 cp.async of 16 bytes per thread
            for c in Tx.unroll(BM * BK // 8 // NT):
                r: Tx.let = (tid + c * NT) // (BK // 8)
                k8: Tx.let = (tid + c * NT) % (BK // 8) * 8
                a_row: Tx.let = Tx.min(bm * BM + r, M - 1)  # rows past M load a valid row, never stored
                if swiglu:
                    b_row: Tx.let = (r // 16 % 2) * n_out + bn * cols + r // 32 * 16 + r % 16
                    Tx.ptx[CP16](S.ptr_to([s, BM + r, k8]), B.ptr_to([b_row, kt * BK + k8]), 16)
                else:
                    Tx.ptx[CP16](S.ptr_to([s, BM + r, k8]), B.ptr_to([bn * BN + r, kt * BK + k8]), 16)
                Tx.ptx[CP16](S.ptr_to([s, r, k8]), A.ptr_to([a_row, kt * BK + k8]), 16)

        for i in Tx.unroll(MI):
            for j in Tx.unroll(NJ):
                for v in Tx.unroll(4):
                    acc[i, j, v] = Tx.float32(0.0)
        for s in range(NS - 1):
            load_stage(s, s)
            Tx.ptx["cp.async.commit_group"]()
        for kt in range(k // BK):
            Tx.ptx["cp.async.wait_group"](NS - 2)  # this thread's copies of slice kt have landed
            Tx.cuda.cta_sync()  # everyone's have; everyone is done reading slice kt - 1
            if kt + NS - 1 < k // BK:
                load_stage(kt + NS - 1, (kt + NS - 1) % NS)  # refill the stage slice kt - 1 used
            Tx.ptx["cp.async.commit_group"]()  # every iteration, even empty: wait_group counts groups
            s: Tx.let = kt % NS
            for kk in Tx.unroll(BK // 16):
                for i in Tx.unroll(MI):
                    Tx.ptx[LDSM](af[i, 0], af[i, 1], af[i, 2], af[i, 3],
                                 S.ptr_to([s, wm * WM + i * 16 + lane % 16, kk * 16 + lane // 16 * 8]))
                for p in Tx.unroll(NJ // 2):
                    Tx.ptx[LDSM](bf[2 * p, 0], bf[2 * p, 1], bf[2 * p + 1, 0], bf[2 * p + 1, 1],
                                 S.ptr_to([s, BM + wn * WN + p * 16 + lane // 16 * 8 + lane % 8,
                                           kk * 16 + lane // 8 % 2 * 8]))
                for i in Tx.unroll(MI):
                    for j in Tx.unroll(NJ):
                        Tx.ptx[MMA](acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3],
                                    af[i, 0], af[i, 1], af[i, 2], af[i, 3], bf[j, 0], bf[j, 1],
                                    acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
        # acc[i, j, 2h + e] is row 16 i + 8 h + lane // 4, column 8 j + 2 (lane % 4) + e of the warp tile
        for i in Tx.unroll(MI):
            for h in Tx.unroll(2):
                row: Tx.let = bm * BM + wm * WM + i * 16 + h * 8 + lane // 4
                if swiglu:
                    for j in Tx.unroll(NJ // 2):  # tile j: gate, tile j + NJ/2: the matching up columns
                        for e in Tx.unroll(2):
                            g: Tx.float32 = Tx.cast(Tx.cast(acc[i, j, 2 * h + e], "bfloat16"), "float32")
                            u: Tx.float32 = Tx.cast(Tx.cast(acc[i, j + NJ // 2, 2 * h + e], "bfloat16"), "float32")
                            out[e] = Tx.cast(g / (Tx.float32(1.0) + Tx.exp(-g)) * u, "bfloat16")
                        col: Tx.let = bn * cols + wn * (WN // 2) + j * 8 + lane % 4 * 2
                        if row < M:
                            for e in Tx.vectorized(2):
                                C[row, col + e] = out[e]
                else:
                    for j in Tx.unroll(NJ):
                        for e in Tx.unroll(2):
                            out[e] = Tx.cast(acc[i, j, 2 * h + e], "bfloat16")
                        col: Tx.let = bn * BN + wn * WN + j * 8 + lane % 4 * 2
                        if row < M:
                            for e in Tx.vectorized(2):
                                C[row, col + e] = out[e]

    return gemm


_EXES = {}


def _executables(d, f):
    key = (d, f)
    if key not in _EXES:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
        _EXES[key] = (tvm.compile(_make_gemm(f, d, True), target=target, tir_pipeline="tirx"),
                      tvm.compile(_make_gemm(d, f, False), target=target, tir_pipeline="tirx"))
    return _EXES[key]


def _honest(x, w_gate_up, w_down):
    """Return bf16 out [T, d] = (bf16(SiLU(gate) * up)) @ w_down^T with gate, up = x @ w_gate_up^T."""
    t, d = x.shape
    f = w_down.shape[1]
    if d % BN or d % BK or f % (BN // 2) or f % BK or min(d, f) < (NS - 1) * BK or w_gate_up.shape[0] != 2 * f:
        raise ValueError(f"unsupported sizes d = {d}, f = {f}")
    gate_up, down = _executables(d, f)
    act = torch.empty((t, f), dtype=x.dtype, device=x.device)
    out = torch.empty((t, d), dtype=x.dtype, device=x.device)
    gate_up(x.contiguous(), w_gate_up.contiguous(), act)
    down(act, w_down.contiguous(), out)
    return out


ALIGN = 256  # transport.ALIGN: every arena tensor starts at a multiple of it
TIMED_CHUNK = 4  # timing.TIMED_CHUNK: draws per timed request (correctness / ablation / audit: 1, profile: 3)
_SEEN = {"calls": 0, "previous": 0, "eager": False}  # calls since the last offset-0 call; the request before; path


def _aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _nbytes(t):
    return t.numel() * t.element_size()


def _arena_layout(x, w_gate_up, w_down):
    """Whether the three inputs sit in one storage as `transport.place` lays out a draw (x first, then aligned)."""
    base = x.untyped_storage().data_ptr()
    if w_gate_up.untyped_storage().data_ptr() != base or w_down.untyped_storage().data_ptr() != base:
        return False
    if not (x.is_contiguous() and w_gate_up.is_contiguous() and w_down.is_contiguous()):
        return False
    x_at = x.storage_offset() * x.element_size()
    g_at = w_gate_up.storage_offset() * w_gate_up.element_size()
    d_at = w_down.storage_offset() * w_down.element_size()
    return x_at % ALIGN == 0 and g_at == x_at + _aligned(_nbytes(x)) and d_at == g_at + _aligned(_nbytes(w_gate_up))


def _eager(x, w_gate_up, w_down):
    """The reference's own ops (cuBLAS GEMMs): bit-identical to what the comparator computes."""
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    acc = torch.promote_types(x.dtype, torch.float32)
    act = (F.silu(gate.to(acc)) * up.to(acc)).to(x.dtype)
    return F.linear(act, w_down)


def solve(x, w_gate_up, w_down):
    """SwiGLU MLP: TIRx, except in a request that follows a 4-draw (timed) request, where the eager ops run."""
    if not (x.is_cuda and w_gate_up.is_cuda and w_down.is_cuda) or not _arena_layout(x, w_gate_up, w_down):
        return _honest(x, w_gate_up, w_down)  # CPU / meta (dry run, trace) or an unknown layout
    if x.storage_offset() == 0:  # first call of a request: the previous one is complete
        _SEEN["previous"] = _SEEN["calls"]
        _SEEN["calls"] = 1
        _SEEN["eager"] = _SEEN["previous"] == TIMED_CHUNK
    else:
        _SEEN["calls"] = _SEEN["calls"] + 1
    if _SEEN["eager"]:
        return _eager(x, w_gate_up, w_down)
    return _honest(x, w_gate_up, w_down)
