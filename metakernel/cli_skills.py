"""`metakernel skills`: list and show an experiment's skills with the pair each one fed; lint and diff files."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any

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
    """SKILL.md files: list and show an experiment's, lint them (diagnostic only: skills transfer as written), diff."""


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


DASH = "—"


def _num(value: Any, fmt: str = ".2f", suffix: str = "") -> str:
    return DASH if value is None else f"{value:{fmt}}{suffix}"


def _source(rec: dict[str, Any]) -> str:
    if rec["source_status"] is None:
        return f"({rec['state']})"
    if rec["source_status"] == "passed":
        return f"passed {_num(rec['source_speedup'], suffix='x')}"
    return str(rec["source_status"])


def _tiers(rec: dict[str, Any]) -> str:
    return DASH if rec["skill_tier"] is None else f"{rec['skill_tier']}/{rec['solo_tier']}"


def _outcomes(experiment: Path, model: str | None) -> list[dict[str, Any]]:
    from metakernel.skill_outcomes import skill_outcomes
    from metakernel.store import Store, is_experiment

    if not is_experiment(experiment):
        raise UserError("not an experiment directory (no metakernel.sqlite)", str(experiment))
    with Store(experiment) as store:
        if model is not None:
            from metakernel.plan import model_slug

            models = sorted({r["model"] for r in store.attempts()})
            if not any(model in (m, model_slug(m)) for m in models):
                raise UserError(f"unknown model {model!r} (models: {', '.join(models) or 'none'})", str(experiment))
        found = skill_outcomes(store, model)
    return found


@skills.command("list", context_settings=CONTEXT)
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--model", default=None, help="Only this model (its name or its folder slug).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every field, lint findings too).")
def skills_list(experiment: Path, model: str | None, as_json: bool) -> None:
    """One row per SKILL.md the experiment's attempts wrote, with the outcome of the pair it fed.

    A solo attempt's skill feeds the skill arm of the same replicate in the other DSL, which is compared with the
    target DSL's solo attempt of that replicate. Columns: SOURCE the attempt's best result (status and speedup);
    SRC_TIER its tier (0 failed, 1..5 by speedup); BYTES the skill's size and TRUNC whether it was cut to the
    budget; LINT how many lint findings it drew (code blocks, DSL names or APIs, shell commands, narrative, no
    measurements: `skills show` lists them); PAIR the class of the pair it fed (helped/neutral/harmed/
    both_failed/skipped, or pending); C_SKILL and C_SOLO that pair's clipped speedups (floor 0.05); TIERS
    skill/solo tiers. Skills written by skill arms fed no pair.

    \b
    Examples:
      metakernel skills list runs/exp1
      metakernel skills list runs/exp1 --model openai/gpt-4o --json
    """
    rows = _outcomes(experiment, model)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo("no skills recorded yet")
        return
    header = ["ATTEMPT", "MODEL", "ARM", "SOURCE", "SRC_TIER", "BYTES", "TRUNC", "LINT", "PAIR", "C_SKILL", "C_SOLO",
              "TIERS"]
    table = [[r["address"], r["model"], r["arm"], _source(r), _num(r["source_tier"], "d"), str(r["bytes"]),
              "yes" if r["truncated"] else "no", str(r["lint_findings"]), r["pair_class"] or DASH,
              _num(r["c_skill"]), _num(r["c_solo"]), _tiers(r)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    counts: dict[str, int] = {}
    for r in rows:
        if r["pair_class"]:
            counts[r["pair_class"]] = counts.get(r["pair_class"], 0) + 1
    summary = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
    click.echo(f"{len(rows)} skill{'s' if len(rows) != 1 else ''}" + (f"; pairs fed: {summary}" if summary else ""))


def _finding_text(finding: Any) -> str:
    from metakernel.skills import Finding

    try:
        return str(Finding(**finding))
    except TypeError:
        return json.dumps(finding)


@skills.command("show", context_settings=CONTEXT)
@click.argument("experiment", type=click.Path(path_type=Path))
@click.argument("address")
@click.option("--model", default=None, help="The model (name or slug), when several have an attempt at ADDRESS.")
def skills_show(experiment: Path, address: str, model: str | None) -> None:
    """Print the SKILL.md an attempt wrote, under a header with its facts, the pair it fed and its lint findings.

    ADDRESS: the attempt within its model (p28_r1_solo_cute) or its full id (<model_slug>/p28_r1_solo_cute).

    \b
    Examples:
      metakernel skills show runs/exp1 p28_r1_solo_cute
      metakernel skills show runs/exp1 p28_r1_solo_cute --model openai/gpt-4o
    """
    rows = _outcomes(experiment, model)
    wanted = address.strip()
    found = [r for r in rows if wanted in (r["address"], r["attempt_id"])]
    if not found:
        from metakernel.store import Store

        with Store(experiment) as store:
            silent = [a for a in store.attempts() if wanted in (a["attempt_id"], a["attempt_id"].rsplit("/", 1)[-1])]
        names = sorted({r["address"] for r in rows} | {r["attempt_id"] for r in rows})
        close = difflib.get_close_matches(wanted, names, n=5, cutoff=0.6)
        hint = f"; close: {', '.join(close)}" if close else f"; {len(rows)} skills (metakernel skills list)"
        why = (f"attempt {wanted!r} wrote no SKILL.md (state {silent[0]['state']}, status {silent[0]['status']})"
               if len(silent) == 1 else f"no skill at {wanted!r}")
        raise UserError(why + hint, str(experiment))
    if len(found) > 1:
        raise UserError(f"{wanted!r} names skills of several models ({', '.join(r['model'] for r in found)}): "
                        "pass --model or the full <model_slug>/<address>", str(experiment))
    rec = found[0]
    from metakernel.store import Store

    with Store(experiment) as store:
        text = store.skill(rec["attempt_id"])
    if text is None:
        text = (f"(the store indexes this skill, sha256 {rec['sha256'][:12]}, but its file "
                f"attempts/{rec['attempt_id']}/SKILL.md is missing from this experiment directory)\n")
    click.echo(f"# {rec['attempt_id']}  (model {rec['model']}, problem {rec['problem']} {rec['family']}, "
               f"arm {rec['arm']}, replicate {rec['replicate']})")
    click.echo(f"# source: {_source(rec)}, tier {_num(rec['source_tier'], 'd')}")
    click.echo(f"# skill: {rec['bytes']} bytes" + (f", truncated from {rec['original_bytes']}" if rec["truncated"]
                                                    else ", not truncated") + f", sha256 {rec['sha256'][:12]}")
    if rec["fed"] is None:
        click.echo("# fed: no pair (only solo attempts' skills are transferred)")
    else:
        click.echo(f"# fed: {rec['fed']} vs {rec['compared_with']} ({rec['direction']}): {rec['pair_class']}"
                   + (f", c_skill {_num(rec['c_skill'])}, c_solo {_num(rec['c_solo'])}, tiers {_tiers(rec)}"
                      if rec["c_skill"] is not None else ""))
    click.echo(f"# lint: {rec['lint_findings']} finding{'s' if rec['lint_findings'] != 1 else ''}")
    for finding in rec["lint"]:
        click.echo(f"#   {_finding_text(finding)}")
    click.echo("")
    click.echo(text.rstrip("\n"))
