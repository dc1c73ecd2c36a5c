"""How steady is this host's CPU speed over time? The suspected cause of the grader's between-grading spread.

Times two fixed pieces of host work back to back for a while — a pure-Python loop and a small torch call
(`empty_like` + `add` on CPU tensors, the kind of host work around every kernel launch) — in chunks of ~10 ms, and
reports how their times move: the fastest and slowest levels, the share of chunks more than 30 % slower than the
fastest, and how long a slow or fast stretch lasts. A steady host gives a ratio near 1; a host whose speed
alternates between states (this project's CI VM: ~1.8x, switching about every second) explains why a grading's
host-bound median depends on when it ran.

    python3 scripts/bench_host_speed.py [--seconds 20] [--out validation/cpu-host-speed.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from metakernel.jsonio import write_json_atomic
from metakernel.provenance import provenance

SLOW = 1.3  # a chunk this much slower than the fastest counts as the slow state


def _loop_chunk() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(50_000):
        total += i
    return time.perf_counter() - started


def _torch_chunk(x: torch.Tensor, b: torch.Tensor) -> float:
    started = time.perf_counter()
    for _ in range(1_000):
        y = torch.empty_like(x)
        torch.add(x, b, out=y)
    return time.perf_counter() - started


def _stretch_s(runs: list[int], period_s: float) -> float:
    """Time-weighted mean length of the stretches in `runs` (a chunk sits in a stretch of that many chunks)."""
    return sum(r * r for r in runs) / sum(runs) * period_s if runs else 0.0


def summarise(series: list[float], period_s: float) -> dict[str, float | int]:
    """Levels, slow share and stretch lengths of one series of chunk times (seconds), one chunk per `period_s`."""
    ordered = sorted(series)
    fast = ordered[max(0, len(ordered) // 20 - 1)]  # 5th percentile: the fast level without single outliers
    slow_flags = [t > SLOW * fast for t in series]
    runs: list[int] = []
    for flag in slow_flags:
        if runs and (runs[-1] > 0) == flag:
            runs[-1] += 1 if flag else -1
        else:
            runs.append(1 if flag else -1)
    return {
        "chunks": len(series), "fast_ms": fast * 1e3, "median_ms": statistics.median(series) * 1e3,
        "p95_ms": ordered[int(0.95 * (len(ordered) - 1))] * 1e3,
        "p95_over_fast": ordered[int(0.95 * (len(ordered) - 1))] / fast,
        "slow_share": sum(slow_flags) / len(series), "switches": max(0, len(runs) - 1),
        "slow_stretch_s": _stretch_s([r for r in runs if r > 0], period_s),
        "fast_stretch_s": _stretch_s([-r for r in runs if r < 0], period_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="validation/cpu-host-speed.json")
    args = parser.parse_args()
    x, b = torch.randn(64, 32), torch.randn(32)
    loop: list[float] = []
    calls: list[float] = []
    until = time.perf_counter() + args.seconds
    while time.perf_counter() < until:
        loop.append(_loop_chunk())
        calls.append(_torch_chunk(x, b))
    period = statistics.fmean(loop) + statistics.fmean(calls)
    data = {"provenance": provenance(), "seconds": args.seconds, "slow_threshold": SLOW,
            "python_loop": summarise(loop, period), "torch_calls": summarise(calls, period),
            "series_ms": {"python_loop": [round(t * 1e3, 3) for t in loop],
                          "torch_calls": [round(t * 1e3, 3) for t in calls]}}
    write_json_atomic(Path(args.out), data)
    for name in ("python_loop", "torch_calls"):
        s = data[name]
        print(f"{name}: fast {s['fast_ms']:.2f} ms, median {s['median_ms']:.2f} ms, p95/fast {s['p95_over_fast']:.2f}, "
              f"slow share {s['slow_share']:.0%}, {s['switches']} switches, typical stretch slow "
              f"{s['slow_stretch_s']:.2f} s / fast {s['fast_stretch_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
