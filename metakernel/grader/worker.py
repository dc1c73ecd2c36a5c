"""The parent's handle on one child process: start it in its sandbox, send requests, survive whatever it does.

A child that crashes (segfault, illegal address, `os._exit`), hangs past its timeout or sends garbage turns into a
`WorkerFailure` with the right status; the parent's own state — including its CUDA context — is untouched.

The child gets a private work dir holding its copy of the kernel (or problem) file, an isolation plan
(`sandbox.make_plan`), one end of a socketpair (no filesystem path, no network), and on the GPU two arenas
(`transport`) sized for `slots` draws of this problem: the only parent memory it can map.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from metakernel.grader import sandbox, transport

#: Where the parent draws arena slots: the OS's randomness, nothing a candidate could seed or replay.
_RANDOM = secrets.SystemRandom()
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH)", re.IGNORECASE)
_PROTECTED = False


class WorkerFailure(Exception):
    """The child failed in a way that ends this evaluation."""

    def __init__(self, status: str, text: str, reason: str = "", oom: list[int] | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.reason = reason
        self.oom = oom  # the child allocator's account of the failed request that ended it (`Evaluation.end`)


@contextlib.contextmanager
def _candidate_reply() -> Iterator[None]:
    """Reading values out of a reply: one that cannot be read is the candidate's process's doing, not ours."""
    try:
        yield
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise WorkerFailure("rule_violation", f"the reply's tensors could not be read ({exc}): outputs must be plain "
                            "tensors of the problem's dtypes", "output_type") from exc


#: What of the parent's environment a child gets: the toolchains' and libraries' own settings, by prefix, and a
#: few names (USER: torch.compile's cache folder asks for it, and a fresh uid has no passwd entry). An allowlist: a
#: secret under a name nobody guessed (DATABASE_URL, GITHUB_PAT) stayed visible to the candidate, which can print
#: it into the error the agent reads (session 35's red-teamer).
CHILD_ENV_PREFIXES = ("PYTHON", "CUDA_", "CUTE_", "CUTLASS_", "TVM_", "NVIDIA_", "NVRTC_", "NVCC_", "TORCH",
                      "PYTORCH_", "METAKERNEL_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "LC_", "LD_LIBRARY_PATH")
CHILD_ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "CC", "CXX", "VIRTUAL_ENV",
                             "CONDA_PREFIX", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"})


def scrubbed_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment as far as CHILD_ENV_* allow and nothing that looks like a credential, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if (k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)) and not _SECRET.search(k)}
    env.update(extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class Worker:
    """One fresh child process serving one evaluation."""

    def __init__(self, *, kind: str, path: Path | None, device: str, dsl: str | None = None, dry_run: bool = False,
                 env: dict[str, str] | None = None, start_timeout: float = 300.0, in_bytes: int = 0,
                 out_bytes: int = 0, slots: int = 1, require_isolation: bool | None = None) -> None:
        self.kind, self.device, self.dsl, self.dry_run = kind, device, dsl, dry_run
        self.source: Path | None = None  # None until `load` names it (a child started ahead of its kernel)
        self.env = env or {}
        self.start_timeout = start_timeout
        self.slots = max(1, slots)
        self.in_slot = transport.aligned(max(in_bytes, 1)) + transport.ALIGN
        self.out_slot = transport.aligned(max(out_bytes, 1)) + transport.ALIGN
        self.require_isolation = require_isolation
        self.tmp = Path(tempfile.mkdtemp(prefix="mk-worker-"))
        self.work = self.tmp / "work"
        self.work.mkdir()
        self.src = self.work / "src"  # not on the import path: a kernel.py named token.py must not shadow the
        # standard library
        self.path: Path | None = None
        self._owner: tuple[int, int] | None = None  # the sandbox's uid and gid, where the child runs as its own user
        if path is not None:
            self._place(Path(path))
        self.log_path = self.tmp / "child.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.ready: dict[str, Any] = {}
        self.isolation: dict[str, Any] = {}
        self.arena_in: Any = None
        self.arena_out: Any = None
        self._pools: list[Any] = []

    # ------------------------------------------------------------------------------------------ lifecycle
    def _arenas(self) -> dict[str, Any]:
        if self.device != "cuda":
            return {}
        # Memory the parent no longer uses goes back to the driver before anything new is allocated: its caching
        # allocator kept 36-64 GB of earlier gradings' arenas and copies on an 80 GB H100 and the next child (or
        # these arenas) found none (validation/h100-gold-682b56c.json).
        transport.release_cache()
        driver = transport.Driver()
        self.arena_in, pool_in = transport.allocate_arena(self.in_slot * self.slots)
        self.arena_out, pool_out = transport.allocate_arena(self.out_slot * self.slots)
        self._pools = [pool_in, pool_out]
        return {"in": transport.export_arena(driver, self.arena_in),
                "out": transport.export_arena(driver, self.arena_out)}

    def _place(self, source: Path) -> None:
        self.source = source.resolve()
        self.path = self.src / self.source.name

    def start(self) -> dict[str, Any]:
        """Start the child: sandbox, arenas, DSL, and the kernel if this worker was made with one.

        Made without one (`path=None`), the child stops there ("warm") until `load` hands it the kernel: it can be
        started while the kernel is still being written, and its grading then waits only for the kernel's import.
        """
        global _PROTECTED
        if not _PROTECTED:
            sandbox.protect_parent()
            _PROTECTED = True
        self.src.mkdir()
        if self.source is not None:
            self._copy_source()
        extra = [self.env[k] for k in ("CUDA_PATH",) if self.env.get(k)]
        allow = (not self.require_isolation) if self.require_isolation is not None else None
        plan = sandbox.make_plan(self.work, extra_binds=extra, allow_unsandboxed=allow)
        self._owner = (plan.uid, plan.gid) if plan.mode == "uid" else None
        if self._owner is not None:
            os.chown(self.src, *self._owner)
            if self.path is not None:
                os.chown(self.path, *self._owner)
        arenas = self._arenas()
        ours, theirs = socket.socketpair()
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self._log = log
        config = {"fd": theirs.fileno(), "plan": asdict(plan), "kind": self.kind,
                  "path": None if self.path is None else str(self.path),
                  "device": self.device, "dsl": self.dsl, "dry_run": self.dry_run, "arenas": arenas,
                  "slot_bytes": self.out_slot}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "metakernel.grader.child"], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, env=scrubbed_environment(self.env), cwd=str(self.work),
                start_new_session=True, pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(config) + "\n").encode())
        self.proc.stdin.close()
        reply = self._receive(self.start_timeout, phase="starting the grading process")
        self.isolation = reply.get("isolation") or {}
        self.ready = self._accepted(reply)
        return reply

    def _accepted(self, reply: dict[str, Any]) -> dict[str, Any]:
        """A start's or a load's reply; a failed one ends this child and is raised (the kernel's, or ours)."""
        if not reply.get("ok"):
            self.close()
            raise WorkerFailure(reply.get("status", "compile_error"), reply.get("error", ""),
                                reply.get("reason", ""), reply.get("oom"))
        return reply

    def _copy_source(self) -> None:
        assert self.source is not None and self.path is not None
        shutil.copyfile(self.source, self.path)
        os.chmod(self.path, 0o644)

    def load(self, source: Path) -> dict[str, Any]:
        """Hand a warm child (started without a file) its kernel: copied into its work dir, then imported there."""
        if self.path is None:
            self._place(Path(source))
            self._copy_source()
            assert self.path is not None
            if self._owner is not None:
                os.chown(self.path, *self._owner)
        assert self.conn is not None
        warm = self.ready
        try:
            transport.send(self.conn, {"op": "load", "path": str(self.path)})
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise self._crashed(f"could not hand it the kernel ({exc})") from exc
        reply = self._accepted(self._receive(self.start_timeout, phase="importing the kernel"))
        self.ready = {**warm, **reply}
        return self.ready

    def request(self, msg: dict[str, Any], timeout: float, blobs: list[bytes] | None = None) -> dict[str, Any]:
        """Send one request and wait for its reply (a failed reply is returned, not raised).

        The reply carries its blobs in `_blobs` and, in `wall_s`, the parent's wall time from sending to receiving:
        what any time the child reports has to fit in.
        """
        assert self.conn is not None
        started = time.perf_counter()
        try:
            transport.send(self.conn, msg, blobs)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise self._crashed(f"could not send the request ({exc})") from exc
        reply = self._receive(timeout, phase=msg.get("op", "request"))
        reply["wall_s"] = time.perf_counter() - started
        return reply

    def _receive(self, timeout: float, phase: str) -> dict[str, Any]:
        assert self.conn is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = transport.receive(self.conn, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            except (EOFError, ConnectionResetError, OSError) as exc:
                raise self._crashed("the connection closed") from exc
            except (ValueError, UnicodeDecodeError) as exc:
                raise WorkerFailure("runtime_error", f"unreadable reply from the candidate process: {exc}") from exc
            if got is not None:
                reply, blobs = got
                reply["_blobs"] = blobs
                return reply
            if self.proc is not None and self.proc.poll() is not None:
                raise self._crashed("it exited")
            if time.monotonic() >= deadline:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s while {phase} (killed)")

    def _crashed(self, why: str) -> WorkerFailure:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return WorkerFailure("runtime_error", f"the candidate process {how} ({why}).\n{self.log_tail()}")

    def log_tail(self, limit: int = 4000) -> str:
        """The end of the child's stdout/stderr."""
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except (OSError, AttributeError, ValueError):
            return ""
        return data[-limit:].decode("utf-8", errors="replace")

    # ------------------------------------------------------------------------------------------ tensors
    def place(self, draws: list[list[Any]]) -> tuple[list[list[Any]], list[list[Any]], list[bytes], list[Any]]:
        """Put a request's draws where the child reads them: (views it will see, specs, blobs, masks).

        GPU: copies into the input arena, one slot per draw, the slots drawn at random (so a call's offset in the
        arena says nothing: with fixed slots, every one-draw request and every row's unscored first call sat at
        offset 0, which told the scored calls apart); the views are the arena's, so in-place updates are
        visible here; every draw after the first is XORed with its own keyed stream (`transport.mask_stream`), and
        `masks[k]` = [start, end, key] tells the child how to undo it right before call k. Every slot is zeroed
        first, the ones this request leaves unused too: what earlier requests placed (a row's draws, unmasked by
        then, seen from a later one-draw request; the bytes between tensors and under a strided view's holes) is
        no history a call can read (docs/integrity.md hole 11). CPU: by value, unmasked (CPU runs are the free
        check and CI).
        """
        views: list[list[Any]] = []
        specs: list[list[Any]] = []
        blobs: list[bytes] = []
        masks: list[Any] = []
        slots: list[int] = []
        if self.device == "cuda":
            if len(draws) > self.slots:
                raise RuntimeError("more draws than arena slots")
            self.arena_in.zero_()
            slots = _RANDOM.sample(range(self.slots), len(draws))
        for k, values in enumerate(draws):
            if self.device == "cuda":
                start = slots[k] * self.in_slot
                placed, spec, end = transport.place(values, self.arena_in, start)
                views.append(placed)
                specs.append(spec)
                if k and end > start:
                    key = secrets.randbits(63)
                    self.arena_in[start:end].bitwise_xor_(transport.mask_stream(end - start, key, "cuda"))
                    masks.append([start, end, key])
                else:
                    masks.append(None)
            else:
                copies = [v.clone() if hasattr(v, "clone") else v for v in values]
                views.append(copies)
                specs.append([transport.pack_value(v, blobs) for v in copies])
                masks.append(None)
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return views, specs, blobs, masks

    def exchange(self, msg: dict[str, Any], draws: list[list[Any]], timeout: float
                 ) -> tuple[dict[str, Any], list[list[Any]]]:
        """Place `draws` and send `msg` with them (a "call" carries one draw as `inputs`, a row "draws").

        Returns the reply and the inputs as the child saw them: after the call they hold its in-place updates
        (the arena's views on the GPU, unmasked by the child; on a CPU the values the child sent back).
        """
        views, specs, blobs, masks = self.place(draws)
        body = {**msg, "inputs": specs[0]} if msg["op"] == "call" else {**msg, "draws": specs, "masks": masks}
        reply = self.request(body, timeout=timeout, blobs=blobs)
        if reply.get("ok") and self.device == "cpu":
            with _candidate_reply():
                for i, spec in enumerate(reply.get("inputs_after", [])):
                    views[0][i] = transport.unpack_value(spec, reply["_blobs"])
                for k, after in enumerate(reply.get("inputs_after_draws", [])):  # a row's draws
                    for i, spec in enumerate(after):
                        views[k][i] = transport.unpack_value(spec, reply["_blobs"])
        return reply, views

    def outputs(self, spec: dict[str, Any], blobs: list[bytes]) -> Any:
        """The returned structure of one call, its tensors as views of the output arena (GPU) or values (CPU).

        The reply is the candidate's process's: on the GPU every tensor must be in the output arena (a spec by
        value or a shape-only one would sidestep "outputs on the GPU" or turn the comparison into our error), and
        shape-only tensors only come back from the free check's full-scale trace.
        """
        allowed = {"at", "v"} if self.device == "cuda" else {"cpu", "v"} | ({"meta"} if self.dry_run else set())
        unexpected = transport.leaf_kinds(spec) - allowed
        if unexpected:
            raise WorkerFailure("rule_violation", "the reply put outputs where the grader does not read them "
                                f"({', '.join(sorted(unexpected))}): outputs must be plain GPU tensors", "output_type")
        with _candidate_reply():
            return transport.unpack_value(spec, blobs, self.arena_out)

    # ------------------------------------------------------------------------------------------ ending
    def kill(self) -> None:
        """Kill the child and everything it started."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait(timeout=30)
        self._reap()

    def _reap(self) -> None:
        """What the child left running under its uid, killed (`sandbox.reap`; once: nothing starts under it again)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            sandbox.reap(*owner)

    def close(self) -> None:
        """Ask the child to exit, then make sure it did; free the arenas and remove the temporary folder."""
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            try:
                transport.send(self.conn, {"op": "exit"})
                self.conn.poll(10)
            except (OSError, EOFError):
                pass
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
            else:
                self._reap()
        if hasattr(self, "_log"):
            self._log.close()
        with transport.GPU_MEMORY_LOCK:  # the pools' destructors empty their cache: not beside another's use
            self.arena_in = self.arena_out = None
            self._pools = []
            if self.device == "cuda":
                transport.release_cache()  # the arenas' pools, back to the driver for the next child
        _remove_tree(self.tmp)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StartingWorker:
    """A Worker whose start (imports, sandbox, arenas) runs in a background thread while other work goes on."""

    def __init__(self, worker: Worker) -> None:
        import threading

        self.worker = worker
        self._ready: dict[str, Any] | None = None
        self._error: WorkerFailure | None = None
        self._ours: Exception | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._ready = self.worker.start()
        except WorkerFailure as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - ours (e.g. no GPU memory left for the arenas): never charged
            self._ours = exc  # formatted by the caller's thread: Python 3.11's traceback formatting parses source,
            # and a parse beside the main thread's static check trips CPython's shared AST depth counter

    def wait(self) -> None:
        """Until the start has finished, either way."""
        self._thread.join()

    def result(self) -> tuple[Worker, dict[str, Any]]:
        """Wait for the start; the started worker and its ready message, or the start's failure."""
        self._thread.join()
        if self._ours is not None:
            raise WorkerFailure("infra_error", "starting the grading process failed (not the kernel's fault):\n"
                                + "".join(traceback.format_exception(self._ours, limit=-4)).rstrip(), "start")
        if self._error is not None:
            raise self._error
        assert self._ready is not None
        return self.worker, self._ready

    def discard(self) -> None:
        """Stop a child that will not be used."""
        self._thread.join()
        self.worker.close()


def _remove_tree(path: Path) -> None:
    """Remove a worker's folder, whatever the child left in it (its files belong to the child's uid)."""
    shutil.rmtree(path, ignore_errors=True)
