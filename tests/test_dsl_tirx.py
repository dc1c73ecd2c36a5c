"""The TIRx adapter on a CPU machine: dry run, llvm launches, every launch route, error cleaning.

The DSL work runs in ONE child process (a module-scoped fixture) for two reasons: `install_hooks` patches tvm-ffi
process-wide (it would leak into every later test of this pytest process), and importing torch + tvm costs ~7 s,
so one child shared by all scenarios keeps the file well under a minute. The child mirrors what the grader's
worker does: environment(dry_run=True), import_dsl(), install_hooks(gate), then candidate files imported from disk.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from metakernel.dsl.base import DslAdapter, LaunchGate
from metakernel.dsl.tirx import ADAPTER, clean_error_text
from tests.helpers import AXPB_LLVM

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "tirx.md"
P28 = ROOT / "problems" / "mlp_norm" / "28_fused_add_rmsnorm_h4096.py"
P28_TIRX = ROOT / "solutions" / "mlp_norm" / "28_fused_add_rmsnorm_h4096" / "correct" / "tirx.py"
HAVE_TVM = importlib.util.find_spec("tvm") is not None

# A CPU (llvm) TIRx kernel: really runs on CPU tensors.
LLVM_KERNEL = AXPB_LLVM + '''

_EXE = []


def exe():
    if not _EXE:
        _EXE.append(tvm.compile(axpb, target="llvm", tir_pipeline="tirx"))
    return _EXE[0]


def solve(x, b):
    y = torch.zeros_like(x)
    exe()(x, b, y)
    return y
'''

# Fails while the module is imported (TVMScript parses at decoration time).
PARSE_ERROR_KERNEL = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def bad(x_ptr: Tx.handle, y_ptr: Tx.handle):
    X = Tx.match_buffer(x_ptr, (4, 256), "float32")
    Y = Tx.match_buffer(y_ptr, (4, 256), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([4])
    tx = Tx.thread_id([256])
    Y[bx, tx] = X[bx, tx] * not_defined_anywhere


def solve(x):
    return x
'''

# Parses, then fails inside tvm.compile (in solve): shared memory of symbolic size.
LOWERING_ERROR_KERNEL = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def bad(x_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, 256), "float32")
    Y = Tx.match_buffer(y_ptr, (M, 256), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([M])
    tx = Tx.thread_id([256])
    s = Tx.alloc_shared((M,), "float32")
    s[tx] = X[bx, tx]
    Y[bx, tx] = s[tx]


def solve(x):
    exe = tvm.compile(bad, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), tir_pipeline="tirx")
    y = torch.empty_like(x)
    exe(x, y)
    return y
'''

# Lowers fine; only the CUDA compiler rejects it (an undefined device function).
DEVICE_ERROR_KERNEL = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def bad(x_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, 256), "float32")
    Y = Tx.match_buffer(y_ptr, (M, 256), "float32")
    Tx.device_entry()
    bx = Tx.cta_id([M])
    tx = Tx.thread_id([256])
    Y[bx, tx] = Tx.call_extern("float32", "no_such_device_fn", X[bx, tx])


def solve(x):
    exe = tvm.compile(bad, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), tir_pipeline="tirx")
    y = torch.empty_like(x)
    exe(x, y)
    return y
'''

CHILD = r'''
import importlib.util, json, os, sys, time, traceback
from metakernel.dsl.base import LaunchGate
from metakernel.dsl.tirx import ADAPTER

os.environ.update(ADAPTER.environment(dry_run=True))
t0 = time.perf_counter()
ADAPTER.import_dsl()
report = {"import_dsl_s": time.perf_counter() - t0, "env": {k: os.environ.get(k) for k in
          ("CUDA_PATH", "TVM_CUDA_COMPILE_MODE", "METAKERNEL_TIRX_DEVICE_COMPILE")}}
import torch
import tvm

work = sys.argv[1]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def gate_dict(gate):
    return {"launches": gate.launches, "suppressed": gate.suppressed, "kernel_names": sorted(gate.kernel_names)}


def scenario(name):
    def wrap(fn):
        try:
            report[name] = fn()
        except BaseException:
            report[name] = {"exception": traceback.format_exc()}
        return fn
    return wrap


def dry_run(path, inputs, name):
    gate = LaunchGate(mode="intercept")
    ADAPTER.install_hooks(gate)
    t0 = time.perf_counter()
    try:
        mod = load(path, name)
        out = mod.solve(*inputs)
    except Exception:
        return {"error": ADAPTER.clean_error(traceback.format_exc()), **gate_dict(gate)}
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    mod.solve(*inputs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return {"outs": [[list(o.shape), str(o.dtype), str(o.device)] for o in outs], "first_call_s": first,
            "second_call_s": time.perf_counter() - t0, **gate_dict(gate)}


@scenario("guide")
def _():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g).bfloat16()
    s, b = torch.randn(256, generator=g).bfloat16(), torch.randn(256, generator=g).bfloat16()
    return dry_run(os.path.join(work, "guide_example.py"), [x, s, b], "guide_example")


@scenario("guide_gemm")
def _():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 128, generator=g).bfloat16(), torch.randn(384, 128, generator=g).bfloat16()
    res = dry_run(os.path.join(work, "guide_gemm.py"), [a, b], "guide_gemm")
    from metakernel.dsl.tirx_host import cuda_sources
    mod = sys.modules.get("guide_gemm")
    src = "".join(s for exe in mod._EXES.values() for s in cuda_sources(exe.mod)) if mod else ""
    res["cuda"] = {s: s in src for s in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                         "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                                         "cp.async.wait_group 1", "extern __shared__")}
    return res


@scenario("p28")
def _():
    prob = load(sys.argv[2], "problem28")
    torch.manual_seed(0)
    inputs = prob.make_inputs(device="cpu", scale="small")
    res = dry_run(sys.argv[3], inputs, "p28_tirx")
    ref = prob.reference(*inputs)
    res["expected"] = [[list(o.shape), str(o.dtype), str(o.device)] for o in ref]
    return res


@scenario("parse_error")
def _():
    return dry_run(os.path.join(work, "parse_error.py"), [torch.randn(4, 256)], "parse_error")


@scenario("lowering_error")
def _():
    return dry_run(os.path.join(work, "lowering_error.py"), [torch.randn(4, 256)], "lowering_error")


@scenario("device_error")
def _():
    if os.environ.get("METAKERNEL_TIRX_DEVICE_COMPILE") != "1":
        return {"skipped": "no CUDA compiler on this machine"}
    return dry_run(os.path.join(work, "device_error.py"), [torch.randn(4, 256)], "device_error")


@scenario("llvm")
def _():
    mod = load(os.path.join(work, "llvm_kernel.py"), "llvm_kernel")
    x, b = torch.randn(7, 33), torch.randn(33)
    want = x * 2 + b
    inputs = frozenset(t.untyped_storage().data_ptr() for t in (x, b))  # a suppressed launch garbles the rest
    res = {}
    gate = LaunchGate(mode="run")
    ADAPTER.install_hooks(gate)
    y = mod.solve(x, b)
    res["run"] = {"err": float((y - want).abs().max()), **gate_dict(gate)}
    gate = LaunchGate(mode="suppress", protected=inputs)
    ADAPTER.install_hooks(gate)
    y = mod.solve(x, b)
    res["suppress"] = {"computed": bool(torch.allclose(y, want)), **gate_dict(gate)}
    # every route to the compiled function: each call must count exactly once and compute right in "run"
    exe = mod.exe()
    built = tvm.tirx.build(mod.axpb, target="llvm", pipeline="tirx")
    routes = {
        "exe()": lambda *a: exe(*a),
        "exe['main']": lambda *a: exe["main"](*a),
        "exe.jit().main": lambda *a: exe.jit().main(*a),
        "exe.mod.main": lambda *a: exe.mod.main(*a),
        "exe.mod['main']": lambda *a: exe.mod["main"](*a),
        "exe.mod()": lambda *a: exe.mod(*a),
        "exe.mod.get_function('main')": lambda *a: exe.mod.get_function("main")(*a),
        "exe.mod.get_function('axpb')": lambda *a: exe.mod.get_function("axpb")(*a),
        "tirx.build()['main']": lambda *a: built["main"](*a),
    }
    res["routes"] = {}
    for name, call in routes.items():
        out = {}
        for mode in ("run", "suppress"):
            gate = LaunchGate(mode=mode, protected=inputs)
            ADAPTER.install_hooks(gate)
            y = torch.zeros_like(x)
            call(x, b, y)
            out[mode] = {"launches": gate.launches, "suppressed": gate.suppressed,
                         "computed": bool(torch.allclose(y, want))}
        res["routes"][name] = out
    gate = LaunchGate(mode="suppress", protected=inputs)
    ADAPTER.install_hooks(gate)
    y = torch.zeros_like(x)
    timer = exe.mod.time_evaluator("main", tvm.cpu(0), number=1, repeat=1)
    timer(x, b, y)
    res["time_evaluator"] = {"launches": gate.launches, "computed": bool(torch.allclose(y, want))}
    # hook overhead per call (run mode) against the raw tvm-ffi function
    gate = LaunchGate(mode="run")
    ADAPTER.install_hooks(gate)
    raw, gated = exe.mod.main._func, exe.mod.main
    for f, key in ((raw, "raw_us"), (gated, "gated_us")):
        t0 = time.perf_counter()
        for _ in range(2000):
            f(x, b, y)
        res[key] = (time.perf_counter() - t0) / 2000 * 1e6
    return res


@scenario("idempotent")
def _():
    mod = sys.modules["llvm_kernel"]
    x, b = torch.randn(3, 8), torch.randn(8)
    old, new = LaunchGate(mode="run"), LaunchGate(mode="run")
    ADAPTER.install_hooks(old)
    ADAPTER.install_hooks(old)
    mod.solve(x, b)
    once = old.launches
    ADAPTER.install_hooks(new)
    mod.solve(x, b)
    from tvm_ffi import _ffi_api
    wrapped = getattr(_ffi_api.ModuleGetFunction, "__name__", "")
    audit = LaunchGate(mode="run", audit=True)
    ADAPTER.install_hooks(audit)
    mod.solve(x, b)
    shots = [[list(t.shape) for t in shot.before] for shot in audit.audited]
    return {"same_gate_twice": once, "old_after_switch": old.launches, "new": new.launches, "patched_fn": wrapped,
            "audited": shots}


print("REPORT " + json.dumps(report))
'''


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not HAVE_TVM:
        pytest.skip("apache-tvm is not installed")
    work = tmp_path_factory.mktemp("tirx")
    (work / "guide_example.py").write_text(guide_example(), encoding="utf-8")
    (work / "guide_gemm.py").write_text(guide_example("tirx-gemm"), encoding="utf-8")
    (work / "llvm_kernel.py").write_text(LLVM_KERNEL, encoding="utf-8")
    (work / "parse_error.py").write_text(PARSE_ERROR_KERNEL, encoding="utf-8")
    (work / "lowering_error.py").write_text(LOWERING_ERROR_KERNEL, encoding="utf-8")
    (work / "device_error.py").write_text(DEVICE_ERROR_KERNEL, encoding="utf-8")
    (work / "child.py").write_text(CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(work / "child.py"), str(work), str(P28), str(P28_TIRX)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=work)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line, f"child failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    report = json.loads(line[len("REPORT "):])
    report["child_s"] = time.perf_counter() - started
    print(json.dumps({k: v for k, v in report.items() if k in ("import_dsl_s", "child_s", "env")}))
    return report


def guide_example(marker: str = "tirx-example") -> str:
    """The guide's python block between `<!-- {marker}-begin -->` and `<!-- {marker}-end -->`."""
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(rf"<!-- {marker}-begin -->\s*```python\n(.*?)```\s*<!-- {marker}-end -->", text, re.S)
    assert m, f"the guide lost its marked example {marker}"
    return m.group(1)


def _ok(res: dict) -> dict:
    assert "exception" not in res, res["exception"]
    assert "error" not in res, res["error"]
    return res


# ------------------------------------------------------------------------------------------- no DSL needed
def test_adapter_satisfies_protocol():
    assert isinstance(ADAPTER, DslAdapter)
    assert ADAPTER.key == "tirx" and ADAPTER.import_roots == ("tvm",)
    assert "def solve" in ADAPTER.guide()
    assert len(ADAPTER.guide().splitlines()) < 330  # the worked tensor-core GEMM is ~95 lines of it


def test_environment_names_a_device_compiler_for_dry_runs():
    env = ADAPTER.environment(dry_run=True)
    assert env["METAKERNEL_TIRX_DEVICE_COMPILE"] in ("0", "1")
    if env["METAKERNEL_TIRX_DEVICE_COMPILE"] == "1":
        assert env["TVM_CUDA_COMPILE_MODE"] in ("nvrtc", "nvcc")
    assert "METAKERNEL_TIRX_DEVICE_COMPILE" not in ADAPTER.environment(dry_run=False)


def test_kernel_name_fallback_matcher():
    assert ADAPTER.is_dsl_kernel_name("fused_add_rmsnorm_kernel")
    assert ADAPTER.is_dsl_kernel_name("main_kernel_1")
    assert not ADAPTER.is_dsl_kernel_name("void at::native::vectorized_elementwise_kernel<4, float>(int, float)")
    assert not ADAPTER.is_dsl_kernel_name("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT")


def test_clean_error_strips_ansi_header_warnings_and_tvm_frames():
    fp8_noise = "".join(
        f'/usr/local/cuda/include/cuda_fp8.hpp({100 + i}): warning #177-D: variable "x{i}" was declared but never '
        f"referenced\n      unsigned int x{i} = 0;\n                   ^\n\n" for i in range(10))
    text = (
        "Traceback (most recent call last):\n"
        '  File "/runs/a/kernel.py", line 40, in solve\n    _exe()(x, y)\n    ^^^^^^^^^^^^\n'
        '  File "/venv/lib/python3.11/site-packages/tvm_ffi/module.py", line 170, in __getattr__\n'
        "    func = self.get_function(name)\n"
        '  File "python/tvm_ffi/cython/function.pxi", line 1038, in tvm_ffi.core.Function.__call__\n'
        '  File "/project/src/runtime/cuda/cuda_module.cc", line 120, in Launch\n'
        "RuntimeError: NVRTC compilation failed:\n" + fp8_noise
        + "Remark: The warnings can be suppressed with \"-diag-suppress <warning-number>\"\n\n"
        "tvm_kernels.cu(57): error: identifier \"foo\" is undefined\n"
        "\x1b[1;31merror\x1b[0m: 1 error detected\n")
    out = ADAPTER.clean_error(text)
    assert "\x1b" not in out
    assert "cuda_fp8.hpp" not in out and "warning #177" not in out and "Remark:" not in out
    assert 'File "/runs/a/kernel.py", line 40, in solve' in out
    assert "function.pxi" not in out and "/project/src" not in out and "frame(s) inside tvm omitted" in out
    assert 'tvm_kernels.cu(57): error: identifier "foo" is undefined' in out
    assert "error: 1 error detected" in out


def test_clean_error_trims_ir_dumps_and_cuda_source():
    ir = "\n".join(["Cannot resolve ScopeIdDef for target=llvm binding=1", "", "Error in pass: _pipeline",
                    "Location (TVMScript):", "# from tvm.script import ir as I", "# from tvm.script import tirx as T",
                    "", "@I.ir_module", "class Module:", "    @T.prim_func", "    def bad(X, Y):"]
                   + [f"        Y[{i}] = X[{i}]\n        ^^^^^^^^^^^^^^" for i in range(60)])
    out = clean_error_text("tvm.error.InternalError: " + ir)
    assert "Cannot resolve ScopeIdDef" in out and "Error in pass: _pipeline" in out
    assert "IR dump" in out and len(out.splitlines()) < 30 and "^^^^" not in out
    src = "\n".join(f"  line {i} of generated cuda;" for i in range(300))
    out = clean_error_text("RuntimeError: " + src + "\nCompilation error:\nk.cu(3): error: bad thing\n")
    assert "generated CUDA source, 300 lines, omitted" in out and "k.cu(3): error: bad thing" in out
    assert "line 150 of generated" not in out


def test_gate_counts_without_tvm():
    gate = LaunchGate(mode="suppress")
    assert gate.should_launch() is False and gate.launches == gate.suppressed == 1


# ------------------------------------------------------------------------------------------- the child
def test_guide_example_passes_dry_run(child):
    res = _ok(child["guide"])
    assert res["launches"] >= 2 and res["suppressed"] == res["launches"]  # two solve calls, none launched
    assert res["outs"] == [[[5, 256], "torch.bfloat16", "cpu"]]
    assert res["kernel_names"] == ["scale_bias_kernel"]
    assert res["second_call_s"] < 0.5  # compiled once, cached


def test_guide_gemm_example_passes_dry_run(child):
    """The guide's tensor-core GEMM lowers to CUDA with mma.sync, ldmatrix and cp.async (and compiles offline)."""
    res = _ok(child["guide_gemm"])
    assert res["launches"] >= 2 and res["suppressed"] == res["launches"]
    assert res["outs"] == [[[256, 384], "torch.bfloat16", "cpu"]]
    assert res["kernel_names"] == ["gemm_kernel"]
    assert all(res["cuda"].values()), res["cuda"]
    assert res["second_call_s"] < 0.5  # compiled once per (N, K)


def test_problem28_kernel_passes_dry_run(child):
    res = _ok(child["p28"])
    assert res["launches"] >= 2 and res["suppressed"] == res["launches"]
    assert res["outs"] == res["expected"]
    assert res["kernel_names"] == ["fused_add_rmsnorm_kernel"]


def test_parse_error_is_raised_and_cleaned(child):
    res = child["parse_error"]
    err = res["error"]
    assert "\x1b" not in err
    assert "Undefined variable: not_defined_anywhere" in err
    assert re.search(r"parse_error\.py:14:\d+", err), err  # the user's file and line
    assert "site-packages/tvm" not in err
    assert res["launches"] == 0


def test_lowering_error_in_solve_is_raised_and_cleaned(child):
    res = child["lowering_error"]
    err = res["error"]
    assert "constant size" in err and "lowering_error.py" in err and 'line 21, in solve' in err
    assert res["launches"] == 0


def test_cuda_compiler_error_surfaces_in_dry_run(child):
    res = child["device_error"]
    if "skipped" in res:
        pytest.skip(res["skipped"])
    err = res["error"]
    assert 'identifier "no_such_device_fn" is undefined' in err and "CUDA device compilation" in err
    assert "generated CUDA source" in err and "warning #177" not in err and "__global__" not in err
    assert 'device_error.py", line 21, in solve' in err
    assert res["launches"] == 1  # counted, not launched, then the offline compile failed


def test_llvm_kernel_runs_counts_and_suppresses(child):
    res = _ok(child["llvm"])
    assert res["run"]["launches"] == 1 and res["run"]["suppressed"] == 0 and res["run"]["err"] < 1e-5
    assert res["suppress"]["launches"] == 1 and res["suppress"]["suppressed"] == 1
    assert not res["suppress"]["computed"]
    assert res["run"]["kernel_names"] == []  # CPU code: no device kernels to attribute


def test_every_launch_route_is_gated(child):
    routes = _ok(child["llvm"])["routes"]
    assert len(routes) == 9
    for name, r in routes.items():
        assert r["run"] == {"launches": 1, "suppressed": 0, "computed": True}, name
        assert r["suppress"] == {"launches": 1, "suppressed": 1, "computed": False}, name
    te = child["llvm"]["time_evaluator"]
    assert te == {"launches": 1, "computed": False}


def test_hooks_are_idempotent_and_follow_the_latest_gate(child):
    res = _ok(child["idempotent"])
    assert res["same_gate_twice"] == 1
    assert res["old_after_switch"] == 1 and res["new"] == 1
    assert res["patched_fn"] == "_gated_module_get_function"
    assert res["audited"] == [[[3, 8], [8], [3, 8]]]  # the launch's tensor arguments reach the gate


def test_hook_overhead_is_small(child):
    res = _ok(child["llvm"])
    assert res["gated_us"] - res["raw_us"] < 20, res
    print(textwrap.dedent(f"raw {res['raw_us']:.2f} us, gated {res['gated_us']:.2f} us per call"))
