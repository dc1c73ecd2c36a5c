"""`metakernel export`: the self-contained bundle (results.json with a legend, skills, kernels) of an experiment."""

from __future__ import annotations

from pathlib import Path

import click

# Same settings as metakernel.cli.CONTEXT; repeated because cli.py imports this module (a cycle otherwise).
CONTEXT = {"auto_envvar_prefix": "METAKERNEL", "help_option_names": ["-h", "--help"], "max_content_width": 110}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@click.command("export", context_settings=CONTEXT)
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Bundle directory: new, empty, or a previous bundle (replaced; other files in it are kept).")
def export(experiment: Path, out_dir: Path) -> None:
    """Write EXPERIMENT's results as a bundle every report can be recomputed from, without the database.

    The bundle holds results.json (schema metakernel.export/1: a legend, the experiment's configuration and
    provenance, runs, the attempt table, attempts still missing, submissions, model-call totals, skills), plus
    skills/<attempt>/SKILL.md and kernels/<attempt>/ (kernel versions, grader reports, transcript, result).

    \b
    Examples:
      metakernel export runs/exp1 --out exports/exp1
      metakernel report exports/exp1 --out exports/exp1/report
    """
    from metakernel.export import RESULTS_NAME, export_bundle, read_bundle

    bundle = export_bundle(experiment, out_dir)
    data = read_bundle(bundle)
    attempts = data["attempts"]
    passed = sum(1 for a in attempts if a["status"] == "passed")
    skipped = sum(1 for a in attempts if a["status"] == "skipped")
    n_files = sum(len(files) for files in data["files"].values())
    click.echo(f"wrote {bundle / RESULTS_NAME}: {_plural(len(attempts), 'attempt')} ({passed} passed, "
               f"{skipped} skipped), {len(data['missing'])} missing, "
               f"{_plural(len(data['submissions']), 'submission')}, {_plural(len(data['skills']), 'skill')}")
    click.echo(f"copied {_plural(n_files, 'file')} under {bundle / 'kernels'} and {bundle / 'skills'}")
    if data["missing"]:
        states: dict[str, int] = {}
        for row in data["missing"]:
            states[row["state"]] = states.get(row["state"], 0) + 1
        click.echo("missing (not in the attempt table): "
                   + ", ".join(f"{n} {state}" for state, n in sorted(states.items())))
