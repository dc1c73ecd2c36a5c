"""The parent's handle on one child process: start it, send requests with timeouts, survive whatever it does.

A child that crashes (segfault, illegal address, `os._exit`), hangs past its timeout or sends garbage turns into a
`WorkerFailure` with the right status; the parent's own state — including its CUDA context — is untouched.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import torch.multiprocessing as _tmp

# Tensors cross the socket through torch's reductions: CUDA IPC handles for GPU tensors, and shared-memory files
# by name for CPU tensors (the default file-descriptor strategy needs a parent/child pair made by multiprocessing).
_tmp.set_sharing_strategy("file_system")

_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH)", re.IGNORECASE)


class WorkerFailure(Exception):
    """The child failed in a way that ends this evaluation."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def scrubbed_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without anything that looks like a credential, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not _SECRET.search(k)}
    env.update(extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _no_address_randomisation() -> None:
    """Runs in the forked child before exec: turn address-space randomisation off (personality ADDR_NO_RANDOMIZE).

    For the timing study (`scripts/bench_timing_modes.py --alternate layout`): does a child's memory layout explain
    why two gradings of one kernel differ? Measured on the H200, no (validation/h200-timing-layout.json: 12-26 %
    between children without randomisation, 15-34 % with it), so grading leaves it on.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    if current != -1:
        libc.personality(current | 0x0040000)


class Worker:
    """One fresh child process serving one evaluation."""

    def __init__(self, *, kind: str, path: Path, device: str, dsl: str | None = None, dry_run: bool = False,
                 env: dict[str, str] | None = None, start_timeout: float = 300.0, fixed_layout: bool = False) -> None:
        self.kind, self.path, self.device, self.dsl, self.dry_run = kind, Path(path).resolve(), device, dsl, dry_run
        self.fixed_layout = fixed_layout
        self.env = env or {}
        self.start_timeout = start_timeout
        self.tmp = tempfile.TemporaryDirectory(prefix="mk-worker-")
        self.log_path = Path(self.tmp.name) / "child.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.ready: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> dict[str, Any]:
        """Spawn the child and wait until it has imported the DSL and the kernel; returns its ready message."""
        address = str(Path(self.tmp.name) / "sock")
        authkey = secrets.token_bytes(32)
        listener = Listener(address=address, family="AF_UNIX", authkey=authkey)
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self._log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "metakernel.grader.child"], stdin=subprocess.PIPE, stdout=log,
            stderr=subprocess.STDOUT, env=scrubbed_environment(self.env), cwd=self.tmp.name,
            start_new_session=True, preexec_fn=_no_address_randomisation if self.fixed_layout else None)
        config = {"address": address, "authkey": authkey.hex(), "kind": self.kind, "path": str(self.path),
                  "device": self.device, "dsl": self.dsl, "dry_run": self.dry_run}
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(config) + "\n").encode())
        self.proc.stdin.close()
        accepted: list[Connection] = []
        thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
        thread.start()
        deadline = time.monotonic() + self.start_timeout
        while thread.is_alive() and time.monotonic() < deadline and self.proc.poll() is None:
            thread.join(0.05)
        if not accepted:
            listener.close()
            self.kill()
            if self.proc.returncode not in (None, -signal.SIGKILL):
                raise WorkerFailure("infra_error", f"the grading process exited early:\n{self.log_tail()}")
            raise WorkerFailure("infra_error", f"the grading process did not start in {self.start_timeout:.0f} s")
        listener.close()
        self.conn = accepted[0]
        reply = self._receive(self.start_timeout, phase="importing the kernel")
        if not reply.get("ok"):
            self.close()
            raise WorkerFailure(reply.get("status", "compile_error"), reply.get("error", ""))
        self.ready = reply
        return reply

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply (a failed reply is returned, not raised)."""
        assert self.conn is not None
        try:
            self.conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise self._crashed(f"could not send the request ({exc})") from exc
        return self._receive(timeout, phase=msg.get("op", "request"))

    def _receive(self, timeout: float, phase: str) -> dict[str, Any]:
        assert self.conn is not None
        try:
            ready = self.conn.poll(timeout)
        except (EOFError, OSError) as exc:
            raise self._crashed(str(exc)) from exc
        if not ready:
            self.kill()
            raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s while {phase} (killed)")
        try:
            reply = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError) as exc:
            raise self._crashed("the connection closed") from exc
        except Exception as exc:  # noqa: BLE001 - an unpicklable or corrupt reply
            raise WorkerFailure("runtime_error", f"unreadable reply from the candidate process: {exc}") from exc
        if not isinstance(reply, dict):
            raise WorkerFailure("runtime_error", "malformed reply from the candidate process")
        return reply

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

    def kill(self) -> None:
        """Kill the child and everything it started."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """Ask the child to exit, then make sure it did; remove the temporary folder."""
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            try:
                self.conn.send({"op": "exit"})
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
        if hasattr(self, "_log"):
            self._log.close()
        self.tmp.cleanup()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
