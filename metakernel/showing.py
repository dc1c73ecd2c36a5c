"""`metakernel problems show`: one problem as a reader wants it — provenance, shapes, roofline, source, tasks.

Full-scale shapes come from running `make_inputs` on the meta device when the file allows it (no memory is
touched); otherwise, and for the eager time, from the committed H200 report when it covers this file's hash.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from metakernel.catalog import load_catalog
from metakernel.errors import UserError
from metakernel.expected import output_names, run_reference
from metakernel.hardware import H200
from metakernel.paths import repo_root
from metakernel.problem import Problem
from metakernel.variants import DSLS, task_text


def _shapes(inputs: list[Any], names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name, x in zip(names, inputs, strict=True):
        if isinstance(x, torch.Tensor):
            out[name] = f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
        else:
            out[name] = repr(x)
    return out


def _h200_entry(problem: Problem) -> dict[str, Any] | None:
    path = repo_root() / "validation" / "h200-problems.json"
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))["problems"].get(problem.nn)
    except (json.JSONDecodeError, KeyError):
        return None
    if entry and entry.get("content_hash") == problem.content_hash:
        return entry
    return None


def describe(number: int) -> dict[str, Any]:
    """Everything `show` prints, as data."""
    problem = load_catalog().problem(number)
    torch.manual_seed(0)
    try:
        small = problem.make_inputs(device="cpu", scale="small")
        returned, mutated = run_reference(problem, small)
    except UserError:
        raise
    except Exception as exc:  # a broken problem file is bad input: one line naming it
        raise UserError(f"running it at small scale raised {type(exc).__name__}: {exc}", str(problem.path)) from exc
    names = output_names(problem, returned)
    outputs = [returned] if isinstance(returned, torch.Tensor) else list(returned or [])
    small_out = _shapes(outputs, names) | {f"{n} (mutated)": s for n, s in
                                           _shapes(list(mutated.values()), tuple(mutated)).items()}
    info: dict[str, Any] = {
        **problem.identity, "title": problem.title, "path": str(problem.path), "docstring": problem.docstring,
        "inputs": problem.input_names, "mutates": problem.mutates,
        "comparators": {n: s.kind for n, s in problem.comparators.items()},
        "small": {"inputs": _shapes(small, problem.input_names), "outputs": small_out,
                  "roofline": problem.roofline(small)},
    }
    try:
        full = problem.make_inputs(device="meta", scale="full")
        info["full"] = {"inputs": _shapes(full, problem.input_names), "roofline": problem.roofline(full)}
    except Exception as exc:  # noqa: BLE001 - meta tensors cannot run data-dependent code; say so
        info["full"] = {"note": f"full-scale shapes need real data ({type(exc).__name__}); see the H200 report"}
    h200 = _h200_entry(problem)
    if h200:
        info["h200"] = {"eager_us": h200.get("eager_us"), "output_shapes": h200.get("output_shapes"),
                        "roofline": h200.get("roofline"), "ok": h200.get("ok")}
        info["full"].setdefault("roofline", h200.get("roofline"))
    roof = info["full"].get("roofline")
    if roof:
        info["full"]["roofline_min_us"] = H200.min_seconds(roof["flops"], roof["bytes"]) * 1e6
    info["source"] = problem.source
    info["tasks"] = {key: task_text(problem, key) for key in DSLS}
    return info


def render(info: dict[str, Any]) -> None:
    """Print `describe`'s data for a person."""
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.syntax import Syntax
    from rich.table import Table

    console = Console()
    console.rule(f"[bold]{info['number']:02d} {info['slug']}[/bold]  ({info['family']}, v{info['version']}, "
                 f"{info['content_hash']})")
    console.print(info["docstring"])
    table = Table(title="shapes")
    for col in ("", "small (CPU)", "full (H200)"):
        table.add_column(col, overflow="fold")
    full_inputs = info["full"].get("inputs", {})
    for name, shape in info["small"]["inputs"].items():
        table.add_row(f"input {name}" + (" (mutated)" if name in info["mutates"] else ""), shape,
                      full_inputs.get(name, ""))
    h200_out = (info.get("h200") or {}).get("output_shapes") or {}
    for name, shape in info["small"]["outputs"].items():
        table.add_row(f"output {name}", shape, str(tuple(h200_out.get(name.split(" ")[0], ()))) or "")
    console.print(table)
    roof_rows = [("small", info["small"]["roofline"]), ("full", info["full"].get("roofline"))]
    for label, roof in roof_rows:
        if roof:
            console.print(f"roofline ({label}): {roof['flops'] / 1e9:.4g} GFLOP, {roof['bytes'] / 1e6:.4g} MB, "
                          f"{roof['flops'] / max(roof['bytes'], 1):.3g} FLOP/byte")
    if info["full"].get("roofline_min_us"):
        console.print(f"H200 roofline lower bound: {info['full']['roofline_min_us']:.1f} us")
    if info.get("h200"):
        console.print(f"H200 eager median: {info['h200']['eager_us']:.1f} us (validation/h200-problems.json)")
    if info["full"].get("note"):
        console.print(info["full"]["note"])
    if info["comparators"]:
        console.print(f"comparators: {info['comparators']}")
    console.rule("source")
    if console.is_terminal:
        console.print(Syntax(info["source"], "python", line_numbers=True, word_wrap=True))
    else:  # piped or captured (an agent's tool): every line whole, whatever width rich assumes
        width = len(str(info["source"].count("\n") + 1))
        console.file.write("".join(f"{i:>{width}} {line}\n"
                                   for i, line in enumerate(info["source"].splitlines(), 1)))
    for key, text in info["tasks"].items():
        console.rule(f"task text: {key} variant")
        console.print(Markdown(text.split("## The problem file")[0]))
        console.print("(followed by the problem file above)")
