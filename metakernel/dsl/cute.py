"""The CuTe DSL (nvidia-cutlass-dsl 4.8.1, Python package `cutlass`) behind `DslAdapter`.

Launch hooks. CuTe has no Python-level "launch one kernel" call to patch: a `@cute.jit` host function is compiled
(MLIR -> LLVM host code + a cubin) and the compiled host function itself calls the CUDA launch API from native code.
So the hooks gate the Python objects that *call* a compiled host function; one call = one gated launch (a host
function that launches several kernels counts once). Every route goes through one of these methods, all wrapped:

- `cute.compile(f, ...)` without options -> `CudaDialectJitCompiledFunction`: `__call__` (and the inherited
  `JitCompiledFunction.__call__` / `run_compiled_program`);
- `compiled.to(device)` -> `JitExecutor`: `__call__`, `run_compiled_program`;
- `cute.compile(f, ..., options="--enable-tvm-ffi")` (or `CUTE_DSL_ENABLE_TVM_FFI=1`) ->
  `TVMFFIJitCompiledFunction.__call__` / `TVMFFIJitCompiledFunctionWithKwargs.__call__` (+ `run_compiled_program`);
- calling a `@cute.jit` function directly: it compiles (or hits the in-memory cache) and then calls the
  compiled object's `run_compiled_program(exe_args)`;
- the alternative `cutlass.compiler` backend -> `CutlassCallJitCompiledFunction.__call__` / `run_compiled_program`.

These methods call one another (`run_compiled_program` -> `to()` -> executor, the kwargs wrapper -> the FFI
function), so a thread-local depth counter makes only the outermost one count and decide. Compilation always
happens before the gate is consulted (in `cute.compile`, or inside the direct call before `run_compiled_program`),
so a suppressed or intercepted call still compiles and still raises compile errors. What the hooks cannot see: a
candidate that digs out the raw `tvm_ffi.Function` behind a compiled object and calls that. Such launches are not
counted, which can only make the candidate fail the launch-count or ablation checks, never pass them.

Kernel names. Each compiled object carries `kernel_info`, an ordered dict keyed by the `__global__` symbols of
its cubin (`kernel_cutlass_<kernel>_<arg-signature>_<n>`, C linkage, identical to the PTX `.entry` names and so to
the names CUPTI / the torch profiler report). The hooks copy those keys into `gate.kernel_names` on every gated
call. A `JitExecutor` from `.to()` does not carry them, so `to()` is wrapped to tag the executor.

CPU dry run. With `CUTE_DSL_ARCH=sm_90a` CuTe compiles real sm_90a code without a GPU. When CUDA is unavailable,
`install_hooks` also installs small shims so that a `solve` written for the GPU runs unchanged on CPU tensors up
to the (intercepted) launch: `from_dlpack` of a CPU torch tensor describes it as a CUDA tensor (so it is typed as
global memory, as it will be on the GPU, and the TVM-FFI environment stream is found), and `torch.cuda`'s
stream, synchronize and device-property queries answer as an idle H200 would. See docs/guides/cute.md.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import sys
import threading
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from metakernel.dsl import cute_host
from metakernel.dsl.base import LaunchGate, refuse_native_code
from metakernel.dsl.resources import Launch, ResourceLog
from metakernel.paths import guides_dir

ARCH = "sm_90a"



# ------------------------------------------------------------------------------------------------ hook state
class _State:
    """Module-wide hook state: the hooks are installed once per process and consult the latest gate."""

    def __init__(self) -> None:
        self.gate: LaunchGate | None = None
        self.patched: list[tuple[type, str, Any]] = []  # (class, attribute, original) for uninstall in tests
        self.shims: list[tuple[Any, str, Any]] = []
        self.installed = False
        self.cpu_shims = False
        self.resources = ResourceLog()  # cubins by hash, for the dry run's resource table


_STATE = _State()
_TLS = threading.local()
_MARK = "__metakernel_gated__"

# CuTe's diagnostics point an error at the nearest stack frame whose module `__name__` is outside `cutlass`. The
# hook wrappers sit between the candidate's call and the DSL, so they run with globals named as a `cutlass`
# submodule: an error raised through them still points at the candidate's own line, not at this file.
_DSL_INTERNAL_NAME = "cutlass._metakernel_launch_gate"
_INTERNAL_GLOBALS: dict[str, Any] = {}


def _dsl_internal(func: Any) -> Any:
    """`func` re-bound to globals that CuTe's frame walk classifies as DSL-internal (same code, same names)."""
    _INTERNAL_GLOBALS.update(globals())
    _INTERNAL_GLOBALS["__name__"] = _DSL_INTERNAL_NAME
    clone = types.FunctionType(func.__code__, _INTERNAL_GLOBALS, func.__name__, func.__defaults__,
                               func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__doc__ = func.__doc__
    return clone


def _kernel_names(obj: Any) -> tuple[str, ...]:
    names = getattr(obj, "_metakernel_kernel_names", None)
    if names is not None:
        return names
    try:
        info = obj.kernel_info
    except Exception:  # noqa: BLE001 - a compiled object without metadata: nothing to attribute
        return ()
    names = tuple(info) if info else ()
    if cute_host.CONFINEMENT.active:  # only kernels a checked build defined: `kernel_info` is the candidate's dict
        forged = [n for n in names if n not in cute_host.BUILT_KERNELS]
        if forged:
            refuse_native_code(f"a compiled object naming kernel {forged[0][:100]!r}, which no build of this file "
                               "defined (kernel_info is the DSL's record, not the kernel's to write)")
    try:  # cache on the compiled object: the hot path is then one attribute lookup
        obj._metakernel_kernel_names = names
    except Exception:  # noqa: BLE001 - objects without a __dict__ recompute it each call
        pass
    return names


def _gated(original: Callable[..., Any], skipped: Any, validate: Callable[..., None] | None = None,
           opaque: bool = False) -> Any:
    """Wrap a method that calls a compiled host function so the outermost call consults the gate.

    `opaque`: the method receives the DSL's packed arguments (a list of addresses), not the caller's; reached
    outermost (a @cute.jit function called directly), the gate cannot read the launch (`LaunchGate.should_launch`).
    """

    @functools.wraps(original)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_TLS, "depth", 0)
        gate = _STATE.gate
        if depth or gate is None:
            return original(self, *args, **kwargs)
        names = _kernel_names(self)
        if names:
            gate.kernel_names.update(names)
        if not gate.should_launch(args, kwargs, names or (), opaque=opaque):
            if gate.mode == "intercept":
                _note_cubin(self)
                if validate is not None:
                    validate(self, args, kwargs)
            return skipped
        _TLS.depth = depth + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _TLS.depth = depth
            gate.after_launch()

    setattr(gated, _MARK, original)
    return gated


def _note_cubin(obj: Any) -> None:
    """Remember the cubin a dry run's intercepted function was built into.

    CUTE_DSL_KEEP=cubin keeps it: the bytes themselves on the TVM-FFI route, a file path on others.
    """
    compiled = getattr(obj, "_compiled", obj)
    cubin = getattr(getattr(compiled, "artifacts", None), "CUBIN", None)
    if isinstance(cubin, str) and os.path.isfile(cubin):
        with open(cubin, "rb") as f:
            cubin = f.read()
    if isinstance(cubin, (bytes, bytearray)):
        key = hashlib.sha256(cubin).hexdigest()
        _STATE.resources.add(key, bytes(cubin))
        _STATE.resources.use(key, _launches(compiled))


#: `cudaLaunchConfig_t` (gridDim, blockDim, dynamicSmemBytes, stream, attrs, numAttrs) in CuTe's lowered host code.
_LAUNCH_CONFIG = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
_LAUNCH_CALLS = ("@_cudaLaunchKernelEx", "@_cudaLaunchKernel")


def _launches(compiled: Any) -> dict[str, Launch]:
    """Each kernel's grid, block and dynamic shared memory as the compiled host function launches it.

    CuTe folds them into constants while lowering the host function (the SmemAllocator total only exists after
    its `InferKernelSmemUsagePass`), so the final host IR that the compiled object keeps (`ir_module`) is where
    they can be read without running it. A value the host computes at run time (a grid from a dynamic shape) stays
    None. Cached on the compiled object; any surprise in the IR only loses the launch columns.
    """
    cached = getattr(compiled, "_metakernel_launches", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    try:
        found = _launches_from_host_ir(compiled.ir_module, _kernel_names(compiled))
    except Exception:  # noqa: BLE001 - no IR kept, another lowering: the table keeps the cubin's columns
        found = {}
    try:
        compiled._metakernel_launches = found
    except Exception:  # noqa: BLE001
        pass
    return found


def _launches_from_host_ir(module: Any, names: tuple[str, ...]) -> dict[str, Launch]:
    from cutlass._mlir import ir as mlir_ir

    ir: Any = mlir_ir  # the bindings are untyped

    stores: list[Any] = []
    calls: list[Any] = []

    def visit(op: Any) -> Any:
        if op.name == "llvm.store":
            stores.append(op)
        elif op.name == "llvm.call" and "callee" in op.attributes \
                and str(op.attributes["callee"]) in _LAUNCH_CALLS:
            calls.append(op)
        return ir.WalkResult.ADVANCE

    def owner(value: Any) -> Any:
        op = value.owner
        return getattr(op, "operation", op) if hasattr(op, "name") else None  # a block argument has no op

    def constant(value: Any) -> int | None:
        op = owner(value)
        if op is None or op.name != "llvm.mlir.constant":
            return None
        return int(ir.IntegerAttr(op.attributes["value"]).value)

    def indices(gep: Any) -> list[int] | None:  # constant GEP indices, None with a dynamic one
        if len(gep.operands) != 1:
            return None
        return [int(i) for i in ir.DenseI32ArrayAttr(gep.attributes["rawConstantIndices"])]

    def is_config(op: Any) -> bool:
        return op is not None and op.name == "llvm.alloca" and str(op.attributes["elem_type"]) == _LAUNCH_CONFIG

    def same_place(a: Any, b: Any) -> bool:  # two pointers to one slot: the same value or equal constant GEPs
        if a == b:
            return True
        ga, gb = owner(a), owner(b)
        return (ga is not None and gb is not None and ga.name == gb.name == "llvm.getelementptr"
                and ga.operands[0] == gb.operands[0] and indices(ga) is not None and indices(ga) == indices(gb))

    def config_of(value: Any) -> Any:  # the launch config alloca a call's pointer is (or was stored as)
        op = owner(value)
        if is_config(op):
            return op
        if op is not None and op.name == "llvm.load":
            for st in stores:
                if same_place(st.operands[1], op.operands[0]) and is_config(owner(st.operands[0])):
                    return owner(st.operands[0])
        return None

    def kernel_of(value: Any) -> str | None:  # the kernel a function-pointer global (`@kernels_<symbol>`) holds
        op = owner(value)
        if op is not None and op.name == "llvm.load":
            op = owner(op.operands[0])
        if op is None or op.name != "llvm.mlir.addressof":
            return None
        symbol = str(op.attributes["global_name"]).lstrip("@")
        return next((n for n in names if symbol == n or symbol.endswith("_" + n)), None)

    with module.context:
        module.operation.walk(visit)
    out: dict[str, Launch] = {}
    for call in calls:
        name = kernel_of(call.operands[0] if str(call.attributes["callee"]) == "@_cudaLaunchKernel"
                         else call.operands[1])
        if name is None:
            continue
        if str(call.attributes["callee"]) == "@_cudaLaunchKernel":  # (func, grid xyz, block xyz, args, smem, ...)
            dims = [constant(call.operands[i]) for i in range(1, 7)]
            smem = constant(call.operands[8])
        else:
            config = config_of(call.operands[0])
            if config is None:
                continue
            dims, smem = [None] * 6, None
            for st in stores:
                gep = owner(st.operands[1])
                if gep is None or gep.name != "llvm.getelementptr" or owner(gep.operands[0]) != config:
                    continue
                at = indices(gep)
                if at is not None and len(at) == 3 and at[:2] in ([0, 0], [0, 1]) and 0 <= at[2] < 3:
                    dims[3 * at[1] + at[2]] = constant(st.operands[0])
                elif at == [0, 2]:
                    smem = constant(st.operands[0])
        grid, block = dims[:3], dims[3:]
        launch = Launch(tuple(grid) if None not in grid else None,  # type: ignore[arg-type]
                        tuple(block) if None not in block else None,  # type: ignore[arg-type]
                        smem)
        if out.get(name, launch) != launch:  # launched twice, differently: only what both launches agree on
            old = out[name]
            launch = Launch(old.grid if old.grid == launch.grid else None,
                            old.block if old.block == launch.block else None,
                            old.dynamic_smem if old.dynamic_smem == launch.dynamic_smem else None)
        out[name] = launch
    return out


def _validate_execution_args(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Intercept mode, non-FFI route: marshal the call's arguments as a real call would.

    Catches wrong arity, wrong argument types and bad kwargs without touching the GPU.
    """
    execution_args = getattr(obj, "execution_args", None)
    if execution_args is None:
        jit_module = getattr(obj, "jit_module", None)
        execution_args = getattr(jit_module, "execution_args", None)
    if execution_args is not None:
        execution_args.generate_execution_args(args, kwargs)


class _DryRunExecutor:
    """What `compiled.to(device)` returns on a machine without CUDA.

    Loading the cubin would need a driver, so calls go back to the compiled object, whose own (gated) `__call__`
    counts and intercepts them.
    """

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled
        self._metakernel_kernel_names = _kernel_names(compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


def _tag_executor(original: Callable[..., Any]) -> Any:
    """Wrap `JitCompiledFunction.to` so the executor it returns knows its kernels' names.

    Without CUDA and outside mode "run" it returns a `_DryRunExecutor` instead of loading the module (which would
    need a driver); in mode "run" the real loader runs and fails as it would anyway on a machine without a GPU.
    """

    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate = _STATE.gate
        if _STATE.cpu_shims and gate is not None and gate.mode != "run":
            return _DryRunExecutor(self)
        executor = original(self, *args, **kwargs)
        if executor is not self:
            try:
                executor._metakernel_kernel_names = _kernel_names(self)
            except Exception:  # noqa: BLE001 - a read-only executor only loses attribution, not gating
                pass
        return executor

    setattr(to, _MARK, original)
    return to


def _patch(cls: type, name: str, make: Callable[[Any], Any]) -> None:
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, None) is not None:
        return
    setattr(cls, name, make(original))
    _STATE.patched.append((cls, name, original))


def _install_launch_hooks() -> None:
    from cutlass.base_dsl.jit_executor import JitCompiledFunction, JitExecutor
    from cutlass.cutlass_dsl.cuda_jit_executor import CudaDialectJitCompiledFunction

    gated, tag = _dsl_internal(_gated), _dsl_internal(_tag_executor)
    validate = _dsl_internal(_validate_execution_args)
    if getattr(_DryRunExecutor.__call__, "__globals__", {}).get("__name__") != _DSL_INTERNAL_NAME:
        _DryRunExecutor.__call__ = _dsl_internal(_DryRunExecutor.__call__)  # type: ignore[method-assign]
    _patch(JitExecutor, "__call__", lambda f: gated(f, 0, validate))
    _patch(JitExecutor, "run_compiled_program", lambda f: gated(f, 0, opaque=True))
    _patch(JitCompiledFunction, "__call__", lambda f: gated(f, 0, validate))
    _patch(JitCompiledFunction, "run_compiled_program", lambda f: gated(f, 0, opaque=True))
    _patch(JitCompiledFunction, "to", tag)
    _patch(CudaDialectJitCompiledFunction, "__call__", lambda f: gated(f, 0, validate))
    _patch(CudaDialectJitCompiledFunction, "to", tag)
    try:
        from cutlass.cutlass_dsl.tvm_ffi_provider import (
            TVMFFIJitCompiledFunction,
            TVMFFIJitCompiledFunctionBase,
            TVMFFIJitCompiledFunctionWithKwargs,
        )
    except ImportError:  # apache-tvm-ffi missing: the FFI route cannot be compiled either
        pass
    else:
        # The FFI function validates its arguments in native code right before launching: nothing to validate
        # separately, so an intercepted FFI call checks nothing beyond compilation.
        _patch(TVMFFIJitCompiledFunctionBase, "run_compiled_program", lambda f: gated(f, None, opaque=True))
        _patch(TVMFFIJitCompiledFunction, "__call__", lambda f: gated(f, None))
        _patch(TVMFFIJitCompiledFunctionWithKwargs, "__call__", lambda f: gated(f, None))
    try:
        from cutlass.cutlass_dsl.cutlass_function import CutlassCallJitCompiledFunction
    except ImportError:
        pass
    else:
        _patch(CutlassCallJitCompiledFunction, "__call__", lambda f: gated(f, None))
        _patch(CutlassCallJitCompiledFunction, "run_compiled_program", lambda f: gated(f, None, opaque=True))


def _uninstall_for_tests() -> None:
    """Undo every patch (tests only: the grader never uninstalls)."""
    for cls, name, original in reversed(_STATE.patched):
        setattr(cls, name, original)
    for owner, name, original in reversed(_STATE.shims):
        setattr(owner, name, original)
    _STATE.patched.clear()
    _STATE.shims.clear()
    _STATE.installed = _STATE.cpu_shims = False
    _STATE.gate = None


# ------------------------------------------------------------------------------------------------ CPU shims
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


_KDL_CPU, _KDL_CUDA = 1, 2
_DLTENSOR_DEVICE_OFFSET = ctypes.sizeof(ctypes.c_void_p)  # DLManagedTensor starts with DLTensor{void* data; DLDevice}


class _CudaLookingTensor:
    """A DLPack producer that hands out a CPU torch tensor's capsule with its device rewritten to cuda:0.

    Used only on a machine without CUDA, only for compilation: the data pointer stays a host pointer and no kernel
    is ever launched on it (the launch is intercepted).
    """

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        capsule = self._tensor.__dlpack__()  # legacy unversioned "dltensor" capsule
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        name = get_name(capsule)
        if name != b"dltensor":
            return capsule
        device = _DLDevice.from_address(get_pointer(capsule, name) + _DLTENSOR_DEVICE_OFFSET)
        if device.device_type == _KDL_CPU:
            device.device_type, device.device_id = _KDL_CUDA, 0
        return capsule


class _FakeTorchStream:
    """What `torch.cuda.current_stream()` returns during a CPU dry run: the legacy default stream, handle 0."""

    cuda_stream = 0
    stream_id = 0
    device_index = 0
    device_type = 1

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", 0)

    def synchronize(self) -> None:
        """Nothing to wait for: nothing runs."""

    def wait_stream(self, stream: Any) -> None:
        """Nothing to order."""

    def wait_event(self, event: Any) -> None:
        """Nothing to order."""

    def query(self) -> bool:
        """Always idle."""
        return True

    def __repr__(self) -> str:
        return "<metakernel dry-run stream 0>"


_H200 = SimpleNamespace(name="NVIDIA H200 (dry-run stand-in)", major=9, minor=0, multi_processor_count=132,
                        total_memory=150_000_000_000, L2_cache_size=50 * 1024 * 1024, warp_size=32,
                        max_threads_per_multi_processor=2048, max_threads_per_block=1024,
                        shared_memory_per_block=48 * 1024, shared_memory_per_block_optin=227 * 1024,
                        shared_memory_per_multiprocessor=228 * 1024, regs_per_multiprocessor=65536,
                        is_integrated=False, is_multi_gpu_board=False, gcnArchName="", uuid="dry-run")


def _make_tensor_init(original_init: Callable[..., Any], torch_tensor: Any) -> Any:
    """`cute.runtime._Tensor.__init__` that presents CPU torch tensors as CUDA tensors (dry run only)."""

    @functools.wraps(original_init)
    def init(self: Any, tensor: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(tensor, torch_tensor) and tensor.device.type == "cpu":
            tensor = _CudaLookingTensor(tensor)
        original_init(self, tensor, *args, **kwargs)

    setattr(init, _MARK, original_init)
    return init


def _install_cpu_shims() -> None:
    import torch
    from cutlass.cute import runtime as cute_runtime

    tensor_cls = cute_runtime._Tensor
    original_init = tensor_cls.__dict__["__init__"]
    if getattr(original_init, _MARK, None) is None:
        tensor_cls.__init__ = _dsl_internal(_make_tensor_init)(original_init, torch.Tensor)  # type: ignore[method-assign]
        _STATE.shims.append((tensor_cls, "__init__", original_init))

    stream = _FakeTorchStream()
    replacements: dict[str, Callable[..., Any]] = {
        "current_stream": lambda device=None: stream,
        "default_stream": lambda device=None: stream,
        "synchronize": lambda device=None: None,
        "current_device": lambda: 0,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": lambda device=None: _H200,
        "get_device_name": lambda device=None: _H200.name,
    }
    for name, fake in replacements.items():
        original = getattr(torch.cuda, name, None)
        if getattr(original, _MARK, None) is not None:
            continue
        setattr(fake, _MARK, original)
        setattr(torch.cuda, name, fake)
        _STATE.shims.append((torch.cuda, name, original))


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no usable torch CUDA: treat as a CPU machine
        return False


# ------------------------------------------------------------------------------------------------ error text
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_NVRTC_WARNING = re.compile(r"^\s*\S*\.(?:h|hpp|cuh|inl)\(\d+\): (?:warning|remark)\b", re.IGNORECASE)
_NVRTC_DETAIL = re.compile(r"^\s*(Remark: The warnings can be suppressed|detected during|\^|\s*$)")
_MLIR_LINE = re.compile(
    r"^\s*(%[\w#.]+(:\d+)?\s*=|\^bb\d+|func\.func|gpu\.(module|func|launch|return)|llvm\.|module\b.*\{|"
    r"\"[\w.]+\"\(|cute\.|cuda\.|scf\.|arith\.|builtin\.|nvvm\.|memref\.|}\s*(loc\(|$)|#loc\d*\s*=|"
    r"loc\(|\w+\.\w+\s+%|return\b\s*%|!\w+\.)")
_DSL_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_DSL_PATH = re.compile(r"(/cutlass/|/nvidia_cutlass_dsl/|/tvm_ffi/|/metakernel/dsl/|/metakernel/grader/|"
                       r"<frozen importlib|/importlib/)")
_KEEP_HEAD, _KEEP_TAIL, _RUN = 3, 2, 8
_MAX_LINE = 600  # one-line IR dumps ("see current operation: ...") can run to many kilobytes


def _drop_nvrtc_warnings(lines: list[str]) -> list[str]:
    out: list[str] = []
    dropped = 0
    skipping = False
    for line in lines:
        if _NVRTC_WARNING.search(line):
            skipping = True
            dropped += 1
            continue
        if skipping and (_NVRTC_DETAIL.match(line) or line.startswith(" ")):
            dropped += 1
            continue
        skipping = False
        out.append(line)
    if dropped:
        out.insert(0, f"[{dropped} lines of NVRTC header warnings removed]")
    return out


def _collapse_mlir(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and (_MLIR_LINE.match(lines[j]) or (j > i and lines[j].strip() == "")):
            j += 1
        if j - i >= _RUN:
            out.extend(lines[i:i + _KEEP_HEAD])
            out.append(f"    ... [{j - i - _KEEP_HEAD - _KEEP_TAIL} lines of MLIR/IR removed] ...")
            out.extend(lines[j - _KEEP_TAIL:j])
            i = j
        else:
            out.append(lines[i])
            i += 1
    return out


def _trim_traceback_frames(lines: list[str]) -> list[str]:
    """Drop traceback frames inside the DSL / harness; keep the candidate's own frames and the messages."""
    out: list[str] = []
    hidden = 0
    i = 0
    while i < len(lines):
        match = _DSL_FRAME.match(lines[i])
        if match and _DSL_PATH.search(match.group(1)):
            i += 1
            while i < len(lines) and lines[i].startswith("    ") and not _DSL_FRAME.match(lines[i]):
                i += 1  # the frame's source line and caret markers
            hidden += 1
            continue
        if hidden and not match:
            out.append(f"  [{hidden} frames inside the DSL/harness hidden]")
            hidden = 0
        elif hidden and match:
            out.append(f"  [{hidden} frames inside the DSL/harness hidden]")
            hidden = 0
        out.append(lines[i])
        i += 1
    if hidden:
        out.append(f"  [{hidden} frames inside the DSL/harness hidden]")
    return out


def clean_error_text(text: str, *, max_lines: int = 120) -> str:
    """Error text as an agent should see it (see `CuteAdapter.clean_error`)."""
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    lines = [line if len(line) <= _MAX_LINE else
             f"{line[:_MAX_LINE - 200]} ... [{len(line) - _MAX_LINE + 100} characters removed] ... {line[-100:]}"
             for line in lines]
    lines = _drop_nvrtc_warnings(lines)
    lines = _trim_traceback_frames(lines)
    lines = _collapse_mlir(lines)
    compact: list[str] = []
    for line in lines:  # collapse runs of blank lines
        if line.strip() or (compact and compact[-1].strip()):
            compact.append(line)
    while compact and not compact[-1].strip():
        compact.pop()
    if len(compact) > max_lines:
        head = max_lines // 3
        tail = max_lines - head - 1
        compact = compact[:head] + [f"... [{len(compact) - head - tail} lines removed] ..."] + compact[-tail:]
    return "\n".join(compact)


# ------------------------------------------------------------------------------------------------ the adapter
class CuteAdapter:
    """NVIDIA CuTe DSL (Python) as the grader sees it."""

    key = "cute"
    name = "CuTe DSL"
    import_roots: tuple[str, ...] = ("cutlass",)

    def environment(self, *, dry_run: bool) -> dict[str, str]:
        """`CUTE_DSL_ARCH` pins the target: without it a GPU-less compile silently targets sm_100a.

        Nothing else is needed on either machine: the wheel carries its own compiler and CUDA runtime pieces, the
        TVM-FFI route needs only the installed `apache-tvm-ffi`, and the CPU dry-run shims are switched on by the
        absence of CUDA, not by the environment. A dry run also keeps each compiled kernel's cubin
        (`CUTE_DSL_KEEP=cubin`, into a temp folder of the child's) for the check's resource table. CuTe's file
        cache is off: a module loaded from it would skip the checks of its build and of its PTX (`cute_host`).
        """
        env = {"CUTE_DSL_ARCH": ARCH, "CUTE_DSL_DISABLE_FILE_CACHING": "1"}  # compiled only from checked modules
        if dry_run:
            env["CUTE_DSL_KEEP"] = "cubin"  # the check's resource table reads each kernel's cubin
        return env

    def import_dsl(self) -> None:
        """Import `cutlass.cute` and the executor modules the hooks patch (~2-4 s cold)."""
        for key, value in self.environment(dry_run=False).items():
            os.environ.setdefault(key, value)
        if os.environ.get("CUTE_DSL_KEEP") and not os.environ.get("CUTE_DSL_DUMP_DIR"):
            import tempfile

            os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="cute-cubins-")  # default: the cwd
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
        import cutlass.cute.runtime  # noqa: F401
        from cutlass.base_dsl import jit_executor  # noqa: F401

        try:
            from cutlass.cutlass_dsl import tvm_ffi_provider  # noqa: F401
        except ImportError:
            pass

    def install_hooks(self, gate: LaunchGate) -> None:
        """Gate every compiled-host-function call (see the module docstring); idempotent.

        A second call only swaps the gate the hooks consult. On a machine without CUDA it also installs the
        dry-run shims (CPU tensors look like CUDA tensors to `from_dlpack`; `torch.cuda` stream/sync/property
        queries answer as an H200 would), so the candidate's GPU-shaped `solve` reaches its intercepted launches.
        """
        _STATE.gate = gate
        if not _STATE.installed:
            self.import_dsl()
            _install_launch_hooks()
            _STATE.installed = True
        if not _STATE.cpu_shims and not _cuda_available():
            _install_cpu_shims()
            _STATE.cpu_shims = True

    def confine(self) -> None:
        """Host functions may build layouts and launch, not touch memory (metakernel.dsl.cute_host says why)."""
        cute_host.confine()

    def clean_error(self, text: str) -> str:
        """Strip ANSI colours, NVRTC header warnings, DSL-internal traceback frames and long MLIR dumps.

        Kept: the candidate's own frames (file and line), CuTe's own `--> file:line:col` pointer with its code
        frame, and the error message, notes and suggestions.
        """
        return clean_error_text(text)

    def resources(self) -> list[dict[str, Any]]:
        """The dry run's resource rows: each kernel compiled for a launch intercepted since the last call.

        Registers, stack, shared memory, block size and occupancy (metakernel.dsl.resources), with each
        launch's grid, block and dynamic shared memory as far as the host side shows them on the CPU.
        """
        return _STATE.resources.take()

    def guide(self) -> str:
        """The agent-facing guide, docs/guides/cute.md (shipped in wheels as package data)."""
        return (guides_dir() / "cute.md").read_text(encoding="utf-8")

    def is_compile_error(self, exc: BaseException) -> bool:
        """CuTe compiles on the first call of solve: its DSL errors then are compile errors, not runtime ones."""
        try:
            from cutlass.base_dsl.common import DSLBaseError, DSLCudaRuntimeError
        except ImportError:
            return False
        return isinstance(exc, DSLBaseError) and not isinstance(exc, DSLCudaRuntimeError)


ADAPTER = CuteAdapter()


# ------------------------------------------------------------------------------------------------ dry-run CLI
def dry_run(kernel: str | os.PathLike[str], problem: str | os.PathLike[str], *, scale: str = "small",
            mode: str = "intercept", calls: int = 2) -> dict[str, Any]:
    """Import `kernel` from disk under an intercepting gate and call `solve` on `problem`'s CPU inputs.

    Run it in a fresh process (`python -m metakernel.dsl.cute KERNEL PROBLEM`): hooks and shims are per process.
    Returns what a grader's dry run would look at; compile errors propagate as exceptions.
    """
    import importlib.util
    import time

    import torch

    gate = LaunchGate(mode=mode)
    started = time.perf_counter()
    ADAPTER.install_hooks(gate)
    import_s = time.perf_counter() - started

    def load(path: str | os.PathLike[str], name: str) -> Any:
        spec = importlib.util.spec_from_file_location(name, str(path))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    prob = load(problem, "dry_run_problem")
    started = time.perf_counter()
    cand = load(kernel, "candidate_kernel")
    load_s = time.perf_counter() - started
    torch.manual_seed(0)
    inputs = prob.make_inputs(device="cpu", scale=scale)
    expected = prob.reference(*inputs)
    per_call: list[float] = []
    launches: list[int] = []
    out: Any = None
    for _ in range(calls):
        gate.reset()
        started = time.perf_counter()
        with torch.no_grad():
            out = cand.solve(*inputs)
        per_call.append(time.perf_counter() - started)
        launches.append(gate.launches)

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {"shape": list(value.shape), "dtype": str(value.dtype), "device": value.device.type}
        if isinstance(value, (list, tuple)):
            return [describe(v) for v in value]
        return type(value).__name__

    return {"dsl_import_s": import_s, "kernel_import_s": load_s, "call_s": per_call, "launches": launches,
            "suppressed": gate.suppressed, "kernel_names": sorted(gate.kernel_names), "outputs": describe(out),
            "expected": describe(expected)}


def _main(argv: list[str]) -> int:
    import argparse
    import json
    import traceback

    parser = argparse.ArgumentParser(prog="python -m metakernel.dsl.cute",
                                     description="CPU dry run of a CuTe kernel.py against a problem file")
    parser.add_argument("kernel")
    parser.add_argument("problem")
    parser.add_argument("--scale", default="small")
    parser.add_argument("--mode", default="intercept", choices=["intercept", "suppress"])
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args(argv)
    for key, value in ADAPTER.environment(dry_run=True).items():
        os.environ.setdefault(key, value)
    try:
        result = {"ok": True, **dry_run(args.kernel, args.problem, scale=args.scale, mode=args.mode,
                                        calls=args.calls)}
    except BaseException as exc:  # noqa: BLE001 - reported as the dry run's verdict
        raw = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        result = {"ok": False, "error_type": type(exc).__name__, "error": ADAPTER.clean_error(raw)}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
