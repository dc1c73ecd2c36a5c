"""Measure on the GPU the accuracy claims of docs/guides/cute-notes.md and tirx-notes.md (and their shared memory).

The notes' "Fast math ..." tables and shared-memory limits are this script's H200 figures (the PTX ISA's bounds,
e.g. tanh.approx.f32 about 2^-11, are not what the hardware does; tests/test_docs_notes.py ties the notes to
validation/h200-notes-accuracy.json). It measures, per DSL and per spelling the notes use, the
error of each function on 2^22 random fp32 inputs against the float64 torch result: max absolute, max relative
(where |ref| > 1e-30), max and mean error in fp32 ulps, mean absolute, and after rounding both to bf16 the max
difference in bf16 ulps and the share of values that round differently ("fine for a value rounded to bf16 next").
"div_tiny" divides into the subnormal range (are denormals flushed to zero?). It launches one kernel per size with
96, 160, 200, 227 (the notes' ceiling) and 228 KB (to be refused) of dynamic shared memory (CuTe SmemAllocator,
TIRx shared.dyn) and checks its output exactly, and times default against approximate tanh (CUDA events, median
of --iters; 1 and 64 chained tanh per value).

    python3 scripts/check_notes_accuracy.py [--out validation/h200-notes-accuracy.json] [--iters 50]
    python3 scripts/check_notes_accuracy.py --compile-only   (CPU: compile every kernel for sm_90a, no GPU)

Each DSL runs in a child process of its own (as the grader keeps them apart); every case is isolated and the
JSON (schema metakernel.notes-accuracy/1) is rewritten after each one. Without CUDA the script exits with status 2
unless --compile-only is given, which exits 0 when every kernel compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, cast

import torch  # before tvm (the TIRx adapter's order)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "scripts"))

from check_guide_gemm import median_ms  # noqa: E402  (the project's CUDA-event timing)

from metakernel.jsonio import write_json_atomic  # noqa: E402

SCHEMA = "metakernel.notes-accuracy/1"
N = 1 << 22
BLOCK = 256
TIME_REPEAT = 64
SMEM_KB = (96, 160, 200, 227, 228)  # 227 KB = 232448 bytes, the sm_90a ceiling per block; 228 KB must be refused
KB = 1024

#: input name -> (low, high) of x, drawn uniformly; "b" (divisor / reciprocal argument) is +-10^U[-2, 2].
INPUTS = {"tanh": (-10.0, 10.0), "exp": (-80.0, 80.0), "exp2": (-100.0, 100.0), "act": (-10.0, 10.0),
          "div": (-10.0, 10.0), "div_tiny": (2e-38, 4e-38)}
#: reference (float64 torch) per function
REFS = {
    "exp": lambda a, b: a.exp(), "exp2": lambda a, b: a.exp2(), "tanh": lambda a, b: a.tanh(),
    "div": lambda a, b: a / b, "rcp": lambda a, b: 1.0 / b, "silu": lambda a, b: a * a.sigmoid(),
    "sigmoid": lambda a, b: a.sigmoid(),
    "gelu_tanh": lambda a, b: 0.5 * a * (1.0 + (0.7978845608028654 * (a + 0.044715 * a**3)).tanh()),
}
#: dsl -> [(case, spelling, reference, input)]; the kernel variant is the case without "_tiny". Spellings are the
#: notes' own (sigmoid is 1 / (1 + exp(-x)), SiLU x / (1 + exp(-x))).
CASES = {
    "cute": [
        ("exp", "cute.math.exp(x)", "exp", "exp"),
        ("exp_fastmath", "cute.math.exp(x, fastmath=True)", "exp", "exp"),
        ("exp2", "cute.math.exp2(x)", "exp2", "exp2"),
        ("tanh", "cute.math.tanh(x)", "tanh", "tanh"),
        ("tanh_approx", "cute.math.tanh(x, approx=True)", "tanh", "tanh"),
        ("div", "a / b", "div", "div"),
        ("div_tiny", "a / b (subnormal results)", "div", "div_tiny"),
        ("rcp_approx", "cute.arch.rcp_approx(b)", "rcp", "div"),
        ("silu", "x / (1.0 + cute.math.exp(-x))", "silu", "act"),
        ("sigmoid", "1.0 / (1.0 + cute.math.exp(-x))", "sigmoid", "act"),
        ("gelu_tanh", "the note's gelu_tanh_kernel (cute.math.tanh(inner, approx=True))", "gelu_tanh", "act"),
    ],
    "tirx": [
        ("exp", "Tx.exp(x)", "exp", "exp"),
        ("ptx_ex2", 'Tx.ptx["ex2.approx.f32"](r[0], x)', "exp2", "exp2"),
        ("tanh", "Tx.tanh(x)", "tanh", "tanh"),
        ("ptx_tanh", 'Tx.ptx["tanh.approx.f32"](r[0], x)', "tanh", "tanh"),
        ("div", "a / b", "div", "div"),
        ("div_tiny", "a / b (subnormal results)", "div", "div_tiny"),
        ("ptx_div_rn", 'Tx.ptx["div.rn.f32"](r[0], a, b)', "div", "div"),
        ("ptx_div_rn_tiny", 'Tx.ptx["div.rn.f32"](r[0], a, b) (subnormal results)', "div", "div_tiny"),
        ("ptx_rcp", 'Tx.ptx["rcp.approx.f32"](r[0], b)', "rcp", "div"),
        ("silu", "x / (1.0 + Tx.exp(-x))", "silu", "act"),
        ("sigmoid", "1.0 / (1.0 + Tx.exp(-x))", "sigmoid", "act"),
    ],
}
TIMED = {"cute": ("tanh", "tanh_approx"), "tirx": ("tanh", "ptx_tanh")}

cutlass = cute = Tx = tvm = cast(Any, None)  # the child of each DSL imports its own (see _import_dsl)


# --------------------------------------------------------------------------- kernels (CuTe DSL)
def cute_elementwise(variant: str, repeat: int = 1):
    """y[i] = f(a[i], b[i]) for one function of the note, applied `repeat` times (chained) for timing."""

    @cute.kernel
    def kernel(mA: cute.Tensor, mB: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * BLOCK + tidx
        x = mA[i]
        b = mB[i]
        for _ in cutlass.range_constexpr(repeat):
            if cutlass.const_expr(variant == "exp"):
                x = cute.math.exp(x)
            elif cutlass.const_expr(variant == "exp_fastmath"):
                x = cute.math.exp(x, fastmath=True)
            elif cutlass.const_expr(variant == "exp2"):
                x = cute.math.exp2(x)
            elif cutlass.const_expr(variant == "tanh"):
                x = cute.math.tanh(x)
            elif cutlass.const_expr(variant == "tanh_approx"):
                x = cute.math.tanh(x, approx=True)
            elif cutlass.const_expr(variant == "div"):
                x = x / b
            elif cutlass.const_expr(variant == "rcp_approx"):
                x = cute.arch.rcp_approx(b)
            elif cutlass.const_expr(variant == "silu"):
                x = x / (1.0 + cute.math.exp(-x))
            elif cutlass.const_expr(variant == "sigmoid"):
                x = 1.0 / (1.0 + cute.math.exp(-x))
            else:  # gelu_tanh, the note's snippet
                inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
                x = 0.5 * x * (1.0 + cute.math.tanh(inner, approx=True))
        mY[i] = x

    @cute.jit
    def launch(mA: cute.Tensor, mB: cute.Tensor, mY: cute.Tensor, stream):
        kernel(mA, mB, mY).launch(grid=(mA.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return _cute_compile(launch, N, N, N)


def cute_stage(tile: int):
    """The note's SmemAllocator staging: x into one dynamic shared buffer of `tile` fp32, out reversed."""

    @cute.kernel
    def kernel(mX: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_tensor(cutlass.Float32, cute.make_layout(tile), byte_alignment=16)
        for j in cutlass.range(tidx, tile, BLOCK):
            buf[j] = mX[j]
        cute.arch.barrier()
        for j in cutlass.range(tidx, tile, BLOCK):
            mY[j] = buf[tile - 1 - j]

    @cute.jit
    def launch(mX: cute.Tensor, mY: cute.Tensor, stream):
        kernel(mX, mY).launch(grid=(1, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    return _cute_compile(launch, tile, tile)


def _cute_compile(launch, *sizes: int):
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    fakes = [make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16) for n in sizes]
    return cute.compile(launch, *fakes, make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")


# --------------------------------------------------------------------------- kernels (TIRx)
def tirx_elementwise(variant: str, repeat: int = 1):
    """The same for TIRx; `variant` and `repeat` are Python constants, so the parser keeps one branch."""

    @Tx.prim_func
    def kernel(a_ptr: Tx.handle, b_ptr: Tx.handle, y_ptr: Tx.handle):
        A = Tx.match_buffer(a_ptr, (N,), "float32")
        B = Tx.match_buffer(b_ptr, (N,), "float32")
        Y = Tx.match_buffer(y_ptr, (N,), "float32")
        Tx.device_entry()
        bx = Tx.cta_id([N // BLOCK])
        tx = Tx.thread_id([BLOCK])
        r = Tx.alloc_local((1,), "float32")
        i: Tx.let = bx * BLOCK + tx
        r[0] = A[i]
        for _ in Tx.unroll(repeat):
            if variant == "exp":
                r[0] = Tx.exp(r[0])
            elif variant == "ptx_ex2":
                Tx.ptx["ex2.approx.f32"](r[0], r[0])
            elif variant == "tanh":
                r[0] = Tx.tanh(r[0])
            elif variant == "ptx_tanh":
                Tx.ptx["tanh.approx.f32"](r[0], r[0])
            elif variant == "div":
                r[0] = r[0] / B[i]
            elif variant == "ptx_div_rn":
                Tx.ptx["div.rn.f32"](r[0], r[0], B[i])
            elif variant == "ptx_rcp":
                Tx.ptx["rcp.approx.f32"](r[0], B[i])
            elif variant == "silu":
                r[0] = r[0] / (1.0 + Tx.exp(-r[0]))
            else:  # sigmoid
                r[0] = 1.0 / (1.0 + Tx.exp(-r[0]))
        Y[i] = r[0]

    return _tirx_compile(kernel)


def tirx_stage(tile: int):
    """The note's shared.dyn staging: one dynamic buffer of two half tiles, out reversed."""
    half = tile // 2

    @Tx.prim_func
    def kernel(x_ptr: Tx.handle, y_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (tile,), "float32")
        Y = Tx.match_buffer(y_ptr, (tile,), "float32")
        Tx.device_entry()
        Tx.cta_id([1])
        tx = Tx.thread_id([BLOCK])
        S = Tx.alloc_buffer((2, half), "float32", scope="shared.dyn")
        for j in range(tile // BLOCK):
            S[(j * BLOCK + tx) // half, (j * BLOCK + tx) % half] = X[j * BLOCK + tx]
        Tx.cuda.cta_sync()
        for j in range(tile // BLOCK):
            k: Tx.let = tile - 1 - (j * BLOCK + tx)
            Y[j * BLOCK + tx] = S[k // half, k % half]

    return _tirx_compile(kernel)


def _tirx_compile(func):
    return tvm.compile(func, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), tir_pipeline="tirx")


BUILD = {"cute": (cute_elementwise, cute_stage), "tirx": (tirx_elementwise, tirx_stage)}


def _import_dsl(dsl: str) -> None:
    global cutlass, cute, Tx, tvm
    if dsl == "cute":
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # without it a GPU-less compile targets sm_100a
        import cutlass
        import cutlass.cute as cute
        import cutlass.memory  # noqa: F401
    else:
        from metakernel.dsl.tirx import ADAPTER

        os.environ.update(ADAPTER.environment(dry_run=False))  # CUDA_PATH and the device compiler, as the grader
        ADAPTER.import_dsl()  # torch first, libcudart preloaded, then tvm
        import tvm
        from tvm.script import tirx as Tx


# --------------------------------------------------------------------------- measuring
def draw(name: str, seed: int):
    """(a, b) on the GPU: a ~ U[INPUTS[name]] (random sign for div_tiny), b ~ +-10^U[-2, 2] (U[2, 16] for div_tiny)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lo, hi = INPUTS[name]
    u = lambda: torch.rand(N, device="cuda", generator=g, dtype=torch.float64)  # noqa: E731
    sign = lambda: torch.where(u() < 0.5, -1.0, 1.0)  # noqa: E731
    a = lo + (hi - lo) * u()
    b = sign() * 10.0 ** (4.0 * u() - 2.0)
    if name == "div_tiny":
        a, b = a * sign(), 2.0 + 14.0 * u()
    a, b = a.float(), b.float()
    a[a == 0] = 0.5  # never zeros
    return a, b


def ordered(t):
    """bf16 bit patterns as integers that count ulps across zero (+0 and -0 both 0)."""
    bits = t.view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def stats(y, ref) -> dict:
    """Errors of fp32 `y` against float64 `ref` (both on the GPU)."""
    finite = torch.isfinite(y) & torch.isfinite(ref)
    err = (y.double() - ref).abs()[finite]
    ref_f = ref[finite]
    rel_mask = ref_f.abs() > 1e-30
    rel = err[rel_mask] / ref_f[rel_mask].abs()
    ulp = torch.ldexp(torch.ones_like(ref_f), (torch.frexp(ref_f).exponent - 24).clamp(min=-149))
    ulps = err / ulp
    bf = (ordered(y.bfloat16()) - ordered(ref.bfloat16())).abs()[finite]
    worst = int(torch.argmax(ulps)) if ulps.numel() else None
    return {"values": int(y.numel()), "nonfinite": int((~finite).sum()),
            "max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
            "max_rel_err": float(rel.max()) if rel.numel() else None,
            "max_rel_err_log2": float(torch.log2(rel.max())) if rel.numel() and rel.max() > 0 else None,
            "max_ulp_fp32": float(ulps.max()), "mean_ulp_fp32": float(ulps.mean()),
            "bf16_max_ulp_diff": int(bf.max()), "bf16_mismatch_fraction": float((bf > 0).double().mean()),
            "zero_where_ref_nonzero": int(((y == 0) & (ref != 0)).sum()),
            "worst_ref": float(ref_f[worst]) if worst is not None else None,
            "worst_out": float(y[finite][worst]) if worst is not None else None}


def run_dsl(dsl: str, compile_only: bool, out: Path | None, iters: int) -> int:
    """Every case of one DSL in this process; returns the number of cases that did not go as expected."""
    _import_dsl(dsl)
    elementwise, stage = BUILD[dsl]
    jobs: list[tuple[str, Any]] = [("accuracy", c) for c in CASES[dsl]]
    jobs += [("timing", (v, r)) for v in TIMED[dsl] for r in (1, TIME_REPEAT)] + [("smem", kb) for kb in SMEM_KB]
    bad = 0
    for seed, (kind, spec) in enumerate(jobs):
        rec: dict = {"kind": kind, "dsl": dsl}
        try:
            if kind == "accuracy":
                case, spelling, ref_name, inp = spec
                variant = case.removesuffix("_tiny")
                rec.update(case=case, spelling=spelling, reference=f"float64 {ref_name}", input=inp,
                           input_range=INPUTS[inp], seed=seed)
                fn = elementwise(variant)
                rec["compiled"] = True
                if not compile_only:
                    a, b = draw(inp, seed)
                    y = torch.empty_like(a)
                    fn(a, b, y)
                    torch.cuda.synchronize()
                    rec.update(stats(y, REFS[ref_name](a.double(), b.double())))
            elif kind == "timing":
                variant, repeat = spec
                rec.update(case=f"{variant} x{repeat}", function=variant, repeat=repeat, iters=iters)
                fn = elementwise(variant, repeat)
                rec["compiled"] = True
                if not compile_only:
                    a, b = draw("tanh", seed)
                    y = torch.empty_like(a)
                    ms = median_ms(lambda fn=fn, a=a, b=b, y=y: fn(a, b, y), iters)
                    rec.update(median_ms=ms, ns_per_value_per_eval=ms * 1e6 / N / repeat)
            else:
                tile = spec * KB // 4
                rec.update(case=f"smem_{spec}KB", smem_bytes=spec * KB, expected="launch" if spec <= 227 else "fail")
                fn = stage(tile)
                rec["compiled"] = True
                if not compile_only:
                    x = torch.randn(tile, device="cuda")
                    y = torch.full_like(x, float("nan"))
                    fn(x, y)  # a refused launch may return without raising: the NaN fill shows it
                    torch.cuda.synchronize()
                    rec.update(call_returned=True, output_written=bool(~y.isnan().all()),
                               correct=bool(torch.equal(y, x.flip(0))))
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001  (a failure is a result)
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[-2000:], traceback=traceback.format_exc()[-4000:])
        if kind == "smem" and not compile_only:
            rec["as_expected"] = bool(rec.get("correct") if spec <= 227 else not rec.get("output_written"))
        bad += not rec["ok"] and rec.get("expected") != "fail"
        print(row(rec), flush=True)
        if out is not None:
            report = json.loads(out.read_text(encoding="utf-8"))
            report["records"].append(rec)
            write_json_atomic(out, report)
    return bad


def _g(v, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def row(r: dict) -> str:
    head = f"{r['dsl']:5} {r.get('case', '?'):16}"
    if not r.get("ok"):
        return f"{head} FAILED{' (expected)' if r.get('expected') == 'fail' else ''}: {r.get('error', '')[:300]}"
    if r["kind"] == "accuracy" and "max_abs_err" in r:
        log2 = "" if r["max_rel_err_log2"] is None else f"2^{r['max_rel_err_log2']:.1f}"
        return (f"{head} abs {_g(r['max_abs_err']):>9} rel {_g(r['max_rel_err']):>9} {log2:>7} "
                f"ulp {_g(r['max_ulp_fp32']):>8} "
                f"mean-abs {_g(r['mean_abs_err']):>9} bf16 ulp {r['bf16_max_ulp_diff']:>3} "
                f"mismatch {100 * r['bf16_mismatch_fraction']:6.3f}% ftz {r['zero_where_ref_nonzero']:>7}  "
                f"{r['spelling']}")
    if r["kind"] == "timing" and "median_ms" in r:
        return f"{head} median {r['median_ms']:.4f} ms ({r['ns_per_value_per_eval']:.4g} ns/value)"
    if r["kind"] == "smem" and r.get("call_returned"):
        out = "exact" if r["correct"] else "written, WRONG" if r["output_written"] else "not written (refused)"
        return f"{head} {r['smem_bytes']} B: call returned, output {out}; as expected: {r['as_expected']}"
    return f"{head} compiled"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "validation" / "h200-notes-accuracy.json")
    ap.add_argument("--compile-only", action="store_true", help="compile every kernel for sm_90a (no GPU needed)")
    ap.add_argument("--dsl", choices=("both", "cute", "tirx"), default="both")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per timing case (median)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run one DSL, append to --out
    args = ap.parse_args()
    dsls = ("cute", "tirx") if args.dsl == "both" else (args.dsl,)
    if not args.compile_only and not torch.cuda.is_available():
        print("check_notes_accuracy: needs a CUDA GPU (an H200); torch sees none, nothing was measured "
              "(--compile-only compiles every kernel without one)", file=sys.stderr)
        return 2
    if args.child:  # one DSL in this process
        bad = run_dsl(dsls[0], args.compile_only, None if args.compile_only else args.out, args.iters)
        if args.compile_only:
            print(f"{dsls[0]}: {f'{bad} case(s) failed to compile' if bad else 'all kernels compiled'}")
        return 1 if args.compile_only and bad else 0  # measured failures are results: any other exit is a crash
    me = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(args.out), "--iters", str(args.iters)]
    if args.compile_only:  # the DSLs at once, each in its own process
        procs = [subprocess.Popen([*me, "--compile-only", "--dsl", d], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for d in dsls]
        outs = [(proc.communicate()[0], proc.returncode) for proc in procs]
        print("".join(text for text, _ in outs), end="")
        return 1 if any(rc for _, rc in outs) else 0
    from metakernel.provenance import provenance

    write_json_atomic(args.out, {"schema": SCHEMA, "provenance": provenance(), "n": N, "block": BLOCK,
                                 "inputs": INPUTS, "time_repeat": TIME_REPEAT, "records": []})
    crashed = False
    for d in dsls:  # one after the other: each has the GPU to itself
        rc = subprocess.run([*me, "--dsl", d], check=False).returncode
        if rc:
            crashed = True
            report = json.loads(args.out.read_text(encoding="utf-8"))
            report["records"].append({"kind": "process", "dsl": d, "ok": False, "error": f"child exited {rc}"})
            write_json_atomic(args.out, report)
    print("\nsummary:\n" + "\n".join(row(r) for r in json.loads(args.out.read_text(encoding="utf-8"))["records"]))
    print(f"written {args.out}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
