"""The grade report: one versioned record per evaluation, plus the short text an agent reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "metakernel.grade/2"
#: The grading protocol (docs/design.md sections 3-4): 2 = sandboxed child, every call checked at random after it
#: returned, dependency ablation, the DSL's kernels at least 50 % of GPU time, foreign kernels refused; 3 = each
#: timing sample the mean of a request's calls made back to back (grader.child.Child.timed); 4 = the correctness,
#: timing and profile phases all send rows of `timing.ROW` draws, every draw after the first masked until its own
#: call (grader.worker.Worker.place), every call of a row required to launch the DSL, timed calls to run only the
#: DSL functions checked calls ran; 5 = a row's first call warms the host and is not timed (the sample is the mean
#: of the later calls), a fifth of the timed and profiled calls compared after the fact, the end-to-end median
#: required to reach 0.95 x the profiled GPU time, no stale draw left in the input arena; 6 = the isolation
#: ablation: the outputs must stay correct when every byte the file's eager code could write, except each DSL
#: launch's own tensor arguments, is noise while that launch runs (docs/integrity.md hole 12).
PROTOCOL = 6
STATUSES = ("passed", "wrong", "compile_error", "runtime_error", "timeout", "rule_violation", "infra_error")


@dataclass
class Timing:
    """End-to-end timing of `solve` (or of the eager reference) over fresh draws."""

    median_us: float
    mean_us: float
    stdev_us: float
    min_us: float
    n: int
    rse: float  # standard error of the median / median
    host_median_us: float  # the child's own perf_counter bracket around the same region
    wall_s: float  # the parent's wall clock over the whole timing phase
    l2_flush: bool = False
    gpu_only_us: float | None = None  # baselines: profiled kernel time per call (candidates keep it on the report)
    # Host speed (timing.measure says why): draws taken, the share counted, the median over every draw, the
    # probe's fast level and median, and the gate used (0 = every draw counted). median_us, n and rse describe the
    # counted draws.
    draws: int | None = None
    kept_share: float | None = None
    all_median_us: float | None = None
    probe_fast_us: float | None = None
    probe_median_us: float | None = None
    host_gate: float = 0.0
    # Timed calls per sample: each sample is the mean of a row's calls after its first, made back to back
    # (child.Child.row), so n samples are n x chunk timed calls
    chunk: int = 1
    # The median of the rows' first calls, which warm the host and are not scored (protocol 5): beside median_us it
    # shows what a call made after the child waited for the parent costs
    first_call_median_us: float | None = None
    # The timing study only (GradeOptions.keep_draws): per timing sample, in order, its time, the probes and the
    # row's untimed first call (keys event_us, probe_us, probe_before_us, probe_after_us, first_us), for
    # timing.replay_gate.
    per_draw: dict[str, list[float | None]] | None = None


@dataclass
class GradeReport:
    """Everything one evaluation found. `status` is one of STATUSES; `reason` a short code for tests/tables."""

    problem: dict[str, Any]
    dsl: str
    kernel_sha256: str
    device: str
    scale: str
    status: str = "infra_error"
    reason: str = ""
    message: str = ""
    mismatch: dict[str, Any] | None = None
    violations: list[str] = field(default_factory=list)
    draws_checked: int = 0
    launches_per_call: float | None = None
    ablation: str | None = None  # the suppressed-launch ablation's finding (also in `ablations`)
    ablations: dict[str, str] = field(default_factory=dict)  # "suppress" / "randomize" -> what was found
    timing: Timing | None = None
    gpu_only_us: float | None = None
    gpu_only_draws: int = 0  # fresh draws profiled for gpu_only_us (timing.profile_kernels: more when work varies)
    gpu_only_rse: float | None = None  # standard error of gpu_only_us over it, from the requests' spread
    dsl_share: float | None = None
    kernels: list[dict[str, Any]] = field(default_factory=list)
    eager: Timing | None = None
    compiled: Timing | None = None
    speedup: float | None = None
    speedup_vs_compile: float | None = None
    # eager GPU kernel time / this kernel's GPU kernel time, host time left out: a kernel's GPU time repeated
    # within 2 % between gradings where its end-to-end median moved up to 16 % (h200-grader-bench-draws.json)
    speedup_gpu: float | None = None
    roofline_fraction: float | None = None
    # the DSL's launch floor on this GPU (metakernel.floors; route -> us, with eager's), when it was measured
    launch_floor_us: dict[str, float] | None = None
    # the free check: per kernel compiled for sm_90a, registers, stack, shared memory, block size, occupancy
    # (metakernel.dsl.resources), at the full-scale shapes where the trace reached them, else the small ones
    resources: list[dict[str, Any]] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    rechecks: int = 0  # timed and profiled draws compared after they returned (chosen at random, >= a fifth)
    seed: int | None = None  # the seed of the draw a `wrong` was found on (timing.seeded_draw reproduces it)
    isolation: dict[str, Any] = field(default_factory=dict)  # sandbox.Isolation in force in the child
    protocol: int = PROTOCOL
    phases_s: dict[str, float] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    @property
    def passed(self) -> bool:
        """True when the kernel is correct and obeys the rules."""
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)

    def agent_text(self) -> str:
        """What the agent sees after a submission: short, actionable, no harness internals."""
        head = f"status: {self.status}" + (f" ({self.reason})" if self.reason else "")
        lines = [head]
        if self.message:
            lines.append(self.message.strip())
        for v in self.violations[:10]:
            lines.append(f"- {v}")
        if self.passed and self.timing:
            lines.append(f"time: {self.timing.median_us:.1f} us median over {self.timing.n} draws "
                         f"(GPU kernels {self.gpu_only_us or 0:.1f} us)")
            if self.eager:
                lines.append(f"eager PyTorch: {self.eager.median_us:.1f} us -> speedup {self.speedup:.3f}x")
            if self.speedup_gpu is not None and self.eager and self.eager.gpu_only_us:
                lines.append(f"GPU kernel time alone: eager {self.eager.gpu_only_us:.1f} us vs "
                             f"{self.gpu_only_us or 0:.1f} us -> {self.speedup_gpu:.3f}x")
            if self.roofline_fraction is not None:
                lines.append(f"roofline: {100 * self.roofline_fraction:.1f} % of the H200 lower bound")
            if self.dsl_share is not None:
                lines.append(f"DSL kernels: {100 * self.dsl_share:.0f} % of GPU time, "
                             f"{self.launches_per_call or 0:g} launch(es) per call")
            if self.launch_floor_us:
                routes = ", ".join(f"{route} {us:.1f} us" for route, us in self.launch_floor_us.items())
                lines.append(f"launch floor on this GPU (a trivial kernel, same bracket): {routes}")
        if self.resources:
            from metakernel.dsl.resources import table

            lines.append(table(self.resources[:12]))
            if len(self.resources) > 12:
                lines.append(f"  ... and {len(self.resources) - 12} more kernels")
        for flag in self.integrity:
            lines.append(f"timing flag: {flag}")
        if self.isolation and self.isolation.get("mode") == "none":
            lines.append("isolation: none (the grader ran without a sandbox)")
        return "\n".join(lines)
