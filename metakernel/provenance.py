"""Where a result came from: code revision (and whether the tree was dirty), package versions, GPU.

The H200 machine receives the checkout without `.git`, so `METAKERNEL_REVISION` (set by whoever launches the job)
takes precedence over asking git.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from metakernel.paths import repo_root


def code_revision() -> dict[str, Any]:
    """{'commit': hash or None, 'dirty': bool or None, 'source': 'env' | 'git' | 'unknown'}."""
    env = os.environ.get("METAKERNEL_REVISION")
    if env:
        commit, _, flag = env.partition("+")
        return {"commit": commit, "dirty": flag == "dirty", "source": "env"}
    try:
        root = str(repo_root())
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return {"commit": commit, "dirty": bool(status), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "source": "unknown"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """Versions of what results depend on (None = not installed)."""
    import torch

    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__,
                                       "cuda": torch.version.cuda}
    for dist in ("metakernel", "nvidia-cutlass-dsl", "apache-tvm", "litellm"):
        versions[dist] = _version(dist)
    return versions


def gpu_info() -> dict[str, Any] | None:
    """Name, capability and memory of GPU 0, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "capability": f"sm_{props.major}{props.minor}",
            "memory_gb": round(props.total_memory / 1e9, 1), "multiprocessors": props.multi_processor_count,
            "driver": _driver_version()}


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


#: The code that decides a grading's verdict and numbers: the grader, the DSL adapters, the comparator and the
#: problem loader. A validation report resumed in a later session keeps an entry only if this is unchanged.
GRADER_CODE = ("grader", "dsl", "compare.py", "expected.py", "structure.py", "problem.py")


def grader_fingerprint(root: Path | None = None) -> str:
    """sha256 (16 hex digits) over the grader's files in a fixed order: each name and its bytes minus docstrings.

    A commit hash changes with every README edit; this changes only when grading can. Docstrings are cut out
    (`_code_only`), so correcting a grader docstring does not void the device validation graded by the same code;
    comments and layout still count. `root`: another checkout's `metakernel` folder.
    """
    root = root or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for part in GRADER_CODE:
        path = root / part
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + _code_only(file.read_bytes()) + b"\0")
    return digest.hexdigest()[:16]


def _code_only(source: bytes) -> bytes:
    """A Python file's bytes without its docstrings (as they are where it does not parse).

    The docstrings are cut out by their positions in the syntax tree, which every Python version reports alike
    (a dump of the tree would not be: 3.12 added fields), so the device and this machine agree.
    """
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            spans.append((doc.lineno, doc.col_offset, doc.end_lineno or doc.lineno, doc.end_col_offset or 0))
    lines = source.splitlines(keepends=True)
    for start, col, end, end_col in sorted(spans, reverse=True):  # offsets are in bytes of the utf-8 lines
        head, tail = lines[start - 1][:col], lines[end - 1][end_col:]
        lines[start - 1:end] = [head + tail]
    return b"".join(lines)


def provenance() -> dict[str, Any]:
    """Everything above plus the time, for the header of every report."""
    return {"created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "revision": code_revision(),
            "versions": package_versions(), "gpu": gpu_info(), "host": platform.node()}
