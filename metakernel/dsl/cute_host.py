"""What a CuTe kernel graded for the GPU may do in its host functions: build layouts and launch, not touch memory.

A `@cute.jit` host function is LLVM code run inside the candidate's process, below every Python-level layer: with
`cute.make_ptr(Int64, addr, AddressSpace.generic)` and a one-element tensor over it, it loads and stores at any
address, and `id()` gives the address of any Python object (the harness's clock included; red-team file
`rt_cute_host_jit_clock`). The host functions of every gold kernel only read shapes and layouts, build atoms and
launch (their ops, surveyed over all 39 gold files: `cute.get_*`, `cute.make_*`, layout algebra, `arith`, `scf`,
`cuda.launch_*`). So where the kernel is for the GPU (and in the free check), `confine` checks each module the DSL
builds, before any pass runs, and refuses a host function holding a CuTe op outside that allowlist (`HOST_CUTE_OPS`:
no op that reads or writes memory or makes a pointer from an integer), an op of any other dialect than the few
gold host code uses, or a declaration of an external function
(`host_problem`), through the audit event the child's hook records. Device code (inside `gpu.module`) is
the kernel's and reaches GPU memory only.
"""

from __future__ import annotations

import re
from typing import Any

from metakernel.dsl.base import CLOCK_REGISTERS, ptx_problem, refuse_native_code

#: Ops of other dialects a host function may hold (an allowlist: the gold kernels' host functions use these). No
#: `func.call`: the DSL inlines nested `@cute.jit` calls, so a traced module holds one host function and calls none;
#: red-team files called libc's memcpy through a body-less declaration, and (session 28's fifth red-teamer) through
#: a helper *with* a body named `memcpy`, which LLVM takes for the library function.
ALLOWED_PREFIXES = ("arith.", "scf.", "math.", "index.", "cuda.launch", "cuda.cast", "cuda.return_if_error",
                    "func.return")
#: CuTe ops a host function may hold: an allowlist since session 28, reviewed op by op against CuTe's dialects
#: (a denylist of access words let `cute.gemm` through, whose host lowering loads A and B and stores into C through
#: a view offset to any address, and a host `printf` of the file's own format, `%s` reading and `%n` writing
#: anywhere: the third and second red-teamers). Shapes, strides, coordinates, layouts and their algebra, views and
#: iterators (pointer arithmetic without a dereference is harmless: device code computes addresses anyway and
#: reaches GPU memory only), atoms, tiled copies and MMAs, divisors, the launch-limit print (`host_print_ok`).
HOST_CUTE_OPS = frozenset("cute." + name for name in (
    "add_offset append_to_rank apply_swizzle assume blocked_product ceil_div coalesce complement composed_get_inner "
    "composed_get_offset composed_get_outer composition cosize crd2idx deref_arith_tuple_iter derefine dice "
    "elem_less equal fast_divmod.compute fast_divmod.create_divisor fast_divmod.divide fast_divmod.get_aux "
    "fast_divmod.get_divisor fast_divmod.make_divisor filter filter_zeros flat_divide flat_product get_flat_coord "
    "get_hier_coord get_integral_coord get_iter get_layout get_layouts_from_tile get_leaves get get_scalars "
    "get_shape get_stride group_modes idx2crd increment_coord kernel_smem_size left_inverse local_partition "
    "local_tile logical_divide logical_product make_arith_tuple_iter make_atom make_composed_layout make_coord "
    "make_desc_iter make_identity_layout make_identity_tensor make_int_tuple make_layout_like make_layout "
    "make_ordered_layout make_shape make_sparse_elem make_stride make_tile make_tiled_copy make_tiled_copy_v2 "
    "make_tiled_mma make_tuple make_view prepend_to_rank print raked_product recast_iter recast_layout "
    "right_inverse select shape_div size slice smem_partition_size static stencil_divide symbolic tile_to_shape "
    "tiled.copy.partition_D tiled.copy.partition_S tiled.copy.retile tiled.mma.partition tiled.mma.partition_shape "
    "tiled_divide tiled_product to_int_tuple "
    "tuple_add tuple_div tuple_mod tuple_mul tuple.product_each tuple.product tuple_sub unpack_tuple zipped_divide "
    "zipped_product").split()) | frozenset("cute_nvgpu." + name for name in (
        "atom.get_coord_tensor atom.get_value atom.set_value atom.make_exec_tma "
        "atom.make_non_exec_2d_gather4_tma_load atom.make_non_exec_2d_scatter4_tma_store "
        "atom.make_non_exec_im2col_tma_load atom.make_non_exec_im2col_tma_store atom.make_non_exec_tiled_tma_load "
        "atom.make_non_exec_tiled_tma_reduce atom.make_non_exec_tiled_tma_store atom.make_s2t_copy "
        "atom.make_tma_residue_tensor atom.make_tmem_copy atom.tma_partition make_gmma_smem_desc "
        "make_umma_smem_desc").split())
#: The CuTe ops reviewed and refused in host code: each loads, stores, allocates, prints memory, turns pointers
#: and integers into each other, or writes a descriptor at a pointer. A CuTe op in neither set (a newer CuTe's) is
#: refused too, and a test lists it for review.
HOST_CUTE_REFUSED = frozenset("cute." + name for name in (
    "copy gemm prefetch copy_atom_call copy.make_fragment deref_desc_iter inttoptr load_scaled_index "
    "make_fragment_like memref.alloc_smem memref.alloca memref.load memref.load_vec memref.store memref.store_vec "
    "mma_atom_call mma.make_fragment prefetch_atom_call print_tma_desc_im2col print_tma_desc_tiled print_view "
    "ptr.load ptr.store ptrtoint random_delay reduce").split()) | frozenset("cute_nvgpu." + name for name in (
        "arch.alloc_rmem arch.alloc_smem arch.get_dyn_smem arch.get_dyn_smem_size arch.make_warp_uniform "
        "arch.prefetch_tma_desc arch.sm100.alloc_tmem arch.sm100.dealloc_tmem arch.sm100.relinquish_tmem_alloc_permit "
        "arch.sm100.retrieve_tmem_ptr atom.get_copy_s2t_smem_desc_view atom.sm107.get_copy_s2t_smem_desc_view "
        "cast_tma_desc_to_integer copy_tma_desc get_grid_constant_pointer get_tma_desc_addr make_tma_desc_im2col "
        "make_tma_desc_im2col_at make_tma_desc_tiled make_tma_desc_tiled_at prefetch_tma_desc "
        "sm103.make_umma_smem_desc_circular sm107.make_umma_smem_desc sm107.make_umma_smem_desc_circular "
        "update_tma_desc arch.copy.SM100.copy_s2t arch.copy.SM100.tma_load arch.copy.SM100.tma_reduce "
        "arch.copy.SM100.tma_store arch.copy.SM100.tmem_load arch.copy.SM100.tmem_store "
        "arch.copy.SM107.tma_load_override arch.copy.SM107.tma_store_override arch.copy.SM90.bulk_copy_g2s "
        "arch.copy.SM90.bulk_copy_s2g "
        "arch.copy.SM90.bulk_copy_s2s arch.mma.SM107.umma arch.mma.SM107.umma_block_scaled "
        "arch.mma.SM107.umma_block_scaled_sparse arch.mma.SM107.umma_sparse arch.mma.SM120.block_scaled").split())
#: Operand types a host `cute.print` may format: numbers (the DSL's own launch-limit message prints an i64).
_NUMBER_TYPE = re.compile(r"^(?:i\d+|index|f\d+|bf16|tf32)$")
#: Regions that hold device code.
DEVICE_OPS = frozenset({"gpu.module", "gpu.binary"})


class _Confinement:
    def __init__(self) -> None:
        self.active = False


CONFINEMENT = _Confinement()


def _host_ops(op: Any) -> Any:
    """Every op nested in `op` outside device-code regions."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                operation = inner.operation
                if operation.name in DEVICE_OPS:
                    continue
                yield operation
                yield from _host_ops(operation)


def forbidden(name: str) -> bool:
    """Whether a host function may not hold an op of this name.

    `func.func` is judged by `host_problem`, and a `cute.print` also by `host_print_ok`.
    """
    if name.startswith(("cute.", "cute_nvgpu.")):
        return name not in HOST_CUTE_OPS
    return not name.startswith(ALLOWED_PREFIXES)


#: Attributes a host `func.func` may carry (the gold kernels' functions have the first three). Others change what
#: the body means: `llvm.linkage = available_externally` threw the body away and the JIT bound the name to libc's
#: `memmove` (session 28's fourth red-teamer).
FUNC_ATTRIBUTES = frozenset({"sym_name", "function_type", "llvm.emit_c_interface", "arg_attrs", "res_attrs",
                             "sym_visibility"})
#: `cuda.cast` in host code: only a launch's result to its integer code, and the constant 0 to the default stream
#: (what the DSL writes). Integers to pointers, streams or events made addresses of the file's choosing (the same
#: red-teamer).
_CAST_FROM = re.compile(r"^!cuda\.result$")
_CAST_TO = re.compile(r"^i\d+$")


def _default_stream(cast: Any) -> bool:
    """Whether a `cuda.cast` makes the default stream: the constant 0 as `!cuda.stream` (a launch without a stream)."""
    try:
        [value], [result] = list(cast.operands), list(cast.results)
        owner = value.owner
        return (str(result.type) == "!cuda.stream" and str(value.type) == "i64" and owner.name == "arith.constant"
                and str(owner.attributes["value"]).strip() == "0 : i64")
    except Exception:  # noqa: BLE001 - anything else is not the default stream
        return False


def host_problem(module: Any) -> str | None:
    """Why a module's host code may not be built for a GPU grading, or None."""
    functions = 0
    for operation in _host_ops(module.operation):
        if operation.name == "func.func":
            if not operation.regions or not len(operation.regions[0].blocks):  # a declaration: code from elsewhere
                return ("host code declaring an external function: a GPU kernel's host function may not call into "
                        "the process")
            functions += 1
            if functions > 1:
                return ("a second host function in the module: the DSL traces one (nested @cute.jit calls are "
                        "inlined); functions of the file's own can stand for the process's")
            try:
                names = {str(operation.attributes[i].name) for i in range(len(operation.attributes))}
            except Exception:  # noqa: BLE001 - unread is refused
                names = {"(unreadable)"}
            if names - FUNC_ATTRIBUTES:
                return (f"a host function with attribute {sorted(names - FUNC_ATTRIBUTES)[0]}: linkage and other "
                        "attributes can swap its body for code of the process")
            continue
        if operation.name == "cuda.cast":
            try:
                froms = [str(value.type) for value in operation.operands]
                tos = [str(result.type) for result in operation.results]
            except Exception:  # noqa: BLE001
                froms, tos = ["(unreadable)"], []
            if not (all(_CAST_FROM.match(t) for t in froms) and all(_CAST_TO.match(t) for t in tos)
                    or _default_stream(operation)):
                return (f"host code casting {', '.join(froms)[:60]} to {', '.join(tos)[:60]}: integers may not "
                        "become pointers, streams or events")
            continue
        if forbidden(operation.name) or (operation.name == "cute.print" and not host_print_ok(operation)):
            return (f"host code with {operation.name}: a GPU kernel's host function may build layouts and launch, "
                    "not read or write memory (do that in the kernel)")
    return None


def host_print_ok(operation: Any) -> bool:
    """Whether a host print only formats numbers.

    No C specifier of the file's own (`{}` placeholders, which CuTe fills by each value's type), every operand a
    number. The DSL prints its own launch-limit errors this way.
    """
    try:
        texts = _texts(operation)[1:]
        types = [str(operand.type) for operand in operation.operands]
    except Exception:  # noqa: BLE001 - unread is refused
        return False
    return not any("%" in text for text in texts) and all(_NUMBER_TYPE.match(t) for t in types)


def _texts(operation: Any) -> list[str]:
    """An op's name and every attribute's text.

    A clock register hides in an inline asm's string, or in the intrinsic name of `llvm.call_intrinsic` (session
    22's red-teamer). The bindings' attribute map iterates over names, not `NamedAttribute`s: read by position
    (session 27's red-teamer found the earlier loop raised on the first attribute and read none). An attribute
    that cannot be read raises: the caller refuses the build rather than pass what it did not see.
    """
    texts = [str(operation.name)]
    attributes = operation.attributes
    if isinstance(attributes, dict):  # the tests' stand-in operations
        return texts + [f"{k} = {v}" for k, v in attributes.items()]
    for index in range(len(attributes)):
        named = attributes[index]
        texts.append(f"{named.name} = {named.attr}")
    return texts


#: LLVM's inline-asm template syntax that builds text no string shows: `$(a$|b$)` prints one variant of several
#: (`%glo$(bal$)timer` is `%globaltimer` in the PTX), and an operand right after a name's characters finishes the
#: name (`%glo$1` with a global `baltimer` passed as a symbol operand, session 27's second red-teamer). No op of
#: the CuTe library writes either.
_ASM_BUILDS_TEXT = re.compile(r"\$[()|]|[\w%]\$\{?\d")
#: Operand constraints device inline asm may use: registers of each width, immediates, tied operands and clobbers
#: (what the CuTe library uses). `s` prints a global's bare name into the template (as `i` does, which the
#: library uses for integer masks: the template rule above keeps such a name from finishing a register's).
_ASM_CONSTRAINT = re.compile(r"^[=+&*]*(?:[rlhfdnqbci]|\d+|~\{[\w.]*\})$")
#: The attribute that links device code from a file into the kernel (`cute.ffi`'s bitcode): code no check reads.
_LINKED = re.compile(r"link[-_]?libraries", re.I)
LINKED_PROBLEM = "device code linked from a file (link-libraries): every kernel instruction must come from this file"


def _op_problem(operation: Any) -> str | None:
    try:
        texts = _texts(operation)
    except Exception as exc:  # noqa: BLE001 - unread is refused, not passed
        return f"device op {operation.name} whose attributes cannot be read ({type(exc).__name__})"
    for text in texts:
        if found := CLOCK_REGISTERS.search(text.replace("$$", "$")):
            return (f"device code reading a GPU clock ({found.group(0)} in {operation.name}): kernels may not time "
                    "themselves or tell calls apart")
        if "inline" in operation.name and _ASM_BUILDS_TEXT.search(text.replace("$$", "")):
            return ("inline asm whose template builds a name from variants or operands ($(...$|...$), a name "
                    "finished by $N): write the PTX out in full")
        if operation.name == "llvm.inline_asm" and text.startswith("constraints = "):
            codes = text[len("constraints = "):].strip('"')
            bad = [c for c in codes.split(",") if c and not _ASM_CONSTRAINT.match(c.strip())]
            if bad:
                return (f"inline asm operand constraint {bad[0]!r}: device inline asm takes registers (r, l, h, f, "
                        "d), immediates (n, i) and clobbers only")
        if _LINKED.search(text):
            return LINKED_PROBLEM
    return None


def _device_ops(op: Any, inside: bool = False) -> Any:
    """Every op nested in `op` inside device-code regions."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                operation = inner.operation
                now = inside or operation.name in DEVICE_OPS
                if now:
                    yield operation
                yield from _device_ops(operation, now)


def device_problem(module: Any) -> str | None:
    """Why a module's device code may not be built for a GPU grading, or None.

    It may not read a GPU clock, build asm text no string shows, link code from a file, or make a global pointer
    of an integer. Nor come as a ready binary: a `gpu.binary` holds device code as bytes no check reads (a traced
    module only ever holds source; session 28's red-teamer moved one in through the MLIR bindings).
    """
    for operation in _device_ops(module.operation):
        if operation.name == "gpu.binary":
            return "device code as a ready binary (gpu.binary): only code the DSL compiles from this file may run"
        if operation.name in ("cute.inttoptr", "llvm.inttoptr") and _global_pointer(operation):
            # an integer made a global-memory pointer in the kernel: memory the launch gate never sees (session
            # 29's red-teamer copied an eager answer handed over as `data_ptr()` integers)
            return (f"device code making a global-memory pointer of an integer ({operation.name}): pass the memory "
                    "as a tensor argument")
        problem = _op_problem(operation)
        if problem:
            return problem
    return None


def _global_pointer(operation: Any) -> bool:
    """Whether an op's result is a pointer into global (or generic) memory, by its printed type."""
    try:
        text = " ".join(str(result.type) for result in operation.results)
    except Exception:  # noqa: BLE001 - unreadable: count it as global
        return True
    if text.startswith("!llvm.ptr"):  # LLVM's address spaces: 3 shared, 5 local, 6 tensor memory
        return not any(text.startswith(f"!llvm.ptr<{space}>") for space in (3, 5, 6))
    return "smem" not in text and "rmem" not in text and "tmem" not in text


def kernel_symbols(module: Any) -> set[str]:
    """The `__global__` symbols a module's device code defines: the `cuda.kernel`s (with a body) it holds.

    A compiled object's `kernel_info` lists the same names, but it is a dict the candidate holds and can write:
    torch's demangled kernel names added there counted torch's work as the DSL's (session 27's red-teamer). Only
    names of kernels the DSL itself built are taken (`cute._kernel_names`). Not other functions: a body-less
    `llvm.func` declared with a library kernel's name (session 27's second red-teamer) defines no kernel.
    """
    found = set()
    for operation in _device_ops(module.operation):
        if operation.name != "cuda.kernel" or not operation.regions or not len(operation.regions[0].blocks):
            continue
        try:
            name = str(operation.attributes["sym_name"]).strip('"')
        except Exception:  # noqa: BLE001 - an op without a symbol defines no kernel
            continue
        if _SYMBOL.match(name):
            found.add(name)
    return found


_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Every kernel symbol a checked build defined in this process.
BUILT_KERNELS: set[str] = set()


def option_problem(dsl: Any) -> str | None:
    """Why the compile options the candidate set may not be used, or None.

    `link-libraries` brings in device code no check reads. And a text option's value is written into the
    compiler's option string between single quotes, unescaped: a value holding a quote would append options of
    its own choosing (session 27's third red-teamer), `link-libraries` or another PTX path among them.
    """
    options = getattr(getattr(dsl, "compile_options", None), "options", None) or {}
    for key, option in dict(options).items():
        value = getattr(option, "value", None)
        name = str(getattr(key, "_option_name", "") or getattr(option, "_option_name", ""))
        if name == "link-libraries" and value:
            return LINKED_PROBLEM
        if isinstance(value, str) and ("'" in value or '"' in value):
            return f"compile option {name or key!r} whose value holds a quote: it would write options of its own"
    return None


def module_digest(module: Any) -> str:
    """A digest of a compiled module's whole content (host code and the embedded kernel binary)."""
    import hashlib
    import io

    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


class _Engines:
    def __init__(self) -> None:
        self.compiling = 0  # checked compiles in progress: the only time a JIT engine may be built


ENGINES = _Engines()


def _guard_engines() -> None:
    """Let JIT engines be built only inside a checked compile.

    An engine turns an LLVM module (or an object file's bytes) into native code in this process. The DSL builds one
    per compile, from the module the checks just read; the engine classes are reachable from any compiled object
    (`type(fn.engine)`), and one built from a module the file wrote as text ran a CPU clock and read the harness's
    memory (session 28's red-teamer). The static rules refuse those names; this is the layer below them.
    """
    from cutlass._mlir import execution_engine

    classes = [cls for cls in execution_engine.ExecutionEngine.__mro__ if cls is not object]
    try:
        from cutlass._mlir._mlir_libs._cutlass_ir._execution_engine import BinaryExecutionEngine
    except ImportError:  # an older CuTe without the JITLink engine
        pass
    else:
        classes.append(BinaryExecutionEngine)
    for cls in classes:
        original_init = cls.__dict__.get("__init__")
        if original_init is None:
            continue

        def guarded(self: Any, *args: Any, _init: Any = original_init, **kwargs: Any) -> None:
            if ENGINES.compiling <= 0:
                refuse_native_code("a JIT engine built outside the DSL's checked compile: it would run native code "
                                   "no check read")
            _init(self, *args, **kwargs)

        cls.__init__ = guarded  # type: ignore[misc]


def confine() -> None:
    """Check every module the DSL builds, and the PTX every compile produces (idempotent).

    A cache hit compiles nothing: CuTe builds a new engine from the cached object's `ir_module`, which the
    candidate holds and can rewrite through the MLIR bindings (session 27's third red-teamer: the embedded kernel
    binary, `llvm.mlir.global @kernels_binary`; the host code too). So each checked compile's module is digested,
    and a cache hit is let through only with that same content, before the engine is built; CuTe's file cache
    (modules read from disk, checked by nobody) is refused outright.
    """
    if CONFINEMENT.active:
        return
    import os
    import tempfile

    from cutlass.base_dsl import compile_backend
    from cutlass.base_dsl.compiler import CompileOptions, GPUArch, KeepPTX
    from cutlass.base_dsl.dsl import BaseDSL

    _guard_engines()
    original = BaseDSL.build_module
    original_apply = CompileOptions.apply_envar_settings
    original_compile = BaseDSL.compile_and_cache
    original_resolve = compile_backend.CompilerBackend._resolve_compile_cache
    ptx_dir = tempfile.mkdtemp(prefix="cute-ptx-")  # the child's own temp folder
    digests: dict[str, str] = {}  # module hash -> digest of the module its checked compile produced

    def build_module(self: Any, module: Any, function_name: str) -> Any:
        problem = host_problem(module) or device_problem(module)
        problem = problem or option_problem(self)
        if problem:
            refuse_native_code(problem)
        built.update(kernel_symbols(module))
        return original(self, module, function_name)

    def apply_envar_settings(self: Any, envar: Any, function_name: str) -> None:
        original_apply(self, envar, function_name)
        keep = self.options[KeepPTX]
        if not keep.value:  # the compiler writes the PTX it assembles; caching stays as it was (an env setting
            keep.value = True  # of KEEP would have turned it off)
            arch = self.options[GPUArch].value or envar.arch
            self._set_artifact_dump_paths(keep, ptx_dir, function_name, arch, "ptx", "full_ptx_path")

    def compile_and_cache(self: Any, module: Any, module_hash: Any, *args: Any, **kwargs: Any) -> Any:
        # the module again, whoever calls: the DSL passes the one `build_module` checked, but a caller of its own
        # (the method is reachable from the DSL's classes) would pass a module of any text
        problem = host_problem(module) or device_problem(module) or option_problem(self)
        pipeline = args[1] if len(args) > 1 else kwargs.get("pipeline")
        if pipeline is not None:  # the DSL's own pipeline writes the PTX the check reads; another need not
            problem = problem or "a compile pipeline of the file's own: only the DSL's default pipeline"
        if problem:
            refuse_native_code(problem)
        device_code = next(_device_ops(module.operation), None) is not None
        path = self.compile_options.full_ptx_path  # where this compile writes its PTX (options reset after it)
        if path and os.path.isfile(path):
            os.unlink(path)  # an earlier compile's file of the same name is not this one's
        ENGINES.compiling += 1
        try:
            compiled = original_compile(self, module, module_hash, *args, **kwargs)
        finally:
            ENGINES.compiling -= 1
        if path and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            os.unlink(path)
            problem = ptx_problem(text)
            if problem:
                refuse_native_code(problem)
        elif (device_code or getattr(compiled, "kernel_info", None)) and module_hash not in digests:
            refuse_native_code("compiled device code whose PTX the grader could not read")
        if module_hash and getattr(compiled, "ir_module", None) is not None:
            digests[module_hash] = module_digest(compiled.ir_module)  # a cache hit's module is this one, unchanged
        return compiled

    def resolve_compile_cache(self: Any, ctx: Any) -> Any:
        state = original_resolve(self, ctx)
        if state.load_from_file_cache:
            refuse_native_code("a compiled module read from CuTe's file cache: no check read it")
        if state.cache_hit and (ctx.module_hash not in digests
                                or module_digest(state.module) != digests[ctx.module_hash]):
            refuse_native_code("a cached compiled module whose content changed after its check (its host code "
                               "or kernel binary was rewritten): the DSL would build an engine from it")
        return state

    built = BUILT_KERNELS
    BaseDSL.build_module = build_module  # type: ignore[method-assign]
    CompileOptions.apply_envar_settings = apply_envar_settings  # type: ignore[method-assign]
    BaseDSL.compile_and_cache = compile_and_cache  # type: ignore[method-assign]
    compile_backend.CompilerBackend._resolve_compile_cache = resolve_compile_cache  # type: ignore[method-assign]
    CONFINEMENT.active = True
