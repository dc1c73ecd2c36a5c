"""From the experiment store to the attempt table every analysis reads, and to a self-contained export bundle.

The store keeps what a run needs to resume (states, tries, file paths); the analysis needs one row per finished
attempt in `analysis.records.ALL_COLUMNS`. `attempt_table` is the only translation between the two, so a report built
from the database and one built from an export (`load_attempts` on either) print the same numbers by construction.

A bundle is a folder a reader can open without metakernel's database::

    results.json                          schema metakernel.export/1: legend, experiment, runs, attempts, missing,
                                          submissions, llm_calls, skills, files
    skills/<model_slug>/<address>/SKILL.md
    kernels/<model_slug>/<address>/       kernel_vNN.py, grades/vNN.json, final_grade.json, transcript.jsonl,
                                          result.json

Every report is recomputable from results.json alone; the copied files are there for people (and for `regrade`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from metakernel.analysis.records import (
    ALL_COLUMNS,
    ARMS,
    FAIL_STATUSES,
    OPTIONAL_SCHEMA,
    PAIR_CLASSES,
    SCHEMA,
    SKILL_ARMS,
    validate_attempts,
)
from metakernel.errors import UserError
from metakernel.jsonio import write_json_atomic
from metakernel.store import Store, is_experiment

EXPORT_SCHEMA = "metakernel.export/1"
RESULTS_NAME = "results.json"
#: What a bundle holds besides results.json; a re-export replaces exactly these.
BUNDLE_DIRS = ("skills", "kernels")

#: Grader statuses, the skipped status, arms, store states and submission kinds, in words (the bundle's legend).
STATUS_DOCS = {
    "passed": "the final kernel was correct on every draw and obeyed the rules; speedup is measured",
    "wrong": "output outside tolerance, or of the wrong structure",
    "compile_error": "kernel.py did not import or its kernel did not compile",
    "runtime_error": "solve raised, or the kernel crashed while running",
    "timeout": "a grading step ran past its time limit",
    "rule_violation": "broke the submission rules (static rules, mutated inputs, no DSL launch, ...)",
    "infra_error": "the grader's infrastructure failed on the final grade (not the candidate's fault)",
    "skipped": "skill arm whose source attempt wrote no SKILL.md; scored as its solo baseline",
}
ARM_DOCS = {
    "solo_cute": "CuTe DSL, no skill given; its SKILL.md is the source of cute2tirx_skill",
    "solo_tirx": "TIRx, no skill given; its SKILL.md is the source of tirx2cute_skill",
    "cute2tirx_skill": "TIRx, given the SKILL.md of solo_cute of the same replicate; compared with solo_tirx",
    "tirx2cute_skill": "CuTe DSL, given the SKILL.md of solo_tirx of the same replicate; compared with solo_cute",
    "placebo_skill": "control: given a skill from another problem of the same family",
    "self_skill": "control: same-DSL retry given its own earlier skill",
}
STATE_DOCS = {
    "pending": "planned, not started (or a killed try to be redone whole)",
    "running": "started by a run that has not finished it",
    "done": "finished: result.json written, counted in attempts",
    "infra_error": "failed for infrastructure reasons (error says why); retried by the next run, never counted",
}
SUBMISSION_KIND_DOCS = {
    "submit": "a graded submission (costs one of the budget); report under grades/",
    "check": "a free CPU dry run",
    "final": "the kept kernel re-graded in a fresh process on fresh seeds: the attempt's grade",
    "regrade": "a later re-grade of a saved kernel (metakernel regrade)",
}
PAIR_CLASS_DOCS = {
    "helped": "c_skill > c_solo * (1 + tau), c = max(speedup if passed else 0, floor)",
    "neutral": "c_skill within the dead band [c_solo / (1 + tau), c_solo * (1 + tau)]",
    "harmed": "c_skill < c_solo / (1 + tau)",
    "both_failed": "neither the skill attempt nor the target solo attempt passed",
    "skipped": "the source wrote no skill; scored as the solo baseline",
}
#: Attempt-level cost statuses that mean some call had no price, so a dollar sum would be a silent undercount.
_UNPRICED_MARKERS = ("unpriced", "partial")
_REPLICATE_IN_ID = re.compile(r"_r(\d+)_")


# --- the attempt table ----------------------------------------------------------------------------------------------


def _experiment_name(store: Store) -> str:
    experiment = store.experiment()
    if experiment is None:
        raise UserError("the experiment store holds no experiment yet (nothing was run)", str(store.root))
    return str(experiment["name"])


def _unpriced_attempts(store: Store) -> set[str]:
    return {r["attempt_id"] for r in store.llm_calls() if r["cost_usd"] is None or r["cost_status"] == "unpriced"}


def _source_replicate(row: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]]) -> float:
    if row["arm"] not in SKILL_ARMS:
        return math.nan
    source = row.get("source_attempt")
    if not source:
        return math.nan
    if source in by_id:
        return float(by_id[source]["replicate"])
    found = _REPLICATE_IN_ID.search(str(source).rsplit("/", 1)[-1])
    return float(found[1]) if found else math.nan


def _cost(row: Mapping[str, Any], unpriced: set[str]) -> float:
    status = str(row.get("cost_status") or "")
    if row.get("cost_usd") is None or row["attempt_id"] in unpriced or any(m in status for m in _UNPRICED_MARKERS):
        return math.nan
    return float(row["cost_usd"])


def _table_row(row: Mapping[str, Any], experiment: str, by_id: Mapping[str, Mapping[str, Any]],
               unpriced: set[str]) -> dict[str, Any]:
    passed = row["status"] == "passed"

    def number(column: str) -> float:
        value = row.get(column)
        return float(value) if passed and value is not None else math.nan

    return {
        "experiment": experiment, "model": row["model"], "problem": int(row["problem"]), "family": row["family"],
        "arm": row["arm"], "dsl": row["dsl"], "replicate": int(row["replicate"]), "status": row["status"],
        "passed": passed, "speedup": number("speedup"), "speedup_gpu": number("speedup_gpu"),
        "roofline_fraction": number("roofline_fraction"),
        "tokens_in": int(row["tokens_in"] or 0), "tokens_out": int(row["tokens_out"] or 0),
        "cost_usd": _cost(row, unpriced), "wall_s": float(row["wall_s"] or 0.0),
        "submissions": int(row["submissions"] or 0), "source_replicate": _source_replicate(row, by_id),
        "synthetic": bool(row["synthetic"]),
    }


def done_rows(store: Store) -> list[tuple[str, dict[str, Any]]]:
    """(attempt_id, table row) for every finished attempt, in the store's stable order."""
    experiment = _experiment_name(store)
    rows = store.attempts()
    by_id = {r["attempt_id"]: r for r in rows}
    unpriced = _unpriced_attempts(store)
    return [(r["attempt_id"], _table_row(r, experiment, by_id, unpriced)) for r in rows if r["state"] == "done"]


def _frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(list(rows), columns=list(ALL_COLUMNS))
    for column in ("passed", "synthetic"):
        df[column] = df[column].astype(bool)
    return df


def attempt_table(store: Store) -> pd.DataFrame:
    """One row per finished attempt in exactly `analysis.records.ALL_COLUMNS`, validated.

    Only `done` attempts count: pending, running and infra-failed ones are not results (`missing_attempts` lists
    them). Speedup and roofline share are NaN unless the final kernel passed; cost is NaN when any of the attempt's
    model calls was unpriced, because a partial dollar sum would read as the whole.

    Raises:
        UserError: When the store holds no experiment or a row the analysis would misread.
    """
    df = _frame(row for _, row in done_rows(store))
    try:
        validate_attempts(df)
    except ValueError as exc:
        raise UserError(f"the store's attempts do not form a valid attempt table: {exc}", str(store.root)) from exc
    return df


def missing_attempts(store: Store) -> list[dict[str, Any]]:
    """Planned attempts without a result (pending, running, infra_error with its error), so gaps are visible."""
    keys = ("attempt_id", "model", "problem", "family", "arm", "dsl", "replicate", "source_attempt", "state",
            "tries", "error")
    return [{k: r[k] for k in keys} for r in store.attempts() if r["state"] != "done"]


# --- JSON helpers ---------------------------------------------------------------------------------------------------


def strict_json(value: Any) -> Any:
    """NaN -> None and numpy scalars -> Python, so results.json is strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _decode(row: Mapping[str, Any], *columns: str) -> dict[str, Any]:
    out = dict(row)
    for column in columns:
        if isinstance(out.get(column), str):
            out[column] = json.loads(out[column])
    return out


def _llm_summary(store: Store) -> list[dict[str, Any]]:
    rows = store.llm_calls()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["attempt_id"], []).append(row)
    out = []
    for attempt_id, calls in grouped.items():
        priced = [c for c in calls if c["cost_usd"] is not None and c["cost_status"] != "unpriced"]
        out.append({
            "attempt_id": attempt_id, "calls": len(calls), "models": sorted({c["model"] for c in calls}),
            "prompt_tokens": sum(c["prompt_tokens"] or 0 for c in calls),
            "completion_tokens": sum(c["completion_tokens"] or 0 for c in calls),
            "priced_calls": len(priced), "unpriced_calls": len(calls) - len(priced),
            "cost_usd_priced": sum(float(c["cost_usd"]) for c in priced),
            "latency_s": sum(float(c["latency_s"] or 0.0) for c in calls),
            "retries": sum(max(0, int(c["tries"] or 1) - 1) for c in calls),
            "replayed_calls": sum(int(c["replayed"]) for c in calls),
            "finish_reasons": dict(Counter(str(c["finish_reason"]) for c in calls)),
        })
    return out


def legend() -> dict[str, Any]:
    """What every field of results.json means (a bundle must be readable without this code)."""
    return {
        "columns": {c.name: f"{c.doc} [{c.dtype}]" for c in (*SCHEMA, *OPTIONAL_SCHEMA)},
        "status": {s: STATUS_DOCS[s] for s in ("passed", *FAIL_STATUSES, "skipped")},
        "arm": {a: ARM_DOCS[a] for a in ARMS},
        "state": STATE_DOCS,
        "submission_kind": SUBMISSION_KIND_DOCS,
        "pair_class": {c: PAIR_CLASS_DOCS[c] for c in PAIR_CLASSES},
        "sections": {
            "experiment": "name, creation time, configuration and provenance recorded when it was started",
            "runs": "every invocation of the command: start, end, argv, provenance, outcome",
            "attempts": "the attempt table (one row per finished attempt, the columns above) plus attempt_id; "
                        "NaN is written as null",
            "missing": "planned attempts without a result (state pending/running/infra_error, with the error)",
            "submissions": "every graded submission/check/final/regrade; path and report_path are relative to the "
                           "experiment directory, kernel_file and report_file to this bundle (null: not copied)",
            "llm_calls": "per attempt: calls, tokens, priced dollars, unpriced call count, latency, retries",
            "skills": "per attempt that wrote SKILL.md: sha256, bytes (original_bytes before the 16 KB cap), "
                      "truncated, lint findings; text under skills/<attempt_id>/SKILL.md",
            "files": "attempt_id -> the files copied for it, relative to this bundle",
        },
    }


# --- the bundle -----------------------------------------------------------------------------------------------------


def read_bundle(path: str | Path) -> dict[str, Any]:
    """The results.json of a bundle (the folder or the file), with its schema checked.

    Raises:
        UserError: When there is no results.json, it is not JSON, or its schema is not metakernel.export/1.
    """
    p = Path(path)
    file = p / RESULTS_NAME if p.is_dir() else p
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read export bundle: {type(exc).__name__}: {exc}".splitlines()[0], str(file)) from exc
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != EXPORT_SCHEMA:
        raise UserError(f"not an export bundle of schema {EXPORT_SCHEMA} (found {schema!r})", str(file))
    return data


def is_bundle(path: str | Path) -> bool:
    """Whether `path` is a bundle folder or its results.json (schema checked)."""
    p = Path(path)
    file = p / RESULTS_NAME if p.is_dir() else p
    if not file.is_file():
        return False
    try:
        read_bundle(file)
    except UserError:
        return False
    return True


def bundle_attempts(path: str | Path) -> pd.DataFrame:
    """The attempt table a bundle carries, in `ALL_COLUMNS` (null read back as NaN), unvalidated."""
    return _frame({c: (math.nan if r.get(c) is None else r.get(c)) for c in ALL_COLUMNS}
                  for r in read_bundle(path)["attempts"])


_KERNEL_FILES = ("kernel_v*.py", "final_grade.json", "grades/*.json", "transcript.jsonl", "result.json")


def _attempt_files(attempt_dir: Path, attempt_id: str, has_skill: bool) -> list[tuple[Path, str]]:
    """(source, bundle-relative destination) of what a bundle ships for one attempt."""
    out = []
    for pattern in _KERNEL_FILES:
        for src in sorted(attempt_dir.glob(pattern)):
            if src.is_file():
                out.append((src, f"kernels/{attempt_id}/{src.relative_to(attempt_dir).as_posix()}"))
    if has_skill and (attempt_dir / "SKILL.md").is_file():
        out.append((attempt_dir / "SKILL.md", f"skills/{attempt_id}/SKILL.md"))
    return out


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError("export target exists and is not a directory", str(out))
    if out.is_dir() and any(out.iterdir()) and not is_bundle(out):
        raise UserError("export target is a non-empty directory that is not a previous export bundle (no "
                        f"{RESULTS_NAME} of schema {EXPORT_SCHEMA}); choose an empty or new directory", str(out))


def _collect(store: Store) -> tuple[dict[str, Any], list[tuple[Path, str]]]:
    experiment = store.experiment()
    done = done_rows(store)
    skills = {s["attempt_id"]: s for s in store.skills()}
    done_ids = [aid for aid, _ in done]
    copies: list[tuple[Path, str]] = []
    files: dict[str, list[str]] = {}
    for aid in done_ids:
        found = _attempt_files(store.attempt_dir(aid), aid, aid in skills)
        copies += found
        files[aid] = [dest for _, dest in found]
    shipped = {src.resolve(): dest for src, dest in copies}
    submissions = []
    for row in store.attempts():
        for sub in store.submissions(row["attempt_id"]):
            sub["kernel_file"] = shipped.get((store.root / sub["path"]).resolve())
            sub["report_file"] = shipped.get((store.root / sub["report_path"]).resolve())
            submissions.append(sub)
    results = {
        "schema": EXPORT_SCHEMA,
        "legend": legend(),
        "experiment": experiment,
        "runs": [_decode(r, "command", "provenance") for r in store.runs()],
        "attempts": [{"attempt_id": aid, **row} for aid, row in done],
        "missing": missing_attempts(store),
        "submissions": submissions,
        "llm_calls": _llm_summary(store),
        "skills": [{**{k: s[k] for k in ("attempt_id", "sha256", "bytes", "original_bytes")},
                    "truncated": bool(s["truncated"]), "lint": json.loads(s["lint"]),
                    "file": f"skills/{s['attempt_id']}/SKILL.md" if s["attempt_id"] in files else None}
                   for s in skills.values()],
        "files": files,
    }
    return strict_json(results), copies


def _install(stage: Path, out: Path) -> None:
    """Move a finished stage into place; results.json goes last so a half-replaced bundle is never complete."""
    if not out.exists() or not any(out.iterdir()):
        if out.exists():
            out.rmdir()
        os.replace(stage, out)
        return
    for name in BUNDLE_DIRS:
        if (out / name).exists():
            shutil.rmtree(out / name)
        if (stage / name).exists():
            os.replace(stage / name, out / name)
    os.replace(stage / RESULTS_NAME, out / RESULTS_NAME)


def export_bundle(exp_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the experiment's bundle into `out_dir` (new, empty, or a previous bundle, which is replaced).

    The bundle is built in a hidden sibling folder and moved into place, so an interrupted export leaves the old
    bundle (or nothing) rather than a mix. Other files in a previous bundle (a report written into it) are kept.

    Returns:
        The bundle folder.

    Raises:
        UserError: When `exp_dir` is not an experiment, or `out_dir` holds something other than a bundle.
    """
    exp, out = Path(exp_dir), Path(out_dir)
    if not is_experiment(exp):
        raise UserError("not an experiment directory (no metakernel.sqlite)", str(exp))
    _check_target(out)
    with Store(exp) as store:
        _experiment_name(store)
        results, copies = _collect(store)
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
        try:
            for src, dest in copies:
                target = stage / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
            write_json_atomic(stage / RESULTS_NAME, results)
            _install(stage, out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return out


__all__ = [
    "EXPORT_SCHEMA", "RESULTS_NAME", "attempt_table", "bundle_attempts", "done_rows", "export_bundle", "is_bundle",
    "legend", "missing_attempts", "read_bundle", "strict_json",
]
