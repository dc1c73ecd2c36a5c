"""Static rules on a submitted kernel.py, checked before any code runs (DESIGN.md sections 3 and 4.1).

An AST walk, not a regex: it sees `import triton as t`, `from torch import compile as c`, `torch . jit` and
`getattr`-free attribute chains. It cannot see through `getattr(torch, "com" + "pile")`, which is why the rules
also forbid the reflective escape hatches (`getattr` on modules with computed names is caught at run time by the
launch-count and ablation checks, and `__import__`/`importlib`/`exec`/`eval` are forbidden outright).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

MAX_BYTES = 300 * 1024

#: Modules a candidate may not import, by prefix: other kernel languages and compilers, raw CUDA routes, process
#: and FFI escapes, and the harness itself.
FORBIDDEN_MODULES: dict[str, str] = {
    "triton": "another kernel language (Triton)",
    "torch.utils.cpp_extension": "CUDA C/C++ through cpp_extension",
    "torch._inductor": "torch.compile's compiler",
    "torch._dynamo": "torch.compile's tracer",
    "torch.jit": "TorchScript",
    "torch.cuda.graphs": "CUDA graphs",
    "ctypes": "ctypes (raw library calls)",
    "cffi": "cffi (raw library calls)",
    "subprocess": "subprocesses",
    "multiprocessing": "subprocesses",
    "os": "os (processes, environment and files)",
    "sys": "sys (interpreter and module state)",
    "importlib": "dynamic imports",
    "builtins": "builtins patching",
    "numba": "another kernel compiler (Numba)",
    "cupy": "another kernel route (CuPy RawKernel)",
    "pycuda": "CUDA C through PyCUDA",
    "cuda": "raw CUDA driver/NVRTC bindings",
    "nvrtc": "NVRTC (CUDA C)",
    "tvm.contrib": "library kernels through TVM (cuBLAS, cuDNN, ...)",
    "tvm_ffi": "raw FFI functions (they bypass launch accounting)",
    "metakernel": "the harness",
    "reference": "the problem's reference",
    "inspect": "introspection of the harness",
    "gc": "introspection of the harness",
    "time": "timers",
    "socket": "network access",
    "threading": "threads (work outside the timed call)",
}

#: Attribute chains (matched as dotted suffixes) and the rule they break.
FORBIDDEN_ATTRIBUTES: dict[str, str] = {
    "torch.compile": "torch.compile",
    "torch.jit": "TorchScript",
    "torch.cuda.graph": "CUDA graphs",
    "torch.cuda.CUDAGraph": "CUDA graphs",
    "torch.cuda.make_graphed_callables": "CUDA graphs",
    "load_inline": "CUDA C/C++ through cpp_extension",
    "elapsed_time": "reading or patching timers",
    "cuda.Event": "timers (torch.cuda.Event)",
    "initial_seed": "reading seeds",
    "get_rng_state": "reading seeds",
    "torch.seed": "reading seeds",
    "cuda.seed": "reading seeds",
    "make_inputs": "reusing make_inputs",
    "reference": "calling the reference",
    "__globals__": "introspection",
    "__builtins__": "introspection",
    "__subclasses__": "introspection",
    "torch._C": "torch internals (torch._C)",
    "cublas": "library kernels through the DSL",
    "get_global_func": "raw FFI functions (they bypass launch accounting)",
    "_ffi_api": "raw FFI functions (they bypass launch accounting)",
    "cudnn": "library kernels through the DSL",
}

FORBIDDEN_CALLS: dict[str, str] = {
    "exec": "exec", "eval": "eval", "compile": "compile()", "__import__": "dynamic imports", "open": "file access",
    "breakpoint": "debugger", "globals": "introspection", "vars": "introspection", "setattr": "patching objects",
    "delattr": "patching objects", "make_inputs": "reusing make_inputs", "reference": "calling the reference",
}

DSL_ROOTS = {"cute": ("cutlass",), "tirx": ("tvm",)}


@dataclass(frozen=True)
class Violation:
    """One broken rule with the line it is on."""

    line: int
    rule: str
    detail: str

    def text(self) -> str:
        """`kernel.py:12: forbidden import triton (another kernel language (Triton))`."""
        return f"kernel.py:{self.line}: {self.detail} ({self.rule})"


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


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_rule(name: str) -> str | None:
    for prefix, rule in FORBIDDEN_MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            return rule
    return None


def check_source(source: bytes | str, dsl: str) -> StaticResult:
    """Apply every static rule for the `dsl` variant."""
    raw = source.encode("utf-8") if isinstance(source, str) else source
    if len(raw) > MAX_BYTES:
        return StaticResult(problem=f"kernel.py is {len(raw)} bytes; the limit is {MAX_BYTES} (300 KB)",
                            status="rule_violation")
    try:
        text = raw.decode("utf-8")
        tree = ast.parse(text, filename="kernel.py")
    except UnicodeDecodeError:
        return StaticResult(problem="kernel.py is not UTF-8 text", status="compile_error")
    except SyntaxError as exc:
        return StaticResult(problem=f"kernel.py does not parse: line {exc.lineno}: {exc.msg}", status="compile_error")
    found: list[Violation] = []
    imported_roots: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> dotted module path it stands for
    other_dsl = {root: key for key, roots in DSL_ROOTS.items() if key != dsl for root in roots}

    def check_module(name: str, line: int) -> None:
        imported_roots.add(name.split(".")[0])
        rule = _module_rule(name)
        if rule:
            found.append(Violation(line, rule, f"forbidden import {name}"))
        root = name.split(".")[0]
        if root in other_dsl:
            found.append(Violation(line, f"the {dsl} variant must not use the {other_dsl[root]} DSL",
                                   f"forbidden import {name}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(alias.name, node.lineno)
                aliases[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(Violation(node.lineno, "relative imports", "relative import"))
                continue
            module = node.module or ""
            check_module(module, node.lineno)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if _module_rule(full) and not _module_rule(module):
                    check_module(full, node.lineno)
                aliases[alias.asname or alias.name] = full
                _check_attr(full, node.lineno, found)
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted:
                head, _, rest = dotted.partition(".")
                expanded = f"{aliases[head]}.{rest}" if head in aliases and rest else dotted
                _check_attr(expanded, node.lineno, found)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            rule = FORBIDDEN_CALLS.get(node.func.id)
            if rule and node.func.id not in aliases:
                found.append(Violation(node.lineno, rule, f"forbidden call {node.func.id}()"))
    if not any(root in imported_roots for root in DSL_ROOTS[dsl]):
        found.append(Violation(1, f"the {dsl} variant must use its DSL",
                               f"kernel.py never imports {' or '.join(DSL_ROOTS[dsl])}"))
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "solve" for n in tree.body) \
            and not any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "solve"
                                                          for t in n.targets) for n in tree.body):
        return StaticResult(tuple(_dedupe(found)), problem="kernel.py defines no top-level solve(*inputs)",
                            status="compile_error")
    unique = _dedupe(found)
    return StaticResult(tuple(unique), status="rule_violation" if unique else None)


def _check_attr(dotted: str, line: int, found: list[Violation]) -> None:
    parts = dotted.split(".")
    for pattern, rule in FORBIDDEN_ATTRIBUTES.items():
        pat = pattern.split(".")
        for i in range(len(parts) - len(pat) + 1):
            if parts[i:i + len(pat)] == pat:
                # `reference`/`make_inputs`/`seed` as an attribute of an unrelated object is fine; as a bare
                # module attribute of the problem it is not — only flag them at the head of a chain.
                if pattern in ("reference", "make_inputs") and i != 0:
                    continue
                found.append(Violation(line, rule, f"forbidden use of {dotted}"))
                return


def _dedupe(found: list[Violation]) -> list[Violation]:
    seen: set[tuple[int, str]] = set()
    out = []
    for v in sorted(found, key=lambda v: v.line):
        if (v.line, v.detail) not in seen:
            seen.add((v.line, v.detail))
            out.append(v)
    return out
