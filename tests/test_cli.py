"""The CLI as a user meets it: listings, and bad input ending in one line and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import SIMPLE, write_problem

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "metakernel", *args], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=300)


def _cards(tmp: Path, text: str = "") -> Path:
    folder = tmp / "families"
    folder.mkdir()
    (folder / "attention.yaml").write_text(text or "name: attention\ntitle: t\nstresses: s\nmembers: [1]\n")
    return folder


def test_list_json_has_all_74():
    result = run("problems", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["number"] for r in rows] == list(range(1, 75))
    assert {r["family"] for r in rows} == {"attention", "kv_cache", "mlp_norm", "moe", "quantization",
                                           "linear_attention"}


def test_show_prints_every_source_line_whole_when_piped():
    """An agent's tool captures the output (no terminal): rich would crop the source at 80 columns."""
    result = run("problems", "show", "31", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    source = (ROOT / "problems" / "mlp_norm" / "31_groupnorm_silu_32g.py").read_text(encoding="utf-8")
    long_lines = [ln for ln in source.splitlines() if len(ln) > 80]
    assert long_lines and all(ln in result.stdout for ln in long_lines)


def test_show_prints_provenance_shapes_roofline_and_both_tasks():
    result = run("problems", "show", "28", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["number"] == 28 and "Provenance" in info["docstring"]
    assert info["small"]["roofline"]["bytes"] > 0 and info["small"]["inputs"]
    assert set(info["tasks"]) == {"cute", "tirx"}
    assert "CuTe DSL" in info["tasks"]["cute"] and "TIRx" in info["tasks"]["tirx"]
    assert "def reference" in info["tasks"]["tirx"]


def test_unknown_problem_number_is_one_line_exit_2():
    result = run("problems", "show", "99")
    assert result.returncode == 2
    assert result.stderr.strip() == "metakernel: error: no problem 99 (problems: 01-74)"
    result = run("problems", "validate", "7,99")
    assert result.returncode == 2 and "no problem 99" in result.stderr and "Traceback" not in result.stderr


def test_malformed_family_card_names_the_file(tmp_path):
    folder = _cards(tmp_path, "name: attention\ntitle: t\nstresses: s\nmembers: [1]\nmembers: [2]\n")
    result = run("problems", "list", env={"METAKERNEL_FAMILIES_DIR": str(folder)})
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and str(folder / "attention.yaml") in line and "duplicate key 'members'" in line
    (folder / "attention.yaml").write_text("name: attention\ntitle: [unclosed\n")
    result = run("problems", "list", env={"METAKERNEL_FAMILIES_DIR": str(folder)})
    assert result.returncode == 2 and "malformed YAML" in result.stderr and "Traceback" not in result.stderr


def test_problem_whose_reference_raises(tmp_path):
    probs = tmp_path / "problems"
    body = SIMPLE.replace("return torch.tanh(x @ w)", "raise ValueError('shape trouble')")
    path = write_problem(probs, "attention", "01_broken", body)
    env = {"METAKERNEL_PROBLEMS_DIR": str(probs), "METAKERNEL_FAMILIES_DIR": str(_cards(tmp_path))}
    result = run("problems", "validate", "1", env=env)
    assert result.returncode == 2
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("metakernel: error:")]
    assert len(errors) == 1 and str(path) in errors[0] and "ValueError: shape trouble" in errors[0]
    assert "Traceback" not in result.stderr
    result = run("problems", "show", "1", env=env)
    assert result.returncode == 2 and str(path) in result.stderr and "Traceback" not in result.stderr
    result = run("--debug", "problems", "show", "1", env=env)
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_validate_good_problem_exit_0_and_report(tmp_path):
    probs = tmp_path / "problems"
    write_problem(probs, "attention", "01_simple", SIMPLE)
    env = {"METAKERNEL_PROBLEMS_DIR": str(probs), "METAKERNEL_FAMILIES_DIR": str(_cards(tmp_path))}
    report = tmp_path / "r.json"
    result = run("problems", "validate", "1", "--report", str(report), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    entry = data["problems"]["01"]
    assert entry["ok"] and {c["name"] for c in entry["checks"]} >= {
        "contract", "fresh_seeds", "deterministic", "precision", "rejects_zeros", "rejects_random", "speed"}
    assert data["provenance"]["versions"]["torch"]


def test_validate_flags_a_problem_whose_rule_cannot_reject_zeros(tmp_path):
    """A reference whose output is (nearly) all zeros would let an all-zeros kernel pass: validate must fail it."""
    probs = tmp_path / "problems"
    write_problem(probs, "attention", "01_zeroish", SIMPLE.replace("torch.tanh(x @ w)", "(x @ w) * 0.0"))
    env = {"METAKERNEL_PROBLEMS_DIR": str(probs), "METAKERNEL_FAMILIES_DIR": str(_cards(tmp_path))}
    result = run("problems", "validate", "1", "--json", env=env)
    assert result.returncode == 1
    checks = {c["name"]: c for c in json.loads(result.stdout)["problems"][0]["checks"]}
    assert not checks["precision"]["ok"] or not checks["rejects_zeros"]["ok"]


def test_local_executor_refuses_a_machine_that_cannot_grade_before_any_model_call(tmp_path):
    """Pins the preflight: on a machine without a CUDA GPU, `run` with the default local executor stops in one
    line (exit 2) before an attempt, a model call or an experiment folder exists."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("tvm") is None:
        import pytest

        pytest.skip("needs a machine that cannot grade (no GPU) with the DSLs installed")
    experiment = tmp_path / "exp"
    done = run("run", "--model", "scripted/gold", "--problems", "28", "--replicates", "1", "--experiment",
               str(experiment))
    assert done.returncode == 2, done.stderr
    assert "cannot grade here" in done.stderr and "--executor stand-in" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not experiment.exists()
    again = run("regrade", str(experiment))
    assert again.returncode == 2


def test_dry_run_needs_no_api_key_and_a_doubled_comma_is_an_error(tmp_path):
    """`--dry-run` calls nothing, so it must not demand a key; `--problems 28,,36` is a typo, not a selection."""
    env = {"OPENAI_API_KEY": ""}  # an empty variable counts as unset
    done = run("run", "--model", "openai-gpt-5", "--problems", "28", "--experiment", str(tmp_path / "e"),
               "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert "openai-gpt-5" in done.stdout and "total" in done.stdout
    bad = run("run", "--model", "scripted/gold", "--problems", "28,,36", "--experiment", str(tmp_path / "f"),
              "--executor", "stand-in", "--dry-run")
    assert bad.returncode == 2 and "empty item in the problem selection" in bad.stderr


def test_untimed_is_a_gpu_gold_flag():
    """The correctness-first loop grades solutions on the GPU; asked for anywhere else it says so in one line."""
    result = run("problems", "validate", "25", "--untimed")
    assert result.returncode == 2 and "--gold --device cuda" in result.stderr and "Traceback" not in result.stderr


def test_regrade_of_a_missing_folder_is_one_line():
    result = run("regrade", "/nonexistent-experiment", "--executor", "stand-in")
    assert result.returncode == 2 and "no such experiment folder" in result.stderr
    assert "Usage:" not in result.stderr and "Traceback" not in result.stderr


def test_skills_list_explains_every_column():
    text = run("skills", "list", "--help").stdout
    for column in ("SOURCE", "SRC_TIER", "BYTES", "TRUNC", "LINT", "PAIR", "C_SKILL", "C_SOLO", "TIERS"):
        assert column in text
