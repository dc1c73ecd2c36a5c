"""Operating-system isolation of the candidate's process (docs/design.md section 4.2).

The candidate is an adversary that reads our source, so the walls are the kernel's, not Python's:

- **its own unprivileged uid/gid** (`mode="uid"`, when the grader runs as root: a fresh uid per child, so two
  children cannot reach each other either) or, for an unprivileged grader, **a user namespace** (`mode="userns"`);
  no supplementary groups, `no_new_privs`, and the grader's own process marked non-dumpable (`protect_parent`), so
  `/proc/<parent>/mem` and `environ` are closed even to a process of the same uid;
- **a private filesystem view**: a new mount namespace whose root is an empty tmpfs holding read-only binds of
  only what the child needs (system directories, the Python installation, the import path — a checkout on the
  import path contributes its `metakernel/` package only, never its `.env` or experiment folders), a fresh `/tmp`,
  a private `/dev/shm`, `/proc` mounted with `hidepid=invisible`, and one writable folder: the child's work dir
  (which holds its copy of the kernel file). The grader's home, caches (the eager baselines), `.env`, the
  experiment store and the parent's files do not exist in that view;
- **no network**: a new, empty network namespace (the channel to the parent is a socketpair made before);
- **no capabilities and a syscall filter**: the root is changed by `pivot_root` with the old one detached (a
  `chroot` is left by any process holding CAP_SYS_CHROOT, and a user-namespace child holds every capability over
  its namespace), every capability is dropped, and a seccomp filter refuses what would rebuild the walls from
  inside: new namespaces, mounts, root changes, other processes' memory, kernel-side programs and modules; once
  the DSL is warm a second one refuses message queues, vsock and, without CUDA, anonymous files (`memfd_create`,
  mappable executable without a file: `refuse_after_warmup`);
- **nothing left behind**: a finished `uid` child's processes and SysV objects are removed (`reap`); a
  user-namespace child's pid and IPC namespaces end with it;
- **resource limits**: no core files, bounded file size and thread count, bounded `/tmp` and `/dev/shm`.

`enter` runs first thing in the child, before torch is imported, and returns what is in force; the grader records
it in every report. When no isolation can be had the child refuses to run the candidate unless the user opted out
(`METAKERNEL_ALLOW_UNSANDBOXED=1` / `GradeOptions.require_isolation=False`), and the report then says so.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MS_NOEXEC, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 8, 1024, 2048, 1 << 21
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 4, 38, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_PDEATHSIG = 47, 4, 1
CLONE_NEWIPC = 0x08000000
MNT_DETACH = 2
SYS_PIVOT_ROOT_X86_64 = 155
#: Namespace flags a `clone` may not carry inside the sandbox.
CLONE_NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUSER | CLONE_NEWPID | 0x02000000 | 0x04000000 | 0x08000000
# (+ cgroup, uts, ipc; a clone's low byte is its exit signal, so the time namespace's 0x80 is unshare's only)
#: Syscalls the filter refuses (x86_64 numbers), with EPERM: what would rebuild the walls from inside.
REFUSED_SYSCALLS_X86_64 = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "memfd_secret": 447, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "bpf": 321, "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "add_key": 248, "request_key": 249,
    "keyctl": 250, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 304,
}
#: Refused once the DSL is warm, before the candidate's import: POSIX message queues outlive the child in the
#: grader's IPC namespace (a channel to the next grading); nothing of ours uses them.
REFUSED_AFTER_WARMUP_X86_64 = {"mq_open": 240}
#: Refused there too in a child without CUDA (the free check, CPU gradings). A memfd is a file nothing mounts
#: `noexec`: written, then loaded by a C++ loader through /proc/self/fd, it runs native code (docs/integrity.md,
#: session 30's residue). The CUDA driver makes one while it initialises (NVIDIA/OpenShell#1696: CUDA error 304
#: under a filter that refused it); whether it needs one later, once warm, no GPU has shown yet, and a refusal it
#: met would fail every GPU grading: CUDA children keep it until a device run shows they can do without.
REFUSED_WITHOUT_CUDA_X86_64 = {"memfd_create": 319}
#: Socket families refused once warm: vsock leads out of the VM past the empty network namespace.
REFUSED_SOCKET_FAMILIES = (40,)  # AF_VSOCK
SYS_SOCKET_X86_64, SYS_SECCOMP_X86_64 = 41, 317
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SYS_CLONE_X86_64, SYS_CLONE3 = 56, 435
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

#: System folders bound read-only into the child's root (symlinks among them are recreated as symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Marks a folder on the import path as a project checkout: only its `metakernel/` package is bound.
CHECKOUT_MARKS = (".git", ".env", "pyproject.toml", "setup.py", "setup.cfg")
#: A fresh uid per child from this range (mode "uid").
UID_BASE, UID_SPAN = 2_100_000, 800_000
ENV_OPT_OUT = "METAKERNEL_ALLOW_UNSANDBOXED"
#: The child's /tmp and /dev/shm.
SCRATCH_TMPFS = "mode=1777,size=2g"


class SandboxError(Exception):
    """Isolation could not be set up (the child then refuses to run the candidate)."""


@dataclass
class Plan:
    """What the parent asks the child to do; crosses to the child as JSON in its start-up config."""

    mode: str  # "uid" | "userns" | "none"
    work: str  # the child's writable folder (its cwd, HOME and TMPDIR)
    root: str  # an empty folder to build the child's root in
    binds: list[str] = field(default_factory=list)  # read-only binds, same path inside
    links: dict[str, str] = field(default_factory=dict)  # symlinks to recreate inside: path -> target
    uid: int = 0
    gid: int = 0
    allow_unsandboxed: bool = False


@dataclass
class Isolation:
    """What was in force in the child (reported with every grading)."""

    mode: str = "none"
    uid: int | None = None
    filesystem: str = "shared"
    network: str = "shared"
    proc: str = "shared"
    no_new_privs: bool = False
    parent_dumpable: bool | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    audit_hook: bool = False
    capabilities: str = "kept"
    syscalls: str = "all allowed"
    opted_out: bool = False
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for reports and `.ci/run`."""
        if self.mode == "none":
            return "isolation: none" + (" (opted out by the user)" if self.opted_out else "")
        return (f"isolation: {self.mode}" + (f" {self.uid}" if self.uid is not None else "")
                + f", filesystem {self.filesystem}, network {self.network}, proc {self.proc}"
                + (", no_new_privs" if self.no_new_privs else "") + f", capabilities {self.capabilities}"
                + f", syscalls {self.syscalls}" + (", audit hook" if self.audit_hook else ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def opted_out() -> bool:
    """The user asked to grade without isolation (only for machines that offer none)."""
    return os.environ.get(ENV_OPT_OUT, "") not in ("", "0")


def protect_parent() -> bool:
    """Mark the grader's process non-dumpable: its memory and environment closed to every other process."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_dumpable() -> bool | None:
    """Whether this process is dumpable (None when unknown)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
    except (OSError, AttributeError):
        return None


def default_mode() -> str:
    """`uid` for a root grader, else `userns` where the kernel offers user namespaces, else `none`."""
    if sys.platform != "linux":
        return "none"
    if os.geteuid() == 0:
        return "uid"
    try:
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0:
            return "userns"
    except (OSError, ValueError):
        pass
    return "none"


def _is_checkout(path: Path) -> bool:
    return any((path / mark).exists() for mark in CHECKOUT_MARKS)


def visible_paths(extra: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Folders to bind read-only (real paths) and symlinks to recreate, for a child that imports like this process.

    Binds: the system folders, the Python installation, every folder on the import path (a checkout contributes
    only its `metakernel` package), the folders of LD_LIBRARY_PATH and `extra` (e.g. a CUDA toolkit root).
    """
    import metakernel

    wanted: list[str] = [*SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    package = Path(metakernel.__file__).resolve().parent
    wanted.append(str(package))
    for entry in sys.path:
        if not entry:
            continue
        p = Path(entry)
        if not p.exists():
            continue
        if p.is_dir() and _is_checkout(p):
            continue  # a project folder: its own package is bound above, nothing else of it
        wanted.append(str(p))
    wanted += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    wanted += list(extra or [])
    binds: list[str] = []
    links: dict[str, str] = {}
    for raw in wanted:
        path = Path(raw)
        if not path.exists():
            continue
        if path.is_symlink() and str(path) in SYSTEM_DIRS:
            links[str(path)] = os.readlink(path)
            continue
        real = str(path.resolve())
        binds.append(real)
        if str(path.absolute()) != real:
            links.setdefault(str(path.absolute()), real)
    # Keep only the outermost of nested binds (a bind of /usr already holds /usr/lib/python3/...).
    outer: list[str] = []
    for b in sorted(set(binds), key=len):
        if not _under(b, outer):
            outer.append(b)
    return outer, {k: v for k, v in links.items() if not _under(k, outer)}


def _under(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or lies below one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def make_plan(work: Path, *, extra_binds: list[str] | None = None, mode: str | None = None,
              allow_unsandboxed: bool | None = None) -> Plan:
    """The isolation plan for one child whose writable folder is `work` (created by the caller, owned by it)."""
    mode = mode or default_mode()
    root = work.parent / (work.name + "-root")
    root.mkdir(mode=0o700, exist_ok=True)
    binds, links = visible_paths(extra_binds)
    # A folder on the import path that holds the work dir (a script run from /tmp puts /tmp there) would bind the
    # parent's whole temp tree into the child, read-only over its own work dir: the child could not read its
    # kernel, and would see other children's folders. Such folders are not bound.
    private = [str(work.resolve()), os.path.realpath(tempfile.gettempdir())]
    binds = [b for b in binds if not any(_under(p, [b]) for p in private)]
    links = {k: v for k, v in links.items() if not any(_under(p, [v]) for p in private)}
    uid = UID_BASE + secrets.randbelow(UID_SPAN)
    plan = Plan(mode=mode, work=str(work), root=str(root), binds=binds, links=links, uid=uid, gid=uid,
                allow_unsandboxed=opted_out() if allow_unsandboxed is None else allow_unsandboxed)
    if mode == "uid":
        os.chown(work, uid, uid)
        os.chmod(work, 0o700)
    return plan


def reap(uid: int, gid: int) -> None:
    """Kill every process of a finished child's uid (mode "uid"): what it started outlives its process group.

    A process the candidate forks and moves to a session of its own escapes the worker's `killpg` and would keep
    running (on the GPU too) through later gradings. There is no pid namespace to end with the child in this mode
    (legacy CUDA IPC handles do not cross pid namespaces), but the uid is the child's alone: `kill(-1)` made as
    that uid signals all of its processes, and the kernel does it under the task list's lock, so a fork cannot slip
    past it.
    """
    # started as the grader (the uid may not be allowed to run this Python), it becomes the uid, then kills
    code = (f"import os, signal; os.setgroups([]); os.setresgid({gid}, {gid}, {gid}); "
            f"os.setresuid({uid}, {uid}, {uid}); os.kill(-1, signal.SIGKILL)")
    try:
        subprocess.run([sys.executable, "-S", "-c", code], env={}, cwd="/", stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        pass
    _remove_ipc_objects(uid)


def _remove_ipc_objects(uid: int) -> None:
    """SysV shared memory, queues and semaphores the uid made: they outlive it in the grader's IPC namespace.

    (A 512 MiB segment left by one child stayed in the host's memory, owned by no process, and a message it left was
    read by the next child: session 35's red-teamer.)
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    for kind, remove, uid_column in (("shm", lambda i: libc.shmctl(i, 0, None), 7),
                                     ("msg", lambda i: libc.msgctl(i, 0, None), 7),
                                     ("sem", lambda i: libc.semctl(i, 0, 0), 4)):  # IPC_RMID = 0
        try:
            rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # uid and cuid: the owner and the creator (columns after the kind's own: see proc(5))
            if len(fields) > uid_column + 2 and uid in (int(fields[uid_column]), int(fields[uid_column + 2])):
                remove(int(fields[1]))


# ------------------------------------------------------------------------------------------------ the child side
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
           ) -> None:
    _check(libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                      flags, data.encode() if data else None), f"mount {source or fstype} on {target}")


def _inside(root: str, path: str) -> str:
    return root.rstrip("/") + "/" + path.lstrip("/")


def _bind_ro(libc: Any, root: str, path: str, writable: bool = False) -> None:
    target = _inside(root, path)
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()  # noqa: SIM115 - a mount point for a file bind
    _mount(libc, path, target, None, MS_BIND | MS_REC)
    if not writable:
        _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_REC)
        return
    # writable, so nothing in it may be mapped executable: a file that writes a shared library there and has a
    # C++ loader dlopen it runs native code in the child, past every audit event (session 32's red-teamer, TVM's
    # module loader reached by name). The source mount's locked flags are kept (a user namespace must keep them).
    _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC | _held_flags(target))


def _held_flags(target: str) -> int:
    """The mount flags at `target` a remount must keep (a user namespace may not drop the source's locked ones)."""
    held = os.statvfs(target).f_flag
    return (held & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)) | (
        MS_RELATIME if held & 4096 else 0)  # (statvfs's ST_RELATIME is 4096)


def _remount_locked(libc: Any, target: str, flags: int, iso: Isolation) -> None:
    """Remount the bind at `target` with `flags` added and its held flags kept; a failure goes to `iso.errors`."""
    try:
        _mount(libc, None, target, None, MS_BIND | MS_REMOUNT | flags | _held_flags(target))
    except SandboxError as exc:
        iso.errors.append(str(exc))


def _limits() -> dict[str, Any]:
    import resource

    applied: dict[str, Any] = {}
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", 16 << 30), ("RLIMIT_NPROC", 4096)):
        try:
            limit = getattr(resource, name)
            soft, hard = resource.getrlimit(limit)
            new = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (new, new))
            applied[name.removeprefix("RLIMIT_").lower()] = new
        except (ValueError, OSError, AttributeError):
            pass
    return applied


def _build_root(libc: Any, plan: Plan, iso: Isolation) -> None:
    """Mount namespace: an empty tmpfs root with read-only binds, fresh /tmp and /dev/shm, /proc hidepid."""
    root = plan.root
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # no writable place the child sees is executable (the root, /tmp, /dev/shm, its work dir): binds keep their own
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64m")
    os.makedirs(_inside(root, "/tmp"), exist_ok=True)
    # memory-backed and charged to no process: bounded (unbounded, each could take half the RAM: session 35's
    # red-teamer); the child's TMPDIR is its work dir, so neither holds more than a library's scratch
    _mount(libc, "tmpfs", _inside(root, "/tmp"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, SCRATCH_TMPFS)
    for path in sorted(plan.binds, key=len):
        try:
            _bind_ro(libc, root, path)
        except (SandboxError, OSError) as exc:
            iso.errors.append(str(exc))
    for link, target in plan.links.items():
        inside = _inside(root, link)
        if os.path.lexists(inside):
            continue
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        os.symlink(target, inside)
    os.makedirs(_inside(root, "/dev"), exist_ok=True)
    _mount(libc, "/dev", _inside(root, "/dev"), None, MS_BIND | MS_REC)
    try:
        _mount(libc, "tmpfs", _inside(root, "/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, SCRATCH_TMPFS)
    except SandboxError as exc:
        iso.errors.append(str(exc))
    # The host's /dev, read-only (device nodes still open for writing: the GPU's, /dev/null) and never executable: a
    # child keeping root's uid (a user namespace made by a root grader) changed node modes and wrote files there,
    # which a loader could map (session 35's red-teamer)
    _remount_locked(libc, _inside(root, "/dev"), MS_RDONLY | MS_NOSUID | MS_NOEXEC, iso)
    if os.path.isdir("/sys"):
        try:
            _bind_ro(libc, root, "/sys")
        except SandboxError as exc:
            iso.errors.append(str(exc))
    os.makedirs(_inside(root, "/proc"), exist_ok=True)
    for option, label in (("hidepid=invisible", "own processes only"), ("hidepid=2", "own processes only")):
        try:
            _mount(libc, "proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV, option)
            iso.proc = label
            break
        except SandboxError as exc:
            iso.errors.append(str(exc))
    else:
        _mount(libc, "/proc", _inside(root, "/proc"), None, MS_BIND | MS_REC)
        iso.proc = "shared"
    sysctl = _inside(root, "/proc/sys")  # the kernel's settings: read-only whoever the child is (same finding)
    try:
        _mount(libc, sysctl, sysctl, None, MS_BIND)
    except SandboxError as exc:
        iso.errors.append(str(exc))
    else:
        _remount_locked(libc, sysctl, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, iso)
    _bind_ro(libc, root, plan.work, writable=True)
    _pivot_root(libc, root)
    os.chdir(plan.work)
    iso.filesystem = "private (read-only system and Python, own work dir, nothing writable executable)"


def _pivot_root(libc: Any, root: str) -> None:
    """Make `root` the namespace's root and detach the old one: nothing of the host's tree is left to climb back to.

    (A `chroot` keeps the old root in the namespace: a process holding CAP_SYS_CHROOT, which a user-namespace child
    holds, chroots into a subfolder and walks `..` out of it; session 35 read the grader's `.env` that way.)
    """
    if os.uname().machine != "x86_64":
        os.chroot(root)  # no pivot_root number known here; the capability drop below still closes the climb
        return
    os.chdir(root)
    _check(libc.syscall(SYS_PIVOT_ROOT_X86_64, b".", b"."), "pivot_root")  # the old root stacks under the new
    _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def _drop_bounding_set(libc: Any) -> None:
    """Empty the bounding set (needs CAP_SETPCAP: a root grader's child does it before leaving root)."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
            break


def _drop_capabilities(libc: Any) -> str:
    """Empty the bounding, ambient, effective, permitted and inheritable sets (a user-namespace child held them all)."""
    _drop_bounding_set(libc)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3, all sets empty
    _check(libc.capset(ctypes.byref(header), data), "capset")
    effective = next((line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("CapEff:")), "?")
    if int(effective, 16) != 0:
        raise SandboxError(f"capabilities are still held after dropping them ({effective})")
    return "none"


def seccomp_program(refused: dict[str, int] | None = None, clones: bool = True,
                    socket_families: tuple[int, ...] = ()) -> list[tuple[int, int, int, int]]:
    """A filter as classic BPF (code, jt, jf, k): `refused` (REFUSED_SYSCALLS_X86_64) and namespace clones, EPERM.

    Another architecture's calling convention (i386 through `int 0x80`, x32) is refused whole: its numbers differ,
    so a listed syscall would pass under another number. `clone3` gets ENOSYS, so glibc falls back to `clone`,
    whose flags a filter can read.
    """
    ld_abs, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    # (op, jump-true label, jump-false label, k); labels are resolved to relative offsets below
    code: list[tuple[int, str | None, str | None, int]] = [
        (ld_abs, None, None, 4), (jeq, "number", "eperm", AUDIT_ARCH_X86_64)]
    code.append((ld_abs, None, None, 0))  # "number"
    numbers = REFUSED_SYSCALLS_X86_64 if refused is None else refused
    code += [(jeq, "eperm", None, nr) for nr in sorted(set(numbers.values()))]
    after = "clones" if clones else "sockets" if socket_families else "allow"
    code.append((jge, "eperm", after, X32_SYSCALL_BIT))
    labels: dict[str, int] = {"number": 2}
    tail: list[tuple[str | None, tuple[int, str | None, str | None, int]]] = []
    if clones:
        tail = [("clones", (jeq, "enosys", None, SYS_CLONE3)), (None, (jeq, None, "allow", SYS_CLONE_X86_64)),
                (None, (ld_abs, None, None, 16)), (None, (jset, "eperm", "allow", CLONE_NAMESPACES))]  # args[0]
    if socket_families:
        tail += [("sockets", (jeq, None, "allow", SYS_SOCKET_X86_64)), (None, (ld_abs, None, None, 16))]
        tail += [(None, (jeq, "eperm", None, family)) for family in socket_families]
        tail.append((None, (0x05, None, None, 0)))  # ja -> allow (patched below)
    tail += [("allow", (ret, None, None, allow)), ("eperm", (ret, None, None, eperm)),
             ("enosys", (ret, None, None, enosys))]
    for name, instruction in tail:
        if name:
            labels[name] = len(code)
        code.append(instruction)
    program = [(op, labels[jt] - at - 1 if jt else 0, labels[jf] - at - 1 if jf else 0, k)
               for at, (op, jt, jf, k) in enumerate(code)]
    return [(op, jt, jf, labels["allow"] - at - 1 if op == 0x05 else k) for at, (op, jt, jf, k) in enumerate(program)]


def _install_syscall_filter(libc: Any, code: list[tuple[int, int, int, int]] | None = None) -> str:
    """Load `code` (`seccomp_program()`; after no_new_privs); what the report says of it."""
    if os.uname().machine != "x86_64":
        return f"all allowed (no filter for {os.uname().machine})"

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    code = code or seccomp_program()
    instructions = (Instruction * len(code))(*[Instruction(*op) for op in code])
    program = Program(len(code), instructions)
    # every thread of the process, not only this one: a filter added once CUDA's and torch's threads exist left them
    # unfiltered, and a signal handler run on one of them made a memfd (session 35's red-teamer)
    _check(libc.syscall(SYS_SECCOMP_X86_64, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                        ctypes.byref(program)), "seccomp filter (all threads)")
    return "filtered (namespaces, mounts, root changes, other processes' memory, bpf, modules, keys, io_uring)"


def refuse_after_warmup(iso: Isolation, *, cuda: bool) -> None:
    """Add the late filter (stacked: none can be removed) and say so in `iso`.

    It refuses REFUSED_AFTER_WARMUP_X86_64, and REFUSED_WITHOUT_CUDA_X86_64 where the child has no CUDA.
    """
    if iso.mode == "none" or not iso.syscalls.startswith("filtered"):
        return
    refused = dict(REFUSED_AFTER_WARMUP_X86_64) | ({} if cuda else REFUSED_WITHOUT_CUDA_X86_64)
    try:
        _install_syscall_filter(_libc(), seccomp_program(refused, clones=False,
                                                         socket_families=REFUSED_SOCKET_FAMILIES))
    except SandboxError as exc:
        iso.errors.append(str(exc))
        return
    iso.syscalls = iso.syscalls.rstrip(")") + ("; message queues and vsock once warm)" if cuda else
                                               "; memfd, message queues and vsock once warm)")


def _become_pid_namespace_init() -> None:
    """Fork: the child goes on as pid 1 of the new pid namespace; this process waits and passes its exit on."""
    pid = os.fork()
    if pid == 0:
        # pid 1 may leave the process group the worker kills (`setsid`); it dies with the waiter, and with it the
        # whole namespace (session 35's red-teamer: a child that did so kept its CUDA context after the grading)
        # (no race to check: until it calls `setsid` later, it is still in the group a kill of the waiter takes)
        _libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        return
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def enter(plan: Plan) -> Isolation:
    """Apply `plan` to this process (the child, before torch is imported); raise SandboxError if it cannot."""
    iso = Isolation(mode=plan.mode, opted_out=plan.allow_unsandboxed and plan.mode == "none")
    iso.limits = _limits()
    if plan.mode == "none":
        if not plan.allow_unsandboxed:
            raise SandboxError("no isolation is available on this machine")
        return iso
    libc = _libc()
    try:
        if plan.mode == "userns":
            uid, gid = os.geteuid(), os.getegid()
            # (its own IPC namespace too: SysV objects and message queues die with it. The uid mode keeps the
            # grader's, untried with legacy CUDA IPC; `reap` removes what the child's uid left there)
            _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC),
                   "unshare(user, mount, net, pid, ipc)")
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
            _become_pid_namespace_init()  # a fresh /proc can only be mounted from inside the new pid namespace
        else:
            _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(mount, net)")
        iso.network = "none (own empty namespace)"
        _build_root(libc, plan, iso)
        if plan.mode == "uid":
            _drop_bounding_set(libc)  # while CAP_SETPCAP is still held
            os.setgroups([])
            os.setresgid(plan.gid, plan.gid, plan.gid)
            os.setresuid(plan.uid, plan.uid, plan.uid)
            iso.uid = plan.uid
            try:
                os.setuid(0)
            except PermissionError:
                pass
            else:
                raise SandboxError("privileges could be regained after dropping them")
        iso.capabilities = _drop_capabilities(libc)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
        iso.no_new_privs = True
        iso.syscalls = _install_syscall_filter(libc)
    except (SandboxError, OSError) as exc:
        if plan.allow_unsandboxed:
            iso.errors.append(str(exc))
            iso.mode, iso.opted_out = "none", True
            return iso
        raise SandboxError(str(exc)) from exc
    home = plan.work
    for key in ("HOME", "TMPDIR", "TMP", "TEMP"):
        os.environ[key] = home
    os.environ["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    return iso


__all__ = ["Isolation", "Plan", "SandboxError", "default_mode", "enter", "make_plan", "opted_out",
           "protect_parent", "reap", "refuse_after_warmup", "visible_paths"]
