"""The `metakernel` command line: noun-verb groups, every option mirrored by a METAKERNEL_* variable.

Bad input (unknown problem, malformed family card, a problem file that raises) ends in one line naming the file
and the cause, exit code 2; `--debug` shows the traceback. Failed checks exit 1.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from metakernel.errors import UserError

CONTEXT = {"auto_envvar_prefix": "METAKERNEL", "help_option_names": ["-h", "--help"], "max_content_width": 110}


def _load_dotenv() -> None:
    """Read `.env` in the working directory (KEY=VALUE lines) without overriding the environment."""
    path = Path(".env")
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            os.environ.setdefault(key.strip(), value.strip().strip("'\""))


@click.group(context_settings=CONTEXT)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="metakernel")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Metakernel: does kernel knowledge learned in one DSL transfer to another?

    \b
    Examples:
      metakernel problems list --family moe
      metakernel problems show 28
      metakernel problems validate              # all 74 on the CPU at small scale
      metakernel problems validate 1-18 --device cuda
      metakernel eval 28 --dsl tirx kernel.py --dry-run
      metakernel report --synthetic --out synthetic-report
    """
    ctx.obj = {"debug": debug}


@cli.group(context_settings=CONTEXT)
def problems() -> None:
    """The 74 problems: list, show, validate."""


@problems.command("list", context_settings=CONTEXT)
@click.option("--family", "family", default=None, help="Only this family (attention, kv_cache, mlp_norm, ...).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def problems_list(family: str | None, as_json: bool) -> None:
    """List problems with their family and one-line summary.

    \b
    Examples:
      metakernel problems list
      metakernel problems list --family attention --json
    """
    from metakernel.catalog import load_catalog

    catalog = load_catalog()
    if family is not None and family not in catalog.families:
        raise UserError(f"unknown family {family!r} (families: {', '.join(catalog.families)})")
    rows = [p for p in catalog.summaries() if family is None or p.family == family]
    if as_json:
        click.echo(json.dumps([{**p.identity, "title": p.title, "path": str(p.path)} for p in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} problems" + (f" in {family}" if family else ""))
    for col in ("NN", "family", "slug", "what it computes"):
        table.add_column(col, overflow="fold")
    for p in rows:
        table.add_row(p.nn, p.family, p.slug, p.title)
    Console().print(table)


@problems.command("show", context_settings=CONTEXT)
@click.argument("number", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def problems_show(number: int, as_json: bool) -> None:
    """Show one problem: provenance, shapes, roofline numbers, source and both variants' task text.

    \b
    Example:
      metakernel problems show 14
    """
    from metakernel.showing import describe, render

    info = describe(number)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
    else:
        render(info)


@problems.command("validate", context_settings=CONTEXT)
@click.argument("selection", nargs=-1)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where to run the references.")
@click.option("--scale", type=click.Choice(["small", "full"]), default=None,
              help="Input scale [default: small on cpu, full on cuda].")
@click.option("--json", "as_json", is_flag=True, help="Print the per-problem reports as JSON.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON report here (rewritten after every problem).")
@click.option("--gold", is_flag=True,
              help="Grade the solutions/ tree instead: gold must pass, wrong must fail as their docstring says.")
@click.option("--resume", is_flag=True, help="Keep --report's entries whose problem file is unchanged.")
@click.option("--time-budget", type=float, default=None,
              help="Stop starting new problems after this many seconds (exit 3: resume later).")
@click.option("--untimed", is_flag=True,
              help="With --gold --device cuda: correctness, ablations, audit and DSL share only (no timing, no "
                   "baselines): the kernel writer's loop, seconds per file.")
@click.option("--jobs", type=click.IntRange(1, 8), default=1, show_default=True,
              help="With --gold --device cuda: grade this many files at once; their untimed phases overlap, every "
                   "timed phase still has the GPU alone.")
def problems_validate(selection: tuple[str, ...], device: str, scale: str | None, as_json: bool,
                      report_path: Path | None, gold: bool, resume: bool, time_budget: float | None,
                      untimed: bool, jobs: int) -> None:
    """Prove problems sane (contract, seeds, determinism, precision, rejections, alt_reference, size, time).

    Checks: the file contract; fresh seeds; determinism; precision vs the float64 anchor; the rule rejects
    all-zeros and random outputs; alt_reference agreement; input size; eager time.

    SELECTION: problem numbers, ranges (3-7) or family names, comma or space separated (default: all).

    \b
    Examples:
      metakernel problems validate
      metakernel problems validate 1-3 moe --device cuda --report out.json
    """
    from metakernel.validate_run import run_validation

    if resume and report_path is None:
        raise UserError("--resume needs --report FILE")
    if untimed and not (gold and device == "cuda"):
        raise UserError("--untimed grades solutions on the GPU: use it with --gold --device cuda")
    if jobs > 1 and not (gold and device == "cuda"):
        raise UserError("--jobs grades solutions side by side on the GPU: use it with --gold --device cuda")
    if gold:
        from metakernel.validate_run import run_gold_validation

        sys.exit(run_gold_validation(",".join(selection), device=device, as_json=as_json, report_path=report_path,
                                     resume=resume, time_budget=time_budget, timed=not untimed,
                                     jobs=jobs))
    code = run_validation(",".join(selection), device=device, scale=scale, as_json=as_json,
                          report_path=report_path, resume=resume, time_budget=time_budget)
    sys.exit(code)


@cli.command("eval", context_settings=CONTEXT)
@click.argument("number", type=int)
@click.argument("kernel", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dsl", type=click.Choice(["cute", "tirx"]), required=True, help="The variant graded.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu grades at small scale (only DSL kernels that run on the CPU, e.g. TIRx llvm).")
@click.option("--dry-run", is_flag=True, help="Only the free CPU check: rules, import, compile, structure.")
@click.option("--draws", type=int, default=5, show_default=True, help="Correctness draws (at least 5).")
@click.option("--flush-l2", is_flag=True, help="Flush the L2 cache before every timed call.")
@click.option("--no-baselines", is_flag=True, help="Skip the eager baseline (no speedup).")
@click.option("--no-timing", is_flag=True,
              help="Correctness, ablations, audit and DSL share only (no timing, no baselines): a quick check.")
@click.option("--compile-baseline", is_flag=True, help="Also time torch.compile of the reference.")
@click.option("--json", "as_json", is_flag=True, help="Print the full versioned report as JSON.")
def eval_cmd(number: int, kernel: Path, dsl: str, device: str, dry_run: bool, draws: int, flush_l2: bool,
             no_baselines: bool, no_timing: bool, compile_baseline: bool, as_json: bool) -> None:
    """Grade one kernel file for problem NUMBER's DSL variant and print the report.

    \b
    Examples:
      metakernel eval 28 --dsl tirx solutions/mlp_norm/28_fused_add_rmsnorm_h4096/correct/tirx.py
      metakernel eval 28 --dsl cute kernel.py --dry-run
    """
    from metakernel.catalog import load_catalog
    from metakernel.grader.evaluate import GradeOptions, grade
    from metakernel.grader.evaluate import dry_run as run_dry

    if draws < 5:
        raise UserError("--draws must be at least 5 (the protocol's minimum)")
    if not kernel.is_file():
        raise UserError("no such file", str(kernel))
    problem = load_catalog().problem(number)
    if dry_run:
        report = run_dry(problem, dsl, kernel)
    else:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda but torch sees no CUDA device (use --dry-run on a CPU machine)")
        options = GradeOptions(draws=draws, flush_l2=flush_l2, baselines=not no_baselines,
                               compile_baseline=compile_baseline, timed=not no_timing)
        report = grade(problem, dsl, kernel, device=device, options=options)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        click.echo(report.agent_text())
    sys.exit(0 if report.passed else 1)


#: The demo experiment of `metakernel report --synthetic`: fixed seed, a planted lift in cute2tirx only (faster
#: kernels, log effect 0.5, and more passes, +1 on the logit: a speed effect alone drowns in pass/fail flips at 24
#: problems).
SYNTHETIC_REPORT = {"n_problems": 24, "models": ("model-a", "model-b"), "replicates": 3,
                    "effect": {"cute2tirx": 0.5}, "pass_effect": {"cute2tirx": 1.0}, "seed": 0, "skip_prob": 0.05}


@cli.command("report", context_settings=CONTEXT)
@click.argument("experiment", required=False, type=click.Path(path_type=Path))
@click.option("--format", "formats", multiple=True, metavar="md|html|json",
              help="Output format; repeat or comma-separate [default: md,html,json].")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory [default: EXPERIMENT's folder/report, or ./synthetic-report].")
@click.option("--tau", type=float, default=0.05, show_default=True, help="Dead band of helped/harmed.")
@click.option("--floor", type=float, default=0.05, show_default=True, help="Floor of the clipped speedup.")
@click.option("--speed", type=click.Choice(["e2e", "gpu"]), default="e2e", show_default=True,
              help="Speedup every metric uses: e2e (eager median / kernel median, the protocol's) or gpu (GPU kernel "
                   "time alone, steadier between gradings; needs attempts graded with profiled baselines).")
@click.option("--synthetic", is_flag=True, help="Report on a generated demo experiment (labelled SYNTHETIC).")
def report_cmd(experiment: Path | None, formats: tuple[str, ...], out_dir: Path | None, tau: float, floor: float,
               speed: str, synthetic: bool) -> None:
    """Write the analysis report (Markdown, HTML, JSON and PNG plots) of an experiment.

    EXPERIMENT is an experiment directory (`metakernel run --experiment`), an exported bundle (`metakernel
    export`) or its results.json, or an attempt table (.csv or .json records). --synthetic reports on a
    generated experiment instead, with a planted effect in cute2tirx; every output then says SYNTHETIC DATA first.

    \b
    Examples:
      metakernel report --synthetic --out demo
      metakernel report runs/exp1 --format md,html --tau 0.1
      metakernel report runs/exp1 --speed gpu --out runs/exp1/report-gpu
      metakernel report runs/exp1-export/results.json --format md --format json
    """
    # Cheap checks first: the analysis imports (pandas, scipy, matplotlib) take seconds.
    if synthetic == (experiment is not None):
        raise UserError("give either EXPERIMENT (an experiment, an export bundle or an attempt table) or --synthetic")
    if experiment is not None and not experiment.exists():
        raise UserError("no such file or directory", str(experiment))
    if tau < 0:
        raise UserError(f"--tau must be >= 0, got {tau:g}")
    if floor <= 0:
        raise UserError(f"--floor must be positive, got {floor:g}")

    from metakernel.analysis.loading import load_attempts
    from metakernel.analysis.records import synthetic_experiment
    from metakernel.analysis.render import FORMATS, write_report
    from metakernel.analysis.report import SYNTHETIC_BANNER

    chosen = [f.strip() for value in formats for f in value.split(",") if f.strip()] or list(FORMATS)
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown:
        raise UserError(f"unknown --format {', '.join(unknown)} (use {', '.join(FORMATS)})")

    if experiment is None:
        df = synthetic_experiment(**SYNTHETIC_REPORT)  # type: ignore[arg-type]
        out = out_dir or Path("synthetic-report")
    else:
        df = load_attempts(experiment)
        out = out_dir or (experiment if experiment.is_dir() else experiment.parent) / "report"
    if bool(df["synthetic"].astype(bool).any()) if len(df) else False:
        click.echo(SYNTHETIC_BANNER)
    try:
        written = write_report(df, out, chosen, tau=tau, floor=floor, speed=speed)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    for fmt, path in written.items():
        for p in path if isinstance(path, list) else [path]:
            click.echo(f"wrote {fmt}: {p}")


def _add_groups() -> None:
    from metakernel.cli_docs import docs
    from metakernel.cli_results import export
    from metakernel.cli_run import regrade_cmd, run_cmd
    from metakernel.cli_skills import skills

    cli.add_command(docs)
    cli.add_command(skills)
    cli.add_command(run_cmd)
    cli.add_command(regrade_cmd)
    cli.add_command(export)


_add_groups()


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry: one-line errors with exit code 2 unless --debug."""
    _load_dotenv()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("METAKERNEL_DEBUG", "") not in ("", "0", "false")
    try:
        return cli.main(args=args, prog_name="metakernel", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except UserError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"metakernel: error: {exc}", err=True)
        sys.exit(2)
