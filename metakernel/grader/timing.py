"""The timing procedure shared by candidates and baselines (DESIGN.md 4.5).

Warm-up calls, then per timed draw: fresh inputs → device sync → start event → solve → full device synchronize →
end event (the child does the bracket with timers captured before the candidate was imported). The median is over
at least `min_timed` draws; sampling stops once the median's standard error is under `rse_target` of it, or at
`max_timed` draws, or when `timing_cap_s` has passed. The parent also measures the wall time of every call, so
reported times that cannot fit in it are flagged.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from metakernel.expected import fresh_copies
from metakernel.grader.report import Timing
from metakernel.problem import Problem

#: Inputs of all profiled draws are alive at once: fewer draws for very large problems.
PROFILE_BYTES = 8 << 30


def fresh_draw(problem: Problem, device: str, scale: str) -> list[Any]:
    """One draw of inputs from an unpredictable seed (made in the parent; the candidate never sees the seed)."""
    torch.manual_seed(secrets.randbits(62))
    return problem.make_inputs(device=device, scale=scale)


def profile_draws(problem: Problem, device: str, scale: str, count: int) -> list[list[Any]]:
    """Up to `count` fresh draws for one profiling request, fewer when their inputs would pass PROFILE_BYTES."""
    draws = [fresh_copies(problem, fresh_draw(problem, device, scale))]
    per_draw = sum(x.numel() * x.element_size() for x in draws[0] if isinstance(x, torch.Tensor))
    while len(draws) < count and per_draw * (len(draws) + 1) <= PROFILE_BYTES:
        draws.append(fresh_copies(problem, fresh_draw(problem, device, scale)))
    return draws


def timing_stats(samples: list[float], host: list[float], wall: float, flush: bool) -> Timing:
    """Median-centred statistics of per-call seconds (rse: standard error of the median over the median)."""
    us = [s * 1e6 for s in samples]
    med = statistics.median(us)
    sd = statistics.stdev(us) if len(us) > 1 else 0.0
    rse = (1.2533 * sd / len(us) ** 0.5) / med if med > 0 else 0.0
    return Timing(median_us=med, mean_us=statistics.fmean(us), stdev_us=sd, min_us=min(us), n=len(us), rse=rse,
                  host_median_us=statistics.median(h * 1e6 for h in host), wall_s=wall, l2_flush=flush)


def measure(call: Callable[[int], dict[str, Any]], *, warmup: int, min_timed: int, max_timed: int,
            rse_target: float, cap_s: float, flush: bool) -> tuple[Timing, list[str]]:
    """Run `call(i)` (i < 0 for warm-up) until the stopping rule; returns the statistics and integrity flags.

    `call` prepares fresh inputs, makes one timed request and returns the child's reply (`event_s`, `host_s`) plus
    `wall_s`, the parent's wall time around the request alone.
    """
    for i in range(warmup):
        call(-1 - i)
    samples: list[float] = []
    host: list[float] = []
    walls: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_timed:
        reply = call(len(samples))
        samples.append(reply["event_s"])
        host.append(reply["host_s"])
        walls.append(reply["wall_s"])
        if len(samples) >= min_timed:
            if timing_stats(samples, host, 0.0, flush).rse < rse_target or time.perf_counter() - started > cap_s:
                break
    stats = timing_stats(samples, host, time.perf_counter() - started, flush)
    flags = []
    if sum(samples) > sum(walls) * 1.02 + 1e-3:
        flags.append(f"reported times sum to {sum(samples):.4f} s but the calls took {sum(walls):.4f} s of wall time")
    if stats.median_us > stats.host_median_us * 1.05 + 50:
        flags.append(f"event median {stats.median_us:.1f} us exceeds the host bracket {stats.host_median_us:.1f} us")
    return stats, flags
