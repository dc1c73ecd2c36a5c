"""Which timing procedure gives the same median in two processes? A measurement study for the grader (issue 3).

The same gold kernel graded twice differed by 2-35 % although each median's standard error was < 1 %: the spread
is between processes, not within one. This script starts several fresh grading children per kernel (the grader's
own `Worker`, CUDA IPC inputs, spin before each call) and, inside each, times the kernel under several procedures,
interleaved draw by draw so drift hits all of them alike:

  ipc         the protocol before this study: one call on the tensors received from the parent
  local       the received tensors copied into the child's own memory before the bracket, then one call
  local_warm  as local, after one untimed call on the same inputs (host caches warm)
  local_x8    as local, eight back-to-back calls in one bracket, divided by eight (throughput, not latency)

Half of the children run with PYTHONHASHSEED=0 to see whether hash-order randomisation matters. The eager
reference is measured the same way (ipc, local). For each procedure the output gives every child's median and the
spread (max/min - 1) between children.

    python3 scripts/bench_timing_modes.py [--only 28,36] [--children 4] [--draws 60] [--out FILE]

Resumable: kernels already in the output file are skipped; the file is rewritten after each one.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from metakernel import gold
from metakernel.catalog import load_catalog
from metakernel.dsl import get_adapter
from metakernel.expected import fresh_copies
from metakernel.grader.worker import Worker
from metakernel.jsonio import write_json_atomic
from metakernel.provenance import provenance

PROCEDURES: dict[str, dict[str, Any]] = {
    "ipc": {},
    "local": {"local_inputs": True},
    "local_warm": {"local_inputs": True, "warm_first": True},
    "local_x8": {"local_inputs": True, "repeat": 8},
}
EAGER_PROCEDURES = ("ipc", "local")


def one_child(problem: Any, worker: Worker, procedures: list[str], draws: int, spin_ms: float) -> dict[str, Any]:
    """Medians (us) per procedure inside one started child."""
    samples: dict[str, list[float]] = {p: [] for p in procedures}
    hosts: dict[str, list[float]] = {p: [] for p in procedures}
    for i in range(-3, draws):
        for name in procedures:
            torch.manual_seed(secrets.randbits(62))
            inputs = fresh_copies(problem, problem.make_inputs(device="cuda", scale="full"))
            torch.cuda.synchronize()
            reply = worker.request({"op": "time", "inputs": inputs, "return_outputs": False, "spin_ms": spin_ms,
                                    **PROCEDURES[name]}, timeout=120)
            if not reply.get("ok"):
                raise RuntimeError(reply.get("error", "")[-2000:])
            if i >= 0:
                samples[name].append(reply["event_s"] * 1e6)
                hosts[name].append(reply["host_s"] * 1e6)
    return {name: {"median_us": statistics.median(samples[name]), "host_median_us": statistics.median(hosts[name]),
                   "rse": 1.2533 * statistics.stdev(samples[name]) / len(samples[name]) ** 0.5
                   / statistics.median(samples[name])}
            for name in procedures}


def spreads(children: list[dict[str, Any]], procedures: list[str]) -> dict[str, Any]:
    out = {}
    for name in procedures:
        meds = [c["medians"][name]["median_us"] for c in children]
        out[name] = {"medians_us": [round(m, 2) for m in meds], "spread": max(meds) / min(meds) - 1}
    return out


def measure(problem: Any, make_worker: Any, procedures: list[str], children: int, draws: int,
            spin_ms: float, alternate: str) -> dict[str, Any]:
    """`alternate`: what every second child changes — "hashseed" (PYTHONHASHSEED=0) or "layout" (no ASLR)."""
    results = []
    for k in range(children):
        flip = k % 2 == 1
        if alternate == "layout":
            worker = make_worker({}, flip)
        else:
            worker = make_worker({"PYTHONHASHSEED": "0"} if flip else {}, False)
        try:
            worker.start()
            results.append({"hashseed0" if alternate == "hashseed" else "fixed_layout": flip,
                            "medians": one_child(problem, worker, procedures, draws, spin_ms)})
        finally:
            worker.close()
    out = {"children": results, "spread": spreads(results, procedures)}
    for flag in (False, True):
        group = [c for c in results if c.get("fixed_layout", c.get("hashseed0")) is flag]
        if len(group) > 1:
            out["spread_" + ("with" if flag else "without") + f"_{alternate}"] = spreads(group, procedures)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="problem numbers, comma separated")
    parser.add_argument("--dsl", default="", help="cute or tirx (default both)")
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--draws", type=int, default=60)
    parser.add_argument("--spin-ms", type=float, default=2.0)
    parser.add_argument("--procedures", default=",".join(PROCEDURES), help="comma separated, of: "
                        + ", ".join(PROCEDURES))
    parser.add_argument("--alternate", choices=["hashseed", "layout"], default="hashseed",
                        help="what every second child changes: PYTHONHASHSEED=0, or address randomisation off")
    parser.add_argument("--only-key", default="", help="solution keys, e.g. 36/correct/tirx.py (comma separated)")
    parser.add_argument("--no-eager", action="store_true", help="skip the eager reference")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds before stopping (resume later)")
    parser.add_argument("--out", default="validation/h200-timing-modes.json")
    args = parser.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {"provenance": provenance(), "kernels": {}}
    data.setdefault("runs", []).append(provenance())
    data["options"] = {"children": args.children, "draws": args.draws, "spin_ms": args.spin_ms,
                       "procedures": args.procedures, "alternate": args.alternate}
    wanted = {int(x) for x in args.only.split(",") if x.strip()}
    procedures = [p for p in args.procedures.split(",") if p]
    unknown = sorted(set(procedures) - set(PROCEDURES))
    if unknown:
        parser.error(f"unknown procedure(s) {unknown}")
    catalog = load_catalog()
    started = time.monotonic()

    def flush() -> None:
        write_json_atomic(out, data)
        if os.environ.get("OUT"):
            write_json_atomic(Path(os.environ["OUT"], out.name), data)

    done_eager: set[int] = set()
    for sol in gold.discover():
        if sol.kind != "gold" or (wanted and sol.number not in wanted) or (args.dsl and sol.dsl != args.dsl):
            continue
        if args.only_key and sol.key not in args.only_key.split(","):
            continue
        if time.monotonic() - started > args.budget:
            print("budget spent; run again to resume")
            return 3
        problem = catalog.problem(sol.number)
        eager_key = f"{sol.number:02d}/eager"
        if not args.no_eager and sol.number not in done_eager and eager_key not in data["kernels"]:
            data["kernels"][eager_key] = measure(
                problem, lambda env, fixed, path=problem.path: Worker(kind="eager", path=path, device="cuda",
                                                                       env=env, fixed_layout=fixed),
                [p for p in EAGER_PROCEDURES if p in procedures], args.children, args.draws, args.spin_ms,
                args.alternate)
            print(eager_key, {k: f"{v['spread']:.3f}" for k, v in data["kernels"][eager_key]["spread"].items()})
            flush()
        done_eager.add(sol.number)
        if sol.key in data["kernels"]:
            continue
        adapter_env = get_adapter(sol.dsl).environment(dry_run=False)
        data["kernels"][sol.key] = measure(
            problem, lambda env, fixed, s=sol, base=adapter_env: Worker(
                kind="candidate", path=s.path, device="cuda", dsl=s.dsl, env={**base, **env}, fixed_layout=fixed),
            procedures, args.children, args.draws, args.spin_ms, args.alternate)
        print(sol.key, {k: f"{v['spread']:.3f}" for k, v in data["kernels"][sol.key]["spread"].items()})
        flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
