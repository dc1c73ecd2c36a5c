"""Every solution in solutions/ on the CPU: gold kernels pass the dry-run check (rules, import, compile for sm_90a,
launches intercepted, output structure); wrong ones whose reason is visible without a GPU are rejected with it."""

from __future__ import annotations

import importlib.util

import pytest

from metakernel import gold
from metakernel.catalog import load_catalog
from metakernel.grader.evaluate import dry_run

SOLUTIONS = gold.discover()
HAVE_DSLS = all(importlib.util.find_spec(m) is not None for m in ("tvm", "cutlass"))
pytestmark = pytest.mark.skipif(not HAVE_DSLS, reason="the DSL packages are not installed")


def test_every_gold_problem_has_both_dsls_and_every_family_at_least_two():
    """Pins the corpus: a gold problem is solved in both DSLs (a variant proven in one only is not a pair); every
    family keeps at least its two first gold problems; at least 12 wrong solutions."""
    catalog = load_catalog()
    gold_pairs = {(s.number, s.dsl) for s in SOLUTIONS if s.kind == "gold" and s.path.stem in ("cute", "tirx")}
    numbers = {n for n, _ in gold_pairs}
    assert all((n, d) in gold_pairs for n in numbers for d in ("cute", "tirx"))
    per_family: dict[str, int] = {}
    for n in numbers:
        fam = catalog.paths[n].parent.name
        per_family[fam] = per_family.get(fam, 0) + 1
    assert len(per_family) == 6 and min(per_family.values()) >= 2, per_family
    assert sum(1 for s in SOLUTIONS if s.kind == "wrong") >= 12


#: Gold kernels whose solve reads values at the full-scale shapes (a token count, a slot range), which a shape-only
#: trace cannot give: their check compiles the small scale and says the full scale was not covered
#: (validation/cpu-check-times.json: the other 73 of 79 compile the GPU's shapes).
NEEDS_VALUES_AT_FULL_SCALE = frozenset({23, 24, 26})


@pytest.mark.parametrize("sol", [s for s in SOLUTIONS if s.kind == "gold"], ids=lambda s: s.key)
def test_gold_passes_the_dry_run(sol):
    report = dry_run(load_catalog().problem(sol.number), sol.dsl, sol.path)
    assert report.status == "passed", report.agent_text()
    if sol.number in NEEDS_VALUES_AT_FULL_SCALE:  # the check says what it could not cover
        assert "full scale not covered" in report.message, report.message
    else:  # what the GPU runs was compiled
        assert "full scale (the GPU's shapes)" in report.message, report.message
    assert (report.launches_per_call or 0) >= 1
    # the resource table, read from the sm_90a cubins (TIRx's need the CUDA toolkit .ci/run checks for)
    assert report.resources and all(r["registers"] > 0 for r in report.resources), report.agent_text()
    text = report.agent_text()
    assert "kernel resources" in text and len(text.encode()) < 4096, text


#: Reasons a dry run can show (before or without values). The other wrong files (mismatch, token, share, timing,
#: ...) need the GPU: dry-running them proved only that they compile, at ~10 s each (a third of CI's time), so CI
#: checks that they clear the static rules (else the GPU would reject them as `static`, not for their reason).
CPU_VISIBLE = frozenset({"static", "structure", "sandbox", "no_dsl_launch", "output_type"})


@pytest.mark.parametrize("sol", [s for s in SOLUTIONS if s.kind == "wrong" and s.expected_reason in CPU_VISIBLE],
                         ids=lambda s: s.key)
def test_wrong_is_not_passed_off_as_gold_by_the_dry_run(sol):
    """Static and structure reasons show on the CPU; the others here may show already (a launch-less file, a
    sandbox refusal at import or in the call): then for the same reason."""
    report = dry_run(load_catalog().problem(sol.number), sol.dsl, sol.path)
    verdict = (report.status, report.reason)
    if sol.expected_reason in ("static", "structure"):
        assert verdict == (sol.expected_status, sol.expected_reason), report.agent_text()
    else:
        assert report.status == "passed" or verdict == (sol.expected_status, sol.expected_reason), \
            report.agent_text()


#: Red-team files whose native host code reaches the child's memory: the check refuses each before it runs
#: (`DslAdapter.confine`), in both DSLs, not only the GPU grading.
#: (`rt_cute_host_func_call_memcpy` is refused by the static rules since session 22: `.base_dsl`; its declaration
#: rule is pinned by `test_cute_host_and_device_rules_on_an_operation_tree`.)
#: (`rt_cute_host_jit_clock` is refused by the static rules since session 29: `make_ptr`; its host rule is pinned by
#: `test_cute_host_ops_of_the_gold_kernels_are_allowed_and_memory_ops_not`.)
NATIVE_CODE = ("rt_tirx_llvm_oob_clock", "rt_tirx_llvm_cast_clock", "rt_tirx_shape_expr_peek",
               "rt_tirx_llvm_gate_oracle")


@pytest.mark.parametrize("sol", [s for s in SOLUTIONS if s.path.stem in NATIVE_CODE], ids=lambda s: s.key)
def test_native_host_code_is_refused_by_the_check(sol, monkeypatch):
    """The layer behind the static rules: these files take addresses with id(), refused by name since session 31,
    so the rule is lifted here to show the host-code check still stops them on its own."""
    from metakernel.grader import static

    monkeypatch.setattr(static, "SAFE_BUILTINS", static.SAFE_BUILTINS | {"id", "hash"})
    report = dry_run(load_catalog().problem(sol.number), sol.dsl, sol.path)
    assert (report.status, report.reason) == ("rule_violation", "sandbox"), report.agent_text()
    assert any(why in report.message for why in ("host code", "names TVM keeps", "pointer made of an integer")), \
        report.agent_text()


@pytest.mark.skipif(not HAVE_DSLS, reason="needs both DSLs")
def test_a_library_written_at_run_time_cannot_be_loaded_in_the_sandbox(monkeypatch):
    """The layer behind the `EnvFunc` rule: session 32's red-teamer wrote a shared library into the work dir with
    TVM's module writer and had TVM's C++ loader `dlopen` it (no audit event), which ran native code that forged the
    harness's clock. With the name rule lifted, the load fails: nothing the child can write is executable."""
    from metakernel.grader import static
    from metakernel.grader.sandbox import default_mode

    if default_mode() == "none":
        pytest.skip("no OS isolation on this machine")
    sol = next(s for s in SOLUTIONS if s.key == "28/wrong/rt_tirx_envfunc_native_library.py")
    monkeypatch.delitem(static.FEATURE_ATTRIBUTES, "EnvFunc")
    report = dry_run(load_catalog().problem(sol.number), sol.dsl, sol.path)
    assert report.status in ("compile_error", "rule_violation"), report.agent_text()
    assert "failed to map segment" in report.message or "Operation not permitted" in report.message \
        or "cannot" in report.message, report.agent_text()


def test_cute_host_ops_of_the_gold_kernels_are_allowed_and_memory_ops_not():
    from metakernel.dsl.cute_host import forbidden

    gold_host_ops = ("cute.get_iter", "cute.make_tiled_copy", "cute_nvgpu.atom.make_non_exec_tiled_tma_load",
                     "cuda.launch_ex", "arith.cmpi", "scf.if", "cute.kernel_smem_size", "cute.print",
                     "cute.composition", "cute.raked_product", "cute.tuple.product_each", "cute.deref_arith_tuple_iter",
                     "cute.add_offset", "cute.to_int_tuple")
    assert not any(forbidden(op) for op in gold_host_ops)
    # `cute.print` passes by name; what it formats is judged by `host_print_ok` (tests/test_integrity_units.py). An
    # allowlist since session 28: `cute.gemm` loads and stores through any view, with no access word in its name.
    assert all(forbidden(op) for op in (
        "cute.memref.store", "cute.memref.load", "cute.inttoptr", "llvm.store", "cute.copy", "cute.print_tensor",
        "memref.load", "gpu.memcpy", "vector.gather", "cuda.memcpy", "builtin.unrealized_conversion_cast",
        "cute.gemm", "cute.mma_atom_call", "cute.deref_desc_iter",
        "cute_nvgpu.make_tma_desc_tiled_at", "cute_nvgpu.update_tma_desc"))


def test_every_cute_op_is_reviewed_for_host_code():
    """Host CuTe ops are an allowlist (session 28: `cute.gemm` loads and stores through any view, with no access word
    in its name). Every op of the installed CuTe dialects is in exactly one of the two reviewed sets, so a CuTe
    upgrade that adds ops fails here until someone decides what each may do in a host function."""
    from cutlass._mlir.dialects import _cute_nvgpu_ops_gen, _cute_ops_gen

    from metakernel.dsl.cute_host import HOST_CUTE_OPS, HOST_CUTE_REFUSED

    installed = {cls.OPERATION_NAME for module in (_cute_ops_gen, _cute_nvgpu_ops_gen)
                 for cls in vars(module).values() if isinstance(getattr(cls, "OPERATION_NAME", None), str)}
    assert not HOST_CUTE_OPS & HOST_CUTE_REFUSED
    assert installed - HOST_CUTE_OPS - HOST_CUTE_REFUSED == set(), "ops to review for host code"
    assert (HOST_CUTE_OPS | HOST_CUTE_REFUSED) - installed == set(), "reviewed ops CuTe no longer has"


def test_cute_host_functions_keep_their_bodies_and_casts_make_no_pointers():
    """Session 28's fourth red-teamer: a `func.func @memmove` with a dummy body and `available_externally` linkage
    (LLVM drops the body, the JIT binds libc's), called with `cuda.cast` i64 -> !llvm.ptr arguments, read and wrote
    anywhere. Parsed by CuTe's own bindings: both are refused, as is a stream made of an integer argument; the DSL's
    own casts (a launch's result to i32, the constant 0 to the default stream) are not."""
    from cutlass._mlir import ir
    from cutlass.cutlass_dsl import CuTeDSL

    from metakernel.dsl.cute_host import host_problem

    CuTeDSL._get_dsl()  # registers CuTe's dialects with the bindings
    with ir.Context():
        cast = ir.Module.parse('module { func.func @f(%a: i64) { %p = "cuda.cast"(%a) : (i64) -> !llvm.ptr\n'
                               "func.return } }")
        linkage = ir.Module.parse("module { func.func @memmove(%a: i64) attributes "
                                  "{llvm.linkage = #llvm.linkage<available_externally>} { func.return } }")
        own = ir.Module.parse('module { func.func @f(%r: !cuda.result) attributes {llvm.emit_c_interface} {\n'
                              '%c = "cuda.cast"(%r) : (!cuda.result) -> i32\n %z = arith.constant 0 : i64\n'
                              '%s = "cuda.cast"(%z) : (i64) -> !cuda.stream\n func.return } }')
        stream = ir.Module.parse('module { func.func @f(%a: i64) { %s = "cuda.cast"(%a) : (i64) -> !cuda.stream\n'
                                 "func.return } }")
        assert "!cuda.stream" in (host_problem(stream) or "")  # a stream handle of the file's choosing
        helper = ir.Module.parse("module { func.func @f(%a: i64) { %r = func.call @memcpy(%a) : (i64) -> i64\n"
                                 "func.return }\n func.func @memcpy(%a: i64) -> i64 { func.return %a : i64 } }")
        assert "func.call" in (host_problem(helper) or "")  # the fifth round: a helper named like libc's
        second = ir.Module.parse("module { func.func @f() { func.return }\n func.func @memcpy() { func.return } }")
        assert "second host function" in (host_problem(second) or "")
        assert "casting i64 to !llvm.ptr" in (host_problem(cast) or "")
        assert "llvm.linkage" in (host_problem(linkage) or "")
        assert host_problem(own) is None


class _Op:
    """An MLIR operation as cute_host walks one: a name, attributes, regions of blocks of operations."""

    def __init__(self, name, children=(), attributes=None, body=True):
        self.name = name
        self.attributes = attributes or {}
        self.operation = self
        self.regions = [type("R", (), {"blocks": [type("B", (), {"operations": list(children)})()] if body
                                       else []})()]


def test_cute_host_and_device_rules_on_an_operation_tree():
    """Host code may not declare an external function (libc's memcpy through a body-less func.func); device code
    may not read a GPU clock, whatever spelling put it there (an nvvm sreg read, inline PTX)."""
    from metakernel.dsl.cute_host import device_problem, host_problem

    def module(*ops):
        return _Op("builtin.module", ops)

    launch = _Op("func.func", [_Op("cute.make_layout"), _Op("cuda.launch_ex"), _Op("func.return")])
    kernel = _Op("gpu.module", [_Op("gpu.func", [_Op("nvvm.read.ptx.sreg.tid.x"), _Op("llvm.inline_asm", attributes={
        "asm_string": "cp.async.bulk.commit_group;"})])])
    assert host_problem(module(launch, kernel)) is None and device_problem(module(launch, kernel)) is None
    assert "external function" in host_problem(module(launch, _Op("func.func", body=False)))
    for clock in (_Op("nvvm.read.ptx.sreg.globaltimer"), _Op("nvvm.read.ptx.sreg.clock64"),
                  _Op("llvm.inline_asm", attributes={"asm_string": "mov.u64 $0, %globaltimer;"}),
                  _Op("llvm.inline_asm", attributes={"asm_string": "mov.u32 $0, %clock;"}),
                  _Op("llvm.call_intrinsic", attributes={"intrin": '"llvm.nvvm.read.ptx.sreg.globaltimer"'})):
        tree = module(launch, _Op("gpu.module", [_Op("gpu.func", [clock])]))
        assert "GPU clock" in device_problem(tree)
        assert host_problem(tree) is None  # the clock is device code: the host rule never looks inside

    def made(name, ty):  # an op whose one result has the printed type `ty`
        op = _Op(name)
        op.results = [type("V", (), {"type": ty})()]
        return module(launch, _Op("gpu.module", [_Op("gpu.func", [op])]))

    # a global pointer made of an integer in a kernel (session 29's fourth red-teamer, through the LLVM dialect)
    for name, ty in (("llvm.inttoptr", "!llvm.ptr<1>"), ("llvm.inttoptr", "!llvm.ptr"),
                     ("cute.inttoptr", "!cute.ptr<bf16, gmem, align<2>>")):
        assert "pointer of an integer" in device_problem(made(name, ty)), (name, ty)
    for name, ty in (("llvm.inttoptr", "!llvm.ptr<3>"), ("cute.inttoptr", "!cute.ptr<f32, smem, align<16>>")):
        assert device_problem(made(name, ty)) is None, (name, ty)


def test_cute_device_rules_read_the_attributes_of_real_mlir_ops():
    """Parsed with CuTe's own MLIR bindings, whose attribute map iterates over names (session 27: the rules read
    no attribute of a real op, so inline PTX reading %globaltimer passed). Refused: a clock in an asm string or a
    callee, LLVM's asm variants and operand-built register names, code linked from a file. Kernel symbols are
    taken only as C identifiers of functions the module defines."""
    from cutlass._mlir import ir

    from metakernel.dsl.cute_host import device_problem, kernel_symbols

    def kernels(body: str, attributes: str = "", extra: str = "") -> str:
        return (f"gpu.module @kernels {attributes} {{\n  cuda.kernel @kernel_cutlass_x_0() {{\n{body}\n"
                f"    cuda.return\n  }}\n{extra}}}")

    def asm(template: str) -> str:
        return f'    %0 = llvm.inline_asm has_side_effects "{template}", "=l" : () -> i64'

    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        torch_named = '  llvm.func @"void at::native::k<int>(int)"() {\n    llvm.return\n  }\n'
        honest = ir.Module.parse(kernels(asm("mov.u32 $0, %laneid;"), extra=torch_named))
        assert device_problem(honest) is None
        assert kernel_symbols(honest) == {"kernel_cutlass_x_0"}  # the demangled C++ name is no DSL symbol
        refused = {
            asm("mov.u64 $0, %globaltimer;"): "GPU clock",
            asm("mov.u64 $0, %glo$(bal$)timer;"): "variants or operands",
            asm("mov.u64 $0, %clo$(ck64$|x$);"): "variants or operands",
            asm("mov.u64 $0, %$1;"): "variants or operands",
            asm("mov.u64 $0, %glo$1;"): "variants or operands",  # `@baltimer` as a symbol operand finished it
            asm("mov.u64 $0, %glo${1};"): "variants or operands",
            '    %0 = llvm.call_intrinsic "llvm.nvvm.read.ptx.sreg.globaltimer"() : () -> i64': "GPU clock",
        }
        for body, reason in refused.items():
            problem = device_problem(ir.Module.parse(kernels(body)))
            assert problem is not None and reason in problem, (body, problem)
        symbol = '    %0 = llvm.inline_asm has_side_effects "mov.u64 $0, $1;", "=l,s" : () -> i64'
        assert "constraint 's'" in device_problem(ir.Module.parse(kernels(symbol)))
        declared = '  llvm.func @ampere_sgemm_128x64_tn()\n'  # declared, never defined: no kernel of this build
        assert kernel_symbols(ir.Module.parse(kernels("", extra=declared))) == {"kernel_cutlass_x_0"}
        linked = ir.Module.parse(kernels("", 'attributes {"link-libraries" = ["/tmp/x.bc"]}'))
        assert "linked from a file" in device_problem(linked)


def test_cute_compile_options_that_write_options_of_their_own_are_refused():
    """A text option's value goes into the compiler's option string between quotes, unescaped (session 27's third
    red-teamer): a value holding a quote, and `link-libraries` itself, are refused; CuTe's own options are not."""
    from types import SimpleNamespace

    from cutlass.base_dsl.compiler import CompileOptions

    from metakernel.dsl.cute_host import option_problem

    assert option_problem(SimpleNamespace(compile_options=CompileOptions())) is None

    def named(name: str, value: object) -> SimpleNamespace:
        return SimpleNamespace(_option_name=name, value=value)

    def dsl(*options: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(compile_options=SimpleNamespace(options=dict(enumerate(options))))

    assert option_problem(dsl(named("ptxas-options", "-v"), named("opt-level", 3))) is None
    injected = named("ptxas-options", "x' link-libraries='/tmp/x.bc")
    assert "holds a quote" in option_problem(dsl(injected))
    assert "linked from a file" in option_problem(dsl(named("link-libraries", "/tmp/x.bc")))


def test_tirx_clock_ops_are_refused_in_a_gpu_source():
    """TIRx's profiling intrinsics and clock reads (and inline PTX naming a clock register) in a source built for a
    GPU grading: refused whatever the name that reached them."""
    import tvm
    from tvm.script import tirx as Tx

    from metakernel.dsl.tirx_host import source_problem

    @Tx.prim_func
    def stamp(buf_ptr: Tx.handle, tag_ptr: Tx.handle, off_ptr: Tx.handle):
        P = Tx.match_buffer(buf_ptr, (64,), "uint64")
        G = Tx.match_buffer(tag_ptr, (1,), "uint64")
        offsets = Tx.match_buffer(off_ptr, (1,), "int32")
        Tx.device_entry()
        Tx.cta_id([1])
        Tx.thread_id([32])
        Tx.cuda.timer_init(P.data, G.data, offsets.data, 1, 0)

    problem = source_problem(tvm.IRModule({"stamp": stamp}))
    assert problem is not None and "GPU clock" in problem


def test_wrong_files_the_gpu_must_judge_clear_the_static_rules():
    """Those files reach the GPU's checks only if the static rules let them through."""
    from metakernel.grader.static import check_source

    later = [s for s in SOLUTIONS if s.kind == "wrong" and s.expected_reason not in CPU_VISIBLE]
    assert len(later) >= 20
    for sol in later:
        result = check_source(sol.path.read_text(), sol.dsl, filename=sol.path.name)
        assert not result.problem and not result.violations, (sol.key, result.problem, result.violations)


def test_the_check_benchmark_measures_time_memory_and_coverage():
    """scripts/bench_check.py (validation/cpu-check-times.json, the guides' figures): one gold kernel's check in a
    process of its own, its wall time, the peak memory of it and its sandboxed child, and the full-scale coverage."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        from bench_check import measure
    finally:
        sys.path.pop(0)
    sol = next(s for s in SOLUTIONS if s.kind == "gold" and s.number == 28 and s.dsl == "tirx")
    row = measure(sol.number, sol.dsl, sol.path)
    assert row["status"] == "passed" and row["full_scale_covered"] and row["full_scale_only"], row
    assert 0 < row["seconds"] < row["wall_s"] and 0.3 < row["peak_rss_gb"] < 8, row
