"""Writing JSON reports so a crash never leaves half a file: write a sibling, then rename over the target."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, indent: int | None = 1) -> None:
    """Write `data` as JSON to `path` (parents created); readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n", encoding="utf-8")
    os.replace(tmp, path)
