"""What the harness adds to a timed call: the grader's end-to-end median beside the same bracket in a plain process.

Issue 13's measurement. For every gold kernel (or the selection given), in one device call so that both see the
same host state, interleaved: a plain process (A), the grader, a second plain process (B). Each plain process
imports the kernel file directly (no sandbox, no launch hooks, no transport) and times the grader's own bracket —
sync, clock, `solve`, device-wide sync, clock, garbage collection off — over fresh full-scale inputs on every
draw; the eager reference gets the same treatment. The bound the grader must meet:

    |grader median - plain median| <= max(5 us, 3 % of plain, 2 x |plain A - plain B|)

where plain median is the mean of A and B and |A - B| is the plain bracket's own A/A spread. The grader is run
with fresh baselines, so its eager median is measured beside its plain twin too.

    METAKERNEL_REVISION=<commit> python3 scripts/bench_overhead.py [--only 28,36] [--out FILE] [--budget S]
        [--draws 300] [--device cuda] [--twins rows|one|both] [--study]
    python3 scripts/bench_overhead.py --plain PROBLEM (eager|KERNEL_FILE) [--draws N] [--device D]
        [--layers gate,guard,poison,idle,rows,mask --dsl DSL]   (one plain run, grader pieces added)
    python3 scripts/bench_overhead.py --floors [--draws N]   (each DSL launch route's floor, scripts/floors/)

The plain twins time rows of timing.ROW fresh draws called back to back, as the grader's timed requests do since
protocol 3 (`--twins rows`, the default); `--twins one` times one call per draw (the issue's original bracket,
which on a cold host carries a cost of its own), `both` adds a one-call run beside the rows twins. The eager
reference is timed once per problem: the second DSL's grading reuses the first's cached baseline.

`--study` adds, per kernel, plain runs with the grader's pieces added one by one (STUDY) and gradings with one of
its pieces taken out (GRADER_STUDY), to locate added time.

Resumable: finished kernels in the output file are kept; the file is rewritten after each one (and copied under
$OUT when set). The gold kernels need the GPU; on a CPU machine only `--plain N eager --device cpu` runs (CI).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

BOUND_US = 5.0
BOUND_SHARE = 0.03
WARMUP = 5
PLAIN_CAP_S = 20.0


#: The launch floor (`--floors`): y = x + 1 on 1024 values through each DSL's launch routes (scripts/floors/).
FLOOR = "floor"
FLOORS = Path(__file__).resolve().parent / "floors"
FLOOR_ROUTES = {"cute (TVM-FFI)": "cute_ffi.py", "cute (from_dlpack)": "cute_dlpack.py", "tirx": "tirx.py",
                "eager": "eager"}
#: Where `metakernel eval` and the experiment report read the floors measured on each GPU.
FLOORS_DATA = Path(__file__).resolve().parents[1] / "metakernel" / "floors.json"


def _load(path: str | Path, name: str) -> Any:
    """A module imported from its file (DSLs read kernel source from files: import it from disk, as the child does)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The grader's pieces a plain process can add one by one (`--layers`), to find where added time goes.
LAYERS = ("gate", "guard", "arena", "ipc", "poison", "idle", "rows", "mask", "mask_poll")
#: The "idle" layer: the child waits this long, blocked, for each request (the parent draws and checks meanwhile).
IDLE_S = 0.005
#: The layer sets the study runs per kernel (`--study`), between the plain runs A and B (the gate alone is known:
#: within the A/A spread of the plain bracket at 14052e3).
STUDY = ("gate,guard", "gate,guard,arena,poison", "gate,guard,ipc,poison")
#: And the grader itself with its pieces taken out (no baselines: only the kernel's median is compared);
#: "sandbox": False grades in a child without OS isolation (the study's only way to tell the sandbox's share).
#: Changes the study makes in its own process, never in the grader's files: "chunk" sets the draws per timed request
#: (timing.ROW: a cost paid once per request shrinks as 1/chunk, one paid per call does not), and
#: "phases": False skips the ablations and the launch-argument audit, so the child goes from its correctness calls
#: straight to timing (does what the launch gate's other modes leave behind slow the calls after them?).
GRADER_STUDY: dict[str, dict[str, Any]] = {
    "no_sandbox": {"sandbox": False},
    "chunk_1": {"chunk": 1}, "chunk_16": {"chunk": 16}, "no_ablation_audit": {"phases": False}}


def _add_layers(layers: set[str], dsl: str, target: str) -> tuple[Any, Any]:
    """Install the grader's launch gate and audit hook as the child does (before the kernel is imported).

    Returns (gate, event counter): the counter counts audit events raised inside the timed window.
    """
    import collections
    import sys

    counts: collections.Counter[str] = collections.Counter()
    window = [False]
    if "guard" in layers:
        def count(event: str, _args: tuple[Any, ...]) -> None:
            if window[0]:
                counts[event] += 1

        sys.addaudithook(count)
    gate = None
    if "gate" in layers:
        from metakernel.dsl import LaunchGate, get_adapter

        adapter = get_adapter(dsl)
        adapter.import_dsl()
        gate = LaunchGate(mode="run")
        adapter.install_hooks(gate)
    if "guard" in layers:
        from metakernel.grader.child import Guard

        # the child's read-only binds: this checkout and the installed packages (they may lie under /tmp)
        readonly = [str(Path(__file__).resolve().parents[1])] + [p for p in sys.path if p and os.path.isdir(p)]
        work = tempfile.mkdtemp(prefix="mk-overhead-work-")
        tempfile.tempdir = work  # the child's TMPDIR is its work dir (CuTe writes its compile scratch there)
        guard = Guard(target, work, readonly)
        sys.addaudithook(guard)
        guard.armed = True
    return gate, (counts, window)


def plain_bracket(number: int | str, target: str, draws: int, device: str, layers: str = "",
                  dsl: str = "") -> dict[str, Any]:
    """The grader's bracket with nothing of the grader around it: median over fresh draws (one process).

    `layers` adds pieces of the grader's child (LAYERS: the DSL launch gate, the audit hook, inputs in an arena,
    the poison fill, the 5 ms idle wait for each request, draws in rows as the grader times them, masked draws),
    so that a difference between the grader and the plain bracket can be attributed; with the audit
    hook the audit events raised inside the window are counted per call.
    """
    import torch

    from metakernel.catalog import load_catalog

    wanted = {x for x in layers.split(",") if x}
    unknown = wanted - set(LAYERS)
    if unknown:
        raise SystemExit(f"unknown layer(s) {sorted(unknown)}: choose from {LAYERS}")
    problem: Any = load_catalog().problem(number) if number != FLOOR else _load(FLOORS / "problem.py", "floor_problem")
    if "gate" in wanted and target == "eager":
        raise SystemExit("the launch gate needs a kernel file and its --dsl, not the eager reference")
    gate, (counts, window) = _add_layers(wanted, dsl, target)
    arena = None
    if {"arena", "ipc"} & wanted and device == "cuda":  # inputs as the child sees them: views of memory torch
        # does not own ("arena": this process's own; "ipc": another process's, mapped as the child maps its arenas)
        from metakernel.grader import transport

        if "ipc" in wanted:
            spec = json.loads(os.environ[IPC_ENV])
            torch.empty(1, device=device)
            base = transport.Driver().open(spec["handle"]) + int(spec["offset"])
            arena = transport.wrap_device_bytes(base, int(spec["nbytes"]))
        else:
            backing = torch.empty(_arena_bytes(problem), dtype=torch.uint8, device=device)
            arena = transport.wrap_device_bytes(backing.data_ptr(), backing.numel())
    if target == "eager":
        fn = problem.reference
    else:
        fn = _load(target, "plain_kernel").solve

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    # "rows": as the grader's timed requests (protocols 3-5), timing.ROW draws made first, then called back to back;
    # a sample is the mean of the calls after the first (protocol 5)
    from metakernel.grader.child import host_probe
    from metakernel.grader.timing import ROW, fast_level

    group = ROW if "rows" in wanted else 1
    times: list[float] = []  # per sample: as the grader (protocol 5), the mean of a row's calls after its first
    firsts: list[float] = []  # each row's first call (the grader's warm-up, not scored)
    every: list[float] = []  # each row's mean over all its calls (protocol 4's sample)
    probes: list[float] = []  # the child's host-speed probe, the slower of before and after the row
    started = time.perf_counter()
    gc.disable()
    try:
        for i in range(WARMUP + max(1, draws // group)):
            batch = []
            for k in range(group):
                torch.manual_seed(1000 + i * group + k)
                batch.append(problem.make_inputs(device=device, scale="full" if device == "cuda" else "small"))
            if arena is not None:  # each draw of the row at its own offset, as the parent places a request's
                placed, at = [], 0
                for inputs in batch:
                    views, _specs, at = transport.place(inputs, arena, at)
                    placed.append(views)
                batch = placed
                sync()
            if "idle" in wanted:
                time.sleep(IDLE_S)
            if "poison" in wanted:
                blocks = [torch.empty(sum(getattr(x, "nbytes", 0) for x in inputs), dtype=torch.uint8, device=device)
                          for inputs in batch]
                for block in blocks:
                    block.fill_(0xFF)
                del blocks
            masked = bool({"mask", "mask_poll"} & wanted)
            if masked:  # as the parent masks a row's later draws (protocol 4); each is unmasked before its call
                for k, inputs in enumerate(batch[1:], start=1):
                    _xor_draw(inputs, i * group + k, device)
            if gate is not None:
                gate.reset()
            each: list[float] = []
            probe_before = host_probe()
            for k, inputs in enumerate(batch):
                if masked and k:  # the child's unmask: a sweep of the draw, then a blocking or a polling wait
                    _xor_draw(inputs, i * group + k, device, wait="poll" if "mask_poll" in wanted else "sync")
                sync()
                window[0] = i >= WARMUP
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = fn(*inputs)
                sync()
                each.append(time.perf_counter() - t0)
                window[0] = False
                del out
            probe = max(probe_before, host_probe())
            del batch, inputs
            gc.collect(0)
            if i >= WARMUP:
                timed = each[1:] or each
                times.append(sum(timed) / len(timed))
                firsts.append(each[0])
                every.append(sum(each) / len(each))
                probes.append(probe)
            if time.perf_counter() - started > PLAIN_CAP_S and len(times) >= 20:
                break
    finally:
        gc.enable()
    row: dict[str, Any] = {"median_us": statistics.median(times) * 1e6, "n": len(times), "min_us": min(times) * 1e6}
    # the grader's host-speed gate (timing.kept_indices at 0.15) applied to this process's own probes: whether the
    # plain process meets the host's slow state as often as the child does
    level = fast_level(probes)
    fast = [t for t, p in zip(times, probes, strict=True) if p <= 1.15 * level]
    row.update({"probe_fast_us": level * 1e6, "probe_median_us": statistics.median(probes) * 1e6,
                "kept_share": len(fast) / len(times), "gated_median_us": statistics.median(fast) * 1e6})
    if wanted:
        row["layers"] = sorted(wanted)
    if group > 1:
        row["calls_per_sample"] = group - 1
        row["first_call_median_us"] = statistics.median(firsts) * 1e6
        row["all_calls_median_us"] = statistics.median(every) * 1e6
    if "guard" in wanted:
        row["audit_events_per_call"] = {k: v / (len(times) * group) for k, v in sorted(counts.items())}
    return row


def _xor_draw(inputs: list[Any], key: int, device: str, wait: str = "") -> None:
    """XOR every contiguous tensor of a draw with a keyed stream (`transport.mask_stream`): twice restores it.

    The "mask" layers: the protocol-4 child unmasks each later draw of a row right before its call, so the plain
    process does the same sweep there; `wait` "sync" ends it with a device-wide sync as the child does, "poll"
    with a loop on an event (the thread keeps running), to tell the sweep's cache effect from the wait's.
    """
    import torch

    from metakernel.grader.transport import mask_stream

    for j, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.numel() and t.is_contiguous():
            flat = t.reshape(-1).view(torch.uint8)
            flat.bitwise_xor_(mask_stream(flat.numel(), key * 64 + j, device))
    if device != "cuda" or not wait:
        return
    if wait == "poll":
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            pass
    else:
        torch.cuda.synchronize()


#: The "ipc" layer's arena (made by the study's own process, as the grader's parent makes the child's).
IPC_ENV = "MK_OVERHEAD_IPC_ARENA"


def _arena_bytes(problem: Any) -> int:
    """Room for a row of timing.ROW draws (the "rows" layer places each at its own offset)."""
    from metakernel.grader import transport
    from metakernel.grader.timing import ROW

    one = transport.draw_bytes(problem.make_inputs(device="cuda", scale="full")) + 64 * transport.ALIGN
    return ROW * one


@contextlib.contextmanager
def _study_patches(chunk: int | None = None, phases: bool = True) -> Iterator[None]:
    """The GRADER_STUDY changes that are not GradeOptions, made to this process's grader modules and undone after."""
    from metakernel.grader import evaluate, timing

    saved = (timing.ROW, evaluate.Evaluation.ablation, evaluate.Evaluation.audit)
    try:
        if chunk is not None:
            timing.ROW = chunk  # read at call time by candidate_worker (arena slots; sizes cached per count), row_size
        if not phases:
            evaluate.Evaluation.ablation = evaluate.Evaluation.audit = lambda self: None  # type: ignore[method-assign]
        yield
    finally:
        timing.ROW, evaluate.Evaluation.ablation, evaluate.Evaluation.audit = saved  # type: ignore[method-assign]


def _grade_variant(problem: Any, sol: Any, device: str, change: dict[str, Any]) -> Any:
    """One grading without baselines, with GradeOptions changed; `sandbox: False` forces a child without isolation;
    `chunk` and `phases` as `_study_patches`."""
    from metakernel.grader import sandbox
    from metakernel.grader.evaluate import GradeOptions, grade

    change = dict(change)
    isolated = change.pop("sandbox", True)
    patches = {"chunk": change.pop("chunk", None), "phases": change.pop("phases", True)}
    options = replace(GradeOptions(), baselines=False, **change)
    with _study_patches(**patches):
        if isolated:
            return grade(problem, sol.dsl, sol.path, device=device, options=options)
        default_mode = sandbox.default_mode
        sandbox.default_mode = lambda: "none"  # type: ignore[assignment]
        try:
            return grade(problem, sol.dsl, sol.path, device=device,
                         options=replace(options, require_isolation=False))
        finally:
            sandbox.default_mode = default_mode  # type: ignore[assignment]


def _plain(number: int | str, target: str, draws: int, device: str, layers: str = "", dsl: str = "") -> dict[str, Any]:
    """One plain run in its own process (a fresh CUDA context, as the grader's child has)."""
    cmd = [sys.executable, __file__, "--plain", str(number), target, "--draws", str(draws), "--device", device]
    if layers:
        cmd += ["--layers", layers, "--dsl", dsl]
    env, arena = dict(os.environ), None
    if "ipc" in layers.split(",") and device == "cuda":
        from metakernel.catalog import load_catalog
        from metakernel.grader import transport

        arena, _pool = transport.allocate_arena(_arena_bytes(load_catalog().problem(int(number))))
        env[IPC_ENV] = json.dumps(transport.export_arena(transport.Driver(), arena))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env)
    del arena
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def within_bound(grader_us: float | None, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The comparison of one grader median with its two plain twins."""
    if grader_us is None or "median_us" not in a or "median_us" not in b:
        return {"ok": None}
    plain = (a["median_us"] + b["median_us"]) / 2
    aa = abs(a["median_us"] - b["median_us"])
    bound = max(BOUND_US, BOUND_SHARE * plain, 2 * aa)
    added = grader_us - plain
    return {"plain_us": plain, "aa_spread_us": aa, "added_us": added, "added_share": added / plain if plain else None,
            "bound_us": bound, "ok": abs(added) <= bound}


def measure_floors(args: Any) -> int:
    """Each route's floor, A then B (interleaved), into the report's `floors` and metakernel/floors.json."""
    from metakernel.jsonio import write_json_atomic
    from metakernel.provenance import provenance

    out = Path(args.out)
    data: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {"provenance": provenance(),
                                                                               "device": args.device}
    runs: dict[str, list[dict[str, Any]]] = {route: [] for route in FLOOR_ROUTES}
    for _ in range(2):
        for route, target in FLOOR_ROUTES.items():
            path = target if target == "eager" else str(FLOORS / target)
            runs[route].append(_plain(FLOOR, path, args.draws, args.device))
    floors = {}
    for route, (a, b) in runs.items():
        ok = "median_us" in a and "median_us" in b
        floors[route] = {"median_us": (a["median_us"] + b["median_us"]) / 2 if ok else None,
                         "aa_spread_us": abs(a["median_us"] - b["median_us"]) if ok else None, "runs": [a, b]}
        print(f"floor {route}: {floors[route]['median_us']} us (A/A {floors[route]['aa_spread_us']} us)")
    measured = provenance()  # this run's, not the resumed report's (which may be from another commit)
    gpu = (measured.get("gpu") or {}).get("name") or args.device
    data["floors"] = {"gpu": gpu, "provenance": measured, "routes": floors}
    write_json_atomic(out, data)
    if os.environ.get("OUT"):
        write_json_atomic(Path(os.environ["OUT"], out.name), data)
    if args.device == "cuda":
        known = json.loads(FLOORS_DATA.read_text()) if FLOORS_DATA.is_file() else {}
        known[str(gpu)] = {route: f["median_us"] for route, f in floors.items()} | {
            "revision": (measured.get("revision") or {}).get("commit")}
        write_json_atomic(FLOORS_DATA, known)
        if os.environ.get("OUT"):
            write_json_atomic(Path(os.environ["OUT"], FLOORS_DATA.name), known)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", nargs=2, metavar=("PROBLEM", "TARGET"), help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="problem numbers, comma separated")
    parser.add_argument("--keys", default="", help="gold solution keys, comma separated (e.g. 28/correct/tirx.py)")
    parser.add_argument("--out", default="validation/h200-overhead.json")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds before stopping (resume later)")
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--layers", default="", help=f"with --plain: grader pieces to add, of {','.join(LAYERS)}")
    parser.add_argument("--dsl", default="", help="with --layers: the kernel's DSL")
    parser.add_argument("--floors", action="store_true",
                        help="time the launch floor of each DSL route (scripts/floors/), twice each, interleaved")
    parser.add_argument("--twins", default="rows", choices=("rows", "one", "both"),
                        help="the plain twins' form: rows of the grader's chunk (default), one call per draw, or both")
    parser.add_argument("--study", action="store_true",
                        help=f"also run plain processes with the grader's pieces added ({' / '.join(STUDY)})")
    parser.add_argument("--layer-sets", default="", help="with --study: layer sets to run, ';' separated")
    parser.add_argument("--variants", default="", help=f"with --study: grader variants, of {','.join(GRADER_STUDY)}")
    args = parser.parse_args()
    if args.plain:
        number: int | str = args.plain[0] if args.plain[0] == FLOOR else int(args.plain[0])
        print(json.dumps(plain_bracket(number, args.plain[1], args.draws, args.device, args.layers, args.dsl)))
        return 0
    if args.floors:
        return measure_floors(args)

    from metakernel import gold
    from metakernel.catalog import load_catalog
    from metakernel.grader.evaluate import GradeOptions, grade
    from metakernel.jsonio import write_json_atomic
    from metakernel.provenance import provenance

    out = Path(args.out)
    data: dict[str, Any] = (json.loads(out.read_text()) if out.is_file()
                            else {"provenance": provenance(), "device": args.device, "kernels": {}})
    data.setdefault("runs", []).append(provenance())
    data["bound"] = f"|grader - plain| <= max({BOUND_US} us, {BOUND_SHARE:.0%} of plain, 2 x plain A/A spread)"
    wanted = {int(x) for x in args.only.split(",") if x.strip()}
    keys = {x.strip() for x in args.keys.split(",") if x.strip()}
    catalog = load_catalog()
    twin = "" if args.twins == "one" else "rows"  # the layers of the twins the bound compares with
    caches: dict[int, str] = {}  # problem -> this run's baseline cache (fresh per problem, shared by its DSLs)
    started = time.monotonic()
    for sol in gold.discover():
        if sol.kind != "gold" or (wanted and sol.number not in wanted) or (keys and sol.key not in keys) \
                or sol.key in data["kernels"]:
            continue
        if time.monotonic() - started > args.budget:
            print("budget spent; run again to resume")
            return 3
        problem = catalog.problem(sol.number)
        first_of_problem = sol.number not in caches
        if first_of_problem:  # fresh baselines, timed beside their eager twins
            caches[sol.number] = tempfile.mkdtemp(prefix="mk-overhead-cache-")
        os.environ["METAKERNEL_CACHE_DIR"] = caches[sol.number]
        began = time.monotonic()
        kernel_a = _plain(sol.number, str(sol.path), args.draws, args.device, twin, sol.dsl)
        one_call = (_plain(sol.number, str(sol.path), args.draws, args.device) if args.twins == "both" else None)
        eager_a = _plain(sol.number, "eager", args.draws, args.device, twin) if first_of_problem else {}
        layered = {layers: _plain(sol.number, str(sol.path), args.draws, args.device, layers, sol.dsl)
                   for layers in ((args.layer_sets.split(";") if args.layer_sets else STUDY) if args.study else ())}
        variants = {}
        chosen = set(args.variants.split(",")) if args.variants else set(GRADER_STUDY)
        for label, change in (GRADER_STUDY.items() if args.study else ()):
            if label not in chosen:
                continue
            varied = _grade_variant(problem, sol, args.device, change)
            variants[label] = {"status": varied.status,
                               "median_us": varied.timing.median_us if varied.timing else None,
                               "n": varied.timing.n if varied.timing else None,
                               "chunk": varied.timing.chunk if varied.timing else None,
                               "isolation": (varied.isolation or {}).get("mode"),
                               "child_steps_s": {k: v for k, v in varied.phases_s.items() if "child" in k}}
        report = grade(problem, sol.dsl, sol.path, device=args.device, options=GradeOptions())
        kernel_b = _plain(sol.number, str(sol.path), args.draws, args.device, twin, sol.dsl)
        eager_b = _plain(sol.number, "eager", args.draws, args.device, twin) if first_of_problem else {}
        grader_us = report.timing.median_us if report.timing else None
        eager_us = report.eager.median_us if report.eager else None
        entry: dict[str, Any] = {
                 "problem": problem.identity, "dsl": sol.dsl, "status": report.status, "reason": report.reason,
                 "twin": args.twins, "grader_us": grader_us, "grader_eager_us": eager_us,
                 "plain": [kernel_a, kernel_b], "plain_eager": [eager_a, eager_b],
                 "kernel": within_bound(grader_us, kernel_a, kernel_b),
                 "eager": (within_bound(eager_us, eager_a, eager_b) if first_of_problem
                           else {"ok": None, "baseline": "cached by the problem's first DSL in this run"}),
                 "phases_s": report.phases_s}
        if one_call is not None:
            entry["plain_one_call"] = one_call
        if layered:
            entry["layered"] = layered
        if variants:
            entry["grader_without"] = variants
        for key, timing in (("grader_timing", report.timing), ("grader_eager_timing", report.eager)):
            if timing is not None:
                entry[key] = {k: v for k, v in timing.__dict__.items() if k != "per_draw"}
        entry["wall_s"] = time.monotonic() - began
        data["kernels"][sol.key] = entry
        print(f"{sol.key}: grader {grader_us} us, plain {entry['kernel'].get('plain_us')} us, "
              f"added {entry['kernel'].get('added_us')} us (ok {entry['kernel']['ok']}); eager added "
              f"{entry['eager'].get('added_us')} us (ok {entry['eager']['ok']})", flush=True)
        rows = list(data["kernels"].values())
        data["summary"] = {"kernels": len(rows),
                           "kernel_within_bound": sum(1 for r in rows if r["kernel"]["ok"]),
                           "eager_timed": sum(1 for r in rows if r["eager"]["ok"] is not None),
                           "eager_within_bound": sum(1 for r in rows if r["eager"]["ok"])}
        write_json_atomic(out, data)
        if os.environ.get("OUT"):
            write_json_atomic(Path(os.environ["OUT"], out.name), data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
