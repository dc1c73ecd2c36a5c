"""Running `validate` over a selection: progress, the results table, the JSON report, resuming, exit codes.

The report is rewritten after every problem (data before completion), so a run cut off by a time limit — one
device command on the H200 is capped at 10 minutes — resumes with `--resume` and skips problems whose entry
matches the file's current content hash, device and scale.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from metakernel.catalog import load_catalog
from metakernel.errors import UserError
from metakernel.jsonio import write_json_atomic
from metakernel.provenance import provenance
from metakernel.validate import ProblemReport, validate_problem

SCHEMA = "metakernel.validation.problems/1"


def _load_report(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"not a JSON report ({exc.msg}, line {exc.lineno})", str(path)) from exc
    if data.get("schema") != SCHEMA:
        raise UserError(f"schema {data.get('schema')!r} is not {SCHEMA}", str(path))
    return data


def _write_report(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data)


def _summarise(data: dict[str, Any], catalog_issues: list[str]) -> None:
    entries = data["problems"].values()
    data["summary"] = {
        "validated": len(entries),
        "passed": sum(1 for e in entries if e["ok"]),
        "failed": sorted(f"{e['number']:02d}" for e in entries if not e["ok"]),
        "eager_us_min": min((e["eager_us"] for e in entries if e.get("eager_us")), default=None),
        "catalog_issues": catalog_issues,
    }


def run_validation(selection: str, *, device: str, scale: str | None, as_json: bool, report_path: Path | None,
                   resume: bool = False, time_budget: float | None = None) -> int:
    """Validate the selected problems; returns the exit code (0 ok, 1 failed checks, 2 broken problem files)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device")
    scale = scale or ("small" if device == "cpu" else "full")
    catalog = load_catalog()
    numbers = catalog.select(selection)
    catalog_issues = catalog.issues() if not selection.strip() else []
    data = (_load_report(report_path) if (report_path and resume) else None) or {
        "schema": SCHEMA, "provenance": provenance(), "device": device, "scale": scale, "problems": {}}
    if data.get("device") != device or data.get("scale") != scale:
        raise UserError(f"report holds {data.get('device')}/{data.get('scale')} results, not {device}/{scale}",
                        str(report_path))
    data.setdefault("runs", []).append(provenance())
    reports: list[ProblemReport | dict[str, Any]] = []
    broken: list[str] = []
    started = time.monotonic()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]validate[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), transient=True, disable=not sys.stderr.isatty())
    skipped_for_time = 0
    with progress:
        task = progress.add_task("", total=len(numbers))
        for number in numbers:
            key = f"{number:02d}"
            progress.update(task, description=key)
            try:
                problem = catalog.problem(number)
            except UserError as exc:
                broken.append(str(exc))
                reports.append({"number": number, "slug": catalog.paths[number].stem[3:], "ok": False,
                                "error": str(exc), "checks": []})
                progress.advance(task)
                continue
            previous = data["problems"].get(key)
            if previous and previous.get("content_hash") == problem.content_hash and previous.get("ok") is not None:
                reports.append(previous)
                progress.advance(task)
                continue
            if time_budget is not None and time.monotonic() - started > time_budget:
                skipped_for_time += 1
                progress.advance(task)
                continue
            report = validate_problem(problem, device=device, scale=scale)
            if report.error:
                broken.append(report.error)
            reports.append(report)
            data["problems"][key] = report.to_dict()
            if report_path:
                _summarise(data, catalog_issues)
                _write_report(report_path, data)
            progress.advance(task)
    if report_path:
        _summarise(data, catalog_issues)
        _write_report(report_path, data)
    dicts = [r.to_dict() if isinstance(r, ProblemReport) else r for r in reports]
    if as_json:
        click.echo(json.dumps({"device": device, "scale": scale, "problems": dicts, "catalog_issues": catalog_issues},
                         indent=1))
    else:
        _print_table(dicts, device, scale, catalog_issues, skipped_for_time)
    for line in broken:
        click.echo(f"metakernel: error: {line}", err=True)
    if broken:
        return 2
    if skipped_for_time:
        click.echo(f"metakernel: {skipped_for_time} problem(s) left for the next run (time budget)", err=True)
        return 3
    return 0 if all(d["ok"] for d in dicts) and not catalog_issues else 1


def _print_table(rows: list[dict[str, Any]], device: str, scale: str, catalog_issues: list[str],
                 skipped: int) -> None:
    from rich.console import Console
    from rich.table import Table

    passed = sum(1 for r in rows if r["ok"])
    table = Table(title=f"validate on {device} at {scale} scale: {passed}/{len(rows)} passed")
    for col in ("NN", "family", "slug", "result", "eager", "notes"):
        table.add_column(col, overflow="fold")
    for r in rows:
        failed = [c for c in r.get("checks", []) if not c["ok"]]
        warned = [c for c in r.get("checks", []) if c["ok"] and c.get("warn") and c["name"] != "alt_reference"]
        if r.get("error"):
            result, notes = "[red]ERROR[/red]", r["error"]
        elif failed:
            result, notes = "[red]FAIL[/red]", "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
        else:
            result, notes = "[green]ok[/green]", "; ".join(f"{c['name']}: {c['detail']}" for c in warned)
        eager = r.get("eager_us")
        shown = "" if eager is None else (f"{eager:.1f} us" if device == "cuda" else f"{eager / 1e3:.1f} ms")
        table.add_row(f"{r['number']:02d}", r.get("family", ""), r.get("slug", ""), result, shown, notes)
    console = Console(width=max(120, Console().width))
    console.print(table)
    for issue in catalog_issues:
        console.print(f"[red]catalog:[/red] {issue}")


GOLD_SCHEMA = "metakernel.validation.gold/1"


def run_gold_validation(selection: str, *, device: str, as_json: bool, report_path: Path | None,
                        resume: bool = False, time_budget: float | None = None, timed: bool = True,
                        jobs: int = 1) -> int:
    """Grade every gold and wrong solution (GPU), or dry-run them (CPU); 0 when every expectation holds.

    `timed=False` is the development loop: correctness, ablations, audit and DSL share without the timing phase
    and baselines. Its entries say `"timed": false`; a timed run re-grades them (an untimed run keeps timed ones).
    `jobs` > 1 grades that many files at once on the GPU (`validate_lanes`), every timed phase still alone.
    """
    import torch

    from metakernel import gold
    from metakernel.grader.evaluate import GradeOptions, PendingWorker, dry_run, grade
    from metakernel.grader.report import PROTOCOL
    from metakernel.grader.static import check_source
    from metakernel.provenance import grader_fingerprint

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device")
    if device == "cuda":
        from metakernel.executor import preflight

        # a machine without the DSLs graded every file a compile error, and a resumed report kept them as graded
        # (session 32: a staging call that forgot its carried part)
        preflight("cuda")
    catalog = load_catalog()
    # file keys ("21/correct/tirx.py") pick single files; the rest selects problems as everywhere
    items = [t for t in selection.replace(",", " ").split() if t]
    keys = {t for t in items if "/" in t}
    problems = ",".join(t for t in items if "/" not in t)
    wanted = set(catalog.select(problems)) if problems or not keys else set()
    solutions = [s for s in gold.discover() if s.number in wanted or s.key in keys]
    if unknown := keys - {s.key for s in solutions}:
        raise UserError(f"no such solution file(s): {', '.join(sorted(unknown))} (keys look like 21/correct/tirx.py)")
    if not solutions:
        raise UserError("no solutions found for that selection under solutions/")
    data: dict[str, Any] = {}
    if report_path and resume and report_path.is_file():
        data = json.loads(report_path.read_text(encoding="utf-8"))
        if data.get("schema") != GOLD_SCHEMA or data.get("device") != device:
            raise UserError(f"not a {GOLD_SCHEMA} report for {device}", str(report_path))
    if not data:
        data = {"schema": GOLD_SCHEMA, "provenance": provenance(), "device": device, "solutions": {}}
    data.setdefault("runs", []).append(provenance())
    left = 0
    # The protocol's timing, with the wall-clock caps that keep a validation shard inside one device command. A call
    # may take 90 s: a first call compiles the kernel, and problem 35's TIRx gold (two NVRTC compiles since session
    # 28, one to PTX for the clock check) passed 45 s with five other lanes compiling beside it (H100, 751c7d6).
    options = GradeOptions(call_timeout_s=90.0, timing_cap_s=20.0, timed=timed)

    fingerprint = grader_fingerprint()

    def todo(sol: gold.Solution) -> bool:
        """Re-grade unless this file was graded by the same grader code (resuming across commits and sessions)."""
        previous = data["solutions"].get(sol.key)
        return not (previous and previous.get("sha256") == sol.sha256 and previous.get("protocol") == PROTOCOL and
                    previous.get("status") != "infra_error" and  # the machine's failure: graded again
                    previous.get("grader") == fingerprint and
                    previous.get("problem", {}).get("content_hash") == catalog.problem(sol.number).content_hash
                    and (previous.get("timed", True) or not timed))

    pending = [s for s in solutions if todo(s)]

    def start_ahead(sol: gold.Solution) -> PendingWorker | None:
        if not check_source(sol.path.read_bytes(), sol.dsl).ok:
            return None  # refused by the static rules: no child to start
        return PendingWorker(catalog.problem(sol.number), sol.dsl, sol.path, "cuda", options)

    written = threading.Lock()  # the report and the terminal, between lanes

    def record(sol: gold.Solution, report: Any, dry: bool = False) -> None:
        entry = gold.entry(sol, report)
        if dry and sol.kind == "wrong" and sol.expected_reason != "static":
            # The dry run cannot see wrong values, hangs or token kernels: only the GPU grades those.
            entry["ok"] = report.status in ("passed", sol.expected_status)
            entry["note"] = "needs the GPU to show its expected reason"
        entry["graded_at"] = data["runs"][-1]["revision"].get("commit")  # a resumed report spans commits,
        entry["grader"] = fingerprint  # but each entry was graded by this grader code
        if device == "cuda":
            entry["timed"] = timed
            entry["gpu"] = (data["runs"][-1].get("gpu") or {}).get("name")  # one report can span an H100 and an H200
        with written:
            data["solutions"][sol.key] = entry
            if report_path:
                _summarise_gold(data)
                _write_report(report_path, data)

    def announce(sol: gold.Solution) -> None:
        with written:
            click.echo(f"grading {sol.key} ({sol.kind}, expect {sol.expected_status}/{sol.expected_reason})",
                       err=True)

    started = time.monotonic()  # the budget is the gradings' (the fingerprint and the catalog take a while on a
    # loaded machine: a 0.5 s budget once ran out before the first grading)
    if device == "cuda" and jobs > 1:
        from metakernel.grader.sharing import GpuShare
        from metakernel.validate_lanes import Lanes, run_lanes

        share = GpuShare()
        # sized now, before any timed phase: sizing draws inputs on the GPU
        sizes = {n: _arena_bytes(catalog.problem(n)) for n in {sol.number for sol in pending}}
        lanes = Lanes(pending, lambda sol: sizes[sol.number], _lanes_arena_budget(),
                      None if time_budget is None else started + time_budget)

        def grade_one(sol: gold.Solution) -> None:
            announce(sol)
            record(sol, grade(catalog.problem(sol.number), sol.dsl, sol.path, device="cuda", options=options,
                              share=share))

        run_lanes(lanes, jobs, grade_one)
        left = lanes.left
        # An infrastructure failure beside other lanes (the grader's memory with five files on an 80 GB card:
        # seven at b8056f2) is graded again alone, while the budget lasts; the rest wait for the next run.
        again = [s for s in pending if data["solutions"].get(s.key, {}).get("status") == "infra_error"]
        for index, sol in enumerate(again):
            if time_budget is not None and time.monotonic() - started > time_budget:
                left += len(again) - index
                break
            announce(sol)
            record(sol, grade(catalog.problem(sol.number), sol.dsl, sol.path, device="cuda", options=options))
    else:
        ahead = Prefetch(start_ahead, lambda sol: _arena_bytes(catalog.problem(sol.number)))
        for index, sol in enumerate(pending):
            problem = catalog.problem(sol.number)
            if time_budget is not None and time.monotonic() - started > time_budget:
                left = len(pending) - index
                break
            announce(sol)
            if device == "cuda":
                current = ahead.take(pending[index:])
                record(sol, grade(problem, sol.dsl, sol.path, device="cuda", options=options, prestarted=current))
            else:
                record(sol, dry_run(problem, sol.dsl, sol.path), dry=True)
        ahead.close()
    _summarise_gold(data)
    if report_path:
        _write_report(report_path, data)
    rows = [data["solutions"][s.key] for s in solutions if s.key in data["solutions"]]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        _print_gold(rows, device)
    if left:
        click.echo(f"metakernel: {left} solution(s) left for the next run (time budget)", err=True)
        return 3
    return 0 if all(r["ok"] for r in rows) else 1


#: Children started ahead of a validation run's next files (DESIGN 8). A file the grader rejects early (most
#: wrong and red-team files: median 4.0 s at 682b56c) waited 3.6 s (median) for its child when only the next file's
#: was started; three ahead overlap those starts with the gradings before them.
PREFETCH_DEPTH = 3
#: Beyond the next file, children are started ahead only while the arenas of those already waiting (allocated in
#: this process as each child starts) stay under this: on an 80 GB H100 the grader's own memory ran children out.
PREFETCH_ARENA_BYTES = 4 << 30


#: With lanes, the share of the card's memory the children's arenas may hold together: each child also holds its
#: CUDA context and the DSL's state, and the parent the draws and float64 references of every file graded at once;
#: above `evaluate.GRADER_MEMORY_SHARE` held by the parent, a child's out-of-memory failure is the grader's.
LANES_ARENA_SHARE = 0.15


def _lanes_arena_budget() -> int:
    import torch

    return int(LANES_ARENA_SHARE * torch.cuda.mem_get_info()[1])


def _arena_bytes(problem: Any) -> int:
    """The GPU memory one child's arenas take for `problem` (`evaluate.exchange_sizes`, cached per problem)."""
    from metakernel.grader import timing
    from metakernel.grader.evaluate import exchange_sizes

    return exchange_sizes(problem, "cuda", "full", timing.ROW).arena_bytes


class Prefetch:
    """Children for the next files of a run, started ahead (each for exactly one file).

    The next file's unless its own arenas pass PREFETCH_ARENA_BYTES (problem 42's 8.8 GB held beside its twin's
    grading ran an 80 GB H100 out of memory); up to PREFETCH_DEPTH files while the arenas they hold stay under it.
    """

    def __init__(self, start: Any, arena_bytes: Any, depth: int = PREFETCH_DEPTH,
                 budget: int = PREFETCH_ARENA_BYTES) -> None:
        self.start, self.arena_bytes, self.depth, self.budget = start, arena_bytes, depth, budget
        self.waiting: dict[str, tuple[Any, int]] = {}  # solution key -> (pending child or None, its arena bytes)

    def take(self, upcoming: list[Any]) -> Any:
        """The child started for upcoming[0] (or None), after starting children for the files after it.

        More than one only while upcoming[0] is a wrong file: a child's start (its CUDA context, the DSL's warm-up
        launch) is GPU and host work beside the grading in progress, and a gold grading is timed.
        """
        current = self.waiting.pop(upcoming[0].key, (None, 0))[0]
        wanted = {sol.key for sol in upcoming[1:1 + self.depth]}
        for key in [k for k in self.waiting if k not in wanted]:  # not coming next after all: stop it
            self._discard(self.waiting.pop(key)[0])
        reach = self.depth if upcoming[0].kind == "wrong" else 1
        for position, sol in enumerate(upcoming[1:1 + reach]):
            if sol.key in self.waiting:
                continue
            size = self.arena_bytes(sol)
            held = sum(b for _, b in self.waiting.values())
            if size > self.budget or (position > 0 and held + size > self.budget):
                break  # a child this large starts in line, when the grading before it has let go of the GPU
            child = self.start(sol)
            self.waiting[sol.key] = (child, size if child is not None else 0)
        return current

    def close(self) -> None:
        """Stop every child still waiting."""
        for pending, _ in self.waiting.values():
            self._discard(pending)
        self.waiting.clear()

    @staticmethod
    def _discard(pending: Any) -> None:
        if pending is not None:
            pending.discard()


def _summarise_gold(data: dict[str, Any]) -> None:
    rows = list(data["solutions"].values())
    data["summary"] = {
        "gold": sum(1 for r in rows if r["kind"] == "gold"),
        "gold_passed": sum(1 for r in rows if r["kind"] == "gold" and r["status"] == "passed"),
        "wrong": sum(1 for r in rows if r["kind"] == "wrong"),
        "wrong_rejected_as_expected": sum(1 for r in rows if r["kind"] == "wrong" and r["expected_matched"]),
        "not_ok": sorted(k for k, r in data["solutions"].items() if not r["ok"]),
        # the grader code each entry was graded by (provenance.grader_fingerprint): one value = one grader
        "graders": sorted({str(r.get("grader")) for r in rows}),
    }


def _print_gold(rows: list[dict[str, Any]], device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"solutions on {device}: {sum(r['ok'] for r in rows)}/{len(rows)} as expected")
    for col in ("solution", "kind", "status/reason", "expected", "kernel", "eager", "speedup", "DSL share"):
        table.add_column(col, overflow="fold")
    for r in rows:
        fmt = lambda v, f: "" if v is None else f.format(v)  # noqa: E731
        table.add_row(r["path"].split("solutions/")[-1], r["kind"], f"{r['status']}/{r['reason']}".rstrip("/"),
                      ("[green]" if r["ok"] else "[red]") + r["expected"] + ("[/green]" if r["ok"] else "[/red]"),
                      fmt(r["kernel_median_us"], "{:.1f} us"), fmt(r["eager_median_us"], "{:.1f} us"),
                      fmt(r["speedup"], "{:.2f}x"), fmt(r["dsl_share"], "{:.0%}"))
    Console(width=max(140, Console().width)).print(table)
