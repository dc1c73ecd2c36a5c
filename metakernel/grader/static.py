"""Static rules on a submitted kernel, checked before any of it runs (docs/design.md sections 3 and 4.1).

The candidate reads this file, so the rules are allowlists wherever a kernel's needs are small enough to list
(imports, builtins, class bases, cuda driver names) and judge attributes by name elsewhere, whatever the chain that
reaches them starts at: torch, the DSLs and the standard library re-export each other's modules
(`torch.nn.modules.module.sys`, `cutlass.torch`), so `.sys` is refused on any object. Every way to name an attribute
without writing it (computed `getattr`, `str.format` fields, `__dict__`, `globals()`) is refused, and modules may
only be used as `m.name` so they never hide in a variable. This is a tripwire in front of the OS sandbox and the
runtime audit hook, not a proof of safety; its messages say what to write instead.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from typing import NamedTuple

MAX_BYTES = 300 * 1024
DSL_ROOTS = {"cute": ("cutlass",), "tirx": ("tvm",)}

#: The only modules a kernel may import ("X.*": X and its submodules). Everything else is refused by name.
ALLOWED_IMPORTS: dict[str, tuple[str, ...]] = {
    "common": ("torch", "torch.nn", "torch.nn.functional", "math", "typing", "functools", "itertools",
               "dataclasses", "enum", "__future__", "collections.*", "numbers"),
    "cute": ("cutlass", "cutlass.cute.*", "cutlass.utils.*", "cutlass.pipeline.*", "cutlass.memory",
             "cutlass.tensor_utils", "cuda.bindings.driver"),
    "tirx": ("tvm", "tvm.script", "tvm.script.tirx.*", "tvm.tirx.*", "tvm.runtime", "tvm.target", "tvm.ir",
             "tvm.arith"),
}
#: What a kernel may take from cuda.bindings.driver (a CUstream for the launch); the rest launches, times and loads
#: code behind the DSL's back.
DRIVER_NAMES = ("CUresult", "CUstream")

_STDLIB = "standard-library module reachable through another module: the sandbox forbids it"
_FRAME = "frame, code and traceback internals: introspection of the harness"
#: Attribute names refused on any object: modules that other modules re-export, and interpreter internals.
MODULE_ATTRIBUTES: dict[str, str] = {
    **dict.fromkeys((
        "sys os posix nt gc inspect ctypes cffi subprocess importlib imp pkgutil runpy zipimport site sysconfig "
        "builtins threading socket ssl select selectors http urllib requests ftplib smtplib xmlrpc webbrowser "
        "pickle marshal shelve dbm copyreg shutil pathlib io tempfile glob fileinput codecs gzip bz2 lzma zipfile "
        "tarfile sqlite3 logging signal weakref atexit traceback linecache faulthandler tracemalloc "
        "multiprocessing concurrent asyncio types operator code codeop dis mmap fcntl resource pty tty termios "
        "platform pwd grp getpass time datetime timeit sched random secrets unittest mock pdb bdb "
        "contextlib warnings stdlib_re keyword redirect_stdout redirect_stderr ExitStack enter_context "
        # reachable through tvm and cutlass (tests/test_static_rules.py lists every module a chain reaches): path
        # probes, a clock (uuid1), JSON the harness's reply uses, and helpers no kernel needs
        "osp posixpath genericpath json uuid uuid1 contextvars shlex hashlib zlib errno colorsys textwrap").split(),
        _STDLIB),
    **dict.fromkeys((
        "f_globals f_locals f_back f_builtins f_code f_lasti f_trace tb_frame tb_next gi_frame gi_code cr_frame "
        "cr_code ag_frame ag_code co_code co_consts co_names cell_contents settrace setprofile").split(), _FRAME),
    # modules and ctypes classes other packages re-export under other names (found by a red-teamer; the
    # reachability test in tests/test_static_rules.py walks every allowed root for more)
    **dict.fromkeys(("bltns", "im", "metadata", "c_void_p", "c_uint32", "c_double", "c_char_p", "c_int", "c_int64",
                     "c_uint64", "c_size_t", "c_float", "CDLL", "PyDLL", "cdll", "pydll", "pythonapi"), _STDLIB),
    # NVML's bindings, which torch.cuda imports where installed (the GPU image), star-import ctypes: memmove and
    # friends read and write any address (the walks reached them on the H200 only, in session 23)
    **dict.fromkeys(("pynvml", "memmove", "memset", "string_at", "wstring_at", "create_string_buffer",
                     "create_unicode_buffer", "byref", "addressof", "CFUNCTYPE", "PYFUNCTYPE", "POINTER",
                     "from_address", "from_buffer", "from_buffer_copy", "in_dll"),
                    "ctypes reached through another module (NVML's bindings): raw reads and writes of any address"),
    "select": f"{_STDLIB} (for a tensor, index it: x[:, i])",
    # `tvm.ir.expr.tvm.runtime.tensor(...)`: a DSL reached again through a module that re-exports it, past the rules
    # that judge a name by the chain it hangs from (session 31's red-teamer)
    **dict.fromkeys(("tvm", "cutlass"), "a DSL package reached through another module: import what you use"),
    "torch": "torch reached through another module: `import torch`; for a stream, make_fake_stream("
             "use_tvm_ffi_env_stream=True) or cuda.bindings.driver.CUstream(torch.cuda.current_stream().cuda_stream)",
    **dict.fromkeys(("numpy", "np", "cupy", "numba", "pycuda", "triton"),
                    "another array or kernel library: not on the import allowlist"),
}

_GRAPHS = "CUDA graphs: not allowed"
_ROUTE = "another kernel route (extension, JIT, compiler or vendor library): write the kernel in the DSL"
_HOOKS = "torch function/dispatch hooks and tensor subclasses: outputs must be plain tensors"
_FFI = "raw FFI, extern calls or module loading: they bypass launch accounting"
_TELL = "a kernel must not tell checked calls from timed ones"
_SETTINGS = "global torch settings: the harness's state, not yours"
_CUDA_API = ("the CUDA driver or runtime API reached through CuTe's internals: it copies to and from any address "
             "and launches code behind the DSL (for a stream: cuda.bindings.driver.CUstream)")
_TVM_LIBRARY = ("TVM's operator libraries, graph compiler and auto-schedulers write the kernel for you: write it in "
                "TVMScript (@Tx.prim_func) and build it with tvm.compile")
#: Attribute names refused on any object: features that bypass the DSL, the timing or the outputs' checks.
_PINNED = "page-locked host memory is visible to GPU kernels outside the grader's view: keep the data on the GPU"
_FOREIGN_MEMORY = "memory of another library's allocator: allocate with torch and pass torch tensors"
#: TVM's own tensors and devices (`tvm.runtime.tensor`, `tvm.cuda(0)`): memory of TVM's allocator, which eager code
#: fills without a launch and the isolation ablation does not cover; the TIRx executable takes torch tensors.
TVM_MEMORY_NAMES = frozenset(("tensor", "empty", "nd", "ndarray", "array", "Tensor", "NDArray", "device", "Device",
                              "cuda", "cpu", "cuda_host", "gpu", "rocm", "vulkan", "metal", "opencl"))
#: Attribute and keyword names that make page-locked host memory (`non_blocking` copies to the CPU do).
PINNED_NAMES = ("pin_memory", "is_pinned", "non_blocking")
FEATURE_ATTRIBUTES: dict[str, str] = {
    **dict.fromkeys(("graph", "graphs", "CUDAGraph", "make_graphed_callables", "is_current_stream_capturing"),
                    _GRAPHS),
    **dict.fromkeys(("cpp_extension", "load_inline", "load_library", "library", "higher_order", "py_impl",
                     "compiler", "fx", "onnx", "hub", "package", "serialization"),
                    _ROUTE),
    **dict.fromkeys(("overrides", "TorchFunctionMode", "TorchDispatchMode", "as_subclass"), _HOOKS),
    **dict.fromkeys(("distributed", "nccl"), "distributed runtimes: work outside the timed call"),
    # page-locked host memory is mapped into the GPU's address space, outside every allocation the isolation
    # ablation overwrites: a kernel reaches it by index arithmetic past a tensor argument (docs/integrity.md hole 12)
    **dict.fromkeys(PINNED_NAMES, _PINNED),
    # another library's device memory as a torch tensor (a TVM tensor through DLPack) or filled from the host: eager
    # code could keep an answer there, outside every allocation the isolation ablation overwrites (hole 12)
    # (CuTe's own `cute.runtime.from_dlpack` wraps a torch tensor and stays: `_attribute_reason` lets it through)
    **dict.fromkeys(("from_dlpack", "to_dlpack", "copyfrom", "copyto"), _FOREIGN_MEMORY),
    **dict.fromkeys((
        "contrib ffi tvm_ffi get_global_func list_global_func_names register_func register_global_func get_function "
        "load_module load_static_library import_module system_lib time_evaluator rpc call_packed call_cpacked "
        "call_packed_lowered call_cpacked_lowered tvm_call_packed call_extern call_pure_extern call_intrin "
        "call_pure_intrin call_llvm_intrin call_llvm_pure_intrin Op make_node load_json").split(), _FFI),
    # free-text device source: pasted into the generated CUDA unchecked (a clock register as two joined C literals,
    # `.entry <cuBLAS kernel>` lines that made library kernels count as TIRx's: session 24's red-teamer)
    **dict.fromkeys(("func_call", "iket", "official_event", "iket_official_event", "call_kernel"),
                    "device source written as text (Tx.cuda.func_call, the iket event, call_kernel) is out of the "
                    "grader's sight: write it in TIRx"),
    **dict.fromkeys(("save", "from_file", "fromfile", "tofile", "gds", "GdsFile"), "file access"),
    **dict.fromkeys(("Event", "elapsed_time", "perf_counter", "perf_counter_ns", "time_ns", "monotonic",
                     "monotonic_ns", "process_time", "thread_time", "clock", "clock64", "globaltimer", "Timer",
                     "benchmark"), f"timers: {_TELL}"),
    # TVM's global function registry by name under another spelling (`tvm.ir.EnvFunc.get(name)()`): module writers
    # and loaders, clocks and the registry's setters (session 32's red-teamer wrote a shared library with them and
    # had TVM's C++ loader run it in the child)
    "EnvFunc": _FFI,
    # torch's operator registry by name (`torch.ops.prim.TimePoint()` is a nanosecond clock) and TorchScript,
    # which compiles source text the rules never read (session 32's red-teamer)
    **dict.fromkeys(("ops", "TimePoint", "AddStatValue"),
                    "torch's operator registry by name (torch.ops): call torch's public functions"),
    **dict.fromkeys(("CompilationUnit", "ScriptFunction", "ScriptModule", "ScriptObject", "parse_ir",
                     "parse_schema", "import_ir_module", "import_ir_module_from_buffer", "StaticModule",
                     "ThroughputBenchmark", "FileCheck", "classes", "CompiledFunction"),
                    "TorchScript compiles source text no rule reads: only the DSL compiles"),
    # torch.monitor's events carry a wall-clock datetime, and a datetime's `now()` read on an instance is a
    # microsecond clock under no other refused name (session 32's red-teamer: every ablated call read milliseconds)
    **dict.fromkeys(("monitor", "now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp", "timestamp"),
                    f"wall clocks: {_TELL}"),
    # a loop counting `stream.query()` until the stream drains is a clock: the ablations' own copies on the stream
    # (the isolation's, gigabytes) made it read long in ablated calls only (the protocol 6 review)
    "query": f"polling a stream's progress is a timer: {_TELL} (synchronize when you need the results)",
    **dict.fromkeys(("default_generator", "default_generators", "get_state", "set_state"),
                    f"random-number state: {_TELL}"),
    **dict.fromkeys(("utilization", "temperature", "power_draw", "clock_rate", "list_gpu_processes", "mem_get_info",
                     "CUDAPluggableAllocator"), f"device and allocator state: {_TELL}"),
    **dict.fromkeys(("backends", "tunable", "use_deterministic_algorithms"), _SETTINGS),
    **dict.fromkeys(("attrgetter", "methodcaller", "update_wrapper", "wraps", "getattr_static", "get_type_hints",
                     "ForwardRef", "from_source", "evaluate"),
                    "attribute access or evaluation by computed name"),
    **dict.fromkeys(("format", "format_map"), "str.format reads attributes named in a string: use an f-string"),
    # TVM's pass infrastructure runs Python of the kernel's inside the compiler, after the source was checked, and
    # its instruments time it (a red-teamer's microsecond clock: PassTimingInstrument around a module_pass)
    **dict.fromkeys(("module_pass", "function_pass", "prim_func_pass", "PassContext"),
                    "TVM's pass infrastructure: build with tvm.compile(func, target=...) as it is"),
    # TVM's operator registry: a lowering rule registered for an op runs Python of the kernel's inside the compiler
    # after the source check, and rewrote the host glue into a write at any address (session 29's red-teamer);
    # `tirx_host.registry_state` refuses a build after any change, this names the usual routes
    **dict.fromkeys(("register_intrin_lowering", "register_op_attr", "set_attr", "reset_attr", "set_attrs_type_key",
                     "register_object", "remove_global_func", "register_dispatch", "register_tir_pipeline",
                     "PIPELINE_MAP", "get_tir_pipeline"),
                    "TVM's operator and function registries: build with tvm.compile(func, target=...) as it is"),
    # the DSL parsers' own evaluators and the ast module: a syntax tree built at run time and compiled by them runs
    # code the static rules never read (the audit hook sees only compiled strings)
    **dict.fromkeys(("ast", "parser", "evaluator", "eval_expr", "eval_assign", "redirect_builtin_function",
                     "findsource", "get_func_nonlocals"),
                    "evaluation of code built at run time"),
    **dict.fromkeys(("make_dataclass", "new_class"), "dynamic class creation: write a class statement"),
    # stdlib helpers that write attributes or module globals named by data (a red-teamer's enum.global_enum wrote
    # the harness's module dict; argparse set torch.Tensor.clone by a computed dest)
    **dict.fromkeys(("global_enum", "global_enum_repr", "global_flag_repr", "global_str", "total_ordering",
                     "argparse", "ArgumentParser", "Namespace", "parse_args", "parse_known_args",
                     "parse_intermixed_args", "parse_known_intermixed_args", "add_argument", "Formatter",
                     "get_field", "vformat", "SimpleNamespace", "deepcopy", "copymodule", "astuple", "asdict"),
                    "sets attributes or module globals named by data: assign names of your own"),
    # CuTe's modules that hold the CUDA driver and runtime bindings (`cutlass.cuda.cuda`,
    # `cutlass.utils.hardware_info.driver`, `cutlass.testing.cuda_runtime`, ...; tests/test_static_rules.py walks
    # every chain to them). `cuda` and `driver` themselves are judged by their chain (`_attribute_reason`), since
    # `torch.cuda`, `Tx.cuda.cta_sync` and `cuda.bindings.driver` are the kernels' own API.
    **dict.fromkeys(("cuda_driver cuda_runtime cuda_jit_executor cuda_event_adapter cuda_stream_adapter "
                     "cuda_library_adapter hardware_info testing cutlass_dsl libinfo tvm_ffi_libinfo").split(),
                    _CUDA_API),
    # TVM's operator libraries, graph compiler and schedulers: kernels TVM writes, not TIRx the kernel file writes
    # (`tvm.topi.nn.softmax` scheduled by `tvm.dlight`, a Relax module calling cuBLAS)
    **dict.fromkeys("relax topi te dlight s_tir meta_schedule autotvm auto_scheduler create_prim_func".split(),
                    _TVM_LIBRARY),
    # library functions that read or write any object's __dict__, a function's globals or members by name when
    # called with a module or the harness's objects as `self` (a red-teamer's LRScheduler.load_state_dict(module,
    # ...), inspect_function_capture, getmembers / copy_members; tests/test_static_rules.py scans every function a
    # chain of allowed names reaches for such code)
    **dict.fromkeys(("optim", "lr_scheduler", "swa_utils", "state_dict", "load_state_dict", "distributions",
                     "getmembers", "copy_members", "ast_helpers", "inspect_function_capture",
                     "inspect_class_capture", "base_dsl", "register_buffer", "register_parameter", "extend_path",
                     "find_spec", "update_abstractmethods", "replace_all_batch_norm_modules_", "parametrize",
                     "replicate", "backend", "experimental", "native_struct", "derived_object", "register_object",
                     "register_script_namespace", "kernel_launcher", "transfer_parametrizations_and_params",
                     "new_from_mlir_values", "extract_mlir_values", "extract_mlir_attributes"),
                    "reads or writes any object's attributes or a module's globals: not kernel code"),
    # a compiled object's JIT engine and the class hierarchy behind any value: `type(fn.engine)(module, ...)` built an
    # engine of LLVM host code the file wrote as text, which no check reads (session 28's red-teamer)
    **dict.fromkeys(("engine", "invoke", "raw_lookup", "mro", "capi_func", "jit_module", "BaseDSL", "CuTeDSL",
                     "CutlassBaseDSL", "compile_and_cache", "build_module", "compiler_provider", "jit_cache",
                     # the MLIR objects behind a compiled object or a traced value: a module of any text, ops moved
                     # into the module being traced (session 28's second red-teamer)
                     "ir_module", "owner", "move_before", "move_after"),
                    "the DSL's JIT engines, compiler and class internals: compile with cute.compile / @cute.jit and "
                    "call that"),
}
#: Classes of names, refused on any object.
ATTRIBUTE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)graph"), _GRAPHS),
    (re.compile(r"(?i)triton|inductor|dynamo|jiterator|cubin|nvrtc|nvjitlink|cudart|cublas|cudnn|cufft|curand"
                r"|cusparse|cusolver"), _ROUTE),
    (re.compile(r"(?i)profil"), f"profilers: {_TELL}"),
    # Clocks under other names: TIRx's profiling intrinsics read %globaltimer (Tx.cuda.timer_start), CuTe's
    # cute.arch.globaltimer_lo, TVM's pass timing instrument times any Python callable wrapped as a pass, LLVM's
    # generic intrinsic call reads any special register by a string (session 22's red-teamers)
    (re.compile(r"(?i)^timer_|globaltimer|timing|instrument|cyclecounter|steadycounter|^call_intrinsic$"),
     f"clocks: {_TELL}"),
    (re.compile(r"^(initial_|manual_)?seed(_all)?$|rng_state"), f"random-number state: {_TELL}"),
    (re.compile(r"memory_(allocated|reserved|cached|stats|summary|snapshot|usage|used|fraction)|max_memory"
                r"|peak_memory|mem_pool|MemPool|allocator|empty_cache|ipc_collect"),
     f"allocator state and statistics: {_TELL}"),
    (re.compile(r"^register_module_"), "global module hooks: they see the harness's calls"),
    (re.compile(r"^export"), "exporting compiled code writes files: keep it in memory"),
)
#: In a CuTe file: the MLIR objects behind the DSL's values and the raw dialect builders. An op's `.operation`
#: gave MLIR's `Operation` class, whose `parse` and `create` made any op, and `.parent` / `.regions` / `.blocks`
#: placed a function of the file's own in the module being traced (session 28's fifth red-teamer).
CUTE_IR_NAMES: dict[str, str] = {
    **dict.fromkeys(("operation", "parent", "regions", "blocks", "erase", "parse"),
                    "the MLIR objects and builders behind CuTe's values: write the kernel with cute's API"),
    # memory reached by address: a `cute.Pointer` parameter takes a plain int through TVM-FFI, inline PTX loads
    # and stores at an Int64, `inttoptr` makes a pointer of one (session 29's fourth red-teamer handed the eager
    # answer to a copy kernel each way); no gold kernel needs them
    **dict.fromkeys(("make_ptr", "Pointer", "inline_ptx", "inttoptr"),
                    "raw pointers and inline PTX reach memory the grader cannot see: pass tensors and use cute's "
                    "copy and layout API"),
}
#: Names the DSL owns: fine on a chain of names starting at the DSL (`cute.compile`), refused on anything else.
DSL_ONLY_ATTRIBUTES: dict[str, str] = {
    "compile": "torch.compile / Module.compile is another compiler: only cute.compile or tvm.compile",
    "jit": "TorchScript is another compiler: only the DSL's @cute.jit",
    "memory": "torch.cuda.memory is allocator state (cutlass.memory is fine)",
    "utils": "torch.utils holds extensions, benchmarks and worker processes (the DSL's utils are fine)",
}
#: Refused where the chain starts at torch or at an expression that is not a name (a value that may be torch).
TORCH_ATTRIBUTES: dict[str, str] = {"load": "torch.load reads files and unpickles them"}

_BUILTINS = frozenset(dir(builtins))
_EXCEPTIONS = frozenset(n for n in _BUILTINS if isinstance(getattr(builtins, n), type)
                        and issubclass(getattr(builtins, n), BaseException)) - {"SystemExit", "KeyboardInterrupt"}
#: Builtins a kernel may name; others are refused even when rebound, since scopes are not tracked.
SAFE_BUILTINS = _EXCEPTIONS | frozenset((
    "abs aiter all anext any ascii bin bool bytearray bytes callable chr classmethod complex dict divmod enumerate "
    "filter float format frozenset hex int isinstance issubclass iter len list map max min next object oct "
    "ord pow print property range repr reversed round set slice sorted staticmethod str sum tuple zip "
    "NotImplemented Ellipsis").split())
BUILTIN_REASONS: dict[str, str] = {
    **dict.fromkeys(("eval", "exec"), "runs code from a string"),
    "compile": "compiles code from a string (the DSL's is cute.compile / tvm.compile)",
    # where the interpreter put fresh objects shows what the grader allocated between two points of a call
    # (session 31's sixth red-teamer told audited calls apart by the ids of fresh tensors)
    **dict.fromkeys(("id", "hash"), "object addresses: a kernel must not tell checked calls from timed ones"),
    "open": "file access", "input": "reads the harness's stdin", "breakpoint": "debugger",
    **dict.fromkeys(("globals", "locals", "vars", "dir", "help"), "introspection of module state"),
    **dict.fromkeys(("setattr", "delattr"), "patching objects: assign self.<name> in __init__ instead"),
    **dict.fromkeys(("getattr", "hasattr"), "only getattr(obj, 'constant_name') is allowed"),
    "type": "only type(x) with one argument (or use isinstance)", "super": "only super() without arguments",
}
#: Forbidden builtins that are also refused as attribute names (compile, type and super are DSL / object API).
_BUILTIN_ATTRIBUTES = frozenset(BUILTIN_REASONS) - {"compile", "type", "super", "input", "help", "dir"}
_METHOD_DUNDERS = frozenset({"__init__", "__post_init__", "__call__", "__repr__"})
_NAME_DUNDERS = frozenset({"__name__", "__file__"})
_TEXT_DUNDERS = frozenset({"__main__", "__name__", "__file__", "__init__"})
ALLOWED_BASES = ("torch.nn.Module", "enum.Enum", "enum.IntEnum", "enum.Flag", "enum.IntFlag", "typing.NamedTuple",
                 "typing.Generic", "typing.Protocol")
#: enum's classes (the functional API is theirs); enum's functions and markers (auto, unique) are not.
ENUM_CLASSES = frozenset(("Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "ReprEnum", "EnumType", "EnumMeta"))
_DUNDER = re.compile(r"__\w+__")
_DUNDER_IN_TEXT = re.compile(r"__\w+?__")


@dataclass(frozen=True)
class Violation:
    """One broken rule with the line it is on."""

    line: int
    rule: str
    detail: str
    filename: str = "kernel.py"

    def text(self) -> str:
        """`kernel.py:12: forbidden attribute .sys (standard-library module ...)`."""
        return f"{self.filename}:{self.line}: {self.detail} ({self.rule})"


@dataclass(frozen=True)
class StaticResult:
    """What the static rules found; `problem` is set when the file cannot be checked at all."""

    violations: tuple[Violation, ...] = ()
    problem: str | None = None  # too large / does not parse / no solve
    status: str | None = None  # compile_error | rule_violation | None when clean

    @property
    def ok(self) -> bool:
        """No violations and no problem."""
        return self.status is None


class _Origin(NamedTuple):
    kind: str  # dsl | torch | driver | module | self | local | unknown
    path: str | None = None  # resolved dotted path, when the chain is names and attributes only


class _Checker:
    """One walk over a parsed kernel; scope-insensitive, so anything ambiguous is refused."""

    def __init__(self, tree: ast.Module, dsl: str, filename: str) -> None:
        self.tree, self.dsl, self.filename = tree, dsl, filename
        self.found: list[Violation] = []
        self.allowed = ALLOWED_IMPORTS["common"] + ALLOWED_IMPORTS[dsl]
        self.other_dsl = {root: key for key, roots in DSL_ROOTS.items() if key != dsl for root in roots}
        self.aliases: dict[str, str] = {}  # imported name -> dotted path it stands for
        self.modules: set[str] = set()  # imported names bound to modules
        self.bound: dict[str, set[str]] = {}  # name -> kinds of binding (import, class, other)
        self.selves: set[int] = set()  # ids of `self` parameters of methods
        self.init_selves: set[int] = set()  # ... of __init__ / __post_init__, whose self is always a fresh object
        self.ok_calls: set[int] = set()  # ids of getattr/type/super names in calls of the allowed shape
        self.docstrings: set[int] = set()
        self.parents: dict[int, ast.AST] = {}
        self.uses_dsl = False
        self.methods: dict[str, set[str]] = {}  # class of this file -> the methods taking self (inherited too)

    def flag(self, node: ast.AST | int, rule: str, detail: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        self.found.append(Violation(line, rule, detail, self.filename))

    def run(self) -> list[Violation]:
        nodes = [n for t in [self.tree, *self._string_annotations()] for n in ast.walk(t)]
        for n in nodes:
            for child in ast.iter_child_nodes(n):
                self.parents[id(child)] = n
        self._collect(nodes)
        for n in nodes:
            self._visit(n)
        if not self.uses_dsl:
            self.flag(1, f"the {self.dsl} variant must use its DSL",
                      f"{self.filename} never imports {' or '.join(DSL_ROOTS[self.dsl])}")
        return _dedupe(self.found)

    def _string_annotations(self) -> list[ast.AST]:
        """Annotations written as strings are code a DSL or typing may evaluate: check them as code."""
        out: list[ast.AST] = []
        for n in ast.walk(self.tree):
            notes = [n.annotation] if isinstance(n, (ast.arg, ast.AnnAssign)) else []
            notes += [n.returns] if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            for note in notes:
                if isinstance(note, ast.Constant) and isinstance(note.value, str):
                    try:
                        parsed = ast.parse(note.value.strip(), mode="eval")
                    except SyntaxError:
                        self.flag(note, "annotations written as strings must be expressions",
                                  "string annotation does not parse")
                        continue
                    out.append(ast.increment_lineno(parsed, note.lineno - 1))
        return out

    # -------------------------------------------------------------------------------------------- bindings
    def _collect(self, nodes: list[ast.AST]) -> None:
        own: dict[str, set[str]] = {}  # class -> the methods it defines that take self
        bases: dict[str, list[str]] = {}  # class -> its bases that are plain names
        for n in nodes:
            if isinstance(n, ast.ClassDef):
                own.setdefault(n.name, set())
                bases.setdefault(n.name, []).extend(
                    b.id for b in (b.value if isinstance(b, ast.Subscript) else b for b in n.bases)
                    if isinstance(b, ast.Name))
                for stmt in n.body:
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        params = stmt.args.posonlyargs + stmt.args.args
                        if params and params[0].arg == "self":
                            own[n.name].add(stmt.name)
                            self.selves.add(id(params[0]))
                            if stmt.name in ("__init__", "__post_init__"):
                                self.init_selves.add(id(params[0]))
            body = getattr(n, "body", None)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                    isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                self.docstrings.add(id(body[0].value))
        for n in nodes:
            if isinstance(n, ast.Import):
                for a in n.names:
                    name, path = (a.asname, a.name) if a.asname else (a.name.split(".")[0], a.name.split(".")[0])
                    self._bind(n, name, "import", path)
                    self.modules.add(name)
            elif isinstance(n, ast.ImportFrom):
                for a in n.names:
                    full = f"{n.module}.{a.name}"
                    if a.name != "*":
                        self._bind(n, a.asname or a.name, "import", full)
                    if self._allowlisted(full) == full:
                        self.modules.add(a.asname or a.name)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                self._bind(n, n.id, "other")
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._bind(n, n.name, "class" if isinstance(n, ast.ClassDef) else "other")
            elif isinstance(n, ast.arg):
                self._bind(n, n.arg, "other")
            elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
                self._bind(n, n.name, "other")
            elif isinstance(n, ast.MatchMapping) and n.rest:
                self._bind(n, n.rest, "other")

        def methods(name: str, seen: frozenset[str]) -> set[str]:
            found = set(own.get(name, ()))
            for base in bases.get(name, ()):
                if base in own and base not in seen:
                    found |= methods(base, seen | {base})
            return found

        self.methods = {name: methods(name, frozenset({name})) for name in own}

    def _method_binding(self, n: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """`self` only where Python binds it to the file's own object.

        A static method whose first parameter is `self` takes any object as self (`Peek.raw(obj)`); a static
        `__init__` made `Poke(obj, v)` assign to `obj` (session 24's second red-teamer).
        """
        params = n.args.posonlyargs + n.args.args
        decorated = [_unparse(d) for d in n.decorator_list]
        if params and params[0].arg == "self" and any(d in ("staticmethod", "classmethod") for d in decorated):
            self.flag(n, "methods run on the file's own objects only",
                      f"{decorated[0]} {n.name} takes self: a static or class method has no self")
        if n.name in ("__init__", "__post_init__") and decorated:
            self.flag(n, "methods run on the file's own objects only", f"decorated {n.name}")

    def _own_class_use(self, n: ast.Name) -> str | None:
        """Why a class of this file may not appear here, or None.

        A method read through its class is a plain function: `Peek.sys_of(typing.collections)` ran `return self._sys`
        on a module and handed out `sys` (session 24's red-teamer, when `self._name` was still allowed). So a class
        may be called, subclassed, type-checked, annotated or read for its other attributes (`Config.BLOCK`), and
        held as a value nowhere.
        """
        parent = self.parents.get(id(n))
        if isinstance(parent, ast.Tuple):  # isinstance(x, (A, B))
            parent = self.parents.get(id(parent))
        if isinstance(parent, ast.Attribute) and parent.value is n:
            if parent.attr in self.methods.get(n.id, ()):
                return (f"{n.id}.{parent.attr}: a method read through its class runs on any object as self; call "
                        "it on an instance")
            return None
        if (isinstance(parent, ast.ClassDef) and any(b is n for b in parent.bases)) \
                or (isinstance(parent, ast.Call) and (parent.func is n or (
                    isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "issubclass")))) \
                or n in getattr(parent, "decorator_list", ()) \
                or isinstance(parent, (ast.arg, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef)) \
                or (isinstance(parent, ast.Subscript) and (parent.slice is n or parent.value is n)):
            return None
        return f"class {n.id} used as a value: a class of this file may be called, subclassed or read (Class.NAME)"

    def _bind(self, node: ast.AST, name: str, kind: str, path: str | None = None) -> None:
        kinds = self.bound.setdefault(name, set())
        if path is not None and self.aliases.setdefault(name, path) != path:
            self.flag(node, "one name, one import", f"{name} is imported as both {self.aliases[name]} and {path}")
        if len(kinds | {kind}) > 1 and "import" in kinds | {kind}:
            self.flag(node, "keep imported names as imported: a rebound module name hides what it stands for",
                      f"{name} is both imported and rebound")
        kinds.add(kind)
        if name == "self" and not (isinstance(node, ast.arg) and id(node) in self.selves):
            self.flag(node, "self may only be the first parameter of a method", "self bound here")
        if not isinstance(node, ast.Name) and name in _BUILTINS and name not in SAFE_BUILTINS:
            self.flag(node, BUILTIN_REASONS.get(name, "not on the builtins allowlist; rename it"),
                      f"forbidden name {name}")

    # -------------------------------------------------------------------------------------------- checks
    def _visit(self, n: ast.AST) -> None:
        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and self._enum_value(n):
            self.flag(n, "an Enum class may be subclassed, called with one value, read (Color.RED) or used in "
                      "isinstance and annotations: held as a value, the functional API is called under another name",
                      f"Enum class {_unparse(n)} used as a value")
        if isinstance(n, ast.Import):
            for a in n.names:
                top = a.name.split(".")[0]
                if self._import(n, a.name) and not a.asname and top != a.name and not self._allowlisted(top):
                    self.flag(n, f"{top} itself is not on the allowlist: bind the module you import",
                              f"import {a.name} without `as`")
        elif isinstance(n, ast.ImportFrom):
            self._import_from(n)
        elif isinstance(n, ast.Attribute):
            if isinstance(n.ctx, (ast.Store, ast.Del)):
                self._assignment(n)
            if n.attr == "__init__" and isinstance(n.value, ast.Call) and _is_name(n.value.func, "super"):
                return
            if isinstance(n.value, ast.Call) and _is_name(n.value.func, "type"):
                self.flag(n, "methods run on the file's own objects only",
                          f"type(...).{n.attr}: a method read through a class runs on any object as self")
            self._attribute(n, n.attr, self._origin(n.value), _is_name(n.value, "self"))
            path = self._origin(n).path
            if path in self.allowed and not self._module_use(n):  # `rt = tvm.runtime`: then rt.<name> is unseen
                self.flag(n, f"a module may only be used as {path}.<name> or imported: bind the attribute you need",
                          f"module {path} used as a value")
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)):
            self._assignment(n)
        elif isinstance(n, ast.Call):
            self._call(n)
        elif isinstance(n, ast.Name):
            self._name(n)
        elif isinstance(n, ast.keyword) and n.arg and _DUNDER.fullmatch(n.arg):
            self.flag(n, "dunder keywords build namespaces by hand", f"keyword argument {n.arg}")
        elif isinstance(n, ast.keyword) and n.arg in PINNED_NAMES:
            self.flag(n, _PINNED, f"keyword argument {n.arg}")
        elif isinstance(n, ast.MatchClass):
            for attr in n.kwd_attrs:
                self._attribute(n, attr, _Origin("unknown"), False)
        elif isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)) and id(n) not in self.docstrings:
            text = n.value if isinstance(n.value, str) else n.value.decode("latin-1")
            bad = [d for d in _DUNDER_IN_TEXT.findall(text) if d not in _TEXT_DUNDERS]
            if bad:
                self.flag(n, "a string naming a dunder can be traversed by str.format or reflection",
                          f"string constant containing {bad[0]}")
        elif isinstance(n, ast.ClassDef):
            self._class(n)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._method_binding(n)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _DUNDER.fullmatch(n.name) and \
                n.name not in _METHOD_DUNDERS:
            self.flag(n, f"only {', '.join(sorted(_METHOD_DUNDERS))} may be defined: the others hook into torch, "
                      "pickling or the harness", f"dunder method {n.name}")

    def _import(self, node: ast.AST, path: str) -> bool:
        top = path.split(".")[0]
        if top in self.other_dsl:
            self.flag(node, f"the {self.dsl} variant must not use the {self.other_dsl[top]} DSL",
                      f"forbidden import {path}")
            return False
        self.uses_dsl |= top in DSL_ROOTS[self.dsl]
        base = self._allowlisted(path)
        if base is None:
            self.flag(node, f"not on the {self.dsl} import allowlist: {', '.join(self.allowed)}",
                      f"forbidden import {path}")
        parts = path.split(".")
        for i in range(len(base.split(".")) if base else 1, len(parts)):
            prefix = ".".join(parts[:i])
            self._attribute(node, parts[i], _Origin(self._kind(prefix), prefix), False)
        return True

    def _import_from(self, n: ast.ImportFrom) -> None:
        if n.level or not n.module:
            self.flag(n, f"relative imports: {self.filename} is imported on its own", "relative import")
            return
        fulls = [f"{n.module}.{a.name}" for a in n.names]
        if all(self._allowlisted(f) == f for f in fulls):  # `from cuda.bindings import driver`
            for f in fulls:
                self._import(n, f)
            return
        if not self._import(n, n.module):
            return
        for a, full in zip(n.names, fulls, strict=True):
            if a.name == "*":
                self.flag(n, "star imports hide which names are used", f"from {n.module} import *")
            elif self._allowlisted(full) != full:
                self._attribute(n, a.name, _Origin(self._kind(n.module), n.module), False)

    def _allowlisted(self, path: str) -> str | None:
        for entry in self.allowed:
            base = entry.removesuffix(".*")
            if path == base or (entry.endswith(".*") and path.startswith(base + ".")):
                return base
        return None

    def _kind(self, path: str) -> str:
        top = path.split(".")[0]
        if top in DSL_ROOTS[self.dsl]:
            return "dsl"
        if path == "cuda.bindings.driver" or path.startswith("cuda.bindings.driver."):
            return "driver"
        return "torch" if top == "torch" else "module"

    def _origin(self, node: ast.AST) -> _Origin:
        parts: list[str] = []
        through = False
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            else:
                through = True
                node = node.func if isinstance(node, ast.Call) else node.value
        if not isinstance(node, ast.Name):
            return _Origin("unknown")
        if node.id == "self":
            return _Origin("self")
        if node.id not in self.aliases:
            return _Origin("local")
        path = ".".join([self.aliases[node.id], *reversed(parts)])
        return _Origin(self._kind(path), None if through else path)

    def _attribute(self, node: ast.AST, name: str, origin: _Origin, on_self: bool) -> None:
        reason = self._attribute_reason(name, origin, on_self)
        if reason:
            self.flag(node, reason, f"forbidden attribute .{name}")

    def _attribute_reason(self, name: str, origin: _Origin, on_self: bool) -> str | None:
        if name in _BUILTIN_ATTRIBUTES:  # the builtins module reached under another name (enum.bltns.getattr)
            return f"{name}: {BUILTIN_REASONS[name]}"
        if _DUNDER.fullmatch(name):
            return "dunder attributes reach interpreter internals (only super().__init__)"
        if name.startswith("_"):
            # own objects too: a method can be made to run on another object as self (an unbound call, a static
            # __init__, a class kept by a decorator: session 24's red-teamers), and then self._sys is sys's
            return "private attribute: only public API, on the file's own objects too (self.name, not self._name)"
        if (name == "cuda" and (origin.path or "").split(".")[0] == "cutlass") or (
                name == "driver" and origin.path != "cuda.bindings"):
            return _CUDA_API  # the CUDA bindings under CuTe's names; torch.cuda and cuda.bindings.driver stay
        if name == "ir" and ((origin.path or "").split(".")[0] == "cutlass" or getattr(self, "dsl", None) == "cute"):
            # `cutlass.runtime.ir`, also through a local name (`rt = cutlass.runtime; rt.ir`, session 28)
            return "the MLIR bindings build modules of any text: write the kernel with cute's API (tvm.ir stays)"
        if name in CUTE_IR_NAMES and getattr(self, "dsl", None) == "cute":
            return CUTE_IR_NAMES[name]
        if origin.path in ("tvm", "tvm.runtime") and name in TVM_MEMORY_NAMES:
            return _FOREIGN_MEMORY  # `tvm.runtime.tensor(host, tvm.cuda(0))`: filled inside TVM (the protocol 6 review)
        if name == "from_dlpack" and origin.kind == "dsl" and (origin.path or "").startswith("cutlass.cute"):
            return None  # CuTe's wrapper of a torch tensor: the memory stays torch's, where the isolation reaches
        reason = MODULE_ATTRIBUTES.get(name) or FEATURE_ATTRIBUTES.get(name)
        reason = reason or next((why for pattern, why in ATTRIBUTE_PATTERNS if pattern.search(name)), None)
        if reason:
            return reason
        if not (origin.kind == "dsl" and origin.path is not None):
            reason = DSL_ONLY_ATTRIBUTES.get(name) or (_SETTINGS if name.startswith("set_") else None)
            if reason:
                return reason
        if origin.kind in ("torch", "unknown") and name in TORCH_ATTRIBUTES:
            return TORCH_ATTRIBUTES[name]
        if origin.kind == "driver" and origin.path is not None and name not in DRIVER_NAMES:
            return f"the driver API launches, times and loads code behind the DSL: only {', '.join(DRIVER_NAMES)}"
        return None

    def _assignment(self, target: ast.Attribute | ast.Subscript) -> None:
        base: ast.AST = target
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name) or (base is not target and isinstance(base, ast.Call)):
            return  # `_FNS[key] = fn`, `out.view(-1)[i] = v`: a container or view of your own
        if isinstance(base, ast.Attribute) and _is_name(base.value, "self"):
            if base is not target or self._init_self(target):
                return
        self.flag(target, "patching objects: assign self.<name> in __init__ (then self.<name>[key] anywhere) or "
                  "a name of your own", f"assignment to {_unparse(target)}")

    def _init_self(self, node: ast.AST) -> bool:
        """Whether the `self` that `node` uses is the parameter of an __init__ (unbound calls cannot reach it)."""
        parent = self.parents.get(id(node))
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                params = parent.args.posonlyargs + parent.args.args + parent.args.kwonlyargs
                own = [p for p in params if p.arg == "self"]
                if own:
                    return id(own[0]) in self.init_selves
            parent = self.parents.get(id(parent))
        return False

    def _call(self, n: ast.Call) -> None:
        func = n.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Call) and _is_name(func.func, "type"):
            self.flag(n, "calling the class type() returns runs constructors (the functional Enum API among them) "
                      "under no name: call the class by its name", "type(...)(...)")
        if self._enum_class(func) and (len(n.args) > 1 or any(kw.arg != "value" for kw in n.keywords)):
            self.flag(n, "the functional Enum API makes members of names built at run time (dunders among them): "
                      "write an Enum class statement", f"{_unparse(func)}(...) with member names")
        if called == "dataclass":  # it sets attributes on the class it is given: only a class of this file's own
            parent = self.parents.get(id(n))
            decorating = isinstance(parent, ast.ClassDef) and any(d is n for d in parent.decorator_list)
            if not (decorating and not n.args) and not (n.args and all(
                    isinstance(a, ast.Name) and self.bound.get(a.id) == {"class"} for a in n.args)):
                self.flag(n, "dataclass() sets attributes on the class it is given: decorate a class of your own",
                          "dataclass() of a class this file does not define")
        if not isinstance(func, ast.Name) or func.id not in ("getattr", "hasattr", "type", "super"):
            return
        name = n.args[1] if len(n.args) in (2, 3) and func.id in ("getattr", "hasattr") else None
        constant = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
        if constant is not None:
            self._attribute(n, constant, self._origin(n.args[0]), _is_name(n.args[0], "self"))
        shapes = {"super": not n.args or (len(n.args) == 2 and _is_name(n.args[1], "self")), "type": len(n.args) == 1}
        if shapes.get(func.id, constant is not None) and not n.keywords:
            self.ok_calls.add(id(func))

    def _enum_value(self, n: ast.Name | ast.Attribute) -> bool:
        """An Enum class (enum's own or one of this file) anywhere but a base, a call, a read or a type check.

        `E = enum.Enum; E("_R", [...])`, `functools.partial(enum.Enum, ...)`: the functional API under another name
        (session 22's red-teamer).
        """
        path = self._origin(n).path or ""
        if path.startswith("enum.") and path.removeprefix("enum.") not in ENUM_CLASSES:
            return False  # enum.auto, enum.unique, ...: functions and markers
        if not self._enum_class(n):
            return False
        parent = self.parents.get(id(n))
        if isinstance(parent, ast.Tuple):  # isinstance(x, (A, B))
            parent = self.parents.get(id(parent))
        return not (
            (isinstance(parent, ast.ClassDef) and any(b is n for b in parent.bases))
            or (isinstance(parent, ast.Call) and (parent.func is n or (
                isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "issubclass"))))
            or (isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is n)
            or n in getattr(parent, "decorator_list", ())
            or isinstance(parent, (ast.arg, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef))
            or (isinstance(parent, ast.Subscript) and parent.slice is n))

    def _enum_class(self, func: ast.AST, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `func` names enum's classes or a class of this file derived from one.

        Calling one with names is the functional API: session 21's red-teamer made `__reduce_ex__` a member.
        """
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return False
        path = self._origin(func).path or ""
        if path == "enum" or path.startswith("enum."):
            return True
        if not (isinstance(func, ast.Name) and self.bound.get(func.id) == {"class"}) or func.id in seen:
            return False
        return any(self._enum_class(base.value if isinstance(base, ast.Subscript) else base, seen | {func.id})
                   for node in ast.walk(self.tree) if isinstance(node, ast.ClassDef) and node.name == func.id
                   for base in node.bases)

    def _name(self, n: ast.Name) -> None:
        if isinstance(n.ctx, ast.Load) and "class" in self.bound.get(n.id, ()):
            reason = self._own_class_use(n)
            if reason:
                self.flag(n, "methods run on the file's own objects only", reason)
        if _DUNDER.fullmatch(n.id):
            if n.id not in _NAME_DUNDERS:
                self.flag(n, "dunder names reach interpreter internals (only __name__, __file__)",
                          f"forbidden name {n.id}")
        elif n.id in _BUILTINS and n.id not in SAFE_BUILTINS and id(n) not in self.ok_calls:
            self.flag(n, BUILTIN_REASONS.get(n.id, "not on the builtins allowlist"), f"forbidden name {n.id}")
        elif n.id in self.modules and not self._module_use(n):
            self.flag(n, f"a module may only be used as {n.id}.<name> or {n.id}(...): bind the attribute you need",
                      f"module {n.id} used as a value")
        elif isinstance(n.ctx, ast.Load) and n.id not in self.bound and n.id not in _BUILTINS:
            self.flag(n, f"never defined in {self.filename}: the harness's names are not reachable",
                      f"undefined name {n.id}")

    def _module_use(self, n: ast.Name | ast.Attribute) -> bool:
        parent = self.parents.get(id(n))
        return isinstance(n.ctx, ast.Load) and (
            (isinstance(parent, ast.Attribute) and parent.value is n)
            or (isinstance(parent, ast.Call) and (parent.func is n or (id(parent.func) in self.ok_calls
                                                                       and parent.args[0] is n)))
            or n in getattr(parent, "decorator_list", ()))

    def _class(self, n: ast.ClassDef) -> None:
        for kw in n.keywords:
            self.flag(n, "metaclasses and class keywords hook class creation", f"class keyword {kw.arg or '**'}")
        for base in n.bases:
            expr = base.value if isinstance(base, ast.Subscript) else base
            kinds = self.bound.get(expr.id, set()) if isinstance(expr, ast.Name) else set()
            origin = self._origin(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else _Origin("unknown")
            if (isinstance(expr, ast.Name) and ((kinds == {"class"}) or (not kinds and expr.id in SAFE_BUILTINS))) \
                    or origin.path in ALLOWED_BASES:
                continue
            text = _unparse(base)
            why = "outputs must be plain tensors" if text.endswith("Tensor") else \
                "no torch function/dispatch modes" if text.endswith("Mode") else \
                f"bases allowed: builtins, this file's classes, {', '.join(ALLOWED_BASES)}"
            self.flag(n, why, f"forbidden base class {text}")


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _unparse(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _defines_solve(tree: ast.Module) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "solve" for n in tree.body) or \
        any(isinstance(n, ast.Assign) and any(_is_name(t, "solve") for t in n.targets) for n in tree.body)


def _parse(text: str, filename: str) -> ast.Module:
    """ast.parse, up to twice more on CPython 3.11's thread-unsafe "AST constructor recursion depth mismatch".

    Python 3.11's traceback formatting parses source lines too; any thread doing so beside the static check trips
    the interpreter's shared AST depth counter (a CI run graded a correct file `infra_error/harness` so, while a
    child started ahead failed in a background thread). A later parse sees a settled counter.
    """
    for _ in range(2):
        try:
            return ast.parse(text, filename=filename)
        except SystemError:
            pass
    return ast.parse(text, filename=filename)


def check_source(source: bytes | str, dsl: str, filename: str = "kernel.py") -> StaticResult:
    """Apply every static rule for the `dsl` variant; messages call the file `filename`."""
    raw = source.encode("utf-8") if isinstance(source, str) else source
    if len(raw) > MAX_BYTES:
        return StaticResult(problem=f"{filename} is {len(raw)} bytes; the limit is {MAX_BYTES} (300 KB)",
                            status="rule_violation")
    try:
        tree = _parse(raw.decode("utf-8"), filename)
    except UnicodeDecodeError:
        return StaticResult(problem=f"{filename} is not UTF-8 text", status="compile_error")
    except SyntaxError as exc:
        return StaticResult(problem=f"{filename} does not parse: line {exc.lineno}: {exc.msg}",
                            status="compile_error")
    except (ValueError, RecursionError, MemoryError) as exc:
        return StaticResult(problem=f"{filename} does not parse: {exc}", status="compile_error")
    try:
        found = _Checker(tree, dsl, filename).run()
    except RecursionError:
        found = [Violation(1, "nesting too deep to check", f"{filename} is too deeply nested", filename)]
    if not _defines_solve(tree):
        return StaticResult(tuple(found), problem=f"{filename} defines no top-level solve(*inputs)",
                            status="compile_error")
    return StaticResult(tuple(found), status="rule_violation" if found else None)


def _dedupe(found: list[Violation]) -> list[Violation]:
    seen: set[tuple[int, str]] = set()
    out = []
    for v in sorted(found, key=lambda v: v.line):
        if (v.line, v.detail) not in seen:
            seen.add((v.line, v.detail))
            out.append(v)
    return out


def attribute_reason(name: str, chain: str | None = None) -> str | None:
    """Why an attribute of that name is refused (None: allowed).

    Read on an object of your own or, given `chain`, at the end of that dotted chain of names from an import.

    The audit hook applies it to strings compiled at run time (type expressions) and a test applies it to every
    public name reachable from the allowed imports, each on its own chain.
    """
    checker = _Checker.__new__(_Checker)
    if chain is None:
        return checker._attribute_reason(name, _Origin("local"), False)
    root = chain.split(".")[0]
    checker.dsl = next((dsl for dsl, roots in DSL_ROOTS.items() if root in roots), "cute")
    return checker._attribute_reason(name, _Origin(checker._kind(chain), chain), False)
