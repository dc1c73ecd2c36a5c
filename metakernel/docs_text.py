"""Guides and a user's local docs, cut into the sections the docs index stores as one document each.

Why a module of its own: splitting text is pure string work (Markdown headings outside code fences,
reStructuredText titles, top-level Python definitions) with no SQLite, no versions and no DSL imports, so it can be
read and tested apart from `metakernel.docs_index`, which calls `guide_documents` and `user_documents` when it builds
an index and stores what comes back.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from metakernel.docs_sources import BODY_CAP, DSLS, Doc
from metakernel.errors import UserError
from metakernel.paths import guides_dir

__all__ = ["guide_documents", "split_markdown", "user_documents"]

_USER_SUFFIXES = (".md", ".rst", ".txt", ".py")


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
    """One document per `##` section of each guide (`guide:<stem>#<slug>`); the intro becomes `#overview`.

    `<dsl>.md` is the guide the prompt carries; `<dsl>-notes.md` holds shorter answers found only by search; both
    belong to that DSL. Other files are DSL-neutral.
    """
    docs = []
    names = {"cute": "CuTe DSL", "tirx": "TIRx"}
    for path in sorted((directory or guides_dir()).glob("*.md")):
        base, _, kind = path.stem.partition("-")
        dsl = base if base in DSLS else ""
        name = f"{names[dsl]} {kind or 'guide'}" if dsl else f"{path.stem} guide"
        seen: set[str] = set()
        for heading, body in split_markdown(path.read_text(encoding="utf-8")):
            slug = _unique(_slug(heading), seen)
            docs.append(Doc(f"guide:{path.stem}#{slug}", dsl, f"{name}: {heading}", body))
    return docs


def _unique(slug: str, seen: set[str]) -> str:
    base, n = slug, 1
    while slug in seen:
        n += 1
        slug = f"{base}-{n}"
    seen.add(slug)
    return slug


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
                            f"{relative.as_posix()}: {heading}", body[:BODY_CAP]))
    return docs
