"""Documents from the installed DSL packages: walk `cutlass.cute` & co. and TVMScript TIRx, one document per object.

Separate from `docs_index` because reading installed packages is its own craft, unrelated to storing and searching
text: importing the DSLs in a contained environment, walking their public submodules, and turning each public
function, class, namespace and constant into a document (signature without MLIR plumbing, docstring, members),
with every other name of the same object kept as an alias. `docs_index` calls `package_documents` when it builds
the index and stores what comes back; `Doc`, the document both modules pass around, lives here so neither imports
the other's internals.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib
import inspect
import os
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

#: The DSLs documented, as the docs index names them (`Doc.dsl`; "" is DSL-neutral).
DSLS = ("cute", "tirx")
#: Modules documented per DSL: (module, walk its public submodules). Earlier roots win the name of an object
#: reachable from several places (`cute.make_layout`, not `cute.core.make_layout`). `tvm.script.tirx` is the
#: module `tvm.tirx.script`.
ROOTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "cute": (("cutlass.cute", True), ("cutlass", False), ("cutlass.utils", True), ("cutlass.pipeline", True)),
    "tirx": (("tvm.tirx.script", True), ("tvm.tirx", True), ("tvm", False), ("tvm.target", False)),
}
#: How kernels spell these modules (`import cutlass.cute as cute`, `from tvm.script import tirx as Tx`).
DISPLAY = (("cutlass.cute", "cute"), ("tvm.tirx.script", "Tx"))
#: MLIR plumbing every CuTe op takes; it only lengthens signatures.
_HIDDEN_PARAMS = frozenset({"loc", "ip"})
#: The most characters one document's body keeps (guides and user docs are capped alike).
BODY_CAP = 20000


@dataclass(frozen=True)
class Doc:
    """One searchable document: a guide section, one public function/class, or a section of a user doc."""

    doc_id: str
    dsl: str
    title: str
    body: str
    #: Other names of the same object (`cute.core.make_layout`, each of the `Tx.float32`-like dtype objects);
    #: `read` and exact-name search resolve them.
    aliases: tuple[str, ...] = ()


def _display(qualname: str) -> str:
    for prefix, short in DISPLAY:
        if qualname == prefix or qualname.startswith(prefix + "."):
            return short + qualname[len(prefix):]
    return qualname


@contextlib.contextmanager
def _import_environment() -> Iterator[None]:
    """Imports print banners and CuTe may need a target arch on a GPU-less machine; keep both contained."""
    added = "CUTE_DSL_ARCH" not in os.environ
    if added:
        os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notes of upstream modules are not ours to show
            yield
    finally:
        if added:
            os.environ.pop("CUTE_DSL_ARCH", None)


def _import(name: str, failures: dict[str, str]) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as exc:  # any import failure is recorded, not fatal: index the rest
        failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return None


def _modules(root: str, walk: bool, failures: dict[str, str]) -> list[ModuleType]:
    """The root module and (when `walk`) its public submodules, shallowest first; private packages not entered."""
    top = _import(root, failures)
    if top is None:
        return []
    found = [top]
    stack = [top] if walk else []
    while stack:
        pkg = stack.pop()
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", []), pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            module = _import(info.name, failures)
            if module is not None:
                found.append(module)
                if info.ispkg:
                    stack.append(module)
    return sorted(found, key=lambda m: (m.__name__.count("."), m.__name__))


def _public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if not isinstance(names, (list, tuple)):
        names = sorted(vars(module))
    return [n for n in names if isinstance(n, str) and not n.startswith("_")]


def _home_module(obj: Any) -> str:
    target = obj.func if isinstance(obj, functools.partial) else obj
    if inspect.isroutine(target) or inspect.isclass(target):
        return getattr(target, "__module__", None) or ""
    return type(target).__module__


#: Object addresses in reprs would change the content hash on every build.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _clean(text: str) -> str:
    """Shorten qualified type names (`cutlass.cute.typing.Layout` -> `Layout`) and drop object addresses."""
    text = _ADDRESS.sub("", text)
    text = re.sub(r"ForwardRef\('([^']*)'\)", r"\1", text)
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [p for p in sig.parameters.values() if p.name not in _HIDDEN_PARAMS]
    return _clean(str(sig.replace(parameters=params)))


def _doc(obj: Any) -> str:
    if inspect.isclass(obj):
        raw = obj.__dict__.get("__doc__")
        return inspect.cleandoc(raw) if isinstance(raw, str) else ""
    try:
        return _ADDRESS.sub("", inspect.getdoc(obj.func if isinstance(obj, functools.partial) else obj) or "")
    except Exception:  # a broken __doc__ descriptor must not stop the build
        return ""


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n", 1)[0].replace("\n", " ").strip()
    first = re.split(r"(?<=\.)\s", first, maxsplit=1)[0]
    return first if len(first) <= 90 else first[:87] + "..."


def _member_lines(cls: type, package: str) -> list[str]:
    """One line per public method/property/enum member of a class, own package's classes only (not `object`)."""
    if issubclass(cls, enum.Enum):
        return [f"  {name} = {_clean(repr(m.value))[:60]}" for name, m in list(cls.__members__.items())[:80]]
    lines, seen = [], set()
    for klass in cls.__mro__:
        if not (getattr(klass, "__module__", None) or "").startswith(package):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(attr, property):
                lines.append(f"  {name} (property) — {_summary(_doc(attr.fget) if attr.fget else '')}")
            elif isinstance(attr, (staticmethod, classmethod)) or inspect.isroutine(attr):
                func = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
                lines.append(f"  {name}{_signature(func)} — {_summary(_doc(func))}")
    return lines[:120]


class _Collector:
    """Turns the public names of a DSL's modules into documents, one per object; other names become aliases."""

    def __init__(self, dsl: str, package: str) -> None:
        self.dsl, self.package = dsl, package
        self.docs: dict[str, Doc] = {}
        self.aliases: dict[str, list[str]] = {}
        self.seen: dict[int, str] = {}
        # `seen` is keyed by id(); namespaces hand out fresh objects per access, and a freed object's id is
        # reused by the next one, so every keyed object is kept alive until the collection ends.
        self._alive: list[Any] = []

    def _remember(self, obj: Any, doc_id: str) -> None:
        self.seen[id(obj)] = doc_id
        self._alive.append(obj)

    def _add(self, obj: Any, name: str, title_doc: str, body: str) -> bool:
        """Add a document for `obj` unless it has one already (then `name` is an alias); True when added."""
        target = getattr(obj, "__func__", obj)
        if id(target) in self.seen:
            self.aliases[self.seen[id(target)]].append(name)
            return False
        doc_id = f"{self.dsl}:{name}"
        while doc_id in self.docs:
            doc_id += "~"
        self._remember(target, doc_id)
        self.aliases[doc_id] = []
        title = f"{name}: {_summary(title_doc)}" if title_doc.strip() else name
        self.docs[doc_id] = Doc(doc_id, self.dsl, title, body[:BODY_CAP])
        return True

    def routine(self, obj: Any, name: str) -> None:
        doc = _doc(obj)
        self._add(obj, name, doc, f"{name}{_signature(obj)}\n\n{doc}".strip())

    def klass(self, cls: type, name: str) -> None:
        doc = _doc(cls)
        bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
        head = f"class {name}" + (f"({bases})" if bases else "")
        if not issubclass(cls, enum.Enum):
            head += f"\n{name}{_signature(cls)}"
        members = _member_lines(cls, self.package)
        body = head + (f"\n\n{doc}" if doc else "") + ("\n\nMembers:\n" + "\n".join(members) if members else "")
        self._add(cls, name, doc, body)

    def namespace(self, obj: Any, name: str, members: list[str]) -> None:
        """An object like `Tx.cuda` or `Tx.ptx`: a document listing its callables, then one per callable."""
        doc = inspect.cleandoc(type(obj).__doc__ or "")
        lines = [f"  {name}.{m} — {_summary(_doc(getattr(obj, m)))}" for m in members]
        if self._add(obj, name, doc, f"{name} (namespace)\n\n{doc}\n\nMembers:\n" + "\n".join(lines)):
            for member in members:
                self.routine(getattr(obj, member), f"{name}.{member}")

    def instances(self, prefix: str, group: list[tuple[str, Any]]) -> None:
        """Objects of one type (`Tx.float32`, `Tx.int8`, ...): one document naming them all, each name an alias."""
        fresh = []
        for attr, obj in group:
            if id(obj) in self.seen:
                self.aliases[self.seen[id(obj)]].append(f"{prefix}.{attr}")
            else:
                fresh.append((attr, obj))
        if not fresh:
            return
        first = fresh[0][1]
        kind = type(first)
        doc = inspect.cleandoc(kind.__doc__ or "")
        call = f"\nCalled as: {fresh[0][0]}{_signature(first)}" if callable(first) else ""
        if len(fresh) == 1:
            name = f"{prefix}.{fresh[0][0]}"
        else:
            name = f"{prefix}.{kind.__name__}-objects"
            doc = f"{kind.__name__} objects: {', '.join(a for a, _ in fresh)}\n\n{doc}"
        members = _member_lines(kind, self.package)
        body = f"{name}{call}\n\n{doc}".strip() + ("\n\nMembers:\n" + "\n".join(members) if members else "")
        self._add(first, name, doc, body)
        if len(fresh) > 1:
            for attr, obj in fresh:
                self._remember(obj, self.seen[id(first)])
                self.aliases[self.seen[id(first)]].append(f"{prefix}.{attr}")

    def _object(self, obj: Any, prefix: str, attr: str, groups: dict[type, list[tuple[str, Any]]]) -> None:
        name = f"{prefix}.{attr}"
        if inspect.isclass(obj):
            self.klass(obj, name)
        elif inspect.isroutine(obj) or isinstance(obj, functools.partial):
            self.routine(obj, name)
        else:  # instances: namespaces (`Tx.cuda`), dtype objects, scope markers; sorted out per type below
            groups.setdefault(type(obj), []).append((attr, obj))

    def module(self, module: ModuleType, failures: dict[str, str]) -> None:
        """Document a module (docstring, public names, constants), then its public objects one by one.

        One object that cannot be inspected is recorded in `failures` and skipped.
        """
        prefix = _display(module.__name__)
        groups: dict[type, list[tuple[str, Any]]] = {}
        constants = []
        exported = set(getattr(module, "__all__", None) or ())
        listed = []
        for attr in _public_names(module):
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    obj = getattr(module, attr)
                if any(issubclass(w.category, DeprecationWarning) for w in caught):
                    continue  # a deprecated spelling: agents should find the current one
                if isinstance(obj, (bool, int, float, str, enum.Enum)):
                    if attr.isupper() or attr in exported:  # not every module-level value is API
                        constants.append(f"  {attr} = {_clean(repr(obj))[:80]}")
                elif not inspect.ismodule(obj) and _home_module(obj).startswith(self.package):
                    listed.append(attr)
                    self._object(obj, prefix, attr, groups)
            except AttributeError:
                continue  # a stale upstream `__all__` entry: nothing to document
            except Exception as exc:  # one odd object must not cost the whole package's docs
                failures[f"{module.__name__}.{attr}"] = f"{type(exc).__name__}: {exc}"[:300]
        for group in groups.values():
            attr, obj = group[0]
            members = [m for m in dir(obj) if not m.startswith("_") and callable(_safe_getattr(obj, m))]
            if len(group) == 1 and members and not callable(obj):
                self.namespace(obj, f"{prefix}.{attr}", members)
            else:
                self.instances(prefix, group)
        doc = inspect.cleandoc(module.__doc__ or "")
        body = f"{prefix} (module)" + (f"\n\n{doc}" if doc else "")
        if listed:
            body += "\n\nPublic names: " + ", ".join(listed)
        if constants:
            body += "\n\nConstants:\n" + "\n".join(constants)
        self._add(module, prefix, doc or f"module {prefix}.", body)

    def documents(self) -> list[Doc]:
        out = []
        for doc_id, doc in self.docs.items():
            aliases = tuple(dict.fromkeys(self.aliases.get(doc_id, [])))
            if aliases:
                shown = ", ".join(aliases[:6]) + (f" (+{len(aliases) - 6} more)" if len(aliases) > 6 else "")
                doc = Doc(doc.doc_id, doc.dsl, doc.title, f"{doc.body}\n\nAlso reachable as: {shown}", aliases)
            out.append(doc)
        return out


def _safe_getattr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except Exception:  # properties of half-initialised namespace objects
        return None


def package_documents(dsl: str, failures: dict[str, str]) -> list[Doc]:
    """Documents for one DSL's installed packages; import failures land in `failures` (module -> cause).

    Modules are visited shallowest display name first (`cute`, `cutlass`, then `cute.arch`, ...), so an object
    exported in several places is named where kernels usually reach it; the other names become aliases.
    """
    collector = _Collector(dsl, ROOTS[dsl][0][0].split(".")[0])
    with _import_environment():
        if dsl == "tirx":
            _import("torch", failures)  # the harness imports torch before tvm; do the same
        modules: dict[str, ModuleType] = {}
        for root, walk in ROOTS[dsl]:
            for module in _modules(root, walk, failures):
                modules.setdefault(module.__name__, module)
        ordered = sorted(modules.values(), key=lambda m: _display(m.__name__).count("."))
        for module in ordered:
            collector.module(module, failures)
    return collector.documents()
