"""Record and replay of model calls in SQLite, so an experiment can be re-run without calling a model.

A call is keyed by `(model, key)`, where `key` is the caller's ``<attempt_id>#<turn>``: replay serves the recorded
response for that key whatever the request now says, so it stays deterministic when grader timings or budget lines
in the messages differ from the recorded run. The sha256 of the canonical request (messages, tools, sampling) is
stored beside each response so such differences are *counted* (`request_digest`), not silently ignored; a second
digest with every digit run masked tells timing noise apart from a conversation that went elsewhere.

The cache is its own SQLite file (default ``<exp>/llm_cache.sqlite``), in WAL mode. All access goes through one
connection under a lock, and every write is one transaction, so concurrent asyncio tasks of one process (and
threads, should a caller offload to one) never interleave a half-written row. Re-recording a key replaces its row:
an attempt redone after a crash must not replay the dead run's turns.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from metakernel.agents.llm import LLMResponse, NonRetryableLLMError

from metakernel.errors import UserError

ReplayMode = Literal["off", "record", "replay"]
MODES: tuple[ReplayMode, ...] = ("off", "record", "replay")
CACHE_FILE = "llm_cache.sqlite"
SCHEMA_VERSION = 1
"""Version of the `calls` table; a cache written by another version is refused, not misread."""

_DIGITS = re.compile(r"\d+")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    model TEXT NOT NULL,
    key TEXT NOT NULL,
    request_sha256 TEXT NOT NULL,
    request_shape_sha256 TEXT NOT NULL,
    response_json TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (model, key)
);
"""


class ReplayMissError(NonRetryableLLMError):
    """Replay found no recorded response for a key: the run asks for a turn the recording never made."""

    def __init__(self, model: str, key: str, path: Path) -> None:
        super().__init__(f"{model}: no recorded response for key {key!r} in {path} (replay mode)", attempts=0)
        self.model = model
        self.key = key


def parse_mode(text: str) -> ReplayMode:
    """Check a user-given mode (`--llm-cache`), one line of error naming the choices."""
    if text not in MODES:
        raise UserError(f"unknown LLM cache mode {text!r} (use one of: {', '.join(MODES)})")
    return cast(ReplayMode, text)


def _canonical(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               sampling: Mapping[str, Any]) -> str:
    request = {"messages": [dict(m) for m in messages], "tools": [dict(t) for t in tools or ()],
               "sampling": dict(sampling)}
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class RequestDigest:
    """Two hashes of one request: exact, and with digit runs masked (timings, budgets, counters)."""

    exact: str
    shape: str


def request_digest(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                   sampling: Mapping[str, Any]) -> RequestDigest:
    """Hash the canonical JSON of a request (sorted keys, no whitespace), once exactly and once digit-masked."""
    text = _canonical(messages, tools, sampling)
    return RequestDigest(exact=hashlib.sha256(text.encode()).hexdigest(),
                         shape=hashlib.sha256(_DIGITS.sub("0", text).encode()).hexdigest())


@dataclass(frozen=True)
class Recorded:
    """One stored call: the response and the digests of the request that produced it."""

    response: LLMResponse
    request: RequestDigest
    recorded_at: float


class ReplayCache:
    """The record/replay store of one experiment; `mode` says whether callers record into it or replay from it."""

    def __init__(self, path: Path, mode: ReplayMode) -> None:
        if mode == "off":
            raise ValueError("an 'off' cache is no cache: pass None instead")
        if mode == "replay" and not path.is_file():
            raise UserError("replay needs a recorded cache, and there is none", str(path))
        self.path = path
        self.mode: ReplayMode = mode
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE), not sqlite3's implicit ones.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                self._db.close()
                raise UserError(f"LLM cache schema {row[0]} is not this version's {SCHEMA_VERSION}", str(path))

    @classmethod
    def for_experiment(cls, exp_dir: Path, mode: ReplayMode) -> ReplayCache | None:
        """The experiment's cache at ``<exp>/llm_cache.sqlite``, or None when recording is off."""
        return None if mode == "off" else cls(exp_dir / CACHE_FILE, mode)

    def __repr__(self) -> str:
        return f"ReplayCache({str(self.path)!r}, mode={self.mode!r})"

    def get(self, model: str, key: str) -> Recorded | None:
        """The recorded call for `(model, key)`, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT response_json, request_sha256, request_shape_sha256, recorded_at FROM calls "
                "WHERE model = ? AND key = ?", (model, key)).fetchone()
        if row is None:
            return None
        return Recorded(LLMResponse.from_dict(json.loads(row[0])), RequestDigest(row[1], row[2]), float(row[3]))

    def put(self, model: str, key: str, digest: RequestDigest, response: LLMResponse) -> None:
        """Store (or replace) the call for `(model, key)` in one transaction."""
        payload = json.dumps(response.to_dict(), sort_keys=True, ensure_ascii=False)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?)",
                                 (model, key, digest.exact, digest.shape, payload, time.time()))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def keys(self, model: str | None = None) -> list[tuple[str, str]]:
        """Every stored `(model, key)`, sorted (for reports and tests)."""
        with self._lock:
            if model is None:
                rows = self._db.execute("SELECT model, key FROM calls ORDER BY model, key").fetchall()
            else:
                rows = self._db.execute("SELECT model, key FROM calls WHERE model = ? ORDER BY key",
                                        (model,)).fetchall()
        return [(str(m), str(k)) for m, k in rows]

    def close(self) -> None:
        """Close the connection (WAL contents are checkpointed by SQLite on the last close)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReplayCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
