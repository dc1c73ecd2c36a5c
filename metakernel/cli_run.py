"""`metakernel run` and `metakernel regrade`: the commands that launch attempts and re-measure their kernels.

Everything that can be wrong with the request (an unknown model or problem, a missing key variable, an impossible
budget, a changed protocol in an existing experiment directory) is reported in one line before anything starts.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from metakernel.errors import UserError

CONTEXT = {"auto_envvar_prefix": "METAKERNEL", "help_option_names": ["-h", "--help"], "max_content_width": 110}


def _problems(text: str) -> list[int]:
    from metakernel.catalog import load_catalog
    from metakernel.problem import parse_selection

    catalog = load_catalog()
    chosen = parse_selection(text, catalog.paths, catalog.families)
    if not chosen:
        raise UserError(f"--problems {text!r} selects no problem")
    return chosen


@click.command("run", context_settings=CONTEXT)
@click.option("--model", "models", multiple=True, required=True,
              help="litellm model string, a spec YAML (agents/models/), scripted/<policy> or local/smollm2; repeat.")
@click.option("--direction", type=click.Choice(["cute2tirx", "tirx2cute", "both"]), default="both", show_default=True)
@click.option("--problems", "problems", required=True, help="Numbers, ranges and family names: 1-18,28,moe.")
@click.option("--replicates", type=int, default=2, show_default=True, help="Replicates of every arm.")
@click.option("--submissions", type=int, default=10, show_default=True, help="Graded submissions per attempt.")
@click.option("--wall", default="40m", show_default=True, help="Wall clock per attempt (model + grading, not queue).")
@click.option("--tokens", type=int, default=None, help="Optional token budget per attempt (prompt + completion).")
@click.option("--cost", "cost", type=float, default=None, help="Optional dollar budget per attempt.")
@click.option("--turns", type=int, default=None, help="Optional cap on model calls per attempt.")
@click.option("--experiment", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Experiment directory (created, or resumed with the same command).")
@click.option("--trials", multiple=True, help="Only these addresses (p28_r1_solo_cute ...) and what they need.")
@click.option("--executor", type=click.Choice(["local", "stand-in"]), default="local", show_default=True,
              help="local: the GPU grader; stand-in: CPU dry runs, results marked synthetic (CI only).")
@click.option("--llm-mode", type=click.Choice(["off", "record", "replay"]), default="record", show_default=True)
@click.option("--llm-cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Record/replay file [default: EXPERIMENT/llm_cache.sqlite].")
@click.option("--api-key-env", default=None, help="Name of the variable holding the API key (never the key).")
@click.option("--api-base", default=None, help="Base URL of an OpenAI-compatible server.")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Attempts in flight.")
@click.option("--spend-cap", type=float, default=None, help="Dollars after which no new attempt starts.")
@click.option("--no-docs", is_flag=True, help="Run without the docs index (docs_search answers 'unavailable').")
@click.option("--dry-run", is_flag=True, help="Print counts, worst-case GPU-hours and dollars; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def run_cmd(models: tuple[str, ...], direction: str, problems: str, replicates: int, submissions: int, wall: str,
            tokens: int | None, cost: float | None, turns: int | None, experiment: Path, trials: tuple[str, ...],
            executor: str, llm_mode: str, llm_cache: Path | None, api_key_env: str | None, api_base: str | None,
            concurrency: int, spend_cap: float | None, no_docs: bool, dry_run: bool, as_json: bool) -> None:
    """Run (or resume) a transfer experiment: solo attempts, skills, skill-conditioned attempts.

    \b
    Examples:
      metakernel run --model openai-gpt-5 --direction both --problems 1-18 --experiment runs/gpt5-attn
      metakernel run --model scripted/gold --problems 28,36 --executor stand-in --experiment /tmp/demo
      metakernel run --model anthropic/claude-sonnet-4-5 --problems moe --dry-run --experiment runs/x
    Kill it at any time; the same command resumes. Finished attempts are never redone.
    """
    from metakernel.budget import Budget, parse_duration
    from metakernel.experiment import Experiment, RunConfig

    if replicates < 1:
        raise UserError(f"--replicates must be at least 1, got {replicates}")
    budget = Budget(submissions=submissions, wall_s=parse_duration(wall), tokens=tokens, cost_usd=cost,
                    turns=turns).validate()
    cfg = RunConfig(models=list(models), problems=_problems(problems), direction=direction, experiment=experiment,
                    replicates=replicates, budget=budget, trials=list(trials), executor=executor, llm_mode=llm_mode,
                    llm_cache=llm_cache, api_key_env=api_key_env, api_base=api_base, concurrency=concurrency,
                    spend_cap_usd=spend_cap, docs=not no_docs)
    exp = Experiment(cfg, check_keys=not dry_run)
    if dry_run:
        click.echo(exp.estimate_text(exp.done_keys()))
        return
    if executor == "local":
        from metakernel.executor import preflight

        preflight()  # before any model call: a machine that cannot grade must not spend one
    argv = ["metakernel", *sys.argv[1:]]
    try:
        summary = _run_with_progress(exp, argv)
    except KeyboardInterrupt:
        done = len(exp.done_keys())
        click.echo(f"interrupted: {done} of {len(exp.order)} attempts finished and kept; the same command "
                   "resumes", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in summary.items()))
    if summary["outcome"] != "complete":
        sys.exit(3)


def _run_with_progress(exp: Any, argv: list[str]) -> dict[str, Any]:
    """The experiment, with a progress bar on a terminal."""
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("attempts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("attempts", total=len(exp.order))
            def echo(line: str) -> None:
                bar.console.print(line, markup=False, highlight=False)

            return asyncio.run(exp.run(argv, echo=echo,
                                       progress=lambda done, total: bar.update(task, completed=done)))
    return asyncio.run(exp.run(argv, echo=click.echo))


@click.command("regrade", context_settings=CONTEXT)
@click.argument("experiment", type=click.Path(path_type=Path))
@click.option("--trials", multiple=True, help="Only these addresses (default: every finished attempt).")
@click.option("--executor", type=click.Choice(["local", "stand-in"]), default="local", show_default=True)
def regrade_cmd(experiment: Path, trials: tuple[str, ...], executor: str) -> None:
    """Re-grade saved final kernels without calling a model (reports stored beside the originals)."""
    from metakernel.experiment import regrade

    if not experiment.is_dir():
        raise UserError("no such experiment folder", str(experiment))
    if executor == "local":
        from metakernel.executor import preflight

        preflight()
    asyncio.run(regrade(experiment, executor, list(trials) or None, echo=click.echo))
