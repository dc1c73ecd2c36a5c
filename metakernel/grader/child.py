"""The candidate's process: imports the DSL and the kernel file, then runs `solve` on request.

Started by `metakernel.grader.worker.Worker` as a fresh interpreter (never forked from a process with CUDA state)
with a scrubbed environment. It never sees seeds, the reference or expected outputs: the parent sends inputs and
receives outputs over a Unix socket; torch's multiprocessing reductions move tensors by CUDA IPC (GPU) or shared
memory (CPU), so mutated inputs are visible to the parent in place. Timers and sync functions are captured before
the candidate is imported, so a candidate that patches `torch.cuda.Event.elapsed_time` does not fool us.

Run as `python -m metakernel.grader.child` with a JSON config on stdin.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_perf = time.perf_counter  # captured before any candidate code exists


def _limit_resources() -> dict[str, Any]:
    applied: dict[str, Any] = {}
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        applied["core"] = 0
    except (ImportError, ValueError, OSError):
        pass
    unshare = getattr(os, "unshare", None)
    if unshare is not None and hasattr(os, "CLONE_NEWNET"):
        try:
            unshare(os.CLONE_NEWNET)  # no network: a fresh, empty network namespace
            applied["network"] = "isolated"
        except OSError as exc:
            applied["network"] = f"not isolated ({exc.strerror})"
    else:
        applied["network"] = "not isolated (no os.unshare)"
    return applied


def _pin_near_gpu(torch: Any) -> None:
    """Pin this process to two fixed cores on the GPU's NUMA node before the first timed call.

    End-to-end times of small kernels are mostly host time (Python, launch, sync); the same kernel graded twice
    differed by up to 35 % between processes even with the GPU kept busy, which is what a different core (or socket)
    per process does to launch and sync latency. The same two GPU-local cores every time remove that lottery.
    """
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        text = Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text().strip()
        cpus: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        allowed = sorted(os.sched_getaffinity(0))
        usable = [c for c in cpus if c in allowed] or allowed
    except (OSError, ValueError, AttributeError, RuntimeError):
        usable = sorted(os.sched_getaffinity(0))
    if len(usable) > 2:
        os.sched_setaffinity(0, usable[-2:])  # the last two: away from core 0's interrupts and housekeeping


class Child:
    """The request loop."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.device = config["device"]
        self.keep: Any = None  # last outputs, kept alive until the parent has copied them (CUDA IPC)
        self.adapter: Any = None
        self.gate: Any = None
        self.solve: Any = None
        self._spin_buf: Any = None
        self._pinned = False

    # -------------------------------------------------------------------------------------------- set-up
    def setup(self) -> dict[str, Any]:
        """Import torch, then the DSL with its launch hooks, then the kernel file (or the reference)."""
        import torch
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy("file_system")
        self.torch = torch
        if self.device == "cuda":
            torch.cuda.init()
            self._sync = torch.cuda.synchronize
            self._event = torch.cuda.Event
            self._record = torch.cuda.Event.record
            self._elapsed = torch.cuda.Event.elapsed_time
        kind = self.config["kind"]
        if kind == "candidate":
            from metakernel.dsl import LaunchGate, get_adapter

            self.adapter = get_adapter(self.config["dsl"])
            self.gate = LaunchGate(mode="intercept" if self.config.get("dry_run") else "run")
            started = _perf()
            self.adapter.import_dsl()
            self.adapter.install_hooks(self.gate)
            dsl_import_s = _perf() - started
            started = _perf()
            module = _import_file(self.config["path"], "candidate_kernel")
            solve = getattr(module, "solve", None)
            if not callable(solve):
                raise _Fail("compile_error", "kernel.py defines no callable solve(*inputs)")
            self.solve = solve
            return {"dsl_import_s": dsl_import_s, "import_s": _perf() - started}
        module = _import_file(self.config["path"], "baseline_problem")
        self.solve = module.reference
        if kind == "compile":
            self.solve = torch.compile(module.reference)
        return {}

    # -------------------------------------------------------------------------------------------- requests
    def poison(self, nbytes: int, pattern: int) -> None:
        """Fill memory the caching allocator will hand out next, so a never-written output holds garbage."""
        if nbytes <= 0:
            return
        torch = self.torch
        block = torch.empty(int(nbytes), dtype=torch.uint8, device=self.device)
        block.fill_(pattern)
        del block

    def spin(self, seconds: float) -> None:
        """Keep the GPU and this CPU busy for `seconds` right before a timed call.

        Between timed calls the parent draws fresh inputs and ships them over IPC; in that gap an H200 drops to idle
        clocks (345 MHz measured) and the next short call is timed while clocks ramp up again, which made the
        same kernel's median differ by up to 28 % between two gradings. Back-to-back small kernels launched from a
        host loop hold both the GPU and the launching core at speed; the work is synchronised before the timed
        bracket starts, so none of it is counted.
        """
        torch = self.torch
        if self._spin_buf is None:
            self._spin_buf = torch.ones(4 * 1024 * 1024, dtype=torch.float32, device="cuda")
        buf = self._spin_buf
        until = _perf() + seconds
        while _perf() < until:
            for _ in range(8):
                buf.mul_(1.0)
        self._sync()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One bracketed call of solve: sync, start event, solve, full sync, end event.

        `local_inputs`, `warm_first` and `repeat` exist for the timing study (scripts/bench_timing_modes.py) and are
        never set by grading: time on child-owned copies, after an untimed call, or over N calls divided by N.
        """
        torch = self.torch
        self.keep = None
        if self.gate is not None:
            self.gate.mode = msg.get("mode", self.gate.mode if self.config.get("dry_run") else "run")
            self.gate.reset()
            self.gate.audit = bool(msg.get("audit"))
        self.poison(msg.get("poison", 0), msg.get("pattern", 0xFF))
        timed = msg["op"] == "time"
        if timed and msg.get("flush_l2") and self.device == "cuda":
            scratch = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
            scratch.fill_(1)
            del scratch
        if timed and self.device == "cuda" and not self._pinned:
            self._pinned = True
            _pin_near_gpu(torch)
        if timed and msg.get("spin_ms") and self.device == "cuda":
            self.spin(float(msg["spin_ms"]) / 1e3)
        received = msg["inputs"]
        local = timed and bool(msg.get("local_inputs")) and self.device == "cuda"
        inputs = _local_copies(torch, received) if local else received
        repeat = max(1, int(msg.get("repeat", 1))) if timed else 1
        probe_torch = timed and bool(msg.get("probe_torch"))
        probe_before = host_probe() if timed else None
        torch_before = torch_probe(torch) if probe_torch else None
        if self.device == "cuda":
            if timed and msg.get("warm_first"):
                with torch.no_grad():
                    self.solve(*inputs)
            self._sync()
            start, end = self._event(enable_timing=True), self._event(enable_timing=True)
            self._record(start)
            gc_was = gc.isenabled()
            gc.disable()  # a collection inside the bracket would be charged to whichever call it hit
            host0 = _perf()
            try:
                with torch.no_grad():
                    for _ in range(repeat):
                        out = self.solve(*inputs)
                self._sync()
            finally:
                if gc_was:
                    gc.enable()
            host1 = _perf()
            self._record(end)
            end.synchronize()
            event_s = self._elapsed(start, end) / 1e3 / repeat
            if local:
                _copy_back(received, inputs)
        else:
            host0 = _perf()
            with torch.no_grad():
                out = self.solve(*inputs)
            host1 = _perf()
            event_s = host1 - host0
        reply = {"ok": True, "event_s": event_s, "host_s": (host1 - host0) / repeat,
                 "launches": self.gate.launches if self.gate else None}
        if probe_before is not None:  # the host may have turned slow during the bracket: a draw counts as fast
            probe_after = host_probe()  # only if the host was fast on both sides of it
            reply.update(probe_s=max(probe_before, probe_after), probe_before_s=probe_before,
                         probe_after_s=probe_after)
        if torch_before is not None:
            reply["probe_torch_s"] = max(torch_before, torch_probe(torch))
        if self.gate is not None and self.gate.audit:
            reply["audited"] = self.gate.audited
            self.gate.audit = False
        self.keep = (out, reply.get("audited"))
        if msg.get("return_outputs", True):
            reply["out"] = _unalias(out, inputs)
        return reply

    def profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Kernel names and device times per call, averaged over a few fresh draws (DSL time share, GPU-only time).

        Several draws, not one draw repeated: a data-dependent kernel (paged attention over random lengths) does
        different work per draw, and one draw's GPU time moved 10-15 % between two gradings of the same kernel.
        """
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        draws = msg.get("draws") or [msg["inputs"]]
        repeats = int(msg.get("repeats", 1))
        calls = len(draws) * repeats
        if self.gate is not None:
            self.gate.mode = "run"
            self.gate.reset()
        with profile(activities=activities) as prof, torch.no_grad():
            for inputs in draws:
                for _ in range(repeats):
                    self.keep = self.solve(*inputs)
            if self.device == "cuda":
                self._sync()
        kernels: list[tuple[str, float]] = []
        for evt in prof.events():
            device_type = getattr(evt, "device_type", None)
            device_us: Any = getattr(evt, "device_time", None) or 0.0
            if device_type is not None and str(device_type).endswith("CUDA") and device_us:
                kernels.append((evt.name, float(device_us) / calls))
        return {"ok": True, "kernels": kernels, "repeats": calls,
                "kernel_names": sorted(self.gate.kernel_names) if self.gate else [],
                "launches": self.gate.launches / calls if self.gate else None}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Dispatch one request."""
        op = msg["op"]
        if op in ("call", "time"):
            return self.call(msg)
        if op == "profile":
            return self.profile(msg)
        raise _Fail("infra_error", f"unknown request {op!r}")


def host_probe(iterations: int = 1000) -> float:
    """Seconds this interpreter takes for a fixed loop now: the host's CPU speed just before a timed call.

    The VMs measured alternate between a fast and a ~2x slower CPU state for about a second at a time
    (validation/cpu-host-speed.json); the parent can count only draws taken in the fast state (timing.measure).
    """
    started = _perf()
    total = 0
    for i in range(iterations):
        total += i
    return _perf() - started


def torch_probe(torch: Any, calls: int = 20) -> float:
    """Seconds for a fixed run of tiny CPU torch calls: host speed on the dispatcher path every launch takes.

    For the timing study (`GradeOptions.keep_draws`), beside the pure-Python `host_probe`: on the H200 two gradings
    with the same Python-probe level still differed by 8 % (validation/h200-grader-bench-gate2.json, 44 CuTe).
    """
    a = torch.ones(16)
    started = _perf()
    for _ in range(calls):
        b = torch.empty_like(a)
        torch.add(a, 1.0, out=b)
    return _perf() - started


def _local_copies(torch: Any, received: list[Any]) -> list[Any]:
    """Child-owned copies of the received GPU tensors (same strides), made before the timed bracket.

    For the timing study (`scripts/bench_timing_modes.py`): received tensors live in the parent's memory, mapped
    in by CUDA IPC, while a model's kernel reads tensors its own process allocated. Measured on the H200, timing on
    the copies changed medians by a few percent either way and not the spread between processes
    (validation/h200-timing-modes.json), so grading times the received tensors.
    """
    return [x.clone() if isinstance(x, torch.Tensor) and x.is_cuda else x for x in received]


def _copy_back(received: list[Any], local: list[Any]) -> None:
    """Write the local copies back into the received tensors, so in-place effects reach the parent's checks."""
    for theirs, ours in zip(received, local, strict=True):
        if ours is not theirs:
            theirs.copy_(ours)


def _unalias(out: Any, inputs: list[Any]) -> Any:
    """Clone returned tensors that share memory with a received input.

    torch cannot send a tensor it received from another process back to it, and the parent compares such an input
    on its own anyway.
    """
    import torch

    received = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return node.clone() if node.untyped_storage().data_ptr() in received else node
        if isinstance(node, (tuple, list)):
            return type(node)(walk(v) for v in node)
        return node

    return walk(out)


class _Fail(Exception):
    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _import_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _Fail("compile_error", f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _candidate_traceback(exc: BaseException) -> str:
    """The traceback without the harness's own frames (and importlib's): what the agent can act on."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_HARNESS) and "importlib._bootstrap" not in f.filename]
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(exc), exc)))


def _failure(child: Child, exc: BaseException, status: str) -> dict[str, Any]:
    text = _candidate_traceback(exc)
    if child.adapter is not None:
        try:
            text = child.adapter.clean_error(text)
        except Exception:  # noqa: BLE001 - cleaning must never hide the error itself
            pass
    fatal = "illegal memory access" in text or "CUDA error" in text or "unspecified launch failure" in text
    return {"ok": False, "status": status, "error": text, "fatal": fatal}


def main() -> None:
    """Read the config, connect back to the parent, set up, and serve requests until told to exit."""
    config = json.loads(sys.stdin.readline())
    from multiprocessing.connection import Client

    conn = Client(config["address"], family="AF_UNIX", authkey=bytes.fromhex(config["authkey"]))
    applied = _limit_resources()
    child = Child(config)
    try:
        info = child.setup()
        conn.send({"ok": True, "ready": True, "limits": applied, **info})
    except _Fail as exc:
        conn.send({"ok": False, "status": exc.status, "error": exc.text})
        return
    except BaseException as exc:  # noqa: BLE001 - an import-time failure of the candidate is its compile error
        conn.send(_failure(child, exc, "compile_error"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg.get("op") == "exit":
            conn.send({"ok": True})
            return
        try:
            reply = child.handle(msg)
        except _Fail as exc:
            reply = {"ok": False, "status": exc.status, "error": exc.text}
        except BaseException as exc:  # noqa: BLE001 - candidate failures are reported, never fatal to the loop
            classify = getattr(child.adapter, "is_compile_error", None)
            reply = _failure(child, exc, "compile_error" if classify and classify(exc) else "runtime_error")
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an output that cannot be shared (not a tensor)
            child.keep = None
            conn.send({"ok": False, "status": "runtime_error",
                       "error": f"solve returned something the harness cannot transfer: {type(exc).__name__}: {exc}"})
        if not reply.get("ok") and reply.get("fatal"):
            return


if __name__ == "__main__":
    main()
