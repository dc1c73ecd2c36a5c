"""The candidate's process: enters the sandbox, imports the DSL and the kernel file, then runs `solve` on request.

Started by `metakernel.grader.worker.Worker` as a fresh interpreter (never forked from a process with CUDA state).
The order matters, because whatever runs after the candidate's import can be reached by the candidate:

1. `sandbox.enter` (own uid, mount and network namespaces, private root) before torch is even imported;
2. torch, CUDA and the two IPC arenas (`transport`); the DSL with its launch hooks;
3. every callable the harness needs later is bound now, C-level where torch offers it (the clock, the device-wide
   sync, tensor copy and view methods, the profiler's enable/disable, the torch-mode probes), so patching a
   Python name later changes nothing the harness uses;
4. an audit hook (PEP 578; it cannot be removed) that refuses process creation, sockets, frame and gc
   introspection from the candidate's code, forbidden imports, libraries loaded from writable folders and writes
   outside the work dir — a tripwire in front of the OS walls, recorded as `rule_violation/sandbox`;
5. the candidate's file.

Every call is handled the same way (poisoned allocator, the same bracket, outputs copied to the output arena);
the parent alone decides, after a reply, which draws it compares. Replies are JSON: a reply cannot run code in
the parent. Run as `python -m metakernel.grader.child` with a JSON config on stdin.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from metakernel.dsl.base import NATIVE_CODE_EVENT
from metakernel.grader import transport
from metakernel.grader.sandbox import Isolation, Plan, SandboxError, enter, refuse_after_warmup
from metakernel.grader.static import DSL_ONLY_ATTRIBUTES, attribute_reason

_perf = time.perf_counter  # a builtin: bound before any candidate code exists
_THIS_FILE = __file__
_type = type
_gc_disable, _gc_collect, _gc_freeze = gc.disable, gc.collect, gc.freeze

#: Imports refused at run time, whoever asks (other kernel languages and compilers).
#: (NVRTC is not among them: TVM compiles its CUDA source through `cuda.bindings.nvrtc`, loaded on first use;
#: the static rules keep candidates from importing it themselves.)
FORBIDDEN_RUNTIME_IMPORTS = ("triton", "numba", "cupy", "pycuda", "torch._inductor", "torch.utils.cpp_extension",
                             "torch._higher_order_ops.triton_kernel_wrap")
#: The DSLs' own device toolchain, which TVM runs as a process where NVRTC is missing (the CPU check). It runs
#: inside the same sandbox (uid, namespaces, no_new_privs); every other program is refused.
#: ctypes.util.find_library (TVM looks libraries up with it) runs ldconfig -p, then gcc or ld.
TOOLCHAIN = frozenset({"nvcc", "ptxas", "fatbinary", "nvlink", "ldconfig", "ldconfig.real", "gcc", "cc", "ld"})
#: Events refused whoever raises them once the candidate is imported.
ALWAYS_REFUSED = ("os.system", "os.exec", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                  "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
                  "sys.addaudithook", "sys.monitoring.register_callback", "gc.get_objects", "gc.get_referrers",
                  "gc.get_referents", "os.kill", "signal.pthread_kill", "cpython._PySys_ClearAuditHooks")
EVALUATED = frozenset({"<string>", "<ast>"})
#: Events refused when the candidate's own code raises them (the DSLs use frames and introspection themselves).
CANDIDATE_REFUSED = ("sys._getframe", "sys._getframemodulename", "object.__getattr__", "object.__setattr__",
                     "object.__delattr__", "function.__new__", "code.__new__",
                     "_thread.start_new_thread", "ctypes.string_at", "ctypes.cdata", "ctypes.addressof",
                     "ctypes.dlsym", "ctypes.cdata/buffer", "mmap.__new__")


class _Fail(Exception):
    def __init__(self, status: str, text: str, reason: str = "") -> None:
        super().__init__(text)
        self.status, self.text, self.reason = status, text, reason


class Guard:
    """The audit hook's state and policy (one per process; the hook itself cannot be removed)."""

    def __init__(self, candidate: str, work: str, readonly: list[str] | tuple[str, ...] = ()) -> None:
        self.candidate = os.path.realpath(candidate)
        self._writable = tuple(os.path.realpath(p).rstrip("/") + "/" for p in (work, "/tmp", "/dev/shm"))
        # The sandbox's read-only binds may lie under /tmp (a checkout or the DSL wheels there): not writable.
        self._readonly = tuple(os.path.realpath(p).rstrip("/") + "/" for p in readonly)
        self.violations: list[str] = []
        self.armed = False
        self._busy = False
        self.events = 0  # every event seen (the request loop reports those raised inside the timed window)
        self._getframe = sys._getframe
        self._judged: dict[str, bool] = {}  # co_filename -> the candidate's code? (files that existed only)
        # The DSL packages' folders, taken now (the DSL is imported, the candidate not yet): a DSL parser may
        # re-parse the DSL's own library functions (CuTe's cutlass.pipeline helpers are @cute.jit functions).
        self._library_roots = tuple(
            os.path.realpath(os.path.dirname(sys.modules[name].__file__ or "")).rstrip("/") + "/"
            for name in DSL_PACKAGES if name in sys.modules and getattr(sys.modules[name], "__file__", None))
        self._library_defs: dict[str, frozenset[str]] = {}
        # Read now, before the candidate runs: the kernel file lies in the writable work dir, and a definition
        # added to it at run time is not the submitted kernel's.
        self._file_bytes: bytes | None = None
        try:
            with open(self.candidate, "rb") as f:
                self._file_bytes = f.read()
            self._file_defs = _definitions(self._file_bytes.decode("utf-8"))
        except (OSError, SyntaxError, ValueError):
            self._file_defs = frozenset()

    def _own_source(self, source: str | bytes) -> bool:
        """Whether a string a DSL parser compiles is the source of a function or class the kernel file defines.

        The DSLs re-parse the kernel's own functions (`inspect.getsource` of a `@cute.jit` / `@Tx.prim_func`
        object), never text made at run time. A piece of the file is not enough: a string literal of the file is
        a piece of it too, and `tvm.script.parse` of one ran its Python with builtins (red team, session 9).
        """
        text = source if isinstance(source, str) else source.decode("utf-8", "replace")
        return _normalised(text) in self._file_defs

    def _library_source(self, source: str | bytes) -> bool:
        """Whether a string a DSL parser compiles is the source of a function or class of the DSL's installed files.

        Only files under the DSL packages' folders (fixed before the candidate ran) that the child cannot write
        (outside its writable folders, or denied to its uid), and only whole definitions: compiling one runs the
        library's code, which importing it would run too; a fragment (`import os`, `exec(code`) proves nothing.
        """
        text = _normalised(source if isinstance(source, str) else source.decode("utf-8", "replace"))
        if not text or not self._library_roots:
            return False
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if not isinstance(path, str) or not path.endswith(".py"):
                continue
            real = os.path.realpath(path)
            if not real.startswith(self._library_roots) or (self.writable(real) and os.access(real, os.W_OK)):
                continue  # a file this process can change is no library
            if real not in self._library_defs:
                try:
                    with open(real, encoding="utf-8") as f:
                        self._library_defs[real] = _definitions(f.read())
                except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                    self._library_defs[real] = frozenset()
            if text in self._library_defs[real]:
                return True
        return False

    def _check_compile(self, event: str, source: str | bytes, filename: str = "") -> None:
        """Check a string compiled after the kernel's import.

        Allowed: code generated by the standard library or a DSL runtime, the kernel's own source re-parsed by a
        DSL, a plain `ast.parse` elsewhere, or else a type expression (an annotation being resolved).
        """
        frame = self._caller()
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if module in CODE_GENERATORS:
            self._check_generated(event, frame, module, source, filename)
            return
        parser = None
        walk, depth = frame, 0
        while walk is not None and depth < 10:
            name = walk.f_globals.get("__name__", "")
            if name.startswith(DSL_PARSERS):
                parser = name
                break
            walk, depth = walk.f_back, depth + 1
        if parser is not None:
            if not self._own_source(source) and not self._library_source(source):
                self.refuse(f"{event} of text that is not a function or class of the kernel file (through {parser})")
            return
        if module == "ast" or _type_expression(source):
            return
        self.refuse(f"{event} of a string that is not a type expression (from {module or 'unknown'})")

    def _check_generated(self, event: str, frame: Any, module: str, source: Any, filename: str) -> None:
        """A compile made by a code generator of the standard library: only as that generator itself would make it.

        Trusting the module's frames alone trusted its private helpers too: `dataclasses._create_fn`, reached
        through a private read, compiled caller-chosen text (red team, session 24). The public entries (a
        dataclass, a namedtuple, tvm_ffi's kwargs wrapper) build their text from names they check are
        identifiers; a run of the module's frames entered any other way is refused (a dunder is entered by Python's
        protocols, which the static rules leave to Python). The import system compiles a
        module's file from disk, so its text must be that file's, byte for byte.
        """
        if module in IMPORT_SYSTEM:
            if not isinstance(source, (str, bytes)) or not filename or not _is_file_text(filename, source):
                self.refuse(f"{event} through the import system of text that is not the file it names "
                            f"({filename or 'no file'})")
            return
        entry = frame
        while frame is not None and frame.f_globals.get("__name__", "") == module:
            entry, frame = frame, frame.f_back
        name = entry.f_code.co_name
        if name.startswith("<") or (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))):
            self.refuse(f"{event} through {module}.{name} (the standard library's code generators may be used "
                        "through their public functions only)")

    def _check_tree_compile(self) -> None:
        """A syntax tree compiled after the kernel's import: only where a DSL compiles the trees it parsed.

        The static rules read the file, not trees built at run time, and the string rule above sees no text here:
        TVMScript's evaluator compiled any tree handed to it (session 22). The DSLs compile trees in three places
        (CuTe's rewritten `@cute.jit` functions, TVMScript's expressions and its Python functions inside a
        prim_func), each from source the string rule checked when it was parsed; the standard library's code
        generators build theirs from identifiers.
        """
        frame = self._caller()
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if module in CODE_GENERATORS and module not in IMPORT_SYSTEM:
            self._check_generated("compile", frame, module, None, "")
        elif module not in TREE_COMPILERS:
            self.refuse(f"compiling a syntax tree built at run time (from {module or 'unknown'})")

    def writable(self, real: str) -> bool:
        """Whether the child could have written the file at real path `real`.

        The work dir, /tmp and /dev/shm, minus the sandbox's read-only binds.
        """
        return real.startswith(self._writable) and not real.startswith(self._readonly)

    def _caller(self) -> Any:
        """The frame that raised the event: the first one outside this file (the hook and its helpers)."""
        try:
            frame: Any = self._getframe(1)
        except ValueError:
            return None
        while frame is not None and frame.f_code.co_filename == _THIS_FILE:
            frame = frame.f_back
        return frame

    def _from_candidate(self) -> bool:
        frame = self._caller()
        # A code object given a file that does not exist (tvm_ffi turns every C++ frame of a TVM error into one,
        # which calls sys._getframe; frozen modules) is judged by the frame that ran it.
        while (frame is not None and frame.f_code.co_filename not in EVALUATED
               and not os.path.exists(frame.f_code.co_filename)):
            frame = frame.f_back
        if frame is None:
            return False
        name = frame.f_code.co_filename
        # Code the candidate had evaluated (a string annotation resolved by typing, TVMScript's expression
        # evaluator) runs in "<string>" / "<ast>" frames, and code it wrote to a file lies in a writable folder:
        # both are the candidate's code too.
        if name in EVALUATED:
            return True
        known = self._judged.get(name)
        if known is None:
            # Cached: DSL launch paths raise frame events on every call (CuTe reads f_code, TVM __code__), and
            # realpath is a syscall per path component. Only names that existed are cached: a file can only
            # appear later where the candidate can write, and such a path is judged the candidate's anyway.
            real = os.path.realpath(name)
            known = self._judged[name] = real == self.candidate or self.writable(real)
        return known

    def refuse(self, what: str) -> None:
        """Record and raise: a caught refusal still ends the grading as a rule violation."""
        self.violations.append(what)
        raise PermissionError(f"the grader's sandbox refused {what}")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit hook: check one event (never re-entered by the checks' own events)."""
        self.events += 1
        if not self.armed or self._busy:
            return
        self._busy = True
        try:
            self._check(event, args)
        finally:
            self._busy = False

    def _check(self, event: str, args: tuple[Any, ...]) -> None:
        if event == NATIVE_CODE_EVENT:
            self.refuse(str(args[0]) if args else event)
        if event in ("subprocess.Popen", "os.posix_spawn", "os.posix_spawnp"):
            program = args[0] if args and args[0] else (args[1][0] if len(args) > 1 and args[1] else "")
            if os.path.basename(os.fsdecode(program)) not in TOOLCHAIN:
                self.refuse(f"{event} {os.path.basename(os.fsdecode(program))}")
            return
        if event in ALWAYS_REFUSED or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            self.refuse(event)
        if event == "import":
            name = str(args[0])
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_RUNTIME_IMPORTS):
                self.refuse(f"import {name}")
            return
        if event == "open":
            path, mode = args[0], args[1]
            if isinstance(path, (str, bytes)) and isinstance(mode, str) and any(c in mode for c in "wax+"):
                real = os.path.realpath(os.fsdecode(path))
                if not self.writable(real):
                    self.refuse(f"writing {real}")
            return
        if event == "ctypes.dlopen":
            lib = args[0] if args else None
            if lib is None and self._from_candidate():  # CDLL(None): libc and libpython's C API, unaudited
                self.refuse("loading the process's own symbols (ctypes.CDLL(None))")
            if isinstance(lib, (str, bytes)) and os.sep in os.fsdecode(lib):
                real = os.path.realpath(os.fsdecode(lib))
                if self.writable(real):
                    self.refuse(f"loading the library {real}")
            return
        if event == "compile" and len(args) > 1 and isinstance(args[1], (str, bytes)):
            filename = os.fsdecode(args[1])
            real = os.path.realpath(filename) if filename.startswith("/") else ""
            if real == self.candidate and isinstance(args[0], (str, bytes)):
                # The kernel file lies in the writable work dir: compiled again (the whole file, or a function
                # of it a DSL parses), it must be what the static rules read.
                text = args[0] if isinstance(args[0], bytes) else args[0].encode("utf-8")
                if text != self._file_bytes and not self._own_source(text):
                    self.refuse(f"compiling the kernel file after it changed ({filename})")
            elif real and self.writable(real):
                self.refuse(f"importing code written at run time ({filename})")
        if event in ("compile", "exec") and args and isinstance(args[0], (str, bytes)):
            named = event == "compile" and len(args) > 1 and isinstance(args[1], (str, bytes))
            self._check_compile(event, args[0], os.fsdecode(args[1]) if named else "")
            return
        if event == "compile" and args and args[0] is not None:
            self._check_tree_compile()
            return
        if event in CANDIDATE_REFUSED and self._from_candidate():
            self.refuse(event + (f" {args[1]}" if event.startswith("object.") and len(args) > 1 else ""))


#: Callers whose string compiles are not code the candidate chose: the import system compiling a module file from
#: disk (the static rules have read the kernel's; libraries load lazily), `ast.parse` (parses, runs nothing) and
#: standard-library modules compiling code they generate from identifiers (a dataclass's __init__, a namedtuple's
#: __new__). Every other string compiled after the kernel's import must be a type expression.
CODE_GENERATORS = frozenset({"importlib._bootstrap_external", "importlib._bootstrap", "dataclasses", "collections",
                             "enum", "tvm_ffi.utils.kwargs_wrapper"})
#: The import system's modules among them: what they compile must be the file it names.
IMPORT_SYSTEM = frozenset({"importlib._bootstrap_external", "importlib._bootstrap"})
#: Where the DSLs compile syntax trees of the kernel's functions they parsed (the only tree compiles allowed).
TREE_COMPILERS = frozenset({"cutlass.base_dsl.dsl", "tvm.script.parser.core.evaluator",
                            "tvm.tirx.script.parser.parser",
                            "tvm_ffi.error"})  # a fixed `_getframe()` template, for a C++ frame of a TVM error
#: The DSLs re-parse the kernel's own functions (CuTe's AST preprocessor, the TVMScript parser).
DSL_PARSERS = ("cutlass.base_dsl.ast_preprocessor", "tvm.script.parser")
#: The packages whose installed source those parsers may re-parse too (their own library functions).
DSL_PACKAGES = ("cutlass", "tvm")


def _is_file_text(filename: str, source: str | bytes) -> bool:
    """Whether `source` is the whole content of the existing file `filename` (what an import compiles)."""
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data == (source if isinstance(source, bytes) else source.encode("utf-8"))


def _normalised(text: str) -> str:
    """Lines stripped of indentation, blank ones dropped: a dedented function still matches its file."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _definitions(text: str) -> frozenset[str]:
    """The normalised source of every function and class a file defines (any depth), with and without decorators.

    That is what `inspect.getsource` hands a DSL parser, and nothing else of the file.
    """
    import ast

    lines = text.splitlines()
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno:
            starts = {node.lineno, min([d.lineno for d in node.decorator_list] + [node.lineno])}
            for start in starts:
                out.add(_normalised("\n".join(lines[start - 1:node.end_lineno])))
    return frozenset(out)


def _type_expression(source: str | bytes) -> bool:
    """Whether `source` is a plain type expression (what resolving a string annotation evaluates).

    typing.get_type_hints (called by functools.singledispatch, and by the DSLs on annotations) evaluates strings:
    without this, an annotation naming a string variable would run any code the candidate wrote, unseen by the
    static rules. Names, non-dunder attributes, subscripts, constants, tuples, lists and `|` only.
    """
    import ast

    try:
        tree = ast.parse(source if isinstance(source, str) else source.decode(), mode="eval")
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return False
    allowed = (ast.Expression, ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.Tuple, ast.List, ast.Load,
               ast.BinOp, ast.BitOr, ast.Slice)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            return False
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return False
        # the static rules' attribute list (torch.sys.modules['ctypes'] names a module, not a type), and no string
        # keys: a type is indexed by types and numbers
        if isinstance(node, ast.Attribute) and node.attr not in DSL_ONLY_ATTRIBUTES and attribute_reason(node.attr):
            return False
        if isinstance(node, ast.Subscript) and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                                                   for c in ast.walk(node.slice)):
            return False
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return False
        if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.BitOr):
            return False
    return True


class Bound:
    """What the harness calls after the candidate's import, bound before it (C-level where torch has one)."""

    def __init__(self, torch: Any, device: str) -> None:
        base = torch._C.TensorBase
        self.Tensor = torch.Tensor
        self.copy_ = base.copy_
        self.view = base.view
        self.fill_ = base.fill_
        self.numel = base.numel
        self.element_size = base.element_size
        self.contiguous = base.contiguous
        self.reshape = base.reshape
        self.data_ptr = base.data_ptr
        self.clone = base.clone
        self.equal = torch._C._VariableFunctions.equal
        self.is_floating_point = base.is_floating_point
        self.empty = torch._C._VariableFunctions.empty
        self.randn = torch._C._VariableFunctions.randn
        self.randperm = torch._C._VariableFunctions.randperm
        self.randint = torch._C._VariableFunctions.randint
        self.bitwise_xor_ = base.bitwise_xor_
        self.Generator = torch._C.Generator
        self.uint8 = torch.uint8
        self.no_grad = torch.no_grad
        self.function_mode = torch._C._is_torch_function_mode_enabled
        self.dispatch_depth = torch._C._len_torch_dispatch_stack
        self.disable_tf = torch._C.DisableTorchFunction
        self.sync = torch._C._cuda_synchronize if device == "cuda" else (lambda: None)
        self.snapshot = torch.cuda.memory_snapshot if device == "cuda" else (lambda: [])
        self.host_stats: Any = getattr(torch.cuda, "host_memory_stats", None) if device == "cuda" else None
        self.memory_stats: Any = torch.cuda.memory_stats if device == "cuda" else None
        from torch.autograd import profiler as p

        self.prof = (p._prepare_profiler, p._enable_profiler, p._disable_profiler, p.ProfilerConfig,
                     p.ProfilerState, p.ProfilerActivity, p._ExperimentalConfig)

    def modes_active(self) -> bool:
        """A torch function or dispatch mode left on by the candidate would run its code inside ours."""
        return bool(self.function_mode()) or self.dispatch_depth() > 0


#: Page-locked bytes a file may add to the host allocator's cache (the staging blocks of `.item()` calls).
PINNED_SLACK = 4096


class Child:
    """The request loop."""

    def __init__(self, config: dict[str, Any], conn: Connection, isolation: Isolation) -> None:
        self.config, self.conn, self.iso = config, conn, isolation
        self.device = config["device"]
        self.adapter: Any = None
        self.gate: Any = None
        self.solve: Any = None
        self.guard: Guard | None = None
        self.arena_in: Any = None
        self.arena_out: Any = None
        self.pinned_base = 0
        self.oom_base = 0
        self.oom_seen: list[tuple[int, int]] = []  # (bytes asked, bytes the allocator held): its failures, in order

    # -------------------------------------------------------------------------------------------- set-up
    def setup(self) -> dict[str, Any]:
        """torch, CUDA, arenas, the DSL and its hooks, the bound callables; then the file, unless it comes later.

        A candidate's child may start before its kernel exists (`WarmWorker`: the agent is still writing it):
        everything up to the audit hook is the same for every kernel of the variant, and `load` does the rest
        once the parent has put the file in this child's work dir.
        """
        import torch

        self.torch = torch
        if self.device == "cuda":
            torch.cuda.init()
            torch.empty(1, device="cuda")
            driver = transport.Driver()
            for key in ("in", "out"):
                spec = self.config["arenas"][key]
                base = driver.open(spec["handle"]) + int(spec["offset"])
                setattr(self, f"arena_{key}", transport.wrap_device_bytes(base, int(spec["nbytes"])))
        kind = self.config["kind"]
        info: dict[str, Any] = {}
        if kind == "candidate":
            from metakernel.dsl import LaunchGate, get_adapter

            self.adapter = get_adapter(self.config["dsl"])
            self.gate = LaunchGate(mode="intercept" if self.config.get("dry_run") else "run")
            self.gate.reachable = self._reachable
            started = _perf()
            self.adapter.import_dsl()
            self.adapter.install_hooks(self.gate)
            if self.device == "cuda" or self.config.get("dry_run"):
                self.adapter.confine()
            info["dsl_import_s"] = _perf() - started
        self.b = Bound(torch, self.device)
        observe = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None) if self.device == "cuda" else None
        if observe is not None:  # the allocator's own account of a failed request (`_failure`), not the file's words
            observe(self._out_of_memory)
        if self.gate is not None and self.b.host_stats is not None:
            self.gate.pinned = self._pinned
        if self.gate is not None and self.device == "cuda":  # half the card (gold files: 20 GiB at most, on an H100)
            self.gate.room = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 2
            self.gate.sync = self.b.sync  # C-level, bound before the file's import (`_context_lost`)
        if kind == "candidate" and self.config.get("dry_run"):
            _warm_meta(torch)
        if self.config.get("path") is not None:
            info.update(self.load(self.config["path"]))
        return info

    def load(self, path: str) -> dict[str, Any]:
        """The audit hook, then the kernel (or the problem file of a baseline's child)."""
        torch = self.torch
        kind = self.config["kind"]
        info: dict[str, Any] = {}
        if kind == "candidate":
            self.guard = Guard(path, self.config["plan"]["work"], self.config["plan"].get("binds", ()))
            sys.addaudithook(self.guard)
            self.guard.armed = True
            self.iso.audit_hook = True
            refuse_after_warmup(self.iso, cuda=self.device == "cuda")  # what the warm-up needed, refused now
            if self.gate is not None and self.gate.pinned is not None:
                for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                              torch.bool):  # `.item()`'s staging blocks (one per element size), cached now
                    torch.ones(1, dtype=dtype, device=self.device).item()
                self.pinned_base = self._pinned_now()  # what the DSLs' warm-up left, before the file's import
            if self.b.memory_stats is not None:
                self.oom_base = int(self.b.memory_stats().get("num_ooms", 0))
            started = _perf()
            try:
                module = _import_file(path, "candidate_kernel")
            finally:
                info["import_s"] = _perf() - started
            solve = getattr(module, "solve", None)
            if not callable(solve):
                raise _Fail("compile_error", f"{os.path.basename(path)} defines no callable solve(*inputs)")
            self.solve = solve
        else:
            module = _import_file(path, "baseline_problem")
            self.solve = torch.compile(module.reference) if kind == "compile" else module.reference
        _gc_disable()  # collections run only where nothing can profit from them (after each call)
        _gc_collect(2)
        _gc_freeze()  # the imports' heap, out of every later full collection (`_collect`)
        return info

    # -------------------------------------------------------------------------------------------- requests
    def inputs(self, specs: list[Any], blobs: list[bytes]) -> list[Any]:
        """A draw's inputs: views of the input arena (GPU) or values (CPU)."""
        return [transport.unpack_value(s, blobs, self.arena_in) for s in specs]

    def poison(self, nbytes: int, pattern: int) -> None:
        """Fill memory the caching allocator will hand out next, so a never-written output holds garbage."""
        if nbytes > 0:
            block = self.b.empty((int(nbytes),), dtype=self.b.uint8, device=self.device)
            self.b.fill_(block, pattern)
            del block

    def _check_clean(self) -> None:
        if self.b.modes_active():
            raise _Fail("rule_violation", "a torch function or dispatch mode is active outside solve: the "
                        "harness's own tensor operations would run candidate code", "sandbox")
        if self.guard is not None and self.guard.violations:
            raise _Fail("rule_violation", f"the sandbox refused: {self.guard.violations[0]} (kernels may not "
                        "create processes, open sockets, inspect frames or the garbage collector, load "
                        "libraries or write files)", "sandbox")
        if self.gate is not None and self.gate.failures:
            raise _Fail("rule_violation", f"solve caught an error of the grader's own work on a DSL launch "
                        f"({self.gate.failures[0]}): a file must let what a launch raises propagate (and pass "
                        "plain tensor views, not expanded or overlapping ones, of a size the card can copy)",
                        "sandbox")
        if self.guard is not None and self.b.memory_stats is not None and self._ooms() > 0:
            raise _Fail("rule_violation", "solve caught an out-of-memory error: a failed allocation empties the "
                        "allocator's cache (empty_cache under another name) and steers where the next one lands; "
                        "size what you allocate to the card instead", "sandbox")

    def _out_of_memory(self, device: int, requested: int, allocated: int, free: int) -> None:
        """The caching allocator's observer, called as it gives up on a request (nothing here may allocate)."""
        self.oom_seen.append((int(requested), int(allocated)))

    def _ooms(self) -> int:
        """Out-of-memory errors since the file's import that were not the gate's own copies'.

        Each one made the caching allocator release its cached segments: session 31's third red-teamer used a
        caught 1 PiB request to vacate an address range the gate's next copy then took. An uncaught one ends the
        call as the kernel's failure anyway.
        """
        own = self.gate.own_ooms if self.gate is not None else 0
        return int(self.b.memory_stats().get("num_ooms", 0)) - self.oom_base - own

    def _bracket(self, inputs: list[Any], _clock: Any = _perf) -> tuple[Any, float]:
        """The timed window: sync, clock, solve, device-wide sync, clock (garbage collection off throughout).

        The clock is a default argument, bound when this file was imported: rebinding the module's `_perf` (a
        red-teamer did, through a module re-exporting builtins) does not reach it.
        """
        b = self.b
        b.sync()
        t0 = _clock()
        with b.no_grad():
            out = self.solve(*inputs)
        b.sync()
        return out, _clock() - t0

    def _counted_bracket(self, inputs: list[Any]) -> tuple[Any, float, int]:
        """`_bracket` and the DSL launches it made (every call of a row must make one)."""
        before = self.gate.launches if self.gate is not None else 0
        out, seconds = self._bracket(inputs)
        return out, seconds, (self.gate.launches - before) if self.gate is not None else 0

    def _focus_mode(self, mode: str, only: Any) -> None:
        """The gate's mode and ablation flags, for a row's focus call or for a whole request (`_set_mode`).

        A focus call is an ablation or the audit; "run" after it sets the gate back. Nothing is reset here:
        within a row the launch counts and units run on, and the focus call's audited copies and randomised count
        stay for the reply. "run" is "intercept" in a dry run.
        """
        gate = self.gate
        if gate is None:
            return
        if mode != "run":
            gate.audited = []
            gate.randomized = 0
            gate.isolated = 0
            gate.pinned_live = 0
        gate.mode = "run" if mode in ("run", "audit", "randomize", "isolate") else mode
        if gate.mode == "run" and self.config.get("dry_run"):
            gate.mode = "intercept"
        gate.audit = mode == "audit"
        gate.randomize = mode == "randomize"
        gate.isolate = mode == "isolate"
        gate.only = frozenset(str(n) for n in only) if only else None

    def _private_pool(self) -> None:
        """A fresh private CUDA pool for the gate's tensors in this row (`LaunchGate.pool`), dropped at its end.

        One per row, so its memory goes back once the row's copies are gone: a pool kept for the whole grading
        would hold an audit's copies of every argument (gigabytes for the KV-cache problems) away from the kernel.
        """
        torch = self.torch
        if self.gate is None or self.device != "cuda" or not hasattr(torch.cuda, "MemPool"):
            return
        try:
            self.gate.pool = torch.cuda.MemPool()
        except Exception:  # noqa: BLE001 - a hardening: without it the gate allocates as before
            self.gate.pool = None

    def _reachable(self) -> list[Any]:
        """What the candidate's eager code can write, for the isolation ablation (`LaunchGate.isolate`).

        The input arena (every draw of the row lies there, and a view's storage spans all of it) and every block of
        the caching allocator, live or free (a freed tensor keeps its values until reused), except the gate's own
        pool, where the saved copies go. Nothing without that pool: a copy could land in a free block listed here
        and be overwritten by the fill that follows. The output arena is left out: eager code cannot reach it (no
        tensor of the candidate's lies there, and a view cannot be made of an address).
        """
        gate = self.gate
        if gate is None or gate.pool is None or self.device != "cuda":
            return []
        regions: list[Any] = []
        if self.arena_in is not None:
            regions.append(self.arena_in)
        own = tuple(gate.pool.id)
        device = self.torch.cuda.current_device()
        for segment in self.b.snapshot():
            if segment.get("device", device) != device or tuple(segment.get("segment_pool_id") or ()) == own:
                continue
            address = int(segment["address"])
            for block in segment.get("blocks") or ():
                size = int(block["size"])
                if size > 0:
                    regions.append(transport.wrap_device_bytes(address, size))
                address += size
        return regions

    def _pinned(self) -> int:
        """Bytes of page-locked host memory the host allocator holds beyond what it held before the file's import.

        Names that make it are refused by the static rules, but `t.to(cpu, dtype, True)` (a non_blocking copy, the
        flag positional) makes it too: the GPU reads it by address, outside every allocation the isolation fills.
        Held, not handed out: a freed block stays cached, page-locked and mapped with its bytes (session 31's
        red-teamer freed the answer's block before the launch, and the count of blocks handed out read 0). An
        honest `.item()` leaves a staging block of a few bytes; `PINNED_SLACK` allows for those.
        """
        grown = self._pinned_now() - self.pinned_base
        return grown if grown > PINNED_SLACK else 0

    def _pinned_now(self) -> int:
        return int(self.b.host_stats().get("allocated_bytes.current", 0))

    def _set_mode(self, mode: str) -> None:
        """The gate in `mode` for a whole request, its counts forgotten."""
        self._focus_mode(mode, None)
        if self.gate is not None:
            self.gate.reset()

    def call(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """One call of solve outside a row (the free check's): poison, (spin), probe, bracket, probe, copy outputs.

        Ablations and audits are not made here: they are a row's focus call (`row`), so nothing tells them apart.
        """
        self._check_clean()
        mode = msg.get("mode", "run")
        if mode not in ("run", "intercept"):
            raise _Fail("infra_error", f"a one-call request in mode {mode!r}: ablations and audits come in rows",
                        "protocol")
        self._set_mode(mode)
        steps = {"enter": _perf()}  # where a request's time goes (diagnostics only: never scored)
        inputs = self.inputs(msg["inputs"], blobs)
        if self.gate is not None:
            self.gate.protected = frozenset(x.untyped_storage().data_ptr() for x in inputs
                                            if isinstance(x, self.torch.Tensor))
        self.poison(int(msg.get("poison", 0)), int(msg.get("pattern", 0xFF)))
        steps["inputs_poison"] = _perf()
        if self.device == "cuda" and msg.get("flush_l2"):
            scratch = self.b.empty((256 * 1024 * 1024,), dtype=self.b.uint8, device="cuda")
            self.b.fill_(scratch, 1)
            del scratch
        steps["flush"] = _perf()
        probe_before = host_probe()
        events = self.guard.events if self.guard is not None else 0
        out, host_s = self._bracket(inputs)
        window_events = (self.guard.events - events) if self.guard is not None else 0
        probe_after = host_probe()
        # One clock since protocol 2 (the bound perf_counter around a device-wide sync): `event_s` is that bracket.
        reply: dict[str, Any] = {"ok": True, "host_s": host_s, "event_s": host_s,
                                 "launches": self.gate.launches if self.gate else None,
                                 "units": sorted(self.gate.units) if self.gate else [],
                                 "probe_s": max(probe_before, probe_after), "probe_before_s": probe_before,
                                 "probe_after_s": probe_after, "window_events": window_events}
        steps["bracket_probes"] = _perf()
        out_blobs: list[bytes] = []
        reply["out"] = self.export_outputs(out, 0, out_blobs)
        steps["export"] = _perf()
        if self.device == "cpu":
            reply["inputs_after"] = [transport.pack_value(x, out_blobs) for x in inputs]
        if mode == "intercept" and self.adapter is not None:
            reply["resources"] = self.adapter.resources()  # the check's table: what each kernel asks of an SM
        del out, inputs
        self._collect()
        self._check_clean()  # after the collection: a finaliser it ran is judged too
        steps["collect"] = _perf()
        marks = list(steps.items())
        reply["steps_s"] = {name: at - marks[i][1] for i, (name, at) in enumerate(marks[1:])}
        return reply, out_blobs

    def _audit_reply(self, msg: dict[str, Any], reply: dict[str, Any], out_blobs: list[bytes]) -> None:
        """The audit call's launch arguments, before and after each launch, copied where the parent reads them."""
        assert self.gate is not None
        sizes = list(msg.get("audit_bytes") or [])  # only arguments about the size of an output in bytes (or
        # padded by a little), whatever their dtype, can hold one: others (caches, weights) stay here

        def wanted(t: Any) -> bool:
            return any(n <= t.nbytes <= n + max(256, n // 100) for n in sizes)

        # The copies go to the output arena past the call's own outputs (slot 0), GPU to GPU: through the
        # socket a 119 MB argument cost six host copies, and problem 28's audit took 3.5 s (docs/timing.md).
        # What does not fit there (a problem of one arena slot) still goes by value.
        free = [int(self.config.get("slot_bytes", 0))] if self.device == "cuda" else []

        # An argument whose bytes are those last sent for the same address (a weight every launch reads, an
        # input a launch left alone: its copy after the launch) is sent once; its spec names the same copy.
        # Problem 34's backward kernels sent 19 s of such copies at 682b56c.
        sent: dict[int, tuple[Any, Any, list[int], Any]] = {}  # address -> (bytes, dtype, shape, spec)
        b = self.b

        def one(t: Any, address: int) -> Any:
            flat = b.view(b.reshape(b.contiguous(t), [-1]), b.uint8)
            last = sent.get(address)
            if (last is not None and last[1] == t.dtype and last[2] == list(t.shape)
                    and b.numel(last[0]) == b.numel(flat) and b.equal(last[0], flat)):
                return last[3]
            fits = bool(free) and transport.aligned(free[0]) + t.nbytes <= self.arena_out.numel()
            if fits and t.is_cuda and transport.known_dtype(t.dtype):
                spec, free[0] = self._export_leaf(t, 0, free[0], self.arena_out.numel(), out_blobs)
            else:
                spec = transport.pack_value(t.cpu(), out_blobs)
            sent[address] = (flat, t.dtype, list(t.shape), spec)
            return spec

        def pack(tensors: list[Any], keep: list[int], addresses: list[int]) -> list[Any]:
            return [one(tensors[i], addresses[i]) for i in keep]

        audited = []
        for launch in self.gate.audited:
            keep = [i for i, t in enumerate(launch.before) if wanted(t)]
            # whether the launch changed any of its tensor arguments (all of them, not only those sent): one that
            # changed none did its work, if any, in memory it reached by address (session 29's red-teamer)
            wrote = None if launch.after is None else any(
                not self.b.equal(a, b) for a, b in zip(launch.before, launch.after, strict=True))
            audited.append({"before": pack(launch.before, keep, launch.addresses), "unit": list(launch.unit),
                            "addresses": [launch.addresses[i] for i in keep], "wrote": wrote,
                            # the same arguments once the launch finished (None: the route has no after-hook)
                            "after": None if launch.after is None else pack(launch.after, keep,
                                                                            launch.addresses)})
        reply["audited"] = audited
        if free:
            self.b.sync()  # the parent reads the arena as soon as the reply arrives

    def unmask(self, mask: Any) -> None:
        """Undo the parent's mask of one draw (`Worker.place`), right before its call and outside the bracket.

        None: the draw was not masked (the first of a row).
        """
        if not mask or self.arena_in is None:
            return
        start, end, key = (int(v) for v in mask)
        if not 0 <= start < end <= self.arena_in.numel():
            raise _Fail("infra_error", "a masked draw lies outside the input arena", "protocol")
        b = self.b
        b.bitwise_xor_(self.arena_in[start:end], transport.mask_stream(end - start, key, self.device,
                                                                      b.randint, b.Generator))
        b.sync()

    def _protect(self, draws: list[list[Any]]) -> None:
        """The launch gate leaves the inputs' storage alone (randomise mode)."""
        if self.gate is not None:
            self.gate.protected = frozenset(x.untyped_storage().data_ptr() for d in draws for x in d
                                            if isinstance(x, self.torch.Tensor))

    def _poison_row(self, msg: dict[str, Any], count: int) -> None:
        """Every call's outputs land in filled memory: `count` blocks held at once, then all freed.

        Rows and profile rows alike, so the allocator hands a call the same kind of memory in every phase.
        """
        nbytes, pattern = int(msg.get("poison", 0)), int(msg.get("pattern", 0xFF))
        if nbytes > 0:
            blocks = [self.b.empty((nbytes,), dtype=self.b.uint8, device=self.device) for _ in range(count)]
            for block in blocks:
                self.b.fill_(block, pattern)
            del blocks

    def row(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """A row of draws called back to back, each in the bracket: one request of the correctness and timing phases.

        Its time is the mean of the calls after the first (protocol 5). A call made after the child has waited for
        the parent (which draws, places and checks for several ms) finds the host cold: on the H200 the first call
        of a row read 205 us (28 CuTe) and 250 us (28 TIRx) where the later calls of the same rows read 145 and 163
        (validation/h200-overhead-study3.json); on the CPU machine a 2-5 ms pause before a 20 us call makes it
        3-15x slower whether the pause sleeps or spins. That cost is the harness's wait, not the kernel's, so the
        first call only warms the host: its outputs are returned and may be checked like any other, its time is
        reported (`first_s`) but not scored. Every draw after the first arrives masked (`Worker.place`) and is
        unmasked right before its own call, so no call can read a later one, and whatever the first call leaves
        behind can be nothing but draw-independent state a warm process has anyway.
        """
        self._check_clean()
        self._set_mode("run")
        steps = {"enter": _perf()}
        draws = [self.inputs(d, blobs) for d in msg["draws"]]
        masks = list(msg.get("masks") or [])
        count = len(draws)
        self._protect(draws)
        self._poison_row(msg, count)
        steps["inputs_poison"] = _perf()
        flush = self.device == "cuda" and bool(msg.get("flush_l2"))
        window_events = 0
        waited = 0.0
        each: list[float] = []
        launches: list[int] = []
        outs: list[Any] = []
        focus = None if msg.get("focus") is None else int(msg["focus"])
        mode = str(msg.get("mode", "run"))
        if focus is not None and not 0 <= focus < count:
            raise _Fail("infra_error", "a row's focus call lies outside the row", "protocol")
        if focus is not None and mode != "run":
            self._private_pool()
        probe_before = host_probe()
        for j in range(count):
            if j < len(masks) and masks[j]:
                started = _perf()
                self.unmask(masks[j])
                waited += _perf() - started
            if flush:
                scratch = self.b.empty((256 * 1024 * 1024,), dtype=self.b.uint8, device="cuda")
                self.b.fill_(scratch, 1)
                del scratch
            events = self.guard.events if self.guard is not None else 0
            if j == focus:
                self._focus_mode(mode, msg.get("only"))
            out = None
            try:
                out, seconds, launched = self._counted_bracket(draws[j])
            finally:
                if j == focus:
                    self._focus_mode("run", None)
                    if self.gate is not None and mode == "suppress":
                        self.gate.give_back_garbled(out)  # what the file keeps between calls, as it was
            window_events += (self.guard.events - events) if self.guard is not None else 0
            launches.append(launched)
            each.append(seconds)
            outs.append(out)
        probe_after = host_probe()
        timed = each[1:] or each  # the first call of a row warms the host (Child.row says why); one call: itself
        sample = sum(timed) / len(timed)
        reply: dict[str, Any] = {"ok": True, "host_s": sample, "event_s": sample, "repeats": len(timed),
                                 "first_s": each[0], "host_each_s": each,
                                 "launches_each": launches if self.gate else None,
                                 "launches": sum(launches) / count if self.gate else None,
                                 "units": sorted(self.gate.units) if self.gate else [],
                                 "probe_s": max(probe_before, probe_after), "probe_before_s": probe_before,
                                 "probe_after_s": probe_after, "window_events": window_events, "unmask_s": waited}
        steps["bracket_probes"] = _perf()
        out_blobs: list[bytes] = []
        if focus is None:
            reply["outs"] = [self.export_outputs(out, slot, out_blobs) for slot, out in enumerate(outs)]
        else:  # an ablation's or the audit's row: only the focus call's outputs (slot 0) and launches are read
            reply["out"] = self.export_outputs(outs[focus], 0, out_blobs)
            reply["launches"] = launches[focus]
            if self.gate is not None and mode == "audit":
                self._audit_reply(msg, reply, out_blobs)
            if self.gate is not None and mode in ("audit", "randomize"):
                reply["randomized"] = self.gate.randomized
            if self.gate is not None and mode == "isolate":
                reply["isolated"] = self.gate.isolated
                reply["pinned"] = self.gate.pinned_live
            if self.gate is not None:  # the gate's copies die with this row, and its pool with them
                self.gate.audited, self.gate.pool = [], None
        if self.device == "cpu":
            reply["inputs_after_draws"] = [[transport.pack_value(x, out_blobs) for x in d] for d in draws]
        steps["export"] = _perf()
        del outs, draws
        self._collect()
        self._check_clean()  # after the collection: a finaliser it ran is judged too
        steps["collect"] = _perf()
        marks = list(steps.items())
        reply["steps_s"] = {name: at - marks[i][1] for i, (name, at) in enumerate(marks[1:])}
        return reply, out_blobs

    def export_outputs(self, out: Any, slot: int, blobs: list[bytes]) -> Any:
        """Check the returned structure (exact types only) and copy its tensors into output slot `slot`.

        Returns the structure as a `transport.unpack_value` spec: every type is checked before anything of the
        candidate's is touched, then each tensor's placeholder is filled with where its copy lies.
        """
        if self.b.modes_active():
            raise _Fail("rule_violation", "solve left a torch function or dispatch mode active", "sandbox")
        leaves: list[tuple[Any, dict[str, Any]]] = []

        def walk(node: Any, depth: int = 0) -> Any:
            kind = _type(node)
            if kind is self.b.Tensor:
                holder: dict[str, Any] = {}
                leaves.append((node, holder))
                return holder
            if isinstance(node, self.b.Tensor):
                raise _Fail("rule_violation", f"solve returned a {kind.__name__}, a subclass of torch.Tensor: "
                            "outputs must be plain torch.Tensor objects", "output_type")
            if kind in (tuple, list) and depth < 8:
                return {"seq": kind.__name__, "items": [walk(v, depth + 1) for v in node]}
            if node is None or kind in (bool, int, float):
                return {"v": node}
            raise _Fail("rule_violation", f"solve returned a {kind.__name__}: outputs must be tensors, or tuples "
                        "and lists of them", "output_type")

        with self.b.disable_tf():
            tree = walk(out)
            at = int(self.config.get("slot_bytes", 0)) * slot
            limit = at + int(self.config.get("slot_bytes", 0))
            for index, (leaf, holder) in enumerate(leaves):
                spec, at = self._export_leaf(leaf, index, at, limit, blobs)
                holder.update(spec)
        self.b.sync()  # the copies are asynchronous, and the parent reads the arena as soon as the reply arrives
        return tree

    def _export_leaf(self, t: Any, index: int, at: int, limit: int, blobs: list[bytes]) -> tuple[Any, int]:
        """One returned tensor: by value on a CPU machine, else copied into the output arena at `at`."""
        b = self.b
        if not transport.known_dtype(t.dtype):
            raise _Fail("rule_violation", f"output {index} has dtype {transport.dtype_name(t.dtype)}, which the "
                        f"problem's outputs never have (return one of {', '.join(transport.DTYPES)})", "output_type")
        if self.device == "cpu":
            return transport.pack_value(b.clone(t), blobs), at
        if not t.is_cuda:
            raise _Fail("rule_violation", f"output {index} is on {t.device.type}, not on the GPU", "output_type")
        nbytes = b.numel(t) * b.element_size(t)
        start = transport.aligned(at)
        if start + nbytes > min(limit, self.arena_out.numel()):
            raise _Fail("wrong", "the outputs are larger than the reference's", "structure")
        if nbytes:
            dst = b.view(self.arena_out[start:start + nbytes], t.dtype)
            b.copy_(b.reshape(dst, t.shape), t)
        spec = {"at": start, "dtype": transport.dtype_name(t.dtype), "shape": list(t.shape),
                "stride": _contiguous_strides(list(t.shape)), "nbytes": nbytes}
        return spec, start + nbytes

    def profile(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Kernel names and device times over a row of fresh draws (one call each), plus each draw's outputs."""
        self._check_clean()
        self._set_mode("run")
        prepare, enable, disable, config_cls, state, activity, experimental = self.b.prof
        acts = {activity.CPU} | ({activity.CUDA} if self.device == "cuda" else set())
        cfg = config_cls(state.KINETO, False, False, False, False, False, experimental(), "")
        draws = [self.inputs(d, blobs) for d in msg["draws"]]
        masks = list(msg.get("masks") or [])
        count = len(draws)
        self._protect(draws)
        results: list[Any] = []
        out_blobs: list[bytes] = []
        kernels: list[tuple[str, float]] = []
        launches: list[int] = []
        # As a row does it (a red-teamer told profiled calls apart by the allocator: their outputs were copied and
        # freed after each call, so the next call's landed at the same address): memory poisoned up front, every
        # call's outputs kept until the row ends, then copied. Only the calls are in the profiler's window.
        self._poison_row(msg, count)
        for slot in range(count):
            self.unmask(masks[slot] if slot < len(masks) else None)
            self.b.sync()
            prepare(cfg, acts)
            enable(cfg, acts)
            try:
                out, _, launched = self._counted_bracket(draws[slot])
            finally:
                result = disable()
            launches.append(launched)
            for evt in result.events():
                if str(evt.device_type()).endswith("CUDA") and evt.duration_ns():
                    kernels.append((str(evt.name()), evt.duration_ns() / 1e3 / count))
            results.append(out)
            del out
        outs = [self.export_outputs(out, slot, out_blobs) for slot, out in enumerate(results)]
        del results
        reply = {"ok": True, "kernels": kernels, "repeats": count, "outs": outs,
                 "kernel_names": sorted(self.gate.kernel_names) if self.gate else [],
                 "units": sorted(self.gate.units) if self.gate else [],
                 "launches_each": launches if self.gate else None,
                 "launches": sum(launches) / count if self.gate else None}
        if self.device == "cpu":
            reply["inputs_after_draws"] = [[transport.pack_value(x, out_blobs) for x in d] for d in draws]
        del draws
        self._collect()
        self._check_clean()  # after the collection: a finaliser it ran is judged too
        return reply, out_blobs

    def _collect(self) -> None:
        """Collect garbage now, while no new inputs have arrived: planted finalizers can profit from nothing.

        The young generation every call, everything every 64 calls. What survives a full collection (torch, the
        DSL compiler, the compiled kernels) is then frozen out of later ones: a full collection of that heap took
        ~200 ms on the CI machine (350 k objects), a share of every timed request's cost, and after the freeze it
        scans only what the calls since allocated.

        A collection can still run the file's code: a generator in a reference cycle, suspended inside a `try`,
        runs its `finally` when collected (no `__del__` needed). Session 33's red-teamer queued seconds of GEMMs
        there, after the outputs were exported, so the reply went out with the GPU busy, into the eager baseline's
        timing (measured next, then cached for every later grading) or another grading's. So the device is
        synchronised after every collection: the reply, and whatever the parent times next, find it idle.
        """
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls % 64 == 0:
            _gc_collect(2)
            _gc_freeze()
        else:
            _gc_collect(0)
        self.b.sync()

    def handle(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Dispatch one request."""
        op = msg.get("op")
        self.oom_seen.clear()  # (an earlier request's failures are that request's: `_failure` reads this one's)
        if op in ("call", "time"):
            return self.call(msg, blobs)
        if op == "profile":
            return self.profile(msg, blobs)
        if op == "row":
            return self.row(msg, blobs)
        raise _Fail("infra_error", f"unknown request {op!r}")


def _warm_meta(torch: Any) -> None:
    """Run typical ops on meta tensors once before the audit hook goes in (the check's full-scale trace).

    torch imports sympy and mpmath on the first meta op, and mpmath compiles strings at import: after the hook,
    that would be refused as the candidate's.
    """
    x = torch.empty((4, 8), dtype=torch.bfloat16, device="meta")
    f = x.float()
    i = torch.zeros(3, dtype=torch.long, device="meta")
    y = torch.softmax(f @ f.t(), -1).topk(2, dim=-1).values.sum() + torch.rsqrt(f.pow(2).mean(-1, keepdim=True))
    z = torch.cat([x[i], x[:3]]).to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1)
    w = torch.where(f > 0, f, -f).scatter_add(0, torch.zeros_like(i)[:, None].expand(3, 8), f[:3])
    del y, z, w


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return list(reversed(strides))


def host_probe(iterations: int = 1000, _clock: Any = _perf) -> float:
    """Seconds this interpreter takes for a fixed loop now: the host's CPU speed just before a timed call."""
    started = _clock()
    total = 0
    for i in range(iterations):
        total += i
    return _clock() - started


def _import_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _Fail("compile_error", f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _candidate_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames (and importlib's): what the agent can act on."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_HARNESS) and "importlib._bootstrap" not in f.filename]
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(exc), exc)))


def _failure(child: Child, exc: BaseException, status: str) -> dict[str, Any]:
    gate_failed = ""
    if getattr(child, "gate", None) is not None:
        # a failure of the gate's own work that left solve: the parent judges it, never as an ablation's
        # "required" (session 31's fifth red-teamer)
        gate_failed = "; ".join(child.gate.failures)
        child.gate.failures.clear()
    bound = getattr(child, "b", None)  # (a failure in set-up comes before the bound callables)
    # [bytes asked, bytes the allocator held] of the allocator's last failure in this call, where it ran out: the
    # parent judges whose fault that was from these, never from the message (the words are the file's to raise)
    oom = None
    if bound is not None and bound.memory_stats is not None and child.guard is not None:
        ooms = max(0, child._ooms())
        if ooms > 0 and child.oom_seen:
            oom = list(child.oom_seen[-1])
        child.oom_base += ooms  # an out-of-memory error that left solve is this call's failure
    if child.guard is not None and child.guard.violations:
        return {"ok": False, "status": "rule_violation", "reason": "sandbox",
                "error": f"the sandbox refused: {child.guard.violations[0]} (kernels may not create processes, "
                         "open sockets, inspect frames or the garbage collector, load libraries or write files)"}
    text = _candidate_traceback(exc)
    if child.adapter is not None:
        try:
            text = child.adapter.clean_error(text)
        except Exception:  # noqa: BLE001 - cleaning must never hide the error itself
            pass
    fatal = "illegal memory access" in text or "CUDA error" in text or "unspecified launch failure" in text
    return {"ok": False, "status": status, "error": text, "fatal": fatal, "gate_failed": gate_failed, "oom": oom}


def _next_message(conn: Connection, receive: Any) -> tuple[dict[str, Any], list[bytes]] | None:
    """The parent's next request and its blobs, or None once the connection has closed."""
    while True:
        try:
            got = receive(conn)
        except (EOFError, OSError):
            return None
        if got is not None:
            return got  # type: ignore[no-any-return]


def main() -> None:
    """Read the config, enter the sandbox, set up, and serve requests until told to exit."""
    config = json.loads(sys.stdin.readline())
    conn = Connection(int(config["fd"]))
    try:
        isolation = enter(Plan(**config["plan"]))
    except SandboxError as exc:
        transport.send(conn, {"ok": False, "status": "infra_error", "reason": "isolation",
                              "error": f"the grader could not isolate the kernel's process: {exc} (set "
                                       "METAKERNEL_ALLOW_UNSANDBOXED=1 to grade without isolation)"})
        return
    if config["kind"] == "probe":  # isolation self-test (metakernel.grader.probe): try, report, leave
        from metakernel.grader.probe import reach

        refuse_after_warmup(isolation, cuda=False)  # what a CPU candidate meets at its import (the probe: no CUDA)
        transport.send(conn, {"ok": True, "isolation": isolation.to_dict(),
                              "probe": reach(json.loads(os.environ["METAKERNEL_PROBE"]))})
        return
    child = Child(config, conn, isolation)
    # Bound before the kernel is imported: a candidate that rewrites transport's globals (a red-teamer replaced
    # `transport.send` through a library helper that updates any object's __dict__) does not reach the replies.
    send, receive = transport.send, transport.receive
    try:
        info = child.setup()
        if config.get("path") is None:  # started ahead of its kernel: warm, then wait for the file
            send(conn, {"ok": True, "warm": True, "isolation": isolation.to_dict(), **info})
            got = _next_message(conn, receive)
            if got is None or got[0].get("op") != "load":
                return  # the parent let this child go unused
            info = child.load(str(got[0]["path"]))
        send(conn, {"ok": True, "ready": True, "isolation": isolation.to_dict(), **info})
    except _Fail as exc:
        send(conn, {"ok": False, "status": exc.status, "reason": exc.reason, "error": exc.text,
                              "isolation": isolation.to_dict()})
        return
    except BaseException as exc:  # noqa: BLE001 - an import-time failure of the candidate is its compile error
        send(conn, {**_failure(child, exc, "compile_error"), "isolation": isolation.to_dict()})
        return
    while True:
        got = _next_message(conn, receive)
        if got is None:
            return
        msg, blobs = got
        if msg.get("op") == "exit":
            send(conn, {"ok": True})
            return
        out_blobs: list[bytes] = []
        try:
            reply, out_blobs = child.handle(msg, blobs)
        except _Fail as exc:
            reply = {"ok": False, "status": exc.status, "reason": exc.reason, "error": exc.text}
        except BaseException as exc:  # noqa: BLE001 - candidate failures are reported, never fatal to the loop
            classify = getattr(child.adapter, "is_compile_error", None)
            reply = _failure(child, exc, "compile_error" if classify and classify(exc) else "runtime_error")
        try:
            send(conn, reply, out_blobs)
        except (TypeError, ValueError) as exc:
            send(conn, {"ok": False, "status": "runtime_error",
                                  "error": f"solve returned something the harness cannot transfer: {exc}"})
        if not reply.get("ok") and (reply.get("fatal") or reply.get("reason") == "sandbox"):
            return


if __name__ == "__main__":
    main()
