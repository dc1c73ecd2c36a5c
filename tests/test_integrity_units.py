"""Unit checks of the integrity pieces that need no child process: token forms, kernel attribution, the
dependency ablation's restore rule and the audit hook's compile rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from metakernel.compare import Expected
from metakernel.dsl.base import LaunchGate
from metakernel.grader.child import _type_expression
from metakernel.grader.kernels import classify, is_symbol
from metakernel.grader.tokens import token_output, token_pair


def _expected(out: torch.Tensor) -> Expected:
    return Expected(returned=out, names=("out",), mutated=(), anchor={"out": out.double()}, reference={"out": out},
                    specs={})


def test_token_forms_are_found_and_honest_arguments_are_not():
    """Pins the audit: the answer as is, affine, transposed, permuted, padded or (ints) shifted is a token; an
    input, or an independent tensor of the same distribution, is not."""
    torch.manual_seed(1)
    x = torch.randn(64, 48)
    out = x * 3.0 - 1.0
    expected = _expected(out)
    for form in (out.clone(), 2 * out + 5, out.t().contiguous(), out.reshape(-1)[torch.randperm(out.numel())],
                 torch.cat([out.reshape(-1), torch.zeros(1)]), 0.5 * out.t().contiguous()):
        assert token_output(form, [x], expected, ()) == "out"
    assert token_output(x.clone(), [x], expected, ()) is None  # an input: the honest kernel's argument
    assert token_output(torch.randn(64, 48), [x], expected, ()) is None
    ids = torch.randint(0, 1000, (4096,))
    assert token_output(ids + 1000, [x], _expected(ids), ()) == "out"
    assert token_output(torch.randint(0, 1000, (4096,)), [x], _expected(ids), ()) is None


def test_an_answer_kept_in_a_wider_type_is_a_token():
    """Hole 7: the eager answer in fp32 (or fp64), handed to a kernel that only narrows it into a bf16 output, is
    the answer; a wider tensor of other values is not."""
    torch.manual_seed(4)
    x = torch.randn(64, 64)
    wide = x.float() * 1.7 + 0.3
    out = wide.to(torch.bfloat16)
    expected = _expected(out)
    assert token_output(wide, [x], expected, ()) == "out"
    assert token_output(wide.double(), [x], expected, ()) == "out"
    assert token_output(torch.randn(64, 64), [x], expected, ()) is None
    # ... and widened as well as padded, reordered or transposed (hole 7's combined forms; rescaled as well is not
    # found: the bf16 answer's rounding is above the affine fit's tolerance)
    padded = torch.cat([wide.reshape(-1), torch.randn(16)])
    permuted = wide.reshape(-1)[torch.randperm(wide.numel())]
    for form in (padded, permuted, wide.t().contiguous()):
        assert token_output(form, [x], expected, ()) == "out"
    assert token_output(torch.cat([torch.randn(64 * 64), torch.randn(16)]), [x], expected, ()) is None


def test_token_forms_are_found_in_dtypes_torch_cannot_sort():
    """fp8 answers (problem 61): torch has no sort or equal for them, the audit compares bit patterns."""
    torch.manual_seed(2)
    x = torch.randn(64, 64)
    q = (x * 4).to(torch.float8_e4m3fn)
    expected = _expected(q)
    for form in (q.reshape(-1)[torch.randperm(q.numel())], torch.cat([q.reshape(-1), q.reshape(-1)[:3]])):
        assert token_output(form, [x], expected, ()) == "out"
    assert token_output(torch.randn(64, 64).to(torch.float8_e4m3fn), [x], expected, ()) is None
    assert token_output(q.view(torch.int32), [x], expected, ()) == "out"  # the answer's bytes as int32 words


def test_an_answer_split_over_two_arguments_by_xor_is_a_token():
    """The eager answer XOR-ed with a random key, handed to the DSL with the key (rt_cute_token_xor_burn): each
    argument alone is noise, the pair is the answer. Unrelated argument pairs are not."""
    torch.manual_seed(3)
    x = torch.randn(128, 128)
    q = (x * 4).to(torch.float8_e4m3fn)
    expected = _expected(q)
    key = torch.randint(-(2 ** 31), 2 ** 31 - 1, (q.numel() // 4,), dtype=torch.int32)
    masked = q.view(torch.int32).reshape(-1) ^ key
    assert token_output(masked, [x], expected, ()) is None and token_output(key, [x], expected, ()) is None
    out = torch.empty(q.numel() // 4, dtype=torch.int32)
    assert token_pair([masked, key, out], [x], expected, ()) == "out"
    other = torch.randint(-(2 ** 31), 2 ** 31 - 1, key.shape, dtype=torch.int32)
    assert token_pair([other, key, out], [x], expected, ()) is None
    y = torch.randn(64, 48)
    assert token_pair([y, torch.randn(64, 48), y * 2], [x], _expected(y * 3 - 1), ()) is None


def test_kernels_are_attributed_by_exact_symbol():
    """A DSL kernel only by the exact symbol it compiled; library kernels by C++ names or vendor prefixes; any
    other plain C name is another JIT's."""
    symbols = {"kernel_cutlass_add_0"}
    assert classify("kernel_cutlass_add_0", symbols) == "dsl"
    assert classify("kernel_cutlass_add_1", symbols) == "foreign"  # no substring matching
    assert classify("void at::native::vectorized_elementwise_kernel<4>(int)", symbols) == "library"
    assert classify("nvjet_tst_128x256_h", symbols) == "library" and classify("sm90_xmma_gemm", symbols) == "library"
    assert classify("Memcpy DtoD (Device -> Device)", symbols) == "library"
    for foreign in ("triton_poi_fused_add_0", "elementwise_kernel", "at_gemm", "gemm_kernel"):
        assert classify(foreign, symbols) == "foreign"
    # a DSL symbol set holding a demangled C++ name was written by the candidate (session 27: CuTe's kernel_info):
    # the grading refuses it as foreign_kernel before classifying
    assert not is_symbol("void at::native::vectorized_elementwise_kernel<4>(int)") and is_symbol("kernel_cutlass_add_0")


PROBLEM_28 = Path(__file__).resolve().parents[1] / "solutions/mlp_norm/28_fused_add_rmsnorm_h4096"
RT_KERNEL_INFO = PROBLEM_28 / "wrong/rt_cute_kernel_info_torch_names.py"


def _load_file(path: Path) -> Any:
    """A kernel file imported as a module of its own (this process: no hooks, no confinement)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _confined_cute_solves(paths: list[Path], prelude: str = "") -> list[list[Any]]:
    """Each file's `solve` on problem 28's inputs, in one fresh process with CuTe's launch hooks and confinement in
    place as a checked child has them (hooks are per process): per file `["launched", launches, kernel names]` or
    `["refused", message, native-code audit events so far, kernel names]`. `prelude` runs before `confine`."""
    import json
    import subprocess
    import sys

    script = f"""
import importlib.util, json, os, sys, torch
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from metakernel.dsl import cute_host
from metakernel.dsl.base import NATIVE_CODE_EVENT, LaunchGate
from metakernel.dsl.cute import ADAPTER
events = []
sys.addaudithook(lambda event, args: events.append(event) if event == NATIVE_CODE_EVENT else None)
{prelude}
gate = LaunchGate(mode="intercept")
ADAPTER.install_hooks(gate)
ADAPTER.confine()
for path in {[str(p) for p in paths]!r}:
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    x = torch.randn(8, 4096, dtype=torch.bfloat16)
    gate.reset()
    try:
        m.solve(x, torch.randn_like(x), torch.randn(4096, dtype=torch.bfloat16))
        print(json.dumps(["launched", gate.launches, sorted(gate.kernel_names)]))
    except PermissionError as exc:
        print(json.dumps(["refused", str(exc), len(events), sorted(gate.kernel_names)]))
"""
    root = PROBLEM_28.parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(paths):]]


def test_cute_kernel_names_are_only_kernels_a_checked_build_defined():
    """Torch's kernel names written into a compiled object's `kernel_info` (a dict the candidate holds) are refused
    at the launch, as a native-code event the child's hook records (session 27), not taken as the DSL's."""
    [(verdict, message, events, names)] = _confined_cute_solves([RT_KERNEL_INFO])
    assert verdict == "refused" and events == 1 and "at::native" in message, message
    assert all(is_symbol(n) for n in names), names


def test_cute_ptx_is_read_after_every_compile_whatever_the_mlir_checks_saw():
    """The PTX each CuTe compile writes is read for GPU clocks: with the MLIR device check switched off, the
    asm-variant and symbol-operand red-team files (whose MLIR never spells the register) are refused by it, and
    problem 28's gold kernel compiles and launches."""
    variant, symbol, gold = _confined_cute_solves(
        [PROBLEM_28 / "wrong/rt_cute_asm_variant_globaltimer.py",
         PROBLEM_28 / "wrong/rt_cute_asm_symbol_operand_globaltimer.py", PROBLEM_28 / "correct/cute.py"],
        prelude="cute_host.device_problem = lambda module: None  # the MLIR check off: only the PTX can tell")
    for row in (variant, symbol):
        assert row[0] == "refused" and "in the compiled PTX" in row[1], row
    assert gold[:2] == ["launched", 1], gold


def test_cute_engines_are_built_only_inside_a_checked_compile():
    """`type(fn.engine)(module, ...)` JITted host code the file wrote as text (a CPU clock, reads at any address)
    past every check (session 28's red-teamer). The static rules refuse the names; below them, with the rules out of
    the way, building an engine outside a checked compile is a sandbox event, and the gold kernel still launches."""
    module_text, libc_clock, gold = _confined_cute_solves(
        [PROBLEM_28 / "wrong/rt_cute_engine_class_unchecked_module.py",
         PROBLEM_28 / "wrong/rt_cute_engine_class_clock_gettime.py", PROBLEM_28 / "correct/cute.py"])
    for row in (module_text, libc_clock):
        assert row[0] == "refused" and "JIT engine built outside" in row[1] and row[2] >= 1, row
    assert gold[:2] == ["launched", 1], gold


def test_cute_host_printf_ready_binaries_and_own_pipelines_are_refused_at_the_compile():
    """Session 28's second red-teamer: a host printf of the file's own format (`%s` reads, `%n` writes anywhere), a
    `gpu.binary` moved into the traced module, a pipeline of the file's own (no PTX written); the third: a host
    `cute.gemm` through a view offset to any address, inside the gold kernel's host function. With the static rules
    out of the way each is refused by confinement; the gold kernel, whose host code the DSL gives a print of its
    own (numbers only), still launches."""
    printf, binary, pipeline, gemm, gold = _confined_cute_solves(
        [PROBLEM_28 / "wrong/rt_cute_host_printf_any_address.py", PROBLEM_28 / "wrong/rt_cute_gpu_binary_insert.py",
         PROBLEM_28 / "wrong/rt_cute_custom_pipeline.py", PROBLEM_28 / "wrong/rt_cute_gold_host_gemm.py",
         PROBLEM_28 / "correct/cute.py"])
    assert printf[0] == "refused" and "cute.print" in printf[1], printf
    assert gemm[0] == "refused" and "cute.gemm" in gemm[1], gemm  # the third round: host ops an allowlist
    assert binary[0] == "refused" and "gpu.binary" in binary[1], binary
    assert pipeline[0] == "refused" and "pipeline of the file's own" in pipeline[1], pipeline
    assert gold[:2] == ["launched", 1], gold


def test_cute_cache_hit_builds_no_engine_from_a_module_rewritten_after_its_check(tmp_path):
    """A CuTe cache hit without an engine builds one from the cached object's `ir_module`, which the candidate can
    rewrite through the MLIR bindings after the checks read it (session 27's third red-teamer named the kernel
    binary; host code is as open). With the module unchanged the hit launches; rewritten, it was built and launched
    before this session and is now refused before any engine exists. A module handed to `compile_and_cache` by a
    caller of its own is checked there too."""
    import subprocess
    import sys

    script = """
import os, torch
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from metakernel.dsl.base import LaunchGate
from metakernel.dsl.cute import ADAPTER
# the gate's argument rules (a direct @cute.jit call of a from_dlpack tensor is refused) are not this test's subject
_should = LaunchGate.should_launch
LaunchGate.should_launch = lambda self, args=(), kwargs=None, names=(), opaque=False: _should(self, (), None, names)
gate = LaunchGate(mode="intercept")
ADAPTER.install_hooks(gate)
ADAPTER.confine()
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass.cute.runtime import from_dlpack
from cutlass.cutlass_dsl import CuTeDSL

@cute.kernel
def add_one(a: cute.Tensor):
    i = cute.arch.thread_idx()[0]
    a[i] = a[i] + 1.0

@cute.jit
def host(a: cute.Tensor):
    add_one(a).launch(grid=[1, 1, 1], block=[32, 1, 1])

x = torch.randn(32)
host(from_dlpack(x))
cache = CuTeDSL._get_dsl().jit_cache
[key] = list(cache._dict)
cache.get(key).capi_func = None  # the next call takes the cache-hit path that builds an engine
host(from_dlpack(x))
print("unchanged", gate.launches)
compiled = cache.get(key)
found = []
def visit(op):
    attributes = op.attributes  # read by position, as cute_host does
    if op.name == "llvm.mlir.global" and "value" in [attributes[i].name for i in range(len(attributes))]:
        found.append(op)
    return ir.WalkResult.ADVANCE
compiled.ir_module.operation.walk(visit)
with compiled.ir_module.context:
    found[0].attributes["value"] = ir.StringAttr.get("rewritten")
compiled.capi_func = None
try:
    host(from_dlpack(x))
    print("rewritten launched", gate.launches)
except PermissionError as exc:
    print("rewritten refused", exc)
import inspect  # a caller of its own hands compile_and_cache a module of any text (the DSL's class is reachable)
text = 'module { llvm.func @f() { llvm.return } }'
with ir.Context():
    try:
        CuTeDSL._get_dsl().compile_and_cache(ir.Module.parse(text), "h", "f", None, inspect.Signature(), True, False)
        print("text compiled")
    except PermissionError as exc:
        print("text refused", exc)
"""
    (tmp_path / "rewrite.py").write_text(script)  # CuTe compiles functions whose source file it can read
    root = PROBLEM_28.parents[2]
    out = subprocess.run([sys.executable, str(tmp_path / "rewrite.py")], capture_output=True, text=True,
                         timeout=600, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "unchanged 2" in lines, lines
    assert any(line.startswith("rewritten refused") and "content changed after its check" in line
               for line in lines), lines
    assert any(line.startswith("text refused") for line in lines), lines


#: The head of the TIRx subprocess scripts below (confinement is process-wide): TVM, the host checks, a file loader.
_TIRX_SCRIPT_HEAD = """
import importlib.util, tvm
from metakernel.dsl import tirx_host
def load(path):
    spec = importlib.util.spec_from_file_location("k", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""


def test_tirx_host_code_calls_by_name_only_the_device_setter_and_the_builds_kernels(tmp_path):
    """`Tx.call_ffi_kernel(name)` and the tensor-map encoder lower to packed calls by name, which the runtime finds
    in TVM's global registry when the module holds no such kernel (session 28's red-teamer deleted a folder through
    `s_tir.meta_schedule.remove_build_dir`). The source check refuses both ops; with it out of the way, the host
    check of the LLVM build refuses the calls (in a confined process: the builder is replaced process-wide), and the
    gold kernel, whose host code calls `__tvm_set_device` and its kernel, builds. A name shaped like a kernel's that
    the build's CUDA modules do not define is refused too (libtorch exports MKL functions named `*_kernel`)."""
    import subprocess
    import sys

    from metakernel.dsl import tirx_host

    script = _TIRX_SCRIPT_HEAD + f"""
wrong = {str(PROBLEM_28 / "wrong")!r}
ffi = load(wrong + "/rt_tirx_host_call_ffi_any_global.py")._make_kernel(4096)
tmap = load(wrong + "/rt_tirx_tensormap_encode_write.py")._make_kernel(64)
gold = load({str(PROBLEM_28 / "correct" / "tirx.py")!r})._make_kernel(4096)
alias_path = {str(tmp_path / "alias.py")!r}
open(alias_path, "w").write(open(wrong + "/rt_tirx_host_call_ffi_any_global.py").read().replace(
    '"runtime.TVMSetStream"', '"mkl_blas_kernel"'))
alias = load(alias_path)._make_kernel(4096)
print("source:", tirx_host.source_problem(ffi), "|", tirx_host.source_problem(tmap))
tirx_host.confine()
target = tvm.target.Target({{"kind": "cuda", "arch": "sm_90a"}})
for mod in (ffi, tmap, alias, gold):
    try:
        tirx_host.checked_build(tvm.compile, mod, target=target, tir_pipeline="tirx", _problem=lambda mod: None)
        print("built")
    except Exception as exc:
        print("refused:", str(exc).splitlines()[-1])
"""
    root = PROBLEM_28.parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    source, ffi, tmap, alias, gold = out.stdout.strip().splitlines()[-5:]
    assert "call_ffi_kernel" in source and "tensormap_encode_tiled" in source, source
    assert "'runtime.TVMSetStream' by name" in ffi, ffi
    assert "'runtime.cuTensorMapEncodeTiled' by name" in tmap, tmap
    assert "'mkl_blas_kernel' by name" in alias, alias
    assert gold == "built", gold
    allowed = [n for n in ("main_kernel", "main_kernel_1", "__tvm_set_device", "tvm_callback_cuda_compile",
                           "runtime.TVMSetStream") if tirx_host.PACKED_CALLEES.match(n)]
    assert allowed == ["main_kernel", "main_kernel_1", "__tvm_set_device"]


def test_tirx_builds_refuse_after_a_registry_change_and_host_code_may_not_make_pointers():
    """A lowering rule registered for an op runs Python of the file's inside `tvm.compile`, after the source check:
    session 29's red-teamer rewrote the gold kernel's host glue into an 8-byte write at `id(obj) + 32`. With the
    static rules out of the way (the file imported directly): the build is refused because TVM's registry changed
    since `confine`; with that check out of the way too, the host check refuses the integer made a pointer; and a
    write through the arguments (no integer involved) is refused because host code writes only its own stack. The
    gold kernel builds twice in a row (the registry recorded after each build)."""
    import subprocess
    import sys

    script = _TIRX_SCRIPT_HEAD + f"""
tirx_host.confine()
target = tvm.target.Target({{"kind": "cuda", "arch": "sm_90a"}})
def build(mod):
    try:
        tirx_host.checked_build(tvm.compile, mod, target=target, tir_pipeline="tirx")
        return "built"
    except Exception as exc:
        return "refused: " + str(exc).splitlines()[-1]
gold = load({str(PROBLEM_28 / "correct" / "tirx.py")!r})
print(build(gold._make_kernel(4096)))
print(build(gold._make_kernel(2048)))
hooked = load({str(PROBLEM_28 / "wrong" / "rt_tirx_op_attr_host_write.py")!r})
print(build(hooked._make_kernel(4096)))
tirx_host.CONFINEMENT.registry = None
print(build(hooked._make_kernel(4096)))
done = []
def through_args(call):
    args = [v for v in call.args if "handle" in str(getattr(v, "ty", ""))]
    if done or not args:
        return call
    done.append(call)
    store = tvm.ir.Call("tirx.tvm_struct_set", [args[0], tvm.tirx.IntImm("int32", 0), tvm.tirx.IntImm("int32", 1),
                                                 args[0]], ret_ty="int32")
    return tvm.tirx.Or(call, tvm.tirx.EQ(store, tvm.tirx.IntImm("int32", 7)))
tvm.ir.register_op_attr("tirx.isnullptr", "llvm.FLowerIntrinsic", through_args, level=100)
print(build(gold._make_kernel(1024)), flush=True)
import os
os._exit(0)  # TVM still holds the Python lowering rule: freeing it at shutdown crashes the interpreter
"""
    root = PROBLEM_28.parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    gold, again, registry, pointer, stack = out.stdout.strip().splitlines()[-5:]
    assert gold == again == "built", (gold, again)
    assert "TVM's registry changed" in registry and "tirx.isnullptr llvm.FLowerIntrinsic" in registry, registry
    assert pointer.startswith("refused") and "reinterpret" in pointer and "int64" in pointer, pointer
    assert "tvm_struct_set on" in stack, stack


def test_tirx_cuda_compile_reads_the_ptx_before_making_the_binary():
    """TVM's CUDA compile callback, as `tirx_host.confine` registers it on a GPU machine, compiles the source to PTX
    with the same compiler, reads it for GPU clocks, and only then makes the binary. The CPU has no CUDA compiler
    (TVM calls no callback here), so the two compilers are stand-ins that record what they were asked."""
    from metakernel.dsl import tirx_host

    asked: list[tuple[str, Any]] = []

    def to_ptx(code: str, target_format: str, compiler: str) -> bytes:
        asked.append(("ptx", (target_format, compiler)))
        return b".visible .entry k_kernel() {\n  mov.u64 %rd1, %glob" + code.encode() + b";\n  ret;\n}\n"

    def to_binary(code: str) -> bytes:
        asked.append(("binary", code))
        return b"\x7fELF"

    refused: list[str] = []

    def refuse(what: str) -> None:
        refused.append(what)
        raise PermissionError(what)

    checked = tirx_host.ptx_checked(to_binary, to_ptx=to_ptx, _refuse=refuse)
    assert checked("al_index") == b"\x7fELF" and not refused
    assert asked[0][0] == "ptx" and asked[0][1][0] == "ptx" and asked[1] == ("binary", "al_index")
    asked.clear()
    try:
        checked("altimer")  # the PTX reads %globaltimer although no source text spelled it
    except PermissionError:
        pass
    assert refused and "globaltimer" in refused[0] and "compiled PTX" in refused[0], refused
    assert [kind for kind, _ in asked] == ["ptx"]  # no binary is made of refused code


def test_tirx_ptx_check_with_the_real_cuda_compiler_sees_what_the_source_text_hides():
    """With this machine's CUDA toolkit (CI ships nvcc): the PTX of problem 28's gold TIRx kernel passes the check,
    and a clock read whose register name a macro splits (no source-text check sees it: `base.source_clock` returns
    None) is refused from the PTX before any binary is made."""
    import pytest
    import tvm

    from metakernel.dsl import tirx_host
    from metakernel.dsl.base import source_clock
    from metakernel.dsl.tirx import ADAPTER

    env = ADAPTER.environment(dry_run=True)
    if env.get("TVM_CUDA_COMPILE_MODE") not in ("nvcc", "nvrtc"):
        pytest.skip("no CUDA compiler on this machine")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    built = tvm.compile(_load_file(PROBLEM_28 / "correct" / "tirx.py")._make_kernel(4096), target=target,
                        tir_pipeline="tirx")
    [source] = [s for s in tirx_host.cuda_sources(built.mod) if "__global__" in s]
    hidden = source + ('\n#define HALF "%%glob"\nextern "C" __global__ void stamp(unsigned long long* o) {\n'
                       '  unsigned long long t; asm volatile("mov.u64 %0, " HALF "altimer;" : "=l"(t)); *o = t; }\n')
    assert source_clock(hidden) is None
    made: list[str] = []
    checked = tirx_host.ptx_checked(lambda code, *args: made.append(code) or b"binary")
    saved = {k: os.environ.get(k) for k in ("TVM_CUDA_COMPILE_MODE", "CUDA_PATH", "PATH")}
    os.environ.update({k: v for k, v in env.items() if k in saved})
    try:
        with target:
            assert checked(source) == b"binary"
            try:
                checked(hidden)
                raise AssertionError("a clock the PTX shows was built")
            except PermissionError as exc:
                assert "globaltimer in the compiled PTX" in str(exc)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert made == [source]


def test_randomize_ablation_restores_what_the_launch_did_not_write():
    """Arguments a launch only reads (inputs, sentinels) get their values back; what it wrote stays."""
    gate = LaunchGate(mode="run", randomize=True)
    read, written = torch.randn(256), torch.zeros(256)
    before = read.clone()
    assert gate.should_launch((read, written))
    assert not torch.equal(read, before) and gate.randomized == 2
    written.copy_(read * 2)  # the "kernel": reads the perturbed input, writes its output
    result = written.clone()
    gate.after_launch()
    assert torch.equal(read, before) and torch.equal(written, result)


def test_randomize_ablation_restores_element_by_element_and_never_waits_for_the_gpu(monkeypatch):
    """The restore keeps what the launch wrote element by element, and the gate never synchronises: a kernel that
    polled its stream right after a launch saw it idle only in audited and perturbed calls, while the gate waited
    (session 29's red-teamer ran its honest path exactly there)."""
    waits: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: waits.append("synchronize"))
    gate = LaunchGate(mode="run", randomize=True, audit=True)
    out = torch.randn(64)
    assert gate.should_launch((out,))
    perturbed = out.clone()
    out[:16] = 7.0  # the "kernel" writes a quarter of its argument
    gate.after_launch()
    assert torch.equal(out[:16], torch.full((16,), 7.0)) and not torch.equal(out[16:], perturbed[16:])
    assert waits == [] and gate.audited[-1].after is not None


def test_the_gate_refuses_device_memory_it_cannot_read():
    """CuTe's own runtime wrappers (`from_dlpack`, `make_ptr`) have no `__dlpack__`: the gate saw no tensor, so the
    audit copied nothing and the randomise ablation randomised nothing (session 29's red-teamer handed the eager
    answer to a copy kernel that way). Such an argument is refused, in the free check too."""
    from cutlass.cute.runtime import from_dlpack

    wrapped = from_dlpack(torch.randn(8, 16))
    for gate in (LaunchGate(mode="intercept"), LaunchGate(mode="run", audit=True),
                 LaunchGate(mode="run", randomize=True), LaunchGate(mode="suppress")):
        with pytest.raises(PermissionError, match="cannot read"):
            gate.should_launch((wrapped, 3))
        with pytest.raises(PermissionError, match="cannot read"):
            gate.should_launch(((torch.zeros(2), wrapped),))
    assert LaunchGate(mode="run").should_launch((wrapped,))  # timed calls pay nothing; the audit call refuses
    from cuda.bindings.driver import CUstream

    with pytest.raises(PermissionError, match="stream the file chose"):  # the gate's copies would not be ordered
        LaunchGate(mode="run", audit=True).should_launch((torch.zeros(4), CUstream(0)))


def test_isolation_fills_what_a_launch_was_not_handed_and_restores_all_of_it():
    """Hole 12: a copy kernel handed a one-element view reached the eager answer by index arithmetic (`anchor.iterator
    + off`, `A[off + i]`). Under the isolation ablation every reachable byte outside the launch's argument views is
    noise while it runs: the answer beside the anchor in the same allocation too. Every byte gets its value back
    after the launch, free blocks included: a block freed before the launch and allocated after it held noise in
    isolated calls only, a tell for a second launch to turn honest (rt_cute_isolation_tell)."""
    torch.manual_seed(7)
    block = torch.randn(1024)  # one allocation: anchor view, then the eager answer
    anchor, answer = block[:1], block[512:768]
    free, out, x = torch.randn(256), torch.zeros(256), torch.randn(256)
    saved_block, saved_x, saved_free = block.clone(), x.clone(), free.clone()
    regions = [block.view(torch.uint8), free.view(torch.uint8), x.view(torch.uint8)]
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: regions)
    assert gate.should_launch((anchor, out))
    assert gate.isolated == block.nbytes - 4 + free.nbytes + x.nbytes
    assert torch.equal(anchor, saved_block[:1])  # the argument's own bytes are kept
    assert int((answer == saved_block[512:768]).sum()) < 8 and not torch.equal(x, saved_x)
    assert not torch.equal(free, saved_free)
    out.copy_(answer)  # the "kernel": reads past its anchor
    gate.after_launch()
    assert not torch.allclose(out, saved_block[512:768])  # it copied noise: the outputs break
    assert torch.equal(block, saved_block) and torch.equal(x, saved_x)  # every byte restored,
    assert torch.equal(free, saved_free)  # the free block's stale values too


def test_isolation_keeps_a_strided_argument_s_elements_not_the_span_between_them():
    """A two-element view whose stride reaches past the eager answer kept the whole span between its elements,
    the answer with it (the protocol 6 review): a strided argument keeps only its own elements while the launch
    runs, and what the launch writes to them survives the restore."""
    block = torch.randn(1024)
    reach = block[::1000]  # elements 0 and 1000: the answer at 512 lies between them
    answer, ends = block[512:768].clone(), reach.clone()
    whole = torch.empty(0, dtype=torch.uint8).set_(block.untyped_storage())
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [whole])
    assert gate.should_launch((reach,))
    assert torch.equal(reach, ends)  # its own elements kept
    assert int((block[512:768] == answer).sum()) < 8  # the span between them: noise
    reach.mul_(2)  # the "kernel" writes its argument
    written = reach.clone()
    gate.after_launch()
    assert torch.equal(block[512:768], answer) and torch.equal(reach, written)
    expanded = torch.randn(4)[:1].expand(8)  # stride 0: one element addressed eight times
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [
        torch.empty(0, dtype=torch.uint8).set_(expanded.untyped_storage())])
    value = expanded[0].clone()
    assert gate.should_launch((expanded,)) and torch.equal(expanded, value.expand(8))
    # 12 G one-byte elements of no memory (strides 0, 0) made the gate's copies fail and the phase inconclusive
    # (session 31's red-teamer): a stride-0 dimension is cut to one element, nothing is copied twice
    shield = torch.zeros(1, dtype=torch.uint8).expand(110000, 110000)
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [whole])
    assert gate.should_launch((shield, reach)) and gate.isolated > 0
    gate.after_launch()
    overlapping = torch.randn(16).as_strided((4, 4), (1, 1))  # distinct dimensions addressing the same elements
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [whole])
    assert gate.should_launch((overlapping,)) and gate.isolated == -1  # the file's: dsl_reach


class _FullDevice:
    """A region whose device copy runs out of memory (a card the file kept full); host copies may too."""

    def __init__(self, tensor: torch.Tensor, host: bool) -> None:
        self.tensor, self.host = tensor, host

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def numel(self) -> int:
        return self.tensor.numel()

    def __getitem__(self, item: Any) -> Any:
        return _FullDevice(self.tensor[item], self.host)

    def clone(self) -> Any:
        raise torch.OutOfMemoryError("the gate's copy")

    def to(self, device: str) -> torch.Tensor:
        if not self.host:
            raise MemoryError("the host is full too")
        return self.tensor.to(device, copy=True)

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def random_(self, low: int, high: int, generator: torch.Generator | None = None) -> None:
        self.tensor.random_(low, high, generator=generator)

    def copy_(self, saved: torch.Tensor) -> None:
        self.tensor.copy_(saved)


def test_isolation_whose_copies_find_no_room_on_the_device_saves_to_the_host():
    """A file that keeps most of the card cached must not make the ablation inconclusive by leaving the gate no
    room for its copies (the protocol 6 review): they go to host memory, and the launch is isolated all the same."""
    live = torch.randn(64)
    before = live.clone()
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [_FullDevice(live.view(torch.uint8), True)])
    assert gate.should_launch((torch.zeros(4),))
    assert gate.isolated == live.nbytes and not torch.equal(live, before)
    gate.after_launch()
    assert torch.equal(live, before)


def test_isolation_s_saved_copies_are_masked_and_the_default_generators_never_move():
    """The gate's copies of the isolated bytes stay unfilled while the launch runs: a verbatim copy of the eager
    answer was there for a kernel that steered the gate's allocation to a known address (session 31's third
    red-teamer). They are XORed with secret pads, drawn again to unmask. And no ablation draws from torch's default
    generators: the CUDA one starts from a fixed seed, so a file's own fresh generator could count the gate's
    draws and tell ablated calls apart."""
    answer = torch.randn(4096)
    before = answer.clone()
    region = answer.view(torch.uint8)
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [region])
    default = torch.random.get_rng_state()
    assert gate.should_launch((torch.zeros(4),))
    (view, saved, masked), = gate._isolated
    assert masked and int((saved == before.view(torch.uint8)).sum()) < region.numel() // 64  # no verbatim copy
    gate.after_launch()
    assert torch.equal(answer, before)
    for mode in ("randomize", "suppress"):
        flag = torch.zeros(8)
        g = LaunchGate(mode="suppress") if mode == "suppress" else LaunchGate(mode="run", randomize=True)
        g.should_launch((flag, torch.ones(1, dtype=torch.int64)))
        assert not torch.equal(flag, torch.zeros(8))  # the gate drew (from its own generators)
        g.after_launch()
    assert torch.equal(torch.random.get_rng_state(), default)


def test_the_gate_counts_its_own_out_of_memory_errors():
    """A caught out-of-memory error is the file's rule violation (it flushes the allocator's cache and steers
    where the next allocation lands: session 31's third red-teamer); the gate's own are counted apart, whether it
    swallows them (the isolation's copies) or they reach the launch (the audit's)."""
    gate = LaunchGate(mode="run")
    with pytest.raises(torch.OutOfMemoryError), gate._aside():
        raise torch.OutOfMemoryError("the gate's copy")
    with pytest.raises(ValueError), gate._aside():
        raise ValueError("not memory")
    assert gate.own_ooms == 1 and len(gate.failures) == 2  # (the child ends the grading on any it sees)
    gate.reset()
    assert gate.own_ooms == 1 and gate.failures  # over the child's life, like the allocator's own count


def test_a_dead_cuda_context_is_the_kernel_s_crash_not_the_gate_s_failure():
    """A randomised index sends an honest gather out of bounds; CUDA reports the fault at the gate's next call, and
    recording it as the gate's failure refused gold 43, 50 and 51 as "could not ablate" (session 32, H100). The
    device decides: when its synchronisation fails too the context is dead (a crash: "required"); when it works,
    the CUDA error stays the gate's (a file could otherwise hide a failure of ours behind the words)."""
    def dead() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    lost = LaunchGate(mode="run", sync=dead)
    with pytest.raises(RuntimeError), lost._aside():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert not lost.failures
    alive = LaunchGate(mode="run", sync=lambda: None)
    with pytest.raises(RuntimeError), alive._aside():
        raise RuntimeError("CUDA error: invalid argument")
    assert alive.failures and "CUDA error" in alive.failures[0]
    nodevice = LaunchGate(mode="run")  # (the CPU: no device to ask)
    with pytest.raises(RuntimeError), nodevice._aside():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert nodevice.failures


def test_the_randomise_restore_gives_back_an_argument_passed_twice():
    """One tensor passed twice (or two overlapping views) was saved the second time with the first draw's values;
    restored in launch order it stayed random, so a multiplier of ones broke the outputs of a file whose DSL did no
    work (session 32's red-teamer, `rt_cute_randomize_alias_restore`). Restored newest first, every element the
    launch did not write is given back, and what it wrote stays."""
    for make in (lambda t: (t, t), lambda t: (t, t[2:])):
        ones, scratch = torch.ones(8), torch.zeros(1)
        gate = LaunchGate(mode="run", randomize=True)
        assert gate.should_launch((*make(ones), scratch))
        assert not torch.equal(ones, torch.ones(8))  # randomised while the launch runs
        scratch[0] = 1.0
        gate.after_launch()
        assert torch.equal(ones, torch.ones(8))
    ones = torch.ones(8)
    gate = LaunchGate(mode="run", randomize=True)
    assert gate.should_launch((ones, ones))
    ones[:4] = 7.0  # an in-place kernel's own writes stay
    gate.after_launch()
    assert torch.equal(ones, torch.tensor([7.0] * 4 + [1.0] * 4))


def test_a_suppressed_call_gives_back_what_the_file_keeps_but_not_its_outputs():
    """A table the file keeps between calls and hands to a launch stayed garbled for the rest of the grading after
    one suppressed call, so an honest kernel's later calls read wrong (`dsl_reach` in the isolation that follows:
    session 32's false-positive review). After the call its values come back, except where the outputs lie."""
    table, out, inputs = torch.full((16,), 2.0), torch.zeros(16), torch.randn(16)
    gate = LaunchGate(mode="suppress", protected=frozenset({inputs.untyped_storage().data_ptr()}))
    assert not gate.should_launch((inputs, table, out))
    assert not torch.equal(table, torch.full((16,), 2.0)) and not torch.equal(out, torch.zeros(16))
    garbage = out.clone()
    gate.give_back_garbled((out[:8], {"rest": out[8:]}))
    assert torch.equal(table, torch.full((16,), 2.0))  # the kept table, as it was
    assert torch.equal(out, garbage)  # the outputs stay garbage: that is the ablation


def test_integer_arguments_are_redrawn_with_replacement_and_odd_dtypes_through_integer_views():
    """A shuffle kept every count, sum and sort of an integer argument, so an honest histogram launch read as
    idle (`dsl_unused`); drawing with replacement from the tensor's own values keeps indices in range and changes
    those. Dtypes torch cannot fill (float4_e2m1fn_x2, unsigned 16-64-bit) made the ablations raise ("could not
    ablate"): they are written through a signed view of the same bytes (session 32's false-positive review)."""
    ids = torch.arange(64, dtype=torch.int32)
    gate = LaunchGate(mode="run", randomize=True)
    assert gate.should_launch((ids,))
    assert not torch.equal(torch.bincount(ids, minlength=64), torch.ones(64, dtype=torch.int64))
    assert int(ids.min()) >= 0 and int(ids.max()) < 64  # drawn from its own values: in range
    gate.after_launch()
    assert torch.equal(ids, torch.arange(64, dtype=torch.int32))
    odd = [torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), torch.tensor([3], dtype=torch.uint32),
           torch.tensor([5, 6], dtype=torch.uint16)]
    for gate in (LaunchGate(mode="run", randomize=True), LaunchGate(mode="suppress")):
        before = [t.view(torch.uint8).clone() for t in odd]
        gate.should_launch(tuple(odd))
        assert not gate.failures
        if gate.mode == "run":
            gate.after_launch()
            assert all(torch.equal(t.view(torch.uint8), b) for t, b in zip(odd, before, strict=True))


def test_an_isolated_launch_is_fenced_by_device_synchronisations():
    """The fill and the restore are queued on the launch's stream: work of the file's on another stream (a shared
    expert's GEMM beside a DSL launch) read noise or was overwritten by the restore (session 32's review). The
    gate waits for the device before the fill, and before and after the restore."""
    calls: list[str] = []
    block = torch.randn(64)
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [block.view(torch.uint8)],
                      sync=lambda: calls.append("sync"))
    arg = torch.zeros(4)
    assert gate.should_launch((arg,)) and calls == ["sync"]
    gate.after_launch()
    assert calls == ["sync"] * 3


def test_the_ablations_write_an_expanded_argument_s_elements_once():
    """A one-byte tensor expanded to 2^40 elements made the audit's, the randomise ablation's and the suppress
    fill's dense copies raise inside the launch, which a file caught to tell those calls apart (session 31's fourth
    red-teamer): the ablations now write a strided argument's distinct elements, and any failure of the gate's own
    work is recorded for the child to end the grading on."""
    shield = torch.zeros(1, dtype=torch.uint8).expand(1 << 20, 1 << 20)
    flag = torch.zeros(4)
    for gate in (LaunchGate(mode="run", randomize=True), LaunchGate(mode="suppress")):
        gate.should_launch((flag[:1].expand(8), shield))
        assert not gate.failures and float(flag[0]) != 0.0
        gate.after_launch()
        flag.zero_()
    overlapping = torch.randn(16).as_strided((4, 4), (1, 1))
    gate = LaunchGate(mode="run", randomize=True)
    with pytest.raises(ValueError, match="address the same elements"):
        gate.should_launch((overlapping,))
    assert gate.failures and "ValueError" in gate.failures[0]


def test_isolation_records_page_locked_memory_live_during_a_launch():
    """Page-locked host memory lies in the GPU's address space, outside every allocation the isolation fills; a
    non_blocking copy to the CPU with the flag positional (`t.to(cpu, dtype, True)`) made it under no refused name
    (the protocol 6 review). An isolated launch records the most the host allocator had handed out, and the
    grader's verdict is `dsl_reach` (`Evaluation.isolation`)."""
    held = [0]
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [], pinned=lambda: held[0])
    assert gate.should_launch((torch.zeros(4),)) and gate.pinned_live == 0
    held[0] = 1 << 20
    assert gate.should_launch((torch.zeros(4),)) and gate.pinned_live == 1 << 20
    held[0] = 0
    assert gate.should_launch((torch.zeros(4),)) and gate.pinned_live == 1 << 20
    gate.reset()
    assert gate.pinned_live == 0


def test_isolation_that_cannot_copy_memory_isolates_nothing():
    """The gate's own copies failing on the device and the host: nothing is filled for the rest of the call. Within
    `room` (half the card) it is the machine's failure, not conclusive (-2); beyond it the file's memory
    made isolation impossible (-1: `dsl_reach`), the escape session 31's red-teamer proposed on the H200 (a live
    tensor larger than the host's memory)."""
    live = torch.randn(64)
    before = live.clone()
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [_FullDevice(live.view(torch.uint8), False)],
                      room=live.nbytes)
    assert gate.should_launch((torch.zeros(4),))
    assert gate.isolated == -2 and torch.equal(live, before)  # within the room: the machine's failure
    assert gate.should_launch((torch.zeros(4),)) and gate.isolated == -2
    gate = LaunchGate(mode="run", isolate=True, reachable=lambda: [_FullDevice(live.view(torch.uint8), False)],
                      room=live.nbytes - 1)
    assert gate.should_launch((torch.zeros(4),))
    assert gate.isolated == -1 and torch.equal(live, before)  # more than the room: the file's (dsl_reach)


def test_randomize_ablation_changes_one_element_integers_and_bools():
    """A launch whose only tensor is a one-element flag it zeroes (the outputs add it) was never randomised, so
    the ablation said "not conclusive" (session 21's red-teamer): flags and masks are randomised too."""
    gate = LaunchGate(mode="run", randomize=True)
    flag, mask = torch.zeros(1, dtype=torch.int64), torch.ones(64, dtype=torch.bool)
    assert gate.should_launch((flag, mask))
    assert gate.randomized == 2 and int(flag) != 0 and not bool(mask.all())
    flag.zero_()  # the "kernel" writes the flag back; the mask it only reads
    gate.after_launch()
    assert int(flag) == 0 and bool(mask.all())


def test_a_suppressed_launch_garbles_what_it_would_have_written_but_not_the_inputs():
    """Suppression must not leave an output buffer as the allocator handed it out: memory that held an eager
    answer (a temporary freed just before) then reads as "correct with the DSL suppressed" on some runs and not on
    others (a CI run saw `dsl_unused` where the audit's `dsl_token` was due). Problem inputs keep their values."""
    torch.manual_seed(4)
    x, answer = torch.randn(32, 16), torch.randn(32, 16)
    stale, ids = answer.clone(), torch.arange(512, dtype=torch.int32)
    gate = LaunchGate(mode="suppress", protected=frozenset({x.untyped_storage().data_ptr()}))
    assert not gate.should_launch((x[1:], stale, ids), names=("k",))
    assert torch.equal(x[1:], x[1:].clone()) and gate.suppressed == 1
    kept = x.clone()
    gate.should_launch((x, stale, ids), names=("k",))
    assert torch.equal(x, kept)  # an input (or a view of one) is never garbled
    assert not torch.isclose(stale, answer).any() and not torch.equal(ids, torch.arange(512, dtype=torch.int32))
    untouched = answer.clone()
    LaunchGate(mode="intercept").should_launch((untouched,), names=("k",))
    assert torch.equal(untouched, answer)  # the CPU dry run only compiles


def test_only_type_expressions_may_be_compiled_from_strings():
    """The audit hook's rule for strings compiled after the kernel's import (typing resolving annotations)."""
    for ok in ("int", "cute.Tensor", "list[int] | None", "cutlass.Constexpr[int]", "'Tensor'"):
        assert _type_expression(ok), ok
    for bad in ("exec('x') or int", "__import__('os')", "x.__class__", "f()", "lambda: 0", "a + b", "x._private",
                "torch.sys.modules['ctypes'].PyDLL", "enum.bltns", "torch.xpu.c_void_p", "typing.Literal['x']"):
        assert not _type_expression(bad), bad


def test_read_only_binds_under_tmp_are_not_writable_code(tmp_path):
    """A checkout or the DSL wheels may live under /tmp (CI clones, the H200 staging): their files are read-only
    binds in the sandbox, so their frames and imports are the harness's and the libraries', not the candidate's."""
    from metakernel.grader.child import Guard

    guard = Guard(str(tmp_path / "kernel.py"), str(tmp_path / "work"), readonly=["/tmp/ci-clone/.venv"])
    assert not guard.writable("/tmp/ci-clone/.venv/lib/python3.11/site-packages/torch/__init__.py")
    assert guard.writable("/tmp/ci-clone/payload.py") and guard.writable(str(tmp_path / "work" / "x.py"))
    assert not guard.writable("/usr/lib/python3/dist-packages/x.py")


def test_only_the_dsl_s_own_read_only_source_counts_as_library_source(tmp_path):
    """A DSL parser may re-parse the DSL's installed functions (cutlass.pipeline), nothing else: not text made at
    run time, not a file outside the DSL's folders, and not a DSL file the child could rewrite."""
    import ast
    import os

    import cutlass.pipeline.helpers as helpers

    from metakernel.grader.child import Guard

    # the DSL's folder as the sandbox binds it: read-only (a checkout under /tmp keeps its venv there)
    guard = Guard(str(tmp_path / "kernel.py"), str(tmp_path / "work"),
                  readonly=[os.path.dirname(os.path.dirname(os.path.realpath(helpers.__file__)))])
    text = open(helpers.__file__, encoding="utf-8").read()
    state = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "PipelineState")
    real = ast.get_source_segment(text, next(n for n in state.body if getattr(n, "name", "") == "advance"))
    assert real and "def advance" in real
    assert guard._library_source(real)
    assert not guard._library_source("import os\nos.system('id')\n")
    stdlib = open(os.__file__, encoding="utf-8").read()
    assert not guard._library_source(stdlib[:2000])  # the standard library is not the DSL's
    guard._library_roots = (str(tmp_path) + "/",)  # a DSL folder the child can write: its files prove nothing
    (tmp_path / "fake_dsl.py").write_text(real, encoding="utf-8")
    assert not guard._library_source(real)


def test_outputs_must_come_back_where_the_grader_reads_them():
    """The child is the candidate's process: on the GPU a reply whose outputs are by value or shape-only is a
    rule violation (not a comparison of meta tensors that would end as our error); shape-only outputs are the
    free check's alone."""
    import pytest

    from metakernel.grader import transport
    from metakernel.grader.worker import Worker, WorkerFailure

    at = {"at": 0, "dtype": "float32", "shape": [2], "stride": [1], "nbytes": 8}
    meta = {"meta": True, "dtype": "float32", "shape": [2], "stride": [1]}
    cpu = {"cpu": 0, "dtype": "float32", "shape": [2]}
    assert transport.leaf_kinds({"seq": "tuple", "items": [at, {"v": None}]}) == {"at", "v"}
    assert transport.leaf_kinds({"seq": "list", "items": [at, meta]}) == {"at", "meta"}
    assert transport.leaf_kinds({"at": 0, "cpu": 1}) == {"?"} and transport.leaf_kinds([at]) == {"?"}
    worker = object.__new__(Worker)
    worker.device, worker.dry_run, worker.arena_out = "cuda", False, None
    for spec in (meta, cpu, {"seq": "tuple", "items": [meta]}):
        with pytest.raises(WorkerFailure) as caught:
            worker.outputs(spec, [b"\0" * 8])
        assert (caught.value.status, caught.value.reason) == ("rule_violation", "output_type")
    worker.device, worker.dry_run = "cpu", True
    assert worker.outputs(meta, []).is_meta
    worker.dry_run = False
    with pytest.raises(WorkerFailure):
        worker.outputs(meta, [])
    assert worker.outputs(cpu, [torch.ones(2).numpy().tobytes()]).tolist() == [1.0, 1.0]


def test_the_candidate_may_not_open_the_process_s_own_symbols():
    """ctypes.CDLL(None) hands out libc's system() and libpython's C API with no audit event after it (a
    red-teamer ran a shell that way); a DSL's own code may still do it."""
    from pathlib import Path

    import pytest

    from metakernel.grader.child import Guard

    # this test file stands in for the kernel (its frames are the candidate's); the checkout is a read-only bind, as
    # in the sandbox, so a clone under /tmp is not taken for code the child wrote
    guard = Guard(__file__, "/nonexistent-work", (str(Path(__file__).resolve().parents[1]),))
    guard.armed = True
    with pytest.raises(PermissionError, match="own symbols"):
        guard("ctypes.dlopen", (None, 0))
    assert guard.violations
    other = Guard("/nonexistent/kernel.py", "/nonexistent-work", (str(Path(__file__).resolve().parents[1]),))
    other.armed = True  # the same call from someone else's code is let through
    other("ctypes.dlopen", (None, 0))


def test_a_crafted_cubin_only_loses_the_resource_table():
    """The check must never fail on a cubin's bytes: an ELF header whose section-table offset does not fit in a
    ssize_t makes struct.unpack_from raise OverflowError (it once left CuTe's launch into solve, and was reported as a
    failed CUDA device compilation for TIRx)."""
    import struct

    from metakernel.dsl.resources import ResourceLog, parse_cubin

    data = bytearray(b"\x7fELF\x02" + bytes(59))
    struct.pack_into("<Q", data, 0x28, 2**64 - 1)
    struct.pack_into("<HHH", data, 0x3A, 64, 1, 0)
    assert parse_cubin(bytes(data)) == []
    log = ResourceLog()  # what both adapters record their cubins in
    log.add("k", bytes(data))
    log.use("k")
    assert log.take() == [] and log.take() == []


def test_a_syntax_tree_compiled_outside_the_dsls_compilers_is_refused():
    """The audit hook judged only compiled strings: a tree built at run time and compiled by a reachable helper
    (TVMScript's evaluator, session 22) ran code the static rules never read. Trees compile only where the DSLs
    compile the ones they parsed, and in the standard library's code generators."""
    import ast
    from pathlib import Path

    import pytest

    from metakernel.grader.child import Guard

    tree = ast.parse("x = 1")
    guard = Guard(__file__, "/nonexistent-work", (str(Path(__file__).resolve().parents[1]),))
    guard.armed = True
    with pytest.raises(PermissionError, match="not a type expression"):  # a string: the string rule's
        guard("compile", ("x = 1", "<string>"))
    with pytest.raises(PermissionError, match="syntax tree built at run time"):
        guard("compile", (tree, "<ast>"))
    namespace = {"__name__": "tvm.script.parser.core.evaluator", "guard": guard, "tree": tree}
    exec("def compile_there():\n    guard('compile', (tree, '<ast>'))\n", namespace)  # noqa: S102
    guard.violations.clear()
    namespace["compile_there"]()  # a frame of the evaluator's module: allowed
    assert not guard.violations


def test_the_reply_channel_and_the_llvm_checks_are_bound_before_the_candidate(monkeypatch):
    """Red-teamers rewrote module globals of the harness (transport's json, transport.send, tirx_host's checks)
    through library helpers; what the child calls after the import is bound before it, so such a rewrite changes
    nothing the harness does."""
    import json
    import socket
    from multiprocessing.connection import Connection

    from metakernel.dsl import tirx_host
    from metakernel.grader import transport

    class Forger:
        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(obj, **kwargs):
            return json.dumps({**obj, "host_s": 0.0}, **kwargs)

    monkeypatch.setattr(transport, "json", Forger)
    ours, theirs = socket.socketpair()
    a, b = Connection(ours.detach()), Connection(theirs.detach())
    try:
        transport.send(a, {"host_s": 1.5})
        got = transport.receive(b, timeout=5)
        assert got is not None and got[0]["host_s"] == 1.5
    finally:
        a.close()
        b.close()
    real = tirx_host.source_problem
    monkeypatch.setattr(tirx_host, "source_problem", lambda mod: None)
    assert tirx_host.checked_build.__kwdefaults__["_problem"] is real


def test_code_generators_compile_only_through_their_public_entries(tmp_path):
    """The hook trusted every compile made from dataclasses' frames, so `dataclasses._create_fn`, reached through a
    private read, compiled any text (red team, session 24). A real hook in a fresh interpreter: dataclasses and
    namedtuples still work, a private generator called directly is refused, and the import system compiles only the
    file it names."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    kernel = tmp_path / "kernel.py"
    kernel.write_text("x = 1\n")
    (tmp_path / "lib").mkdir()
    module = tmp_path / "lib" / "plain_module.py"  # a read-only bind in the sandbox, as the DSL wheels may be
    module.write_text("VALUE = 41 + 1\n")
    script = textwrap.dedent(f"""
        import collections, dataclasses, importlib.machinery, sys
        from metakernel.grader.child import Guard
        guard = Guard({str(kernel)!r}, {str(tmp_path / 'work')!r},
                      ({str(Path(__file__).resolve().parents[1])!r}, {str(tmp_path / 'lib')!r}))
        sys.addaudithook(guard)
        guard.armed = True
        point = dataclasses.make_dataclass("Point", ["a", "b"])
        assert point(1, 2).b == 2
        assert collections.namedtuple("Pair", "a b")(3, 4).a == 3
        sys.path.insert(0, {str(tmp_path / 'lib')!r})
        import plain_module
        assert plain_module.VALUE == 42 and not guard.violations, guard.violations
        def refused(call):
            try:
                call()
            except PermissionError as e:
                return str(e)
            raise AssertionError("not refused")
        print(refused(lambda: dataclasses._create_fn("f", [], ["return 1"], globals={{}})))
        loader = importlib.machinery.SourceFileLoader("plain_module", {str(module)!r})
        print(refused(lambda: loader.source_to_code(b"VALUE = 0", {str(module)!r})))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "dataclasses._create_fn" in lines[0] and "public functions only" in lines[0]
    assert "import system" in lines[1] and "plain_module.py" in lines[1]


def test_the_kernel_file_compiles_only_as_the_rules_read_it(tmp_path):
    """The kernel lies in the writable work dir: text written over it at run time and compiled under its name is
    refused, while the file itself and a function of it (what a DSL parser re-parses) still compile."""
    from pathlib import Path

    import pytest

    from metakernel.grader.child import Guard

    kernel = tmp_path / "work" / "kernel.py"
    kernel.parent.mkdir()
    kernel.write_text("import torch\n\n\ndef solve(x):\n    return x + 1\n")
    guard = Guard(str(kernel), str(tmp_path / "work"), (str(Path(__file__).resolve().parents[1]),))
    guard.armed = True

    def from_module(name: str) -> Any:
        """A function whose frame is module `name`'s, raising a compile event as that module would."""
        namespace: dict[str, Any] = {"__name__": name, "guard": guard}
        exec("def compile_there(text, path):\n    guard('compile', (text, path))\n", namespace)  # noqa: S102
        return namespace["compile_there"]

    imports, parser = from_module("importlib._bootstrap"), from_module("cutlass.base_dsl.ast_preprocessor")
    imports(kernel.read_bytes(), str(kernel))  # the import of the kernel
    parser("def solve(x):\n    return x + 1\n", str(kernel))  # CuTe's preprocessor parses a function of it
    assert not guard.violations
    kernel.write_text("import os\nos.system('true')\n")
    with pytest.raises(PermissionError, match="after it changed"):
        imports(kernel.read_bytes(), str(kernel))


def test_a_clock_in_the_generated_device_source_is_refused_whatever_op_wrote_it():
    """The IR check knows clock ops by name and reads each string operand alone; session 24's red-teamer read
    %globaltimer through two joined C literals and `clock64()` in free text. The device source TVM generated is
    read as the CUDA compiler reads it: that file's kernel (its route closed by name since) is refused there with
    the op check out of the way, an honest gold kernel's source is not, and the usual spellings are all found."""
    import tvm

    from metakernel.dsl import tirx_host
    from metakernel.dsl.base import source_clock

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    wrong = PROBLEM_28 / "wrong"
    funccall = _load_file(wrong / "rt_tirx_funccall_globaltimer.py")
    symbol = _load_file(wrong / "rt_tirx_symbol_macro_globaltimer.py")  # session 26: `#define`s in a symbol
    stringify = _load_file(wrong / "rt_tirx_pragma_import_c_stringify_clock.py")  # session 26: pasted C text
    digraph = _load_file(wrong / "rt_tirx_pragma_import_c_digraph_clock.py")
    for cheat, clock in ((funccall.add_rmsnorm_stamped, "globaltimer"), (symbol._module(4096), "##"),
                         (stringify._make_kernel(4096), "#define"), (digraph._make_kernel(4096), "%:")):
        refused: list[str] = []

        def refuse(what: str) -> None:
            refused.append(what)  # noqa: B023 - used within this iteration
            raise PermissionError(what)

        tirx_host.CONFINEMENT.active, was = True, tirx_host.CONFINEMENT.active
        try:
            try:
                tirx_host.checked_build(tvm.compile, cheat, target=target, tir_pipeline="tirx",
                                        _problem=lambda mod: None, _refuse=refuse)
            except PermissionError:
                pass
        finally:
            tirx_host.CONFINEMENT.active = was
        assert refused and "GPU clock" in refused[0] and clock in refused[0], refused
    assert "C identifiers" in (tirx_host.source_problem(symbol._module(4096)) or "")
    for pasted in (stringify, digraph):
        assert "pragma_import_c" in (tirx_host.source_problem(pasted._make_kernel(4096)) or "")
    tagged = _load_file(wrong / "rt_tirx_thread_tag_clock.py")  # a thread tag holding C text (third round)
    assert "thread tag" in (tirx_host.source_problem(tagged._make_kernel(4096)) or "")

    from tvm.script import tirx as Tx

    @Tx.prim_func
    def printing(x_ptr: Tx.handle):  # any string operand holding C syntax: no op's tokens need it
        X = Tx.match_buffer(x_ptr, (32,), "float32")
        Tx.device_entry()
        tx = Tx.thread_id([32])
        Tx.cuda.printf("v=%f;\n", X[tx])
        X[tx] = X[tx] + 1.0

    assert "C syntax" in (tirx_host.source_problem(printing) or "")

    gold = _load_file(PROBLEM_28 / "correct" / "tirx.py")
    honest = tvm.compile(gold._make_kernel(4096), target=target, tir_pipeline="tirx")
    assert tirx_host.built_problem(honest) is None

    for text in ('asm volatile("mov.u64 %0, %%global" "timer;" : "=l"(t));', "t = clock64 ();", "t = clock();",
                 'asm("mov.u32 %0, %%glob" /* x */ "altimer;");', 'asm("mov.u32 %0, %%glob\\x61ltimer;");',
                 'asm("mov.u32 %0, %%pm2;");', "mov.u64 %rd1, %clock64;", "cuda::std::chrono::system_clock::now()",
                 # the red-teamer's other spellings (session 26): raw strings, a clock by pointer or in parentheses,
                 # universal-character escapes, "//" inside an earlier literal, nvvm's builtin, the grid id
                 'asm("%%glob" R"(altimer)");', "auto f = &clock64; t = (clock64)();",
                 'asm("%%\\u0067lobaltimer");', 'printf("//"); asm("%%glob" /**/ "altimer");',
                 "t = __nvvm_read_ptx_sreg_clock64();", 'asm("mov.u32 %0, %%gridid;");', "#define C(a, b) a##b"):
        assert source_clock(text), text
    assert source_clock("float clocks = a * b; // clock64()\nint pm = 3; /* clock() */ char q = '\"';") is None


def test_the_child_ends_a_grading_whose_file_caught_the_gate_s_failure():
    """A failure of the gate's own work that solve caught is a rule violation at the next request; one that left
    solve is judged as that call's failure, and forgotten."""
    from types import SimpleNamespace

    from metakernel.grader.child import Bound, Child, _Fail, _failure

    gate = LaunchGate(mode="run")
    gate.failures.append("OutOfMemoryError: the audit's copy")
    child = SimpleNamespace(b=Bound(torch, "cpu"), guard=None, gate=gate, adapter=None, oom_seen=[])
    with pytest.raises(_Fail) as caught:
        Child._check_clean(child)  # type: ignore[arg-type]
    assert caught.value.status == "rule_violation" and "caught an error of the grader's own work" in caught.value.text
    _failure(child, RuntimeError("out of memory"), "runtime_error")  # type: ignore[arg-type]
    Child._check_clean(child)  # type: ignore[arg-type]


def test_the_gate_writes_arguments_without_moving_their_version_or_failing_on_inference_tensors():
    """The gate wrote launch arguments in place, which moved their version counter in isolated, randomised and
    suppressed calls only: autograd's check of a saved tensor raised exactly there, a tell; and an inference
    tensor, a complex one or a leaf that requires grad made the ablations' own writes raise, which read as
    "required" (session 31's fifth red-teamer). The gate now writes through aliases of its own."""
    w = torch.ones(8, requires_grad=True)
    probe = torch.randn(8)
    y = (probe * w).sum()
    with torch.inference_mode():
        frozen = torch.randn(8)
    leaf = torch.randn(4, requires_grad=True)
    waves = torch.randn(4, dtype=torch.complex64)
    for gate in (LaunchGate(mode="run", randomize=True), LaunchGate(mode="suppress")):
        before = probe.clone()
        gate.should_launch((probe, frozen, leaf, waves))
        assert not torch.equal(probe, before) and not gate.failures
        gate.after_launch()
    (grad,) = torch.autograd.grad(y, w)  # no "modified by an inplace operation"
    assert grad.shape == w.shape


def test_the_child_synchronises_after_a_collection_runs_the_file_s_code():
    """A generator in a reference cycle, suspended in a `try`, runs its `finally` when collected: session 33's
    red-teamer queued seconds of GPU work there, after the outputs were exported, into the eager baseline's timing.
    The child's collection is followed by a device-wide synchronisation, so no reply leaves the GPU busy."""
    from metakernel.grader.child import Child

    events: list[str] = []

    class Bound:
        @staticmethod
        def sync() -> None:
            events.append("sync")

    def planted():
        try:
            yield
        finally:
            events.append("finaliser")

    child = Child.__new__(Child)
    child.b = Bound()
    child._calls = 0
    holder: list[Any] = []
    gen = planted()
    next(gen)
    holder.extend([holder, gen])
    del holder, gen
    child._collect()
    assert events == ["finaliser", "sync"], events


def test_the_audit_copies_an_expanded_argument_in_the_memory_it_addresses():
    """One element expanded to 2^40 elements: a dense audit copy ran out of memory, which read as the machine's
    failure (`infra_error`), so a file could void its own grading. The audit copies its distinct elements and
    expands them again; an overlapping view above 1 GiB of elements is refused as the gate's failure on the file's
    argument (a ValueError: `rule_violation` in the parent)."""
    big = torch.randn(1).expand(1 << 40)
    gate = LaunchGate(mode="run", audit=True)
    assert gate.should_launch((big,), names=("k",)) and not gate.failures
    (copy,) = gate.audited[0].before
    assert copy.shape == big.shape and copy.untyped_storage().nbytes() == 4 and float(copy[12345]) == float(big[0])
    weight = torch.randn(64, 32)
    batched = weight.expand(8, 64, 32)  # an honest broadcast of a shared weight
    gate = LaunchGate(mode="run", audit=True)
    assert gate.should_launch((batched,), names=("k",)) and torch.equal(gate.audited[0].before[0], batched)
    overlapping = torch.zeros((1 << 16) + (1 << 14)).as_strided((1 << 16, 1 << 14), (1, 1))  # 4 GiB of elements
    gate = LaunchGate(mode="run", audit=True)
    with pytest.raises(ValueError, match="overlapping"):
        gate.should_launch((overlapping,), names=("k",))
    assert gate.failures and "ValueError" in gate.failures[0]
