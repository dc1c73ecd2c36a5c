"""Grading one kernel file for one variant (docs/design.md section 4), and the dry-run check.

The parent draws inputs and computes the reference and the float64 anchor; the candidate runs in a sandboxed
`Worker` child. Order: static rules → start child (sandbox, DSL, kernel) → ≥ 5 correctness draws → ablations
(DSL launches suppressed, then the DSL launches' inputs randomised: outputs must break) → audit (a launch handed
the answer, also transformed) → timing over fresh draws → profiler attribution (exact DSL symbols, ≥ 50 % of GPU
time, no foreign kernels) → baselines → speedup and plausibility verdicts.

Every call looks the same to the candidate: correctness, timed and profiled calls come in the same request, a row
of `timing.ROW` draws, every one after the first masked until its own call, with the same allocator treatment, and
each returns its outputs; which draws are compared is decided here after the reply (`Checker`; every draw in the
correctness phase, at least a fifth of the others). Every call of a row must launch the DSL, and timed calls may
run only the DSL functions checked calls ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import statistics
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

from metakernel.compare import Expected, Verdict, compare
from metakernel.expected import compute_expected, fresh_copies
from metakernel.grader import kernels as kernel_names
from metakernel.grader.baseline import baseline_worker, cached_timing, eager_timing
from metakernel.grader.report import PROTOCOL, GradeReport
from metakernel.grader.sharing import Alone, GpuShare
from metakernel.grader.static import check_source
from metakernel.grader.timing import (
    ROW,
    bracket_settings,
    fresh_draw,
    knobs,
    measure,
    profile_kernels,
    row_size,
    seeded_draw,
)
from metakernel.grader.transport import leaf_kinds, release_cache, unpack_value
from metakernel.grader.worker import StartingWorker, Worker, WorkerFailure
from metakernel.hardware import H200
from metakernel.problem import Problem
from metakernel.provenance import provenance
from metakernel.structure import flatten, structure_mismatch

#: Where an ablation's or the audit's call sits in its row: the OS's randomness, nothing a candidate could replay.
_RANDOM = secrets.SystemRandom()

#: The share of timed and profiled draws compared at random (decided after each reply), and the floor kept: a
#: fifth, as the integrity issue asks. Every check computes the reference twice (native and float64) and costs
#: the H200 ~20 ms, more than a timed row of four calls, so the share sets how many rows the timing phase affords.
CHECK_SHARE, CHECK_FLOOR = 0.2, 0.2
#: An end-to-end median under this share of the profiled GPU time is `implausible_time`: each timed call holds its
#: own GPU work inside its bracket, so an honest median cannot be lower. Every gold kernel on the H200 reads at
#: least 1.002 x (problem 34 CuTe, validation/h200-gold.json); the slack covers draws whose work varies. A call
#: that ran other (eager, library) work only where it was timed gains at most this share (docs/integrity.md hole 10).
E2E_OVER_GPU_MIN = 0.95
#: A DSL function launched only in timed rows fails the grading from this share of the timed rows on.
TIMED_ONLY_SHARE = 0.25
#: GPU-only time below the roofline bound times this is physically impossible (inputs larger than L2, resp.
#: small enough to stay in the H200's 50 MB L2, where bandwidth can beat HBM's several times).
ROOFLINE_MARGIN, ROOFLINE_MARGIN_L2, L2_BYTES = 0.5, 0.15, 50 * 1024 * 1024


@dataclass
class GradeOptions:
    """Knobs of one evaluation; defaults are the protocol's."""

    draws: int = 5
    warmup: int = 3
    min_timed: int = 50
    max_timed: int = 200
    host_gate: float = 0.15  # > 0: count only draws taken at full host speed (timing.measure says why); 0 = all
    min_timing_s: float = 2.0  # sample at least this long (with the gate: long enough to meet the fast state)
    host_gate_wait_s: float = 2.0  # with the gate: stop waiting for fast draws after this long (timing.measure)
    host_fast_us: float | None = None  # the host's fast probe level measured beforehand (timing.measure, gate only)
    keep_draws: bool = False  # timing study: per-draw event times and probes in Timing.per_draw
    timing_cap_s: float = 60.0
    rse_target: float = 0.005
    flush_l2: bool = False
    call_timeout_s: float = 120.0
    start_timeout_s: float = 300.0
    scale: str | None = None
    baselines: bool = True
    compile_baseline: bool = False
    profile: bool = True
    # fresh draws profiled for GPU-only time and DSL share (timing.profile_kernels says why):
    profile_draws: int = 24  # at least this many,
    profile_max_draws: int = 48  # more while the GPU-time mean's standard error is over profile_rse, up to this
    profile_rse: float = 0.005
    require_isolation: bool | None = None  # None: METAKERNEL_ALLOW_UNSANDBOXED decides; False: opt out
    # False: the development loop (correctness, ablations, audit, profile and DSL share; no timing, no baselines),
    # so a kernel writer's broken file costs seconds of device time; never how attempts are graded
    timed: bool = True


class _Done(Exception):
    pass


class Checker:
    """Which draws are compared: each with probability CHECK_SHARE, more when the phase falls below CHECK_FLOOR.

    Decided by the parent after the reply, from a secret source, so nothing the candidate sees before or during
    a call depends on it.
    """

    def __init__(self) -> None:
        self.seen = 0
        self.checked = 0

    def choose(self) -> bool:
        """True when the draw just returned is to be compared."""
        self.seen += 1
        pick = secrets.randbelow(1000) < CHECK_SHARE * 1000 or self.checked < CHECK_FLOOR * self.seen - 1
        self.checked += pick
        return pick


def _outputs_nbytes(expected: Expected) -> int:
    return sum(t.numel() * t.element_size() for n, t in expected.reference.items() if n not in expected.mutated)


def _copy(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return result.clone()
    if isinstance(result, (tuple, list)):
        return type(result)(_copy(x) for x in result)
    return result


@dataclass
class Sizes:
    """Arena bytes one draw of a problem needs (inputs, returned outputs) and the draws one request carries."""

    in_bytes: int
    out_bytes: int
    slots: int

    @property
    def arena_bytes(self) -> int:
        """The GPU memory one child's two arenas take in the parent: what a child started ahead adds there."""
        return (self.in_bytes + self.out_bytes) * self.slots


_SIZES: dict[tuple[str, str, str, int], Sizes] = {}


#: Draws `exchange_sizes` looks at to tell fixed sizes from value-dependent ones.
SIZE_DRAWS = 3


def exchange_sizes(problem: Problem, device: str, scale: str, slots: int) -> Sizes:
    """Measured once per problem and process from a few draws and their reference results.

    Some outputs' sizes depend on the drawn values (problem 24's local shard length follows the random request
    lengths): where the draws disagree, the arenas get twice the largest size seen, so that a correct kernel's
    outputs on a later draw still fit (on the H200 both gold kernels of problem 24 were rejected as "outputs
    larger than the reference's" when the arena was sized from one draw).
    """
    from metakernel.grader.timing import ARENA_BYTES
    from metakernel.grader.transport import aligned, draw_bytes

    key = (problem.content_hash, device, scale, slots)
    if key not in _SIZES:
        seen_in, seen_out = set(), set()
        for _ in range(SIZE_DRAWS):
            _, inputs = seeded_draw(problem, device, scale)
            seen_in.add(draw_bytes(inputs) if device == "cuda" else 0)
            with torch.no_grad():
                returned = problem.reference(*fresh_copies(problem, inputs))
            seen_out.add(sum(aligned(leaf.tensor.numel() * leaf.tensor.element_size())
                             for leaf in flatten(returned)))
            del inputs, returned
        in_bytes = max(seen_in) * (2 if len(seen_in) > 1 else 1)
        out_bytes = max(seen_out) * (2 if len(seen_out) > 1 else 1)
        fit = max(1, ARENA_BYTES // max(in_bytes, 1))
        _SIZES[key] = Sizes(in_bytes, out_bytes, min(slots, fit))
    return _SIZES[key]


#: How CUDA words a kernel's access outside valid memory; which one depends on where the stray address lands
#: (a write 4 GB past the arena is cudaErrorInvalidAddressSpace, inside a mapped neighbour cudaErrorIllegalAddress).
MEMORY_FAULTS = ("illegal memory access", "illegal address", "global/shared address space", "misaligned address")


#: How CUDA and torch word an allocation that found no memory.
OUT_OF_MEMORY = ("OutOfMemoryError", "out of memory")
#: A child's out-of-memory failure is the grader's when the grader's own process held more than this share of the
#: GPU at the time: on an 80 GB H100 the corpus validation ran gold kernels of problems 21-50 out of memory while the
#: parent held 62-77 GB (validation/h100-gold-682b56c.json). Above it the card is too small for the grader's copies
#: of that problem, and the failure costs the candidate nothing.
GRADER_MEMORY_SHARE = 0.25
#: ... but not where the kernel's own process held and asked for more than this share of the card: half is the room
#: the launch gate's copies assume (`Child.setup`), twice what the largest gold file needs on an 80 GB H100.
KERNEL_MEMORY_SHARE = 0.5


#: The eager baseline's child is started ahead (`Evaluation.start_baseline_ahead`) only while its arenas, held by
#: this process beside the candidate's and the timed draws, stay under this: problem 42 (2 GB a draw, 8.8 GB of
#: arenas a child) ran out of memory in the grader on an 80 GB H100 with both children's arenas held.
EAGER_AHEAD_ARENA_BYTES = 4 << 30


def grader_gpu_bytes(device: str) -> tuple[int, int] | None:
    """(bytes this process holds on the GPU after returning its cache, the GPU's total), or None off the GPU."""
    if device != "cuda" or not torch.cuda.is_available():
        return None
    release_cache()
    return torch.cuda.memory_reserved(), torch.cuda.mem_get_info()[1]


def process_tree(pid: int) -> set[int]:
    """`pid` and its descendants (a child in its own pid namespace runs the kernel in a forked grandchild)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(p) for p in handle.read().split())
        except (OSError, ValueError):
            pass
    return found


def tree_gpu_bytes(pid: int | None) -> int | None:
    """Device bytes the driver says `pid`'s process tree uses, through every allocator (torch's, TVM's, CuTe's).

    None where that cannot be known: no NVML, no live process, or none of the tree among the GPU's processes (a
    pid namespace the driver does not report in): then nobody is credited with memory the driver did not show.
    """
    if pid is None or not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        used = {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # noqa: BLE001 - NVML is a help here, never a reason to fail a grading
        return None
    tree = process_tree(pid) & set(used)
    return sum(used[p] for p in tree) if tree else None


class Evaluation:
    """One grading run; methods are the phases, each may end it by raising `_Done`."""

    def __init__(self, problem: Problem, dsl: str, kernel: Path, device: str, options: GradeOptions) -> None:
        self.problem, self.dsl, self.kernel, self.device, self.o = problem, dsl, kernel, device, options
        self.scale = options.scale or ("full" if device == "cuda" else "small")
        source = kernel.read_bytes() if kernel.is_file() else b""
        self.source = source
        self.report = GradeReport(problem=problem.identity, dsl=dsl, kernel_sha256=hashlib.sha256(source).hexdigest(),
                                  device=device, scale=self.scale, protocol=PROTOCOL)
        self.worker: Worker | None = None
        self.pattern = 0xFF
        self.poison_bytes = 0
        self.last_seed: int | None = None
        # (output, consuming launch, producing unit): answers a DSL launch was handed from an earlier one (audit)
        self.token_producers: list[tuple[str, int, tuple[str, ...]]] = []
        # compiled units checked calls (correctness, profile) launched; per DSL function, the timed rows that
        # launched it (`check_timed_units`)
        self.units_checked: set[tuple[str, ...]] = set()
        # unit -> whether any of its launches in the audit calls changed a tensor argument (`blind_names`)
        self.unit_wrote: dict[tuple[str, ...], bool] = {}
        self.timed_functions: dict[str, int] = {}
        self.timed_rows = 0
        self.eager_ahead: StartingWorker | None = None  # the eager baseline's child, started early (baselines)

    def end(self, status: str, reason: str, message: str = "", *, oom: list[int] | None = None,
            **fields: Any) -> NoReturn:
        """The verdict. `oom`: [bytes asked, bytes held] of the child allocator's failure that ended the call.

        A failure in which the allocator ran out is the machine's where the kernel kept to its share of the card
        and others filled it (`_grader_memory`). Only the allocator's own account counts: the words are the file's
        to raise (session 33's second red-teamer voided a grading with a RuntimeError of its own), and so is any
        size a message names.
        """
        copy = getattr(self.worker, "path", None) if self.worker is not None else None
        if copy is not None and message:  # tracebacks name the child's copy: show the user's own file instead
            message = message.replace(str(copy), str(self.kernel))
        failed = status in ("runtime_error", "timeout", "compile_error")
        crowded = self._grader_memory(oom) if failed else None
        if crowded is not None:
            status, reason = "infra_error", "grader_memory"
            message = f"{crowded} (not the kernel's fault):\n{message}"
        self.report.status, self.report.reason, self.report.message = status, reason, message
        for k, v in fields.items():
            setattr(self.report, k, v)
        raise _Done

    def _grader_memory(self, oom: list[int] | None) -> str | None:
        """Why the allocator's failure `oom` is the machine's, or None where it is the kernel's.

        The kernel's own appetite is its request plus what its allocator held, and, where the driver reports it,
        everything its process tree used through any allocator (a file holding the card through TVM's allocator
        and then failing a small torch request is charged). Within half the card, the crowd was someone else's:
        the grader's, another grading's beside it (on an H100, gold 51 TIRx ran out beside a lane's child holding
        47 GB), or the machine's. Where the driver says nothing, the grader's own share must explain it.
        """
        if not oom:
            return None
        held = grader_gpu_bytes(self.device)
        if held is None:
            return None
        requested, allocated = int(oom[0]), int(oom[1])
        half = KERNEL_MEMORY_SHARE * held[1]
        if requested + allocated > half:
            return None
        tree = self._child_gpu_bytes()
        asked = f"the kernel's request for {requested / 2**30:.2f} GiB found no GPU memory"
        if tree is not None:
            if tree + requested > half:
                return None
            return (f"{asked} while its process used {tree / 2**30:.1f} of the GPU's {held[1] / 2**30:.0f} GiB "
                    f"and the grader held {held[0] / 2**30:.1f}")
        if held[0] <= GRADER_MEMORY_SHARE * held[1]:
            return None
        return (f"{asked} (its allocator held {allocated / 2**30:.1f} GiB) while the grader itself held "
                f"{held[0] / 2**30:.1f} of the GPU's {held[1] / 2**30:.0f} GiB")

    def _child_gpu_bytes(self) -> int | None:
        """What the driver says the candidate's live child uses of the card (`tree_gpu_bytes`), or None."""
        proc = getattr(self.worker, "proc", None) if self.worker is not None else None
        return tree_gpu_bytes(proc.pid if proc is not None and proc.poll() is None else None)

    def kernel_held_the_card(self, exc: BaseException) -> str | None:
        """Why the grader's own out-of-memory error `exc` is the kernel's doing, or None.

        A file that fills the card (at import, or in a call through any allocator) makes the grader's next
        allocation fail: that was an infra_error (never charged). Where the driver reports the child's process tree
        above half the card, it is the kernel's.
        """
        if type(exc).__name__ != "OutOfMemoryError":
            return None
        tree = self._child_gpu_bytes()
        total = torch.cuda.mem_get_info()[1] if tree is not None else 0
        if tree is None or tree <= KERNEL_MEMORY_SHARE * total:
            return None
        return (f"the kernel's process used {tree / 2**30:.1f} of the GPU's {total / 2**30:.0f} GiB, more than "
                "half, and the grader could not allocate its own copies: keep a kernel's memory to what it needs")

    # ------------------------------------------------------------------------------------------ phases
    def static(self) -> None:
        name = self.kernel.name
        if not self.kernel.is_file():
            self.end("compile_error", "no_file", f"no kernel file at {self.kernel}")
        result = check_source(self.source, self.dsl, filename=name)
        if result.problem:
            self.end(result.status or "compile_error", "static", result.problem)
        if result.violations:
            self.end("rule_violation", "static", f"{name} breaks the submission rules:",
                     violations=[v.text() for v in result.violations])

    def start(self, prestarted: StartingWorker | None = None) -> None:
        """The candidate's child, ready: the one started ahead, or a fresh one.

        A child started ahead that ran out of GPU memory did so beside the grading before this one (on an H100,
        problem 25's TIRx gold failed its import so while problem 25's CuTe grading held the card): it is started again
        here, alone, and only that start's failure is the kernel's.
        """
        try:
            if prestarted is not None:
                try:
                    self.worker, ready = prestarted.result()
                except WorkerFailure as exc:
                    if exc.status == "infra_error" or not any(m in exc.text for m in OUT_OF_MEMORY):
                        raise  # the grader's failure already, or the kernel's own
                    prestarted.discard()  # its arenas go back before the fresh child's are drawn
                    prestarted = None
            if prestarted is None:
                self.worker = candidate_worker(self.problem, self.dsl, self.kernel, self.device, self.o)
                ready = self.worker.start()
        except WorkerFailure as exc:
            if exc.status == "infra_error":
                self.end("infra_error", exc.reason or "start", exc.text)
            if exc.status == "rule_violation":
                self.end("rule_violation", exc.reason or "sandbox", exc.text)
            self.end(exc.status, "compile" if exc.status == "compile_error" else "import",
                     f"importing {self.kernel.name} failed:\n{exc.text}", oom=exc.oom)
        assert self.worker is not None
        self.report.isolation = self.worker.isolation
        self.report.phases_s["import"] = ready.get("import_s", 0.0) + ready.get("dsl_import_s", 0.0)

    def _fail_reply(self, reply: dict[str, Any]) -> None:
        if reply.get("reason") != "sandbox":  # (a file that caught the gate's failure: the child's verdict stands)
            self._gate_failure(reply)
        error = reply.get("error", "")
        status = reply.get("status", "runtime_error")
        reason = reply.get("reason") or ("illegal_address" if any(f in error for f in MEMORY_FAULTS)
                                         else "compile" if status == "compile_error" else "exception")
        prefix = "" if status in ("rule_violation", "wrong") else "solve raised:\n"
        self.end(status, reason, prefix + error, oom=reply.get("oom"))

    def full_scale_trace(self) -> tuple[str, bool]:
        """`solve` at the full-scale shapes the GPU runs: (a sentence on what it covered, whether that was all).

        Shape-only (meta) tensors, launches intercepted after compiling. This is the specialisation a paid
        submission runs, so the check compiles it first; a small-scale call can take other compile-time branches
        (thread counts, vector widths, guards) and proves nothing the GPU runs. Code that needs values (`.item()`,
        `.tolist()`, a DLPack export of the data) cannot run on meta tensors: that path is reported as not
        covered, not as the kernel's error. All is covered when solve ran, launched the DSL and its output
        structure could be checked against the reference's at these shapes (18 references need values too).
        """
        assert self.worker is not None
        inputs = self.problem.make_inputs(device="meta", scale="full")
        try:
            reply, _ = self._exchange("call", [inputs], 0, mode="intercept")
        except WorkerFailure as exc:  # the child died in the trace (an abort in a compiler): the file's failure
            self.end(exc.status, exc.reason or ("timeout" if exc.status == "timeout" else "crash"),
                     f"at the full-scale shapes (the ones the GPU runs), the process failed:\n{exc.text}")
        if not reply.get("ok"):
            error = str(reply.get("error", ""))
            if "meta" in error.lower():
                last = next((ln.strip() for ln in reversed(error.splitlines()) if ln.strip()), "")
                return f"full scale not covered (solve needs values a shape-only trace has not: {last[:160]})", False
            status = reply.get("status", "runtime_error")
            if status in ("rule_violation", "infra_error"):
                self._fail_reply(reply)
            self.end(status, "compile" if status == "compile_error" else "full_scale",
                     f"at the full-scale shapes (the ones the GPU runs), solve raised:\n{error}")
        self.report.resources = reply.get("resources") or self.report.resources  # what the GPU will run
        self.report.launches_per_call = reply.get("launches")
        if not reply.get("launches"):
            self.end("rule_violation", "no_dsl_launch", f"solve launched no {self.dsl} kernel at the full-scale shapes")
        out = self.worker.outputs(reply["out"], reply["_blobs"])
        try:  # the child was sent copies: `inputs` are as drawn
            with torch.no_grad():
                expected = self.problem.reference(*inputs)
        except Exception:  # noqa: BLE001 - a reference that needs values: the structure is checked at small scale
            expected = None
        if expected is not None:
            mismatch = structure_mismatch_safe(out, expected)
            if mismatch is not None:
                self.end("wrong", "structure", f"at the full-scale shapes: wrong output structure: {mismatch}")
        return (f"full scale (the GPU's shapes): {reply.get('launches')} launch(es) compiled and intercepted"
                + ("" if expected is not None else "; output structure checked at small scale")), expected is not None

    def draw(self) -> list[Any]:
        """Fresh inputs from an unpredictable seed; the seed is kept so a `wrong` can be reproduced."""
        self.last_seed, inputs = seeded_draw(self.problem, self.device, self.scale)
        return inputs

    def _focus(self, inputs: list[Any], mode: str, position: int | None = None, **extra: Any
               ) -> tuple[dict[str, Any], list[Any]]:
        """One call in `mode` (an ablation or the audit), sent as a row like every correctness and timed request.

        A one-draw request was told apart from a row by what the rest of the input arena held (zeros where a row's
        later draws lie, a red-teamer's `rt_tirx_lone_draw_zeroed_arena`), so a kernel could be honest only where
        the ablations and the audit look. Now `inputs` take a random position in a row of fresh draws and only that
        call runs in `mode`; the others run as usual and are not read. `position` places it (the ablations and
        the audit cover every position of a row: a kernel can tell a call's position from which slots are still
        masked). Returns the reply (its `out`: the focus call's outputs) and the focus draw's inputs as the child
        saw them. Raises WorkerFailure.
        """
        assert self.worker is not None
        self.pattern = 0x7F if self.pattern == 0xFF else 0xFF
        if mode == "intercept":  # the free check: nothing is graded, one draw suffices
            reply, views = self._exchange("call", [inputs], self.pattern, mode=mode, **extra)
            return reply, views[0]
        row = self.row_size()
        focus = _RANDOM.randrange(row) if position is None else position % row
        draws = [inputs if k == focus else fresh_draw(self.problem, self.device, self.scale)
                 for k in range(row)]
        reply, views = self._exchange("row", draws, self.pattern, mode=mode, focus=focus, **extra)
        self._every_call_launched(reply, f"{mode} request")
        return reply, views[focus]

    def call(self, inputs: list[Any], mode: str = "run", **extra: Any) -> tuple[dict[str, Any], list[Any], Any]:
        """A call in `mode`: (reply, the inputs as the child saw them, its outputs); failures end the grading.

        The audit and the free check send these (`_focus`: the audit's call hides in a row).
        """
        assert self.worker is not None
        try:
            reply, seen = self._focus(inputs, mode, **extra)
        except WorkerFailure as exc:
            reason = "timeout" if exc.status == "timeout" else "crash"
            self.end(exc.status, reason, exc.text)
        if not reply.get("ok"):
            self._fail_reply(reply)
        return reply, seen, self.worker.outputs(reply["out"], reply["_blobs"])

    def _exchange(self, op: str, draws: list[list[Any]], pattern: int, **extra: Any
                  ) -> tuple[dict[str, Any], list[list[Any]]]:
        """One request of `draws` (copies placed, `Worker.exchange`), alike for every op; raises WorkerFailure."""
        assert self.worker is not None
        msg = {"op": op, "poison": self.poison_bytes, "pattern": pattern, **bracket_settings(self.o), **extra}
        return self.worker.exchange(msg, [fresh_copies(self.problem, d) for d in draws], self.o.call_timeout_s)

    def row_size(self) -> int:
        """Draws per request in the correctness, timing and profile phases (timing.ROW)."""
        return row_size(self.worker.slots if self.worker is not None else 1)

    def _row(self, op: str, draws: list[list[Any]], label: str) -> tuple[dict[str, Any], list[list[Any]]]:
        """One request of a row of draws, alike in the correctness, timing and profile phases; failures end it.

        Returns the reply and each draw's inputs as the child saw them. Every call of the row must have launched
        a DSL kernel: a `solve` that told timed calls from checked ones and ran only eager code in them would
        otherwise be timed at the eager code's speed with the DSL's share (docs/integrity.md hole 10).
        """
        assert self.worker is not None
        self.pattern = 0x7F if self.pattern == 0xFF else 0xFF
        try:
            reply, views = self._exchange(op, draws, self.pattern)
        except WorkerFailure as exc:
            self.end(exc.status, exc.reason or ("timeout" if exc.status == "timeout" else "crash"), exc.text)
        if not reply.get("ok"):
            self._fail_reply(reply)
        self._every_call_launched(reply, label)
        return reply, views

    def _every_call_launched(self, reply: dict[str, Any], label: str) -> None:
        """Every call of a row must launch the DSL (a suppressed launch counts: it was made)."""
        for k, launched in enumerate(reply.get("launches_each") or []):
            if not launched:
                self.end("rule_violation", "no_dsl_launch",
                         f"{label}: call {k + 1} of a request launched no {self.dsl} kernel (every call must launch "
                         "one whose result is used)")

    def _compare(self, out: Any, seen: list[Any], expected: Expected) -> tuple[str | None, Verdict | None]:
        """(structure problem, None) or (None, the comparator's verdict) for one call's outputs and mutated inputs."""
        out = _copy(out)
        problem = structure_mismatch_safe(out, expected.returned)
        if problem is not None:
            return problem, None
        mutated = {n: seen[self.problem.input_names.index(n)] for n in self.problem.mutates}
        return None, compare(out, mutated, expected)

    def judge(self, inputs: list[Any], seen: list[Any], out: Any, expected: Expected, label: str) -> None:
        """Compare one call's outputs (and mutated inputs) with `expected`; inputs it must leave alone, too."""
        problem, verdict = self._compare(out, seen, expected)
        if problem is not None:
            self.end("wrong", "structure", f"{label}: wrong output structure: {problem}", seed=self.last_seed)
        assert verdict is not None
        if not verdict.passed:
            mm = verdict.mismatch
            reason = "nan" if mm is not None and "NaN" in mm.detail else "mismatch"
            self.end("wrong", reason, f"{label}: {verdict.text()}", mismatch=verdict.to_dict()["mismatch"],
                     seed=self.last_seed)
        for i, (name, before) in enumerate(zip(self.problem.input_names, inputs, strict=True)):
            if name in self.problem.mutates or not isinstance(before, torch.Tensor):
                continue
            if not torch.equal(before, seen[i]):
                self.end("rule_violation", "input_mutated",
                         f"solve changed input {name}, which the problem does not mutate")

    def start_baseline_ahead(self) -> None:
        """Start the eager baseline's clean child now, when this grading will measure the baseline (not cached).

        Its imports then overlap the correctness, ablation and audit phases instead of following the profile (the
        baseline phase took a median 7.8 s of each problem's first grading on the H100 at 682b56c), and the timing
        phase waits until its start has finished, so nothing of it runs beside a timed call.
        """
        if not (self.o.timed and self.o.baselines):
            return
        if cached_timing(self.problem, self.device, self.scale, kind="eager", options=self.o) is not None:
            return
        if exchange_sizes(self.problem, self.device, self.scale, ROW).arena_bytes > EAGER_AHEAD_ARENA_BYTES:
            return  # its arenas beside the candidate's and the timed draws ran the grader out of GPU memory
        self.eager_ahead = StartingWorker(baseline_worker(self.problem, self.device, self.scale, kind="eager",
                                                          options=self.o))

    def correctness(self) -> None:
        """At least `draws` fresh draws, every one compared, in rows of the shape timed requests have."""
        started = time.perf_counter()
        launches: list[float] = []
        row = self.row_size()
        while self.report.draws_checked < self.o.draws:
            seeded = [seeded_draw(self.problem, self.device, self.scale) for _ in range(row)]
            if not self.poison_bytes:
                self.poison_bytes = 2 * _outputs_nbytes(compute_expected(self.problem, seeded[0][1]))
            reply, views = self._row("row", [inputs for _, inputs in seeded], "correctness")
            if not launches:  # the first call compiles (DSL kernels are usually built on first use)
                self.report.phases_s["first_call"] = reply["host_each_s"][0]
            launches.extend(reply["launches_each"])
            assert self.worker is not None
            for k, (seed, inputs) in enumerate(seeded):
                # one draw's references at a time (the inputs stay the parent's own, untouched by the call): a row's
                # four float64 references of problem 21's caches took 39 GB, and 80 GB cards ran out
                exp = compute_expected(self.problem, inputs)
                self.poison_bytes = max(self.poison_bytes, 2 * _outputs_nbytes(exp))
                self.last_seed = seed
                self.judge(inputs, views[k], self.worker.outputs(reply["outs"][k], reply["_blobs"]), exp,
                           f"draw {self.report.draws_checked + 1}")
                self.report.draws_checked += 1
                del exp
            self.units_checked.update(tuple(u) for u in reply.get("units") or [])
        self.report.launches_per_call = statistics.fmean(launches)
        self.report.phases_s["correctness"] = time.perf_counter() - started

    def _still_correct(self, inputs: list[Any], seen: list[Any], out: Any) -> bool:
        problem, verdict = self._compare(out, seen, compute_expected(self.problem, inputs))
        return problem is None and verdict is not None and verdict.passed

    def ablation(self) -> None:
        """Launches suppressed, then the launches' inputs randomised: either way the outputs must break.

        A call that raises or kills its process is not evidence that the outputs need the DSL's values: a file can
        fail on purpose when a probe launch tells it the call is ablated (session 33's red-teamer passed problem 28
        with eager outputs and a one-element probe that raised there). That position is ablated again in the other
        mode; an honest kernel whose garbled indices crash one mode shows its dependence in the other. Failing
        both ways is `dsl_unused`: the grader has no evidence left.
        """
        started = time.perf_counter()
        for mode, position in self.ablation_positions():
            outcome = self._ablated(mode, position=position)
            if outcome == "failed":
                failed = self.report.ablations[mode]
                mode = "randomize" if mode == "suppress" else "suppress"
                outcome = self._ablated(mode, position=position)
                if outcome in ("failed", "not_randomized"):
                    second = (self.report.ablations[mode] if outcome == "failed"
                              else "randomised: no tensor argument to randomise")
                    self.end("rule_violation", "dsl_unused",
                             f"no ablated call showed that the outputs depend on the {self.dsl} kernels' values "
                             f"({failed}; {second}): a failure is no evidence. Let solve return its outputs, "
                             "wrong ones, when its DSL launches' results are garbage",
                             ablation="failed in both modes")
            if outcome == "not_randomized":
                self.report.ablations[mode] = "no tensor argument to randomise: not conclusive"
                continue
            if outcome == "correct":
                what = ("every DSL launch suppressed" if mode == "suppress"
                        else "the DSL launches' tensor arguments overwritten with random values before they ran")
                self.end("rule_violation", "dsl_unused",
                         f"outputs are still correct with {what}: the {self.dsl} kernels do no work the result "
                         "depends on", ablation=f"passed with {mode}")
            self.report.ablations[mode] = "outputs wrong: the DSL's values are required"
        self.report.ablation = self.report.ablations.get("suppress")
        self.report.phases_s["ablation"] = time.perf_counter() - started

    def _ablated(self, mode: str, label: str | None = None, **extra: Any) -> str:
        """One ablated call on a fresh draw: "wrong", "correct", "not_randomized" or "failed" (noted under `label`).

        A failure is never "required" on its own (`ablation` says why); a crashed process is restarted.
        """
        label = label or mode
        inputs = self.draw()
        try:
            reply, seen, out = self._quiet_call(inputs, mode, **extra)
        except _Crashed as exc:
            self.report.ablations[label] = f"{_PAST[mode]}: the process failed ({exc}), which is not evidence"
            self._restart()
            return "failed"
        if reply is None:
            self.report.ablations[label] = f"{_PAST[mode]}: solve raised, which is not evidence"
            return "failed"
        if mode == "randomize" and not reply.get("randomized"):
            return "not_randomized"
        return "correct" if self._still_correct(inputs, seen, out) else "wrong"

    def ablation_positions(self) -> list[tuple[str, int]]:
        """Each position of a row once, half of them suppressed and half randomised, in a random order.

        A kernel can tell a call's position in its row (the slots of later draws are still masked), so a check
        made at one position only would let it be honest there and cheat at the others; eager work beside an idle
        DSL launch is `dsl_unused` under either mode, so every position meets one of them.
        """
        row = self.row_size()
        order = _RANDOM.sample(range(row), row)
        pairs = [("suppress" if i % 2 == 0 else "randomize", p) for i, p in enumerate(order)]
        if row == 1:
            pairs.append(("randomize", 0))
        return pairs

    def isolation(self) -> None:
        """Every position of a row once with the DSL launches isolated: the outputs must stay correct.

        Before each launch every byte the file's eager code could have written (the caching allocator's blocks, the
        input arena) is noise, except the launch's own tensor arguments (`LaunchGate.isolate`). A kernel reads its
        arguments only, so its outputs do not change; a copy kernel that reached an eager answer by index arithmetic
        from a one-element argument (docs/integrity.md hole 12: no op, name or token shows it) reads noise. A
        failure here is the kernel's: an honest one never reads the noise.
        """
        started = time.perf_counter()
        row = self.row_size()
        isolated, failed = 0, False
        for position in _RANDOM.sample(range(row), row):
            inputs = self.draw()
            try:
                reply, seen, out = self._quiet_call(inputs, "isolate", position=position)
            except _Crashed as exc:
                self.end("rule_violation", "dsl_reach",
                         f"the process failed ({exc}) while memory not handed to the {self.dsl} launches held noise: a "
                         "DSL kernel reads memory outside its tensor arguments")
            if reply is None:
                self.end("rule_violation", "dsl_reach",
                         f"solve raised while memory not handed to the {self.dsl} launches held noise: a DSL kernel "
                         "reads memory outside its tensor arguments")
            if int(reply.get("pinned") or 0) > 0:
                self.end("rule_violation", "dsl_reach",
                         f"{int(reply['pinned'])} bytes of page-locked host memory were in use while a {self.dsl} "
                         "launch ran: GPU kernels read it by address, outside every tensor argument (keep data on "
                         "the GPU; no non_blocking copies to the CPU)")
            count = int(reply.get("isolated") or 0)
            if count == -1:  # a file that keeps more memory than the grader can copy would never be isolated
                self.end("rule_violation", "dsl_reach",
                         "the file keeps more GPU memory than the grader can set aside (on the device or the host) to "
                         f"isolate its {self.dsl} launches, or hands one a view whose dimensions address the same "
                         "elements: free what the kernel does not need, pass plain (non-overlapping) views")
            isolated, failed = max(isolated, count), failed or count < 0
            if count > 0 and not self._still_correct(inputs, seen, out):
                self.end("rule_violation", "dsl_reach",
                         f"outputs are wrong when the memory not handed to the {self.dsl} launches holds noise while "
                         "they run: a DSL kernel reads memory outside its tensor arguments (pass everything it "
                         "reads as a tensor argument)")
        self.report.ablations["isolate"] = (
            f"outputs unchanged with {isolated / 2**20:.0f} MiB outside the launches' arguments overwritten"
            if isolated > 0 else "the grader could not list the allocator's memory: not conclusive"
            if failed else "nothing to isolate here (no CUDA allocator): not conclusive")
        self.report.phases_s["isolation"] = time.perf_counter() - started

    def _quiet_call(self, inputs: list[Any], mode: str, **extra: Any
                    ) -> tuple[dict[str, Any] | None, list[Any], Any]:
        """A call whose failure is information, not a verdict (the ablations)."""
        assert self.worker is not None
        try:
            reply, seen = self._focus(inputs, mode, **extra)
        except WorkerFailure as exc:
            raise _Crashed(exc.status) from exc
        if not reply.get("ok"):
            if reply.get("reason") == "sandbox":
                self._fail_reply(reply)
            self._gate_failure(reply)  # the grader's own work failed inside a launch: never "required"
            if self._grader_memory(reply.get("oom")) is not None:
                self._fail_reply(reply)  # the ablation's copies beside a kernel near the card's limit: the machine's
            if reply.get("fatal"):
                raise _Crashed(reply.get("status", "runtime_error"))
            return None, seen, None
        return reply, seen, self.worker.outputs(reply["out"], reply["_blobs"])

    def _gate_failure(self, reply: dict[str, Any]) -> None:
        """A failure of the grader's own work inside a launch (an audit's copies, an ablation's fills) ends the grading.

        Out of memory is the machine's, anything else the file's (it made a launch argument the gate cannot copy or
        write). The audit's calls come here too: its copies' failure read as the kernel's runtime error.
        """
        failed = str(reply.get("gate_failed") or "")
        if not failed:
            return
        if "OutOfMemoryError" in failed:
            self.end("infra_error", "grader_memory",
                     f"the grader ran out of memory auditing or ablating a {self.dsl} launch ({failed[:300]})")
        self.end("rule_violation", "sandbox",
                 f"the grader could not audit or ablate a {self.dsl} launch ({failed[:300]}): pass plain tensor "
                 "views of the dtypes the kernel computes in")

    def _restart(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.worker = None
        self.start()

    def audits(self) -> None:
        """The audit at every position of a row, in a random order (`ablation_positions` says why)."""
        row = self.row_size()
        for position in _RANDOM.sample(range(row), row):
            self.audit(position)

    def audit(self, position: int | None = None) -> None:
        """Catch token kernels: a DSL launch handed the finished answer, as is or transformed.

        An argument that still holds what an earlier DSL launch of the same call wrote into that very memory is
        that launch's work, not a token (problem 45's finalising launch reads the expert_ids its routing launch
        wrote). Such producers are kept: if the per-unit ablation later finds one idle (its values overwritten
        by eager code before the next launch read them), the consumer was handed an eager answer after all.
        """
        inputs = self.draw()
        expected = compute_expected(self.problem, inputs)
        # an output's size in bytes, or twice or four times it: the answer kept in a wider type (docs/integrity.md
        # hole 7: fp32 or fp64 for a bf16 output, int64 for int32)
        sizes = sorted({t.nbytes * k for n, t in expected.reference.items() if n not in self.problem.mutates
                        for k in (1, 2, 4)})
        mark = time.perf_counter()
        reply, _, _ = self.call(inputs, mode="audit", audit_bytes=sizes, position=position)
        self.report.phases_s["audit_call"] = (self.report.phases_s.get("audit_call", 0.0)
                                              + time.perf_counter() - mark)  # the rest of the phase: token checks
        from metakernel.grader.tokens import same_bytes, token_output, token_pair

        blobs = reply["_blobs"]
        arena = self.worker.arena_out if self.worker is not None else None

        unpacked: dict[str, Any] = {}  # spec -> tensor: the child sends an unchanged argument's copy once
        verdicts: dict[str, str | None] = {}  # spec -> token_output's answer for it (a function of its bytes)

        def key(spec: Any) -> str:
            return json.dumps(spec, sort_keys=True)

        def copied(spec: Any) -> Any:
            """One audited argument: a view of the output arena (GPU) or a value; nothing else is read."""
            allowed = {"at", "cpu"} if arena is not None else {"cpu"}
            try:
                if not isinstance(spec, dict) or leaf_kinds(spec) - allowed:
                    raise ValueError("not a tensor copy")
                k = key(spec)
                if k not in unpacked:
                    unpacked[k] = unpack_value(spec, blobs, arena).to(self.device)
                return unpacked[k]
            except (ValueError, KeyError, TypeError) as exc:
                self.end("rule_violation", "output_type", f"the audit's reply put launch arguments where the "
                         f"grader does not read them ({exc})")

        def token(spec: Any, arg: Any) -> str | None:
            k = key(spec)
            if k not in verdicts:
                verdicts[k] = token_output(arg, inputs, expected, self.problem.mutates)
            return verdicts[k]

        written: dict[int, tuple[Any, tuple[str, ...]]] = {}  # address -> (what a launch left there, its unit)
        for launch, record in enumerate(reply.get("audited") or []):
            if isinstance(record.get("wrote"), bool):  # over every audit call of the grading (`blind_names`)
                unit = tuple(record["unit"])
                self.unit_wrote[unit] = self.unit_wrote.get(unit, False) or record["wrote"]
            specs = record["before"]
            before = [copied(spec) for spec in specs]
            addresses = record["addresses"]
            args = []
            for spec, arg, address in zip(specs, before, addresses, strict=True):
                producer = written.get(address)
                if producer is not None and same_bytes(arg, producer[0]):
                    name = token(spec, arg)
                    if name is not None:
                        self.token_producers.append((name, launch, producer[1]))
                    continue
                args.append((spec, arg))
            for spec, arg in args:
                name = token(spec, arg)
                if name is not None:
                    self.end("rule_violation", "dsl_token",
                             f"{self.dsl} launch {launch + 1} was handed the finished value of output {name} (or "
                             "a rescaled, shifted, reshaped, reinterpreted or permuted copy of it) before it ran: "
                             "the DSL kernel does no work the answer depends on")
            name = token_pair([arg for _, arg in args], inputs, expected, self.problem.mutates)
            if name is not None:
                self.end("rule_violation", "dsl_token",
                         f"{self.dsl} launch {launch + 1} was handed output {name} split over two arguments (their "
                         "bytes XOR to the finished value) before it ran: the DSL kernel does no work the answer "
                         "depends on")
            if record["after"] is not None:
                for b, spec, address in zip(before, record["after"], addresses, strict=True):
                    left = copied(spec)
                    if not same_bytes(left, b):
                        written[address] = (left, tuple(record["unit"]))

    def timing(self) -> None:
        if self.eager_ahead is not None:
            self.eager_ahead.wait()  # no process start beside the timed calls
        checker = Checker()
        spent = {"timing_draw": 0.0, "timing_call": 0.0, "timing_check": 0.0}  # where the phase's wall time goes

        chunk = self.row_size()

        def one(i: int) -> dict[str, Any]:
            assert self.worker is not None
            t0 = time.perf_counter()
            seeded = [seeded_draw(self.problem, self.device, self.scale) for _ in range(chunk)]
            t1 = time.perf_counter()
            reply, views = self._row("row", [d for _, d in seeded], "timed request" if i >= 0 else "warm-up")
            t2 = time.perf_counter()
            self.timed_rows += 1
            for function in {kernel_names.function_of(n) for u in reply.get("units") or [] for n in u}:
                self.timed_functions[function] = self.timed_functions.get(function, 0) + 1
            for k, spec in enumerate(reply["outs"]):
                if checker.choose():
                    self.last_seed, inputs = seeded[k]
                    self.judge(inputs, views[k], self.worker.outputs(spec, reply["_blobs"]),
                               compute_expected(self.problem, inputs),
                               f"timed draw {i * chunk + k + 1}" if i >= 0 else "warm-up draw")
                    self.report.rechecks += 1
            spent["timing_draw"] += t1 - t0
            spent["timing_call"] += t2 - t1
            spent["timing_check"] += time.perf_counter() - t2
            spent["timing_child_window_events"] = spent.get("timing_child_window_events", 0.0) + float(
                reply.get("window_events") or 0)  # a count (audit events raised inside the timed window), not seconds
            for step, seconds in (reply.get("steps_s") or {}).items():  # the child's own account (diagnostics)
                if isinstance(seconds, (int, float)):
                    key = f"timing_child_{step}"
                    spent[key] = spent.get(key, 0.0) + float(seconds)
            return reply

        timing, flags = measure(one, **knobs(self.o))
        self.report.timing = timing
        self.report.integrity.extend(flags)
        self.report.phases_s["timing"] = timing.wall_s
        self.report.phases_s.update(spent)
        if timing.wall_s > 0 and timing.median_us * timing.n * timing.chunk * 1e-6 > 1.02 * timing.wall_s + 1e-3:
            self.end("rule_violation", "implausible_time", "the reported call times add up to more than the wall "
                     "time the parent measured around them")

    def profile(self) -> None:
        assert self.worker is not None
        checker = Checker()
        started = time.perf_counter()

        requests: list[list[tuple[str, float]]] = []  # each request's kernels (a whole request without DSL work)

        def send(count: int) -> dict[str, Any]:
            assert self.worker is not None
            draws = [self.draw() for _ in range(count)]
            reply, views = self._row("profile", draws, "profiled request")
            self.units_checked.update(tuple(u) for u in reply.get("units") or [])
            requests.append([(str(n), float(us)) for n, us in reply.get("kernels", [])])
            for k, spec in enumerate(reply["outs"]):
                if checker.choose():
                    out = self.worker.outputs(spec, reply["_blobs"])
                    self.judge(draws[k], views[k], out, compute_expected(self.problem, draws[k]), "profiled draw")
                    self.report.rechecks += 1
            return reply

        try:
            reply = profile_kernels(send, self.o, self.row_size())
        except WorkerFailure as exc:
            self.end(exc.status, "crash" if exc.status != "timeout" else "timeout", exc.text)
        names = set(reply.get("kernel_names", []))
        kernels = reply.get("kernels", [])
        total = sum(us for _, us in kernels)
        # (a CPU grading, in tests only, names TIRx's llvm units `function@address`: no symbol rule there)
        borrowed = sorted(n for n in names if kernel_names.vendor_named(n)
                          or (self.device == "cuda" and not kernel_names.is_symbol(n)))
        if borrowed:
            self.report.phases_s["profile"] = time.perf_counter() - started
            self.end("rule_violation", "foreign_kernel",
                     f"{self.dsl} kernel {borrowed[0][:120]!r} carries a name of torch's or a vendor library's "
                     "kernels (or is no C identifier), which would count that library's work as the DSL's: name "
                     "DSL kernels otherwise")
        classes = {name: kernel_names.classify(name, names) for name, _ in kernels}
        foreign = [n for n, kind in classes.items() if kind == "foreign"]
        if foreign:
            self.report.phases_s["profile"] = time.perf_counter() - started
            self.end("rule_violation", "foreign_kernel",
                     f"GPU kernel {foreign[0][:120]!r} is neither a {self.dsl} kernel this file compiled nor a "
                     "torch or CUDA library kernel (another JIT or kernel language did GPU work)")
        idle = self.unit_ablation([tuple(u) for u in reply.get("units") or []], kernels, classes)
        idle |= self.blind_names()
        for name in idle:
            classes[name] = "dsl_idle"
        for output, launch, unit in self.token_producers:
            if unit and set(unit) <= idle:
                self.report.phases_s["profile"] = time.perf_counter() - started
                self.end("rule_violation", "dsl_token",
                         f"{self.dsl} launch {launch + 1} was handed the finished value of output {output}, left by "
                         "an earlier launch whose own values the outputs do not depend on (eager code replaced "
                         "them): the DSL kernel does no work the answer depends on")
        dsl_us = sum(us for name, us in kernels if classes[name] == "dsl")
        idle_us = sum(us for name, us in kernels if classes[name] == "dsl_idle")
        self.report.kernels = [{"name": n[:160], "us": round(us, 3), "kind": classes[n]} for n, us in kernels]
        self.report.phases_s["profile"] = time.perf_counter() - started
        if not kernels:
            return
        self.report.gpu_only_us = total
        self.report.gpu_only_draws = int(reply.get("repeats") or 0)
        self.report.gpu_only_rse = reply.get("rse")
        self.report.dsl_share = dsl_us / total if total > 0 else None
        if self.device == "cuda" and dsl_us <= 0 and idle_us > 0:
            self.end("rule_violation", "dsl_unused", f"the outputs depend on none of the {self.dsl} launches alone")
        if self.device == "cuda" and dsl_us <= 0:
            self.end("rule_violation", "no_dsl_launch", f"the profiled calls ran no {self.dsl} kernel on the GPU")
        bare = [k for k, req in enumerate(requests) if not any(classes.get(n) == "dsl" and us > 0 for n, us in req)]
        if self.device == "cuda" and bare:
            self.end("rule_violation", "no_dsl_launch",
                     f"profiled request {bare[0] + 1} of {len(requests)} ran no {self.dsl} kernel the outputs depend "
                     "on (the share is pooled over requests: none may leave the DSL out)")
        if self.device == "cuda" and self.report.dsl_share is not None and self.report.dsl_share < 0.5:
            unused = (f"; {idle_us:.0f} us more ran in {self.dsl} launches the outputs do not depend on, which "
                      "do not count" if idle_us > 0 else "")
            self.end("rule_violation", "dsl_share",
                     f"{self.dsl} kernels are {100 * self.report.dsl_share:.0f} % of the call's GPU time "
                     f"(mean over {self.report.gpu_only_draws} profiled draws{unused}); the rule is at least 50 %: "
                     "move the heavy work into the DSL")

    def blind_names(self) -> set[str]:
        """DSL symbols whose launches changed none of their tensor arguments in the audit calls (not DSL work).

        Whatever such a launch wrote, it reached by address (an integer turned into a pointer in device code):
        memory the audit, the ablations and the poison fill never see. Session 29's red-teamer handed the eager
        answer to a copy kernel as `data_ptr()` integers, with a burn in the same kernel for the share. A unit with
        one writing launch (an expert with no tokens beside others) is not blind.
        """
        blind_units = [unit for unit, changed in self.unit_wrote.items() if not changed]
        writing = {name for unit, changed in self.unit_wrote.items() if changed for name in unit}
        names = {name for unit in blind_units for name in unit} - writing
        for unit in blind_units:
            if set(unit) <= names:
                self.report.ablations[f"unit {','.join(n[:48] for n in unit)}"] = (
                    "changed none of its tensor arguments in the audit calls: its time is not counted as "
                    f"{self.dsl} work (memory a kernel reaches by address is out of the grader's sight)")
        return names

    def unit_ablation(self, units: list[tuple[str, ...]], kernels: list[tuple[str, float]],
                      classes: dict[str, str]) -> set[str]:
        """The DSL symbols whose launches the outputs do not depend on (their time is not DSL work).

        Only where a call launches two or more compiled units (one unit is the whole-call ablation, already
        passed). Each unit alone gets its tensor arguments randomised before it runs (or, with none to randomise,
        is suppressed); outputs that stay correct mean its values were not needed: e.g. a kernel that burns time
        on scratch memory so that the DSL's share of the GPU time looks larger. A crash or an error shows nothing
        (a file can fail on purpose when it sees its unit ablated), so the other mode is tried; a unit that fails both
        ways still counts (the comment there says why).
        """
        dsl_time: dict[str, float] = {}
        for name, us in kernels:
            if classes.get(name) == "dsl":
                dsl_time[name] = dsl_time.get(name, 0.0) + us
        units = sorted({u for u in units if u and any(dsl_time.get(n) for n in u)},
                       key=lambda u: -sum(dsl_time.get(n, 0.0) for n in u))
        if len(units) < 2:
            return set()
        idle: set[str] = set()
        required: set[str] = set()
        for unit in units:
            label = f"unit {','.join(n[:48] for n in unit)}"
            verdict = "required"  # unless a mode shows the outputs right without its values
            for mode in ("randomize", "suppress"):
                outcome = self._ablated(mode, label, only=list(unit))
                if outcome in ("failed", "not_randomized"):
                    continue  # no tensor argument: whether it is needed at all is the suppression's question
                if outcome == "correct":
                    verdict = "idle"
                    self.report.ablations[label] = (f"outputs still correct with it {_PAST[mode]}: its time is not "
                                                    f"counted as {self.dsl} work")
                else:
                    self.report.ablations[label] = f"outputs wrong with it {_PAST[mode]}: its values are required"
                break
            else:
                # Honest pipelines fail both ways: a unit's garbled or shifted integers (a tile schedule, an
                # expert's offsets) send the next units out of bounds (gold 45, 50 and 51 on an H100 in session 33,
                # refused as dsl_token and dsl_share when this read "idle"). So it counts, as before session 33; a
                # burn that fails on purpose when ablated is docs/integrity.md hole 4's, bounded by the share rule.
                self.report.ablations[label] = (f"{self.report.ablations.get(label, 'nothing to randomise')}; "
                                                "failed both ways: counted as required")
            (idle if verdict == "idle" else required).update(unit)
        return idle - required

    def baselines(self) -> None:
        if not self.o.baselines:
            return
        started = time.perf_counter()
        ahead, self.eager_ahead = self.eager_ahead, None
        self.report.eager = eager_timing(self.problem, self.device, self.scale, kind="eager", options=self.o,
                                         ahead=ahead)
        if self.o.compile_baseline:
            self.report.compiled = eager_timing(self.problem, self.device, self.scale, kind="compile",
                                                options=self.o)
        self.report.phases_s["baselines"] = time.perf_counter() - started

    def check_timed_units(self) -> None:
        """Timed calls may launch only DSL functions that checked or profiled calls launched too.

        A function seen only in timed rows is code that ran where nothing compares or attributes it (the DSL share,
        the unit ablation and the audit see the other phases): a kernel that told timed calls apart. Compared by
        DSL function (`kernels.function_of`), so a new shape specialisation is not new code. A function in fewer
        than TIMED_ONLY_SHARE of the timed rows is only flagged: an honest branch that few draws take (a long
        sequence, an empty expert) can miss the 8 checked and 24-48 profiled draws, while a fast path that pays
        must run in most timed rows. A different specialisation of a checked function is not caught here.
        """
        checked = {kernel_names.function_of(n) for unit in self.units_checked for n in unit}
        extra = {f: rows for f, rows in self.timed_functions.items() if f not in checked}
        if not extra:
            return
        worst = max(extra, key=lambda f: extra[f])
        share = extra[worst] / max(self.timed_rows, 1)
        text = (f"timed calls launched {self.dsl} code that no checked or profiled call launched ({worst[:60]}, in "
                f"{extra[worst]} of {self.timed_rows} timed rows)")
        if share >= TIMED_ONLY_SHARE:
            self.end("rule_violation", "timed_units", f"{text}: every request must run the same kernels")
        self.report.integrity.append(text)

    def finish(self) -> None:
        self.check_timed_units()
        r = self.report
        if r.timing and r.gpu_only_us and r.timing.median_us < E2E_OVER_GPU_MIN * r.gpu_only_us:
            self.end("rule_violation", "implausible_time",
                     f"end-to-end median {r.timing.median_us:.1f} us is below the GPU kernel time "
                     f"{r.gpu_only_us:.1f} us the profiler measured")
        if self.device == "cuda" and (r.timing or r.gpu_only_us):
            inputs = self.draw()
            counts = self.problem.roofline(inputs)
            nbytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
            bound = H200.min_seconds(counts["flops"], counts["bytes"]) * 1e6
            if r.timing:
                r.roofline_fraction = bound / r.timing.median_us
            margin = ROOFLINE_MARGIN_L2 if nbytes <= L2_BYTES else ROOFLINE_MARGIN
            if r.gpu_only_us and r.gpu_only_us < margin * bound:
                self.end("rule_violation", "implausible_time",
                         f"GPU time {r.gpu_only_us:.2f} us is below {margin:g} x the H200's roofline bound "
                         f"{bound:.2f} us: no kernel can do this work that fast")
        if self.device == "cuda":
            from metakernel.floors import floors_for

            floors = floors_for(torch.cuda.get_device_name())
            r.launch_floor_us = {k: v for k, v in floors.items() if k.split(" ")[0] in (self.dsl, "eager")} or None
        if r.timing and r.eager:
            r.speedup = r.eager.median_us / r.timing.median_us
        if r.eager and r.eager.gpu_only_us and r.gpu_only_us:
            r.speedup_gpu = r.eager.gpu_only_us / r.gpu_only_us
        if r.timing and r.compiled:
            r.speedup_vs_compile = r.compiled.median_us / r.timing.median_us
        r.status, r.reason = "passed", "" if self.o.timed else "untimed"
        r.message = "correct on every checked draw; DSL launches required; " + (
            "timed" if self.o.timed else "not timed (a correctness-first development run)")


class _Crashed(Exception):
    pass


_PAST = {"suppress": "suppressed", "randomize": "randomised"}


def candidate_worker(problem: Problem, dsl: str, kernel: Path | None, device: str, options: GradeOptions,
                     dry_run: bool = False) -> Worker:
    """A (not yet started) child for grading `kernel` in `dsl`, its arenas sized for `problem`.

    `kernel=None`: a child that stops before the audit hook and the import until it is handed one (`WarmWorker`).
    """
    from metakernel.dsl import get_adapter
    from metakernel.grader import timing

    scale = options.scale or ("full" if device == "cuda" else "small")
    sizes = exchange_sizes(problem, device, scale, timing.ROW)
    return Worker(kind="candidate", path=kernel, device=device, dsl=dsl, dry_run=dry_run,
                  env=get_adapter(dsl).environment(dry_run=dry_run), start_timeout=options.start_timeout_s,
                  in_bytes=sizes.in_bytes, out_bytes=sizes.out_bytes, slots=sizes.slots,
                  require_isolation=options.require_isolation)


class PendingWorker(StartingWorker):
    """A candidate's child started in a background thread: its imports (4-8 s with the DSL) overlap other grading.

    DESIGN 8: grading children are spawned ahead of need and used once.
    """

    def __init__(self, problem: Problem, dsl: str, kernel: Path, device: str, options: GradeOptions) -> None:
        super().__init__(candidate_worker(problem, dsl, kernel, device, options))


class WarmWorker(StartingWorker):
    """A candidate's child started before its kernel exists: sandbox, arenas and DSL ready, the import left.

    DESIGN 8's pool: while the agent writes its next file, `LocalExecutor` keeps one such child per variant, so a
    grading waits only for the kernel's own import (the DSL's import and warm-up took a median 2.8 s of each gold
    grading on the H200, session 23). `grade` hands it the file (`bind`); a child of another variant or other
    options is discarded, never reused.
    """

    def __init__(self, problem: Problem, dsl: str, device: str, options: GradeOptions) -> None:
        self.key = (problem.content_hash, dsl, device, options)
        self.kernel: Path | None = None
        super().__init__(candidate_worker(problem, dsl, None, device, options))

    def fits(self, problem: Problem, dsl: str, device: str, options: GradeOptions) -> bool:
        """Started for this variant, device and options."""
        return self.key == (problem.content_hash, dsl, device, options)

    def bind(self, kernel: Path) -> None:
        """The kernel this child will import when `result` is asked for."""
        self.kernel = kernel

    def result(self) -> tuple[Worker, dict[str, Any]]:
        """Wait for the warm start, then hand the child its kernel and wait for the import."""
        worker, _ = super().result()
        assert self.kernel is not None, "bind() the kernel first"
        return worker, worker.load(self.kernel)


def structure_mismatch_safe(candidate: Any, expected: Any) -> str | None:
    """`structure_mismatch`, with unsupported candidate types reported instead of raised."""
    try:
        return structure_mismatch(candidate, expected)
    except TypeError as exc:
        return str(exc)


def grade(problem: Problem, dsl: str, kernel: Path, device: str = "cuda", options: GradeOptions | None = None,
          prestarted: PendingWorker | WarmWorker | None = None, share: GpuShare | None = None) -> GradeReport:
    """Grade one kernel file; never raises for anything the candidate does.

    `prestarted` is a child already importing this kernel (`PendingWorker`) or a warm one waiting for a kernel of this
    variant (`WarmWorker`); it is used or discarded.
    `share` lets gradings run side by side on one GPU (`sharing.GpuShare`): this one's timed phases then wait until
    it has the card alone, and `phases_s["share_wait"]` says how long it waited for either kind of phase.
    """
    options = options or GradeOptions()
    if isinstance(prestarted, WarmWorker):
        if prestarted.fits(problem, dsl, device, options):
            prestarted.bind(kernel)
        else:
            prestarted.discard()
            prestarted = None
    ev = Evaluation(problem, dsl, kernel, device, options)
    ev.report.options = dict(options.__dict__)
    together = share is not None
    share = share or Alone()
    started = time.perf_counter()
    try:
        mark = time.perf_counter()
        with share.untimed():
            if together:
                ev.report.phases_s["share_wait"] = time.perf_counter() - mark
            mark = time.perf_counter()
            ev.static()
            ev.report.phases_s["static"] = time.perf_counter() - mark  # the wait above is share_wait's, not this
            mark = time.perf_counter()
            ev.start(prestarted)
            ev.report.phases_s["start_wait"] = time.perf_counter() - mark  # 0 when a child started ahead was ready
            prestarted = None
            ev.start_baseline_ahead()
            ev.correctness()
            ev.ablation()
            mark = time.perf_counter()
            ev.audits()
            ev.report.phases_s["audit"] = time.perf_counter() - mark
            ev.isolation()
            if ev.eager_ahead is not None:
                ev.eager_ahead.wait()  # no process start beside a timed phase (its own or another grading's)
        mark = time.perf_counter()
        with share.timed():
            if together:
                ev.report.phases_s["share_wait"] += time.perf_counter() - mark
            if options.timed:
                ev.timing()
            if options.profile:
                ev.profile()
            if options.timed:
                ev.baselines()
            ev.finish()
    except _Done:
        pass
    except WorkerFailure as exc:
        ev.report.status, ev.report.reason, ev.report.message = exc.status, exc.reason or "worker", exc.text
    except Exception as exc:  # noqa: BLE001 - a bug of ours: infra_error (never charged), not a crashed experiment
        hog = ev.kernel_held_the_card(exc)
        if hog is not None:
            ev.report.status, ev.report.reason, ev.report.message = "runtime_error", "memory", hog
        else:
            ev.report.status, ev.report.reason = "infra_error", "harness"
            ev.report.message = "the grader failed (not the kernel's fault):\n" + "".join(
                traceback.format_exception(exc, limit=-4)).rstrip()
    finally:
        if prestarted is not None:
            prestarted.discard()
        if ev.eager_ahead is not None:  # the grading ended before its baseline: stop that child once it is up,
            # without making this report wait for it (a process exit still waits: the thread is not a daemon)
            threading.Thread(target=ev.eager_ahead.discard).start()
        if ev.worker is not None:
            if not ev.report.isolation:
                ev.report.isolation = ev.worker.isolation
            mark = time.perf_counter()
            ev.worker.close()
            ev.report.phases_s["close"] = time.perf_counter() - mark
        ev.report.phases_s["total"] = time.perf_counter() - started
        ev.report.provenance = provenance()
    return ev.report


def dry_run(problem: Problem, dsl: str, kernel: Path, timeout_s: float = 300.0) -> GradeReport:
    """The free `check`: static rules, import, then `solve` at the full-scale shapes with DSL launches intercepted.

    The small-scale call on real CPU tensors runs only where the shape-only trace could not cover everything
    (code that reads values, a reference that needs values for the structure check): compiling both specialisations
    added nothing the GPU runs and doubled the check's time (problem 37's CuTe kernel: 62 s on the 2-core CI
    machine, 29 of them the small one).

    Runs in the same sandbox as grading. Launches are intercepted after compilation, so this catches import, trace
    and compile errors; it proves nothing about the values (only the GPU does).
    """
    options = GradeOptions(scale="small", call_timeout_s=timeout_s, start_timeout_s=timeout_s)
    ev = Evaluation(problem, dsl, kernel, "cpu", options)
    try:
        ev.static()
        ev.worker = candidate_worker(problem, dsl, kernel, "cpu", options, dry_run=True)
        try:
            ev.worker.start()
        except WorkerFailure as exc:
            if exc.status in ("infra_error", "rule_violation"):
                ev.end(exc.status, exc.reason or "import", exc.text)
            ev.end(exc.status, "import", f"importing {kernel.name} failed:\n{exc.text}")
        ev.report.isolation = ev.worker.isolation
        full, covered = ev.full_scale_trace()
        done = [full]
        if not covered:  # the small-scale call on real CPU tensors checks what the trace could not
            inputs = ev.draw()
            expected_structure = compute_expected(problem, inputs).returned
            reply, _, out = ev.call(inputs, mode="intercept")
            ev.report.resources = ev.report.resources or reply.get("resources") or []
            if not reply.get("launches"):
                ev.end("rule_violation", "no_dsl_launch", f"solve launched no {dsl} kernel")
            mismatch = structure_mismatch_safe(out, expected_structure)
            if mismatch is not None:
                ev.end("wrong", "structure", f"wrong output structure: {mismatch}")
            ev.report.launches_per_call = ev.report.launches_per_call or reply["launches"]
            done.append(f"small scale: {reply['launches']} launch(es) intercepted, output structure right")
        ev.report.status, ev.report.reason = "passed", "dry_run"
        ev.report.message = (f"dry run ok: imports, compiles; {'; '.join(done)} (values not checked: only the GPU "
                             "proves them)")
    except _Done:
        pass
    finally:
        if ev.worker is not None:
            ev.worker.close()
    return ev.report


__all__ = ["GradeOptions", "dry_run", "flatten", "grade"]
