"""The check's resource table: occupancy arithmetic for an H200 SM and the text an agent reads (the cubin parser
itself is exercised on every gold kernel's real sm_90a cubins by tests/test_solutions_dry_run.py), and the launch
columns (grid, block, dynamic shared memory) each adapter reads from a real CPU compile's host side.

The DSL compiles run in two fresh subprocesses started together (the hooks patch process-global DSL objects; each
`import` of a DSL costs seconds), as tests/test_dsl_cute.py does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metakernel.dsl.resources import KernelResources, Launch, ResourceLog, occupancy, table

ROOT = Path(__file__).resolve().parents[1]


def test_occupancy_is_bounded_by_whichever_sm_resource_runs_out_first():
    # 115 registers: 15 * 256 per warp, 17 warps of 64 fit, two 8-warp blocks: 25 %
    k = occupancy(KernelResources("gemm", 115, 0, 1024, 256))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (2, "registers", 0.25)
    # 24 registers, 128 threads: 16 blocks of 4 warps fill the 64 warps
    k = occupancy(KernelResources("ew", 24, 0, 0, 128))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (16, "threads", 1.0)
    # 100 KB of static shared memory: two blocks (plus 1 KB reserved each) in 228 KB
    k = occupancy(KernelResources("tile", 32, 0, 100 * 1024, 128))
    assert (k.blocks_per_sm, k.limited_by) == (2, "shared memory")
    # 44 KB declared: the cubin says 45 KB (the reserve included), five blocks fit; counting the reserve again
    # would make it four
    k = occupancy(KernelResources("tile44", 32, 0, 45 * 1024, 128))
    assert (k.blocks_per_sm, k.limited_by) == (5, "shared memory")
    # dynamic shared memory only, a cubin that shows none: the reserve is added
    k = occupancy(KernelResources("dyn45", 32, 0, 0, 128, dynamic_smem=45 * 1024))
    assert k.blocks_per_sm == 4
    # 32 threads, few registers: the 32-blocks-per-SM cap
    k = occupancy(KernelResources("tiny", 16, 0, 0, 32))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (32, "blocks", 0.5)
    # block size not fixed at compile time: nothing claimed
    k = occupancy(KernelResources("dyn", 40, 0, 0, None))
    assert k.blocks_per_sm is None and k.occupancy is None


def test_occupancy_counts_the_launch_dynamic_shared_memory_block_and_grid():
    # the same 128-thread kernel: 16 blocks/SM without shared memory, 2 with 100 KB of dynamic shared memory
    assert occupancy(KernelResources("ew", 24, 0, 0, 128, dynamic_smem=0)).blocks_per_sm == 16
    k = occupancy(KernelResources("tile", 24, 0, 0, 128, dynamic_smem=100 * 1024))
    assert (k.blocks_per_sm, k.limited_by, k.occupancy) == (2, "shared memory", 0.125)
    # static and dynamic add up: 60 KB + 60 KB (+ 1 KB) per block -> one block
    k = occupancy(KernelResources("both", 24, 0, 60 * 1024, 128, dynamic_smem=60 * 1024))
    assert (k.blocks_per_sm, k.limited_by) == (1, "shared memory")
    # the cubin fixed no block size: the launch's (4 x 64 threads) is used
    k = occupancy(KernelResources("free", 24, 0, 0, None, block=[64, 4, 1], grid=[528, 1, 1]))
    assert (k.blocks_per_sm, k.limited_by) == (8, "threads")
    # waves: 528 blocks / (8 per SM x 132 SMs)
    assert k.waves == 0.5
    # a grid computed only at run time: no waves
    assert occupancy(KernelResources("g", 24, 0, 0, 128, grid=None)).waves is None


def test_table_names_kernels_by_function_and_flags_local_memory():
    rows = [occupancy(KernelResources("kernel_cutlass__gemm_kernel_tensorptrbf16gmemalign16o40961_0", 115, 0, 0,
                                      256)).as_dict(),
            occupancy(KernelResources("softmax_kernel", 255, 96, 0, None)).as_dict()]
    text = table(rows)
    assert "_gemm_kernel " in text and "tensorptr" not in text
    assert "block size not fixed at compile time" in text
    assert "register spills or local arrays" in text  # stack > 0 is called out
    assert "? = set only at run time, a ? dyn B not counted" in text  # no launch known: said so
    assert table([]) == ""


def test_table_shows_grid_dynamic_smem_and_waves_and_drops_the_caveat_when_known():
    rows = [occupancy(KernelResources("tile_kernel", 32, 0, 0, 256, grid=[132, 1, 1], block=[256, 1, 1],
                                      dynamic_smem=102400)).as_dict()]
    text = table(rows)
    head, columns, line = text.splitlines()[:3]
    assert "not counted" not in head and "132 SMs" in head
    assert "grid" in columns and "dyn B" in columns and "waves" in columns
    assert line.split()[:9] == ["tile_kernel", "32", "0", "0", "102400", "256", "132x1x1", "2", "25"]
    assert line.split()[10] == "0.50"  # 132 blocks / (2 x 132)
    assert "waves < 1" in text


def test_log_gives_one_row_per_kernel_and_distinct_launch():
    log = ResourceLog()
    log.kernels["m"] = [KernelResources("a", 32, 0, 0, 128), KernelResources("b", 32, 0, 0, None)]
    log.use("m", {"a": Launch((4, 1, 1), (128, 1, 1), 0), "b": Launch(None, (64, 1, 1), 4096)})
    log.use("m", {"a": Launch((4, 1, 1), (128, 1, 1), 0), "b": Launch(None, (64, 1, 1), 4096)})  # again: same rows
    log.use("m", {"a": Launch((8, 1, 1), (128, 1, 1), 0)})  # another shape: a's new grid, b unknown
    rows = log.take()
    assert [(r["name"], r["grid"], r["dynamic_smem"], r["threads"] or r["block"]) for r in rows] == [
        ("a", [4, 1, 1], 0, 128), ("b", None, 4096, [64, 1, 1]), ("a", [8, 1, 1], 0, 128),
        ("b", None, None, None)]
    assert rows[1]["blocks_per_sm"] == 32  # from the launch's 64 threads (the cubin fixed none)
    assert log.take() == []
    assert log.kernels["m"][0].grid is None  # the cubin's rows are not changed by a launch


# ------------------------------------------------------------------------------------------- real DSL compiles
# Kernels with a grid and dynamic shared memory chosen here, compiled for sm_90a on the CPU through the adapter's
# hooks in mode "intercept" (what the dry run does); the rows are the adapter's `resources()` after one call.

CUTE_KERNEL = '''
import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

TILE = 25600  # 100 KB of fp32 from the SmemAllocator: dynamic shared memory the DSL sizes


@cute.kernel
def staged_kernel(mX: cute.Tensor, mY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    smem = cutlass.memory.SmemAllocator()
    buf = smem.allocate_tensor(cutlass.Float32, cute.make_layout(TILE), byte_alignment=16)
    for j in cutlass.range(tidx, TILE, 256):
        buf[j] = mX[j]
    cute.arch.barrier()
    for j in cutlass.range(tidx, TILE, 256):
        mY[j] = buf[TILE - 1 - j]


@cute.kernel
def copy_kernel(mX: cute.Tensor, mY: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    mY[bidx * 128 + tidx] = mX[bidx * 128 + tidx]


@cute.jit
def both(mX: cute.Tensor, mY: cute.Tensor, n: cutlass.Int32, stream):
    staged_kernel(mX, mY).launch(grid=(3, 2, 1), block=(256, 1, 1), stream=stream)
    copy_kernel(mX, mY).launch(grid=(n, 1, 1), block=(128, 1, 1), smem=4096, stream=stream)  # grid: run time


def solve(x, y, n):
    fake = make_fake_compact_tensor(cutlass.Float32, (TILE,), assumed_align=16)
    fn = cute.compile(both, fake, fake, n, make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")
    fn(x, y, n)
'''

TIRX_KERNEL = '''
from tvm.script import tirx as Tx

TILE = 25600  # 100 KB of fp32 in the one shared.dyn buffer


@Tx.prim_func
def stage(x_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, TILE), "float32")
    Y = Tx.match_buffer(y_ptr, (M, TILE), "float32")
    Tx.device_entry()
    row, half = Tx.cta_id([M, 2])  # the grid: (M, 2) blocks, M from the arguments at each call
    tx = Tx.thread_id([256])
    S = Tx.alloc_buffer((TILE,), "float32", scope="shared.dyn")
    for j in range(TILE // 512):
        S[half * (TILE // 2) + j * 256 + tx] = X[row, half * (TILE // 2) + j * 256 + tx]
    Tx.cuda.cta_sync()
    for j in range(TILE // 512):
        Y[row, half * (TILE // 2) + j * 256 + tx] = S[TILE - 1 - (half * (TILE // 2) + j * 256 + tx)]
'''

CHILD = '''
import importlib.util, json, os, sys
dsl, kernel_path = sys.argv[1], sys.argv[2]
from metakernel.dsl.base import LaunchGate
if dsl == "cute":
    from metakernel.dsl.cute import ADAPTER
else:
    from metakernel.dsl.tirx import ADAPTER
os.environ.update(ADAPTER.environment(dry_run=True))
ADAPTER.import_dsl()
gate = LaunchGate(mode="intercept")
ADAPTER.install_hooks(gate)
import torch
spec = importlib.util.spec_from_file_location("kernel_under_test", kernel_path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if dsl == "cute":
    x = torch.zeros(25600)
    module.solve(x, torch.empty_like(x), 7)
else:
    import tvm
    exe = tvm.compile(module.stage, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}),
                      tir_pipeline="tirx")
    x = torch.zeros(300, 25600)
    exe(x, torch.empty_like(x))
from metakernel.dsl.resources import table
rows = ADAPTER.resources()
print("ROWS " + json.dumps({"rows": rows, "table": table(rows), "launches": gate.launches}))
'''

HAVE = {"cute": importlib.util.find_spec("cutlass") is not None, "tirx": importlib.util.find_spec("tvm") is not None}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("resources")
    (work / "child.py").write_text(CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = {}
    for dsl, source in (("cute", CUTE_KERNEL), ("tirx", TIRX_KERNEL)):
        if HAVE[dsl]:
            (work / f"{dsl}_kernel.py").write_text(source, encoding="utf-8")
            procs[dsl] = subprocess.Popen([sys.executable, str(work / "child.py"), dsl, str(work / f"{dsl}_kernel.py")],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work)
    out = {}
    for dsl, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        line = next((ln for ln in stdout.splitlines() if ln.startswith("ROWS ")), None)
        assert line, f"{dsl} child failed (rc {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-4000:]}"
        out[dsl] = json.loads(line[len("ROWS "):])
    return out


def _row(result: dict, fragment: str) -> dict:
    rows = [r for r in result["rows"] if fragment in r["name"]]
    assert len(rows) == 1, result["table"]
    return rows[0]


@pytest.mark.skipif(not HAVE["cute"], reason="nvidia-cutlass-dsl is not installed")
def test_cute_rows_show_the_launch_grid_and_the_smem_allocator_size(compiled):
    result = compiled["cute"]
    assert result["launches"] == 1  # one host function, both kernels
    staged = _row(result, "staged_kernel")
    assert (staged["grid"], staged["block"], staged["dynamic_smem"]) == ([3, 2, 1], [256, 1, 1], 25600 * 4)
    # 100 KB of dynamic shared memory (+ static + 1 KB reserved) per block: two blocks in 228 KB
    assert staged["blocks_per_sm"] == 2 and staged["limited_by"] == "shared memory", result["table"]
    assert staged["waves"] == pytest.approx(6 / (2 * 132))
    copy = _row(result, "copy_kernel")
    assert (copy["grid"], copy["block"], copy["dynamic_smem"]) == (None, [128, 1, 1], 4096)  # grid from `n`
    lines = result["table"].splitlines()
    assert any(line.split()[:1] == ["staged_kernel"] and "3x2x1" in line.split() and "102400" in line.split()
               for line in lines), result["table"]


@pytest.mark.skipif(not HAVE["tirx"], reason="apache-tvm is not installed")
def test_tirx_rows_show_the_grid_of_the_call_and_the_shared_dyn_size(compiled):
    from metakernel.dsl.tirx import find_cuda_root

    result = compiled["tirx"]
    if not result["rows"] and find_cuda_root() is None:
        pytest.skip("no CUDA toolkit: TIRx kernels get no cubin, so no resource rows")
    assert result["launches"] == 1
    row = _row(result, "stage_kernel")
    # grid (M, 2) with M = 300 rows of the call's arguments; 256 threads; the shared.dyn buffer's 100 KB
    assert (row["grid"], row["block"], row["dynamic_smem"]) == ([300, 2, 1], [256, 1, 1], 25600 * 4)
    assert row["blocks_per_sm"] == 2 and row["limited_by"] == "shared memory", result["table"]
    assert row["waves"] == pytest.approx(600 / (2 * 132))
    assert "not counted" not in result["table"].splitlines()[0]
    assert "300x2x1" in result["table"]


@pytest.mark.skipif(not HAVE["tirx"], reason="apache-tvm is not installed")
def test_an_sm90_cubin_s_shared_size_holds_the_1_kb_reserve(tmp_path):
    """Why `occupancy` adds the SM's 1 KB per-block reserve only where the cubin shows no shared memory: nvcc for
    sm_90a puts it into `.nv.shared.<kernel>` whenever the kernel uses any (declared 256 B -> 1280, dynamic only ->
    1024, none -> no section). Compiled in a child process with the adapter's toolkit environment."""
    from metakernel.dsl.tirx import find_cuda_root

    if find_cuda_root() is None:
        pytest.skip("no CUDA toolkit on this machine")
    script = tmp_path / "sizes.py"
    script.write_text('''
import json, os
from metakernel.dsl import get_adapter
os.environ.update(get_adapter("tirx").environment(dry_run=True))
import tvm
from tvm.support import nvcc
from metakernel.dsl.resources import parse_cubin
body = "int i = blockIdx.x * blockDim.x + threadIdx.x;"
sources = {
    "declared": "__shared__ float s[64]; " + body + " s[threadIdx.x % 64] = a[i]; __syncthreads(); a[i] = s[0];",
    "dynamic": "extern __shared__ float s[]; " + body + " s[threadIdx.x] = a[i]; __syncthreads(); a[i] = s[0];",
    "none": body + " a[i] = a[i] * 2.f;",
}
sizes = {}
for name, code in sources.items():
    src = 'extern "C" __global__ void k_' + name + '(float* a) { ' + code + ' }'
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        binary = nvcc.compile_cuda(src, target_format="cubin", compiler=os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc"))
    sizes[name] = {k.name: k.static_smem for k in parse_cubin(bytes(binary))}["k_" + name]
print(json.dumps(sizes))
''')
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    assert sizes == {"declared": 64 * 4 + 1024, "dynamic": 1024, "none": 0}
