"""The launch floor of each DSL on a GPU: the least time a call takes through a launch route.

A trivial kernel (y = x + 1 on 1024 values, scripts/floors/) timed with the grader's bracket by
`scripts/bench_overhead.py --floors`, which writes `floors.json` beside this module, keyed by GPU name. The
grader's report and the experiment report show it, so a reader sees how much of a small kernel's end-to-end time
(and of its speedup) the DSL's launch route alone decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("floors.json")


def measured(path: Path | None = None) -> dict[str, dict[str, float]]:
    """GPU name -> route -> floor in µs, for every GPU measured ({} when nothing was)."""
    source = path or DATA
    if not source.is_file():
        return {}
    try:
        known: dict[str, Any] = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {gpu: {route: float(us) for route, us in entry.items() if isinstance(us, (int, float))
                  and route != "revision"} for gpu, entry in known.items() if isinstance(entry, dict)}


def floors_for(gpu: str | None, path: Path | None = None) -> dict[str, float]:
    """Route -> floor in µs measured on `gpu` (its torch device name), or {} when never measured there."""
    return measured(path).get(gpu, {}) if gpu else {}
