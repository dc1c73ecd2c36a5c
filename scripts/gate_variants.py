"""Which host-speed gate makes two gradings of the same kernel agree? Replayed over recorded draws.

Reads bench_grader reports made with --keep-draws (every timed draw's event time and host probes), and for each
probe (Python loop: the slower of before/after, before only; tiny torch calls) and gate width recomputes each
grading's median as that gate would have counted it (grader/timing.replay_gate), then the relative difference
between the two gradings of each kernel. One device run thus answers for every variant.

    python3 scripts/gate_variants.py validation/h200-grader-bench-keep.json [--out validation/gate-variants.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from metakernel.grader.timing import replay_gate

PROBES = ("probe", "probe_before", "probe_torch")
GATES = (0.0, 0.05, 0.10, 0.15, 0.25)
TOLERANCE = 0.02


def variants(solutions: dict[str, Any], probes: tuple[str, ...] = PROBES,
             gates: tuple[float, ...] = GATES) -> list[dict[str, Any]]:
    """Per (probe, gate): per-kernel relative differences and their summary, over kernels with recorded draws."""
    rows = []
    for probe in probes:
        for gate in gates:
            diffs, counted = {}, []
            for key, sol in solutions.items():
                runs = [r.get("per_draw") for r in sol.get("runs", [])]
                if len(runs) != 2 or not all(r and r.get(f"{probe}_us") for r in runs):
                    continue
                (m1, n1), (m2, n2) = (replay_gate(r, probe, gate) for r in runs)
                diffs[key] = abs(m1 - m2) / m1
                counted += [n1, n2]
            if diffs:
                values = sorted(diffs.values())
                rows.append({"probe": probe, "gate": gate, "kernels": len(values),
                             "within_2pct": sum(v <= TOLERANCE for v in values),
                             "median_diff": statistics.median(values), "worst_diff": values[-1],
                             "median_counted": statistics.median(counted), "diffs": diffs})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    solutions: dict[str, Any] = {}
    for path in args.reports:
        solutions.update(json.loads(path.read_text())["solutions"])
    rows = variants(solutions)
    if not rows:
        print("no kernel has recorded draws in both gradings (bench_grader.py --keep-draws)")
        return 1
    print("| probe | gate | kernels | within 2 % | median diff | worst | median counted draws |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['probe']} | {r['gate']:.2f} | {r['kernels']} | {r['within_2pct']} | "
              f"{r['median_diff'] * 100:.1f} % | {r['worst_diff'] * 100:.1f} % | {r['median_counted']:.0f} |")
    if args.out:
        args.out.write_text(json.dumps({"sources": [str(p) for p in args.reports], "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
