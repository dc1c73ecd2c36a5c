"""The timing procedure shared by candidates and baselines (docs/design.md 4.5).

Warm-up calls, then per timed draw: fresh inputs → device sync → start event → solve → full device synchronize →
end event (the child does the bracket with timers captured before the candidate was imported). The median is over
at least `min_timed` draws; sampling stops once the median's standard error is under `rse_target` of it, or at
`max_timed` draws, or when `timing_cap_s` has passed. The parent also measures the wall time of every call, so
reported times that cannot fit in it are flagged.
"""

from __future__ import annotations

import math
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from metakernel.grader.report import Timing
from metakernel.problem import Problem

#: The input arena holds one request's row of draws: fewer draws per row for very large problems.
ARENA_BYTES = 8 << 30


def seeded_draw(problem: Problem, device: str, scale: str) -> tuple[int, list[Any]]:
    """One draw of inputs from an unpredictable seed (made in the parent; the candidate never sees it), and the seed.

    The report keeps the seed of a failing draw, so a `wrong` can be reproduced after grading.
    """
    seed = secrets.randbits(62)
    with _DRAWING:  # torch's generators are the process's: gradings side by side must not interleave a draw
        torch.manual_seed(seed)
        return seed, problem.make_inputs(device=device, scale=scale)


_DRAWING = threading.Lock()


def fresh_draw(problem: Problem, device: str, scale: str) -> list[Any]:
    """One draw of inputs from an unpredictable seed."""
    return seeded_draw(problem, device, scale)[1]


#: Draws per request in the correctness, timing and profile phases (`row_size` caps it for very large problems).
#: Every request of those phases has this shape, so a `solve` cannot tell a timed call from a checked or profiled
#: one by how many draws its request holds (docs/integrity.md hole 10). The draws of a row are placed together,
#: every one after the first masked until its own call (`Worker.place`), and called back to back: a call made
#: after the child waited for the parent finds the host cold (docs/timing.md), so a timing sample is a row's mean.
#: With 4, the 24 profiled draws give 6 request means (the spread estimate 5 degrees of freedom): two requests of
#: 6 draws let one grading of problem 01 (TIRx) stop at an estimate of 0.24 % where 48 draws measure 0.66 %
#: (validation/h200-grader-bench-gpuonly2.json).
ROW = 4


def row_size(slots: int) -> int:
    """Draws per request: ROW, or fewer where the arenas hold fewer draws (very large problems)."""
    return max(1, min(ROW, slots))


def profile_kernels(send: Callable[[int], dict[str, Any]], options: Any, row: int = ROW) -> dict[str, Any]:
    """Profile fresh draws in requests of `row` draws until the mean GPU time per call is known to `profile_rse`.

    A kernel whose work depends on the draw (paged attention over random page lengths: the longest request sets
    the time) moved 2-3.4 % between two gradings when its GPU-only time was the mean of 6 draws, 0.1-0.4 % (CuTe)
    with 48; a fixed-work kernel's requests agree to 0.02 %. So the count adapts (GradeOptions): at least
    `profile_draws`, then more until the standard error of the request means is under `profile_rse` of their mean,
    at most `profile_max_draws`. `send(count)` makes one profile request of `count` fresh draws (the caller places
    them, checks their outputs and raises on a failed reply) and returns the child's reply. Returns the reply shape
    with kernels merged by name (µs per call), the launched DSL units merged, `repeats` = calls profiled and `rse`
    of the GPU-time mean (None from a single request).
    """
    per_name: dict[str, float] = {}
    names: set[str] = set()
    units: set[tuple[str, ...]] = set()
    chunk_us: list[tuple[int, float]] = []
    calls = 0
    rse = float("inf")
    while calls < options.profile_max_draws:
        reply = send(min(row, options.profile_max_draws - calls))
        n = int(reply.get("repeats") or 1)
        for name, us in reply.get("kernels", []):
            per_name[name] = per_name.get(name, 0.0) + float(us) * n
        names.update(reply.get("kernel_names", []))
        units.update(tuple(u) for u in reply.get("units", []))
        chunk_us.append((n, sum(float(us) for _, us in reply.get("kernels", []))))
        calls += n
        rse = _chunk_rse(chunk_us)
        if calls >= options.profile_draws and rse <= options.profile_rse:
            break
    return {"ok": True, "kernels": [(name, total / calls) for name, total in per_name.items()],
            "kernel_names": sorted(names), "units": sorted(units), "repeats": calls,
            "rse": rse if math.isfinite(rse) else None}


def _chunk_rse(chunks: list[tuple[int, float]]) -> float:
    """Standard error of the call-weighted mean of per-request mean times, over that mean (inf with one request)."""
    if len(chunks) < 2:
        return float("inf")
    total = sum(n for n, _ in chunks)
    mean = sum(n * us for n, us in chunks) / total
    if mean <= 0:
        return 0.0
    per_draw_var = sum(n * (us - mean) ** 2 for n, us in chunks) / (len(chunks) - 1)  # a request mean: var / n
    return (per_draw_var / total) ** 0.5 / mean


#: What `measure(keep_draws=True)` records per draw (in µs, as `<key>_us`); the child's reply carries `<key>_s`.
PER_DRAW = ("event", "probe", "probe_before", "probe_after", "first")


def replay_gate(per_draw: dict[str, list[float | None]], probe: str, gate: float,
                fast_ref_us: float | None = None) -> tuple[float, int]:
    """The median (µs) and number of the draws that `gate` on probe `probe` would have counted.

    Replays a gate over recorded draws, so one set of gradings answers for every gate variant
    (scripts/gate_variants.py). With no draw at full speed every draw counts, as in `timing_stats`.
    """
    events = [float(x or 0.0) for x in per_draw["event_us"]]
    _, kept = _counted(per_draw.get(f"{probe}_us") or [], gate, len(events), fast_ref_us)
    return statistics.median(events[i] for i in kept), len(kept)


def _counted(probes: list[float | None] | None, gate: float, n: int,
             fast_ref: float | None) -> tuple[list[int], list[int]]:
    """The draws at full host speed, and the draws the statistics use: those, or every draw when there are none."""
    fast = kept_indices(probes, gate, n, fast_ref)
    return fast, fast or list(range(n))


def timing_stats(samples: list[float], host: list[float], wall: float, flush: bool,
                 probes: list[float | None] | None = None, gate: float = 0.0,
                 fast_ref_s: float | None = None) -> Timing:
    """Median-centred statistics of per-call seconds (rse: `median_rse`, the median's standard error over it).

    With `gate` > 0 the statistics describe only the draws `kept_indices` keeps (taken at full host speed); the
    median over every draw and the probe's levels are reported beside them either way.
    """
    fast, kept = _counted(probes, gate, len(samples), fast_ref_s)  # no draw at full speed: measure flags it
    us = [samples[i] * 1e6 for i in kept]
    med = statistics.median(us)
    sd = statistics.stdev(us) if len(us) > 1 else 0.0
    rse = median_rse(us, med)
    known = _valid_probes(probes)
    return Timing(median_us=med, mean_us=statistics.fmean(us), stdev_us=sd, min_us=min(us), n=len(us), rse=rse,
                  host_median_us=statistics.median(host[i] * 1e6 for i in kept), wall_s=wall, l2_flush=flush,
                  draws=len(samples), kept_share=len(fast) / len(samples),
                  all_median_us=statistics.median(x * 1e6 for x in samples),
                  probe_fast_us=fast_level(known, fast_ref_s) * 1e6 if known else None,
                  probe_median_us=statistics.median(known) * 1e6 if known else None, host_gate=gate)


def median_rse(us: list[float], med: float) -> float:
    """The median's standard error over the median, from the median absolute deviation.

    Call times have a heavy right tail (a preempted host, a late interrupt): the normal-theory estimate from the
    standard deviation (1.2533 sd / sqrt n) let a handful of outliers hold the estimate over the 0.5 % target, so
    on the H200 18 of 25 gold gradings sampled the full 8 s gate wait although their medians had settled (one
    grading of problem 01: sd 26.8 us, estimate 0.73 % at 81 draws). The MAD scaled to a standard deviation
    (x 1.4826) describes the body of the distribution, which is what the median's error depends on.
    """
    if len(us) < 2 or med <= 0:
        return 0.0
    mad = statistics.median(abs(x - med) for x in us)
    return 1.2533 * 1.4826 * mad / len(us) ** 0.5 / med


def fast_level(probes: list[float], fast_ref_s: float | None = None) -> float:
    """The host's fast level: the 10th percentile of the probes (the minimum is one lucky draw).

    A reference level measured beforehand wins when lower: a grading that spent its whole timing phase in the slow
    state would otherwise take the slow level for the fast one.
    """
    ordered = sorted(probes)
    level = ordered[(len(ordered) - 1) // 10]
    return min(level, fast_ref_s) if fast_ref_s else level


def _valid_probes(probes: list[float | None] | None) -> list[float]:
    return [p for p in probes or [] if p is not None and p > 0]


def kept_indices(probes: list[float | None] | None, gate: float, n: int,
                 fast_ref_s: float | None = None) -> list[int]:
    """Draws taken at full host speed: probe ≤ (1 + gate) x the fast level (every draw if off or a probe is missing)."""
    known = _valid_probes(probes)
    if gate <= 0 or len(known) != n:
        return list(range(n))
    limit = fast_level(known, fast_ref_s) * (1.0 + gate)
    return [i for i, p in enumerate(known) if p <= limit]


def host_fast_level_us(seconds: float, gap_s: float = 0.002) -> float:
    """The host's fast probe level (µs): the 10th percentile of the child's probe taken every `gap_s` for `seconds`.

    Measured once before a series of gradings (scripts/bench_grader.py --host-fast-us auto) so that the gate knows
    the fast level even in a grading that never meets it. The probe is the very function the child runs.
    """
    from metakernel.grader.child import host_probe

    probes = []
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        probes.append(host_probe())
        time.sleep(gap_s)
    return fast_level(probes) * 1e6


def bracket_settings(options: Any) -> dict[str, Any]:
    """What the child's bracket takes from a GradeOptions (every call of candidates and baselines alike)."""
    return {"flush_l2": options.flush_l2}


def knobs(options: Any) -> dict[str, Any]:
    """`measure`'s keyword arguments from a GradeOptions (candidates and baselines are timed alike)."""
    ref = options.host_fast_us
    return {"warmup": options.warmup, "min_timed": options.min_timed, "max_timed": options.max_timed,
            "rse_target": options.rse_target, "cap_s": options.timing_cap_s, "flush": options.flush_l2,
            "gate": options.host_gate, "min_span_s": options.min_timing_s, "gate_wait_s": options.host_gate_wait_s,
            "fast_ref_s": ref * 1e-6 if ref else None, "keep_draws": options.keep_draws}


def measure(call: Callable[[int], dict[str, Any]], *, warmup: int, min_timed: int, max_timed: int,
            rse_target: float, cap_s: float, flush: bool, gate: float = 0.0,
            min_span_s: float = 0.0, gate_wait_s: float = 2.0, fast_ref_s: float | None = None,
            keep_draws: bool = False) -> tuple[Timing, list[str]]:
    """Run `call(i)` (i < 0 for warm-up) until the stopping rule; returns the statistics and integrity flags.

    `call` prepares fresh inputs, makes one timed request and returns the child's reply (`event_s`, `host_s`, and
    `probe_s`: the child's host-speed probe, the slower of just before and just after the bracket) plus `wall_s`,
    the parent's wall time around the request alone. Stops once at least `min_timed` counted draws have a standard
    error under `rse_target` and `min_span_s` has passed, or at `max_timed` counted draws, or after `cap_s`.

    The host-speed gate (`gate` > 0, GradeOptions' default 0.15): the VMs measured switch between a fast and a
    ~1.7-2x slower CPU state (validation/cpu-host-speed.json, h200-host-speed.json), and a grading that sat in the
    slow state reported a host-bound median up to 13 % higher (H200) than another grading of the same kernel. With
    the gate only draws whose probes (before and after the bracket) are within `gate` of the host's fast level
    count; `min_span_s` makes sampling last long enough to meet the fast state, `max_timed` bounds the counted
    draws, and after `gate_wait_s` (once `min_timed` draws are taken) sampling stops with what it has. On the H200
    this cut the end-to-end difference between two gradings of a gold kernel from a median of 7.9 % (2 of 11 within
    2 %) to 1.4 % (8 of 15) (validation/h200-grader-bench-speedups.json, -gate-before.json, -gate2.json).
    Waiting 2 s instead of 8 loses nothing measurable: replayed over the recorded draws of two gradings of 11 gold
    kernels, the gate's A/A difference reads a median 1.5-4.0 % when each grading is cut to its first 2 s, 2.4-3.5 %
    at 4 s and 3.1-3.8 % over the whole 8 s (three probe variants; `scripts/gate_variants.py --waits`,
    validation/gate-waits.json), while every gold grading and every eager baseline spent the whole wait (the
    timing phase was 4.0 s in the median gold grading at 4 s, docs/timing.md).
    `fast_ref_s` is the host's fast level measured beforehand (scripts/bench_grader.py --host-fast-us auto), for
    gradings that never meet the fast state themselves.
    """
    for i in range(warmup):
        call(-1 - i)
    samples: list[float] = []
    host: list[float] = []
    walls: list[float] = []
    probes: list[float | None] = []
    repeats: list[int] = []  # timed calls per sample (a row's calls after its first; the sample is their mean)
    firsts: list[float] = []  # each row's first call: warms the host, reported but not scored (child.Child.row)
    replies: list[dict[str, Any]] = []
    started = time.perf_counter()
    while True:
        reply = call(len(samples))
        samples.append(reply["event_s"])
        host.append(reply["host_s"])
        walls.append(reply["wall_s"])
        probes.append(reply.get("probe_s"))
        repeats.append(int(reply.get("repeats") or 1))
        if reply.get("first_s") is not None and repeats[-1] < len(reply.get("host_each_s") or []):
            firsts.append(float(reply["first_s"]))
        if keep_draws:
            replies.append(reply)
        elapsed = time.perf_counter() - started
        if elapsed > cap_s:
            break
        counted = len(kept_indices(probes, gate, len(samples), fast_ref_s)) if gate > 0 else len(samples)
        if counted >= max_timed:
            break
        if gate > 0 and elapsed > gate_wait_s and len(samples) >= min_timed:
            break  # waited long enough for the fast state: the fast draws so far (flagged below if too few)
        if counted >= min_timed and elapsed >= min_span_s:
            stats = timing_stats(samples, host, 0.0, flush, probes, gate, fast_ref_s)
            if stats.rse < rse_target:
                break
    stats = timing_stats(samples, host, time.perf_counter() - started, flush, probes, gate, fast_ref_s)
    if keep_draws:
        stats.per_draw = {f"{key}_us": [r[f"{key}_s"] * 1e6 if r.get(f"{key}_s") is not None else None
                                        for r in replies] for key in PER_DRAW}
    flags = []
    stats.chunk = max(repeats) if repeats else 1
    stats.first_call_median_us = statistics.median(firsts) * 1e6 if firsts else None
    reported = sum(t * n for t, n in zip(samples, repeats, strict=True))
    if reported > sum(walls) * 1.02 + 1e-3:
        flags.append(f"reported times sum to {reported:.4f} s but the calls took {sum(walls):.4f} s of wall time")
    counted = round((stats.kept_share or 0.0) * len(samples))  # timing_stats' count of draws at full speed
    if counted < min_timed:
        flags.append(f"only {counted} of {len(samples)} draws were taken at full host speed (fewer than "
                     f"{min_timed}): the median may carry host slowdowns")
    return stats, flags
