"""`agents/` and `analysis/` ship as `metakernel.agents` / `metakernel.analysis`, editable and as a wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, metakernel, metakernel.agents, metakernel.analysis
from metakernel.paths import problems_dir, families_dir, guides_dir
print(json.dumps({"pkg": metakernel.__file__, "agents": metakernel.agents.__file__,
                  "analysis": metakernel.analysis.__file__, "problems": len(list(problems_dir().glob("*/*.py"))),
                  "families": len(list(families_dir().glob("*.yaml"))),
                  "guides": sorted(p.name for p in guides_dir().glob("*.md"))}))
"""


def _probe(cwd: Path, env: dict[str, str] | None = None) -> dict:
    import json
    import os

    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=cwd, timeout=300,
                         env={**os.environ, **(env or {})}, check=True)
    return json.loads(out.stdout)


def test_editable_install_maps_agents_and_analysis(tmp_path):
    """The test environment is an editable install (README): the mapped packages resolve into the checkout."""
    found = _probe(tmp_path)
    assert Path(found["agents"]) == ROOT / "agents" / "__init__.py"
    assert Path(found["analysis"]) == ROOT / "analysis" / "__init__.py"
    assert found["problems"] >= 1 and found["families"] == 6


def test_wheel_install_carries_packages_and_problem_data(tmp_path):
    """A built wheel, installed elsewhere, imports the mapped packages and finds problems and family cards."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, timeout=600, capture_output=True)
    wheel = next(wheels.glob("metakernel-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, timeout=600, capture_output=True)
    found = _probe(tmp_path, env={"PYTHONPATH": str(site)})
    for key in ("pkg", "agents", "analysis"):
        assert Path(found[key]).is_relative_to(site), found
    assert found["problems"] == len(list((ROOT / "problems").glob("*/*.py")))
    assert found["families"] == 6
    assert found["guides"] == ["cute-notes.md", "cute.md", "tirx-notes.md", "tirx.md"]  # guides and their notes
