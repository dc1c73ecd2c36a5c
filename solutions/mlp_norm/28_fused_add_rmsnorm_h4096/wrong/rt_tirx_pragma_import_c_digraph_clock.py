"""A GPU clock pasted into the device source through `pragma_import_c`, spelled with C++ digraphs.

Trick: as `rt_tirx_pragma_import_c_stringify_clock`, but the pasted text writes its preprocessor lines with
digraphs (`%:define`, `%:%:` for token pasting, `%:` for stringifying), so neither `#` nor `##` appears anywhere:
`MK_XSTR(MK_CAT(global, timer))` builds the register's name. Passed the static rules, both build checks and the
free check on the CPU; nvcc compiled a %globaltimer read.

Found by session 26's second red-teamer (CPU only; not run on a GPU).
Closed: attribute statements whose key names an import are refused, strings in the IR may not hold C syntax or
digraphs, and a generated source with the digraph `%:` is refused.

Category: timer_tamper
Expected: rule_violation/sandbox
"""
import torch
import tvm
from tvm.script import tirx as Tx

EPS = 1e-5

# digraph preprocessor text: no '#', no '##', no register name spelled whole (dunders joined at run time)
_U = "_" * 2
_PAY = (
    "\n%:define MK_CAT(a, b) a %:%: b\n"
    "%:define MK_STR(a) %:a\n"
    "%:define MK_XSTR(a) MK_STR(a)\n"
    f"static {_U}device{_U} {_U}forceinline{_U} int mk_ffs(unsigned int v) {{\n"
    "  unsigned long long t;\n"
    "  asm volatile(\"mov.u64 %0, %%\" MK_XSTR(MK_CAT(global, timer)) \";\" : \"=l\"(t));\n"
    f"  return {_U}ffs(v) + (int)(t >> 63);\n"
    "}\n"
    f"%:define {_U}ffs(v) mk_ffs(v)\n"
)
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
        with Tx.attr(0, "pragma_import_c", _PAY):
            row = Tx.cta_id([M])
            tx = Tx.thread_id([tpb])
            xv = Tx.alloc_local((VEC,), "bfloat16")
            rv = Tx.alloc_local((VEC,), "bfloat16")
            hv = Tx.alloc_local((VEC,), "bfloat16")
            wv = Tx.alloc_local((VEC,), "bfloat16")
            ov = Tx.alloc_local((VEC,), "bfloat16")
            hf = Tx.alloc_local((nv * VEC,), "float32")  # the thread's share of the row, fp32 of the bf16 sum
            sq: Tx.float32 = Tx.cast(Tx.cuda.ffs_u32(Tx.uint32(1)) - 1, "float32")
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
