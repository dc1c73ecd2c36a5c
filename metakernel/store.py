"""The experiment store: one SQLite database (WAL) plus plain files a person can open (docs/design.md section 6).

Why both: the database answers "what is finished, what did it cost" transactionally, so a crashed run resumes
without losing or duplicating an attempt; the files (kernel versions, SKILL.md, transcript, grader reports) are what
a researcher reads and what an export ships. Files are always written before the row that marks them complete, so a
kill at any instant leaves either a finished attempt with all its files or an unfinished one that is redone whole.

Layout of an experiment directory::

    metakernel.sqlite                 experiments, runs, attempts, submissions, llm_calls, skills
    llm_cache.sqlite                  record/replay of model calls (agents.replay)
    attempts/<model_slug>/<address>/  kernel_v01.py, grades/v01.json, checks/, final_grade.json, SKILL.md,
                                      transcript.jsonl, result.json
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metakernel.errors import UserError
from metakernel.jsonio import write_json_atomic

SCHEMA = "metakernel.store/1"
DB_NAME = "metakernel.sqlite"
ATTEMPT_RESULT_SCHEMA = "metakernel.attempt/1"
#: Attempt states. `done` is the completion marker (result.json exists); `infra_error` is retried on resume.
STATES = ("pending", "running", "done", "infra_error")

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiment (
    id INTEGER PRIMARY KEY CHECK (id = 1), name TEXT NOT NULL, created TEXT NOT NULL,
    config TEXT NOT NULL, provenance TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
    provenance TEXT NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY, model TEXT NOT NULL, problem INTEGER NOT NULL, family TEXT NOT NULL,
    arm TEXT NOT NULL, dsl TEXT NOT NULL, replicate INTEGER NOT NULL, source_attempt TEXT,
    state TEXT NOT NULL DEFAULT 'pending', tries INTEGER NOT NULL DEFAULT 0, run_id INTEGER,
    status TEXT, reason TEXT, passed INTEGER, speedup REAL, roofline_fraction REAL,
    final_submission INTEGER, submissions INTEGER, checks INTEGER, turns INTEGER,
    tokens_in INTEGER, tokens_out INTEGER, cost_usd REAL, cost_status TEXT, wall_s REAL, queue_s REAL,
    ended_by TEXT, error TEXT, started TEXT, finished TEXT, synthetic INTEGER NOT NULL DEFAULT 0,
    schema TEXT NOT NULL DEFAULT 'metakernel.attempt/1');
CREATE TABLE IF NOT EXISTS submissions (
    attempt_id TEXT NOT NULL, try INTEGER NOT NULL, kind TEXT NOT NULL, n INTEGER NOT NULL,
    kernel_sha256 TEXT NOT NULL, path TEXT NOT NULL, status TEXT NOT NULL, reason TEXT, speedup REAL,
    median_us REAL, report_path TEXT NOT NULL, queue_s REAL, grade_s REAL, created TEXT NOT NULL,
    PRIMARY KEY (attempt_id, try, kind, n));
CREATE TABLE IF NOT EXISTS llm_calls (
    attempt_id TEXT NOT NULL, try INTEGER NOT NULL, turn INTEGER NOT NULL, model TEXT NOT NULL,
    prompt_tokens INTEGER, completion_tokens INTEGER, cost_usd REAL, cost_status TEXT, latency_s REAL,
    tries INTEGER, finish_reason TEXT, replayed INTEGER NOT NULL DEFAULT 0, created TEXT NOT NULL,
    PRIMARY KEY (attempt_id, try, turn));
CREATE TABLE IF NOT EXISTS skills (
    attempt_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL, original_bytes INTEGER NOT NULL,
    truncated INTEGER NOT NULL, lint TEXT NOT NULL, path TEXT NOT NULL, updated TEXT NOT NULL);
"""

#: Columns added after stores were first written (same schema): every store, new or old, gains them on open, so
#: this is their one declaration. (table, column, type)
_ADDED_COLUMNS = (("attempts", "speedup_gpu", "REAL"),
                  ("llm_calls", "cached_tokens", "INTEGER"))  # prompt tokens read from the provider's cache


def now() -> str:
    """UTC timestamp with seconds, the one format every record uses."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def is_experiment(path: Path) -> bool:
    """True when `path` is an experiment directory (holds the database)."""
    return (Path(path) / DB_NAME).is_file()


class Store:
    """One experiment's database and files. Thread-safe: the asyncio loop and grading threads share it."""

    def __init__(self, root: Path, *, create: bool = False) -> None:
        self.root = Path(root)
        db = self.root / DB_NAME
        if not db.is_file() and not create:
            raise UserError("not an experiment directory (no metakernel.sqlite)", str(self.root))
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_DDL)
        for table, column, kind in _ADDED_COLUMNS:
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:  # new stores, and old ones (their rows get it empty)
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        found = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if found is None:
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
        elif found[0] != SCHEMA:
            raise UserError(f"experiment store has schema {found[0]}, this metakernel reads {SCHEMA}", str(db))

    # ---------------------------------------------------------------------------------------------- plumbing
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, tuple(args)).fetchall()]

    def close(self) -> None:
        """Checkpoint the WAL into the database file and close it."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- experiment
    def experiment(self) -> dict[str, Any] | None:
        """The experiment row with config and provenance decoded, or None before `init_experiment`."""
        rows = self._rows("SELECT * FROM experiment WHERE id=1")
        if not rows:
            return None
        row = rows[0]
        row["config"] = json.loads(row["config"])
        row["provenance"] = json.loads(row["provenance"])
        return row

    def init_experiment(self, name: str, config: dict[str, Any], provenance: dict[str, Any],
                        identity_keys: Iterable[str]) -> None:
        """Record the experiment once; a later run must agree on the keys that decide comparability.

        The budget, the sampling and the grader settings are what make two arms comparable, so resuming with a
        different value would silently mix protocols: that is refused. Adding problems or replicates is allowed.
        """
        existing = self.experiment()
        if existing is None:
            with self._tx() as cur:
                cur.execute("INSERT INTO experiment VALUES (1, ?, ?, ?, ?)",
                            (name, now(), json.dumps(config, sort_keys=True), json.dumps(provenance, sort_keys=True)))
            return
        old = existing["config"]
        for key in identity_keys:
            if old.get(key) != config.get(key):
                raise UserError(f"this experiment was started with {key}={old.get(key)!r}; this run asks for "
                                f"{config.get(key)!r} (use a new --experiment directory to change it)",
                                str(self.root))

    def begin_run(self, command: list[str], provenance: dict[str, Any]) -> int:
        """Open a run (one invocation of the command) and recover attempts a killed run left `running`."""
        with self._tx() as cur:
            cur.execute("INSERT INTO runs (started, command, provenance) VALUES (?, ?, ?)",
                        (now(), json.dumps(command), json.dumps(provenance, sort_keys=True)))
            run_id = int(cur.lastrowid or 0)
            cur.execute("UPDATE attempts SET state='pending' WHERE state='running'")
        return run_id

    def end_run(self, run_id: int, outcome: str) -> None:
        """Close a run with a one-word outcome (complete, incomplete, interrupted, spend_cap)."""
        with self._tx() as cur:
            cur.execute("UPDATE runs SET finished=?, outcome=? WHERE id=?", (now(), outcome, run_id))

    def runs(self) -> list[dict[str, Any]]:
        """Every invocation so far, oldest first."""
        return self._rows("SELECT * FROM runs ORDER BY id")

    # ---------------------------------------------------------------------------------------------- attempts
    def ensure_attempts(self, rows: Iterable[dict[str, Any]]) -> int:
        """Insert planned attempts that are not there yet; returns how many were new."""
        cols = ("attempt_id", "model", "problem", "family", "arm", "dsl", "replicate", "source_attempt")
        added = 0
        with self._tx() as cur:
            for row in rows:
                cur.execute(f"INSERT OR IGNORE INTO attempts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            tuple(row.get(c) for c in cols))
                added += cur.rowcount
        return added

    def attempt(self, attempt_id: str) -> dict[str, Any] | None:
        """One attempt row."""
        rows = self._rows("SELECT * FROM attempts WHERE attempt_id=?", (attempt_id,))
        return rows[0] if rows else None

    def attempts(self, state: str | None = None) -> list[dict[str, Any]]:
        """Attempt rows (optionally in one state), in a stable order."""
        if state is None:
            return self._rows("SELECT * FROM attempts ORDER BY model, problem, replicate, arm")
        return self._rows("SELECT * FROM attempts WHERE state=? ORDER BY model, problem, replicate, arm", (state,))

    def attempt_dir(self, attempt_id: str) -> Path:
        """Where the attempt's files live (attempt ids are `<model_slug>/<address>`, both path-safe)."""
        return self.root / "attempts" / attempt_id

    def start_attempt(self, attempt_id: str, run_id: int) -> int:
        """Mark an attempt running and clear whatever an earlier, unfinished try left; returns the try number.

        An unfinished try is discarded whole (its rows and files) rather than continued: a model conversation
        cannot be resumed faithfully, and half an attempt must not count toward anything.
        """
        row = self.attempt(attempt_id)
        if row is None:
            raise KeyError(attempt_id)
        if row["state"] == "done":
            raise RuntimeError(f"attempt {attempt_id} is already done")
        directory = self.attempt_dir(attempt_id)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        with self._tx() as cur:
            for table in ("submissions", "llm_calls", "skills"):
                cur.execute(f"DELETE FROM {table} WHERE attempt_id=?", (attempt_id,))
            cur.execute("UPDATE attempts SET state='running', tries=tries+1, run_id=?, started=?, error=NULL "
                        "WHERE attempt_id=?", (run_id, now(), attempt_id))
        return int(row["tries"]) + 1

    def record_submission(self, attempt_id: str, try_no: int, kind: str, n: int, kernel: Path, sha256: str,
                          report: dict[str, Any], queue_s: float, grade_s: float) -> Path:
        """Save one grader report next to its kernel and index it; `kind` is submit, check, final or regrade."""
        directory = self.attempt_dir(attempt_id)
        name = {"submit": f"grades/v{n:02d}.json", "check": f"checks/c{n:02d}.json", "final": "final_grade.json",
                "regrade": f"regrades/r{n:02d}.json"}[kind]
        path = directory / name
        write_json_atomic(path, report)
        timing = report.get("timing") or {}
        with self._tx() as cur:
            cur.execute("INSERT OR REPLACE INTO submissions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (attempt_id, try_no, kind, n, sha256, str(kernel.relative_to(self.root)),
                         report.get("status", "infra_error"), report.get("reason"), report.get("speedup"),
                         timing.get("median_us"), str(path.relative_to(self.root)), queue_s, grade_s, now()))
        return path

    def submissions(self, attempt_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        """Graded submissions (and checks, finals, regrades) of the attempt's current try."""
        sql = "SELECT * FROM submissions WHERE attempt_id=?"
        args: list[Any] = [attempt_id]
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        return self._rows(sql + " ORDER BY kind, n", args)

    def record_llm_call(self, attempt_id: str, try_no: int, turn: int, model: str, response: Any,
                        replayed: bool) -> None:
        """Tokens, dollars and latency of one model call (the text itself lives in the transcript)."""
        with self._tx() as cur:
            cur.execute("INSERT OR REPLACE INTO llm_calls (attempt_id, try, turn, model, prompt_tokens, "
                        "completion_tokens, cost_usd, cost_status, latency_s, tries, finish_reason, replayed, "
                        "created, cached_tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (attempt_id, try_no, turn, model, response.prompt_tokens, response.completion_tokens,
                         response.cost_usd, response.cost_status, response.latency_s, response.attempts,
                         response.finish_reason, int(replayed), now(), getattr(response, "cached_tokens", 0)))

    def llm_calls(self, attempt_id: str | None = None) -> list[dict[str, Any]]:
        """Model-call rows (tokens, dollars, latency) of one attempt or of all, in turn order."""
        if attempt_id is None:
            return self._rows("SELECT * FROM llm_calls ORDER BY attempt_id, turn")
        return self._rows("SELECT * FROM llm_calls WHERE attempt_id=? ORDER BY turn", (attempt_id,))

    def llm_costs(self, attempt_id: str) -> list[float | None]:
        """Dollars of each model call of the attempt's current try (None: unpriced)."""
        return [r["cost_usd"] for r in self._rows("SELECT cost_usd FROM llm_calls WHERE attempt_id=?", (attempt_id,))]

    def spent_usd(self) -> float:
        """Dollars spent on priced calls of finished and running attempts (what the spend cap counts)."""
        rows = self._rows("SELECT COALESCE(SUM(cost_usd), 0) AS s FROM llm_calls")
        return float(rows[0]["s"])

    def record_skill(self, attempt_id: str, text: str, *, sha256: str, original_bytes: int, truncated: bool,
                     lint: list[dict[str, Any]]) -> Path:
        """Write SKILL.md (replacing the previous version) and index it with its lint findings."""
        path = self.attempt_dir(attempt_id) / "SKILL.md"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        with self._tx() as cur:
            cur.execute("INSERT OR REPLACE INTO skills VALUES (?,?,?,?,?,?,?,?)",
                        (attempt_id, sha256, len(text.encode()), original_bytes, int(truncated), json.dumps(lint),
                         str(path.relative_to(self.root)), now()))
        return path

    def skill(self, attempt_id: str) -> str | None:
        """The SKILL.md a finished attempt left, or None when it wrote none."""
        rows = self._rows("SELECT path FROM skills WHERE attempt_id=?", (attempt_id,))
        if not rows:
            return None
        path = self.root / rows[0]["path"]
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def skills(self) -> list[dict[str, Any]]:
        """Skill rows of every attempt that wrote one."""
        return self._rows("SELECT * FROM skills ORDER BY attempt_id")

    def append_transcript(self, attempt_id: str, event: dict[str, Any]) -> None:
        """One JSON line per event (model reply, tool result, budget note): the attempt as a person reads it."""
        path = self.attempt_dir(attempt_id) / "transcript.jsonl"
        with self._lock, path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"at": now(), **event}, default=str) + "\n")

    _RESULT_COLUMNS = ("status", "reason", "passed", "speedup", "speedup_gpu", "roofline_fraction", "final_submission",
                       "submissions", "checks", "turns", "tokens_in", "tokens_out", "cost_usd", "cost_status",
                       "wall_s", "queue_s", "ended_by", "synthetic")

    def finish_attempt(self, attempt_id: str, result: dict[str, Any]) -> None:
        """Write result.json, then mark the attempt done: the row is the completion marker."""
        result = {"schema": ATTEMPT_RESULT_SCHEMA, "attempt_id": attempt_id, "finished": now(), **result}
        write_json_atomic(self.attempt_dir(attempt_id) / "result.json", result)
        values = [result.get(c) for c in self._RESULT_COLUMNS]
        sets = ", ".join(f"{c}=?" for c in self._RESULT_COLUMNS)
        with self._tx() as cur:
            cur.execute(f"UPDATE attempts SET {sets}, state='done', finished=?, error=NULL WHERE attempt_id=?",
                        (*values, result["finished"], attempt_id))

    def fail_attempt(self, attempt_id: str, error: str) -> None:
        """An infrastructure failure (provider outage, grader infra): not a result, retried on the next run."""
        with self._tx() as cur:
            cur.execute("UPDATE attempts SET state='infra_error', error=?, finished=? WHERE attempt_id=?",
                        (error[:4000], now(), attempt_id))

    def skip_attempt(self, attempt_id: str, why: str, *, synthetic: bool = False) -> None:
        """A skill arm whose source wrote no SKILL.md: done, status `skipped` (scored as its solo baseline)."""
        directory = self.attempt_dir(attempt_id)
        directory.mkdir(parents=True, exist_ok=True)
        self.finish_attempt(attempt_id, {"status": "skipped", "reason": why, "passed": 0, "submissions": 0,
                                         "checks": 0, "turns": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0,
                                         "cost_status": "none", "wall_s": 0.0, "queue_s": 0.0,
                                         "ended_by": "skipped", "synthetic": int(synthetic)})


__all__ = ["DB_NAME", "SCHEMA", "STATES", "Store", "is_experiment", "now"]
