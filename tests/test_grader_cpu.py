"""The grader end to end on the CPU: real child processes, real TIRx llvm kernels on CPU tensors, the comparator,
the launch gate, ablation, the token-kernel audit, timing and baselines — and every way a candidate can fail.

The problem is a small synthetic one (y = 2·x + b in fp32) because the llvm target is only a stand-in for the GPU:
what is exercised is the grader's machinery, with the DSL compiler and launches for real.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from metakernel.grader.evaluate import GradeOptions, dry_run, grade
from metakernel.grader.report import PROTOCOL
from metakernel.problem import load_problem_file
from tests.helpers import AXPB_CUDA, AXPB_LLVM, write_problem
from tests.helpers import AXPB_PROBLEM as PROBLEM

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is not installed")


HEADER = AXPB_LLVM + '''

@Tx.prim_func
def copy(x_ptr: Tx.handle, y_ptr: Tx.handle):
    M = Tx.int32()
    N = Tx.int32()
    X = Tx.match_buffer(x_ptr, (M, N), "float32")
    Y = Tx.match_buffer(y_ptr, (M, N), "float32")
    for i, j in Tx.grid(M, N):
        Y[i, j] = X[i, j]


_EXE = {}


def exe(f):
    key = f
    if key not in _EXE:
        _EXE[key] = tvm.compile(f, target="llvm", tir_pipeline="tirx")
    return _EXE[key]
'''

KERNELS = {
    "correct": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return y
""",
    "zeros": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return torch.zeros_like(x)
""",
    "no_launch": """
def solve(x, b):
    return x * 2.0 + b
""",
    "unused": """
def solve(x, b):
    scratch = torch.empty_like(x)
    exe(axpb)(x, b, scratch)
    return x * 2.0 + b
""",
    "token": """
def solve(x, b):
    eager = x * 2.0 + b
    y = torch.empty_like(x)
    exe(copy)(eager, y)
    return y
""",
    "two_stage": """
def solve(x, b):
    staged = torch.empty_like(x)
    exe(axpb)(x, b, staged)  # the work
    y = torch.empty_like(x)
    exe(copy)(staged, y)  # handed the answer, which the launch before computed: not a token
    return y
""",
    "token_after_launch": """
def solve(x, b):
    staged = torch.empty_like(x)
    exe(axpb)(x, b, staged)
    staged.copy_(x * 2.0 + b + 0.0)  # eager overwrites the launch's result (bit-identical here)...
    y = torch.empty_like(x)
    exe(copy)(x * 2.0 + b, y)  # ...and the next launch is handed an eager answer in a fresh buffer
    return y
""",
    "cached": """
_CACHE = []

def solve(x, b):
    if not _CACHE:
        y = torch.empty_like(x)
        exe(axpb)(x, b, y)
        _CACHE.append(y)
    exe(copy)(_CACHE[0], torch.empty_like(x))
    return _CACHE[0]
""",
    "mutates": """
def solve(x, b):
    exe(axpb)(x, b, x)
    return x
""",
    "dtype": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return y.double()
""",
    "dtype_unknown": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return y.to(torch.float8_e4m3fnuz)
""",
    "raises": """
def solve(x, b):
    raise RuntimeError("my kernel is broken")
""",
    "hang": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    while True:
        y.add_(0.0)
""",
    "burn": """
_SCRATCH = {}

def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    if "a" not in _SCRATCH:
        _SCRATCH["a"], _SCRATCH["b"] = torch.ones(64, 64), torch.empty(64, 64)
    exe(copy)(_SCRATCH["a"], _SCRATCH["b"])  # burns time; nobody reads b
    return y
""",
    # session 33's red-teamer: a probe launch tells the ablated calls apart, and solve raises there (a failure was
    # read as "the DSL's values are required"); the answer is eager
    "raise_on_ablation": """
def solve(x, b):
    seed = torch.full((4, 4), 3.0)
    probe = torch.empty(4, 4)
    exe(copy)(seed, probe)
    if not bool((probe == 3.0).all()):
        raise RuntimeError("ablated")
    return x * 2.0 + b + 0.0 * probe[0, 0]
""",
    # the same tell keeping a burn counted as DSL work past the per-unit ablation
    "burn_raise": """
_SCRATCH = {}

def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    if "a" not in _SCRATCH:
        _SCRATCH["a"], _SCRATCH["b"] = torch.ones(64, 64), torch.empty(64, 64)
    exe(copy)(_SCRATCH["a"], _SCRATCH["b"])
    if not bool((_SCRATCH["b"] == 1.0).all()):
        raise RuntimeError("ablated")
    return y
""",
    "tuple": """
def solve(x, b):
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return (y,)
""",
    # tells timed calls apart by counting: the DSL through correctness (two rows of four), the ablations and the
    # audit (three calls), eager code from then on, i.e. in every timed call
    "eager_when_timed": """
_CALLS = [0]

def solve(x, b):
    _CALLS[0] += 1
    if _CALLS[0] > 11:
        return x * 2.0 + b
    y = torch.empty_like(x)
    exe(axpb)(x, b, y)
    return y
""",
}

FAST = GradeOptions(draws=5, warmup=1, min_timed=10, max_timed=20, rse_target=0.5, timing_cap_s=10,
                    call_timeout_s=60, start_timeout_s=180, host_gate=0.0, min_timing_s=0.0)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("problems")
    return load_problem_file(write_problem(root, "mlp_norm", "27_axpb", PROBLEM))


def _kernel(tmp_path: Path, name: str, body: str | None = None, header: str = HEADER) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(header + textwrap.dedent(body if body is not None else KERNELS[name]), encoding="utf-8")
    return path


def _gpu_kernel(tmp_path: Path, name: str, body: str | None = None) -> Path:
    """A kernel for the GPU (CUDA target): what the free check is for."""
    return _kernel(tmp_path, f"gpu_{name}", body if body is not None else KERNELS[name], AXPB_CUDA)


def test_correct_llvm_kernel_passes_with_timing_and_baseline(problem, tmp_path, monkeypatch):
    """Pins the whole pipeline: draws, comparison, ablation, audit, timing, eager baseline, speedup."""
    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert report.status == "passed", report.agent_text()
    # whole rows of timing.ROW draws, every one compared: 5 asked for, two rows of four checked
    assert report.draws_checked == 8 and report.launches_per_call == 1
    assert report.ablations == {"suppress": "outputs wrong: the DSL's values are required",
                                "randomize": "outputs wrong: the DSL's values are required",
                                "isolate": "nothing to isolate here (no CUDA allocator): not conclusive"}
    assert report.timing is not None and 10 <= report.timing.n <= 20 and report.timing.median_us > 0
    assert report.eager is not None and report.speedup == pytest.approx(
        report.eager.median_us / report.timing.median_us)
    assert report.rechecks >= 1
    assert report.isolation.get("limits", {}).get("core") == 0 and report.isolation.get("audit_hook") is True
    assert report.protocol == PROTOCOL and report.schema == "metakernel.grade/2"
    assert "status: passed" in report.agent_text()
    # The baseline is cached on disk: a second grade reuses it.
    assert list((tmp_path / "cache" / "baselines").glob("27-eager-*.json"))
    # Every timed draw carried a host probe; with the gate off every draw counts.
    t = report.timing
    assert t.draws == t.n and t.kept_share == 1.0 and t.all_median_us == t.median_us and t.host_gate == 0.0
    assert t.probe_fast_us > 0 and t.probe_median_us >= t.probe_fast_us
    # No CUDA kernels on a CPU: no GPU-only times, so no GPU-time speedup (never a made-up one).
    assert report.gpu_only_us is None and report.eager.gpu_only_us is None and report.speedup_gpu is None


def test_untimed_grade_checks_everything_but_time(problem, tmp_path, monkeypatch):
    """The development loop (`eval --no-timing`, `validate --gold --untimed`): every check that decides pass or
    reject still runs; nothing is timed and no baseline is measured, and the report says so."""
    from dataclasses import replace

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=replace(FAST, timed=False))
    assert (report.status, report.reason) == ("passed", "untimed") and "not timed" in report.message
    assert report.draws_checked == 8 and report.ablations and report.timing is None and report.eager is None
    assert "timing" not in report.phases_s and "baselines" not in report.phases_s
    assert not (tmp_path / "cache" / "baselines").exists()
    wrong = grade(problem, "tirx", _kernel(tmp_path, "zeros"), device="cpu", options=replace(FAST, timed=False))
    assert wrong.status == "wrong"


def test_default_host_gate_grades_end_to_end(problem, tmp_path, monkeypatch):
    """The protocol's gate (on by default) through a real grading: the candidate and the eager baseline are both
    timed on the draws taken at full host speed, sampling lasts at least min_timing_s, the wait is bounded."""
    from metakernel.grader.timing import replay_gate

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    defaults = GradeOptions()
    assert defaults.host_gate > 0 and defaults.min_timing_s > 0
    options = GradeOptions(**{**FAST.__dict__, "host_gate": defaults.host_gate, "min_timing_s": 0.5,
                              "host_gate_wait_s": 1.5, "max_timed": 100_000, "keep_draws": True})
    started = time.perf_counter()
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=options)
    assert report.status == "passed", report.agent_text()
    for t in (report.timing, report.eager):
        assert t is not None and t.host_gate == defaults.host_gate
        assert 0.5 <= t.wall_s <= 1.5 + 1.0, t.wall_s  # at least min_timing_s, at most the wait plus one draw
        assert t.n == round(t.kept_share * t.draws) or (t.kept_share < 1 and t.n == t.draws)
        assert t.n >= 1 and t.median_us > 0 and t.probe_fast_us > 0
        # keep_draws: every draw's time and probes are recorded, and replaying the gate gives the reported median
        assert t.per_draw is not None and all(len(v) == t.draws for v in t.per_draw.values())
        assert all(x is not None and x > 0 for k in ("probe_before_us", "probe_after_us")
                   for x in t.per_draw[k])
        assert t.per_draw["probe_us"] == [max(b, a) for b, a in zip(t.per_draw["probe_before_us"],
                                                                      t.per_draw["probe_after_us"], strict=True)]
        assert replay_gate(t.per_draw, "probe", t.host_gate) == (pytest.approx(t.median_us), t.n)
    assert report.speedup == pytest.approx(report.eager.median_us / report.timing.median_us)
    assert time.perf_counter() - started < 120


def test_gate_variants_replays_every_gate_over_recorded_draws(tmp_path):
    """scripts/gate_variants.py on two gradings of a two-state host: without a gate the medians follow the mix of
    fast and slow draws and disagree; a gate on the probe makes them agree on the fast host's time."""
    import json
    import subprocess
    import sys

    def grading(fast_share: float, seed: int) -> dict:
        import random

        rng = random.Random(seed)
        per = {"event_us": [], "probe_us": [], "probe_before_us": [], "probe_torch_us": []}
        for _ in range(300):
            slow = rng.random() >= fast_share
            jitter = 1 + rng.uniform(-0.01, 0.01)
            per["event_us"].append((200.0 if slow else 100.0) * jitter)
            per["probe_us"].append((50.0 if slow else 27.0) * jitter)
            per["probe_before_us"].append(27.0 * jitter)  # a probe blind to the state: no gate can use it
            per["probe_torch_us"].append((90.0 if slow else 50.0) * jitter)
        return {"per_draw": per}

    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"solutions": {"k": {"runs": [grading(0.7, 1), grading(0.3, 2)]}}}))
    out = tmp_path / "variants.json"
    done = subprocess.run([sys.executable, "scripts/gate_variants.py", str(report), "--out", str(out)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    rows = {(r["probe"], r["gate"]): r for r in json.loads(out.read_text())["variants"]}
    assert rows[("probe", 0.0)]["median_diff"] > 0.3  # ungated: one grading mostly fast, the other mostly slow
    for probe in ("probe", "probe_torch"):
        assert rows[(probe, 0.15)]["median_diff"] < 0.02 and rows[(probe, 0.15)]["within_2pct"] == 1
    assert rows[("probe_before", 0.15)]["median_diff"] > 0.3
    assert "| probe | 1 | 0.15 | all | 1 | 1 |" in done.stdout


def test_gate_variants_rolling_window_and_shared_reference():
    """A speed state lasts many draws while one probe is noisy: a rolling median of the probe tells the states
    apart where single probes do not; a shared reference denies the fast label to a grading that never reached
    the other's fast level (it then counts every draw)."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from gate_variants import variants

    def grading(fast_share, seed, fast=(27.0, 100.0), slow=(34.0, 130.0), noise=0.45, block=40, n=400):
        rng = random.Random(seed)
        fast_blocks = set(rng.sample(range(n // block), round(n // block * fast_share)))
        per = {"event_us": [], "probe_us": []}
        for i in range(n):
            probe, event = fast if i // block in fast_blocks else slow
            per["event_us"].append(event * (1 + rng.uniform(-0.01, 0.01)))
            per["probe_us"].append(probe * (1 + rng.uniform(-noise, noise)))
        return {"per_draw": per}

    noisy = {"k": {"runs": [grading(0.7, 1), grading(0.3, 2)]}}
    rows = {r["window"]: r for r in variants(noisy, probes=("probe",), gates=(0.15,), windows=(1, 25))}
    assert rows[1]["median_diff"] > 0.1 and rows[25]["median_diff"] < 0.02

    never_fast = {"k": {"runs": [grading(0.5, 3, noise=0.01),
                                 grading(0.5, 4, fast=(33.0, 120.0), slow=(50.0, 200.0), noise=0.01)]}}
    own, shared = (variants(never_fast, probes=("probe",), gates=(0.15,), shared_ref=ref)[0] for ref in (False, True))
    assert own["median_counted"] == 200 and shared["median_counted"] == 300  # (200 + 400) / 2: every draw counts


def test_gpu_time_speedup_is_shown_to_the_agent():
    from metakernel.grader.report import GradeReport, Timing

    eager = Timing(median_us=900.0, mean_us=900.0, stdev_us=1.0, min_us=899.0, n=50, rse=0.001,
                   host_median_us=950.0, wall_s=0.1, gpu_only_us=600.0)
    report = GradeReport(problem={"number": 27}, dsl="tirx", kernel_sha256="0" * 64, device="cuda", scale="full",
                         status="passed", timing=eager, eager=eager, speedup=1.0, gpu_only_us=150.0,
                         speedup_gpu=4.0)
    assert "GPU kernel time alone: eager 600.0 us vs 150.0 us -> 4.000x" in report.agent_text()


def test_gpu_only_time_profiles_more_draws_only_when_the_work_varies(problem):
    """Stands in for the GPU profiler (absent on CPU): per-call kernel times from the draws the grader sent."""
    from metakernel.grader import timing

    def child(vary):
        def send(count):
            if vary is None:
                raise RuntimeError("boom")
            draws = [problem.make_inputs(device="cpu", scale="small") for _ in range(count)]
            spread = [float(d[0].float().std()) if vary else 1.0 for d in draws]
            per_call = sum(100.0 * s for s in spread) / count
            return {"ok": True, "kernels": [("gemm", 0.75 * per_call), ("norm", 0.25 * per_call)],
                    "kernel_names": ["gemm"], "units": [["gemm"], ["burn"]], "repeats": count}
        return send

    options = GradeOptions(profile_draws=24, profile_max_draws=48, profile_rse=0.005)
    fixed = timing.profile_kernels(child(False), options)
    assert fixed["repeats"] == 24 and fixed["rse"] == 0.0
    assert dict(fixed["kernels"]) == {"gemm": 75.0, "norm": 25.0}
    assert fixed["units"] == [("burn",), ("gemm",)]  # the per-unit ablation needs them (the H200 lost them once)
    strict = GradeOptions(profile_draws=24, profile_max_draws=48, profile_rse=1e-6)
    varying = timing.profile_kernels(child(True), strict)
    assert varying["repeats"] == 48 and 0 < varying["rse"] < 0.5
    with pytest.raises(RuntimeError, match="boom"):
        timing.profile_kernels(child(None), options)


@pytest.mark.parametrize("name, status, reason", [
    ("zeros", "wrong", "mismatch"),
    ("no_launch", "rule_violation", "no_dsl_launch"),
    ("unused", "rule_violation", "dsl_unused"),
    ("token", "rule_violation", "dsl_token"),
    ("token_after_launch", "rule_violation", "dsl_token"),
    ("cached", "wrong", "mismatch"),
    ("mutates", "rule_violation", "input_mutated"),
    ("dtype", "wrong", "structure"),
    ("dtype_unknown", "rule_violation", "output_type"),  # not our error (infra_error) because we cannot carry it
    ("tuple", "wrong", "structure"),
    ("raises", "runtime_error", "exception"),
    ("eager_when_timed", "rule_violation", "no_dsl_launch"),
])
def test_wrong_kernels_get_their_reason(problem, tmp_path, name, status, reason):
    report = grade(problem, "tirx", _kernel(tmp_path, name), device="cpu",
                   options=GradeOptions(**{**FAST.__dict__, "baselines": False}))
    assert (report.status, report.reason) == (status, reason), report.agent_text()
    assert report.agent_text().startswith(f"status: {status}")


def test_a_traceback_names_the_user_s_own_file(problem, tmp_path):
    """The child runs a copy of the kernel in its sandbox; the agent is shown its own file's path and line."""
    report = dry_run(problem, "tirx", _kernel(tmp_path, "my_attempt_7", KERNELS["raises"]))
    assert report.status == "runtime_error", report.agent_text()
    assert f'File "{tmp_path / "my_attempt_7.py"}", line' in report.message and "mk-worker" not in report.message


def test_an_answer_an_earlier_dsl_launch_computed_is_not_a_token(problem, tmp_path):
    """A later launch handed what an earlier DSL launch of the same call wrote is that launch's work (on the H200
    the gold TIRx kernel of problem 45 was rejected: its finalising launch reads the expert_ids its routing launch
    wrote)."""
    report = grade(problem, "tirx", _kernel(tmp_path, "two_stage"), device="cpu",
                   options=GradeOptions(**{**FAST.__dict__, "baselines": False}))
    assert report.status == "passed", report.agent_text()


def test_hang_is_killed_and_the_parent_survives(problem, tmp_path):
    """A hanging solve ends as `timeout`; the next evaluation in the same parent works."""
    options = GradeOptions(**{**FAST.__dict__, "call_timeout_s": 8, "baselines": False})
    report = grade(problem, "tirx", _kernel(tmp_path, "hang"), device="cpu", options=options)
    assert (report.status, report.reason) == ("timeout", "timeout")
    again = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu",
                  options=GradeOptions(**{**FAST.__dict__, "baselines": False}))
    assert again.status == "passed"


SEGFAULT = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def wild(x_ptr: Tx.handle, y_ptr: Tx.handle):
    X = Tx.match_buffer(x_ptr, (64, 32), "float32")
    Y = Tx.match_buffer(y_ptr, (64, 32), "float32")
    for i, j in Tx.grid(64, 32):
        Y[i + 40000000, j] = X[i, j]


_EXE = []


def solve(x, b):
    if not _EXE:
        _EXE.append(tvm.compile(wild, target="llvm", tir_pipeline="tirx"))
    y = torch.empty_like(x)
    _EXE[0](x, y)
    return y
'''


def test_wild_write_crashes_the_child_not_the_parent(problem, tmp_path):
    """An out-of-bounds write kills the candidate process (SIGSEGV); the parent reports runtime_error."""
    path = tmp_path / "wild.py"
    path.write_text(SEGFAULT, encoding="utf-8")
    report = grade(problem, "tirx", path, device="cpu", options=GradeOptions(**{**FAST.__dict__,
                                                                                "baselines": False}))
    assert report.status == "runtime_error" and report.reason == "crash", report.agent_text()
    assert "SIGSEGV" in report.message or "signal" in report.message


def test_bad_files_get_reports_not_tracebacks(problem, tmp_path):
    """Does not parse / over 300 KB / no solve / import-time error: a report saying exactly that."""
    cases = {
        "syntax": ("def solve(:\n", "compile_error", "does not parse"),
        "big": ("import tvm\n" + "#" * 310_000 + "\ndef solve(x, b):\n    return x\n", "rule_violation", "300 KB"),
        "nosolve": ("import tvm\n\ndef other():\n    pass\n", "compile_error", "no top-level solve"),
        "importerr": ("import tvm\nraise ValueError('boom at import')\n\ndef solve(x, b):\n    return x\n",
                      "compile_error", "boom at import"),
    }
    for name, (text, status, needle) in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        report = grade(problem, "tirx", path, device="cpu", options=FAST)
        assert report.status == status and needle in report.message, (name, report.agent_text())
        assert "metakernel/grader" not in report.message, "harness frames leaked into the agent's text"


def test_dry_run_intercepts_and_checks_structure(problem, tmp_path):
    ok = dry_run(problem, "tirx", _gpu_kernel(tmp_path, "correct"))
    assert ok.status == "passed" and ok.launches_per_call == 1, ok.agent_text()
    bad = dry_run(problem, "tirx", _gpu_kernel(tmp_path, "tuple"))
    assert (bad.status, bad.reason) == ("wrong", "structure")
    none = dry_run(problem, "tirx", _gpu_kernel(tmp_path, "no_launch"))
    assert (none.status, none.reason) == ("rule_violation", "no_dsl_launch")


def test_the_check_refuses_llvm_code_of_the_kernels_own(problem, tmp_path):
    """Where the kernel is for the GPU (the check, GPU gradings), LLVM builds only TVM's argument glue: host code
    of the candidate's own would read and write the child's memory below every Python-level layer (the red team
    rebound the timing clock that way). A CPU grading runs llvm kernels by design (the tests above)."""
    for name, text in (("llvm_kernel", HEADER + KERNELS["correct"]),
                       ("llvm_beside", AXPB_CUDA + LLVM_BESIDE + KERNELS["correct"])):
        path = tmp_path / f"{name}.py"
        path.write_text(text, encoding="utf-8")
        report = dry_run(problem, "tirx", path)
        assert (report.status, report.reason) == ("rule_violation", "sandbox"), report.agent_text()
        assert "host code that accesses buffer" in report.message, report.agent_text()
    from metakernel.dsl.tirx_host import RAW_MEMORY, host_problem, source_problem

    assert "tirx.tvm_struct_set" in RAW_MEMORY and source_problem(None) is None and host_problem(None) is None


#: An llvm-target function built at import beside a CUDA kernel (the red team's route to raw memory).
LLVM_BESIDE = '''

@Tx.prim_func
def peek(b_ptr: Tx.handle, a_ptr: Tx.handle):
    B = Tx.match_buffer(b_ptr, (1,), "int64")
    A = Tx.match_buffer(a_ptr, (2,), "int64")
    A[1] = B[A[0]]


_PEEK = tvm.compile(peek, target="llvm", tir_pipeline="tirx")
'''


def _two_state_host(fast_share: float):
    """Replies of a host that is fast (10 us calls, 30 us probes) a given share of the time, else 2x slower."""
    import random

    rng = random.Random(7)

    def call(i: int) -> dict:
        slow = rng.random() >= fast_share
        jitter = 1 + rng.uniform(-0.02, 0.02)
        return {"event_s": (20e-6 if slow else 10e-6) * jitter, "host_s": 11e-6, "wall_s": 1e-3,
                "probe_s": (60e-6 if slow else 30e-6) * jitter}
    return call


@pytest.mark.parametrize("fast_share", [0.8, 0.3])
def test_host_gate_reports_the_fast_host_median_whatever_the_mix(fast_share):
    from metakernel.grader.timing import measure

    def run(gate: float):
        return measure(_two_state_host(fast_share), warmup=0, min_timed=50, max_timed=400, rse_target=0.005,
                       cap_s=10, flush=False, gate=gate)

    (gated, flags), (ungated, _) = run(0.15), run(0.0)
    assert gated.median_us == pytest.approx(10.0, rel=0.03) and gated.n >= 50 and not flags
    assert gated.kept_share == pytest.approx(fast_share, abs=0.1) and gated.probe_fast_us == pytest.approx(30, rel=0.03)
    # without the gate the median follows the mix: fast when the host was mostly fast, slow otherwise
    assert ungated.median_us == pytest.approx(10.0 if fast_share > 0.5 else 20.0, rel=0.05)
    assert ungated.kept_share == 1.0 and gated.all_median_us == pytest.approx(ungated.median_us, rel=0.05)


def test_host_gate_flags_too_few_fast_draws_and_ignores_missing_probes():
    import time

    from metakernel.grader.timing import kept_indices, measure

    host = _two_state_host(0.3)

    def slow_call(i: int) -> dict:
        time.sleep(0.002)  # the gate samples until the time cap when too few draws are fast
        return host(i)

    timing, flags = measure(slow_call, warmup=0, min_timed=50, max_timed=60, rse_target=0.005, cap_s=0.1,
                            flush=False, gate=0.15)
    assert timing.draws > timing.n and timing.n < 50 and any("full host speed" in f for f in flags)
    assert kept_indices([30e-6, None, 60e-6], 0.15, 3) == [0, 1, 2]  # a reply without a probe: every draw counts


def test_host_gate_reference_level_catches_a_grading_that_never_met_the_fast_state():
    from metakernel.grader.timing import kept_indices, measure, timing_stats

    always_slow = _two_state_host(0.0)
    # Alone, the gate takes the slow level for the fast one and counts every draw.
    alone, _ = measure(always_slow, warmup=0, min_timed=50, max_timed=100, rse_target=0.005, cap_s=10,
                       flush=False, gate=0.15)
    assert alone.median_us == pytest.approx(20.0, rel=0.05) and alone.kept_share == 1.0
    # With the host's fast level known beforehand no draw counts: the median over all is reported and flagged.
    probes = [always_slow(i)["probe_s"] for i in range(100)]
    assert kept_indices(probes, 0.15, 100, fast_ref_s=30e-6) == []
    none_fast = timing_stats([20e-6] * 100, [11e-6] * 100, 1.0, False, probes, 0.15, fast_ref_s=30e-6)
    assert none_fast.n == 100 and none_fast.kept_share == 0.0 and none_fast.probe_fast_us == pytest.approx(30.0)
    # A mostly slow grading with the reference level reports the fast host's median.
    gated, flags = measure(_two_state_host(0.2), warmup=0, min_timed=50, max_timed=100, rse_target=0.005, cap_s=10,
                           flush=False, gate=0.15, fast_ref_s=30e-6)
    assert gated.median_us == pytest.approx(10.0, rel=0.03) and gated.n >= 50 and not flags


def test_a_grader_bug_is_an_infra_error_not_a_crash(problem, tmp_path, monkeypatch):
    """A harness exception (on the H200 the audit once met a dtype torch cannot sort) ends that grading as
    infra_error/harness, never charged to the kernel, and the next grading still works."""
    from metakernel.grader import evaluate

    def broken(self, position=None):
        raise NotImplementedError('"sort" not implemented for \'Float8_e4m3fn\'')

    monkeypatch.setattr(evaluate.Evaluation, "audit", broken)
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert (report.status, report.reason) == ("infra_error", "harness"), report.agent_text()
    assert "Float8_e4m3fn" in report.message and report.isolation
    monkeypatch.undo()
    assert grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST).status == "passed"


def test_the_audit_sends_an_argument_the_launch_left_alone_once(problem, tmp_path):
    """The audit's copies: x is read by the launch and left alone, so its copy after the launch is the one sent
    before it (one blob, one spec); y is written, so both are sent. Problem 34's backward kernels spent 19 s sending
    such duplicates at 682b56c."""
    from metakernel.expected import compute_expected
    from metakernel.grader.evaluate import Evaluation

    ev = Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cpu", FAST)
    try:
        ev.start()
        inputs = ev.draw()
        sizes = sorted({t.nbytes for t in compute_expected(problem, inputs).reference.values()})
        reply, _, _ = ev.call(inputs, mode="audit", audit_bytes=sizes)
        (record,) = reply["audited"]
        assert len(record["before"]) == 2, record  # x and y: the output's size (b is smaller)
        same = [before == after for before, after in zip(record["before"], record["after"], strict=True)]
        assert sorted(same) == [False, True], record
        assert len({spec["cpu"] for spec in record["before"] + record["after"]}) == 3  # x once, y before and after
    finally:
        if ev.worker is not None:
            ev.worker.close()


@pytest.fixture
def started_ahead(monkeypatch, tmp_path):
    """The children gradings start in the background (StartingWorker), recorded in order; a fresh baseline cache."""
    from metakernel.grader import evaluate

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    made = []

    class Recorded(evaluate.StartingWorker):
        def __init__(self, worker):
            made.append(self)
            super().__init__(worker)

    monkeypatch.setattr(evaluate, "StartingWorker", Recorded)
    return made


def test_the_eager_child_starts_early_and_is_stopped_when_the_grading_ends_before_its_baseline(problem, tmp_path,
                                                                                                started_ahead):
    """A grading that will measure its problem's eager baseline starts that clean child before its correctness
    phase; one that ends early (a wrong kernel) stops it without waiting for it, and a cached baseline starts none."""
    made = started_ahead
    wrong = grade(problem, "tirx", _kernel(tmp_path, "zeros"), device="cpu", options=FAST)
    assert wrong.status == "wrong" and len(made) == 1 and made[0].worker.kind == "eager"
    deadline = time.monotonic() + 120
    child = made[0].worker
    while (child.conn is not None or child.proc is None or child.proc.poll() is None) and time.monotonic() < deadline:
        time.sleep(0.2)  # stopped in the background
    assert child.conn is None and child.proc.poll() is not None
    passed = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert passed.status == "passed" and passed.eager is not None and len(made) == 2  # measured by that child
    assert made[1].worker.conn is None  # used and closed
    again = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert again.status == "passed" and len(made) == 2  # cached: no child


def test_an_eager_child_that_failed_to_start_for_our_reasons_is_an_infra_error(problem, tmp_path, monkeypatch):
    """Not a pass without a baseline: the grading is the grader's failure, as when the child started in line."""
    from metakernel.grader import worker

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    real = worker.Worker.start

    def start(self):
        if self.kind == "eager":
            raise RuntimeError("no GPU memory left for the arenas")
        return real(self)

    monkeypatch.setattr(worker.Worker, "start", start)
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert (report.status, report.reason) == ("infra_error", "harness"), report.agent_text()
    assert "arenas" in report.message


def test_running_out_of_memory_is_the_grader_s_fault_while_the_grader_holds_the_gpu(problem, tmp_path, monkeypatch):
    """On an 80 GB H100 gold kernels ran out of GPU memory while the grading process held 62-77 GB: that is an
    infra_error (never charged). With the grader holding little, or the kernel holding and asking for more than half
    the card, running out of memory stays the kernel's failure. Only the child allocator's own account of the failed
    request counts (`oom`: [bytes asked, bytes held]); the message is the file's to write. (The GPU's memory is a
    double here: there is none on this machine.)"""
    from metakernel.grader import evaluate

    words = "solve raised:\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.13 GiB."
    fair = [int(4.13 * 2**30), 6 << 30]
    ev = evaluate.Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cuda", FAST)

    def verdict(message, oom=None, status="runtime_error"):
        with pytest.raises(evaluate._Done):
            ev.end(status, "exception", message, oom=oom)
        return ev.report.status, ev.report.reason

    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: (62 << 30, 80 << 30))
    assert verdict(words, fair) == ("infra_error", "grader_memory")
    assert "62.0 of the GPU's 80 GiB" in ev.report.message and "4.13 GiB" in ev.report.message
    assert verdict("solve raised:\nValueError: shapes", fair) == ("infra_error", "grader_memory")  # (its own words)
    assert verdict(words) == ("runtime_error", "exception")  # words without the allocator's account: the file's
    assert verdict(words, [1 << 30, 40 << 30]) == ("runtime_error", "exception")  # it held half the card itself
    assert verdict(words, [41 << 30, 0]) == ("runtime_error", "exception")  # it asked for more than half
    assert verdict(words, fair, status="rule_violation") == ("rule_violation", "exception")
    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: (3 << 30, 80 << 30))
    assert verdict(words, fair) == ("runtime_error", "exception")  # the grader held little: the kernel's


def test_where_the_driver_reports_the_kernel_s_process_its_whole_use_decides(problem, tmp_path, monkeypatch):
    """With NVML's per-process account of the child's tree (every allocator, not only torch's): a kernel within half
    the card whose small request failed ran out beside someone else's memory (another grading's child held 47 GB
    when gold 51 TIRx ran out on an H100), the machine's fault even where the grader itself held little; one whose
    process used more than half (a TVM allocation, say) is charged. (NVML and the GPU are doubles here.)"""
    from metakernel.grader import evaluate

    ev = evaluate.Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cuda", FAST)
    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: (3 << 30, 80 << 30))
    small = [int(1.49 * 2**30), 25 << 20]
    for tree, expected in ((1 << 30, ("infra_error", "grader_memory")), (45 << 30, ("runtime_error", "exception")),
                           (None, ("runtime_error", "exception"))):
        monkeypatch.setattr(evaluate, "tree_gpu_bytes", lambda pid, tree=tree: tree)
        with pytest.raises(evaluate._Done):
            ev.end("runtime_error", "exception", "solve raised: ...", oom=small)
        assert (ev.report.status, ev.report.reason) == expected, (tree, ev.report.message)


def test_a_kernel_that_fills_the_card_is_charged_for_the_grader_s_own_failure(problem, tmp_path, monkeypatch):
    """A file that holds most of the card makes the grader's next allocation fail: that read infra_error/harness
    (never charged). Where the driver shows the child's tree above half the card it is the kernel's."""
    from metakernel.grader import evaluate

    ev = evaluate.Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cuda", FAST)
    ev.worker = SimpleNamespace(proc=SimpleNamespace(pid=os.getpid(), poll=lambda: None))  # type: ignore[assignment]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (1 << 30, 80 << 30))
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.13 GiB")
    monkeypatch.setattr(evaluate, "tree_gpu_bytes", lambda pid: 60 << 30)
    assert "60.0 of the GPU's 80 GiB" in (ev.kernel_held_the_card(oom) or "")
    assert ev.kernel_held_the_card(ValueError("shapes")) is None  # only the grader's out-of-memory errors
    monkeypatch.setattr(evaluate, "tree_gpu_bytes", lambda pid: 10 << 30)
    assert ev.kernel_held_the_card(oom) is None
    monkeypatch.setattr(evaluate, "tree_gpu_bytes", lambda pid: None)
    assert ev.kernel_held_the_card(oom) is None  # no driver account: the grader's, as before


def test_a_process_tree_is_found_through_proc():
    """The child in its own pid namespace runs the kernel in a forked grandchild: NVML lists that one."""
    from metakernel.grader.evaluate import process_tree

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert {parent.pid, grandchild} <= process_tree(parent.pid)
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_a_file_s_own_out_of_memory_words_are_the_kernel_s_failure(problem, tmp_path, monkeypatch):
    """A file that raises the allocator's words itself (session 33's second red-teamer), at import or in solve,
    while the grader holds most of the card, is charged for it: no allocator ran out (`oom` is None in the reply)."""
    from metakernel.grader import evaluate

    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: (62 << 30, 80 << 30))
    words = 'RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB")'
    in_solve = grade(problem, "tirx", _kernel(tmp_path, "forged_oom", f"def solve(x, b):\n    raise {words}\n"),
                     device="cpu", options=FAST)
    assert (in_solve.status, in_solve.reason) == ("runtime_error", "exception"), in_solve.agent_text()
    body = f"raise {words}\n\n\ndef solve(x, b):\n    return x\n"
    at_import = grade(problem, "tirx", _kernel(tmp_path, "forged_oom_import", body), device="cpu", options=FAST)
    assert at_import.status == "compile_error" and "out of memory" in at_import.message, at_import.agent_text()


def test_a_child_started_ahead_that_fails_for_our_reasons_is_an_infra_error(problem, tmp_path, monkeypatch):
    """A pool child whose start raised something other than a candidate failure (on the H100: no GPU memory left
    for its arenas) ended the grading in an AssertionError; it is an infra_error naming the cause."""
    from metakernel.grader import evaluate, worker

    def no_memory(self):
        raise RuntimeError("CUDA out of memory while allocating the arenas")

    monkeypatch.setattr(worker.Worker, "start", no_memory)
    kernel = _kernel(tmp_path, "correct")
    pending = evaluate.PendingWorker(problem, "tirx", kernel, "cpu", FAST)
    report = grade(problem, "tirx", kernel, device="cpu", options=FAST, prestarted=pending)
    assert (report.status, report.reason) == ("infra_error", "start"), report.agent_text()
    assert "allocating the arenas" in report.message


def test_a_child_started_ahead_that_ran_out_of_gpu_memory_is_started_again_alone(problem, tmp_path, monkeypatch):
    """On an H100 problem 25's TIRx gold failed its import with a CUDA out-of-memory error in a child started while
    the grading before it held the card, and was charged a compile_error. Such a child is started again in line;
    only that start's own failure is the kernel's."""
    from metakernel.grader import evaluate, worker

    real = worker.Worker.start
    starts, freed_first = [], []

    def start(self):
        starts.append(self)
        if len(starts) == 1:
            raise worker.WorkerFailure("compile_error", "torch.AcceleratorError: CUDA error: out of memory")
        freed_first.append(not starts[0].tmp.exists())  # let go of before the fresh child starts
        return real(self)

    monkeypatch.setattr(worker.Worker, "start", start)
    kernel = _kernel(tmp_path, "correct")
    ahead = evaluate.PendingWorker(problem, "tirx", kernel, "cpu", FAST)
    report = grade(problem, "tirx", kernel, device="cpu", options=FAST, prestarted=ahead)
    assert report.status == "passed" and len(starts) == 2, report.agent_text()
    assert freed_first == [True]

    def always(self):
        raise worker.WorkerFailure("compile_error", "torch.OutOfMemoryError: CUDA out of memory", oom=[1 << 30, 0])

    monkeypatch.setattr(worker.Worker, "start", always)
    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: None)  # no GPU held: the kernel's own doing
    again = grade(problem, "tirx", kernel, device="cpu", options=FAST,
                  prestarted=evaluate.PendingWorker(problem, "tirx", kernel, "cpu", FAST))
    assert (again.status, again.reason) == ("compile_error", "compile"), again.agent_text()
    monkeypatch.setattr(evaluate, "grader_gpu_bytes", lambda device: (40 << 30, 80 << 30))
    held = grade(problem, "tirx", kernel, device="cpu", options=FAST)
    assert (held.status, held.reason) == ("infra_error", "grader_memory"), held.agent_text()


def test_a_large_problem_s_eager_child_is_not_started_ahead(problem, tmp_path, monkeypatch, started_ahead):
    """Its arenas beside the candidate's and the timed draws ran the grader out of memory (problem 42 on an H100):
    above EAGER_AHEAD_ARENA_BYTES the baseline's child starts in line, after the candidate's timing."""
    from metakernel.grader import evaluate

    made = started_ahead
    monkeypatch.setattr(evaluate, "EAGER_AHEAD_ARENA_BYTES", 0)
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert report.status == "passed" and report.eager is not None and not made, report.agent_text()


def test_a_launch_the_outputs_do_not_depend_on_is_not_dsl_work(problem, tmp_path):
    """The per-unit ablation: a second compiled kernel that only burns time on scratch memory (to pad the DSL's
    share of the GPU time) is found idle; the kernel that computes the answer is required."""
    from metakernel.grader.evaluate import Evaluation, fresh_copies

    path = _kernel(tmp_path, "burn")
    ev = Evaluation(problem, "tirx", path, "cpu", FAST)
    try:
        ev.start()
        reply, _, _ = ev.call(ev.draw())
        units = [tuple(u) for u in reply["units"]]
        assert len(units) == 2 and all(units), units
        profiled, _ = ev.worker.exchange({"op": "profile", "poison": ev.poison_bytes, "pattern": 0xFF},
                                         [fresh_copies(problem, ev.draw())], 60.0)
        assert sorted(tuple(u) for u in profiled["units"]) == sorted(units)  # what Evaluation.profile reads
        kernels = [(name, 10.0) for unit in units for name in unit]
        idle = ev.unit_ablation(units, kernels, {name: "dsl" for name, _ in kernels})
        (burn,) = [u for u in units if set(u) & idle]
        assert set(burn) == idle, (units, idle, ev.report.ablations)
        texts = sorted(ev.report.ablations.values())
        assert any("still correct" in t for t in texts) and any("required" in t for t in texts), texts
    finally:
        if ev.worker is not None:
            ev.worker.close()


def test_a_file_that_fails_when_ablated_shows_no_dependence(problem, tmp_path):
    """A raise in an ablated call is no evidence that the outputs need the DSL's values: the position is ablated
    in the other mode too, and failing both ways is `dsl_unused` (it was read as "required")."""
    report = grade(problem, "tirx", _kernel(tmp_path, "raise_on_ablation"), device="cpu", options=FAST)
    assert (report.status, report.reason) == ("rule_violation", "dsl_unused"), report.agent_text()
    assert "no evidence" in report.message and "solve raised" in report.message, report.message


def test_an_honest_kernel_whose_one_ablation_crashes_passes_on_the_other(problem, tmp_path, monkeypatch):
    """Honest gathers with garbled indices can kill the process in one mode: the other mode, at the same position,
    shows the dependence (the crashed child is restarted)."""
    from metakernel.grader import evaluate

    real = evaluate.Evaluation._quiet_call
    modes: list[str] = []

    def crash_randomised(self, inputs, mode, **extra):
        modes.append(mode)
        if mode == "randomize":
            raise evaluate._Crashed("runtime_error")
        return real(self, inputs, mode, **extra)

    monkeypatch.setattr(evaluate.Evaluation, "_quiet_call", crash_randomised)
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST)
    assert report.status == "passed", report.agent_text()
    assert modes.count("suppress") == 4 and modes.count("randomize") == 2, modes  # each crash retried as suppress
    assert report.ablations["randomize"].startswith("randomised: the process failed"), report.ablations
    assert report.ablations["suppress"] == "outputs wrong: the DSL's values are required"


def test_a_burn_that_fails_when_ablated_is_caught_by_the_whole_call_ablation(problem, tmp_path):
    """A burn whose file raises when the burn's values change: the whole-call ablations ablate the burn too, so the
    file fails both ways there (`dsl_unused`). The per-unit ablation alone counts a unit that fails both ways (honest
    pipelines do: garbled schedules send the next units out of bounds), which hole 4's share bound covers."""
    from metakernel.grader.evaluate import Evaluation

    report = grade(problem, "tirx", _kernel(tmp_path, "burn_raise"), device="cpu", options=FAST)
    assert (report.status, report.reason) == ("rule_violation", "dsl_unused"), report.agent_text()
    ev = Evaluation(problem, "tirx", _kernel(tmp_path, "burn_raise"), "cpu", FAST)
    try:
        ev.start()
        reply, _, _ = ev.call(ev.draw())
        units = [tuple(u) for u in reply["units"]]
        kernels = [(name, 10.0) for unit in units for name in unit]
        idle = ev.unit_ablation(units, kernels, {name: "dsl" for name, _ in kernels})
        assert len(units) == 2 and not idle, (units, idle, ev.report.ablations)
        texts = sorted(ev.report.ablations.values())
        assert any("solve raised" in t and "failed both ways: counted as required" in t for t in texts), texts
    finally:
        if ev.worker is not None:
            ev.worker.close()


def test_the_profile_phase_discounts_an_idle_unit(problem, tmp_path, monkeypatch):
    """The wiring: the profile phase hands the units its requests saw to the per-unit ablation and marks the burn
    `dsl_idle`. The CPU profiler records no device kernels, so each unit's symbols get a stand-in time."""
    from metakernel.grader import evaluate

    real = evaluate.profile_kernels

    def with_times(send, options, row):
        reply = real(send, options, row)
        names = [name for unit in reply["units"] for name in unit]
        return {**reply, "kernels": [(name, 10.0) for name in names], "kernel_names": names}

    monkeypatch.setattr(evaluate, "profile_kernels", with_times)
    ev = evaluate.Evaluation(problem, "tirx", _kernel(tmp_path, "burn"), "cpu", FAST)
    try:
        ev.start()
        ev.profile()
        assert sorted(k["kind"] for k in ev.report.kernels) == ["dsl", "dsl_idle"], ev.report.kernels
        assert ev.report.dsl_share == 0.5
    finally:
        if ev.worker is not None:
            ev.worker.close()


SCALED_PROBLEM = """
def reference(x, b):
    return x * 2.0 + b

def make_inputs(device="cuda", scale="full"):
    rows = 4096 if scale == "full" else 64
    return [torch.randn(rows, 32, device=device), torch.randn(32, device=device)]

def roofline(x, b):
    return {"flops": 2 * x.numel(), "bytes": 4 * (2 * x.numel() + b.numel())}
"""


def test_the_check_compiles_the_full_scale_path_too(tmp_path):
    """The free check traces solve at the full-scale shapes (meta tensors): a branch only the GPU's shapes take is
    compiled before any paid submission; code that needs values there is reported as not covered."""
    scaled = load_problem_file(write_problem(tmp_path / "problems", "mlp_norm", "27_axpb_scaled", SCALED_PROBLEM))
    ok = dry_run(scaled, "tirx", _gpu_kernel(tmp_path, "correct"))
    assert ok.status == "passed" and "full scale (the GPU's shapes): 1 launch" in ok.message, ok.agent_text()
    broken = dry_run(scaled, "tirx", _gpu_kernel(tmp_path, "full_only_error", """
def solve(x, b):
    y = torch.empty_like(x)
    if x.shape[0] > 1000:  # the full-scale specialisation: a target this machine has not got
        tvm.compile(axpb, target="no-such-target", tir_pipeline="tirx")(x, b, y)
    else:
        exe(axpb)(x, b, y)
    return y
"""))
    assert broken.status != "passed" and "at the full-scale shapes" in broken.message, broken.agent_text()
    # TVM's error (its C++ frames become Python frames of files that do not exist, which call sys._getframe)
    # reaches the agent as the error, not as a sandbox refusal
    assert broken.reason != "sandbox" and "no-such-target" in broken.message, broken.agent_text()
    values = dry_run(scaled, "tirx", _gpu_kernel(tmp_path, "needs_values", """
def solve(x, b):
    y = torch.empty_like(x)
    if float(x.abs().max()) > 0:  # reads a value: a shape-only trace cannot
        exe(axpb)(x, b, y)
    return y
"""))
    assert values.status == "passed" and "full scale not covered" in values.message, values.agent_text()


def test_timing_stops_on_a_settled_median_despite_a_heavy_tail():
    """A few late draws (a preempted host) must not keep sampling going once the median has settled: on the H200
    the normal-theory estimate held 18 of 25 gold gradings at the full gate wait."""
    import random

    from metakernel.grader.timing import measure, median_rse

    rng = random.Random(7)

    def tailed(i: int) -> dict:
        late = rng.random() < 0.06
        t = (400e-6 if late else 100e-6) * (1 + rng.uniform(-0.01, 0.01))
        return {"event_s": t, "host_s": t, "wall_s": 1e-3}

    timing, _ = measure(tailed, warmup=0, min_timed=50, max_timed=400, rse_target=0.005, cap_s=10, flush=False)
    assert timing.n < 100 and timing.median_us == pytest.approx(100.0, rel=0.02)
    sd_based = 1.2533 * timing.stdev_us / timing.n ** 0.5 / timing.median_us
    assert timing.rse < 0.005 < sd_based  # the old estimate would not have stopped here
    # the body's spread still counts: a median over a wide distribution is not called settled
    wide = [rng.uniform(50, 150) for _ in range(50)]
    assert median_rse(wide, sorted(wide)[25]) > 0.02


def test_timed_calls_may_run_only_the_units_checked_calls_ran(problem, tmp_path):
    """A DSL function launched in most timed rows but in no checked one ran where nothing compared or attributed
    it; one that only a few timed rows launched (a rare honest branch) is flagged, not failed."""
    from metakernel.grader.evaluate import Evaluation, _Done

    ev = Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cpu", FAST)
    ev.units_checked = {("axpb_kernel",)}
    ev.timed_functions, ev.timed_rows = {"axpb_kernel": 40}, 40
    ev.check_timed_units()  # the same functions: fine
    assert not ev.report.integrity
    ev.timed_functions["rare_branch_kernel"] = 3
    ev.check_timed_units()
    assert "rare_branch_kernel" in ev.report.integrity[0] and ev.report.status != "rule_violation"
    ev.timed_functions["fast_path_kernel"] = 30
    with pytest.raises(_Done):
        ev.check_timed_units()
    assert (ev.report.status, ev.report.reason) == ("rule_violation", "timed_units")
    assert "fast_path_kernel" in ev.report.message and "30 of 40" in ev.report.message


def test_cute_specialisations_of_one_function_are_one_function():
    from metakernel.grader.kernels import function_of

    a = "kernel_cutlass_rmsnorm_kernel_tensorptrbf16gmemalign16o40961_tensorptrbf16gmem_0"
    b = "kernel_cutlass_rmsnorm_kernel_tensorptrbf16gmemalign16o81921_tensorptrbf16gmem_0"
    assert function_of(a) == function_of(b) == "rmsnorm_kernel" and function_of("axpb_kernel") == "axpb_kernel"


def test_a_row_calls_every_draw_and_says_how_each_call_went(problem, tmp_path):
    """One row request: every draw called in its own bracket, each call's time and launches in the reply; the
    sample is the mean of the calls after the first, which only warms the host (protocol 5) and is reported apart."""
    from metakernel.grader.evaluate import Evaluation
    from metakernel.grader.timing import ROW

    ev = Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cpu", FAST)
    try:
        ev.start()
        draws = [ev.draw() for _ in range(ROW)]
        reply, views = ev._row("row", draws, "test")
        each = reply["host_each_s"]
        assert reply["repeats"] == ROW - 1 and len(each) == ROW and reply["launches_each"] == [1] * ROW
        assert reply["first_s"] == each[0] and reply["event_s"] == pytest.approx(sum(each[1:]) / (ROW - 1))
        assert len(views) == ROW and reply["wall_s"] >= sum(each)
        assert reply["unmask_s"] == 0.0  # CPU draws cross by value, unmasked
        for k, spec in enumerate(reply["outs"]):
            x, b = draws[k]
            assert torch.allclose(ev.worker.outputs(spec, reply["_blobs"]), 2.0 * x + b)
    finally:
        if ev.worker is not None:
            ev.worker.close()


def test_the_mask_of_a_later_draw_is_keyed_and_the_same_in_another_process():
    """The parent masks a row's later draws and the child unmasks them with the same keyed stream: it must be the
    same bytes in two processes, differ by key, and XOR twice to the original."""
    import subprocess
    import sys

    from metakernel.grader.transport import mask_stream

    key = 0x1234_5678_9ABC
    here = mask_stream(4096, key, "cpu")
    there = subprocess.run([sys.executable, "-c", "import sys; from metakernel.grader.transport import mask_stream; "
                            f"sys.stdout.buffer.write(mask_stream(4096, {key}, 'cpu').numpy().tobytes())"],
                           capture_output=True, check=True).stdout
    assert here.numpy().tobytes() == there
    assert not torch.equal(here, mask_stream(4096, key + 1, "cpu"))
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    masked = data ^ here
    assert (masked == data).float().mean() < 0.05 and torch.equal(masked ^ here, data)


def test_ablations_and_the_audit_hide_their_call_in_a_row(problem, tmp_path):
    """A one-draw request was told apart from a row by what the rest of the input arena held (a red-teamer's
    `rt_tirx_lone_draw_zeroed_arena`): the ablations and the audit now send rows of timing.ROW fresh draws, their
    own call at each position in turn; only that call runs in their mode and only its outputs come back."""
    from metakernel.grader.evaluate import Evaluation
    from metakernel.grader.timing import ROW

    ev = Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cpu", FAST)
    sent: list[dict] = []
    try:
        ev.start()
        real = ev.worker.exchange

        def spy(msg, draws, timeout):
            sent.append({**msg, "count": len(draws)})
            return real(msg, draws, timeout)

        ev.worker.exchange = spy
        ev.correctness()
        ev.ablation()
        ev.audits()
        ev.isolation()
        assert ev.report.ablations == {"suppress": "outputs wrong: the DSL's values are required",
                                       "randomize": "outputs wrong: the DSL's values are required",
                                       "isolate": "nothing to isolate here (no CUDA allocator): not conclusive"}
        focused = [m for m in sent if m.get("mode", "run") != "run"]
        assert all(m["op"] == "row" and m["count"] == ROW and 0 <= m["focus"] < ROW for m in focused)
        # a kernel can tell a call's position in its row: the ablations and the audit each meet every position
        ablated = [m for m in focused if m["mode"] in ("suppress", "randomize")]
        assert sorted(m["focus"] for m in ablated) == list(range(ROW))
        assert sorted(m["mode"] for m in ablated) == ["randomize"] * (ROW // 2) + ["suppress"] * (ROW - ROW // 2)
        assert sorted(m["focus"] for m in focused if m["mode"] == "audit") == list(range(ROW))
        assert sorted(m["focus"] for m in focused if m["mode"] == "isolate") == list(range(ROW))
        assert all(m["op"] == "row" and m["count"] == ROW for m in sent)  # every request has the same shape
        # the focus call alone is suppressed: its outputs are garbage, the row's other calls launched as usual
        x, b = ev.draw()
        positions = set()
        for _ in range(12):
            reply, seen = ev._focus([x, b], "suppress")
            positions.add(sent[-1]["focus"])
            assert reply["ok"] and reply["launches_each"] == [1] * ROW and reply["launches"] == 1
            assert not torch.allclose(ev.worker.outputs(reply["out"], reply["_blobs"]), 2.0 * x + b)
            assert torch.equal(seen[0], x)
        reply, _ = ev._focus([x, b], "run")
        assert torch.allclose(ev.worker.outputs(reply["out"], reply["_blobs"]), 2.0 * x + b)
        assert len(positions) > 1  # 4 ** -11 that twelve draws of the position agree
    finally:
        if ev.worker is not None:
            ev.worker.close()


def test_gradings_side_by_side_keep_their_verdicts_and_time_alone(problem, tmp_path, monkeypatch):
    """`grade(share=...)` (the validation's lanes): two gradings at once, a passing and a wrong one, reach the same
    verdicts as alone, and the passing one's timed phases ran while the other held no phase."""
    from metakernel.grader.sharing import GpuShare

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))

    class Watched(GpuShare):
        def __init__(self) -> None:
            super().__init__()
            self.inside: dict[str, int] = {"untimed": 0, "timed": 0}
            self.crowded: list[dict[str, int]] = []  # phases held by others while a timed phase ran

        def _watch(self, phase, kind):
            from contextlib import contextmanager

            @contextmanager
            def watched():
                with phase:
                    self.inside[kind] += 1
                    if kind == "timed" and sum(self.inside.values()) > 1:
                        self.crowded.append(dict(self.inside))
                    try:
                        yield
                    finally:
                        if kind == "timed" and sum(self.inside.values()) > 1:
                            self.crowded.append(dict(self.inside))
                        self.inside[kind] -= 1
            return watched()

        def untimed(self):
            return self._watch(super().untimed(), "untimed")

        def timed(self):
            return self._watch(super().timed(), "timed")

    share = Watched()
    reports = {}

    def one(name: str) -> None:
        reports[name] = grade(problem, "tirx", _kernel(tmp_path, name), device="cpu", options=FAST, share=share)

    import threading

    threads = [threading.Thread(target=one, args=(name,)) for name in ("correct", "zeros")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert reports["correct"].status == "passed", reports["correct"].agent_text()
    assert reports["zeros"].status == "wrong", reports["zeros"].agent_text()
    assert share.crowded == []
    assert reports["correct"].phases_s["share_wait"] >= 0 and reports["correct"].timing is not None


def test_a_dsl_symbol_named_like_a_library_kernel_is_refused(problem, tmp_path, monkeypatch):
    """Session 24's red-teamer declared cuBLAS's kernel names as TIRx's (free-text device source), so cuBLAS's
    GEMMs counted as DSL time. Whatever the route, a DSL symbol that reads as a library kernel is a verdict."""
    from metakernel.grader import evaluate

    reply = {"kernels": [("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", 80.0), ("silu_mul_kernel", 8.0)],
             "kernel_names": ["nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "silu_mul_kernel"],
             "units": [], "repeats": 24, "rse": 0.001}
    monkeypatch.setattr(evaluate, "profile_kernels", lambda send, options, row: reply)
    ev = evaluate.Evaluation(problem, "tirx", _kernel(tmp_path, "correct"), "cpu", FAST)
    ev.worker = types.SimpleNamespace(slots=4)  # the profile request is replaced above: no child is asked
    with pytest.raises(evaluate._Done):
        ev.profile()
    assert (ev.report.status, ev.report.reason) == ("rule_violation", "foreign_kernel")
    assert "nvjet_hsh" in ev.report.message


def test_a_warm_child_imports_a_kernel_handed_to_it_after_its_start(problem, tmp_path, monkeypatch):
    """DESIGN 8's pool: a child started before its kernel exists (sandbox, arenas, DSL) grades the file it is
    handed later, as a child started with it would; a file that does not import costs its compile error."""
    from metakernel.grader.evaluate import WarmWorker

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    warm = WarmWorker(problem, "tirx", "cpu", FAST)
    warm.wait()
    assert warm.worker.ready.get("warm") and warm.worker.path is None  # no kernel in it yet
    kernel = _kernel(tmp_path, "correct")
    report = grade(problem, "tirx", kernel, device="cpu", options=FAST, prestarted=warm)
    assert report.status == "passed", report.agent_text()
    assert warm.worker.ready.get("import_s") is not None and warm.worker.path.name == kernel.name

    broken = _kernel(tmp_path, "broken", "def solve(x, b):\n    return (\n")
    again = WarmWorker(problem, "tirx", "cpu", FAST)
    failed = grade(problem, "tirx", broken, device="cpu", options=FAST, prestarted=again)
    assert failed.status == "compile_error", failed.agent_text()


def test_a_warm_child_of_another_variant_is_let_go_not_used(problem, tmp_path, monkeypatch):
    from dataclasses import replace

    from metakernel.grader.evaluate import WarmWorker

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    other = WarmWorker(problem, "tirx", "cpu", replace(FAST, draws=6))
    report = grade(problem, "tirx", _kernel(tmp_path, "correct"), device="cpu", options=FAST, prestarted=other)
    assert report.status == "passed", report.agent_text()
    assert other.worker.path is None and not other.worker.tmp.exists()  # never handed the kernel; stopped


def test_the_local_executor_warms_a_child_for_the_next_submission(problem, tmp_path, monkeypatch):
    """After each grading, still holding the slot, `LocalExecutor` starts a child for the same variant; the next
    submission's grading takes it, and closing the executor stops what is left."""
    import asyncio

    from metakernel.executor import LocalExecutor

    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    executor = LocalExecutor(device="cpu", options=FAST)

    async def session():
        first = await executor.grade(problem, "tirx", _kernel(tmp_path, "correct"))
        await executor._slots.drain()
        assert len(executor._warm) == 1
        waiting = executor._warm[0]
        second = await executor.grade(problem, "tirx", _kernel(tmp_path, "zeros"))
        used = waiting.worker.path is not None and waiting.worker.path.name == "zeros.py"
        await executor.close()
        return first, second, used, waiting

    first, second, used, waiting = asyncio.run(session())
    assert first.report.status == "passed" and second.report.status == "wrong", second.report.agent_text()
    assert used and executor._warm == [] and not waiting.worker.tmp.exists()


def test_no_thread_empties_the_cache_while_another_allocates_into_a_private_pool(monkeypatch):
    """Validation lanes aborted the process twice (sessions 24 and 26: torch's INTERNAL ASSERT
    `captures_underway.empty()` in `~MemPool`): one thread destroyed a pool or emptied the cache while another was
    inside `use_mem_pool`. Torch's CUDA calls are stand-ins here (no GPU in CI); what is tested is our lock."""
    import contextlib
    import threading
    import time

    import torch

    from metakernel.grader import transport

    inside = threading.Event()
    events: list[str] = []

    class Pool:
        pass

    @contextlib.contextmanager
    def use_mem_pool(pool):
        events.append("enter")
        inside.set()
        time.sleep(0.2)  # another thread tries to empty the cache meanwhile
        yield
        events.append("exit")

    monkeypatch.setattr(torch.cuda, "MemPool", Pool, raising=False)
    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool, raising=False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty"))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: torch.zeros(1, dtype=torch.uint8))
    lane = threading.Thread(target=transport.allocate_arena, args=(1 << 20,))
    lane.start()
    assert inside.wait(5)
    transport.release_cache()
    lane.join()
    assert events == ["enter", "exit", "empty"], events


#: y = 2x + b computed eagerly and copied by a TIRx kernel handed both buffers as integer addresses (session 29's
#: red-teamer): the launch gate sees no tensor, so neither the audit nor the randomise ablation can look at it.
ADDRESS_COPY = '''
import torch
import tvm
from tvm.script import tirx as Tx


@Tx.prim_func
def copy(src: Tx.int64, dst: Tx.int64, total: Tx.int32):
    S = Tx.decl_buffer((total,), "float32", data=Tx.reinterpret("handle", src))
    D = Tx.decl_buffer((total,), "float32", data=Tx.reinterpret("handle", dst))
    for i in range(total):
        D[i] = S[i]


_EXE = {}


def solve(x, b):
    if "f" not in _EXE:
        _EXE["f"] = tvm.compile(copy, target=tvm.target.Target("llvm"), tir_pipeline="tirx")
    answer = (x * 2.0 + b).contiguous()
    out = torch.zeros_like(answer)
    _EXE["f"](answer.data_ptr(), out.data_ptr(), answer.numel())
    return out
'''


def test_a_launch_that_changes_none_of_its_tensor_arguments_is_not_dsl_work(problem, tmp_path):
    """The audit records whether each launch changed any of its tensor arguments; a unit that never did reached
    its memory by address, and its time is not counted as DSL work (on a GPU the share rule then decides: here,
    with no GPU profile, the grading notes it). The same kernel built for the GPU is refused by the source check
    (a pointer made of an integer in device code)."""
    from dataclasses import replace

    kernel = tmp_path / "address_copy.py"
    kernel.write_text(ADDRESS_COPY, encoding="utf-8")
    report = grade(problem, "tirx", kernel, device="cpu", options=replace(FAST, baselines=False))
    notes = [v for k, v in report.ablations.items() if k.startswith("unit ")]
    assert any("changed none of its tensor arguments" in v for v in notes), report.ablations
    assert report.ablations.get("randomize") == "no tensor argument to randomise: not conclusive"
    gpu = tmp_path / "address_copy_gpu.py"
    gpu.write_text(ADDRESS_COPY.replace('tvm.target.Target("llvm")',
                                        'tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})').replace(
        "    for i in range(total):\n", "    Tx.device_entry()\n    for i in range(total):\n"), encoding="utf-8")
    dry = dry_run(problem, "tirx", gpu)
    assert dry.status == "rule_violation" and "reinterpreting int64 as" in dry.message, dry.agent_text()
