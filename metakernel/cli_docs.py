"""`metakernel docs`: build, search and read the docs index the agents' docs_search/docs_read tools use."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from metakernel.errors import UserError

# Same settings as metakernel.cli.CONTEXT; repeated because cli.py imports this module (a cycle otherwise).
CONTEXT = {"auto_envvar_prefix": "METAKERNEL", "help_option_names": ["-h", "--help"], "max_content_width": 110}


def _progress(message: str) -> None:
    click.echo(f"docs: {message}", err=True)


@click.group("docs", context_settings=CONTEXT)
def docs() -> None:
    """The docs index agents search: our guides plus docstrings of the installed CuTe DSL and TIRx.

    Built on this machine from the installed packages (no upstream text ships with metakernel), versioned by
    the DSL versions and the guides, cached under ~/.cache/metakernel/docs (METAKERNEL_DOCS_DIR overrides;
    METAKERNEL_DOCS_SOURCES=guides,tirx limits what is indexed, e.g. on a machine with one DSL).
    """


@docs.command("build", context_settings=CONTEXT)
@click.option("--from", "from_path", type=click.Path(path_type=Path), default=None,
              help="Also index a local copy of upstream docs (.md/.rst/.txt/.py), replacing the previous one.")
@click.option("--dsl", "user_dsl", type=click.Choice(["cute", "tirx", "neutral"]), default=None,
              help="DSL of the --from docs [default: guessed per file from its path].")
@click.option("--force", is_flag=True, help="Rebuild the main index even when it is current.")
def docs_build(from_path: Path | None, user_dsl: str | None, force: bool) -> None:
    """Build the index for the installed DSL versions (importing them takes seconds), and --from docs.

    \b
    Examples:
      metakernel docs build
      metakernel docs build --from ~/src/cutlass/media/docs --dsl cute
    """
    from metakernel.docs_index import build_index, build_user_index, index_path

    path = index_path()
    if force or not path.is_file():
        report = build_index(progress=_progress)
        click.echo(f"built {report.path} ({report.n_docs} documents: "
                   + ", ".join(f"{k} {v}" for k, v in report.counts.items())
                   + f"; {report.seconds:.1f} s, {report.size_bytes / 1e6:.1f} MB)")
        for module, cause in report.failures.items():
            click.echo(f"  not indexed: {module}: {cause}")
    else:
        click.echo(f"up to date: {path} (use --force to rebuild)")
    if from_path is not None:
        dsl = None if user_dsl is None else ("" if user_dsl == "neutral" else user_dsl)
        user = build_user_index(from_path, dsl=dsl)
        click.echo(f"built {user.path} ({user.n_docs} documents from {from_path})")


@docs.command("search", context_settings=CONTEXT)
@click.argument("query", nargs=-1, required=True)
@click.option("--dsl", type=click.Choice(["cute", "tirx"]), default=None,
              help="Only this DSL's documents (plus DSL-neutral ones).")
@click.option("-k", "k", type=click.IntRange(1, 50), default=8, show_default=True, help="How many hits.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def docs_search(query: tuple[str, ...], dsl: str | None, k: int, as_json: bool) -> None:
    """Search like an agent's docs_search: one line per hit, "<doc_id>  <title> — <snippet>".

    \b
    Examples:
      metakernel docs search make_layout --dsl cute
      metakernel docs search shared memory allocation -k 3
    """
    from metakernel.docs_index import DocsIndex, format_hits

    text = " ".join(query)
    with DocsIndex.open(progress=_progress) as index:
        hits = index.search(text, dsl or "", k)
    if as_json:
        click.echo(json.dumps([h.__dict__ for h in hits], indent=1))
    else:
        click.echo(format_hits(hits, text))


@docs.command("show", context_settings=CONTEXT)
@click.argument("doc_id")
@click.option("--max-chars", type=int, default=0, show_default=True,
              help="Truncate like docs_read (it uses 12000); 0 shows everything.")
def docs_show(doc_id: str, max_chars: int) -> None:
    """Print one document (an id from `docs search`, or a name like cute.make_layout); exit 1 if unknown.

    \b
    Example:
      metakernel docs show guide:tirx#writing-the-kernel
    """
    from metakernel.docs_index import DocsIndex

    with DocsIndex.open(progress=_progress) as index:
        found = index.get(doc_id) is not None
        click.echo(index.read(doc_id, max_chars=max_chars))
    if not found:
        sys.exit(1)


@docs.command("info", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def docs_info(as_json: bool) -> None:
    """Show the index's version key, document counts, content hash, size and import failures (exit 1: not built).

    \b
    Example:
      metakernel docs info --json
    """
    from metakernel.docs_index import DocsIndex, index_path, version_key

    try:
        index = DocsIndex.open(build_if_missing=False)
    except UserError:
        click.echo(f"not built: {index_path()} (version key {version_key()}); run `metakernel docs build`")
        sys.exit(1)
    with index:
        info = index.info()
    if as_json:
        click.echo(json.dumps(info, indent=1))
        return
    for key in ("version_key", "path", "n_docs", "counts", "content_sha256", "size_bytes", "build_seconds",
                "built_at", "import_failures", "user_path", "user"):
        click.echo(f"{key}: {info.get(key)}")
