"""Gradings side by side on one GPU: their untimed phases together, each timed phase alone.

Graded one file after another, the corpus validation took about 1300 s of an H200 (session 23: 851 s for 112 of
its files), more than one device session affords, and most of it is untimed work (the child's start, compiling,
correctness, ablations, audits) whose verdicts do not depend on what else runs on the card. The timed phases
(timing, profile, baselines, the plausibility verdicts) must find the GPU and the host as a lone grading does:
each waits until no grading is in an untimed phase, and no untimed phase starts while one waits or runs (so a timed
phase is never starved). A grading holds one phase at a time, never both, so the two cannot deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class GpuShare:
    """One GPU's gradings: any number in untimed phases at once, or one in a timed phase."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._untimed = 0  # gradings in an untimed phase now
        self._timed = False  # a grading in its timed phase now
        self._waiting = 0  # gradings waiting for their timed phase

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Held through a grading's untimed phases: waits while a timed phase runs or waits."""
        with self._cond:
            while self._timed or self._waiting:
                self._cond.wait()
            self._untimed += 1
        try:
            yield
        finally:
            with self._cond:
                self._untimed -= 1
                self._cond.notify_all()

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Held through a grading's timed phases: waits until no other grading holds a phase."""
        with self._cond:
            self._waiting += 1
            while self._timed or self._untimed:
                self._cond.wait()
            self._waiting -= 1
            self._timed = True
        try:
            yield
        finally:
            with self._cond:
                self._timed = False
                self._cond.notify_all()


class Alone(GpuShare):
    """A grading with the GPU to itself (`grade`'s default): both phases enter at once."""

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Entered at once."""
        yield

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Entered at once."""
        yield
