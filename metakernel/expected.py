"""Computing what a result is judged against: the native reference and the float64 anchor.

The anchor runs `reference` on inputs whose floating tensors are upcast to float64 (integer and bool inputs are
used as they are), so it is the most precise answer the problem's own code defines. Inputs a problem MUTATES are
cloned for every evaluation, so the caller's tensors stay as drawn.
"""

from __future__ import annotations

from typing import Any

import torch

from metakernel.compare import Expected, named_leaves
from metakernel.problem import Problem
from metakernel.structure import default_names, flatten


def upcast(x: Any) -> Any:
    """Floating tensors → new float64 tensors (recursively through tuples and lists); other values unchanged."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(upcast(v) for v in x)
    return x


def clone_tensors(x: Any) -> Any:
    """Deep copy of tensors (so an evaluation cannot change the caller's inputs)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(clone_tensors(v) for v in x)
    return x


def prepare_args(problem: Problem, inputs: list[Any], *, to_float64: bool) -> list[Any]:
    """Arguments for one reference call: mutated inputs cloned, floats upcast when asked."""
    args = []
    for name, value in zip(problem.input_names, inputs, strict=True):
        value = clone_tensors(value) if name in problem.mutates else value
        args.append(upcast(value) if to_float64 else value)
    return args


def fresh_copies(problem: Problem, inputs: list[Any]) -> list[Any]:
    """Inputs for one call: MUTATES ones cloned, so every call starts from the drawn state; the rest shared."""
    return [x.clone() if n in problem.mutates and isinstance(x, torch.Tensor) else x
            for n, x in zip(problem.input_names, inputs, strict=True)]


def unchanged_snapshot(problem: Problem, inputs: list[Any]) -> dict[int, torch.Tensor]:
    """Copies of every input a call must leave alone, by position, to prove afterwards that it did."""
    return {i: x.clone() for i, (n, x) in enumerate(zip(problem.input_names, inputs, strict=True))
            if isinstance(x, torch.Tensor) and n not in problem.mutates}


def run_reference(problem: Problem, inputs: list[Any], *, to_float64: bool = False
                  ) -> tuple[Any, dict[str, torch.Tensor]]:
    """(returned result, mutated inputs by name) of one reference call on (copies of) `inputs`."""
    args = prepare_args(problem, inputs, to_float64=to_float64)
    with torch.no_grad():
        returned = problem.reference(*args)
    mutated = {n: args[problem.input_names.index(n)] for n in problem.mutates}
    return returned, mutated


def output_names(problem: Problem, returned: Any) -> tuple[str, ...]:
    """Names of the returned tensors: the file's OUTPUT_NAMES or the defaults."""
    return problem.output_names if problem.output_names is not None else default_names(returned)


def compute_expected(problem: Problem, inputs: list[Any]) -> Expected:
    """Reference and anchor for one draw of inputs, plus the score tensors that top-k comparators need."""
    returned, mutated = run_reference(problem, inputs)
    anchor_returned, anchor_mutated = run_reference(problem, inputs, to_float64=True)
    names = output_names(problem, returned)
    reference = named_leaves(returned, mutated, names)
    anchor = named_leaves(anchor_returned, anchor_mutated, names)
    returned_count = len(flatten(returned))
    if returned_count != len(names):
        raise ValueError(f"OUTPUT_NAMES has {len(names)} names but reference returns {returned_count} tensor(s)")
    scores: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for spec in problem.comparators.values():
        if spec.scores and spec.scores not in scores:
            fn = problem.function(spec.scores)
            with torch.no_grad():
                native = fn(*prepare_args(problem, inputs, to_float64=False))
                anchored = fn(*prepare_args(problem, inputs, to_float64=True))
            scores[spec.scores] = (native, anchored)
    return Expected(returned=returned, names=names, mutated=problem.mutates, anchor=anchor, reference=reference,
                    specs=dict(problem.comparators), scores=scores)
