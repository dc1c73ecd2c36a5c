"""Where submissions are graded: one interface for the attempt loop, the GPU grader or a labelled CPU stand-in.

The attempt loop only knows `Executor.grade` (a full evaluation, bounded by grading slots, with the time spent
queueing for a slot reported separately because the budget must not count it) and `Executor.check` (the free CPU dry
run). `LocalExecutor` runs the real grader on this machine's GPU; `StandInExecutor` exists because CPU CI has no GPU:
it runs the real dry run (static rules, import, compile for sm_90a, launches intercepted, output structure) and then
invents nothing it could pass off as a measurement -- its reports say `stand_in`, and every attempt it grades is
stored as synthetic, so no report can present those numbers as results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from metakernel.grader.report import GradeReport, Timing
from metakernel.problem import Problem

T = TypeVar("T")


@dataclass
class Graded:
    """A grade plus the two clocks the budget needs apart: waiting for a slot and grading."""

    report: GradeReport
    queue_s: float
    grade_s: float


class Executor(Protocol):
    """What the attempt loop grades through."""

    name: str
    slots: int
    synthetic: bool

    async def grade(self, problem: Problem, dsl: str, kernel: Path) -> Graded:
        """A full evaluation in a fresh child (correctness, rules, timing); never raises for the candidate."""
        ...

    async def check(self, problem: Problem, dsl: str, kernel: Path) -> GradeReport:
        """The free CPU dry run."""
        ...

    async def close(self) -> None:
        """Let go of whatever was kept between gradings (children started ahead)."""
        ...


class _Slots:
    """Grading slots: one per GPU, because two gradings on one GPU would time each other."""

    def __init__(self, slots: int) -> None:
        self._semaphore = asyncio.Semaphore(slots)
        self._after: set[asyncio.Task[None]] = set()

    async def run(self, fn: Callable[..., T], *args: Any, then: Callable[[], Any] | None = None
                  ) -> tuple[T, float, float]:
        """`fn(*args)` in a thread once a slot is free; returns its result, seconds queued, seconds running.

        `then()` runs in a thread after `fn`, still holding the slot, once the result has been returned: work that
        must not run beside another grading but need not delay this one's report.
        """
        queued = time.monotonic()
        await self._semaphore.acquire()
        try:
            started = time.monotonic()
            result = await asyncio.to_thread(fn, *args)
            ran = time.monotonic() - started
        except BaseException:
            self._semaphore.release()
            raise
        if then is None:
            self._semaphore.release()
        else:
            task = asyncio.create_task(self._then(then))
            self._after.add(task)
            task.add_done_callback(self._after.discard)
        return result, started - queued, ran

    async def _then(self, then: Callable[[], Any]) -> None:
        try:
            await asyncio.to_thread(then)
        finally:
            self._semaphore.release()

    async def drain(self) -> None:
        """Wait for every `then` still running."""
        while self._after:
            await asyncio.gather(*list(self._after), return_exceptions=True)


class LocalExecutor:
    """The real grader on this machine's GPU.

    One slot: the grader makes inputs in the parent on the first visible GPU and hands them to the child by CUDA
    IPC, so gradings on several GPUs of one host would need per-slot devices end to end (not built yet; on a
    multi-GPU host run one experiment per GPU with CUDA_VISIBLE_DEVICES).
    """

    name = "local"
    synthetic = False

    #: Children kept warm for the variants graded last (DESIGN 8): each holds a CUDA context, the DSL and its
    #: problem's arenas on the GPU, so only the most recent few are kept.
    WARM = 2

    def __init__(self, device: str = "cuda", options: Any = None) -> None:
        from metakernel.grader.evaluate import GradeOptions

        self.device = device
        self.options = options or GradeOptions()  # the protocol's; tests pass quicker ones
        self._slots = _Slots(1)
        self.slots = 1
        self._checks = asyncio.Semaphore(2)
        self._warm: list[Any] = []  # WarmWorker, oldest first (touched only by the slot's holder)

    async def grade(self, problem: Problem, dsl: str, kernel: Path) -> Graded:
        """See `Executor.grade`.

        The grading takes a child warmed for its variant when one is waiting; after the report, still holding the
        slot (a child's start is GPU work that must not run beside another grading's timed calls), a fresh one is
        warmed for the same variant: an attempt's next submission then waits only for its kernel's import.
        """
        report, queue_s, grade_s = await self._slots.run(self._grade, problem, dsl, kernel,
                                                           then=lambda: self._warm_up(problem, dsl))
        return Graded(report, queue_s, grade_s)

    def _grade(self, problem: Problem, dsl: str, kernel: Path) -> GradeReport:
        from metakernel.grader.evaluate import grade

        warm = next((w for w in self._warm if w.fits(problem, dsl, self.device, self.options)), None)
        if warm is not None:
            self._warm.remove(warm)
        return grade(problem, dsl, kernel, self.device, options=self.options, prestarted=warm)

    def _warm_up(self, problem: Problem, dsl: str) -> None:
        from metakernel.grader.evaluate import WarmWorker

        if any(w.fits(problem, dsl, self.device, self.options) for w in self._warm):
            return
        while len(self._warm) >= self.WARM:
            self._warm.pop(0).discard()
        warm = WarmWorker(problem, dsl, self.device, self.options)
        warm.wait()  # started (or failed) before the slot is let go
        self._warm.append(warm)

    async def close(self) -> None:
        """Stop the warm children (after the last grading's warm-up has finished)."""
        await self._slots.drain()
        while self._warm:
            await asyncio.to_thread(self._warm.pop().discard)

    async def check(self, problem: Problem, dsl: str, kernel: Path) -> GradeReport:
        """See `Executor.check`."""
        from metakernel.grader.evaluate import dry_run

        async with self._checks:
            return await asyncio.to_thread(dry_run, problem, dsl, kernel)


class StandInExecutor:
    """CPU stand-in for the GPU step: the real dry run, then a report that is plainly not a measurement.

    A kernel that passes the dry run is reported `passed` with reason `stand_in` and a speedup derived from its
    hash (deterministic, so record and replay see the same text); anything the dry run rejects keeps its real
    status. Dry runs are memoised by (problem, dsl, kernel hash): the final re-grade of an already graded kernel
    would prove nothing new on a CPU.
    """

    name = "stand-in"
    synthetic = True
    #: Process-wide: a kernel file's dry run does not change between experiments run in one process.
    _memo: dict[tuple[int, str, str], GradeReport] = {}

    def __init__(self, slots: int = 1) -> None:
        self.slots = slots
        self._slots = _Slots(slots)

    def _dry(self, problem: Problem, dsl: str, kernel: Path) -> GradeReport:
        from metakernel.grader.evaluate import dry_run

        sha = hashlib.sha256(kernel.read_bytes()).hexdigest() if kernel.is_file() else "missing"
        key = (problem.number, dsl, sha)
        if key not in self._memo:
            self._memo[key] = dry_run(problem, dsl, kernel)
        return self._memo[key]

    async def check(self, problem: Problem, dsl: str, kernel: Path) -> GradeReport:
        """See `Executor.check`."""
        return await asyncio.to_thread(self._dry, problem, dsl, kernel)

    async def close(self) -> None:
        """Nothing is kept between gradings."""

    async def grade(self, problem: Problem, dsl: str, kernel: Path) -> Graded:
        """See `Executor.grade`."""
        dry, queue_s, grade_s = await self._slots.run(self._dry, problem, dsl, kernel)
        report = dataclasses.replace(dry, device="cpu-stand-in")
        if dry.passed:
            speedup = 0.5 + int(dry.kernel_sha256[:8] or "0", 16) % 250 / 100.0
            median = 100.0
            report.reason = "stand_in"
            report.message = ("CPU stand-in: imports, compiles and returns the right structure; values and speed "
                              "were NOT measured (no GPU here)")
            report.timing = Timing(median_us=median, mean_us=median, stdev_us=0.0, min_us=median, n=1, rse=0.0,
                                   host_median_us=median, wall_s=0.0)
            report.eager = Timing(median_us=median * speedup, mean_us=median * speedup, stdev_us=0.0,
                                  min_us=median * speedup, n=1, rse=0.0, host_median_us=median * speedup, wall_s=0.0)
            report.speedup = speedup
            report.integrity = ["stand-in: no GPU; the speedup is a placeholder derived from the kernel's hash"]
        return Graded(report, queue_s, grade_s)


def preflight(device: str = "cuda") -> None:
    """Refuse, in one line and before any model call, an executor that cannot grade on this machine.

    Without it a run on a CPU machine would pay for every model call and record each attempt as the agent's
    compile error. Checks: a CUDA GPU for torch, both DSL packages, and OS isolation for the candidate (or the
    user's explicit opt-out).
    """
    import importlib.util

    from metakernel.errors import UserError
    from metakernel.grader import sandbox

    missing = [name for name in ("cutlass", "tvm") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"the local executor cannot grade here: DSL package(s) {', '.join(missing)} not installed "
                        "(pip install -e .)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("the local executor cannot grade here: torch sees no CUDA GPU (run on an sm_90a GPU "
                            "machine, or use --executor stand-in for a CPU demo)")
    if sandbox.default_mode() == "none" and not sandbox.opted_out():
        raise UserError("the local executor cannot grade here: this machine offers no isolation for the kernel's "
                        f"process (no root, no user namespaces); set {sandbox.ENV_OPT_OUT}=1 to grade without it")


def make_executor(name: str) -> Executor:
    """`local` (the GPU grader) or `stand-in` (CPU CI)."""
    from metakernel.errors import UserError

    if name == "local":
        return LocalExecutor()
    if name == "stand-in":
        return StandInExecutor()
    raise UserError(f"unknown executor {name!r} (known: local, stand-in)")


__all__ = ["Executor", "Graded", "LocalExecutor", "StandInExecutor", "make_executor", "preflight"]
