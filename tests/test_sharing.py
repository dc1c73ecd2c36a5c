"""Gradings side by side: untimed phases overlap, a timed phase runs alone, and lanes hand out files safely.

Real threads throughout; what runs in a phase here is a sleep, the grading itself is `test_grader_cpu`'s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from metakernel.grader.sharing import Alone, GpuShare
from metakernel.validate_lanes import Lanes, run_lanes


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, float, float]] = []

    def hold(self, share_phase, kind: str, seconds: float) -> None:
        with share_phase:
            t0 = time.monotonic()
            time.sleep(seconds)
            t1 = time.monotonic()
        with self.lock:
            self.spans.append((kind, t0, t1))


def _overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_untimed_phases_overlap_and_a_timed_phase_runs_alone():
    share, log = GpuShare(), Log()
    threads = [threading.Thread(target=log.hold, args=(share.untimed(), "untimed", 0.2)) for _ in range(3)]
    threads += [threading.Thread(target=log.hold, args=(share.timed(), "timed", 0.1)) for _ in range(2)]
    threads += [threading.Thread(target=log.hold, args=(share.untimed(), "untimed", 0.1)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(log.spans) == 8
    timed = [s for s in log.spans if s[0] == "timed"]
    for span in timed:
        assert not any(_overlap(span, other) for other in log.spans if other is not span), log.spans
    untimed = [s for s in log.spans if s[0] == "untimed"]
    assert any(_overlap(a, b) for i, a in enumerate(untimed) for b in untimed[i + 1:]), "no two untimed phases met"


def test_a_waiting_timed_phase_is_not_overtaken_by_new_untimed_phases():
    """Writer preference: once a timed phase waits, untimed phases that come later wait behind it."""
    share, order = GpuShare(), []
    first_in, timed_waits = threading.Event(), threading.Event()

    def long_untimed():
        with share.untimed():
            first_in.set()
            timed_waits.wait(5)
            time.sleep(0.1)
        order.append("untimed-1 out")

    def timed():
        first_in.wait(5)
        timed_waits.set()
        with share.timed():
            order.append("timed in")

    def late_untimed():
        timed_waits.wait(5)
        time.sleep(0.05)  # the timed phase is waiting by now
        with share.untimed():
            order.append("untimed-2 in")

    threads = [threading.Thread(target=f) for f in (long_untimed, timed, late_untimed)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["untimed-1 out", "timed in", "untimed-2 in"]


def test_a_phase_left_by_an_exception_lets_the_others_in():
    share = GpuShare()
    with pytest.raises(RuntimeError), share.timed():
        raise RuntimeError("the grading ended early")
    with pytest.raises(RuntimeError), share.untimed():
        raise RuntimeError("the grading ended early")
    done = threading.Event()

    def timed():
        with share.timed():
            done.set()

    t = threading.Thread(target=timed)
    t.start()
    t.join(2)
    assert done.is_set()


def test_alone_enters_both_phases_at_once():
    share = Alone()
    with share.untimed(), share.timed():  # nested: a lone grading never waits for itself
        pass


@dataclass(frozen=True)
class Sol:
    key: str
    number: int
    size: int = 1


def _run(sols: list[Sol], jobs: int, budget: int, seconds: float = 0.05, deadline: float | None = None,
         fail: str | None = None) -> tuple[Lanes, list[tuple[Sol, float, float]]]:
    lanes = Lanes(sols, lambda s: s.size, budget, deadline)
    spans, lock = [], threading.Lock()

    def grade_one(sol: Sol) -> None:
        t0 = time.monotonic()
        if sol.key == fail:
            raise ValueError("a bug of ours")
        time.sleep(seconds)
        with lock:
            spans.append((sol, t0, time.monotonic()))

    run_lanes(lanes, jobs, grade_one)
    return lanes, spans


def test_lanes_grade_every_file_once_and_a_problem_s_first_file_alone():
    """A problem's first file (it measures the baseline) has no twin beside it; the files after it may."""
    sols = [Sol(f"{n}-{dsl}-{k}", n) for n in range(1, 5) for dsl in ("cute", "tirx") for k in range(2)]
    lanes, spans = _run(sols, jobs=3, budget=100)
    assert sorted(s.key for s, _, _ in spans) == sorted(s.key for s in sols) and lanes.left == 0
    for number in {s.number for s in sols}:
        mine = sorted((span for span in spans if span[0].number == number), key=lambda span: span[1])
        assert all(b0 >= mine[0][2] - 0.01 for _, b0, _ in mine[1:]), f"a twin ran beside problem {number}'s first file"
    most = max(sum(1 for _, b0, b1 in spans if b0 <= t < b1) for _, t, _ in spans)
    assert most >= 2, "no two files were ever graded at once"
    one_problem = [Sol(f"28-wrong-{k}", 28) for k in range(7)]
    _, spans = _run(one_problem, jobs=3, budget=100)
    first = min(spans, key=lambda span: span[1])
    assert all(b0 >= first[2] - 0.01 for b, b0, _ in spans if b is not first[0]), "a twin ran beside the first file"
    assert max(sum(1 for _, b0, b1 in spans if b0 <= t < b1) for _, t, _ in spans) >= 2, "the rest never overlapped"


def test_lanes_keep_the_arenas_under_the_budget_and_grade_a_larger_file_alone():
    sols = [Sol("a", 1, 4), Sol("b", 2, 4), Sol("c", 3, 4), Sol("huge", 4, 10), Sol("d", 5, 4)]
    lanes, spans = _run(sols, jobs=3, budget=8)
    assert lanes.left == 0 and len(spans) == 5
    for _, t, _ in spans:
        held = sum(s.size for s, b0, b1 in spans if b0 <= t < b1)
        running = [s.key for s, b0, b1 in spans if b0 <= t < b1]
        assert held <= 8 or running == ["huge"], running


def test_lanes_start_nothing_after_the_deadline_and_count_what_is_left():
    sols = [Sol(str(k), k) for k in range(10)]
    lanes, spans = _run(sols, jobs=2, budget=100, seconds=0.2, deadline=time.monotonic() + 0.3)
    assert 2 <= len(spans) <= 6 and lanes.left == 10 - len(spans)


def test_a_lane_s_exception_stops_the_run_and_reaches_the_caller():
    sols = [Sol(str(k), k) for k in range(8)]
    with pytest.raises(ValueError, match="a bug of ours"):
        _run(sols, jobs=2, budget=100, fail="1")
