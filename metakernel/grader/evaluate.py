"""Grading one kernel file for one variant (DESIGN.md section 4), and the dry-run check.

The parent draws inputs and computes the reference and the float64 anchor; the candidate runs in a `Worker`
child. Order: static rules → start child (imports DSL + kernel) → ≥ 5 correctness draws (poisoned allocator,
mutated-input and unchanged-input checks, DSL launch count) → ablation (DSL launches suppressed must break the
outputs) → timing over fresh draws with re-checks → profiler attribution → baselines → speedup and flags.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from metakernel.compare import Expected, compare, compare_one
from metakernel.expected import compute_expected, fresh_copies, unchanged_snapshot
from metakernel.grader.baseline import eager_timing
from metakernel.grader.report import GradeReport
from metakernel.grader.static import check_source
from metakernel.grader.timing import bracket_settings, fresh_draw, knobs, measure, profile_kernels
from metakernel.grader.worker import Worker, WorkerFailure
from metakernel.hardware import H200
from metakernel.problem import Problem
from metakernel.provenance import provenance
from metakernel.structure import flatten, structure_mismatch


@dataclass
class GradeOptions:
    """Knobs of one evaluation; defaults are the protocol's."""

    draws: int = 5
    warmup: int = 3
    min_timed: int = 50
    max_timed: int = 200
    host_gate: float = 0.15  # > 0: count only draws taken at full host speed (timing.measure says why); 0 = all
    min_timing_s: float = 2.0  # sample at least this long (with the gate: long enough to meet the fast state)
    host_gate_wait_s: float = 8.0  # with the gate: stop waiting for fast draws after this long
    host_fast_us: float | None = None  # the host's fast probe level measured beforehand (timing.measure, gate only)
    keep_draws: bool = False  # timing study: per-draw event times and probes in Timing.per_draw (+ a torch probe)
    timing_cap_s: float = 60.0
    rse_target: float = 0.005
    rechecks: int = 3
    flush_l2: bool = False
    spin_ms: float = 2.0  # GPU kept busy before each timed call (child.Child.spin says why)
    call_timeout_s: float = 120.0
    start_timeout_s: float = 300.0
    scale: str | None = None
    baselines: bool = True
    compile_baseline: bool = False
    profile: bool = True
    # fresh draws profiled for GPU-only time and DSL share (child.Child.profile, timing.profile_kernels say why):
    profile_draws: int = 24  # at least this many,
    profile_max_draws: int = 48  # more while the GPU-time mean's standard error is over profile_rse, up to this
    profile_rse: float = 0.005


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _outputs_nbytes(expected: Expected) -> int:
    return sum(t.numel() * t.element_size() for n, t in expected.reference.items() if n not in expected.mutated)


def _copy(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return result.clone()
    if isinstance(result, (tuple, list)):
        return type(result)(_copy(x) for x in result)
    return result


class Evaluation:
    """One grading run; methods are the phases, each may end it by raising `_Done`."""

    def __init__(self, problem: Problem, dsl: str, kernel: Path, device: str, options: GradeOptions) -> None:
        self.problem, self.dsl, self.kernel, self.device, self.o = problem, dsl, kernel, device, options
        self.scale = options.scale or ("full" if device == "cuda" else "small")
        source = kernel.read_bytes() if kernel.is_file() else b""
        self.source = source
        self.report = GradeReport(problem=problem.identity, dsl=dsl, kernel_sha256=hashlib.sha256(source).hexdigest(),
                                  device=device, scale=self.scale)
        self.worker: Worker | None = None
        self.pattern = 0xFF

    def end(self, status: str, reason: str, message: str = "", **fields: Any) -> None:
        self.report.status, self.report.reason, self.report.message = status, reason, message
        for k, v in fields.items():
            setattr(self.report, k, v)
        raise _Done

    # ------------------------------------------------------------------------------------------ phases
    def static(self) -> None:
        if not self.kernel.is_file():
            self.end("compile_error", "no_file", f"no kernel file at {self.kernel}")
        result = check_source(self.source, self.dsl)
        if result.problem:
            self.end(result.status or "compile_error", "static", result.problem)
        if result.violations:
            self.end("rule_violation", "static", "kernel.py breaks the submission rules:",
                     violations=[v.text() for v in result.violations])

    def start(self, prestarted: PendingWorker | None = None) -> None:
        try:
            if prestarted is not None:
                self.worker, ready = prestarted.result()
            else:
                self.worker = candidate_worker(self.dsl, self.kernel, self.device, self.o)
                ready = self.worker.start()
        except WorkerFailure as exc:
            self.end(exc.status, "compile" if exc.status == "compile_error" else "import",
                     f"importing kernel.py failed:\n{exc.text}")
        self.report.limits = ready.get("limits", {})
        self.report.phases_s["import"] = ready.get("import_s", 0.0) + ready.get("dsl_import_s", 0.0)

    def call(self, inputs: list[Any], expected: Expected | None, mode: str = "run", op: str = "call",
             want_outputs: bool = True, audit: bool = False) -> dict[str, Any]:
        assert self.worker is not None
        self.pattern = 0x7F if self.pattern == 0xFF else 0xFF
        msg = {"op": op, "inputs": inputs, "mode": mode, "return_outputs": want_outputs, "audit": audit,
               "poison": 2 * _outputs_nbytes(expected) if expected is not None else 0, "pattern": self.pattern,
               **bracket_settings(self.o)}
        try:
            reply = self.worker.request(msg, timeout=self.o.call_timeout_s)
        except WorkerFailure as exc:
            reason = "timeout" if exc.status == "timeout" else "crash"
            self.end(exc.status, reason, exc.text)
        if not reply.get("ok"):
            error = reply.get("error", "")
            status = reply.get("status", "runtime_error")
            reason = ("illegal_address" if "illegal memory access" in error
                      else "compile" if status == "compile_error" else "exception")
            self.end(reply.get("status", "runtime_error"), reason, f"solve raised:\n{error}")
        if want_outputs:
            reply["out"] = _copy(reply.get("out"))
        _sync(self.device)
        return reply

    def judge(self, inputs: list[Any], sent: list[Any], snapshot: dict[int, torch.Tensor], reply: dict[str, Any],
              expected: Expected, draw: int) -> None:
        out = reply["out"]
        problem = structure_mismatch_safe(out, expected.returned)
        if problem is not None:
            self.end("wrong", "structure", f"draw {draw}: wrong output structure: {problem}")
        mutated = {n: sent[self.problem.input_names.index(n)] for n in self.problem.mutates}
        verdict = compare(out, mutated, expected)
        if not verdict.passed:
            mm = verdict.mismatch
            reason = "nan" if mm is not None and "NaN" in mm.detail else "mismatch"
            self.end("wrong", reason, f"draw {draw}: {verdict.text()}", mismatch=verdict.to_dict()["mismatch"])
        for i, before in snapshot.items():
            if not torch.equal(before, sent[i]):
                self.end("rule_violation", "input_mutated",
                         f"solve changed input {self.problem.input_names[i]}, which the problem does not mutate")

    def correctness(self) -> None:
        started = time.perf_counter()
        launches = []
        for draw in range(1, self.o.draws + 1):
            inputs = fresh_draw(self.problem, self.device, self.scale)
            expected = compute_expected(self.problem, inputs)
            sent = fresh_copies(self.problem, inputs)
            snapshot = unchanged_snapshot(self.problem, sent)
            reply = self.call(sent, expected)
            if not reply.get("launches"):
                self.end("rule_violation", "no_dsl_launch",
                         f"solve launched no {self.dsl} kernel (every call must launch one whose result is used)")
            launches.append(reply["launches"])
            if draw == 1:  # the first call compiles (DSL kernels are usually built on first use)
                self.report.phases_s["first_call"] = reply["host_s"]
            self.judge(inputs, sent, snapshot, reply, expected, draw)
            self.report.draws_checked = draw
        self.report.launches_per_call = statistics.fmean(launches)
        self.report.phases_s["correctness"] = time.perf_counter() - started

    def ablation(self) -> None:
        inputs = fresh_draw(self.problem, self.device, self.scale)
        expected = compute_expected(self.problem, inputs)
        sent = fresh_copies(self.problem, inputs)
        assert self.worker is not None
        try:
            reply = self.worker.request({"op": "call", "inputs": sent, "mode": "suppress", "return_outputs": True,
                                         "poison": 2 * _outputs_nbytes(expected), "pattern": 0xFF},
                                        timeout=self.o.call_timeout_s)
        except WorkerFailure as exc:
            self.report.ablation = f"the process failed without DSL launches ({exc.status}): counts as required"
            self._restart_after_ablation()
            return
        if not reply.get("ok"):
            self.report.ablation = "solve raised without DSL launches: counts as required"
            return
        mutated = {n: sent[self.problem.input_names.index(n)] for n in self.problem.mutates}
        out = _copy(reply.get("out"))
        if structure_mismatch_safe(out, expected.returned) is None and compare(out, mutated, expected).passed:
            self.end("rule_violation", "dsl_unused",
                     f"outputs are still correct with every {self.dsl} launch suppressed: the DSL kernel does no "
                     "work the result depends on", ablation="passed without DSL launches")
        self.report.ablation = "outputs wrong without DSL launches"

    def audit(self) -> None:
        """Catch token kernels: a DSL launch handed the finished answer (e.g. an eager result it merely copies)."""
        inputs = fresh_draw(self.problem, self.device, self.scale)
        expected = compute_expected(self.problem, inputs)
        reply = self.call(fresh_copies(self.problem, inputs), expected, want_outputs=False, audit=True)
        for launch, tensors in enumerate(reply.get("audited") or []):
            for arg in tensors:
                for name in (*expected.names, *expected.mutated):
                    if name in self.problem.mutates:
                        continue  # a cache handed to the kernel that updates it is the normal case
                    ref = expected.reference[name]
                    # Any view of the answer counts (a copy kernel is typically handed a flattened one).
                    if arg.numel() != ref.numel() or arg.dtype != ref.dtype or not ref.numel():
                        continue
                    leaves = {**expected.reference, name: arg.reshape(ref.shape).to(ref.device)}
                    check, mismatch = compare_one(name, leaves, expected)
                    if mismatch is None and not bool((ref == 0).all()):
                        self.end("rule_violation", "dsl_token",
                                 f"{self.dsl} launch {launch + 1} was handed the finished value of output {name} "
                                 "before it ran: the DSL kernel does no work the answer depends on")

    def _restart_after_ablation(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.worker = None
        self.start()

    def timing(self) -> None:
        recheck_at = set(random.sample(range(self.o.min_timed), k=min(self.o.rechecks, self.o.min_timed)))

        def one(i: int) -> dict[str, Any]:
            inputs = fresh_draw(self.problem, self.device, self.scale)
            recheck = i in recheck_at
            expected = compute_expected(self.problem, inputs) if recheck else None
            sent = fresh_copies(self.problem, inputs)
            snapshot = unchanged_snapshot(self.problem, sent) if recheck else {}
            _sync(self.device)
            t0 = time.perf_counter()
            reply = self.call(sent, expected, op="time", want_outputs=recheck)
            reply["wall_s"] = time.perf_counter() - t0
            if recheck and expected is not None:
                self.judge(inputs, sent, snapshot, reply, expected, draw=self.o.draws + i + 1)
                self.report.rechecks += 1
            return reply

        timing, flags = measure(one, **knobs(self.o))
        self.report.timing = timing
        self.report.integrity.extend(flags)
        self.report.phases_s["timing"] = timing.wall_s

    def profile(self) -> None:
        assert self.worker is not None
        try:
            reply = profile_kernels(self.worker, self.problem, self.device, self.scale, self.o)
        except WorkerFailure as exc:
            self.report.integrity.append(f"profiling failed: {exc.status}")
            return
        if not reply.get("ok"):
            self.report.integrity.append("profiling failed: " + reply.get("error", "")[-300:])
            return
        from metakernel.dsl import get_adapter

        adapter = get_adapter(self.dsl)
        names = set(reply.get("kernel_names", []))
        kernels = reply.get("kernels", [])
        total = sum(us for _, us in kernels)
        dsl_us = sum(us for name, us in kernels if _is_dsl_kernel(adapter, name, names))
        self.report.kernels = [{"name": n[:160], "us": round(us, 3), "dsl": _is_dsl_kernel(adapter, n, names)}
                               for n, us in kernels]
        if kernels:
            self.report.gpu_only_us = total
            self.report.gpu_only_draws = int(reply.get("repeats") or 0)
            self.report.gpu_only_rse = reply.get("rse")
            self.report.dsl_share = dsl_us / total if total > 0 else None
            timing = self.report.timing
            if timing is not None and timing.median_us < 0.8 * total:
                self.report.integrity.append(
                    f"end-to-end median {timing.median_us:.1f} us is below the GPU kernel time {total:.1f} us")

    def baselines(self) -> None:
        if not self.o.baselines:
            return
        started = time.perf_counter()
        self.report.eager = eager_timing(self.problem, self.device, self.scale, kind="eager", options=self.o)
        if self.o.compile_baseline:
            self.report.compiled = eager_timing(self.problem, self.device, self.scale, kind="compile",
                                                options=self.o)
        self.report.phases_s["baselines"] = time.perf_counter() - started

    def finish(self) -> None:
        r = self.report
        if r.timing and r.eager:
            r.speedup = r.eager.median_us / r.timing.median_us
        if r.eager and r.eager.gpu_only_us and r.gpu_only_us:
            r.speedup_gpu = r.eager.gpu_only_us / r.gpu_only_us
        if r.timing and r.compiled:
            r.speedup_vs_compile = r.compiled.median_us / r.timing.median_us
        if r.timing and self.device == "cuda":
            counts = self.problem.roofline(fresh_draw(self.problem, self.device, self.scale))
            bound = H200.min_seconds(counts["flops"], counts["bytes"]) * 1e6
            r.roofline_fraction = bound / r.timing.median_us
        r.status, r.reason = "passed", ""
        r.message = "correct on every draw; DSL launches required; timed"


class _Done(Exception):
    pass


def candidate_worker(dsl: str, kernel: Path, device: str, options: GradeOptions) -> Worker:
    """A (not yet started) child for grading `kernel` in `dsl`."""
    from metakernel.dsl import get_adapter

    return Worker(kind="candidate", path=kernel, device=device, dsl=dsl,
                  env=get_adapter(dsl).environment(dry_run=False), start_timeout=options.start_timeout_s)


class PendingWorker:
    """A child started in a background thread, so its imports (4-8 s of DSL import) overlap other grading.

    DESIGN 8: grading children are spawned ahead of need and used once.
    """

    def __init__(self, dsl: str, kernel: Path, device: str, options: GradeOptions) -> None:
        import threading

        self.worker = candidate_worker(dsl, kernel, device, options)
        self._ready: dict[str, Any] | None = None
        self._error: WorkerFailure | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._ready = self.worker.start()
        except WorkerFailure as exc:
            self._error = exc

    def result(self) -> tuple[Worker, dict[str, Any]]:
        """Wait for the start; the started worker and its ready message, or the start's failure."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._ready is not None
        return self.worker, self._ready

    def discard(self) -> None:
        """Stop a child that will not be used."""
        self._thread.join()
        self.worker.close()


def structure_mismatch_safe(candidate: Any, expected: Any) -> str | None:
    """`structure_mismatch`, with unsupported candidate types reported instead of raised."""
    try:
        return structure_mismatch(candidate, expected)
    except TypeError as exc:
        return str(exc)


def _is_dsl_kernel(adapter: Any, name: str, known: set[str]) -> bool:
    if name in known or any(k and k in name for k in known):
        return True
    matcher = getattr(adapter, "is_dsl_kernel_name", None)
    return bool(matcher(name)) if matcher else False


def grade(problem: Problem, dsl: str, kernel: Path, device: str = "cuda", options: GradeOptions | None = None,
          prestarted: PendingWorker | None = None) -> GradeReport:
    """Grade one kernel file; never raises for anything the candidate does.

    `prestarted` is a child already importing this kernel (see `PendingWorker`); it is used or discarded.
    """
    options = options or GradeOptions()
    ev = Evaluation(problem, dsl, kernel, device, options)
    ev.report.options = dict(options.__dict__)
    started = time.perf_counter()
    try:
        ev.static()
        ev.start(prestarted)
        prestarted = None
        ev.correctness()
        ev.ablation()
        ev.audit()
        ev.timing()
        if options.profile:
            ev.profile()
        ev.baselines()
        ev.finish()
    except _Done:
        pass
    except WorkerFailure as exc:
        ev.report.status, ev.report.reason, ev.report.message = exc.status, "worker", exc.text
    finally:
        if prestarted is not None:
            prestarted.discard()
        if ev.worker is not None:
            ev.worker.close()
        ev.report.phases_s["total"] = time.perf_counter() - started
        ev.report.provenance = provenance()
    return ev.report


def dry_run(problem: Problem, dsl: str, kernel: Path, timeout_s: float = 300.0) -> GradeReport:
    """The free `check`: static rules, import, then `solve` on small CPU inputs with DSL launches intercepted.

    Launches are intercepted after compilation, so this catches import, trace and compile errors; it proves
    nothing about the values (only the GPU does).
    """
    from metakernel.dsl import get_adapter

    options = GradeOptions(scale="small", call_timeout_s=timeout_s, start_timeout_s=timeout_s)
    ev = Evaluation(problem, dsl, kernel, "cpu", options)
    try:
        ev.static()
        ev.worker = Worker(kind="candidate", path=kernel, device="cpu", dsl=dsl, dry_run=True,
                           env=get_adapter(dsl).environment(dry_run=True), start_timeout=timeout_s)
        try:
            ev.worker.start()
        except WorkerFailure as exc:
            ev.end(exc.status, "import", f"importing kernel.py failed:\n{exc.text}")
        inputs = fresh_copies(problem, fresh_draw(problem, "cpu", "small"))
        expected_structure = compute_expected(problem, inputs).returned
        reply = ev.call(inputs, None, mode="intercept")
        if not reply.get("launches"):
            ev.end("rule_violation", "no_dsl_launch", f"solve launched no {dsl} kernel")
        mismatch = structure_mismatch_safe(reply.get("out"), expected_structure)
        if mismatch is not None:
            ev.end("wrong", "structure", f"wrong output structure: {mismatch}")
        ev.report.status, ev.report.reason = "passed", "dry_run"
        ev.report.launches_per_call = reply["launches"]
        ev.report.message = (f"dry run ok: imports, compiles, {reply['launches']} {dsl} launch(es) intercepted, "
                             "output structure right (values not checked: only the GPU proves them)")
    except _Done:
        pass
    finally:
        if ev.worker is not None:
            ev.worker.close()
    return ev.report


__all__ = ["GradeOptions", "dry_run", "flatten", "grade"]
