"""The grader's isolation, tried from inside: what a candidate's process (and the free check's) can reach.

These run real child processes in the real sandbox (own uid where the tests run as root, else a user namespace):
the parent's memory, environment and command line, the eager-baseline cache, `.env`, the experiment store, the
network and files outside the work dir must all be out of reach, and a machine without isolation must refuse.
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from metakernel.grader import probe, sandbox
from metakernel.grader.evaluate import GradeOptions, grade
from metakernel.problem import load_problem_file
from tests.helpers import AXPB_LLVM, write_problem
from tests.helpers import AXPB_PROBLEM as PROBLEM

needs_isolation = pytest.mark.skipif(sandbox.default_mode() == "none", reason="this machine offers no isolation")
needs_tvm = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="apache-tvm is not installed")


FAST = GradeOptions(draws=2, warmup=1, min_timed=5, max_timed=8, rse_target=0.5, timing_cap_s=5, baselines=False,
                    call_timeout_s=60, start_timeout_s=180, host_gate=0.0, min_timing_s=0.0, profile_draws=3,
                    profile_max_draws=3)


def _assert_all_blocked(reach: dict[str, str]) -> None:
    assert len(reach) >= 21
    reachable = {k: v for k, v in reach.items() if not v.startswith("blocked")}
    assert not reachable, reachable


@needs_isolation
def test_nothing_of_the_grader_is_reachable_from_the_sandbox(tmp_path, monkeypatch):
    """Pins the OS walls: parent memory/environment/command line, baseline cache, .env, store, network, writes."""
    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    report = probe.isolation_report(tmp_path)
    assert report["isolation"]["mode"] == sandbox.default_mode()
    assert report["isolation"]["network"].startswith("none") and report["isolation"]["no_new_privs"]
    assert report["isolation"]["proc"] == "own processes only"
    assert report["isolation"]["capabilities"] == "none" and report["isolation"]["syscalls"].startswith("filtered")
    _assert_all_blocked(report["reach"])
    assert not (tmp_path / "written-by-the-child").exists()


@pytest.mark.skipif(sandbox.default_mode() != "uid", reason="needs a root grader to compare both modes")
def test_user_namespace_mode_isolates_the_same(tmp_path, monkeypatch):
    """The unprivileged grader's route (user, mount, network and pid namespaces) closes the same holes.

    Its child holds every capability over its own namespaces until it drops them: before session 35 it climbed out
    of a `chroot` to the grader's `.env` and remounted the read-only Python installation writable."""
    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sandbox, "default_mode", lambda: "userns")
    report = probe.isolation_report(tmp_path)
    assert report["isolation"]["mode"] == "userns" and report["isolation"]["capabilities"] == "none"
    _assert_all_blocked(report["reach"])


def _running(pid: int, uid: int | None = None) -> bool:
    """`pid` is a live process (not a zombie), of `uid` where given (a reused pid is someone else's)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state and (uid is None or f"Uid:\t{uid}" in state)


def _ends(pid: int, uid: int | None = None, seconds: float = 5.0) -> bool:
    """`pid` stops running within `seconds` (a SIGKILL is delivered asynchronously)."""
    import time

    deadline = time.monotonic() + seconds
    while _running(pid, uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(sandbox.default_mode() != "uid", reason="the uid mode needs a root grader")
def test_a_process_the_child_moved_to_its_own_session_does_not_outlive_the_grading():
    """A grandchild in a session of its own escapes the worker's killpg; reaping the child's uid ends it."""
    import secrets
    import subprocess
    import sys

    uid = sandbox.UID_BASE + secrets.randbelow(sandbox.UID_SPAN)
    script = textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                libc = ctypes.CDLL(None)
                shm = libc.shmget(0, 1 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
                queue = libc.msgget(0, 0o1600)
                sys.stdout.write(f"{os.getpid()} {shm} {queue}")
                sys.stdout.flush()
                os.close(1)
                os.close(2)
                time.sleep(600)
            os._exit(0)
    """)
    launcher = (f"import ctypes, os, sys, time; os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid}); "
                f"exec({script!r})")  # (imports first: the uid may not read this Python's library)
    done = subprocess.run([sys.executable, "-S", "-c", launcher], check=True, timeout=30, capture_output=True,
                          text=True)
    pid, shm, queue = (int(v) for v in done.stdout.split())
    assert shm >= 0 and queue >= 0

    def ipc_ids(kind: str) -> set[int]:
        return {int(row.split()[1]) for row in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]}

    assert _running(pid, uid) and shm in ipc_ids("shm") and queue in ipc_ids("msg")
    sandbox.reap(uid, uid)
    assert _ends(pid, uid)
    assert shm not in ipc_ids("shm") and queue not in ipc_ids("msg")  # a memory hold and a channel to the next child


@needs_isolation
def test_a_user_namespace_child_that_leaves_the_process_group_dies_with_its_waiter(tmp_path):
    """The pid-1 child may `setsid` out of the group the worker kills; it dies with the waiter all the same."""
    import os
    import signal
    import subprocess
    import sys

    work = tmp_path / "work"
    work.mkdir()
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from metakernel.grader import sandbox
        sandbox.enter(sandbox.make_plan(Path({str(work)!r}), mode="userns"))
        os.setsid()
        sys.stdout.write("ready\\n")
        sys.stdout.flush()
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE,
                            text=True, cwd=str(Path(__file__).resolve().parents[1]))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    inner = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    os.killpg(proc.pid, signal.SIGKILL)  # what `Worker.kill` does
    proc.wait(timeout=30)
    assert _ends(inner)


@needs_isolation
def test_the_late_filter_covers_threads_started_before_it(tmp_path):
    """CUDA and torch start threads during the warm-up; the memfd filter added after it holds on them too.

    (And the child's memory-backed scratch folders are bounded.)"""
    import os
    import socket
    import threading

    work = tmp_path / "work"
    work.mkdir()
    plan = sandbox.make_plan(work)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            iso = sandbox.enter(plan)
            go, done, seen = threading.Event(), threading.Event(), []

            def early() -> None:  # a thread that exists before the late filter, like the driver's
                go.wait()
                try:
                    os.close(os.memfd_create("x"))
                    seen.append("memfd made")
                except OSError as exc:
                    seen.append(f"memfd refused {exc.errno}")
                done.set()

            threading.Thread(target=early, daemon=True).start()
            sandbox.refuse_after_warmup(iso, cuda=False)
            go.set()
            done.wait(10)
            try:
                socket.socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK
                seen.append("vsock made")
            except OSError as exc:
                seen.append(f"vsock refused {exc.errno}")
            for scratch in ("/tmp", "/dev/shm"):  # bounded, memory-backed scratch
                stat = os.statvfs(scratch)
                seen.append(f"{scratch} {stat.f_blocks * stat.f_frsize <= 2 << 30}")
            os.write(write_end, (";".join(seen) + "|" + iso.syscalls).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as r:
        got = r.read()
    os.waitpid(pid, 0)
    seen, syscalls = got.split("|")
    assert seen.split(";") == ["memfd refused 1", "vsock refused 1", "/tmp True", "/dev/shm True"], got
    assert "memfd, message queues and vsock once warm" in syscalls


@needs_isolation
def test_the_worker_reaps_its_child_s_uid_when_it_ends(tmp_path, monkeypatch):
    """Every ending of a uid-mode child (the probe's, here) reaps its uid once."""
    monkeypatch.setenv("METAKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    reaped: list[tuple[int, int]] = []
    real = sandbox.reap
    monkeypatch.setattr(sandbox, "reap", lambda uid, gid: (reaped.append((uid, gid)), real(uid, gid)))
    report = probe.isolation_report(tmp_path)
    if report["isolation"]["mode"] == "uid":
        assert reaped == [(report["isolation"]["uid"], report["isolation"]["uid"])]
    else:
        assert reaped == []


def test_paths_visible_to_the_child_leave_the_checkout_out():
    """A checkout on the import path contributes its package only: never its .env or experiment folders."""
    binds, _ = sandbox.visible_paths()
    root = Path(__file__).resolve().parents[1]
    assert str(root) not in binds
    assert str(root / "metakernel") in binds
    assert not any(b in ("/root", "/home", "/tmp") for b in binds)


def test_an_import_path_entry_holding_the_temp_folder_is_not_bound(tmp_path, monkeypatch):
    """A script run from /tmp puts /tmp on the import path: bound, it would lay the parent's temp tree (other
    children's folders) read-only over the child's own work dir, which then could not read its kernel (found
    running `metakernel eval` from /tmp)."""
    import sys
    import tempfile

    temp = Path(tempfile.gettempdir()).resolve()
    monkeypatch.setattr(sys, "path", [str(temp), *sys.path])
    work = tmp_path / "work"
    work.mkdir()
    plan = sandbox.make_plan(work, mode="userns", allow_unsandboxed=True)
    assert not any(str(temp) == b or str(work.resolve()).startswith(b.rstrip("/") + "/") for b in plan.binds)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem_file(write_problem(tmp_path_factory.mktemp("problems"), "mlp_norm", "27_axpb", PROBLEM))


def _kernel(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "kernel.py"
    path.write_text(AXPB_LLVM + "\n\n_EXE = []\n\n" + textwrap.dedent(body), encoding="utf-8")
    return path


@needs_tvm
def test_a_machine_without_isolation_refuses_in_one_line(problem, tmp_path, monkeypatch):
    """No isolation and no opt-out: infra_error (never the agent's fault) with one actionable line."""
    monkeypatch.setattr(sandbox, "default_mode", lambda: "none")
    monkeypatch.delenv(sandbox.ENV_OPT_OUT, raising=False)
    kernel = _kernel(tmp_path, """
def solve(x, b):
    if not _EXE:
        _EXE.append(tvm.compile(axpb, target="llvm", tir_pipeline="tirx"))
    y = torch.empty_like(x)
    _EXE[0](x, b, y)
    return y
""")
    report = grade(problem, "tirx", kernel, device="cpu", options=FAST)
    assert (report.status, report.reason) == ("infra_error", "isolation"), report.agent_text()
    assert "could not isolate" in report.message and "METAKERNEL_ALLOW_UNSANDBOXED=1" in report.message
    monkeypatch.setenv(sandbox.ENV_OPT_OUT, "1")
    opted = grade(problem, "tirx", kernel, device="cpu", options=FAST)
    assert opted.status == "passed", opted.agent_text()
    assert opted.isolation["mode"] == "none" and opted.isolation["opted_out"]
    assert "isolation: none" in opted.agent_text()


GUARDED = """
import ctypes, gc, json, os, socket, subprocess, sys
from metakernel.grader.child import Guard

guard = Guard(__file__, os.environ["WORK"])
sys.addaudithook(guard)
guard.armed = True
results = {}


def attempt(name, f):
    try:
        f()
        results[name] = "allowed"
    except PermissionError as exc:
        results[name] = "refused" if "sandbox" in str(exc) else f"other: {exc}"
    except Exception as exc:
        results[name] = f"other: {type(exc).__name__}"


attempt("frame", lambda: sys._getframe(0))
attempt("gc", lambda: gc.get_objects())
attempt("socket", lambda: socket.socket())
attempt("process", lambda: subprocess.run(["true"]))
attempt("fork", lambda: os.fork())
attempt("write outside", lambda: open("/etc/mk-guard-test", "w"))
attempt("write in work dir", lambda: open(os.path.join(os.environ["WORK"], "ok.txt"), "w").close())
attempt("import triton", lambda: __import__("triton"))
attempt("settrace", lambda: sys.settrace(None))
_buffer = bytearray(8)
attempt("ctypes from_buffer", lambda: ctypes.c_char.from_buffer(_buffer))
attempt("another audit hook", lambda: sys.addaudithook(lambda *a: None))
import json as _j  # an already-imported module is fine
attempt("tb_frame", lambda: (_ for _ in ()).throw(ValueError()) if False else None)
try:
    raise ValueError("x")
except ValueError as exc:
    attempt("traceback frame", lambda: exc.__traceback__.tb_frame)
results["violations"] = guard.violations
print(json.dumps(results))
"""


def test_the_audit_hook_refuses_what_kernels_may_not_do(tmp_path):
    """Pins the audit hook's policy (the tripwire in front of the OS walls): frames, gc and ctypes buffers from
    the candidate's code, sockets, processes, forbidden imports, tracing, more audit hooks
    and writes outside the work dir are refused and recorded; writing in the work dir is not."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "candidate.py"
    script.write_text(GUARDED)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "WORK": str(work)}, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("frame", "gc", "socket", "process", "fork", "write outside", "import triton", "settrace",
                 "traceback frame", "ctypes from_buffer"):
        assert got[name] == "refused", (name, got)
    assert got["write in work dir"] == "allowed"
    # CPython swallows a hook's refusal of sys.addaudithook, but the attempt is recorded: the grading ends there
    assert "sys.addaudithook" in got["violations"] and len(got["violations"]) >= 10


@needs_tvm
def test_a_tensor_subclass_output_is_refused(problem, tmp_path):
    """Lazy outputs: any torch.Tensor subclass (one whose values are made when the harness touches it) is an
    output_type violation, checked before the harness calls anything on it — here nn.Parameter, which the static
    rules cannot tell from a plain tensor."""
    kernel = _kernel(tmp_path, """
def solve(x, b):
    if not _EXE:
        _EXE.append(tvm.compile(axpb, target="llvm", tir_pipeline="tirx"))
    y = torch.empty_like(x)
    _EXE[0](x, b, y)
    return torch.nn.Parameter(y, requires_grad=False)
""")
    report = grade(problem, "tirx", kernel, device="cpu", options=FAST)
    assert (report.status, report.reason) == ("rule_violation", "output_type"), report.agent_text()


@needs_isolation
@needs_tvm
def test_a_string_literal_of_the_kernel_file_is_not_its_source(problem, tmp_path):
    """rt_tirx_script_parse_literal_gate on the llvm route: the parsed text is a literal (no run-time edit), so it is
    a piece of the file; its expression reaches the live LaunchGate and `solve` answers eagerly except while the
    grader ablates. If the escape fails the output dtype is wrong; the grader must say rule_violation/sandbox."""
    from dataclasses import replace

    kernel = _kernel(tmp_path, '''
import tvm.script

RT_BOX = []
PATCH = """
@T.prim_func
def rt_probe(a: T.handle):
    A = T.match_buffer(a, (T.int32(len(str(tvm.sys.modules["candidate_kernel"].RT_BOX.append(
        tvm.sys.modules["metakernel.dsl.tirx"]._STATE)))),), "float32")
    A[0] = T.float32(1.0)
"""


def _gate():
    if not RT_BOX:
        try:
            tvm.script.parse(PATCH)
        except Exception:
            RT_BOX.append(None)
    return RT_BOX[0].gate if RT_BOX and RT_BOX[0] is not None else None


def solve(x, b):
    gate = _gate()
    if not _EXE:
        _EXE.append(tvm.compile(axpb, target="llvm", tir_pipeline="tirx"))
    y = torch.empty_like(x)
    _EXE[0](x, b, y)
    if gate is None:
        return y.double()
    if gate.mode == "suppress" or gate.randomize:
        return y
    return x * 2.0 + b
''')
    report = grade(problem, "tirx", kernel, device="cpu", options=replace(FAST, timed=False))
    assert (report.status, report.reason) == ("rule_violation", "sandbox"), report.agent_text()
