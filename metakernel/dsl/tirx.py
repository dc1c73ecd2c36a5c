"""The TIRx adapter: apache-tvm 0.27 (`tvm.script.tirx`, `tvm.compile(..., tir_pipeline="tirx")`).

How a TIRx kernel is launched from Python, and where the hooks sit
-----------------------------------------------------------------
`tvm.compile` (and `tvm.tirx.build`) return host code plus imported device modules; the kernel runs when a
*function object* taken from that module is called. Every Python route to such a function ends in one FFI call,
`tvm_ffi._ffi_api.ModuleGetFunction(module, name, query_imports)`:

- `exe(*args)` -> `Executable.__call__` -> `exe.jit().main` -> `Module.__getattr__` -> `Module.get_function`
- `exe["main"](*args)` -> `Executable.__getitem__` -> `Module.get_function(name, query_imports=True)`
- `mod.main(...)`, `mod["main"](...)`, `mod(...)`, `mod.get_function("main")(...)` on `exe.mod`, on the module of
  `tvm.tirx.build`, on `exe.jit()` and on `tvm.runtime.load_module(path)`; the same for a device module's own
  kernel functions (`exe.mod.imports[0]["x_kernel"]`).

`install_hooks` replaces that attribute with a version that returns a gated wrapper for every function that is
not TVM bookkeeping (`__tvm_*`, `_get_target_string`, ...). The wrapper asks `gate.should_launch(args)` on every call:
in mode "run" it calls the real function, otherwise it returns None without calling it (TIRx kernels write into
the buffers they are given and return nothing). `Module.time_evaluator` (which finds the function in C++) is
gated too. Compilation is untouched: `tvm.compile` has already lowered the kernel before anything can be called;
in mode "intercept" the CUDA source is additionally compiled offline (NVRTC or nvcc, when one is available) once per
module, so device-compiler errors surface in the dry run although nothing is launched.

Kernel names: the device symbols are read from the CUDA source of the module's imported device modules
(`extern "C" __global__ void ... name(`, or `.entry name` in PTX) and added to `gate.kernel_names` on every gated
call. TIRx emits them unmangled, so they equal the profiler's kernel names.

Launch configurations (the dry run's resource table): `tvm.tirx.build` (what `tvm.compile` calls) is wrapped too,
only to keep each lowered module's launch expressions (grid, block, dynamic shared memory) by CUDA source; an
intercepted call evaluates them on its arguments. See "launch configurations" below.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from metakernel.dsl import tirx_host
from metakernel.dsl.base import LaunchGate
from metakernel.dsl.resources import Launch, ResourceLog
from metakernel.paths import guides_dir

# docs/ is not package data: the guide is read from the checkout (or METAKERNEL_GUIDES_DIR).
DEFAULT_ARCH = "sm_90a"

# Functions TVM itself looks up by name (export, system-lib, RPC): never gated.
_INTERNAL_NAMES = frozenset({"_get_target_string", "get_func_names", "get_symbol", "get_const_vars"})

_KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")
_PTX_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)")
_NAMES_ATTR = "_metakernel_kernel_names"
_TIRX_KERNEL_NAME_RE = re.compile(r"^[A-Za-z_]\w*_kernel(?:_\d+)?$")


class _HookState:
    """Process-wide hook state: the patched originals and the gate the wrappers consult."""

    def __init__(self) -> None:
        self.gate: LaunchGate | None = None
        self.installed = False
        self.orig_get_function: Any = None
        self.orig_time_evaluator: Any = None
        self.device_checked: dict[str, BaseException | None] = {}
        self.resources = ResourceLog()  # cubins by source hash, for the dry run's resource table
        self.orig_build: Any = None
        self.orig_split: Any = None
        self.lowered: list[Any] = []  # the lowered IRModule of each build in progress (innermost last)
        self.launch_plans: dict[str, dict[str, list[_PlannedLaunch]]] = {}  # CUDA source hash -> host fn -> ...


_STATE = _HookState()


def _is_internal(name: str) -> bool:
    return name.startswith("__tvm") or name in _INTERNAL_NAMES or "." in name


def kernel_names_of(mod: Any) -> frozenset[str]:
    """Device-kernel symbols compiled into `mod`; empty for CPU (llvm) modules and binary-only device modules.

    Cached on the Python module object (module handles can be reused after a module is freed, so no global cache).
    """
    cache = getattr(mod, "__dict__", None)
    if cache is not None and _NAMES_ATTR in cache:
        return cache[_NAMES_ATTR]  # type: ignore[no-any-return]
    found: set[str] = set()
    for src in tirx_host.cuda_sources(mod):
        found.update(_KERNEL_RE.findall(src))
        found.update(_PTX_ENTRY_RE.findall(src))
    names = frozenset(found)
    if cache is not None:
        cache[_NAMES_ATTR] = names
    return names


def _device_compile_check(mod: Any, name: str = "", args: tuple[Any, ...] = ()) -> None:
    """In a dry run: compile the module's CUDA source offline once, so device-compiler errors are raised.

    Skipped when METAKERNEL_TIRX_DEVICE_COMPILE is "0" or TVM_CUDA_COMPILE_MODE names no usable compiler. The
    resource table gets the cubin and the launch that host function `name` would make with `args`.
    """
    if os.environ.get("METAKERNEL_TIRX_DEVICE_COMPILE", "1") == "0":
        return
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "")
    if mode not in ("nvrtc", "nvcc"):
        return
    arch = os.environ.get("METAKERNEL_TIRX_ARCH", DEFAULT_ARCH)
    for src in tirx_host.cuda_sources(mod):
        if "__global__" not in src:
            continue  # PTX or nothing to compile
        key = hashlib.sha256((mode + arch + src).encode()).hexdigest()
        if key not in _STATE.device_checked:
            err: BaseException | None = None
            try:
                import tvm
                from tvm.support import nvcc as tvm_nvcc

                with tvm.target.Target({"kind": "cuda", "arch": arch}):  # nvcc reads the arch from the scope
                    binary = tvm_nvcc.compile_cuda(src, target_format="cubin", compiler=mode)
                _STATE.resources.add(key, bytes(binary))
            except Exception as e:  # noqa: BLE001
                err = e
            _STATE.device_checked[key] = err
        _STATE.resources.use(key, _launches(src, name, args))
        cached = _STATE.device_checked[key]
        if cached is not None:
            text = str(cached).replace(src, f"[generated CUDA source, {src.count(chr(10)) + 1} lines, omitted]\n")
            raise RuntimeError(f"CUDA device compilation ({mode}, {arch}) failed:\n{text}") from None


class GatedFunction:
    """A TVM function whose every call first asks the current `LaunchGate` whether to really run it."""

    __slots__ = ("_func", "_module", "_name")

    def __init__(self, func: Any, module: Any, name: str) -> None:
        self._func = func
        self._module = module
        self._name = name

    def __call__(self, *args: Any) -> Any:
        """Count the launch; run it in mode "run", else return None (in "intercept", after a device compile)."""
        gate = _STATE.gate
        if gate is None:  # hooks never installed for this process: behave like the plain function
            return self._func(*args)
        names = kernel_names_of(self._module)
        gate.kernel_names.update(names)
        # A module without device symbols (the llvm target) is still one unit for the per-unit ablation; its host
        # functions are all called "main" when compiled alone, so the module's identity tells them apart.
        if gate.should_launch(args, names=names or (f"{self._name}@{id(self._module):x}",)):
            try:
                return self._func(*args)
            finally:
                gate.after_launch()
        if gate.mode == "intercept":
            _device_compile_check(self._module, self._name, args)
        return None

    def __getattr__(self, item: str) -> Any:
        return getattr(self._func, item)

    def __repr__(self) -> str:
        return f"GatedFunction({self._name!r})"


# --------------------------------------------------------------------------- launch configurations
# The grid, block and dynamic shared memory of a TIRx launch are expressions of the host function (`M`, a shape
# of an argument, in `ceildiv(M, 128)`), evaluated by its compiled code at each call: not in the cubin, not in the
# CUDA source. They are in the lowered IRModule, as the trailing arguments of each `call_ffi_kernel` (one per
# `launch_params` tag: blockIdx.*, threadIdx.*, tirx.use_dyn_shared_memory). So `tvm.tirx.build` is wrapped to
# keep them per CUDA source, with the variables of the function's parameters (a buffer's shape, a scalar) they
# may use; an intercepted call then binds those to its arguments and simplifies each expression to a number.


class _PlannedLaunch:
    """One `call_ffi_kernel` of a host function: the kernel, its launch expressions, and what binds them."""

    __slots__ = ("kernel", "tags", "exprs", "params", "lets")

    def __init__(self, kernel: str, tags: list[str], exprs: list[Any], params: list[tuple[Any, int, int | None]],
                 lets: list[tuple[Any, Any]]) -> None:
        self.kernel, self.tags, self.exprs, self.params, self.lets = kernel, tags, exprs, params, lets


def _ir_nodes(node: Any) -> Any:
    """Statements and calls under `node` (TIR has no Python visitor here: fields by ffi reflection), in order."""
    import tvm
    import tvm_ffi

    stack = [node]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (list, tuple, tvm_ffi.Array)):
            stack.extend(reversed(list(obj)))
            continue
        if not isinstance(obj, (tvm.tirx.Stmt, tvm.ir.Call)):
            continue
        yield obj
        fields: list[str] = []
        info = getattr(type(obj), "__tvm_ffi_type_info__", None)
        while info is not None:
            fields[:0] = [f.name for f in info.fields if f.name != "span"]
            info = info.parent_type_info
        stack.extend(reversed([getattr(obj, f, None) for f in fields]))


def _param_vars(func: Any) -> list[tuple[Any, int, int | None]]:
    """(variable, argument index, shape axis or None for a scalar) for the parameters of a TIRx PrimFunc."""
    import tvm

    out: list[tuple[Any, int, int | None]] = []
    for i, param in enumerate(func.params):  # every parameter is a Var: a buffer is one of BufferType
        if isinstance(param.ty, tvm.ir.PrimType):
            if "int" in str(param.ty.dtype):
                out.append((param, i, None))
        else:
            out.extend((d, i, j) for j, d in enumerate(param.shape)
                       if isinstance(d, tvm.tirx.Var) and isinstance(d.ty, tvm.ir.PrimType))
    return out


def _plan(source: Any, lowered: Any) -> dict[str, list[_PlannedLaunch]]:
    """Per host function of the lowered module: its kernel launches, bound to the source function's parameters."""
    import tvm

    sources = {source.attrs["global_symbol"] if source.attrs and "global_symbol" in source.attrs else "main":
               source} if isinstance(source, tvm.tirx.PrimFunc) else {
        gv.name_hint: f for gv, f in source.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    out: dict[str, list[_PlannedLaunch]] = {}
    for gv, func in lowered.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs and "tirx.is_global_func" in func.attrs):
            continue
        src = sources.get(gv.name_hint) or (next(iter(sources.values())) if len(sources) == 1 else None)
        params = _param_vars(src) if src is not None else []
        lets: list[tuple[Any, Any]] = []
        launches = []
        for node in _ir_nodes(func.body):
            if isinstance(node, (tvm.tirx.Bind, tvm.tirx.LetStmt)):
                lets.append((node.var, node.value))
            elif isinstance(node, tvm.ir.Call) and getattr(node.op, "name", "") == "tirx.call_ffi_kernel":
                tags = [str(t) for t in node.attrs.launch_params]
                exprs = list(node.args)[len(node.args) - len(tags):]
                launches.append(_PlannedLaunch(str(node.args[0].value), tags, exprs, params, list(lets)))
        if launches:
            out[gv.name_hint] = launches
    return out


def _evaluate(launch: _PlannedLaunch, args: tuple[Any, ...]) -> Launch:
    """The launch's numbers for these call arguments (None where an expression does not reduce to a constant)."""
    import tvm
    from tvm.sym import Analyzer

    analyzer = Analyzer()
    bound = []
    for var, i, axis in launch.params:
        try:
            value = int(args[i] if axis is None else args[i].shape[axis])
        except Exception:  # noqa: BLE001 - an argument of another kind: that variable stays unknown
            continue
        analyzer.bind(var, tvm.tirx.IntImm(str(var.ty.dtype), value))
        bound.append(var)
    for var, value in launch.lets:
        if not any(var.same_as(b) for b in bound):
            try:
                analyzer.bind(var, value)
            except Exception:  # noqa: BLE001
                pass
    values: dict[str, int] = {}
    for tag, expr in zip(launch.tags, launch.exprs, strict=True):
        try:
            out = analyzer.simplify(expr)
        except Exception:  # noqa: BLE001
            continue
        if isinstance(out, tvm.tirx.IntImm):
            values[tag] = int(out.value)
    tags = set(launch.tags)

    def dims(kind: str) -> tuple[int, int, int] | None:
        axes = [values.get(f"{kind}.{a}", None if f"{kind}.{a}" in tags else 1) for a in "xyz"]
        return None if None in axes else tuple(axes)  # type: ignore[return-value]

    dyn = "tirx.use_dyn_shared_memory"
    return Launch(dims("blockIdx"), dims("threadIdx"), values.get(dyn) if dyn in tags else 0)


def _launches(src: str, name: str, args: tuple[Any, ...]) -> dict[str, Launch]:
    """The launches host function `name` of the module compiled to CUDA `src` makes with `args` (kernel -> launch)."""
    plans = _STATE.launch_plans.get(hashlib.sha256(src.encode()).hexdigest(), {})
    plan = plans.get(name) or (next(iter(plans.values())) if len(plans) == 1 else [])
    out: dict[str, Launch] = {}
    for launch in plan:
        try:
            out[launch.kernel] = _evaluate(launch, args)
        except Exception:  # noqa: BLE001 - only the launch columns are lost
            pass
    return out


def _planning_build(mod: Any, *args: Any, **kwargs: Any) -> Any:
    """`tvm.tirx.build` that also files the lowered module's launch expressions under its CUDA source."""
    _STATE.lowered.append(None)
    try:
        built = tirx_host.checked_build(_STATE.orig_build, mod, *args, **kwargs)
        lowered = _STATE.lowered[-1]
    finally:
        _STATE.lowered.pop()
    if lowered is not None:
        try:
            plan = _plan(mod, lowered)
            for src in tirx_host.cuda_sources(built):
                _STATE.launch_plans[hashlib.sha256(src.encode()).hexdigest()] = plan
        except Exception:  # noqa: BLE001 - an unexpected IR only loses the launch columns, never the build
            pass
    return built


def _keeping_split(mod: Any) -> Any:
    """`split_host_device_mods`, the one point where the whole lowered module (host and device) passes."""
    if _STATE.lowered:
        _STATE.lowered[-1] = mod
    return _STATE.orig_split(mod)


def _gated_module_get_function(mod: Any, name: str, query_imports: bool) -> Any:
    func = _STATE.orig_get_function(mod, name, query_imports)
    if func is None or not isinstance(name, str) or _is_internal(name):
        return func
    return GatedFunction(func, mod, name)


def _gated_time_evaluator(self: Any, func_name: str, dev: Any, *args: Any, **kwargs: Any) -> Any:
    evaluator = _STATE.orig_time_evaluator(self, func_name, dev, *args, **kwargs)

    def gated_evaluator(*call_args: Any) -> Any:
        gate = _STATE.gate
        names = kernel_names_of(self)
        if gate is not None:
            gate.kernel_names.update(names)
        if gate is None or gate.should_launch(call_args, names=names):
            return evaluator(*call_args)
        from tvm.runtime.module import BenchmarkResult

        return BenchmarkResult([0.0])

    return gated_evaluator


# --------------------------------------------------------------------------- environment helpers
def _has_headers(root: str) -> tuple[bool, bool]:
    incs = [os.path.join(root, "include"), os.path.join(root, "targets", "x86_64-linux", "include")]
    runtime = any(os.path.isfile(os.path.join(i, "cuda_runtime.h")) for i in incs)
    cccl = any(
        os.path.isfile(os.path.join(i, "cccl", "cuda", "std", "cstdint"))
        or os.path.isfile(os.path.join(i, "cuda", "std", "cstdint"))
        for i in incs
    )
    return runtime, cccl


def find_cuda_root() -> str | None:
    """A CUDA toolkit root whose include/ has cuda_runtime.h and CCCL (what TVM's NVRTC path needs), or None.

    TVM guesses realpath(which nvcc)/../..; that is wrong when nvcc is a wrapper script, hence this search.
    """
    cands: list[str] = [os.environ[v] for v in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = os.path.realpath(nvcc)
        cands.append(os.path.dirname(os.path.dirname(real)))
        try:
            head = Path(real).read_bytes()[:4096]
            if head.startswith(b"#!"):  # a wrapper such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
                cands += [m.group(1).decode() for m in re.finditer(rb"(/[^\s\"']+)/bin/nvcc", head)]
        except OSError:
            pass
    cands += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    fallback = None
    seen: set[str] = set()
    for cand in cands:
        root = os.path.realpath(cand)
        if root in seen or not os.path.isdir(root):
            continue
        seen.add(root)
        runtime, cccl = _has_headers(root)
        if runtime and cccl:
            return root
        if runtime and fallback is None:
            fallback = root
    return fallback


def _nvidia_lib_dirs() -> list[str]:
    dirs = []
    for base in sys.path:
        dirs += glob.glob(os.path.join(base, "nvidia", "*", "lib"))
    return dirs


def _find_lib(pattern: str, cuda_root: str | None) -> str | None:
    dirs = _nvidia_lib_dirs()
    if cuda_root:
        dirs += [os.path.join(cuda_root, "lib64"), os.path.join(cuda_root, "lib")]
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, pattern)))
        if hits:
            return hits[0]
    return None


def _preload_cudart() -> None:
    """Put a libcudart.so.13 into the process before tvm loads its CUDA runtime (tvm skips it silently otherwise)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    if "libcudart.so" in maps:
        return
    lib = _find_lib("libcudart.so.13*", find_cuda_root())
    for cand in ([lib] if lib else []) + ["libcudart.so.13"]:
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


# --------------------------------------------------------------------------- error cleaning
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_FRAME_RE = re.compile(r'^\s*File "([^"]*)", line \d+')
# nvcc/NVRTC warning blocks: in CUDA headers (the fp8 ones) and in TVM's generated .cu (unused variables)
_HEADER_WARNING_RE = re.compile(r"^\S+\(\d+\): (?:warning|remark)\b", re.IGNORECASE)
_REMARK_RE = re.compile(r"^Remark: The warnings can be suppressed", re.IGNORECASE)
_TVM_LOG_RE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+: (Warning|Info|Debug): ")
_CHAIN_RE = re.compile(r"^(Traceback \(most recent call last\)|During handling of the above exception|"
                       r"The above exception was the direct cause)")
_IR_START_RE = re.compile(r"^(# from tvm\.script import|@I\.ir_module|@T\.prim_func|@Tx\.prim_func)")
_CARET_RE = re.compile(r"^\s*[\^~]+\s*$")


def _is_dsl_internal_path(path: str) -> bool:
    p = path.replace("\\", "/")
    return (
        "/site-packages/tvm/" in p
        or "/site-packages/tvm_ffi/" in p
        or "/dist-packages/tvm" in p
        or p.startswith(("python/tvm_ffi/", "/project/src/", "<frozen ", "<ast>"))
        or "/metakernel/dsl/" in p
    )


def _drop_header_warnings(lines: list[str]) -> list[str]:
    """Remove NVRTC/nvcc warning blocks (e.g. ~30 lines of cuda_fp8.hpp noise); errors stay."""
    out: list[str] = []
    skipping = False
    for line in lines:
        if _HEADER_WARNING_RE.match(line.strip()) or _REMARK_RE.match(line.strip()):
            skipping = True
            continue
        if skipping:
            # a warning block is the diagnostic line, the quoted source line, a caret line, then a blank line
            if line.strip() == "" or line.startswith((" ", "\t")) or _CARET_RE.match(line):
                continue
            skipping = False
        out.append(line)
    return out


def _drop_internal_frames(lines: list[str]) -> list[str]:
    """Collapse traceback frames inside tvm / tvm_ffi / importlib into one line per run; keep the user's frames."""
    out: list[str] = []
    dropped = 0
    i = 0
    while i < len(lines):
        m = _FRAME_RE.match(lines[i])
        if not m:
            if dropped:
                out.append(f"  [... {dropped} frame(s) inside tvm omitted ...]")
                dropped = 0
            out.append(lines[i])
            i += 1
            continue
        j = i + 1  # the frame's body: indented source and caret lines
        while j < len(lines) and lines[j].startswith("    ") and not _FRAME_RE.match(lines[j]):
            j += 1
        if _is_dsl_internal_path(m.group(1)):
            dropped += 1
        else:
            if dropped:
                out.append(f"  [... {dropped} frame(s) inside tvm omitted ...]")
                dropped = 0
            out.extend(lines[i:j])
        i = j
    if dropped:
        out.append(f"  [... {dropped} frame(s) inside tvm omitted ...]")
    return out


def _trim_ir_dumps(lines: list[str], keep: int = 6) -> list[str]:
    """Shorten TVMScript IR dumps printed inside "Error in pass" messages: first and last lines, underlines."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not _IR_START_RE.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        j = i
        while j < len(lines) and not _CHAIN_RE.match(lines[j]):
            j += 1
        region = [ln for ln in lines[i:j] if not _CARET_RE.match(ln)]
        while region and not region[-1].strip():
            region.pop()
        if len(region) <= 2 * keep + 4:
            out.extend(region)
        else:
            out.extend(region[:keep])
            out.append(f"    [... IR dump: {len(region) - 2 * keep} lines omitted ...]")
            out.extend(region[-keep:])
        if j < len(lines):
            out.append("")
        i = j
    return out


def _drop_cuda_source(text: str) -> str:
    """Drop the generated CUDA source that TVM puts before an nvcc failure; keep the compiler's messages."""
    marker = "\nCompilation error:\n"
    pos = text.find(marker)
    if pos < 0:
        return text
    head = text[:pos]
    start = max(head.rfind("\nRuntimeError: "), head.rfind("\nRuntimeError:"))
    src_from = start + len("\nRuntimeError: ") if start >= 0 else 0
    first_src = re.search(r'^(?:#|//|extern "C")', head[src_from:], re.M)  # keep message lines before the source
    if first_src:
        src_from += first_src.start()
    n_src = head[src_from:].count("\n") + 1
    if n_src < 10:
        return text
    return (head[:src_from] + f"[generated CUDA source, {n_src} lines, omitted]\nCompilation error:\n"
            + text[pos + len(marker):])


def clean_error_text(text: str, max_lines: int = 200) -> str:
    """Turn a TIRx error or traceback into what an agent needs: its file/line and the message, no noise."""
    text = _ANSI_RE.sub("", text).replace("\r\n", "\n")
    text = _drop_cuda_source(text)
    lines = text.split("\n")
    lines = _drop_header_warnings(lines)
    seen_logs: set[str] = set()
    kept = []
    for line in lines:  # TVM C++ log lines ("[hh:mm:ss] file.cc:80: Warning: ..."): keep each text once
        m = _TVM_LOG_RE.match(line)
        if m:
            msg = line[m.start(1):]
            if msg in seen_logs:
                continue
            seen_logs.add(msg)
            line = "TVM " + msg
        kept.append(line)
    lines = _drop_internal_frames(kept)
    lines = _trim_ir_dumps(lines)
    squeezed: list[str] = []
    for line in lines:
        if line.strip() == "" and squeezed and squeezed[-1].strip() == "":
            continue
        squeezed.append(line.rstrip())
    while squeezed and not squeezed[-1].strip():
        squeezed.pop()
    while squeezed and not squeezed[0].strip():
        squeezed.pop(0)
    if len(squeezed) > max_lines:
        head, tail = max_lines // 4, max_lines - max_lines // 4 - 1
        squeezed = squeezed[:head] + [f"[... {len(squeezed) - head - tail} lines omitted ...]"] + squeezed[-tail:]
    return "\n".join(squeezed)


# --------------------------------------------------------------------------- the adapter
class TirxAdapter:
    """TIRx in apache-tvm 0.27 behind `DslAdapter`."""

    key = "tirx"
    name = "TIRx"
    import_roots: tuple[str, ...] = ("tvm",)

    def environment(self, *, dry_run: bool) -> dict[str, str]:
        """Variables for the child process, set before it imports torch and tvm.

        CUDA_PATH: a toolkit root with headers + CCCL (NVRTC needs it; TVM's guess from `which nvcc` fails on a
        wrapper script). TVM_CUDA_COMPILE_MODE: nvrtc when libnvrtc is found, else nvcc. PATH gains the toolkit's
        bin/. libcudart is not an environment matter: `import_dsl` imports torch first and preloads it.
        In a dry run, METAKERNEL_TIRX_DEVICE_COMPILE=1 asks the hooks to compile intercepted kernels' CUDA source.
        """
        env: dict[str, str] = {}
        root = find_cuda_root()
        if root:
            env["CUDA_PATH"] = root
            bin_dir = os.path.join(root, "bin")
            path = os.environ.get("PATH", "")
            if os.path.isfile(os.path.join(bin_dir, "nvcc")) and bin_dir not in path.split(os.pathsep):
                env["PATH"] = bin_dir + (os.pathsep + path if path else "")
        nvcc_found = bool(shutil.which("nvcc")) or bool(root and os.path.isfile(os.path.join(root, "bin", "nvcc")))
        if os.environ.get("TVM_CUDA_COMPILE_MODE"):
            env["TVM_CUDA_COMPILE_MODE"] = os.environ["TVM_CUDA_COMPILE_MODE"]
        elif _find_lib("libnvrtc.so*", root) and root and all(_has_headers(root)):
            env["TVM_CUDA_COMPILE_MODE"] = "nvrtc"
        elif nvcc_found:
            env["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        # without torch's DLPack C exchange API, tvm-ffi would JIT-build a torch addon (slow, needs a C++ toolchain)
        try:
            import torch

            if not (hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
                    or hasattr(torch.Tensor, "__c_dlpack_exchange_api__")):
                env["TVM_FFI_DISABLE_TORCH_C_DLPACK"] = "1"
        except ImportError:
            pass
        env["METAKERNEL_TIRX_ARCH"] = os.environ.get("METAKERNEL_TIRX_ARCH", DEFAULT_ARCH)
        if dry_run:
            env["METAKERNEL_TIRX_DEVICE_COMPILE"] = "1" if env.get("TVM_CUDA_COMPILE_MODE") else "0"
        return env

    def import_dsl(self) -> None:
        """Import torch (and initialise CUDA when there is a GPU), preload libcudart, then tvm and TIRx script."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
        _preload_cudart()
        import tvm
        import tvm.script.tirx  # noqa: F401  (the parser: seconds)
        import tvm_ffi  # noqa: F401

        if torch.cuda.is_available() and not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
            raise RuntimeError(
                "tvm's CUDA runtime did not load although torch sees a GPU (libcudart.so.13 not loadable before "
                "tvm was imported?)"
            )

    def install_hooks(self, gate: LaunchGate) -> None:
        """Route every TVM module-function call through `gate` (idempotent; a new gate replaces the old one)."""
        _STATE.gate = gate
        if _STATE.installed:
            return
        import tvm.runtime.module as tvm_module
        from tvm_ffi import _ffi_api as ffi_api

        _STATE.orig_get_function = ffi_api.ModuleGetFunction
        ffi_api.ModuleGetFunction = _gated_module_get_function
        _STATE.orig_time_evaluator = tvm_module.Module.time_evaluator
        tvm_module.Module.time_evaluator = _gated_time_evaluator  # type: ignore[method-assign]
        import tvm.tirx

        build_module: Any = sys.modules["tvm.tirx.build"]  # the attribute `tvm.tirx.build` is the function
        _STATE.orig_build, _STATE.orig_split = tvm.tirx.build, build_module.split_host_device_mods
        tvm.tirx.build = _planning_build
        build_module.split_host_device_mods = _keeping_split
        _STATE.installed = True

    def confine(self) -> None:
        """LLVM builds only TVM's argument glue of checked sources (metakernel.dsl.tirx_host says why)."""
        tirx_host.confine()

    def clean_error(self, text: str) -> str:
        """Strip ANSI codes, CUDA-header warnings, tvm-internal frames, IR and CUDA source dumps."""
        return clean_error_text(text)

    def resources(self) -> list[dict[str, Any]]:
        """The dry run's resource rows: each kernel compiled for a launch intercepted since the last call.

        Registers, stack, shared memory, block size and occupancy (metakernel.dsl.resources), with each
        launch's grid, block and dynamic shared memory as far as the host side shows them on the CPU.
        """
        return _STATE.resources.take()

    def guide(self) -> str:
        """The agent-facing guide, docs/guides/tirx.md (METAKERNEL_GUIDES_DIR overrides the folder)."""
        return (guides_dir() / "tirx.md").read_text(encoding="utf-8")

    def is_dsl_kernel_name(self, name: str) -> bool:
        """Fallback for profiler attribution when `gate.kernel_names` is empty (binary-only modules).

        TIRx names a device kernel `<prim_func name>_kernel` (a `_N` suffix when a function has several), as
        extern "C", so it shows in a trace without namespace, template or argument list; torch's and library
        kernels show demangled C++ (`void at::native::...<...>(...)`) and do not match.
        """
        return bool(_TIRX_KERNEL_NAME_RE.match(name))


ADAPTER = TirxAdapter()
