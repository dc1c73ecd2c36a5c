"""Baselines: the problem's eager `reference` (primary) and torch.compile of it (secondary).

Each is timed by the candidate's procedure in a clean child process of the grader's own (the same sandbox) and
cached on disk per (problem content hash, GPU, torch version, scale, timing settings), so a baseline is measured
once per machine, not once per submission. Candidates never see the cache: their filesystem view does not hold
it. Every entry is still verified before use — owned by this user, writable by nobody else, its key and checksum
matching — and an entry that fails is measured again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from metakernel.expected import fresh_copies
from metakernel.grader.report import PROTOCOL, Timing
from metakernel.grader.timing import bracket_settings, fresh_draw, knobs, measure, profile_kernels
from metakernel.grader.worker import StartingWorker, Worker, WorkerFailure
from metakernel.jsonio import write_json_atomic
from metakernel.problem import Problem


def cache_dir() -> Path:
    """`METAKERNEL_CACHE_DIR` or ~/.cache/metakernel."""
    return Path(os.environ.get("METAKERNEL_CACHE_DIR") or Path.home() / ".cache" / "metakernel")


def _key(problem: Problem, device: str, scale: str, kind: str, setting: str) -> str:
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    # the protocol: 2 = the sandboxed child over the arena transport, 3 = timed in requests of calls in a row
    raw = json.dumps([problem.content_hash, problem.version, gpu, torch.__version__, device, scale, kind, setting,
                      "gpu-only-adaptive", f"protocol-{PROTOCOL}"])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _checksum(key: str, timing: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([key, timing], sort_keys=True).encode()).hexdigest()


def read_entry(path: Path, key: str) -> Timing | None:
    """A cached baseline, or None when it is missing or cannot be trusted (owner, mode, key, checksum)."""
    try:
        st = path.stat()
        folder = path.parent.stat()
    except OSError:
        return None
    uid = os.geteuid()
    if st.st_uid != uid or folder.st_uid != uid or st.st_mode & 0o022 or folder.st_mode & 0o022:
        return None
    try:
        entry = json.loads(path.read_text())
        if entry.get("key") != key or entry.get("checksum") != _checksum(key, entry["timing"]):
            return None
        return Timing(**entry["timing"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_entry(path: Path, key: str, problem: Problem, kind: str, timing: Timing) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    body = asdict(timing)
    write_json_atomic(path, {"problem": problem.identity, "kind": kind, "key": key, "timing": body,
                             "checksum": _checksum(key, body)}, indent=None)
    os.chmod(path, 0o600)


def _entry_path(problem: Problem, device: str, scale: str, kind: str, options: Any) -> tuple[Path, str]:
    """Where a baseline of these timing settings is cached, and its key."""
    setting = f"{options.flush_l2}"
    if options.host_gate > 0 or options.min_timing_s > 0:
        setting += f"-gate{options.host_gate}-{options.min_timing_s}-{options.host_gate_wait_s}-{options.host_fast_us}"
    key = _key(problem, device, scale, kind, setting)
    return cache_dir() / "baselines" / f"{problem.nn}-{kind}-{key}.json", key


def cached_timing(problem: Problem, device: str, scale: str, *, kind: str, options: Any) -> Timing | None:
    """The cached baseline, if one can be trusted (`read_entry`)."""
    path, key = _entry_path(problem, device, scale, kind, options)
    return read_entry(path, key)


def baseline_worker(problem: Problem, device: str, scale: str, *, kind: str, options: Any) -> Worker:
    """The (not yet started) clean child that times the reference: no candidate code, the grader's own sandbox."""
    from metakernel.grader import timing
    from metakernel.grader.evaluate import exchange_sizes

    sizes = exchange_sizes(problem, device, scale, timing.ROW)
    return Worker(kind=kind, path=problem.path, device=device, start_timeout=options.start_timeout_s,
                  in_bytes=sizes.in_bytes, out_bytes=sizes.out_bytes, slots=sizes.slots,
                  require_isolation=getattr(options, "require_isolation", None))


def eager_timing(problem: Problem, device: str, scale: str, *, kind: str, options: Any,
                 use_cache: bool = True, ahead: StartingWorker | None = None) -> Timing | None:
    """Median time of the reference (kind "eager") or its torch.compile form (kind "compile").

    `ahead`: its clean child, started earlier (`baseline_worker` in a `StartingWorker`), so that its imports
    overlapped the candidate's checks; used, or closed when the cache already holds the baseline.
    """
    path, key = _entry_path(problem, device, scale, kind, options)
    if use_cache:
        cached = read_entry(path, key)
        if cached is not None:
            if ahead is not None:
                ahead.discard()
            return cached
    from metakernel.grader import timing

    worker = ahead.worker if ahead is not None else baseline_worker(problem, device, scale, kind=kind,
                                                                     options=options)
    try:
        if ahead is not None:
            ahead.result()
        else:
            worker.start()

        def draws(count: int) -> list[list[Any]]:
            return [fresh_copies(problem, fresh_draw(problem, device, scale)) for _ in range(count)]

        def send(msg: dict[str, Any], batch: list[list[Any]]) -> dict[str, Any]:
            reply, _ = worker.exchange(msg, batch, options.call_timeout_s)
            if not reply.get("ok"):
                raise WorkerFailure(reply.get("status", "runtime_error"), reply.get("error", ""))
            return reply

        chunk = timing.row_size(worker.slots)

        def call(i: int) -> dict[str, Any]:  # timed exactly as candidates are (child.Child.row)
            return send({"op": "row", **bracket_settings(options)}, draws(chunk))  # wall_s: Worker.exchange's

        result, _ = measure(call, **knobs(options))
        if device == "cuda" and options.profile:
            try:
                reply = profile_kernels(lambda count: send({"op": "profile"}, draws(count)), options, chunk)
                result.gpu_only_us = sum(us for _, us in reply.get("kernels", [])) or None
            except WorkerFailure:
                pass  # the eager timing stands; only its GPU-only time stays unknown
    except WorkerFailure as exc:
        if exc.status == "infra_error" and exc.reason == "start":  # our own error while starting it ahead (no
            raise RuntimeError(exc.text) from exc  # memory for its arenas): the grading's infra_error, as before
        return None
    finally:
        worker.close()
    _write_entry(path, key, problem, kind, result)
    return result
