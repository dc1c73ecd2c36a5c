"""Which host-speed gate makes two gradings of the same kernel agree? Replayed over recorded draws.

Reads bench_grader reports made with --keep-draws (every timed draw's event time and host probes), and for each
probe (Python loop: the slower of before/after, before only; tiny torch calls) and gate width recomputes each
grading's median as that gate would have counted it (grader/timing.replay_gate), then the relative difference
between the two gradings of each kernel. One device run thus answers for every variant.

Two refinements a better gate could use are replayed too: `--windows` judges a draw by the rolling median of the
probe over that many neighbouring draws (a speed state lasts seconds, one probe is noisy), and `--shared-ref`
gives both gradings the lower of their two fast levels, as a known per-host reference level would.

    python3 scripts/gate_variants.py validation/h200-grader-bench-keep.json [--windows 1,9,25] [--shared-ref]
        [--out validation/gate-variants.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from metakernel.grader.timing import fast_level, replay_gate

PROBES = ("probe", "probe_before", "probe_torch")
GATES = (0.0, 0.05, 0.10, 0.15, 0.25)
TOLERANCE = 0.02


def rolling_median(values: list[float], window: int) -> list[float]:
    """Each value replaced by the median of the `window` values centred on it (fewer at the ends)."""
    half = window // 2
    return [statistics.median(values[max(0, i - half):i + half + 1]) for i in range(len(values))]


def _first_seconds(run: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """A grading's recorded draws cut to those of its first `wait_s` seconds of sampling (0: all of them).

    The draws of one timing phase come at a steady pace, so the first n * wait / timing_s of them are what a gate
    that stopped waiting after `wait_s` would have had.
    """
    per_draw = run["per_draw"]
    if wait_s <= 0 or not run.get("timing_s"):
        return per_draw
    keep = max(1, round(len(per_draw["event_us"]) * min(1.0, wait_s / run["timing_s"])))
    return {k: v[:keep] for k, v in per_draw.items()}


def variants(solutions: dict[str, Any], probes: tuple[str, ...] = PROBES, gates: tuple[float, ...] = GATES,
             windows: tuple[int, ...] = (1,), shared_ref: bool = False,
             waits: tuple[float, ...] = (0.0,)) -> list[dict[str, Any]]:
    """Per (probe, window, gate, wait): per-kernel relative differences and their summary, over kernels with
    recorded draws in both gradings."""
    rows = []
    for probe, window, wait in ((p, w, t) for p in probes for w in windows for t in waits):
        prepared = {}  # per kernel: both gradings with the probe rolled, and the shared reference level
        for key, sol in solutions.items():
            runs = [_first_seconds(r, wait) if r.get("per_draw") else None for r in sol.get("runs", [])]
            if len(runs) != 2 or not all(r and r.get(f"{probe}_us") for r in runs):
                continue
            rolled = [{"event_us": r["event_us"],
                       f"{probe}_us": rolling_median([float(x or 0.0) for x in r[f"{probe}_us"]], window)}
                      for r in runs]
            prepared[key] = (rolled, min(fast_level(r[f"{probe}_us"]) for r in rolled) if shared_ref else None)
        for gate in gates:
            diffs, counted = {}, []
            for key, (rolled, ref) in prepared.items():
                (m1, n1), (m2, n2) = (replay_gate(r, probe, gate, ref) for r in rolled)
                diffs[key] = abs(m1 - m2) / m1
                counted += [n1, n2]
            if diffs:
                values = sorted(diffs.values())
                rows.append({"probe": probe, "window": window, "shared_ref": shared_ref, "gate": gate,
                             "wait_s": wait or None,
                             "kernels": len(values), "within_2pct": sum(v <= TOLERANCE for v in values),
                             "median_diff": statistics.median(values), "worst_diff": values[-1],
                             "median_counted": statistics.median(counted), "diffs": diffs})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--windows", default="1", help="rolling-median windows of the probe, comma separated")
    parser.add_argument("--shared-ref", action="store_true", help="both gradings gate on the lower fast level")
    parser.add_argument("--waits", default="0", help="seconds of sampling kept, comma separated (0: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    windows = tuple(int(w) for w in args.windows.split(","))
    solutions: dict[str, Any] = {}
    for path in args.reports:
        solutions.update(json.loads(path.read_text())["solutions"])
    waits = tuple(float(w) for w in args.waits.split(","))
    rows = variants(solutions, windows=windows, shared_ref=args.shared_ref, waits=waits)
    if not rows:
        print("no kernel has recorded draws in both gradings (bench_grader.py --keep-draws)")
        return 1
    print("| probe | window | gate | wait | kernels | within 2 % | median diff | worst | median counted draws |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        wait = f"{r['wait_s']:g} s" if r["wait_s"] else "all"
        print(f"| {r['probe']} | {r['window']} | {r['gate']:.2f} | {wait} | {r['kernels']} | {r['within_2pct']} | "
              f"{r['median_diff'] * 100:.1f} % | {r['worst_diff'] * 100:.1f} % | {r['median_counted']:.0f} |")
    if args.out:
        args.out.write_text(json.dumps({"sources": [str(p) for p in args.reports], "windows": windows,
                                         "waits": waits, "shared_ref": args.shared_ref, "variants": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
