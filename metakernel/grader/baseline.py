"""Baselines: the problem's eager `reference` (primary) and torch.compile of it (secondary).

Each is timed by the candidate's procedure in a clean child process and cached on disk per (problem content hash,
GPU, torch version, scale, L2 flush), so a baseline is measured once per machine, not once per submission.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from metakernel.expected import fresh_copies
from metakernel.grader.report import Timing
from metakernel.grader.timing import bracket_settings, fresh_draw, knobs, measure, profile_kernels
from metakernel.grader.worker import Worker, WorkerFailure
from metakernel.jsonio import write_json_atomic
from metakernel.problem import Problem


def cache_dir() -> Path:
    """`METAKERNEL_CACHE_DIR` or ~/.cache/metakernel."""
    return Path(os.environ.get("METAKERNEL_CACHE_DIR") or Path.home() / ".cache" / "metakernel")


def _key(problem: Problem, device: str, scale: str, kind: str, setting: str) -> str:
    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    # "gpu-only-adaptive": older entries lack the eager GPU kernel time or profiled a fixed 6 draws; measure again
    raw = json.dumps([problem.content_hash, problem.version, gpu, torch.__version__, device, scale, kind, setting,
                      "gpu-only-adaptive"])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _gpu_kernel_us(worker: Worker, problem: Problem, device: str, scale: str, options: Any) -> float | None:
    """The baseline's GPU kernel time per call, profiled over fresh draws like a candidate's; None if unknown."""
    reply = profile_kernels(worker, problem, device, scale, options)
    total = sum(us for _, us in reply.get("kernels", [])) if reply.get("ok") else 0.0
    return total or None


def eager_timing(problem: Problem, device: str, scale: str, *, kind: str, options: Any,
                 use_cache: bool = True) -> Timing | None:
    """Median time of the reference (kind "eager") or its torch.compile form (kind "compile")."""
    setting = f"{options.flush_l2}-{options.spin_ms}"
    if options.host_gate > 0 or options.min_timing_s > 0:
        setting += f"-gate{options.host_gate}-{options.min_timing_s}-{options.host_gate_wait_s}-{options.host_fast_us}"
    key = _key(problem, device, scale, kind, setting)
    path = cache_dir() / "baselines" / f"{problem.nn}-{kind}-{key}.json"
    if use_cache and path.is_file():
        return Timing(**json.loads(path.read_text())["timing"])
    worker = Worker(kind=kind, path=problem.path, device=device, start_timeout=options.start_timeout_s)
    try:
        worker.start()

        def call(i: int) -> dict[str, Any]:
            inputs = fresh_draw(problem, device, scale)
            sent = fresh_copies(problem, inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            reply = worker.request({"op": "time", "inputs": sent, "return_outputs": False,
                                    **bracket_settings(options)}, timeout=options.call_timeout_s)
            if not reply.get("ok"):
                raise WorkerFailure(reply.get("status", "runtime_error"), reply.get("error", ""))
            reply["wall_s"] = time.perf_counter() - t0
            return reply

        timing, _ = measure(call, **knobs(options))
        if device == "cuda" and options.profile:
            try:
                timing.gpu_only_us = _gpu_kernel_us(worker, problem, device, scale, options)
            except WorkerFailure:
                pass  # the eager timing stands; only its GPU-only time stays unknown
    except WorkerFailure:
        return None
    finally:
        worker.close()
    write_json_atomic(path, {"problem": problem.identity, "kind": kind, "timing": asdict(timing)}, indent=None)
    return timing
