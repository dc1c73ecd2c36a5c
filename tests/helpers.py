"""Small builders shared by tests: temporary problem files and family cards."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_problem(root: Path, family: str, name: str, body: str) -> Path:
    """Write `root/<family>/<name>.py` with a docstring and the given body; returns its path."""
    folder = root / family
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text('"""A test problem used by the suite.\n\nProvenance: synthetic.\n"""\nimport torch\n\n'
                    + textwrap.dedent(body), encoding="utf-8")
    return path


SIMPLE = """
def reference(x, w):
    return torch.tanh(x @ w)

def make_inputs(device="cuda", scale="full"):
    return [torch.randn(8, 16, device=device), torch.randn(16, 4, device=device) / 4]

def roofline(x, w):
    return {"flops": 2 * 8 * 16 * 4, "bytes": 4 * (8 * 16 + 16 * 4 + 8 * 4)}
"""
