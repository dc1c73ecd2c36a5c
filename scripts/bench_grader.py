"""Benchmark the grader on the H200: what an evaluation costs, and whether it repeats.

For every gold solution (or the selection given), grade it twice with the protocol's defaults and record:
evaluation wall time, import + first-call (compile) time, GPU busy time (kernel time per call x calls timed), the
two medians and their relative difference. Kernels with medians >= 50 us must repeat within 2 %.

    METAKERNEL_REVISION=<commit> python3 scripts/bench_grader.py [--only 28,36] [--out FILE] [--warm]
        [--fresh-baselines] [--host-gate 0.15 --min-timing-s 2 [--host-fast-us auto] [--host-gate-wait-s 8]]
        [--keep-draws] [--flush-l2]

--fresh-baselines measures the eager baseline again for each grading, so the speedups (end-to-end and GPU-time)
are compared too; --host-gate counts only draws taken at full host speed (grader/timing.measure), and
--host-fast-us auto first measures the host's fast level here for 10 s so that a grading spent wholly in the slow
state still knows it (it then samples until the fast state comes back or --host-gate-wait-s passes). The gate
is the grader's default; --host-gate 0 --min-timing-s 0 counts every draw.

Resumable: finished solutions in the output file are kept; the file is rewritten after each one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from metakernel import gold
from metakernel.catalog import load_catalog
from metakernel.grader.evaluate import GradeOptions, WarmWorker, grade
from metakernel.grader.timing import host_fast_level_us
from metakernel.provenance import provenance

REPEAT_TOLERANCE = 0.02
MIN_US_FOR_REPEAT = 50.0


def _rel_diff(a: float | None, b: float | None) -> float | None:
    return abs(a - b) / a if a and b else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="problem numbers, comma separated")
    parser.add_argument("--out", default="validation/h200-grader-bench.json")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds before stopping (resume later)")
    parser.add_argument("--flush-l2", action="store_true", help="grade with the L2 flush before every timed call")
    for field, hint in (("host_gate", "count only draws taken at full host speed (e.g. 0.15; 0 = every draw)"),
                        ("min_timing_s", "sample at least this long (with the gate: e.g. 2)"),
                        ("timing_cap_s", "stop sampling after this long"),
                        ("host_gate_wait_s", "with the gate: stop waiting for fast draws after this long")):
        parser.add_argument("--" + field.replace("_", "-"), type=float, default=getattr(GradeOptions, field), help=hint)
    parser.add_argument("--host-fast-us", default="",
                        help="the gate's reference fast level: a number, or 'auto' to measure it here first")
    parser.add_argument("--keep-draws", action="store_true",
                        help="record every timed draw's time and host probes (scripts/gate_variants.py replays them)")
    parser.add_argument("--fresh-baselines", action="store_true",
                        help="measure the eager baseline again for every grading (else the first one is cached)")
    parser.add_argument("--warm", action="store_true",
                        help="hand each grading a child warmed for its variant before the clock starts (what an "
                             "experiment's next submission gets: LocalExecutor), so wall_s is kernel file to report")
    args = parser.parse_args()
    out = Path(args.out)
    data: dict[str, Any] = (json.loads(out.read_text()) if out.is_file()
                            else {"provenance": provenance(), "solutions": {}})
    data.setdefault("runs", []).append(provenance())
    wanted = {int(x) for x in args.only.split(",") if x.strip()}
    catalog = load_catalog()
    started = time.monotonic()
    fast_us = data.get("options", {}).get("host_fast_us")  # a resumed run keeps its reference level
    if args.host_fast_us and fast_us is None:
        fast_us = host_fast_level_us(10.0) if args.host_fast_us == "auto" else float(args.host_fast_us)
        print(f"host fast probe level: {fast_us:.1f} us")
    options = GradeOptions(flush_l2=args.flush_l2, host_gate=args.host_gate,
                           min_timing_s=args.min_timing_s, host_fast_us=fast_us, timing_cap_s=args.timing_cap_s,
                           host_gate_wait_s=args.host_gate_wait_s, keep_draws=args.keep_draws)
    data.setdefault("options", {}).update(flush_l2=args.flush_l2,
                                          fresh_baselines=args.fresh_baselines, host_gate=args.host_gate,
                                          min_timing_s=args.min_timing_s, host_fast_us=fast_us,
                                          timing_cap_s=args.timing_cap_s,
                                          host_gate_wait_s=args.host_gate_wait_s, keep_draws=args.keep_draws,
                                          warm=args.warm)
    for sol in gold.discover():
        if sol.kind != "gold" or (wanted and sol.number not in wanted) or sol.key in data["solutions"]:
            continue
        if time.monotonic() - started > args.budget:
            print("budget spent; run again to resume")
            return 3
        problem = catalog.problem(sol.number)
        runs: list[dict[str, Any]] = []
        for _ in range(2):
            if args.fresh_baselines:  # the eager baseline measured again per grading: speedups repeat or not
                os.environ["METAKERNEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="mk-bench-cache-")
            warm = None
            if args.warm:
                warm = WarmWorker(problem, sol.dsl, "cuda", options)
                warm.wait()  # started while the agent would still be writing the file: not in wall_s
            t0 = time.perf_counter()
            report = grade(problem, sol.dsl, sol.path, device="cuda", options=options, prestarted=warm)
            wall = time.perf_counter() - t0
            timing = report.timing
            runs.append({
                "status": report.status, "reason": report.reason, "wall_s": wall,
                "import_s": report.phases_s.get("import"), "first_call_s": report.phases_s.get("first_call"),
                "correctness_s": report.phases_s.get("correctness"), "timing_s": report.phases_s.get("timing"),
                "baselines_s": report.phases_s.get("baselines"), "phases_s": report.phases_s,
                "median_us": timing.median_us if timing else None, "n": timing.n if timing else None,
                "all_median_us": timing.all_median_us if timing else None,
                "kept_share": timing.kept_share if timing else None,
                "draws": timing.draws if timing else None,
                "integrity": report.integrity,
                "probe_fast_us": timing.probe_fast_us if timing else None,
                "probe_median_us": timing.probe_median_us if timing else None,
                "rse": timing.rse if timing else None, "gpu_only_us": report.gpu_only_us,
                "gpu_only_draws": report.gpu_only_draws, "gpu_only_rse": report.gpu_only_rse,
                "gpu_busy_s": (report.gpu_only_us or 0) * 1e-6 * (timing.n if timing else 0),
                "eager_median_us": report.eager.median_us if report.eager else None,
                "eager_gpu_only_us": report.eager.gpu_only_us if report.eager else None,
                "speedup": report.speedup, "speedup_gpu": report.speedup_gpu,
                **({"per_draw": timing.per_draw, "eager_per_draw": report.eager.per_draw if report.eager else None}
                   if args.keep_draws and timing else {}),
            })
        m1, m2 = runs[0]["median_us"], runs[1]["median_us"]
        diff = _rel_diff(m1, m2)
        g1, g2 = runs[0]["gpu_only_us"], runs[1]["gpu_only_us"]
        gpu_diff = _rel_diff(g1, g2)
        speedup_diffs = {f"{k}_rel_diff": _rel_diff(runs[0][k], runs[1][k]) for k in ("speedup", "speedup_gpu")}
        data["solutions"][sol.key] = {**speedup_diffs,
            "dsl": sol.dsl, "problem": problem.identity, "runs": runs, "median_rel_diff": diff,
            "repeat_ok": None if diff is None or m1 < MIN_US_FOR_REPEAT else diff <= REPEAT_TOLERANCE,
            "gpu_only_rel_diff": gpu_diff,
            "gpu_only_repeat_ok": None if gpu_diff is None or g1 < MIN_US_FOR_REPEAT else gpu_diff <= REPEAT_TOLERANCE,
        }
        walls = f"{runs[0]['wall_s']:.1f} / {runs[1]['wall_s']:.1f} s"
        print(f"{sol.key}: medians {m1} / {m2} us, diff {diff}; gpu-only {g1} / {g2} us, diff {gpu_diff}; "
              f"walls {walls}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1))
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], out.name).write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
