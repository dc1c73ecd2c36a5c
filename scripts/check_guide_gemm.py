"""Check the guide's tensor-core GEMM and problem 32's gold kernel on a GPU: errors and TFLOP/s beside cuBLAS.

    python3 scripts/check_guide_gemm.py [--shapes 4096x4096x4096,8192x8192x8192] [--iters 20] [--no-gold]

1. The example of docs/guides/cute.md, section "Tensor cores: warpgroup MMA", is cut out of the guide (as
   tests/test_dsl_cute.py does), written to a file and imported. For each MxNxK (multiples of 128, 256, 64) it
   runs C = A @ B^T on random bf16 inputs and prints the max error against a float64 product beside cuBLAS's
   (torch.matmul(a, b.t())), then both speeds. Problem 32's two GEMM shapes (4096 x 28672 x 4096 and
   4096 x 4096 x 14336) are always added.
2. solutions/mlp_norm/32_swiglu_mlp_h4096/correct/cute.py at full scale: the comparator's verdict (float64 anchor,
   the problem's tolerance) and its time beside the eager reference (cuBLAS GEMMs + elementwise).
Times are CUDA-event medians of back-to-back calls (warm L2, host overhead included). Without CUDA the script
says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "cute.md"
GOLD = ROOT / "solutions" / "mlp_norm" / "32_swiglu_mlp_h4096" / "correct" / "cute.py"
HEADING = "## Tensor cores: warpgroup MMA"
P32_GEMMS = [(4096, 28672, 4096), (4096, 4096, 14336)]


def guide_gemm_source() -> str:
    section = GUIDE.read_text(encoding="utf-8").split(HEADING, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    if not match:
        raise SystemExit(f"no Python block after {HEADING!r} in {GUIDE}")
    return match.group(1)


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def median_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def check_gemm(gemm, m: int, n: int, k: int, iters: int) -> None:
    torch.manual_seed(m + 3 * n + 7 * k)
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    exact = a.double() @ b.double().t()
    c = gemm.solve(a, b)
    ref = torch.matmul(a, b.t())
    scale = exact.abs().max().item()
    err = (c.double() - exact).abs().max().item()
    err_ref = (ref.double() - exact).abs().max().item()
    t_guide = median_ms(lambda: gemm.solve(a, b), iters)
    t_cublas = median_ms(lambda: torch.matmul(a, b.t()), iters)
    flop = 2.0 * m * n * k
    verdict = "ok" if err <= 3 * max(err_ref, scale * 2.0 ** -8) else "WRONG"
    print(f"{m:>6}x{n:>6}x{k:>6}  max err {err:9.4g} (cuBLAS {err_ref:9.4g}, max|C| {scale:8.4g}) {verdict:5}  "
          f"guide {t_guide:8.3f} ms {flop / t_guide / 1e9:6.0f} TFLOP/s   cuBLAS {t_cublas:8.3f} ms "
          f"{flop / t_cublas / 1e9:6.0f} TFLOP/s   ratio {t_cublas / t_guide:5.2f}", flush=True)


def check_gold(iters: int) -> None:
    sys.path.insert(0, str(ROOT))
    from metakernel.compare import compare
    from metakernel.expected import compute_expected
    from metakernel.problem import load_problem

    problem = load_problem(32)
    gold = load_module(GOLD, "gold_32_cute")
    torch.manual_seed(0)
    inputs = problem.make_inputs("cuda", "full")
    out = gold.solve(*inputs)
    verdict = compare(out, {}, compute_expected(problem, inputs))
    for o in verdict.outputs:
        print(f"problem 32 gold: {o.name} passed={o.passed} max err {o.max_error:.4g} allowance {o.allowance:.4g}")
    print(f"problem 32 gold: verdict {verdict.text()}")
    flop = problem.roofline(inputs)["flops"]
    t_gold = median_ms(lambda: gold.solve(*inputs), iters)
    t_eager = median_ms(lambda: problem.reference(*inputs), iters)
    print(f"problem 32 gold {t_gold:8.3f} ms {flop / t_gold / 1e9:6.0f} TFLOP/s   eager reference (cuBLAS) "
          f"{t_eager:8.3f} ms {flop / t_eager / 1e9:6.0f} TFLOP/s   speedup {t_eager / t_gold:5.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192", help="comma-separated MxNxK")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-gold", action="store_true", help="skip problem 32's gold kernel")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("check_guide_gemm: needs a CUDA GPU (an H200); torch sees none, nothing was checked", file=sys.stderr)
        return 2
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
    shapes += [s for s in P32_GEMMS if s not in shapes]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "guide_gemm.py"  # the DSL reads kernel source from the file
        path.write_text(guide_gemm_source(), encoding="utf-8")
        gemm = load_module(path, "guide_gemm")
        print(f"guide GEMM ({HEADING[3:]}) vs torch.matmul on {torch.cuda.get_device_name()}:")
        for m, n, k in shapes:
            check_gemm(gemm, m, n, k, args.iters)
    if not args.no_gold:
        check_gold(args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
