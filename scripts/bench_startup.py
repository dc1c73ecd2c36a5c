"""How long the CLI takes to answer, each command in a fresh process (median of N runs): the start-up a user feels.

    python3 scripts/bench_startup.py [--runs 7] [--out validation/cpu-startup.json]

`--help` and `problems list` must answer in well under half a second (issue 16): they import neither torch nor a
DSL. The report records the machine's provenance beside the medians, so numbers from different machines are not
mixed up.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMMANDS = {
    "metakernel --help": ["--help"],
    "metakernel run --help": ["run", "--help"],
    "metakernel problems list": ["problems", "list"],
    "metakernel problems list --json": ["problems", "list", "--json"],
    "metakernel skills --help": ["skills", "--help"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "validation" / "cpu-startup.json"))
    args = parser.parse_args()
    from metakernel.jsonio import write_json_atomic
    from metakernel.provenance import provenance

    results = {}
    for name, argv in COMMANDS.items():
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "metakernel", *argv], cwd=ROOT, capture_output=True)
            times.append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed: {done.stderr.decode()[-500:]}")
        results[name] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                         "runs": args.runs}
        print(f"{name:36s} median {results[name]['median_s']:.3f} s (min {min(times):.3f}, max {max(times):.3f})")
    write_json_atomic(Path(args.out), {"provenance": provenance(), "commands": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
