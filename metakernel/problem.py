"""Problem files: discovery, loading and the contract every file must meet (docs/problem-format.md).

A problem file is data written as Python: `reference`, `make_inputs`, `roofline` and optional declarations. It is
loaded from its path (file names start with digits, so they are not importable modules), and its identity is
number + version + a hash of the file's bytes, which goes into every result.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from metakernel.errors import UserError
from metakernel.paths import problems_dir

_FILE_RE = re.compile(r"^(?P<nn>\d{2})_(?P<slug>[a-z0-9_]+)\.py$")
COMPARATOR_KINDS = ("float", "exact", "topk", "topk_values", "quantized")
QUANT_FORMATS = ("float8_e4m3fn", "float8_e5m2", "int8", "int4", "e2m1")


@dataclass(frozen=True)
class ComparatorSpec:
    """How one output (or mutated input) is compared; see `metakernel.compare`."""

    kind: str
    scores: str | None = None  # topk / topk_values: name of the module function giving the full scores
    indices: str | None = None  # topk_values: the index output the values are aligned with
    scale: str | None = None  # quantized: output or input holding the scales
    block: tuple[int, ...] = ()  # quantized: elements per scale along each dim (0 = the whole dim)
    format: str | None = None  # quantized: storage format


@dataclass(frozen=True)
class Problem:
    """A loaded problem file."""

    number: int
    slug: str
    family: str
    path: Path
    module: ModuleType = field(repr=False, compare=False)
    version: int
    content_hash: str
    title: str
    docstring: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...] | None
    mutates: tuple[str, ...]
    comparators: dict[str, ComparatorSpec]

    @property
    def nn(self) -> str:
        """The two-digit problem number used in addresses (`p07_r1_solo_cute`)."""
        return f"{self.number:02d}"

    @property
    def name(self) -> str:
        """`<NN>_<slug>`, the file stem."""
        return f"{self.nn}_{self.slug}"

    @property
    def identity(self) -> dict[str, Any]:
        """What every result records about the problem it graded."""
        return {"number": self.number, "slug": self.slug, "family": self.family,
                "version": self.version, "content_hash": self.content_hash}

    @property
    def reference(self) -> Callable[..., Any]:
        """The problem's `reference(*inputs)`."""
        return self.module.reference

    def make_inputs(self, device: str = "cuda", scale: str = "full") -> list[Any]:
        """Draw one set of inputs from the global torch RNG."""
        inputs = self.module.make_inputs(device=device, scale=scale)
        if not isinstance(inputs, list):
            raise UserError(f"make_inputs returned {type(inputs).__name__}, expected a list", str(self.path))
        if len(inputs) != len(self.input_names):
            raise UserError(f"make_inputs returned {len(inputs)} inputs but reference takes "
                            f"{len(self.input_names)} ({', '.join(self.input_names)})", str(self.path))
        return inputs

    def roofline(self, inputs: list[Any]) -> dict[str, int]:
        """Minimal FLOPs and bytes for these inputs."""
        counts = self.module.roofline(*inputs)
        if not isinstance(counts, dict) or not {"flops", "bytes"} <= set(counts):
            raise UserError("roofline must return a dict with 'flops' and 'bytes'", str(self.path))
        return {k: int(v) for k, v in counts.items() if k in ("flops", "bytes")}

    def function(self, name: str) -> Callable[..., Any]:
        """A helper function the file defines (scores functions for `topk` comparators)."""
        return getattr(self.module, name)

    @property
    def alt_reference(self) -> Callable[..., Any] | None:
        """The independent formulation validate compares `reference` with, if the file defines one."""
        return getattr(self.module, "alt_reference", None)

    @property
    def source(self) -> str:
        """The file's text, as an agent sees it."""
        return self.path.read_text(encoding="utf-8")


def _parse_spec(name: str, raw: Any, where: str) -> ComparatorSpec:
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, dict) or raw.get("kind") not in COMPARATOR_KINDS:
        raise UserError(f"COMPARATORS[{name!r}]: kind must be one of {', '.join(COMPARATOR_KINDS)}", where)
    allowed = {"kind", "scores", "indices", "scale", "block", "format", "dim"}
    extra = set(raw) - allowed
    if extra:
        raise UserError(f"COMPARATORS[{name!r}]: unknown field(s) {', '.join(sorted(extra))}", where)
    kind = raw["kind"]
    if raw.get("dim", -1) != -1:
        raise UserError(f"COMPARATORS[{name!r}]: only dim=-1 is supported", where)
    spec = ComparatorSpec(kind=kind, scores=raw.get("scores"), indices=raw.get("indices"), scale=raw.get("scale"),
                          block=tuple(int(b) for b in raw.get("block", ())), format=raw.get("format"))
    if kind in ("topk", "topk_values") and not spec.scores:
        raise UserError(f"COMPARATORS[{name!r}]: {kind} needs 'scores' (a function name)", where)
    if kind == "topk_values" and not spec.indices:
        raise UserError(f"COMPARATORS[{name!r}]: topk_values needs 'indices' (the index output)", where)
    if kind == "quantized":
        if not spec.scale:
            raise UserError(f"COMPARATORS[{name!r}]: quantized needs 'scale'", where)
        if spec.format not in QUANT_FORMATS:
            raise UserError(f"COMPARATORS[{name!r}]: format must be one of {', '.join(QUANT_FORMATS)}", where)
    return spec


def load_problem_file(path: Path) -> Problem:
    """Import one problem file and check its declarations (not its numbers: that is `validate`).

    Name, number, VERSION, docstring and content hash come from `summarise_problem_file`, the one reading of them
    that `problems list` shares, so a listing and a grading can never name a problem differently.
    """
    where = str(path)
    summary = summarise_problem_file(path)
    module_name = f"metakernel_problem_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError("cannot be imported", where)
    module = importlib.util.module_from_spec(spec)
    try:
        # Registered so inspect.getsource and pickling by reference work for functions defined in the file.
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure importing user data is bad input
        sys.modules.pop(module_name, None)
        raise UserError(f"import failed: {type(exc).__name__}: {exc}", where) from exc
    for attr in ("reference", "make_inputs", "roofline"):
        if not callable(getattr(module, attr, None)):
            raise UserError(f"missing function {attr}()", where)
    params = inspect.signature(module.reference).parameters.values()
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        raise UserError("reference must take plain positional parameters (one per input)", where)
    input_names = tuple(p.name for p in params)
    mutates = tuple(getattr(module, "MUTATES", ()))
    unknown = [m for m in mutates if m not in input_names]
    if unknown:
        raise UserError(f"MUTATES names unknown input(s): {', '.join(unknown)}", where)
    output_names = getattr(module, "OUTPUT_NAMES", None)
    if output_names is not None:
        output_names = tuple(output_names)
        clash = set(output_names) & set(mutates)
        if clash or len(set(output_names)) != len(output_names):
            raise UserError("OUTPUT_NAMES must be unique and distinct from MUTATES", where)
    comparators = {n: _parse_spec(n, raw, where) for n, raw in dict(getattr(module, "COMPARATORS", {})).items()}
    known = set(output_names or ()) | set(mutates) | ({"out"} if output_names is None else set())
    for name, cspec in comparators.items():
        if output_names is not None and name not in known:
            raise UserError(f"COMPARATORS names unknown output {name!r}", where)
        for fn in (cspec.scores,):
            if fn and not callable(getattr(module, fn, None)):
                raise UserError(f"COMPARATORS[{name!r}] refers to missing function {fn}()", where)
    return Problem(
        number=summary.number, slug=summary.slug, family=summary.family, path=path, module=module,
        version=summary.version, content_hash=summary.content_hash, title=summary.title,
        docstring=inspect.getdoc(module) or "", input_names=input_names, output_names=output_names,
        mutates=mutates, comparators=comparators,
    )


@dataclass(frozen=True)
class ProblemSummary:
    """What a listing shows of a problem, read from its file without running it.

    No torch import: `problems list` answers in a fraction of a second.
    """

    number: int
    slug: str
    family: str
    path: Path
    version: int
    content_hash: str
    title: str

    @property
    def nn(self) -> str:
        """The two-digit number as the file name spells it."""
        return f"{self.number:02d}"

    @property
    def identity(self) -> dict[str, Any]:
        """The same identity a loaded `Problem` records."""
        return {"number": self.number, "slug": self.slug, "family": self.family, "version": self.version,
                "content_hash": self.content_hash}


def summarise_problem_file(path: Path) -> ProblemSummary:
    """Number, slug, family, VERSION and the docstring's first line, from the file's syntax tree."""
    import ast

    match = _FILE_RE.match(path.name)
    if match is None:
        raise UserError("file name must be <NN>_<slug>.py (two digits, lower-case slug)", str(path))
    data = path.read_bytes()
    try:
        tree = ast.parse(data, filename=str(path))
    except SyntaxError as exc:
        raise UserError(f"import failed: SyntaxError: {exc}", str(path)) from exc
    doc = ast.get_docstring(tree) or ""
    if not doc.strip():
        raise UserError("missing module docstring (one-line summary, provenance, shapes)", str(path))
    version = 1
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VERSION" for t in node.targets):
            value = node.value.value if isinstance(node.value, ast.Constant) else None
            if not isinstance(value, int) or value < 1:
                raise UserError("VERSION must be a positive integer", str(path))
            version = value
    return ProblemSummary(int(match["nn"]), match["slug"], path.parent.name, path, version,
                          hashlib.sha256(data).hexdigest()[:16], doc.strip().splitlines()[0])


def problem_paths(directory: Path | None = None) -> dict[int, Path]:
    """Every `<family>/<NN>_<slug>.py` under the problems folder, by number (duplicate numbers are an error)."""
    directory = directory or problems_dir()
    found: dict[int, Path] = {}
    for path in sorted(directory.glob("*/*.py")):
        match = _FILE_RE.match(path.name)
        if not match:
            continue
        number = int(match["nn"])
        if number in found:
            raise UserError(f"problem number {number:02d} is used twice ({found[number]} and {path})", str(directory))
        found[number] = path
    return dict(sorted(found.items()))


@cache
def _load_cached(path: Path, mtime_ns: int) -> Problem:
    return load_problem_file(path)


def load_problem(number: int, directory: Path | None = None) -> Problem:
    """Load problem NN, or raise a `UserError` that says which numbers exist."""
    paths = problem_paths(directory)
    if number not in paths:
        span = f"{min(paths):02d}-{max(paths):02d}" if paths else "none found"
        raise UserError(f"no problem {number:02d} (problems: {span})")
    path = paths[number]
    return _load_cached(path, path.stat().st_mtime_ns)


def parse_selection(text: str, known: dict[int, Path], families: dict[str, Any] | None = None) -> list[int]:
    """Turn '1,3-5,moe' into problem numbers; family names expand to their members."""
    chosen: list[int] = []
    if not text.strip():
        return chosen
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise UserError(f"empty item in the problem selection {text!r} (a doubled or trailing comma?)")
        if families and part in families:
            chosen.extend(families[part].members)
        elif re.fullmatch(r"\d+", part):
            chosen.append(int(part))
        elif re.fullmatch(r"\d+-\d+", part):
            lo, hi = (int(x) for x in part.split("-"))
            if lo > hi:
                raise UserError(f"empty range {part!r}")
            chosen.extend(range(lo, hi + 1))
        else:
            names = ", ".join(families) if families else "none"
            raise UserError(f"cannot read problem selection {part!r} (numbers, ranges like 3-7, or families: {names})")
    for number in chosen:
        if number not in known:
            span = f"{min(known):02d}-{max(known):02d}" if known else "none found"
            raise UserError(f"no problem {number:02d} (problems: {span})")
    return list(dict.fromkeys(chosen))
