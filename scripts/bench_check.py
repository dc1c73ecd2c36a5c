"""How long the free check (`metakernel eval --dry-run`) takes, and how much memory it needs, for every gold kernel.

Issue 15 asks the check to stay free: about a minute and a few GB at most on the 2-core CPU machine, measured over
all gold kernels, with the guides saying how long it takes. Each dry run is made in a fresh process of its own, one
at a time (nothing else of ours running), so its wall time is what an agent waits and its peak memory is the
largest resident memory of that process and the sandboxed child it starts together (sampled from /proc).

    python3 scripts/bench_check.py [--only 28,37] [--out validation/cpu-check-times.json]

Resumable: kernels already in the output file are kept; the file is rewritten after each one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_ONE = """
import json, os, sys, threading, time
from pathlib import Path
from metakernel.catalog import load_catalog
from metakernel.grader.evaluate import dry_run


def tree_rss_kb(root):
    parents, rss = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            parents[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
            rss[int(pid)] = next(int(ln.split()[1]) for ln in open(f"/proc/{pid}/status") if ln.startswith("VmRSS"))
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree} - tree
        grew, tree = bool(new), tree | new
    return sum(rss.get(p, 0) for p in tree)


peak, running = [0], [True]


def sample():
    while running[0]:
        peak[0] = max(peak[0], tree_rss_kb(os.getpid()))
        time.sleep(0.2)


threading.Thread(target=sample, daemon=True).start()
started = time.perf_counter()
report = dry_run(load_catalog().problem(int(sys.argv[1])), sys.argv[2], Path(sys.argv[3]))
seconds = time.perf_counter() - started
running[0] = False
print(json.dumps({"status": report.status, "reason": report.reason, "seconds": seconds, "peak_rss_gb": peak[0] / 1e6,
                  "full_scale_only": "small scale:" not in report.message,
                  "full_scale_covered": "full scale (the GPU's shapes)" in report.message,
                  "kernels": len(report.resources),
                  "grids_known": sum(1 for r in report.resources if r.get("grid"))}))
"""


def measure(number: int, dsl: str, path: Path) -> dict[str, Any]:
    """One dry run in a process of its own: its result, wall time (s, the process's start included) and the peak
    resident memory (GB) of that process and its descendants together (the sandboxed child), sampled every 0.2 s
    from /proc (the child runs under another uid: read as root, else only what is readable is counted)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _ONE, str(number), dsl, str(path)], capture_output=True, text=True,
                          timeout=900, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    row: dict[str, Any] = json.loads(lines[-1]) if lines else {"status": "error", "error": done.stderr[-1000:]}
    row["wall_s"] = time.perf_counter() - started
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="problem numbers, comma separated")
    parser.add_argument("--out", type=Path, default=Path("validation/cpu-check-times.json"))
    args = parser.parse_args()

    from metakernel import gold
    from metakernel.jsonio import write_json_atomic
    from metakernel.provenance import provenance

    wanted = {int(x) for x in args.only.split(",") if x.strip()}
    data: dict[str, Any] = (json.loads(args.out.read_text()) if args.out.is_file()
                            else {"provenance": provenance(), "kernels": {}})
    data["cpus"] = os.cpu_count()
    for sol in gold.discover():
        if sol.kind != "gold" or (wanted and sol.number not in wanted) or sol.key in data["kernels"]:
            continue
        row = measure(sol.number, sol.dsl, sol.path)
        data["kernels"][sol.key] = row
        print(f"{sol.key}: {row.get('status')} {row['wall_s']:.1f} s, peak {row.get('peak_rss_gb')} GB", flush=True)
        rows = list(data["kernels"].values())
        walls = sorted(r["wall_s"] for r in rows)
        data["summary"] = {"kernels": len(rows), "passed": sum(r.get("status") == "passed" for r in rows),
                           "median_wall_s": statistics.median(walls), "max_wall_s": walls[-1],
                           "slowest": max(data["kernels"], key=lambda k: data["kernels"][k]["wall_s"]),
                           "full_scale_only": sum(bool(r.get("full_scale_only")) for r in rows),
                           "full_scale_covered": sum(bool(r.get("full_scale_covered")) for r in rows),
                           "max_peak_rss_gb": max((r.get("peak_rss_gb") or 0.0) for r in rows)}
        write_json_atomic(args.out, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
