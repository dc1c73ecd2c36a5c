"""What a process inside the grader's sandbox can reach, tried from inside it.

`isolation_report()` starts a child exactly as a candidate's is started (same plan, same uid, namespaces and
filesystem view), and from inside it tries what an adversarial kernel would — native code can do whatever Python
can, so these are plain reads and connects, with no audit hook in the way: the parent's memory, environment and
command line, the eager-baseline cache, a `.env` and an experiment store next to the grader, writing outside the
work dir, mapping a file it wrote executable (a library written at run time and loaded), a loopback port the
parent is listening on, and rebuilding the walls from inside: climbing out of its root, remounting or mounting
file systems, a new user namespace, an anonymous file mapped executable (`memfd_create`); and a secret in the
grader's environment under a name no credential pattern matches; writing the kernel's settings or the device
nodes' modes. Tests assert every one is blocked; `.ci/run` prints it (`python -m metakernel.grader.probe`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from metakernel.grader.sandbox import CLONE_NEWUSER, MS_BIND, MS_REMOUNT


def _try(f: Any) -> str:
    try:
        value = f()
    except Exception as exc:  # noqa: BLE001 - every failure is the answer
        return f"blocked ({type(exc).__name__}: {exc})"[:200]
    return f"REACHABLE ({str(value)[:80]})"


def _in_fork(f: Any) -> str:
    """`_try(f)` in a forked copy: what changes a process (its root, its namespaces) leaves the probe as it was."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.write(write_end, _try(f).encode()[:400])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        answer = r.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return answer or "blocked (the forked probe died)"


def _libc_call(name: str, *args: Any) -> Any:
    """A libc call as native code would make it; OSError with the errno when it fails."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return "done"


def _climb_out(secret: str) -> Any:
    """The chroot climb: a process that may chroot enters a subfolder and walks `..` past its old root."""
    os.makedirs("mk-probe-climb", exist_ok=True)
    os.chroot("mk-probe-climb")
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")
    with open(secret, "rb") as f:
        return f.read(64)


def _open_for_writing(path: str) -> Any:
    with open(path, "r+"):
        return "opened"


def _memfd_executable() -> Any:
    import mmap

    fd = os.memfd_create("mk-probe")  # type: ignore[attr-defined]
    os.write(fd, b"\xc3" * mmap.PAGESIZE)
    return mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC)


def reach(targets: dict[str, Any]) -> dict[str, str]:
    """Inside the sandbox: try every target; "blocked (...)" or "REACHABLE (...)" for each."""
    ppid = int(targets["parent_pid"])

    def listdir(path: str) -> Any:
        return os.listdir(path)

    def read(path: str) -> Any:
        with open(path, "rb") as f:
            return f.read(64)

    def write(path: str) -> Any:
        with open(path, "w") as f:
            return f.write("x")

    def map_executable(folder: str) -> Any:
        """A file written here, mapped executable: what a loader (`dlopen`) does with a library written at run time."""
        import mmap

        path = os.path.join(folder, f"mk-probe-exec-{os.getpid()}")
        with open(path, "wb") as f:
            f.write(b"\xc3" * mmap.PAGESIZE)
        try:
            with open(path, "rb") as f:
                return mmap.mmap(f.fileno(), mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        finally:
            os.unlink(path)

    def connect() -> Any:
        with socket.create_connection(("127.0.0.1", int(targets["port"])), timeout=2) as s:
            return s.getpeername()

    return {
        "parent memory": _try(lambda: read(f"/proc/{ppid}/mem")),
        "parent environment": _try(lambda: read(f"/proc/{ppid}/environ")),
        "parent command line": _try(lambda: read(f"/proc/{ppid}/cmdline")),
        "other processes": _try(lambda: [p for p in listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
                                or _raise("none visible")),
        "baseline cache": _try(lambda: listdir(targets["cache"])),
        ".env": _try(lambda: read(targets["env_file"])),
        "experiment store": _try(lambda: read(targets["store"])),
        "write outside the work dir": _try(lambda: write(targets["outside"])),
        "run code written to the work dir": _try(lambda: map_executable(os.getcwd())),
        "run code written to /tmp": _try(lambda: map_executable("/tmp")),
        "run code written to /dev/shm": _try(lambda: map_executable("/dev/shm")),
        "network (loopback port the parent listens on)": _try(connect),
        "regain root": _try(lambda: os.setuid(0) if os.getuid() != 0 else _raise("still root")),
        "climb out of its root (chroot and ..) to .env": _in_fork(lambda: _climb_out(targets["env_file"])),
        "remount a system folder writable": _in_fork(lambda: _libc_call("mount", None, b"/usr", None,
                                                                       MS_REMOUNT | MS_BIND, None)),
        "mount a new (executable) file system": _in_fork(lambda: _libc_call("mount", b"tmpfs", os.getcwd().encode(),
                                                                           b"tmpfs", 0, None)),
        "new user namespace": _in_fork(lambda: _libc_call("unshare", CLONE_NEWUSER)),
        "anonymous file mapped executable (memfd_create)": _try(_memfd_executable),
        "a secret in the grader's environment under an unguessed name": _try(lambda: os.environ[PROBE_SECRET]),
        # (both leave things as they were if they succeed: the file is opened, not written; the mode is its own)
        "open the kernel's settings for writing (/proc/sys)": _try(lambda: _open_for_writing(
            "/proc/sys/kernel/hostname")),
        "change a device node's mode (/dev)": _try(lambda: os.chmod("/dev/null",
                                                                    os.stat("/dev/null").st_mode & 0o7777)),
    }


#: Set in the grader's environment while the probe runs: a name no credential pattern matches.
PROBE_SECRET = "MK_PROBE_DATABASE_URL"


def _raise(why: str) -> Any:
    raise PermissionError(why)


def isolation_report(folder: Path | None = None) -> dict[str, Any]:
    """Start a sandboxed probe child; its isolation and what it could reach."""
    from metakernel.grader.baseline import cache_dir
    from metakernel.grader.worker import Worker

    base = Path(folder or tempfile.mkdtemp(prefix="mk-probe-"))
    (base / ".env").write_text("OPENAI_API_KEY=sk-not-a-real-key\n")
    (base / "store.sqlite").write_bytes(b"SQLite format 3\x00")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    targets = {"parent_pid": os.getpid(), "cache": str(cache), "env_file": str(base / ".env"),
               "store": str(base / "store.sqlite"), "outside": str(base / "written-by-the-child"),
               "port": listener.getsockname()[1]}
    worker = Worker(kind="probe", path=Path(__file__), device="cpu", env={"METAKERNEL_PROBE": json.dumps(targets)})
    os.environ[PROBE_SECRET] = "postgres://grader:not-a-real-password@localhost/store"
    try:
        ready = worker.start()
    finally:
        os.environ.pop(PROBE_SECRET, None)
        worker.close()
        listener.close()
    return {"isolation": ready.get("isolation", {}), "reach": ready.get("probe", {})}


def main() -> int:
    """Print the isolation in force and what a sandboxed process can reach; exit 1 if anything is reachable."""
    from metakernel.grader.sandbox import Isolation

    report = isolation_report()
    iso = Isolation(**report["isolation"]) if report["isolation"] else Isolation()
    lines = [iso.summary()] + [f"  {k}: {v}" for k, v in report["reach"].items()]
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if any(v.startswith("REACHABLE") for v in report["reach"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
