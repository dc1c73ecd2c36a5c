"""The two variants of every problem: the same task, a different kernel DSL.

This module only names them and writes the task text an agent reads; how to write `solve` in each DSL (launch
route, streams, dry-run check) belongs to the DSL adapters.
"""

from __future__ import annotations

from dataclasses import dataclass

from metakernel.grader.report import PROTOCOL
from metakernel.problem import Problem


@dataclass(frozen=True)
class Dsl:
    """A kernel DSL a variant requires."""

    key: str
    name: str
    package: str
    imports: str


DSLS: dict[str, Dsl] = {
    "cute": Dsl("cute", "CuTe DSL", "nvidia-cutlass-dsl 4.8.1",
                "import cutlass\nimport cutlass.cute as cute"),
    "tirx": Dsl("tirx", "TIRx", "apache-tvm 0.27.0.post1 (tvm.script.tirx, tvm.compile(..., tir_pipeline=\"tirx\"))",
                "import tvm\nfrom tvm.script import tirx as Tx"),
}

_RULES = """\
Write one file, kernel.py (at most 300 KB), defining solve(*inputs). It is called positionally with the list
make_inputs() returns (CUDA tensors on an H200, sm_90a) and must return the same structure as reference():
container types, lengths and nesting; every tensor a plain torch.Tensor (no subclass) on the GPU, with the
reference's shape and dtype.{mutates}
Every call must launch {dsl} kernels whose computed values the returned tensors depend on, and those kernels must
take at least 50 % of the call's GPU time (a kernel the outputs do not depend on counts as not {dsl}); a {dsl}
kernel may read only the tensors passed to its launch (not memory reached by offsets past them); eager
PyTorch and plain Python may do the rest. You may cache compiled
kernels, static metadata and output buffers, never input-dependent results. Imports: torch, math, typing,
functools, itertools, dataclasses, enum, collections, numbers and the {dsl} packages only. Forbidden: other kernel
languages or compilers (Triton, CUDA C/C++ by any route, torch.compile, torch.jit, cpp_extension, jiterator),
library kernels reached through the DSL, CUDA graphs, calling or reusing reference/make_inputs, reading seeds,
timers, allocator statistics or grader state, processes, files, sockets, introspection (dunder attributes,
frames, gc, getattr with computed names) and assigning to attributes of modules or of torch's objects. The kernel
runs in a sandbox (its own user, no network, a private filesystem); what it refuses is a rule violation.
Correctness: outputs are compared with reference() on float64-upcast inputs on at least 5 fresh random draws and
on a secret random share of the timed and profiled calls, so every call must be right;
a float output passes iff max|out - anchor| <= 3 * max(ref_err, eps(dtype) * max|anchor|), where ref_err is the
error of reference() itself in the original dtypes. Integer outputs must be exact.{comparators}
Score: end-to-end time of solve() against eager PyTorch (speedup = eager median / your median), only if correct.
Timing calls solve in rows of fresh draws back to back, each call in its own bracket with a full device sync;
a row's first call only warms the host, the median is over the later ones (grading protocol {protocol})."""


def task_text(problem: Problem, dsl_key: str) -> str:
    """The task an agent is given for one variant: the problem file, the contract and the DSL it must use."""
    dsl = DSLS[dsl_key]
    mutates = ""
    if problem.mutates:
        mutates = (f"\nsolve must update {', '.join(problem.mutates)} in place exactly as reference does; all other "
                   "inputs must be left unchanged.")
    special = {n: s.kind for n, s in problem.comparators.items() if s.kind not in ("float", "exact")}
    comparators = ""
    if special:
        comparators = "\nSpecial comparators: " + ", ".join(f"{n}: {k}" for n, k in special.items()) + (
            " (topk: any valid tie-break and order within a row; quantized: dequantized values within one unit "
            "in the last place of the storage format plus the scale's error).")
    return (
        f"# Problem {problem.nn}: {problem.slug} ({dsl.name} variant)\n\n"
        f"{problem.title}\n\n"
        f"Write the kernel in {dsl.name} ({dsl.package}):\n```python\n{dsl.imports}\n```\n\n"
        f"## Rules\n{_RULES.format(dsl=dsl.name, mutates=mutates, comparators=comparators, protocol=PROTOCOL)}\n\n"
        f"## The problem file ({problem.path.parent.name}/{problem.path.name})\n```python\n{problem.source}```\n"
    )
