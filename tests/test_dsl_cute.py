"""The CuTe DSL adapter on a CPU machine: dry runs, launch hooks, error cleaning.

Everything that imports the DSL runs in fresh subprocesses, started together by one module-scoped fixture:
- the hooks patch process-global classes (CuTe's compiled-function classes) and, without CUDA, `torch.cuda`
  stream/property functions — they must not leak into the rest of the pytest session;
- a dry run is defined as "a fresh process that installs the hooks before importing the candidate", which is
  what the grader's child does;
- `import cutlass.cute` costs 2-4 s and each process pays it once; running the processes in parallel keeps the
  module under a minute on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metakernel.dsl.base import DslAdapter, LaunchGate
from metakernel.dsl.cute import ADAPTER, clean_error_text
from metakernel.grader.static import check_source

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "cute.md"
P28 = ROOT / "problems" / "mlp_norm" / "28_fused_add_rmsnorm_h4096.py"
S28 = ROOT / "solutions" / "mlp_norm" / "28_fused_add_rmsnorm_h4096" / "correct" / "cute.py"

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

AFFINE_PROBLEM = '''"""Test problem for the guide's example: per-channel affine y = x * w + b in bf16."""
import torch


def reference(x, w, b):
    return (x.float() * w.float() + b.float()).to(x.dtype)


def make_inputs(device="cuda", scale="full"):
    m, n = (4096, 4096) if scale == "full" else (37, 256)
    x = torch.randn(m, n, device=device).to(torch.bfloat16)
    w = torch.randn(n, device=device).to(torch.bfloat16)
    b = torch.randn(n, device=device).to(torch.bfloat16)
    return [x, w, b]


def roofline(x, w, b):
    return {"flops": 2 * x.numel(), "bytes": 4 * x.numel()}
'''

GEMM_PROBLEM = '''"""Test problem for the guide's tensor-core example: C = A @ B^T in bf16 (fp32 accumulation)."""
import torch


def reference(a, b):
    return (a.float() @ b.float().t()).to(a.dtype)


def make_inputs(device="cuda", scale="full"):
    m, n, k = (1024, 2048, 1024) if scale == "full" else (128, 256, 192)   # tile multiples; 16 and 3 k-tiles
    a = torch.randn(m, k, device=device).to(torch.bfloat16)
    b = torch.randn(n, k, device=device).to(torch.bfloat16)
    return [a, b]


def roofline(a, b):
    return {"flops": 2 * a.shape[0] * b.shape[0] * a.shape[1], "bytes": 2 * (a.numel() + b.numel())}
'''

# The guide's tensor-core example through the grader's own dry run (its sandbox refuses what a real grading would).
GEMM_SCRIPT = '''
import json, sys
from pathlib import Path
from metakernel.grader.evaluate import dry_run
from metakernel.problem import load_problem_file

report = dry_run(load_problem_file(Path(sys.argv[2])), "cute", Path(sys.argv[1]))
print("RESULT " + json.dumps({"status": report.status, "reason": report.reason, "message": report.message,
                              "launches": report.launches_per_call}))
'''

# Other ways a candidate may launch the guide's kernel; appended to the guide's example for the hooks test.
ROUTES = '''

from cutlass.cute.runtime import from_dlpack
import cutlass.torch as ctorch

_plain = {}


def solve_dlpack(x, w, b):
    y = torch.empty_like(x)
    args = [from_dlpack(t, assumed_align=16) for t in (x, w, b, y)]
    if "f" not in _plain:
        _plain["f"] = cute.compile(affine, *args, ctorch.current_stream())
    _plain["f"](*args, ctorch.current_stream())
    return y


def solve_direct(x, w, b):
    y = torch.empty_like(x)
    affine(*[from_dlpack(t, assumed_align=16) for t in (x, w, b, y)], ctorch.current_stream())
    return y


def solve_executor(x, w, b):
    y = torch.empty_like(x)
    args = [from_dlpack(t, assumed_align=16) for t in (x, w, b, y)]
    if "e" not in _plain:
        _plain["e"] = cute.compile(affine, *args, make_fake_stream()).to(0)
    _plain["e"](*args, ctorch.current_stream())
    return y


def solve_ffi_dlpack(x, w, b):
    y = torch.empty_like(x)
    if "d" not in _plain:
        args = [from_dlpack(t, assumed_align=16, enable_tvm_ffi=True) for t in (x, w, b, y)]
        _plain["d"] = cute.compile(affine, *args, make_fake_stream(use_tvm_ffi_env_stream=True),
                                   options="--enable-tvm-ffi")
    _plain["d"](x, w, b, y)
    return y


def solve_bad_arity(x, w, b):
    y = torch.empty_like(x)
    args = [from_dlpack(t, assumed_align=16) for t in (x, w, b, y)]
    if "f" not in _plain:
        _plain["f"] = cute.compile(affine, *args, ctorch.current_stream())
    _plain["f"](*args[:3], ctorch.current_stream())
    return y
'''

HOOKS_SCRIPT = '''
import importlib.util, json, sys, traceback
import torch
from metakernel.dsl.base import LaunchGate
from metakernel.dsl import cute as mc

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

res = {}
first = LaunchGate(mode="intercept")
mc.ADAPTER.install_hooks(first)
wrappers = [(cls, name) for cls, name, _ in mc._STATE.patched]
before = {f"{c.__name__}.{n}": c.__dict__[n] for c, n in wrappers}
res["patched"] = sorted(before)
second = LaunchGate(mode="intercept")
mc.ADAPTER.install_hooks(second)
mc.ADAPTER.install_hooks(second)
after = {f"{c.__name__}.{n}": c.__dict__[n] for c, n in wrappers}
res["same_wrappers"] = all(before[k] is after[k] for k in before) and len(mc._STATE.patched) == len(before)
res["no_double_wrap"] = all(getattr(getattr(f, mc._MARK), mc._MARK, None) is None for f in after.values())
res["torch_stream"] = torch.cuda.current_stream().cuda_stream

kernel = load(sys.argv[1], "candidate_kernel")
x = torch.randn(37, 256).to(torch.bfloat16)
w = torch.randn(256).to(torch.bfloat16)
b = torch.randn(256).to(torch.bfloat16)
for route in ["solve", "solve_dlpack", "solve_direct", "solve_executor", "solve_ffi_dlpack"]:
    second.reset()
    counts = []
    try:
        for _ in range(2):
            y = getattr(kernel, route)(x, w, b)
            counts.append(second.launches)
        res[route] = {"launches": counts, "suppressed": second.suppressed, "shape": list(y.shape),
                      "dtype": str(y.dtype)}
    except PermissionError as exc:  # the gate cannot read CuTe's own wrappers: refused, once counted
        res[route] = {"launches": [second.launches], "refused": str(exc)}
res["first_gate_launches"] = first.launches
res["kernel_names"] = sorted(second.kernel_names)

second.mode = "suppress"
second.reset()
kernel.solve(x, w, b)
res["suppress"] = {"launches": second.launches, "suppressed": second.suppressed}

second.mode = "intercept"
try:
    kernel.solve_bad_arity(x, w, b)
    res["bad_arity"] = None
except Exception as exc:
    res["bad_arity"] = mc.ADAPTER.clean_error("".join(traceback.format_exception(exc)))

second.mode = "run"   # no GPU here: a launch that really goes ahead must fail
second.reset()
try:
    kernel.solve_dlpack(x, w, b)
    res["run"] = {"raised": None}
except Exception as exc:
    res["run"] = {"raised": type(exc).__name__, "launches": second.launches, "suppressed": second.suppressed}

# the problem-28 solution and a kernel with a compile error, through the same dry-run entry point as the CLI
res["p28"] = mc.dry_run(sys.argv[2], sys.argv[3])
try:
    mc.dry_run(sys.argv[4], sys.argv[5])
    res["broken"] = None
except Exception as exc:
    res["broken"] = mc.ADAPTER.clean_error("".join(traceback.format_exception(exc)))
print("RESULT " + json.dumps(res))
'''

ERROR_KERNEL_EDIT = (".store((x * w + b).to(mY.element_type))", ".store(x * w + b)")


def _guide_example(heading: str = "## A complete example") -> str:
    """The first Python block after `heading` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"the guide's code block after {heading!r} is missing"
    return match.group(1)


def _guide_gemm() -> str:
    return _guide_example("## Tensor cores: warpgroup MMA")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(ADAPTER.environment(dry_run=True))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    tmp = tmp_path_factory.mktemp("cute")
    problem = tmp / "problem_affine.py"
    problem.write_text(AFFINE_PROBLEM, encoding="utf-8")
    example = tmp / "kernel.py"
    example.write_text(_guide_example(), encoding="utf-8")
    broken = tmp / "kernel_broken.py"
    old, new = ERROR_KERNEL_EDIT
    assert old in _guide_example()
    broken.write_text(_guide_example().replace(old, new), encoding="utf-8")
    routes = tmp / "kernel_routes.py"
    routes.write_text(_guide_example() + ROUTES, encoding="utf-8")
    hooks = tmp / "hooks_script.py"
    hooks.write_text(HOOKS_SCRIPT, encoding="utf-8")
    gemm = tmp / "kernel_gemm.py"
    gemm.write_text(_guide_gemm(), encoding="utf-8")
    gemm_problem = tmp / "90_guide_gemm.py"
    gemm_problem.write_text(GEMM_PROBLEM, encoding="utf-8")
    gemm_script = tmp / "gemm_script.py"
    gemm_script.write_text(GEMM_SCRIPT, encoding="utf-8")
    dry = [sys.executable, "-m", "metakernel.dsl.cute"]
    commands = {  # a small CI machine has two cores; the GEMM's sandboxed dry run is the longest
        "example": dry + [str(example), str(problem)],
        "hooks": [sys.executable, str(hooks), str(routes), str(S28), str(P28), str(broken), str(problem)],
        "gemm": [sys.executable, str(gemm_script), str(gemm), str(gemm_problem)],
    }
    procs = {key: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                   cwd=tmp) for key, cmd in commands.items()}
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[key] = (proc.returncode, stdout, stderr)
    return out


def _json(run: tuple[int, str, str]) -> dict:
    code, stdout, stderr = run
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON from the dry run (exit {code}):\n{stdout}\n{stderr[-3000:]}"
    return json.loads(lines[-1])


def _hooks(runs: dict) -> dict:
    code, stdout, stderr = runs["hooks"]
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"hooks script failed (exit {code}):\n{stderr[-4000:]}"
    return json.loads(line[len("RESULT "):])


def _check_dry_run(result: dict) -> None:
    assert result.get("ok", True), result.get("error")
    assert result["launches"] == [1, 1]  # every call launches once, compiled once
    assert result["suppressed"] == 1  # intercepted: counted, not launched
    assert result["outputs"] == result["expected"]  # same structure, shapes, dtypes
    assert result["kernel_names"] and all(n.startswith("kernel_cutlass_") for n in result["kernel_names"])


def test_adapter_protocol() -> None:
    assert isinstance(ADAPTER, DslAdapter)
    assert (ADAPTER.key, ADAPTER.name, ADAPTER.import_roots) == ("cute", "CuTe DSL", ("cutlass",))
    assert ADAPTER.environment(dry_run=True)["CUTE_DSL_ARCH"] == "sm_90a"
    assert ADAPTER.environment(dry_run=False)["CUTE_DSL_ARCH"] == "sm_90a"
    guide = ADAPTER.guide()
    assert "def solve(" in guide and "--enable-tvm-ffi" in guide
    assert len(guide.splitlines()) < 400


def test_guide_example_and_solution_pass_static_rules() -> None:
    for source in (_guide_example(), _guide_gemm(), S28.read_text(encoding="utf-8")):
        result = check_source(source, "cute")
        assert result.ok, result


def test_guide_example_dry_run(runs: dict) -> None:
    result = _json(runs["example"])
    _check_dry_run(result)
    assert result["outputs"] == {"shape": [37, 256], "dtype": "torch.bfloat16", "device": "cpu"}
    assert result["kernel_names"][0].startswith("kernel_cutlass_affine_kernel_")


def test_guide_tensor_core_gemm_dry_run(runs: dict) -> None:
    """The wgmma + TMA example compiles for sm_90a at both scales (3 k-tiles: fewer than the 4 stages; 16 k-tiles:
    the refill path) inside the grader's sandbox, and launches once per call. Its values need the GPU
    (scripts/check_guide_gemm.py)."""
    code, stdout, stderr = runs["gemm"]
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"the GEMM dry run failed (exit {code}):\n{stderr[-4000:]}"
    result = json.loads(line[len("RESULT "):])
    assert (result["status"], result["reason"]) == ("passed", "dry_run"), result["message"]
    assert result["launches"] == 1
    assert "full scale" in result["message"] and "1 launch(es) compiled" in result["message"]


def test_problem28_solution_dry_run(runs: dict) -> None:
    result = _hooks(runs)["p28"]
    _check_dry_run(result)
    assert result["outputs"] == [{"shape": [300, 256], "dtype": "torch.bfloat16", "device": "cpu"}] * 2


def test_compile_error_is_raised_and_clean(runs: dict) -> None:
    error = _hooks(runs)["broken"]
    assert error, "the broken kernel compiled"
    assert "\x1b[" not in error
    assert "Type mismatch" in error and "BFloat16" in error
    assert re.search(r'kernel_broken\.py", line \d+', error)  # the candidate's own frame survives
    assert "site-packages" not in error  # DSL-internal frames are hidden
    assert len(error.splitlines()) < 60


def test_hooks_every_route_idempotent_suppress_and_run(runs: dict) -> None:
    res = _hooks(runs)
    assert res["same_wrappers"] and res["no_double_wrap"]
    assert {"JitCompiledFunction.__call__", "JitExecutor.run_compiled_program",
            "TVMFFIJitCompiledFunctionWithKwargs.__call__"} <= set(res["patched"])
    assert res["torch_stream"] == 0  # the dry-run stand-in for torch's current stream
    for route in ["solve", "solve_ffi_dlpack"]:  # torch tensors handed to the launch (the TVM-FFI route)
        assert res[route]["launches"] == [1, 2], (route, res[route])  # counted once per call, never twice
        assert res[route]["suppressed"] == 2
        assert res[route]["shape"] == [37, 256] and res[route]["dtype"] == "torch.bfloat16"
    for route in ["solve_dlpack", "solve_direct", "solve_executor"]:  # CuTe's wrappers: gated, then refused
        assert res[route]["launches"] == [1] and "cannot read" in res[route]["refused"], (route, res[route])
    assert res["first_gate_launches"] == 0  # a re-install swaps the gate
    assert any(n.startswith("kernel_cutlass_affine_kernel_") for n in res["kernel_names"])
    assert res["suppress"] == {"launches": 1, "suppressed": 1}
    assert "cannot read" in res["bad_arity"] and "kernel_routes.py" in res["bad_arity"]
    assert "metakernel/dsl/cute.py" not in res["bad_arity"]  # the error points at the candidate, not the hook
    assert res["run"]["raised"] and res["run"]["launches"] == 1 and res["run"]["suppressed"] == 0


def test_clean_error_text_unit() -> None:
    mlir = "\n".join(f'    %{i} = "cute.make_layout"(%{i - 1}) : (!cute.int) -> !cute.layout<"(8,1)">'
                     for i in range(1, 41))
    warnings = "\n".join(
        f"/usr/local/cuda/include/cuda_fp8.hpp({100 + i}): warning #177-D: variable \"x\" was declared but never "
        f"referenced\n      int x;\n          ^\n" for i in range(10))
    body = textwrap.dedent("""\
        Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

        Traceback (most recent call last):
          File "/work/kernel.py", line 40, in solve
            fn = cute.compile(host, x)
          File "/venv/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/base_dsl/dsl.py", line 99, in compile
            return self._func(x)
          File "/venv/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/base_dsl/compiler.py", line 9, in run
            raise DSLRuntimeError(msg)
        cutlass.base_dsl.common.DSLRuntimeError:
        \x1b[91m\x1b[1merror\x1b[0m: bad layout
          \x1b[94m-->\x1b[0m /work/kernel.py:12:5
        module {
        """)
    text = warnings + body + mlir + "\n}\n"
    clean = clean_error_text(text)
    assert "\x1b" not in clean
    assert "cuda_fp8.hpp" not in clean and "diag-suppress" not in clean
    assert 'File "/work/kernel.py", line 40, in solve' in clean
    assert "dsl.py" not in clean and "frames inside the DSL/harness hidden" in clean
    assert "error: bad layout" in clean and "--> /work/kernel.py:12:5" in clean
    assert "lines of MLIR/IR removed" in clean and "%20 =" not in clean and "%1 =" in clean
    assert len(clean.splitlines()) < 25
    assert len(clean_error_text("x" * 5000)) < 700


def test_gate_semantics_without_the_dsl() -> None:
    gate = LaunchGate(mode="suppress")
    assert not gate.should_launch() and (gate.launches, gate.suppressed) == (1, 1)


def test_the_dsl_may_reparse_its_own_library_functions_in_the_sandbox(tmp_path: Path) -> None:
    """`cutlass.pipeline`'s helpers are @cute.jit functions the DSL re-parses from its installed source; the
    sandbox took that for a string compiled at run time and refused the allowlisted module (found writing the
    tensor-core gold kernel of problem 32). The DSL's own read-only files are allowed; other source is not."""
    from metakernel.grader.evaluate import dry_run
    from metakernel.problem import load_problem_file

    family = tmp_path / "mlp_norm"
    family.mkdir()
    (family / "91_affine.py").write_text(AFFINE_PROBLEM, encoding="utf-8")
    problem = load_problem_file(family / "91_affine.py")
    src = _guide_example().replace("import cutlass.cute as cute\n",
                                   "import cutlass.cute as cute\nimport cutlass.pipeline as pipeline\n")
    src = src.replace("    nvec = mX.shape[1] // VEC", "    state = pipeline.make_pipeline_state("
                      "pipeline.PipelineUserType.Producer, 4)\n    state.advance()\n    nvec = mX.shape[1] // VEC")
    assert "state.advance()" in src
    kernel = tmp_path / "kernel.py"
    kernel.write_text(src, encoding="utf-8")
    report = dry_run(problem, "cute", kernel)
    assert (report.status, report.reason) == ("passed", "dry_run"), report.agent_text()
