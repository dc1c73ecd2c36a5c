"""Output structures: flattening nested results into named tensors and checking a candidate's shape of result.

A result is a tensor, None, or a tuple/list nesting of those. Comparison happens leaf by leaf, but the container
types must match first: a list where the reference returns a tuple is a wrong answer, not a detail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Leaf:
    """One tensor of a result, with the path that reaches it (e.g. `(1, 0)`)."""

    path: tuple[int, ...]
    tensor: torch.Tensor


def flatten(result: Any) -> list[Leaf]:
    """The tensors of a result in depth-first order."""
    leaves: list[Leaf] = []

    def walk(node: Any, path: tuple[int, ...]) -> None:
        if isinstance(node, torch.Tensor):
            leaves.append(Leaf(path, node))
        elif isinstance(node, (tuple, list)):
            for i, child in enumerate(node):
                walk(child, (*path, i))
        elif node is not None:
            raise TypeError(f"unsupported output type {type(node).__name__} at {_where(path)}")

    walk(result, ())
    return leaves


def default_names(result: Any) -> tuple[str, ...]:
    """`out` for a single tensor, else `out0`, `out1`, ... in flattened order."""
    leaves = flatten(result)
    if len(leaves) == 1 and not leaves[0].path:
        return ("out",)
    return tuple(f"out{i}" for i in range(len(leaves)))


def _where(path: tuple[int, ...]) -> str:
    return "result" + "".join(f"[{i}]" for i in path)


def _describe(node: Any) -> str:
    if isinstance(node, torch.Tensor):
        return f"Tensor{tuple(node.shape)} {str(node.dtype).removeprefix('torch.')} on {node.device.type}"
    if isinstance(node, (tuple, list)):
        return f"{type(node).__name__} of length {len(node)}"
    return type(node).__name__


def structure_mismatch(candidate: Any, expected: Any) -> str | None:
    """A one-line description of the first structural difference, or None when the structures agree.

    Checks container types, lengths and nesting, then each tensor's shape, dtype and device type.
    """

    def walk(c: Any, e: Any, path: tuple[int, ...]) -> str | None:
        if isinstance(e, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return f"{_where(path)}: expected {_describe(e)}, got {_describe(c)}"
            if tuple(c.shape) != tuple(e.shape):
                return f"{_where(path)}: expected shape {tuple(e.shape)}, got {tuple(c.shape)}"
            if c.dtype != e.dtype:
                return f"{_where(path)}: expected dtype {e.dtype}, got {c.dtype}"
            if c.device.type != e.device.type:
                return f"{_where(path)}: expected a tensor on {e.device.type}, got one on {c.device.type}"
            return None
        if isinstance(e, (tuple, list)):
            if type(c) is not type(e):
                return f"{_where(path)}: expected {_describe(e)}, got {_describe(c)}"
            if len(c) != len(e):
                return f"{_where(path)}: expected {_describe(e)}, got {_describe(c)}"
            for i, (ci, ei) in enumerate(zip(c, e, strict=True)):
                found = walk(ci, ei, (*path, i))
                if found:
                    return found
            return None
        if e is None:
            return None if c is None else f"{_where(path)}: expected None, got {_describe(c)}"
        return f"{_where(path)}: unsupported expected type {type(e).__name__}"

    return walk(candidate, expected, ())
