"""`metakernel skills`: lint SKILL.md files and diff two of them (list/show come with the attempt store)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from metakernel.errors import UserError

# Same settings as metakernel.cli.CONTEXT; repeated because cli.py imports this module (a cycle otherwise).
CONTEXT = {"auto_envvar_prefix": "METAKERNEL", "help_option_names": ["-h", "--help"], "max_content_width": 110}


def skill_files(paths: tuple[Path, ...]) -> list[Path]:
    """The files named, plus every SKILL.md under the directories named (sorted, each once)."""
    found: dict[Path, None] = {}
    for path in paths:
        if path.is_file():
            found[path] = None
        elif path.is_dir():
            found.update(dict.fromkeys(sorted(path.rglob("SKILL.md"))))
        else:
            raise UserError("no such file or directory", str(path))
    return list(found)


def _read_skill(path: Path) -> str:
    """A skill file's text; a directory means its SKILL.md (an attempt folder)."""
    target = path / "SKILL.md" if path.is_dir() else path
    if not target.is_file():
        raise UserError("no such file", str(target))
    return target.read_text(encoding="utf-8", errors="replace")


@click.group("skills", context_settings=CONTEXT)
def skills() -> None:
    """SKILL.md files: lint them (diagnostic only: skills transfer as written) and diff two of them."""


@skills.command("lint", context_settings=CONTEXT)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--strict", is_flag=True, help="Exit 1 when any file has a finding (soft ones included).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def skills_lint(paths: tuple[Path, ...], strict: bool, as_json: bool) -> None:
    """Report code, DSL API names, shell commands, a missing cap or evidence in SKILL.md files.

    PATHS: files, or directories searched recursively for files named SKILL.md.

    \b
    Examples:
      metakernel skills lint runs/exp1/attempts
      metakernel skills lint SKILL.md --strict
    """
    from metakernel.skills import lint_skill

    files = skill_files(paths)
    if not files:
        raise UserError(f"no SKILL.md found under {', '.join(map(str, paths))}")
    report = {str(path): lint_skill(_read_skill(path)) for path in files}
    if as_json:
        click.echo(json.dumps({path: [f.__dict__ for f in found] for path, found in report.items()}, indent=1))
    else:
        for path, found in report.items():
            click.echo(f"{path}: {len(found)} finding{'s' if len(found) != 1 else ''}")
            for finding in found:
                click.echo(f"  {finding}")
    if strict and any(report.values()):
        sys.exit(1)


@skills.command("diff", context_settings=CONTEXT)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
def skills_diff(a: Path, b: Path) -> None:
    """Unified diff of two skills (files, or attempt directories holding SKILL.md).

    \b
    Example:
      metakernel skills diff runs/exp1/attempts/m/p28_r1_solo_cute runs/exp1/attempts/m/p28_r2_solo_cute
    """
    from metakernel.skills import diff_skills

    text = diff_skills(_read_skill(a), _read_skill(b), str(a), str(b))
    click.echo(text.rstrip("\n") if text else "identical")
