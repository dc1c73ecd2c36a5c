"""What a TIRx kernel graded for the GPU may have LLVM compile into the child's own process: TVM's glue, no more.

A TIRx module's host code is LLVM machine code run inside the candidate's process, below every Python-level
layer: no audit event sees its loads and stores. An llvm-target function, or host code of a CUDA function, that
indexes a one-element buffer far out of bounds, or declares a buffer at an address it computed (`id()` gives the
address of any Python object), reads and writes the harness's objects: a red-team file rebound the timing
clock that way and graded 1.7 us for a 174 us kernel (session 17, CPU). A GPU kernel needs none of it: its host
functions only unpack arguments, check them and launch. So where the kernel is for the GPU (and in the free
check), `confine` makes every LLVM build

- come from `tvm.compile` / `tvm.tirx.build` of a source none of whose functions calls the glue's raw-memory
  intrinsics (`tvm_struct_get` on a handle it made, `tvm_call_packed`, ...) or an external C function, and
- hold no buffer access and no call beyond the glue's (`HOST_GLUE`) once lowered,

and refuses anything else through the audit event `base.NATIVE_CODE_EVENT`, which the child's audit hook turns into a
`rule_violation/sandbox` that catching the exception does not undo. A CPU-only grading runs llvm kernels by
design: there none of this applies, and the CPU grader is no trust boundary (docs/integrity.md).

The device code of the same builds is judged three times: the IR by op names before the build
(`source_problem`), the PTX the CUDA compiler makes of TVM's source during it (`ptx_checked`, where every spelling of
a GPU clock ends), and that CUDA source after it (`built_problem`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from typing import Any

from metakernel.dsl.base import CLOCK_REGISTERS, ptx_problem, source_clock
from metakernel.dsl.base import refuse_native_code as refuse

#: Calls TVM's lowering puts into a GPU module's host functions: argument unpacking and checks, the launch.
HOST_GLUE = frozenset({
    "tirx.tvm_struct_get", "tirx.tvm_struct_set", "tirx.tvm_stack_alloca", "tirx.tvm_stack_make_shape",
    "tirx.tvm_stack_make_array", "tirx.tvm_call_packed_lowered", "tirx.tvm_call_cpacked_lowered",
    "tirx.handle_add_byte_offset", "tirx.isnullptr", "tirx.reinterpret", "tirx.buffer_data", "tirx.ret",
    "prim.if_then_else", "tirx.likely", "tirx.assume", "tirx.tvm_throw_last_error",
})
#: Calls a kernel's own source may not make anywhere: each reads, writes or calls at an address of its choosing
#: (the glue's struct and stack access, packed calls into TVM's registry, C functions of the process).
RAW_MEMORY = frozenset({
    "tirx.tvm_struct_get", "tirx.tvm_struct_set", "tirx.tvm_stack_alloca", "tirx.tvm_stack_make_shape",
    "tirx.tvm_stack_make_array", "tirx.tvm_call_packed", "tirx.tvm_call_cpacked", "tirx.tvm_call_trace_packed",
    "tirx.tvm_call_packed_lowered", "tirx.tvm_call_cpacked_lowered", "tirx.tvm_call_trace_packed_lowered",
    "tirx.handle_add_byte_offset", "tirx.call_extern", "tirx.call_pure_extern", "tirx.call_llvm_intrin",
    "tirx.call_llvm_pure_intrin", "tirx.lookup_param",
    # lowered to packed calls of a name the source chooses, which the runtime looks up in TVM's global registry
    # (session 28's red-teamer called `s_tir.meta_schedule.remove_build_dir` from host code; the tensor-map encoder
    # writes a descriptor at any address)
    "tirx.call_ffi_kernel", "tirx.tensormap_encode_tiled", "tirx.anylist_setitem_call_packed",
    "tirx.anylist_setitem_call_cpacked",
})
#: What lowered host code may call by name: TVM's device setter and the kernels of the build (`<func>_kernel`,
#: `<func>_kernel_<n>`, as TVM names the device functions it splits off). A name the runtime does not find among the
#: module's kernels is looked up in TVM's global registry, where functions delete folders, load libraries and
#: start processes.
PACKED_CALLEES = re.compile(r"__tvm_set_device\Z|[A-Za-z_]\w*_kernel(?:_\d+)?\Z")
PACKED_CALLS = frozenset({"tirx.tvm_call_packed_lowered", "tirx.tvm_call_cpacked_lowered"})

#: Device source written as free text (`Tx.cuda.func_call(..., source_code=...)`): pasted into the generated CUDA
#: unread by any check here, it read `%globaltimer` spelled as two joined C literals and declared cuBLAS's kernel
#: names as the DSL's (session 24's red-teamer); the iket instrumentation event pastes its source alike (their second
#: round).
FREE_SOURCE = frozenset({"tirx.cuda.func_call", "tirx.cuda.iket_official_event"})

#: GPU clocks (and the profiler's intrinsics, which read one): refused anywhere in a source built for a GPU
#: grading, as are string operands naming a clock register (`base.CLOCK_REGISTERS`: inline PTX).
CLOCK_OPS = frozenset({"tirx.cuda.clock64", "tirx.cuda.mov_sreg", "tirx.timer_init_cuda", "tirx.timer_start_cuda",
                       "tirx.timer_end_cuda", "tirx.timer_finalize_cuda", "tirx.start_profile_intrinsic",
                       "tirx.end_profile_intrinsic"})

#: A function's name and symbol (TVM's codegen pastes the symbol into the CUDA source unread: a red-teamer's symbol
#: carried newlines and `#define`s, session 26), and the text of its attributes and variable names.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME = re.compile(r"[A-Za-z0-9_.]*\Z")
#: A thread tag (`Tx.launch_thread(tag, n)`): codegen writes it wherever the thread variable is read (session 26's
#: third red-teamer pasted a `#define` and a clock read through one).
_THREAD_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[xyz])?\Z")
#: What no string operand of an op needs (its tokens are modifiers such as `.shared::cta` or `sum`), and text pasted
#: into a source needs: line breaks, quotes, escapes, preprocessor lines and C++ digraphs, statement characters.
_C_SYNTAX = re.compile(r'[\n\r"\\#;{}]|%:|<%|%>|<:|:>')

#: Buffer loads and stores by their IR type keys (`tvm.tirx.BufferLoad` is a function that builds an ir.TensorLoad).
BUFFER_ACCESS = frozenset({"ir.TensorLoad", "tirx.BufferLoad", "tirx.BufferStore"})


class _Confinement:
    """Whether `confine` is in force, and how many checked builds are in progress (LLVM may build only then)."""

    def __init__(self) -> None:
        self.active = False
        self.checked_builds = 0
        # the kernels the CUDA builds of the build in progress defined (TVM builds device modules before the host
        # module that launches them): the only `*_kernel` names host code may call
        self.kernels: set[str] = set()
        self.registry: dict[str, Any] | None = None  # `registry_state` when confined


CONFINEMENT = _Confinement()


def ir_nodes(node: Any, texts: list[str] | None = None) -> Iterator[Any]:
    """Every IR object under `node` (statements, expressions, buffers), by the fields ffi reflection lists.

    With `texts`, every string met on the way (fields, map keys and values, list items) is appended to it: codegen
    pastes some of them (a thread tag, a symbol) into the generated source as they are.
    """
    import tvm_ffi

    stack = [node]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str):
            if texts is not None:
                texts.append(obj)
            continue
        if isinstance(obj, (list, tuple, tvm_ffi.Array)):
            stack.extend(obj)
            continue
        if isinstance(obj, tvm_ffi.Map):  # buffer maps, attributes
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        info = getattr(type(obj), "__tvm_ffi_type_info__", None)
        if info is None:
            continue
        yield obj
        while info is not None:
            stack.extend(getattr(obj, f.name, None) for f in info.fields if f.name != "span")
            info = info.parent_type_info


def _functions(mod: Any) -> list[tuple[str, Any]]:
    """(name, PrimFunc) of an IRModule, or of a lone PrimFunc."""
    import tvm

    if isinstance(mod, tvm.tirx.PrimFunc):
        return [("main", mod)]
    if isinstance(mod, tvm.ir.IRModule):
        return [(gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    return []


def _op_name(node: Any) -> str | None:
    import tvm

    if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
        return str(node.op.name)
    return None


def source_problem(mod: Any) -> str | None:
    """Why the source handed to a build may not be built for a GPU grading, or None.

    The whole function is walked, not only its body: a buffer's shape in the buffer map becomes a host-side check
    after lowering (a red-team file hid a `tvm_struct_set` there). Names TVM keeps for its own functions are
    refused too: the launch gate lets them run in the free check.
    """
    for name, func in _functions(mod):
        symbol = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else name
        for label in {name, symbol}:
            if not _IDENTIFIER.match(label):
                return (f"a function named {label[:60]!r} (function names must be C identifiers: TVM pastes them "
                        "into the generated CUDA source)")
            if label.startswith("__tvm"):
                return f"a function named {label} (names TVM keeps for its own functions)"
        for key, value in (func.attrs.items() if func.attrs else ()):
            if isinstance(value, str) and not _NAME.match(value):
                return f"function attribute {key} = {value[:60]!r} in {name} (attribute text must be a plain name)"
        texts: list[str] = []
        for node in ir_nodes(func, texts):
            tag = getattr(node, "thread_tag", None)
            if isinstance(tag, str) and tag and not _THREAD_TAG.match(tag):
                return f"a thread tag {tag[:40]!r} in {name} (codegen pastes it: blockIdx.x, threadIdx.y, ...)"
            hint = getattr(node, "name_hint", None)
            if isinstance(hint, str) and not _NAME.match(hint):
                return f"a variable named {hint[:60]!r} in {name} (names must be plain: codegen pastes them)"
            key = getattr(node, "attr_key", None)
            if isinstance(key, str) and "import" in key:
                return (f"an attribute {key} in {name} (it pastes foreign C or LLVM text into the build: write the "
                        "code in TIRx)")
            pointer = _pointer_problem(node)
            if pointer:  # device code too: memory reached by address is out of the launch gate's sight
                return (f"{pointer} in {name} (a pointer made of an integer reaches memory the grader cannot see: "
                        "pass tensors)")
            op = _op_name(node)
            if op in RAW_MEMORY:
                return f"{op.removeprefix('tirx.')} in {name} (raw memory access or a call into the process)"
            if op in FREE_SOURCE:
                return (f"{op.removeprefix('tirx.')} in {name} (device source written as text: its kernels, clocks "
                        "and memory access are out of the grader's sight; write the code in TIRx)")
            if op in CLOCK_OPS or (op is None and isinstance(getattr(node, "value", None), str)
                                   and CLOCK_REGISTERS.search(node.value)):
                return (f"{op.removeprefix('tirx.') if op else 'a clock register'} in {name} (a GPU clock: kernels "
                        "may not time themselves or tell calls apart)")
        for text in texts:
            if _C_SYNTAX.search(text):
                return (f"a string {text[:40]!r} in {name} holding C syntax (line breaks, quotes, preprocessor "
                        "or statement characters): codegen pastes some strings into the CUDA source")
    return None


#: Statements and expressions that bind a variable (`stack: T.let = T.tvm_stack_alloca(...)` prints as one).
BINDINGS = frozenset({"tirx.Bind", "tirx.LetStmt", "prim.Let", "tirx.Let"})
#: What may hold the argument stack a host function fills for its packed calls.
STACKS = frozenset({"tirx.tvm_stack_alloca", "tirx.tvm_stack_make_array", "tirx.tvm_stack_make_shape"})
STRUCT_ACCESS = frozenset({"tirx.tvm_struct_get", "tirx.tvm_struct_set"})


def _type_text(expr: Any) -> str:
    return str(getattr(expr, "ty", None) or getattr(expr, "dtype", "?"))


def _is_pointer(expr: Any) -> bool:
    ty = getattr(expr, "ty", None)
    if ty is not None:
        return type(ty).__name__ == "PointerType" or str(ty).startswith("T.handle")
    return str(getattr(expr, "dtype", "")) == "handle"


def _pointer_problem(node: Any) -> str | None:
    """Why an IR node makes a pointer of an integer or moves one by a computed distance, or None.

    TVM's glue only reinterprets one pointer type as another and steps over a fixed header
    (`handle_add_byte_offset(args[i], 24)`); a handle made of an integer, or moved by one, reads and writes
    wherever `tvm_struct_get`/`tvm_struct_set` are pointed (session 29's red-teamer wrote 8 bytes at `id(obj) + 32`).
    Source code is held to it too: a kernel's buffer declared at an integer address is memory the gate never sees.
    """
    kind = type(node).__tvm_ffi_type_info__.type_key
    if kind in ("prim.Cast", "tirx.Cast") and (_is_pointer(node) or _is_pointer(node.value)):
        return f"casting {_type_text(node.value)} to {_type_text(node)}"
    op = _op_name(node)
    if op == "tirx.reinterpret" and node.args and _is_pointer(node) != _is_pointer(node.args[0]):
        return f"reinterpreting {_type_text(node.args[0])} as {_type_text(node)}"
    if op == "tirx.handle_add_byte_offset" and len(node.args) > 1:
        offset = node.args[1]
        if type(offset).__tvm_ffi_type_info__.type_key != "ir.IntImm" or not 0 <= int(offset.value) < 4096:
            return "moving a pointer by a computed or large distance"
    return None


def host_problem(mod: Any, kernels: Collection[str] | None = None) -> str | None:
    """Why a module LLVM is about to build holds more than argument glue, or None.

    `kernels`, where given, are the kernels the build's CUDA modules define: a packed call of a `*_kernel` name
    must then name one of them (TVM 0.27 resolves such a name within the module, but a name it does not find there
    would go to the process's symbols and TVM's registry, where libtorch exports MKL's `*_kernel` functions).
    """
    for name, func in _functions(mod):
        stacks = {_handle(node.var) for node in ir_nodes(func)
                  if type(node).__tvm_ffi_type_info__.type_key in BINDINGS and _op_name(node.value) in STACKS}
        for node in ir_nodes(func):
            op = _op_name(node)
            if op in STRUCT_ACCESS:
                fixed = all(type(arg).__tvm_ffi_type_info__.type_key == "ir.IntImm" for arg in node.args[1:3])
                if not fixed or (op == "tirx.tvm_struct_set" and _handle(node.args[0]) not in stacks):
                    return (f"host code {op.removeprefix('tirx.')} on {str(node.args[0])[:60]} in {name}: "
                            "host code may only read its arguments' fields and fill its own argument stack")
            if type(node).__tvm_ffi_type_info__.type_key in BUFFER_ACCESS:
                return (f"host code that accesses buffer {node.buffer.name} in {name}: a GPU kernel's host code may "
                        "only unpack arguments and launch; compute in the kernel (no llvm-target functions)")
            pointer = _pointer_problem(node)
            if pointer:
                return f"host code {pointer} in {name}: host code may only pass on the pointers it is given"
            if op is not None and op not in HOST_GLUE:
                return f"host code calling {op.removeprefix('tirx.')} in {name}"
            if op in PACKED_CALLS:
                callee = getattr(node.args[0], "value", None) if len(node.args) else None
                if (not isinstance(callee, str) or not PACKED_CALLEES.match(callee)
                        or kernels is not None and callee != "__tvm_set_device" and callee not in kernels):
                    return (f"host code calling {str(callee)[:60]!r} by name in {name}: host code may only set the "
                            "device and launch the build's kernels")
    return None


def kernel_symbols(mod: Any) -> set[str]:
    """The global symbols of the functions an IRModule defines."""
    out = set()
    for func in mod.functions.values():
        attrs = getattr(func, "attrs", None)
        name = attrs.get("global_symbol") if attrs is not None else None
        if name is not None:
            out.add(str(name))
    return out


def _handle(obj: Any) -> int:
    """An FFI object's identity (its C handle; Python's id for anything else)."""
    try:
        return int(obj.__chandle__())
    except Exception:  # noqa: BLE001
        return id(obj)


def _device_modules(mod: Any) -> list[Any]:
    """The module and every module it imports (transitively), the root first."""
    seen: set[int] = set()
    out: list[Any] = []
    stack = [mod]
    while stack:
        m = stack.pop()
        key = _handle(m)
        if key in seen:
            continue
        seen.add(key)
        out.append(m)
        try:
            stack.extend(m.imports)
        except Exception:  # noqa: BLE001
            pass
    return out


def cuda_sources(mod: Any) -> list[str]:
    """CUDA (or PTX) source text of every CUDA module under `mod`; empty when only binaries are held."""
    out = []
    for m in _device_modules(mod):
        try:
            if m.kind != "cuda":
                continue
            src = m.inspect_source()
        except Exception:  # noqa: BLE001
            continue
        if src:
            out.append(src)
    return out


def built_problem(built: Any) -> str | None:
    """Why the device code a build produced may not run in a GPU grading (it reads a GPU clock), or None.

    `source_problem` judges the IR by op names and reads each string operand alone; what TVM's codegen finally
    writes (its Python codegen joins operand strings into inline PTX, adds helpers such as the profiler's timestamp)
    is read here as the CUDA compiler will read it, whatever op wrote it (`base.source_clock`).
    """
    runtime_module = getattr(built, "mod", built)  # `tvm.compile` wraps `tvm.tirx.build`'s module in an Executable
    for src in cuda_sources(runtime_module):
        clock = source_clock(src)
        if clock:
            return (f"device code reading a GPU clock ({clock.strip()} in the generated CUDA source): kernels may "
                    "not time themselves or tell calls apart")
    return None


#: Op attributes TVM's passes and code generators look up: a Python function set as one of them (a lowering rule,
#: a legalisation) runs inside the compiler after the source was checked. Each per target kind, and the plain keys.
_TARGET_KINDS = ("default", "llvm", "cuda", "nvptx", "rocm", "metal", "opencl", "webgpu", "hexagon", "aarch64", "c",
                 "cuda.fastmath", "llvm.fastmath", "default.fastmath")
OP_ATTR_KEYS = tuple(f"{kind}.{key}" for kind in _TARGET_KINDS for key in ("FLowerIntrinsic", "FLegalize")) + (
    "FLowerBuiltin", "FCallPacked", "FNormalize", "FPurity", "TCallEffectKind", "TGlobalSymbol", "TVectorizable",
    "TDeviceIntrinsicNamespace", "FInferMixedPrecision", "TMixedPrecisionPolicy", "FInferType", "dist.FInferType",
    "TScriptPrinterName")


def registry_state() -> dict[str, Any]:
    """What TVM's registries hold that its compile calls, by object identity.

    That is the global function registry, the operators' compiler attributes and the Python tables the compile
    reads (named pipelines, tile-primitive lowering cases, the CUDA code generator's functions and header tags).

    TVM's compile calls Python registered in either (an op's `llvm.FLowerIntrinsic`, a `tvm_callback_*` global)
    after `source_problem` has read the source: session 29's red-teamer registered a lowering rule for `isnullptr`
    that rewrote the gold kernel's host glue into an 8-byte write at any address, and one for `rsqrt` that put a
    refused `call_extern` into device code. `confine` records this state once the grader's own entries are in, and
    each checked build again when it ends (TVM may register entries lazily while it builds); `checked_build` refuses
    to build after any change made between them, whatever route made it. ~50 ms for ~28k entries.
    """
    import tvm
    import tvm_ffi

    def identity(value: Any) -> Any:
        handle = getattr(value, "__chandle__", None)
        return ("object", handle()) if callable(handle) else ("value", repr(value))

    out: dict[str, Any] = {}
    # the Python tables TVM's compile reads: named pipelines and the tile primitives' lowering cases
    from tvm.tirx import compilation_pipeline
    from tvm.tirx.operator.tile_primitive import dispatcher

    for name, factory in compilation_pipeline.PIPELINE_MAP.items():
        out["pipeline " + name] = ("python", id(factory))
    for (op, kind), cases in getattr(dispatcher, "_DISPATCH_TABLE", {}).items():
        out[f"dispatch {op.name} {kind}"] = ("python", tuple(id(case.impl) for case in cases))
    try:  # the CUDA code generator's Python table (op -> function returning CUDA text) and its header tags
        from tvm.backend.cuda.codegen import header, registry
    except ImportError:
        pass
    else:
        for name, function in registry.CODEGEN_REGISTRY.items():
            out["cuda codegen " + str(name)] = ("python", id(function))
        out["cuda header tags"] = ("python", tuple(sorted(map(str, header.TAGS))))
    for name in tvm_ffi.registry.list_global_func_names():
        out["function " + name] = identity(tvm_ffi.get_global_func(name, allow_missing=True))
    for name in tvm.ir.Op.list_op_names():
        op = tvm.ir.Op.get(name)
        for key in OP_ATTR_KEYS:
            if op.has_attr(key):
                out[f"op {name} {key}"] = identity(op.get_attr(key))
    return out


def _registry_problem(_state: Any = registry_state) -> str | None:
    """Why TVM's registries no longer hold what `confine` recorded, or None."""
    recorded = CONFINEMENT.registry
    if recorded is None:
        return None
    now = _state()
    changed = sorted(key for key in recorded.keys() | now.keys() if recorded.get(key) != now.get(key))
    if not changed:
        return None
    return (f"TVM's registry changed after the grader confined it ({', '.join(changed[:3])}"
            f"{', ...' if len(changed) > 3 else ''}): a function registered there runs inside the compiler, after "
            "the source check; build with tvm.compile(func, target=...) as it is")


def checked_build(build: Any, mod: Any, *args: Any, _problem: Any = source_problem, _refuse: Any = refuse,
                  _built_problem: Any = built_problem, _registry_problem: Any = _registry_problem,
                  _registry_state: Any = registry_state, **kwargs: Any) -> Any:
    """`build(mod, ...)` with its source checked first and LLVM allowed to run while it lasts; then its device source.

    The checks are default arguments, bound when this file was imported: a candidate that rewrote this module's
    globals (a red-teamer did, through a library helper that updates any object's `__dict__`) does not reach them.
    """
    if not CONFINEMENT.active:
        return build(mod, *args, **kwargs)
    problem = _registry_problem()
    if problem:
        _refuse(problem)
    problem = _problem(mod)
    if problem:
        _refuse(problem)
    CONFINEMENT.checked_builds += 1
    CONFINEMENT.kernels = set()  # nothing a failed build left behind
    try:
        built = build(mod, *args, **kwargs)
    finally:
        CONFINEMENT.checked_builds -= 1
    problem = _built_problem(built)
    if problem:
        _refuse(problem)
    CONFINEMENT.registry = _registry_state()  # what TVM registered lazily in its own build (the next one compares)
    return built


#: llvm target attributes that reach LLVM's options or switch its passes on (TVM sets `mtriple` itself; `mcpu` stays:
#: a machine's default may name it)
LLVM_OPTION_ATTRS = ("cl-opt", "mattr")


def confine() -> None:
    """Put the LLVM builder behind `host_problem` (idempotent). TVM looks the builder up by name for each build."""
    if CONFINEMENT.active:
        return
    import tvm_ffi

    original = tvm_ffi.get_global_func("target.build.llvm")
    original_cuda = tvm_ffi.get_global_func("target.build.cuda", allow_missing=True)
    state, check, deny, symbols = CONFINEMENT, host_problem, refuse, kernel_symbols  # closure cells (checked_build)

    def build_llvm(mod: Any, target: Any) -> Any:
        if state.checked_builds <= 0:
            deny("an llvm module built outside tvm.compile")
        if any(target.attrs.get(name) for name in LLVM_OPTION_ATTRS):
            # LLVM's own command-line options: `-x86-lvi-load-opt-plugin` dlopens a path of the file's choosing from
            # C++ when the host code is finalised (session 32's third red-teamer); others change code generation
            deny("LLVM command-line options or CPU features in the target (cl-opt, mattr): give the target as "
                 "the guide does, Target({'kind': 'cuda', 'arch': 'sm_90a'})")
        kernels, state.kernels = frozenset(state.kernels), set()
        problem = check(mod, kernels)
        if problem:
            deny(problem)
        return original(mod, target)

    tvm_ffi.register_global_func("target.build.llvm", build_llvm, override=True)
    if original_cuda is not None:
        build_cuda_original = original_cuda

        def build_cuda(mod: Any, target: Any) -> Any:
            state.kernels.update(symbols(mod))
            return build_cuda_original(mod, target)

        tvm_ffi.register_global_func("target.build.cuda", build_cuda, override=True)
    import tvm.support.nvcc  # noqa: F401  (registers the callback; a later import would replace the checked one)

    compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    if compile_cuda is not None:
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", ptx_checked(compile_cuda), override=True)
    CONFINEMENT.registry = registry_state()
    CONFINEMENT.active = True


def ptx_checked(compile_cuda: Any, to_ptx: Any = None, _problem: Any = ptx_problem, _refuse: Any = refuse) -> Any:
    """TVM's CUDA compile callback, with the module's PTX read for GPU clocks before the binary is made.

    `built_problem` reads the CUDA source, as the C compiler's lexer would; what only the preprocessor or the
    compiler shows (a macro holding half a register's name, an intrinsic the source names otherwise) ends in the
    PTX, as CuTe's check reads it (`base.ptx_problem`). NVRTC makes a loadable binary only from a real
    architecture and PTX only from a virtual one, so the source is compiled to PTX once more for the check (the
    same compiler and options; `to_ptx` is TVM's `compile_cuda` unless a test passes another).
    """

    def checked(code: str, *args: Any) -> Any:
        import os

        compile_ptx = to_ptx
        if compile_ptx is None:
            from tvm.support import nvcc

            compile_ptx = nvcc.compile_cuda
        mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower()
        ptx = compile_ptx(code, target_format="ptx", compiler=mode)
        text = ptx.decode("utf-8", "replace") if isinstance(ptx, (bytes, bytearray)) else str(ptx)
        problem = _problem(text)
        if problem:
            _refuse(problem)
        return compile_cuda(code, *args)

    return checked
