"""What a CuTe kernel graded for the GPU may do in its host functions: build layouts and launch, not touch memory.

A `@cute.jit` host function is LLVM code run inside the candidate's process, below every Python-level layer: with
`cute.make_ptr(Int64, addr, AddressSpace.generic)` and a one-element tensor over it, it loads and stores at any
address, and `id()` gives the address of any Python object (the harness's clock included; red-team file
`rt_cute_host_jit_clock`). The host functions of every gold kernel only read shapes and layouts, build atoms and
launch (their ops, surveyed over all 40 gold files: `cute.get_*`, `cute.make_*`, `arith`, `scf`, `cuda.launch_*`).
So where the kernel is for the GPU (and in the free check), `confine` checks each module the DSL builds, before any
pass runs, and refuses a host function holding a CuTe op that reads or writes memory or makes a pointer from an
integer, an op of any other dialect than the few gold host code uses, or a declaration of an external function
(`host_problem`), through the audit event the child's hook records. Device code (inside `gpu.module`) is
the kernel's and reaches GPU memory only.
"""

from __future__ import annotations

from typing import Any

from metakernel.dsl.base import CLOCK_REGISTERS, refuse_native_code

#: Ops of other dialects a host function may hold (an allowlist: the gold kernels' host functions use these, and a
#: red-team file called libc's memcpy through a body-less `func.func` declaration and `func.call`).
ALLOWED_PREFIXES = ("arith.", "scf.", "math.", "index.", "cuda.launch", "cuda.cast", "cuda.return_if_error",
                    "func.return", "func.call")
#: Words that mark a CuTe op as an access to memory (element loads and stores, copies, atomics, pointer casts).
ACCESS_WORDS = ("memref.", "load", "store", "copy", "atomic", "inttoptr", "ptrtoint", "print_tensor", "prefetch")
#: Constructors whose names carry those words but only describe an access a kernel makes (gold host code has them).
CONSTRUCTORS = ("cute.make_", "cute_nvgpu.atom.make_")
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
    """Whether a host function may not hold an op of this name (`func.func` is judged by `host_problem`)."""
    if name.startswith(CONSTRUCTORS):
        return False
    if name.startswith(("cute.", "cute_nvgpu.")):
        return any(word in name for word in ACCESS_WORDS)
    return not name.startswith(ALLOWED_PREFIXES)


def host_problem(module: Any) -> str | None:
    """Why a module's host code may not be built for a GPU grading, or None."""
    for operation in _host_ops(module.operation):
        if operation.name == "func.func":
            if not operation.regions or not len(operation.regions[0].blocks):  # a declaration: code from elsewhere
                return ("host code declaring an external function: a GPU kernel's host function may not call into "
                        "the process")
            continue
        if forbidden(operation.name):
            return (f"host code with {operation.name}: a GPU kernel's host function may build layouts and launch, "
                    "not read or write memory (do that in the kernel)")
    return None


def _texts(operation: Any) -> list[str]:
    """An op's name and every attribute's text.

    A clock register hides in an inline asm's string, or in the intrinsic name of `llvm.call_intrinsic` (session
    22's red-teamer).
    """
    texts = [str(operation.name)]
    attributes = operation.attributes
    try:
        if isinstance(attributes, dict):
            texts += [str(v) for v in attributes.values()]
        else:
            texts += [str(named.attr) for named in attributes]
    except Exception:  # noqa: BLE001 - an attribute that cannot print: its op's name still counts
        pass
    return texts


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
    """Why a module's device code may not be built for a GPU grading (it reads a GPU clock), or None."""
    for operation in _device_ops(module.operation):
        if any(CLOCK_REGISTERS.search(text) for text in _texts(operation)):
            return (f"device code reading a GPU clock ({operation.name}): kernels may not time themselves or tell "
                    "calls apart")
    return None


def confine() -> None:
    """Check every module the DSL builds (idempotent)."""
    if CONFINEMENT.active:
        return
    from cutlass.base_dsl.dsl import BaseDSL

    original = BaseDSL.build_module

    def build_module(self: Any, module: Any, function_name: str) -> Any:
        problem = host_problem(module) or device_problem(module)
        if problem:
            refuse_native_code(problem)
        return original(self, module, function_name)

    BaseDSL.build_module = build_module  # type: ignore[method-assign]
    CONFINEMENT.active = True
