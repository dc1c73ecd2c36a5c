"""A validation's files graded side by side on one GPU (`metakernel problems validate --gold --jobs N`).

Graded one after another, the 182 corpus files need about 1300 s of an H200, more than a device session's
30 minutes leave after staging. Lanes grade files at once, each through `grade(..., share=...)`, so their untimed
phases overlap while every timed phase still has the card alone (`grader.sharing.GpuShare`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Lanes:
    """Which file a free lane grades next.

    A problem's first file is graded alone: its grading measures the eager baseline, and a twin beside it would
    measure it again. Once one of its files is done, the rest may go side by side: problem 28 holds 70 of the
    corpus's wrong files, which one at a time took a lane for minutes while the others idled. The arenas of the
    children graded at once stay under `budget` (two children of problem 25, its arenas not counted then, ran an
    80 GB H100 out of memory), except that a file whose arenas alone pass it is graded while nothing else is. No
    file starts after `deadline`.
    """

    def __init__(self, pending: list[Any], arena_bytes: Callable[[Any], int], budget: int,
                 deadline: float | None = None) -> None:
        self._queue = list(pending)
        self._arena_bytes = arena_bytes
        self._budget = budget
        self._deadline = deadline
        self._cond = threading.Condition()
        self._problems: set[int] = set()  # problems with a file graded now
        self._finished: set[int] = set()  # problems with a file graded to the end (gold first: the baseline is cached)
        self._held: dict[str, int] = {}  # solution key -> its arena bytes, for the files graded now
        self._stopped = False

    @property
    def left(self) -> int:
        """Files never started (the deadline passed, or the run was stopped)."""
        with self._cond:
            return len(self._queue)

    def stop(self) -> None:
        """No more files start (a lane failed)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def take(self) -> Any:
        """The next file for a lane to grade, waiting until one may start; None when the run is over for it."""
        with self._cond:
            while True:
                if self._stopped or not self._queue or (
                        self._deadline is not None and time.monotonic() > self._deadline):
                    return None
                chosen = self._eligible()
                if chosen is not None:
                    self._queue.remove(chosen)
                    self._problems.add(chosen.number)
                    self._held[chosen.key] = self._arena_bytes(chosen)
                    return chosen
                self._cond.wait(timeout=1.0)  # the deadline is checked again even if no lane finishes

    def done(self, sol: Any) -> None:
        """`sol`'s grading is over: its problem and arenas are free for the next file."""
        with self._cond:
            self._problems.discard(sol.number)  # a twin may still run: only before `_finished` does that matter
            self._finished.add(sol.number)
            self._held.pop(sol.key, None)
            self._cond.notify_all()

    def _eligible(self) -> Any:
        held = sum(self._held.values())
        for sol in self._queue:
            if sol.number in self._problems and sol.number not in self._finished:
                continue
            size = self._arena_bytes(sol)
            if not self._held or held + size <= self._budget:
                return sol
            return None  # in order: a large file waits for room rather than being overtaken for ever
        return None


def run_lanes(lanes: Lanes, jobs: int, grade_one: Callable[[Any], None]) -> None:
    """`jobs` threads grading the files `lanes` hands out; the first exception of a lane stops the run and is raised."""
    errors: list[BaseException] = []

    def lane() -> None:
        while True:
            sol = lanes.take()
            if sol is None:
                return
            try:
                grade_one(sol)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)
                lanes.stop()
                return
            finally:
                lanes.done(sol)

    threads = [threading.Thread(target=lane, name=f"lane-{i}") for i in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
