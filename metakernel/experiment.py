"""`metakernel run`: plan an experiment, check everything that can fail before anything starts, then schedule.

Resumability is the store's job (a killed run leaves attempts `running`; the next run resets them to `pending` and
redoes them whole); this module's job is ordering and limits: a skill attempt starts only after its source solo
attempt is done (and is `skipped` if that source wrote no SKILL.md), at most `concurrency` attempts are in flight,
grading is bounded by the executor's slots, each model's calls by its own concurrency, and no new attempt starts
once the spend cap is reached. Infrastructure failures are retried `infra_retries` times within the run and then
left for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from metakernel.budget import Budget, SpendCap, estimate, litellm_cache_price, litellm_prices, render
from metakernel.errors import UserError
from metakernel.plan import AttemptKey, build_plan, order

#: Config keys that decide whether two runs into one directory are the same protocol (see Store.init_experiment).
IDENTITY_KEYS = ("budget", "executor", "prompt_hash", "grader_options")


@dataclass
class RunConfig:
    """Everything `metakernel run` was asked for (recorded in the store, minus anything secret)."""

    models: list[str]
    problems: list[int]
    direction: str
    experiment: Path
    replicates: int = 2
    budget: Budget = field(default_factory=Budget)
    trials: list[str] = field(default_factory=list)
    executor: str = "local"
    llm_mode: str = "record"
    llm_cache: Path | None = None
    api_key_env: str | None = None
    api_base: str | None = None
    concurrency: int = 4
    spend_cap_usd: float | None = None
    infra_retries: int = 1
    docs: bool = True
    grade_s_estimate: float = 90.0


def _guides_hash() -> str:
    from metakernel.paths import guides_dir

    h = hashlib.sha256()
    for path in sorted(guides_dir().glob("*.md")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


class Experiment:
    """A validated plan, ready to estimate or run."""

    def __init__(self, cfg: RunConfig, *, check_keys: bool = True) -> None:
        """`check_keys=False` for a plan that calls no model (`--dry-run`): it needs no API key."""
        from metakernel.agents.models import resolve_model
        from metakernel.agents.replay import parse_mode
        from metakernel.catalog import load_catalog

        self.llm_mode = parse_mode(cfg.llm_mode)
        if cfg.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1, got {cfg.concurrency}")
        if not cfg.models:
            raise UserError("name at least one --model")
        cfg.budget.validate()
        self.cfg = cfg
        catalog = load_catalog()
        # Loaded once, here: unknown or broken problems fail before anything starts, and attempts reuse them.
        self.problems = {number: catalog.problem(number) for number in cfg.problems}
        replay = cfg.llm_mode == "replay"
        self.specs = {m: resolve_model(m, cfg.api_key_env, cfg.api_base, require_key=check_keys and not replay)
                      for m in cfg.models}
        self.plan = build_plan(cfg.models, cfg.problems, cfg.direction, cfg.replicates, cfg.trials or None)
        self.order = order(self.plan)
        from metakernel.executor import make_executor

        self.executor = make_executor(cfg.executor)

    # -------------------------------------------------------------------------------------------- dry run
    def estimate_text(self, done: set[AttemptKey] | None = None) -> str:
        """Counts, worst-case GPU-hours and dollars (where priced) for what is left to run."""
        prices = {m: litellm_prices(self.specs[m].model) for m in self.cfg.models}
        cached = {m: litellm_cache_price(self.specs[m].model) for m in self.cfg.models}
        est = estimate(self.plan, self.cfg.budget, prices, grade_s=self.cfg.grade_s_estimate, done=done or set(),
                       cache_prices=cached, gpu=self.cfg.executor != "stand-in")
        return render(est)

    def done_keys(self) -> set[AttemptKey]:
        """Attempts an existing store already finished (so a dry run of a resume counts only what is left)."""
        from metakernel.store import Store, is_experiment

        if not is_experiment(self.cfg.experiment):
            return set()
        with Store(self.cfg.experiment) as store:
            finished = {r["attempt_id"] for r in store.attempts("done")}
        return {k for k in self.plan if k.attempt_id in finished}

    # -------------------------------------------------------------------------------------------- records
    def config_record(self) -> dict[str, Any]:
        """The configuration as stored: model specs without keys (the key's variable name only)."""
        from metakernel.agents.prompts import prompt_hash
        from metakernel.grader.evaluate import GradeOptions

        cfg = self.cfg
        specs = {}
        for name, spec in self.specs.items():
            d = asdict(spec)
            d.pop("retry", None)
            specs[name] = d
        return {
            "models": cfg.models, "model_specs": specs, "problems": cfg.problems, "direction": cfg.direction,
            "replicates": cfg.replicates, "trials": cfg.trials, "budget": cfg.budget.to_dict(),
            "executor": cfg.executor, "llm_mode": cfg.llm_mode, "concurrency": cfg.concurrency,
            "spend_cap_usd": cfg.spend_cap_usd, "prompt_hash": prompt_hash(), "guides_sha256": _guides_hash(),
            "grader_options": asdict(GradeOptions()),
        }

    # -------------------------------------------------------------------------------------------- run
    async def run(self, argv: list[str], echo: Callable[[str], None] = print,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Run (or resume) the experiment; returns a summary. Safe to kill at any point and run again.

        `echo` gets one line per finished attempt (a log a person can grep); `progress(finished, total)` drives a
        progress bar when the caller has a terminal.
        """
        from metakernel.agents.attempt import AttemptSetup, InfraFailure, run_attempt
        from metakernel.agents.models import model_runtime, open_client
        from metakernel.agents.replay import CACHE_FILE, ReplayCache
        from metakernel.provenance import provenance
        from metakernel.store import Store

        cfg = self.cfg
        store = Store(cfg.experiment, create=True)
        config = self.config_record()
        docs = None
        if cfg.docs:
            from metakernel.docs_index import DocsIndex

            docs = await asyncio.to_thread(DocsIndex.open, True)
            config["docs_index"] = docs.identity()
        prov = provenance()
        store.init_experiment(cfg.experiment.name, config, prov, IDENTITY_KEYS)
        rows = []
        for key in self.plan:
            problem = self.problems[key.problem]
            rows.append({"attempt_id": key.attempt_id, "model": key.model, "problem": key.problem,
                         "family": problem.family, "arm": key.arm, "dsl": key.dsl, "replicate": key.replicate,
                         "source_attempt": key.source.attempt_id if key.source else None})
        store.ensure_attempts(rows)
        run_id = store.begin_run(argv, prov)
        cache = None
        if self.llm_mode != "off":
            cache = ReplayCache(cfg.llm_cache or cfg.experiment / CACHE_FILE, self.llm_mode)
        cap = SpendCap(cfg.spend_cap_usd, spent_usd=store.spent_usd())
        slots = asyncio.Semaphore(cfg.concurrency)
        events = {key: asyncio.Event() for key in self.plan}
        counts = {"done": 0, "infra_error": 0, "skipped": 0, "blocked": 0, "spend_cap": 0, "already_done": 0}
        total = len(self.order)
        clients: dict[str, Any] = {}
        outcome = "interrupted"

        async def one(key: AttemptKey) -> None:
            try:
                row = store.attempt(key.attempt_id)
                if row is not None and row["state"] == "done":
                    counts["already_done"] += 1
                    return
                skill = None
                if key.source is not None:
                    await events[key.source].wait()
                    src = store.attempt(key.source.attempt_id)
                    if src is None or src["state"] != "done":
                        counts["blocked"] += 1
                        echo(f"  {key.attempt_id}: waiting for {key.source.address} (not finished); run again")
                        return
                    skill = store.skill(key.source.attempt_id)
                    if skill is None:
                        store.skip_attempt(key.attempt_id, "source wrote no SKILL.md",
                                           synthetic=self.executor.synthetic)
                        counts["skipped"] += 1
                        echo(f"[{_progress(counts, total)}] {key.attempt_id}: skipped (source wrote no SKILL.md)")
                        return
                async with slots:
                    if not cap.allows_new():
                        counts["spend_cap"] += 1
                        return
                    for attempt in range(cfg.infra_retries + 1):
                        setup = AttemptSetup(key=key, problem=self.problems[key.problem], budget=cfg.budget,
                                             client=clients[key.model], executor=self.executor, store=store,
                                             run_id=run_id, docs=docs, source_skill=skill)
                        try:
                            result = await run_attempt(setup)
                        except InfraFailure as exc:
                            store.fail_attempt(key.attempt_id, str(exc))
                            echo(f"  {key.attempt_id}: infra failure (try {attempt + 1}): {exc}")
                            continue
                        except Exception as exc:  # noqa: BLE001 - a harness bug must not take the run down
                            store.fail_attempt(key.attempt_id, "harness error:\n" + traceback.format_exc())
                            echo(f"  {key.attempt_id}: harness error: {type(exc).__name__}: {exc}")
                            break
                        for cost in store.llm_costs(key.attempt_id):
                            cap.add(cost)
                        store.finish_attempt(key.attempt_id, result)
                        counts["done"] += 1
                        speed = f" {result['speedup']:.2f}x" if result.get("speedup") else ""
                        echo(f"[{_progress(counts, total)}] {key.attempt_id}: {result['status']}{speed} "
                             f"({result['submissions']} submissions, {result['turns']} turns, "
                             f"{result['wall_s']:.0f} s, ended by {result['ended_by']})")
                        return
                    counts["infra_error"] += 1
            finally:
                events[key].set()
                if progress is not None:  # attempts that ended, not events set (an interrupt sets them all)
                    progress(sum(counts.values()), total)

        try:
            async with contextlib.AsyncExitStack() as stack:
                for name, spec in self.specs.items():
                    live = await stack.enter_async_context(model_runtime(spec, serve=cfg.llm_mode != "replay"))
                    clients[name] = open_client(live, cache)
                already = sum(1 for r in store.attempts("done"))
                resuming = f" ({already} already done: resuming)" if already else ""
                echo(f"experiment {cfg.experiment}: {total} attempts planned{resuming}, executor "
                     f"{self.executor.name}, llm {cfg.llm_mode}")
                try:
                    await asyncio.gather(*(one(key) for key in self.order))
                finally:
                    await self.executor.close()
            left = [r for r in store.attempts() if r["state"] != "done"]
            outcome = "complete" if not left else ("spend_cap" if counts["spend_cap"] else "incomplete")
        finally:
            store.end_run(run_id, outcome)
            summary = {
                "outcome": outcome, **counts,
                "model_calls": sum(c.model_calls for c in clients.values()),
                "replayed_calls": sum(getattr(c, "replayed", 0) for c in clients.values()),
                "replay_diverged": sum(getattr(c, "diverged", 0) for c in clients.values()),
                "spend": cap.describe(),
            }
            store.close()
            if cache is not None:
                cache.close()
        return summary


def _progress(counts: dict[str, int], total: int) -> str:
    return f"{counts['done'] + counts['skipped'] + counts['already_done']}/{total}"


__all__ = ["IDENTITY_KEYS", "Experiment", "RunConfig"]


async def regrade(experiment: Path, executor_name: str, addresses: list[str] | None = None,
                  echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Re-grade the final kernels of finished attempts without calling any model (docs/design.md section 6).

    The new reports are stored beside the old (`regrades/rNN.json`), never in place of them: an attempt's grade is
    the one it got when it ran; a regrade is for checking a result, or re-measuring on another GPU or grader.
    """
    from metakernel.catalog import load_catalog
    from metakernel.executor import make_executor
    from metakernel.store import Store

    executor = make_executor(executor_name)
    catalog = load_catalog()
    with Store(experiment) as store:
        try:
            return await _regrade_rows(experiment, store, executor, catalog, addresses, echo)
        finally:
            await executor.close()


async def _regrade_rows(experiment: Path, store: Any, executor: Any, catalog: Any, addresses: list[str] | None,
                        echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """`regrade`'s work, once its store and executor are open."""
    out: list[dict[str, Any]] = []
    rows = [r for r in store.attempts("done") if r["status"] != "skipped" and r["final_submission"]]
    if addresses:
        wanted = set(addresses)
        rows = [r for r in rows if r["attempt_id"].split("/", 1)[1] in wanted or r["attempt_id"] in wanted]
        if not rows:
            raise UserError(f"no finished attempt matches {', '.join(sorted(wanted))}", str(experiment))
    for row in rows:
        aid = row["attempt_id"]
        kernel = store.attempt_dir(aid) / f"kernel_v{int(row['final_submission']):02d}.py"
        if not kernel.is_file():
            echo(f"  {aid}: final kernel file missing ({kernel.name}); skipped")
            continue
        graded = await executor.grade(catalog.problem(row["problem"]), row["dsl"], kernel)
        n = len(store.submissions(aid, "regrade")) + 1
        try_no = int(row["tries"])
        store.record_submission(aid, try_no, "regrade", n, kernel, graded.report.kernel_sha256,
                                graded.report.to_dict(), graded.queue_s, graded.grade_s)
        new = graded.report
        item = {"attempt_id": aid, "was_status": row["status"], "was_speedup": row["speedup"],
                "status": new.status, "speedup": new.speedup if new.passed else None,
                "speedup_gpu": new.speedup_gpu if new.passed else None}
        out.append(item)
        was = f"{row['status']}" + (f" {row['speedup']:.2f}x" if row["speedup"] else "")
        now_ = f"{new.status}" + (f" {new.speedup:.2f}x" if new.passed and new.speedup else "")
        echo(f"{aid}: {was} -> {now_}")
    return out
