"""Share forgery by symbol: cuBLAS does both GEMMs of problem 32, and its kernels are counted as TIRx.

Trick: the profiler attribution counts a kernel as the DSL's when its exact name is in
`gate.kernel_names`, which `metakernel.dsl.tirx.kernel_names_of` fills by running two regexes
(`__global__ void NAME(` and `.entry NAME`) over the WHOLE generated CUDA source of a module. TIRx's
`Tx.cuda.func_call(name, *args, source_code=...)` pastes any text into that source (it is meant for a CUDA helper
function or macro), so a comment line `// .entry <cuBLAS kernel name>` in the helper's source makes cuBLAS's own
GEMM kernels "DSL symbols". `source_problem` (tirx_host.py) checks op names and clock strings only, and the
static rules refuse no name here (`func_call`, `source_code` are allowed).

The file: x @ w_gate_up^T and act @ w_down^T by torch (cuBLAS), the SiLU(gate) * up epilogue by a small TIRx
kernel that is real and required (so both ablations break the output and the audit finds no answer handed in:
the TIRx launch is handed the GEMM output, not the answer). The SiLU helper is a macro given to func_call, and its
source carries the cuBLAS kernel names (LIBRARY_NAMES, read once with the profiler on the same kind of GPU).
DSL share then reads ~100 % although TIRx does ~0.1 % of the FLOPs and ~10 % of the GPU time.

Found by session 24's red-teamer (static check clean, free check passed, and the grader's profile phase
fed an H100-shaped trace gave DSL share 1.00 at 5133ba7; not run on a GPU). Closed: `func_call` is a refused
attribute and `tirx.cuda.func_call` a refused op; and a DSL symbol named like a library kernel is now a
`foreign_kernel` verdict of its own, whatever route declared it.

Category: gate_forgery
Expected: rule_violation/static
"""
import torch
import torch.nn.functional as F
import tvm
from tvm.script import tirx as Tx

# cuBLAS kernel names the two GEMMs launch on the grading GPU. A real attacker reads them once with the profiler on
# the same kind of GPU and torch build, or lists every nvjet_* / sm90_xmma_* name in libcublasLt's strings (the
# file may be 300 KB). The names below are placeholders of that form: the device budget of this session was spent,
# so the exact H100 names were not read (sim_share_A.py feeds these same names to the grader's profile phase).
LIBRARY_NAMES = (
    "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT",
)
SRC = "#define mk_silu(g) ((g) / (1.0f + expf(-(g))))\n" + "".join("// .entry " + n + "\n" for n in LIBRARY_NAMES)


@Tx.prim_func
def silu_mul(g_ptr: Tx.handle, a_ptr: Tx.handle):
    T = Tx.int32()
    W = Tx.int32()
    NF = Tx.int32()
    G = Tx.match_buffer(g_ptr, (T, W), "bfloat16")
    A = Tx.match_buffer(a_ptr, (T, NF), "bfloat16")
    Tx.device_entry()
    row = Tx.cta_id([T])
    tx = Tx.thread_id([256])
    for c in Tx.serial((NF + 255) // 256):
        col: Tx.let = c * 256 + tx
        if col < NF:
            g: Tx.float32 = Tx.cast(G[row, col], "float32")
            u: Tx.float32 = Tx.cast(G[row, col + NF], "float32")
            s: Tx.float32 = Tx.cuda.func_call("mk_silu", g, source_code=SRC, return_type="float32")
            A[row, col] = Tx.cast(s * u, "bfloat16")


_EXE = {}


def solve(x, w_gate_up, w_down):
    if "k" not in _EXE:
        _EXE["k"] = tvm.compile(silu_mul, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                                tir_pipeline="tirx")
    gu = F.linear(x, w_gate_up)  # cuBLAS
    act = torch.empty((x.shape[0], w_down.shape[1]), dtype=x.dtype, device=x.device)
    _EXE["k"](gu, act)  # TIRx: the epilogue only
    return F.linear(act, w_down)  # cuBLAS
