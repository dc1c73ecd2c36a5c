"""The docs index agents search: guides split per section, user docs, search that survives any text, reads that
answer unknown ids with close ones, versioned files, and one real build from the installed CuTe DSL and TIRx."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sqlite3

import pytest
from click.testing import CliRunner

from metakernel.cli_docs import docs
from metakernel.docs_index import (
    SOURCES,
    DocsIndex,
    DocsQueryError,
    build_index,
    build_user_index,
    content_sha256,
    fts_queries,
    index_path,
    version_key,
)
from metakernel.docs_text import guide_documents, split_markdown, user_documents
from metakernel.errors import UserError
from metakernel.paths import guides_dir

GUIDES = ("guides",)


@pytest.fixture
def docs_dir(tmp_path, monkeypatch):
    folder = tmp_path / "docs-cache"
    monkeypatch.setenv("METAKERNEL_DOCS_DIR", str(folder))
    monkeypatch.setenv("METAKERNEL_DOCS_SOURCES", "guides")
    return folder


@pytest.fixture
def index(docs_dir):
    with DocsIndex.open(sources=GUIDES) as opened:
        yield opened


@pytest.fixture
def upstream(tmp_path):
    """A small local copy of 'upstream docs' in every supported format, plus files that must be ignored."""
    root = tmp_path / "upstream"
    (root / "cutlass" / "media").mkdir(parents=True)
    (root / "tvm").mkdir()
    (root / "cutlass" / "media" / "layouts.md").write_text(
        "# CuTe layouts\n\nIntro about hierarchical layouts.\n\n## Swizzling\n\nA zebracorn swizzle avoids bank "
        "conflicts.\n\n```python\n## not a heading inside a fence\n```\n\n### Details\n\nMore details.\n")
    (root / "tvm" / "schedule.rst").write_text(
        "Scheduling\n==========\n\nIntro text.\n\nThread binding\n--------------\n\nBind loops to quokkathreads.\n")
    (root / "notes.txt").write_text("Plain notes about occupancy and registers.\n")
    (root / "example.py").write_text(
        '"""Example module docstring."""\n\n\ndef wombat_kernel(x):\n    """Adds one."""\n    return x + 1\n\n\n'
        "class Helper:\n    pass\n")
    (root / "data.json").write_text('{"ignored": true}\n')
    (root / ".hidden").mkdir()
    (root / ".hidden" / "secret.md").write_text("# Hidden\n\nnot indexed\n")
    return root


def _sections(path):
    """`##` headings outside code fences, counted independently of the splitter."""
    count, fence = 0, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and line.startswith("## "):
            count += 1
    return count


def test_guides_become_one_document_per_section():
    """Invariant: each `##` section of each guide is its own document with a stable id, plus the intro."""
    found = guide_documents()
    for name in ("cute", "tirx"):
        path = guides_dir() / f"{name}.md"
        own = [d for d in found if d.doc_id.startswith(f"guide:{name}#")]
        assert len(own) == _sections(path) + 1
        assert all(d.dsl == name for d in own)
    ids = {d.doc_id for d in found}
    assert {"guide:tirx#overview", "guide:tirx#writing-the-kernel", "guide:cute#streams"} <= ids
    streams = next(d for d in found if d.doc_id == "guide:cute#streams")
    assert streams.title == "CuTe DSL guide: Streams" and streams.body.startswith("## Streams")


def test_split_markdown_ignores_headings_in_fences_and_keeps_the_title_with_the_intro():
    text = "# Title\n\nintro\n\n## A\n\n```\n## inside\n```\n\n### sub\n\n## B\nb\n"
    assert [h for h, _ in split_markdown(text)] == ["Overview", "A", "B"]
    assert [h for h, _ in split_markdown(text, max_level=3)] == ["Overview", "A", "sub", "B"]
    assert "## inside" in split_markdown(text)[1][1]


def test_version_key_and_file_name_carry_builder_guides_and_dsl_versions(docs_dir):
    key = version_key(SOURCES)
    cute = importlib.metadata.version("nvidia-cutlass-dsl")
    tvm = importlib.metadata.version("apache-tvm")
    assert re.fullmatch(rf"b\d+-g[0-9a-f]{{12}}-cute{re.escape(cute)}-tirx{re.escape(tvm)}", key)
    assert version_key(GUIDES) == key.split("-cute")[0]
    assert index_path(GUIDES) == docs_dir / f"docs-{version_key(GUIDES)}.sqlite"
    assert index_path() == index_path(GUIDES)  # METAKERNEL_DOCS_SOURCES=guides in these tests
    with pytest.raises(UserError, match="unknown docs sources"):
        version_key(("guides", "triton"))


def test_version_key_changes_when_a_guide_changes(tmp_path, monkeypatch):
    guides = tmp_path / "guides"
    guides.mkdir()
    (guides / "cute.md").write_text("# Guide\n\n## One\n\ntext\n")
    monkeypatch.setenv("METAKERNEL_GUIDES_DIR", str(guides))
    before = version_key(GUIDES)
    (guides / "cute.md").write_text("# Guide\n\n## One\n\nedited text\n")
    assert version_key(GUIDES) != before


def test_build_is_atomic_reproducible_and_identified(docs_dir):
    """Invariant: the same inputs give the same content hash; no temporary file is left behind."""
    first = build_index(GUIDES)
    identity = DocsIndex(first.path).identity()
    second = build_index(GUIDES)
    assert DocsIndex(second.path).identity()["content_sha256"] == identity["content_sha256"]
    assert identity["content_sha256"] == content_sha256(guide_documents())
    assert identity["version_key"] == version_key(GUIDES) and identity["n_docs"] == len(guide_documents())
    assert identity["sources"] == ["guides"] and identity["packages"] == {} and identity["user"] is None
    assert [p.name for p in docs_dir.iterdir()] == [first.path.name]
    assert first.counts == {"guides": len(guide_documents())} and first.failures == {}


def test_open_without_building_names_the_command(docs_dir):
    with pytest.raises(UserError, match="metakernel docs build"):
        DocsIndex.open(build_if_missing=False, sources=GUIDES)


def test_search_ranks_sections_and_filters_by_dsl(index):
    hits = index.search("Tx.alloc_shared", k=3)
    assert hits[0].doc_id == "guide:tirx#writing-the-kernel"
    assert "\n" not in hits[0].snippet
    tirx_only = index.search("stream", dsl="tirx", k=20)
    assert tirx_only and all(h.dsl in ("tirx", "") for h in tirx_only)
    assert any(h.doc_id == "guide:cute#streams" for h in index.search("streams", dsl="cute"))
    assert len(index.search("the", k=2)) == 2


def test_exact_names_come_first(index):
    """`guide:cute#streams` typed as a query is found by name before any bm25 ranking."""
    assert index.search("guide:cute#streams", k=1)[0].doc_id == "guide:cute#streams"


@pytest.mark.parametrize("query", ['"unbalanced', "tma AND copy", "shared*", "sha*", "a OR b NOT c", "NEAR(x y)",
                                   "(((", "title:streams", "-x", "'", "x^2", "col:umn \"", "streams; DROP TABLE",
                                   "make_layout(", "{}[]", "ünïcode", "AND", "*"])
def test_search_survives_any_text(index, query):
    """Invariant: user text never reaches FTS5 as syntax: hits or a DocsQueryError message, never sqlite3 errors."""
    try:
        hits = index.search(query)
    except DocsQueryError as exc:
        assert "nothing to search for" in str(exc)
        return
    assert isinstance(hits, list)


@pytest.mark.parametrize("query", ["", "   ", "***", '""', "AND OR NOT", "!?"])
def test_empty_query_is_a_clear_message(index, query):
    with pytest.raises(DocsQueryError, match="nothing to search for"):
        index.search(query)
    assert index.search_text(query).startswith("nothing to search for")


def test_query_translation_quotes_every_token():
    strict, loose = fts_queries('cute.make_layout "tma AND sha*')
    assert strict == '"cute make layout" AND "tma" AND "sha" *'
    assert loose == '"cute" OR "make" OR "layout" OR "tma" OR "sha"'


def test_cuda_c_spellings_are_searched_as_written_and_as_the_dsls_spell_them():
    """Agents bring CUDA C words ("__syncthreads", "atomicAdd"); the docs say sync_threads / atomic_add."""
    strict, loose = fts_queries("__syncthreads atomicAdd SmemAllocator barrier")
    assert strict == ('("syncthreads" OR "sync threads") AND ("atomicAdd" OR "atomic add") AND '
                      '("SmemAllocator" OR "Smem Allocator") AND "barrier"')
    assert '"sync" OR "threads"' in loose and '"atomic" OR "add"' in loose and '"barrier"' in loose
    assert fts_queries("shared memory") == ('"shared" AND "memory"', '"shared" OR "memory"')  # plain words: as is


def test_prefix_search_and_unknown_dsl(index):
    assert any(h.doc_id == "guide:cute#streams" for h in index.search("strea*", dsl="cute"))
    with pytest.raises(DocsQueryError, match="unknown dsl"):
        index.search("streams", dsl="triton")


def test_no_hits_is_a_hint_line(index):
    assert index.search_text("zzzqqqxxy") == ("no documents match for 'zzzqqqxxy'; try fewer or more general "
                                              "words, or another dsl")


def test_format_hits_one_line_per_hit(index):
    text = index.search_text("streams", k=2)
    lines = text.splitlines()
    assert len(lines) == 2
    assert re.match(r"^guide:\w+#[\w-]+  .+ — .+$", lines[0])


def test_read_known_truncated_and_unknown(index):
    text = index.read("guide:tirx#writing-the-kernel")
    assert text.startswith("guide:tirx#writing-the-kernel (tirx)  TIRx guide: Writing the kernel\n\n## Writing")
    short = index.read("guide:tirx#writing-the-kernel", max_chars=100)
    assert short.endswith(f"[truncated: showed 100 of {len(text)} characters]") and short.startswith(text[:100])
    missing = index.read("guide:tirx#writing-the-kernal")
    assert missing.startswith("no document 'guide:tirx#writing-the-kernal'; close ids: ")
    assert "guide:tirx#writing-the-kernel" in missing
    assert index.read("nothing-like-this-at-all-42") == ("no document 'nothing-like-this-at-all-42'; use "
                                                         "docs_search to find ids")
    assert index.read("tirx#dtypes").startswith("guide:tirx#dtypes")  # the prefix may be left out


def test_user_documents_split_by_format(upstream):
    found = {d.doc_id: d for d in user_documents(upstream)}
    assert set(found) == {
        "user:cutlass/media/layouts.md#overview", "user:cutlass/media/layouts.md#swizzling",
        "user:cutlass/media/layouts.md#details", "user:tvm/schedule.rst#scheduling",
        "user:tvm/schedule.rst#thread-binding", "user:notes.txt#overview", "user:example.py#overview",
        "user:example.py#wombat-kernel", "user:example.py#helper"}
    assert found["user:cutlass/media/layouts.md#swizzling"].dsl == "cute"
    assert found["user:tvm/schedule.rst#thread-binding"].dsl == "tirx"
    assert found["user:notes.txt#overview"].dsl == ""
    assert "return x + 1" in found["user:example.py#wombat-kernel"].body
    assert {d.dsl for d in user_documents(upstream, dsl="tirx")} == {"tirx"}
    with pytest.raises(UserError, match="no such file"):
        user_documents(upstream / "missing")


def test_user_index_is_searched_together_and_identified(docs_dir, upstream):
    report = build_user_index(upstream)
    assert report.n_docs == 9 and report.path.name == "user-docs.sqlite"
    with DocsIndex.open(sources=GUIDES) as index:
        assert index.search("zebracorn")[0].doc_id == "user:cutlass/media/layouts.md#swizzling"
        assert index.search("quokkathreads", dsl="cute") == []
        assert index.search("quokkathreads", dsl="tirx")[0].doc_id == "user:tvm/schedule.rst#thread-binding"
        mixed = {h.doc_id.split(":")[0] for h in index.search("layouts streams", k=20)}
        assert mixed == {"guide", "user"}
        assert "Bind loops" in index.read("user:tvm/schedule.rst#thread-binding")
        user = index.identity()["user"]
        assert user["n_docs"] == 9 and user["source"] == str(upstream.resolve())
    empty = upstream / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no .md, .rst"):
        build_user_index(empty)


def test_cli_build_search_show_info(docs_dir, upstream):
    runner = CliRunner()
    result = runner.invoke(docs, ["info"])
    assert result.exit_code == 1 and result.output.startswith("not built: ")
    result = runner.invoke(docs, ["build", "--from", str(upstream), "--dsl", "neutral"])
    assert result.exit_code == 0, result.output
    assert f"built {index_path()}" in result.output and "(9 documents from" in result.output
    result = runner.invoke(docs, ["build"])
    assert result.exit_code == 0 and result.output.startswith("up to date: ")
    result = runner.invoke(docs, ["search", "zebracorn", "swizzle", "--dsl", "tirx", "-k", "1"])
    assert result.exit_code == 0
    assert result.output.startswith("user:cutlass/media/layouts.md#swizzling  ")  # --dsl neutral at build
    result = runner.invoke(docs, ["search", "streams", "--json"])
    assert json.loads(result.output)[0]["doc_id"] == "guide:cute#streams"
    result = runner.invoke(docs, ["show", "guide:cute#streams"])
    assert result.exit_code == 0 and "## Streams" in result.output
    result = runner.invoke(docs, ["show", "guide:cute#stream"])
    assert result.exit_code == 1 and "close ids: guide:cute#streams" in result.output
    result = runner.invoke(docs, ["search", "***"])
    assert isinstance(result.exception, UserError) and "nothing to search for" in str(result.exception)
    result = runner.invoke(docs, ["info", "--json"])
    info = json.loads(result.output)
    assert info["version_key"] == version_key(GUIDES) and info["user"]["n_docs"] == 9


def test_index_built_from_the_installed_packages(tmp_path, monkeypatch):
    """One real build (a few seconds): known public names of both DSLs are found by search and by read."""
    monkeypatch.delenv("METAKERNEL_DOCS_SOURCES", raising=False)
    report = build_index(SOURCES, directory=tmp_path)
    assert report.counts["cute"] > 1000 and report.counts["tirx"] > 400 and report.counts["guides"] > 10
    assert not {"cutlass.cute", "cutlass", "tvm.tirx", "tvm.tirx.script", "torch"} & set(report.failures)
    with DocsIndex.open(build_if_missing=False, directory=tmp_path) as index:
        assert index.search("make_layout", dsl="cute")[0].doc_id == "cute:cute.make_layout"
        assert index.search("cta_id", dsl="tirx")[0].doc_id == "tirx:Tx.cta_id"
        assert index.search("tvm.compile", dsl="tirx")[0].doc_id == "tirx:tvm.compile"
        layout = index.read("cute:cute.make_layout")
        assert "cute.make_layout(shape" in layout and "Layout" in layout
        assert index.read("cute.core.make_layout").startswith("cute:cute.make_layout ")  # an alias
        assert index.read("Tx.float32").startswith("tirx:Tx.DtypeConstructor-objects")
        assert "Tx.cuda.atomic_add" in index.read("tirx:Tx.cuda")
        # Regression: namespaces hand out fresh objects, and a reused id() once made Tx.ptx.red an alias of an
        # unrelated object (and dropped ~100 Tx.ptx documents).
        assert index.read("Tx.ptx.red").startswith("tirx:Tx.ptx.red ")
        assert index.read("tvm.tirx.layout.warpid").startswith("tirx:tvm.tirx.layout.Axis-objects ")
        assert not any(h.dsl == "tirx" for h in index.search("layout", dsl="cute", k=20))
        identity = index.identity()
        assert identity["packages"] == {"cute": importlib.metadata.version("nvidia-cutlass-dsl"),
                                        "tirx": importlib.metadata.version("apache-tvm")}
        assert identity["n_docs"] == report.n_docs
    with sqlite3.connect(report.path) as db:
        bodies = "\n".join(row[0] for row in db.execute("SELECT body FROM documents"))
    assert " at 0x" not in bodies  # object addresses would make the content hash differ per build


def test_the_guide_section_covering_a_whole_question_is_lifted_into_the_top_three(tmp_path, monkeypatch):
    """bm25 over a long question's words ranks API one-liners that repeat one word above the note that answers
    all of it; the note covering most of the question's phrases comes third at worst, and nothing else moves."""
    from metakernel.docs_index import write_index
    from metakernel.docs_sources import Doc

    api = [Doc(f"cute:cute.arch.quux_size_{i}", "cute", f"cute.arch.quux_size_{i}",
               "allocate the maximum quux size: quux size, quux size") for i in range(5)]
    filler = " ".join(f"filler{i}" for i in range(300))  # a long note: bm25 discounts its one mention of each word
    note = Doc("guide:cute-notes#buffers", "", "CuTe DSL notes: buffers",
               f"{filler} To allocate a wombat buffer: the maximum quux size is 227 KB per block. {filler}")
    question = "how do I allocate a wombat in a kernel and what is the maximum quux size"  # no doc says kernel
    path = tmp_path / "index.sqlite"
    background = [Doc(f"cute:cute.other_{i}", "cute", f"cute.other_{i}", f"other{i} thing" + " wombat" * (i % 30 == 0))
                  for i in range(300)]  # a realistic vocabulary: the question's words are rare, wombat less so
    write_index(path, [*api, note, *background], {"sources": ["cute"]})
    with DocsIndex(path) as idx:
        lifted = [h.doc_id for h in idx.search(question, dsl="cute", k=8)]
        assert idx.search("quux size", dsl="cute", k=1)[0].doc_id.startswith("cute:cute.arch.quux_size")
        monkeypatch.setattr(DocsIndex, "_by_coverage", lambda self, query, found: found)
        plain = [h.doc_id for h in idx.search(question, dsl="cute", k=8)]
    note_id = "guide:cute-notes#buffers"
    assert note_id in lifted[:3] and note_id not in plain[:3]
    rest = [d for d in lifted if d != note_id]
    assert rest == [d for d in plain if d != note_id][:len(rest)]
