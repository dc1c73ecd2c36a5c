"""Run the TIRx guide's tensor-core GEMM (docs/guides/tirx.md, "Tensor cores") on a GPU against torch.matmul.

For each shape M x N x K: C = A @ B^T with bf16 A [M, K], B [N, K]; prints the max error of the guide's kernel and
of torch.matmul (cuBLAS), both against an fp32 product of the same bf16 inputs, and the TFLOP/s of each (CUDA
events, median of --iters timed calls after warm-up).

    python3 scripts/check_guide_gemm_tirx.py [--shapes 4096x4096x4096,4096x28672x4096] [--iters 20]

Needs a CUDA GPU (sm_90a: H100 / H200); without one it exits with status 2 after importing everything.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from check_guide_gemm import median_ms  # noqa: E402  (the same CUDA-event timing as the CuTe GEMM check)

from metakernel.dsl.tirx import ADAPTER  # noqa: E402

GUIDE = ROOT / "docs" / "guides" / "tirx.md"
DEFAULT_SHAPES = "4096x4096x4096,4096x28672x4096,4096x4096x14336"  # square; problem 32's two GEMMs


def guide_gemm_source() -> str:
    """The python block between the guide's tirx-gemm markers."""
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"<!-- tirx-gemm-begin -->\s*```python\n(.*?)```\s*<!-- tirx-gemm-end -->", text, re.S)
    if not m:
        raise SystemExit(f"{GUIDE}: the tirx-gemm example markers are missing")
    return m.group(1)


def load_example(workdir: str):
    """Write the example to a file (TVMScript reads its source) and import it."""
    path = os.path.join(workdir, "guide_gemm.py")
    Path(path).write_text(guide_gemm_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("guide_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["guide_gemm"] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxNxK")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",") if s]

    os.environ.update(ADAPTER.environment(dry_run=False))  # CUDA_PATH, the device compiler, as the grader does
    ADAPTER.import_dsl()  # torch first, libcudart preloaded, then tvm
    import torch

    with tempfile.TemporaryDirectory() as workdir:
        example = load_example(workdir)
        if not torch.cuda.is_available():
            print("no CUDA device: the example imported; nothing to run on this machine", file=sys.stderr)
            return 2
        print(f"device: {torch.cuda.get_device_name()}")
        print(f"{'M x N x K':>22} {'err tirx':>10} {'err cublas':>10} {'TFLOP/s tirx':>13} {'TFLOP/s cublas':>15}")
        torch.manual_seed(0)
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda").bfloat16()
            b = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
            ref = a.float() @ b.float().T
            c = example.solve(a, b)
            torch.cuda.synchronize()
            err_tirx = (c.float() - ref).abs().max().item()
            err_cublas = (torch.matmul(a, b.T).float() - ref).abs().max().item()
            flops = 2.0 * m * n * k
            t_tirx = median_ms(lambda a=a, b=b: example.solve(a, b), args.iters)
            t_cublas = median_ms(lambda a=a, b=b: torch.matmul(a, b.T), args.iters)
            print(f"{f'{m} x {n} x {k}':>22} {err_tirx:10.3g} {err_cublas:10.3g} "
                  f"{flops / t_tirx / 1e9:13.1f} {flops / t_cublas / 1e9:15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
