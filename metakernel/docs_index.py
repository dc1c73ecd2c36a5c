"""The docs an agent searches: our guides plus the installed DSL packages' docstrings, in one SQLite FTS5 index.

We do not ship upstream documentation; the index is built on the machine from what is installed (docstrings and
signatures of `cutlass.cute` & co. and of TVMScript TIRx), so it always describes the DSL versions the grader
runs. The file name carries a version key (builder version, guide hash, DSL package versions): upgrading a DSL or
editing a guide builds a fresh index instead of serving stale text, and `identity()` names it in an experiment's
provenance. A user's local copy of upstream docs (`metakernel docs build --from PATH`) goes into a separate index
beside it and is searched together with it.

Agents type anything into `docs_search`, so every query is reduced to quoted FTS5 phrases: operators, quotes and
punctuation never reach FTS5 as syntax, and an empty query gets a message instead of an error.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import enum
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import pkgutil
import re
import sqlite3
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from metakernel.errors import UserError
from metakernel.paths import guides_dir

#: Bump when the extraction or the schema changes: the version key changes and old indexes are left alone.
BUILDER_VERSION = 1
DSLS = ("cute", "tirx")
#: What an index can be built from; tests build from "guides" alone to avoid importing the DSLs.
SOURCES = ("guides", "cute", "tirx")
DEFAULT_MAX_CHARS = 12000
MAX_K = 50
#: The distribution each DSL comes from (its version goes into the version key).
PACKAGES = {"cute": "nvidia-cutlass-dsl", "tirx": "apache-tvm"}
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
_USER_SUFFIXES = (".md", ".rst", ".txt", ".py")
_BODY_CAP = 20000
_OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})


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


@dataclass(frozen=True)
class Hit:
    """One search result; `snippet` is one line of the body around the match."""

    doc_id: str
    dsl: str
    title: str
    snippet: str


@dataclass
class BuildReport:
    """What a build produced: where, how many documents per source, how long, and which imports failed."""

    path: Path
    version_key: str
    n_docs: int
    counts: dict[str, int]
    failures: dict[str, str]
    seconds: float
    size_bytes: int


class DocsQueryError(UserError):
    """A query with nothing to search for (empty, or only punctuation and operators)."""


# ---------------------------------------------------------------------------------------------- locations & keys


def docs_dir() -> Path:
    """`METAKERNEL_DOCS_DIR`, else `<METAKERNEL_CACHE_DIR or ~/.cache/metakernel>/docs`."""
    override = os.environ.get("METAKERNEL_DOCS_DIR")
    if override:
        return Path(override)
    return Path(os.environ.get("METAKERNEL_CACHE_DIR") or Path.home() / ".cache" / "metakernel") / "docs"


def package_version(dsl: str) -> str:
    """The installed version of a DSL's distribution, "none" when it is not installed (read without importing)."""
    try:
        return importlib.metadata.version(PACKAGES[dsl])
    except importlib.metadata.PackageNotFoundError:
        return "none"


def guides_sha256() -> str:
    """sha256 over the guide files' names and bytes, so an edited guide gets a new index."""
    digest = hashlib.sha256()
    for path in sorted(guides_dir().glob("*.md")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def default_sources() -> tuple[str, ...]:
    """`METAKERNEL_DOCS_SOURCES` (comma-separated, e.g. "guides,tirx" on a machine with one DSL), else all."""
    value = os.environ.get("METAKERNEL_DOCS_SOURCES", "")
    chosen = tuple(s.strip() for s in value.split(",") if s.strip()) or SOURCES
    _check_sources(chosen)
    return chosen


def version_key(sources: Sequence[str] | None = None) -> str:
    """The key naming an index: builder version, guide hash and DSL versions of the chosen sources."""
    sources = default_sources() if sources is None else sources
    _check_sources(sources)
    parts = [f"b{BUILDER_VERSION}"]
    if "guides" in sources:
        parts.append("g" + guides_sha256()[:12])
    parts += [f"{dsl}{package_version(dsl)}" for dsl in DSLS if dsl in sources]
    return "-".join(parts)


def index_path(sources: Sequence[str] | None = None, directory: Path | None = None) -> Path:
    """Where the index of these sources lives (the name carries the version key)."""
    return (directory or docs_dir()) / f"docs-{version_key(sources)}.sqlite"


def user_index_path(directory: Path | None = None) -> Path:
    """The separate index of a user's local docs (`docs build --from`), searched together with the main one."""
    return (directory or docs_dir()) / "user-docs.sqlite"


def _check_sources(sources: Sequence[str]) -> None:
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise UserError(f"unknown docs sources {', '.join(unknown) or '(none)'} (choose from {', '.join(SOURCES)})")


# ------------------------------------------------------------------------------------------------------ guides


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def split_markdown(text: str, max_level: int = 2) -> list[tuple[str, str]]:
    """Split Markdown into (heading, section text) at headings up to `max_level`, ignoring `#` inside fences.

    The text before the first split (a `#` title and its intro) is the section "Overview".
    """
    sections: list[tuple[str, list[str]]] = [("Overview", [])]
    fence = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            fence = "" if fence == stripped[:3] else (fence or stripped[:3])
            sections[-1][1].append(line)
            continue
        match = None if fence else re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        starts_text = len(sections) == 1 and not any(ln.strip() for ln in sections[0][1])
        if match and len(match.group(1)) <= max_level and not starts_text:
            sections.append((match.group(2).replace("`", "").strip(), [line]))
        else:
            sections[-1][1].append(line)
    return [(heading, "\n".join(lines).strip()) for heading, lines in sections if "\n".join(lines).strip()]


def guide_documents(directory: Path | None = None) -> list[Doc]:
    """One document per `##` section of each guide (`guide:<dsl>#<slug>`); the intro becomes `#overview`."""
    docs = []
    for path in sorted((directory or guides_dir()).glob("*.md")):
        dsl = path.stem if path.stem in DSLS else ""
        name = {"cute": "CuTe DSL", "tirx": "TIRx"}.get(path.stem, path.stem)
        seen: set[str] = set()
        for heading, body in split_markdown(path.read_text(encoding="utf-8")):
            slug = _unique(_slug(heading), seen)
            docs.append(Doc(f"guide:{path.stem}#{slug}", dsl, f"{name} guide: {heading}", body))
    return docs


def _unique(slug: str, seen: set[str]) -> str:
    base, n = slug, 1
    while slug in seen:
        n += 1
        slug = f"{base}-{n}"
    seen.add(slug)
    return slug


# ------------------------------------------------------------------------------------------- installed packages


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
        self.docs[doc_id] = Doc(doc_id, self.dsl, title, body[:_BODY_CAP])
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


# ------------------------------------------------------------------------------------------------- user docs


def _split_rst(text: str) -> list[tuple[str, str]]:
    """Sections at reStructuredText titles (a line underlined by a run of one punctuation character)."""
    lines = text.splitlines()
    marks = "=-~^\"'`#*+"
    titles = [i - 1 for i in range(1, len(lines))
              if lines[i - 1].strip() and not set(lines[i - 1].strip()) <= set(marks)
              and len(set(lines[i].strip())) == 1 and lines[i].strip()[0] in marks
              and len(lines[i].strip()) >= max(3, len(lines[i - 1].strip()))]
    starts = ([0] if not titles or titles[0] > 0 else []) + titles
    out = []
    for a, b in zip(starts, [*starts[1:], len(lines)], strict=True):
        body = "\n".join(lines[a:b]).strip()
        if body:
            out.append((lines[a].strip() if a in titles else "Overview", body))
    return out


def _split_python(text: str) -> list[tuple[str, str]]:
    """Module docstring, then one section per top-level def/class with its source (examples are code)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [("Source", text)]
    out = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append(("Overview", doc))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, ast.get_source_segment(text, node) or node.name))
    return out or [("Source", text)]


def _guess_dsl(relative: Path) -> str:
    words = set(re.split(r"[^a-z0-9]+", str(relative).lower()))
    if words & {"cute", "cutlass", "cutedsl"}:
        return "cute"
    if words & {"tvm", "tirx", "tvmscript", "tir"}:
        return "tirx"
    return ""


def user_documents(root: Path, dsl: str | None = None) -> list[Doc]:
    """Documents from a local docs tree (.md/.rst/.txt/.py), split by headings; ids are `user:<path>#<slug>`.

    The DSL is `dsl` when given, else guessed from the path ("cutlass"/"cute" or "tvm"/"tirx" in it), else neutral.
    """
    if not root.exists():
        raise UserError("no such file or directory", str(root))
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    docs = []
    for path in files:
        if path.suffix.lower() not in _USER_SUFFIXES or any(part.startswith(".") for part in path.parts[-3:]):
            continue
        relative = path.relative_to(root) if root.is_dir() else Path(path.name)
        text = path.read_text(encoding="utf-8", errors="replace")
        suffix = path.suffix.lower()
        if suffix == ".rst":
            sections = _split_rst(text)
        elif suffix == ".py":
            sections = _split_python(text)
        else:
            sections = split_markdown(text, max_level=3)
        seen: set[str] = set()
        for heading, body in sections:
            slug = _unique(_slug(heading), seen)
            docs.append(Doc(f"user:{relative.as_posix()}#{slug}", dsl if dsl is not None else _guess_dsl(relative),
                            f"{relative.as_posix()}: {heading}", body[:_BODY_CAP]))
    return docs


# -------------------------------------------------------------------------------------------------- building


def content_sha256(docs: Iterable[Doc]) -> str:
    """sha256 over the documents in id order: two indexes with the same hash answer every query alike."""
    digest = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: d.doc_id):
        digest.update("\0".join((doc.doc_id, doc.dsl, doc.title, doc.body, *doc.aliases)).encode() + b"\1")
    return digest.hexdigest()


_SCHEMA = """
CREATE TABLE documents (rowid INTEGER PRIMARY KEY, doc_id TEXT UNIQUE NOT NULL, dsl TEXT NOT NULL,
                        title TEXT NOT NULL, body TEXT NOT NULL);
CREATE VIRTUAL TABLE docs_fts USING fts5(title, body, content='documents', content_rowid='rowid',
                                         tokenize='unicode61 remove_diacritics 2');
CREATE TABLE aliases (name TEXT PRIMARY KEY, doc_id TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def write_index(path: Path, docs: list[Doc], meta: dict[str, Any]) -> int:
    """Write documents + metadata to a temporary file and move it into place (readers never see half an index)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    unique = {d.doc_id: d for d in docs}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as db:
            db.executescript(_SCHEMA)
            db.executemany("INSERT INTO documents (doc_id, dsl, title, body) VALUES (?, ?, ?, ?)",
                           [(d.doc_id, d.dsl, d.title, d.body) for d in unique.values()])
            db.execute("INSERT INTO docs_fts (rowid, title, body) SELECT rowid, title, body FROM documents")
            db.executemany("INSERT OR IGNORE INTO aliases VALUES (?, ?)",
                           [(a, d.doc_id) for d in unique.values() for a in d.aliases])
            full = {**meta, "n_docs": len(unique), "content_sha256": content_sha256(unique.values())}
            db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in full.items()])
            db.commit()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(unique)


def build_index(sources: Sequence[str] | None = None, directory: Path | None = None,
                progress: Callable[[str], None] | None = None) -> BuildReport:
    """Build the main index from the guides and/or the installed DSL packages (importing them takes seconds)."""
    start = time.perf_counter()
    sources = default_sources() if sources is None else tuple(sources)
    path = index_path(sources, directory)
    docs: list[Doc] = []
    counts: dict[str, int] = {}
    failures: dict[str, str] = {}
    for source in SOURCES:
        if source not in sources:
            continue
        if progress:
            progress(f"collecting {source}")
        found = guide_documents() if source == "guides" else package_documents(source, failures)
        counts[source] = len(found)
        docs += found
    key = version_key(sources)
    meta = {"version_key": key, "builder_version": BUILDER_VERSION, "sources": list(sources),
            "packages": {dsl: package_version(dsl) for dsl in DSLS if dsl in sources},
            "guides_sha256": guides_sha256() if "guides" in sources else None, "counts": counts,
            "import_failures": failures, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    n_docs = write_index(path, docs, {**meta, "build_seconds": round(time.perf_counter() - start, 2)})
    return BuildReport(path, key, n_docs, counts, failures, time.perf_counter() - start, path.stat().st_size)


def build_user_index(root: Path, directory: Path | None = None, dsl: str | None = None) -> BuildReport:
    """Replace the user-docs index with the documents found under `root`."""
    start = time.perf_counter()
    if dsl not in (None, "", *DSLS):
        raise UserError(f"unknown dsl {dsl!r} (use {', '.join(DSLS)} or leave it out)")
    docs = user_documents(root, dsl)
    if not docs:
        raise UserError("no .md, .rst, .txt or .py files with text found", str(root))
    path = user_index_path(directory)
    key = f"user-b{BUILDER_VERSION}"
    n_docs = write_index(path, docs, {"version_key": key, "builder_version": BUILDER_VERSION,
                                      "source": str(root.resolve()), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return BuildReport(path, key, n_docs, {"user": n_docs}, {}, time.perf_counter() - start, path.stat().st_size)


# --------------------------------------------------------------------------------------------------- searching


def fts_queries(query: str) -> tuple[str, str]:
    """(all-phrases query, any-word query) in FTS5 syntax built only from quoted word tokens.

    Each whitespace-separated chunk becomes one phrase of its word characters (`cute.make_layout` -> "cute make
    layout", matching the name's tokens in order); a trailing `*` keeps prefix search; bare AND/OR/NOT/NEAR are
    dropped (the all-phrases query already means AND). Raises DocsQueryError when nothing is left.
    """
    phrases, words = [], []
    for chunk in query.split():
        if chunk in _OPERATORS:
            continue
        tokens = re.findall(r"[^\W_]+", chunk)  # the tokenizer splits at "_" too
        if not tokens:
            continue
        star = " *" if chunk.rstrip("\"')]}.,;:!?").endswith("*") else ""
        phrases.append('"' + " ".join(tokens) + '"' + star)
        words += [f'"{t}"' for t in tokens]
    if not phrases:
        raise DocsQueryError(f"nothing to search for in {query!r}: give some words, e.g. 'shared memory layout'")
    return " AND ".join(phrases), " OR ".join(dict.fromkeys(words))


def format_hits(hits: Sequence[Hit], query: str = "") -> str:
    """One line per hit, "<doc_id>  <title> — <snippet>"; a hint line when nothing matched."""
    if not hits:
        about = f" for {query!r}" if query else ""
        return f"no documents match{about}; try fewer or more general words, or another dsl"
    return "\n".join(f"{h.doc_id}  {h.title} — {h.snippet}" for h in hits)


class DocsIndex:
    """A read-only view of the main index (and the user-docs index when present): search, read, identity."""

    def __init__(self, path: Path, user_path: Path | None = None) -> None:
        self.path = path
        self.user_path = user_path if user_path is not None and user_path.is_file() else None
        self._dbs = [self._connect(path)] + ([self._connect(self.user_path)] if self.user_path else [])
        self._lock = threading.Lock()

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        # Read-only and shareable across threads: the attempt loop may search from worker threads.
        return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)

    @classmethod
    def open(cls, build_if_missing: bool = True, *, sources: Sequence[str] | None = None,
             directory: Path | None = None, progress: Callable[[str], None] | None = None) -> DocsIndex:
        """The index for the installed DSL versions and current guides, built first when missing (and allowed)."""
        path = index_path(sources, directory)
        if not path.is_file():
            if not build_if_missing:
                raise UserError("docs index not built: run `metakernel docs build`", str(path))
            build_index(sources, directory, progress)
        return cls(path, user_index_path(directory))

    def close(self) -> None:
        """Close the database connections."""
        for db in self._dbs:
            db.close()

    def __enter__(self) -> DocsIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, match: str, dsl: str, limit: int) -> list[tuple[float, Hit]]:
        sql = ("SELECT d.doc_id, d.dsl, d.title, snippet(docs_fts, 1, '', '', '…', 14), bm25(docs_fts, 8.0, 1.0)"
               " FROM docs_fts JOIN documents d ON d.rowid = docs_fts.rowid"
               " WHERE docs_fts MATCH ? AND (? = '' OR d.dsl IN (?, '')) ORDER BY 5 LIMIT ?")
        rows = []
        with self._lock:
            for db in self._dbs:
                try:
                    rows += db.execute(sql, (match, dsl, dsl, limit)).fetchall()
                except sqlite3.OperationalError as exc:
                    raise DocsQueryError(f"could not search for {match!r}: {exc}") from exc
        hits = [(score, Hit(i, d, t, " ".join(s.split()))) for i, d, t, s, score in rows]
        return sorted(hits, key=lambda pair: pair[0])

    def _exact(self, query: str, dsl: str) -> list[Hit]:
        """Documents named exactly by the query (`make_layout` -> `cute:cute.make_layout`), shortest id first.

        bm25 alone ranks a short undocumented `make_layout_like` above `make_layout` itself.
        """
        name = query.strip().strip("`'\"")
        if not re.fullmatch(r"[A-Za-z_][\w.:#-]*", name):
            return []
        sql = ("SELECT doc_id, dsl, title, body FROM documents WHERE (doc_id = ? OR substr(doc_id, instr(doc_id, ':')"
               " + 1) = ? OR doc_id GLOB ? OR doc_id IN (SELECT doc_id FROM aliases WHERE name = ? OR name GLOB ?))"
               " AND (? = '' OR dsl IN (?, '')) ORDER BY length(doc_id) LIMIT 4")
        rows = []
        with self._lock:
            for db in self._dbs:
                rows += db.execute(sql, (name, name, f"*.{name}", name, f"*.{name}", dsl, dsl)).fetchall()
        return [Hit(i, d, t, " ".join(b.split("\n", 1)[0].split())[:160]) for i, d, t, b in rows]

    def search(self, query: str, dsl: str = "", k: int = 8) -> list[Hit]:
        """Best `k` documents: exact names first, then bm25 (titles weigh 8x); DSL-neutral ones for any `dsl`.

        After exact names come documents containing every phrase of the query, then ones containing any of its
        words. Raises DocsQueryError (a UserError) for an empty query or an unknown dsl.
        """
        if dsl not in ("", *DSLS):
            raise DocsQueryError(f"unknown dsl {dsl!r} (use {', '.join(DSLS)} or leave it empty)")
        k = max(1, min(int(k), MAX_K))
        strict, loose = fts_queries(query)
        hits: dict[str, Hit] = {h.doc_id: h for h in self._exact(query, dsl)}
        for match in (strict, loose):
            if len(hits) >= k:
                break
            for _, hit in self._query(match, dsl, k + len(hits)):
                hits.setdefault(hit.doc_id, hit)
        return list(hits.values())[:k]

    def search_text(self, query: str, dsl: str = "", k: int = 8) -> str:
        """`format_hits(search(...))`, with query errors as the text: what the docs_search tool returns."""
        try:
            return format_hits(self.search(query, dsl, k), query)
        except DocsQueryError as exc:
            return str(exc)

    def doc_ids(self) -> list[str]:
        """Every document id, main index first."""
        with self._lock:
            return [row[0] for db in self._dbs for row in db.execute("SELECT doc_id FROM documents ORDER BY rowid")]

    def _get(self, doc_id: str) -> Doc | None:
        """The document with this id, or the one this alias names (`Tx.float32`, `cute.core.make_layout`)."""
        with self._lock:
            for db in self._dbs:
                row = db.execute("SELECT doc_id, dsl, title, body FROM documents WHERE doc_id = ? OR doc_id ="
                                 " (SELECT doc_id FROM aliases WHERE name = ?)", (doc_id, doc_id)).fetchone()
                if row:
                    return Doc(*row)
        return None

    def get(self, doc_id: str) -> Doc | None:
        """The document for an id or alias; an id without its prefix (`cute.make_layout`) works when unambiguous."""
        doc_id = doc_id.strip().strip("`'\"")
        found = self._get(doc_id)
        if found is None and doc_id:
            tails = [i for i in self.doc_ids() if i.split(":", 1)[-1] == doc_id]
            found = self._get(tails[0]) if len(tails) == 1 else None
        return found

    def close_ids(self, doc_id: str, n: int = 8) -> list[str]:
        """Ids resembling `doc_id` (spelling, then substring) for the "no such document" message."""
        ids = self.doc_ids()
        close = difflib.get_close_matches(doc_id, ids, n=n, cutoff=0.6)
        needle = doc_id.strip().lower()
        return close + [i for i in ids if needle and needle in i.lower() and i not in close][:n - len(close)]

    def read(self, doc_id: str, max_chars: int = DEFAULT_MAX_CHARS) -> str:
        """The document's text (id and title first), truncated with a note; an unknown id gets close ids instead.

        Never raises for a bad id: the text goes back to the agent, which can act on it.
        """
        doc = self.get(doc_id)
        if doc is None:
            close = self.close_ids(doc_id)
            hint = ("; close ids: " + ", ".join(close)) if close else "; use docs_search to find ids"
            return f"no document {doc_id.strip()!r}{hint}"
        text = f"{doc.doc_id} ({doc.dsl or 'neutral'})  {doc.title}\n\n{doc.body}"
        if max_chars > 0 and len(text) > max_chars:
            text = text[:max_chars] + f"\n[truncated: showed {max_chars} of {len(text)} characters]"
        return text

    def _meta(self, db: sqlite3.Connection) -> dict[str, Any]:
        with self._lock:
            return {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}

    def identity(self) -> dict[str, Any]:
        """Version key, document count and content hash of the index (and of the user docs) for provenance."""
        meta = self._meta(self._dbs[0])
        out = {k: meta.get(k) for k in ("version_key", "n_docs", "content_sha256", "builder_version", "packages",
                                         "guides_sha256", "sources")}
        out["n_import_failures"] = len(meta.get("import_failures") or {})
        if len(self._dbs) > 1:
            user = self._meta(self._dbs[1])
            out["user"] = {k: user.get(k) for k in ("version_key", "n_docs", "content_sha256", "source")}
        else:
            out["user"] = None
        return out

    def info(self) -> dict[str, Any]:
        """identity() plus paths, sizes, per-source counts, build time and import failures (for `docs info`)."""
        meta = self._meta(self._dbs[0])
        return {**self.identity(), "path": str(self.path), "size_bytes": self.path.stat().st_size,
                "counts": meta.get("counts"), "build_seconds": meta.get("build_seconds"),
                "built_at": meta.get("built_at"), "import_failures": meta.get("import_failures"),
                "user_path": str(self.user_path) if self.user_path else None}
