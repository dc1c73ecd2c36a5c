"""The docs an agent searches: our guides plus the installed DSL packages' docstrings, in one SQLite FTS5 index.

We do not ship upstream documentation; the index is built on the machine from what is installed (docstrings and
signatures of `cutlass.cute` & co. and of TVMScript TIRx, collected by `metakernel.docs_sources`), so it always
describes the DSL versions the grader runs. Guides and user docs are cut into sections by `metakernel.docs_text`.
This module owns the rest: writing the index, and searching and reading it. The file name carries a version key
(builder version, guide hash, DSL package versions): upgrading a DSL or editing a guide builds a fresh index instead
of serving stale text, and `identity()` names it in an experiment's provenance. A user's local copy of upstream
docs (`metakernel docs build --from PATH`) goes into a separate index beside it and is searched together with it.

Agents type anything into `docs_search`, so every query is reduced to quoted FTS5 phrases: operators, quotes and
punctuation never reach FTS5 as syntax, and an empty query gets a message instead of an error.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.metadata
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metakernel.docs_sources import DISPLAY as DISPLAY  # re-exported: the index's public names stay importable here
from metakernel.docs_sources import DSLS, Doc, package_documents
from metakernel.docs_sources import ROOTS as ROOTS
from metakernel.docs_text import guide_documents, user_documents
from metakernel.errors import UserError
from metakernel.paths import guides_dir

#: Bump when the extraction or the schema changes: the version key changes and old indexes are left alone.
BUILDER_VERSION = 2
#: What an index can be built from; tests build from "guides" alone to avoid importing the DSLs.
SOURCES = ("guides", "cute", "tirx")
DEFAULT_MAX_CHARS = 12000
MAX_K = 50
#: Any-word hits looked at for the guide section that covers most of a question (`DocsIndex._by_coverage`).
COVERAGE_POOL = 40
#: The distribution each DSL comes from (its version goes into the version key).
PACKAGES = {"cute": "nvidia-cutlass-dsl", "tirx": "apache-tvm"}
_OPERATORS = frozenset({"AND", "OR", "NOT", "NEAR"})
#: Words an agent's question carries that say nothing about the answer ("which stream does the kernel run on"):
#: left out of the any-word query, where they made long documents outrank the one about streams.
_STOP_WORDS = frozenset({"a", "an", "the", "which", "what", "how", "does", "do", "is", "are", "on", "in", "of",
                         "to", "for", "and", "with", "can", "i", "my", "it", "be", "by", "from", "at", "as", "this",
                         "that", "when", "why", "where", "should", "use", "get", "or", "vs", "versus"})


#: CUDA C spellings an agent brings from CUDA (held-out queries missed on them: "__syncthreads", "atomicAdd",
#: "float4"), each searched for as written or as the words the DSLs' docs use; camelCase words are also split.
_CUDA_WORDS = {"syncthreads": "sync threads", "syncwarp": "sync warp", "shfl": "shuffle", "atomicadd": "atomic add",
               "atomicmax": "atomic max", "atomicmin": "atomic min", "atomiccas": "atomic cas",
               "float4": "vectorized", "float2": "vectorized", "int4": "vectorized", "half2": "vectorized",
               "blockidx": "block idx", "threadidx": "thread idx", "blockdim": "block dim", "griddim": "grid dim",
               "rsqrtf": "rsqrt", "expf": "exp", "exp2f": "exp2", "tanhf": "tanh", "fdividef": "div",
               "laneid": "lane idx", "warpsize": "warp size"}


def _alternatives(tokens: list[str]) -> list[str]:
    """The token list as the DSLs' docs may spell it: camelCase split, CUDA C words translated (empty: no change)."""
    out: list[str] = []
    for token in tokens:
        parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", token) or [token]
        mapped = _CUDA_WORDS.get(token.lower())
        out += mapped.split() if mapped else parts
    return out if [t.lower() for t in out] != [t.lower() for t in tokens] else []


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
                                         tokenize='porter unicode61 remove_diacritics 2');
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
    phrases, words = _phrases(query)
    return " AND ".join(phrases), " OR ".join(dict.fromkeys(words))


def _phrases(query: str) -> tuple[list[str], list[str]]:
    """The query's phrases (one per chunk, with its alternative spelling) and its words, as `fts_queries` uses them."""
    phrases, words, stop_phrases = [], [], []
    for chunk in query.split():
        if chunk in _OPERATORS:
            continue
        tokens = re.findall(r"[^\W_]+", chunk)  # the tokenizer splits at "_" too
        if not tokens:
            continue
        star = " *" if chunk.rstrip("\"')]}.,;:!?").endswith("*") else ""
        if len(tokens) == 1 and tokens[0].lower() in _STOP_WORDS and not star:
            stop_phrases.append(f'"{tokens[0]}"')
            continue
        phrase = '"' + " ".join(tokens) + '"' + star
        other = _alternatives(tokens)
        phrases.append(f'({phrase} OR "{" ".join(other)}"{star})' if other else phrase)
        words += [f'"{t}"' for t in tokens + other if t.lower() not in _STOP_WORDS]
    phrases = phrases or stop_phrases  # a query of stop words only still searches for them
    words = words or stop_phrases
    if not phrases:
        raise DocsQueryError(f"nothing to search for in {query!r}: give some words, e.g. 'shared memory layout'")
    return phrases, words


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

        Exact names are the whole query's, then those of up to two API names inside it ("sync_threads barrier": a
        one-line docstring loses to longer ones in bm25). After them come documents containing every phrase of
        the query, then ones containing any of its words (among which a guide section covering as much of the
        question as any is lifted into the top three: `_by_coverage`). Raises DocsQueryError (a UserError) for
        an empty query or an unknown dsl.
        """
        if dsl not in ("", *DSLS):
            raise DocsQueryError(f"unknown dsl {dsl!r} (use {', '.join(DSLS)} or leave it empty)")
        k = max(1, min(int(k), MAX_K))
        strict, loose = fts_queries(query)
        hits: dict[str, Hit] = {h.doc_id: h for h in self._exact(query, dsl)}
        named = [c.strip("`'\"(),;:?") for c in query.split()]  # API names inside a question ("sync_threads barrier")
        for name in [c for c in named if ("_" in c.strip("_") or "." in c) and c != query.strip()][:2]:
            for hit in self._exact(name, dsl)[:1]:
                hits.setdefault(hit.doc_id, hit)
        for match in (strict, loose):
            if len(hits) >= k:
                break
            if match is loose:
                found = self._by_coverage(query, self._query(match, dsl, max(COVERAGE_POOL, k + len(hits))))
            else:
                found = self._query(match, dsl, k + len(hits))
            for _, hit in found:
                hits.setdefault(hit.doc_id, hit)
        return list(hits.values())[:k]

    def _by_coverage(self, query: str, found: list[tuple[float, Hit]]) -> list[tuple[float, Hit]]:
        """Any-word hits in bm25 order, except that our guide section covering most of a question comes third at worst.

        bm25 over an OR of a long question's words favours short API docstrings that repeat one of its words
        ("max dynamic smem size": `get_dyn_smem_size` five times) over the note written to answer the whole
        question. A guide section that contains as many of the question's phrases as any hit is lifted into the
        top three; nothing else moves (re-ranking every hit by coverage lifted module overviews, which mention
        everything, above the function asked for).
        """
        phrases, _ = _phrases(query)
        if len(phrases) < 3 or not found:
            return found
        ids = [hit.doc_id for _, hit in found]
        marks = ",".join("?" * len(ids))
        sql = ("SELECT d.doc_id FROM docs_fts JOIN documents d ON d.rowid = docs_fts.rowid"
               f" WHERE docs_fts MATCH ? AND d.doc_id IN ({marks})")
        covered: dict[str, int] = dict.fromkeys(ids, 0)
        with self._lock:
            for phrase in phrases:
                for db in self._dbs:
                    try:
                        for (doc_id,) in db.execute(sql, (phrase, *ids)):
                            covered[doc_id] += 1
                    except sqlite3.OperationalError:
                        continue
        best = max(covered.values())
        guide = next((i for i, doc_id in enumerate(ids) if doc_id.startswith("guide:") and covered[doc_id] == best),
                     None)
        if guide is None or guide <= 2:
            return found
        return found[:2] + [found[guide]] + found[2:guide] + found[guide + 1:]

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
