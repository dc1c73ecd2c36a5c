"""The launch floors (scripts/floors/, `bench_overhead.py --floors`, metakernel/floors.py): the floor kernels
compile for sm_90a here, and what was measured per GPU reaches the grader's report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from metakernel.floors import floors_for
from metakernel.grader.report import GradeReport, Timing

FLOORS = Path(__file__).resolve().parents[1] / "scripts" / "floors"


def test_floors_are_read_per_gpu_and_ignore_the_revision(tmp_path):
    data = tmp_path / "floors.json"
    data.write_text(json.dumps({"NVIDIA H200": {"cute (TVM-FFI)": 9.5, "tirx": 12.25, "eager": 7.0,
                                                "revision": "abc1234"}}))
    assert floors_for("NVIDIA H200", data) == {"cute (TVM-FFI)": 9.5, "tirx": 12.25, "eager": 7.0}
    assert floors_for("NVIDIA A100", data) == {} and floors_for(None, data) == {}
    assert floors_for("NVIDIA H200", tmp_path / "missing.json") == {}


def test_a_passed_report_shows_the_floor_it_was_given():
    timing = Timing(median_us=20.0, mean_us=20.0, stdev_us=1.0, min_us=19.0, n=50, rse=0.001, host_median_us=20.0,
                    wall_s=1.0)
    report = GradeReport(problem={"number": 28}, dsl="tirx", kernel_sha256="0", device="cuda", scale="full",
                         status="passed", timing=timing, launch_floor_us={"tirx": 12.25, "eager": 7.0})
    assert "launch floor on this GPU (a trivial kernel, same bracket): tirx 12.2 us, eager 7.0 us" in \
        report.agent_text()


@pytest.mark.parametrize("route", ["cute_ffi", "cute_dlpack"])
def test_cute_floor_kernels_compile_for_sm90a(route):
    """Both routes' floor kernels compile; the `from_dlpack` route is measured (in a plain process) to show what it
    cost, and the grader refuses it (its launch arguments are CuTe's wrappers, which the gate cannot read)."""
    done = subprocess.run([sys.executable, "-m", "metakernel.dsl.cute", str(FLOORS / f"{route}.py"),
                           str(FLOORS / "problem.py")], capture_output=True, text=True, timeout=300, check=False)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if route == "cute_dlpack":
        assert not result["ok"] and "cannot read" in result["error"], result
        return
    assert result["ok"], result
    assert result["launches"] == [1, 1] and result["outputs"] == result["expected"]


def test_tirx_floor_kernel_lowers_to_cuda(tmp_path):
    script = tmp_path / "lower.py"
    script.write_text(f"""
import importlib.util, os
from metakernel.dsl import get_adapter
for k, v in get_adapter("tirx").environment(dry_run=True).items():
    os.environ.setdefault(k, v)
import torch, tvm
spec = importlib.util.spec_from_file_location("floor", {str(FLOORS / "tirx.py")!r})
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
exe = tvm.compile(m.plus_one, target=tvm.target.Target({{"kind": "cuda", "arch": "sm_90a"}}), tir_pipeline="tirx")
mods = exe.mod.imports if hasattr(exe.mod, "imports") else exe.mod.imported_modules
src = mods[0].inspect_source() if hasattr(mods[0], "inspect_source") else mods[0].get_source()
print("SOURCE" if "plus_one" in src and "__global__" in src else "NO SOURCE")
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.stdout.strip().endswith("SOURCE") and "NO" not in done.stdout, done.stderr[-2000:]


def test_bench_overhead_times_the_floor_problem_in_a_plain_process():
    done = subprocess.run([sys.executable, str(FLOORS.parent / "bench_overhead.py"), "--plain", "floor", "eager",
                           "--draws", "20", "--device", "cpu"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["n"] == 20 and row["median_us"] > 0
