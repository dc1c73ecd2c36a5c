"""The attempt loop end to end on the CPU: scripted models through litellm's real path, the real SQLite store, the
real dry-run check of the gold kernels, and the labelled CPU stand-in for the GPU step.

Covers the issue's "done means": a full experiment (2 problems x both directions x 2 replicates) with solo,
transfer and skipped arms; SIGKILL half-way and the same command completes it with nothing lost or duplicated;
replay reproduces it with zero model calls; garbage replies cost turns, not submissions; an outage ends in
`infra_error` and is retried on resume; bad input fails in one line before anything starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metakernel.budget import Budget
from metakernel.experiment import Experiment, RunConfig
from metakernel.store import Store

PROBLEMS = [28, 36]  # both have gold kernels in both DSLs


def _run(tmp: Path, name: str, models: list[str], **kw) -> tuple[dict, Path]:
    exp = tmp / name
    cfg = RunConfig(models=models, problems=kw.pop("problems", PROBLEMS), direction=kw.pop("direction", "both"),
                    experiment=exp, executor="stand-in", docs=kw.pop("docs", False), **kw)
    summary = asyncio.run(Experiment(cfg).run(["test"], echo=lambda s: None))
    return summary, exp


def _rows(exp: Path) -> list[dict]:
    with Store(exp) as store:
        return store.attempts()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One full experiment with two scripted models: `gold` writes skills, `noskill` never does."""
    tmp = tmp_path_factory.mktemp("exp")
    summary, exp = _run(tmp, "full", ["scripted/gold", "scripted/noskill"])
    return summary, exp


def test_full_experiment_has_solo_transfer_and_skipped_arms(recorded):
    summary, exp = recorded
    assert summary["outcome"] == "complete"
    rows = _rows(exp)
    assert len(rows) == 2 * 2 * 4 * 2  # models x problems x arms x replicates
    assert all(r["state"] == "done" for r in rows)
    gold = [r for r in rows if r["model"] == "scripted/gold"]
    noskill = [r for r in rows if r["model"] == "scripted/noskill"]
    # gold: the deliberate mistake, then the gold kernel; every arm passes on the stand-in and is marked synthetic.
    assert {r["status"] for r in gold} == {"passed"} and {r["submissions"] for r in gold} == {2}
    assert all(r["synthetic"] == 1 and r["reason"] == "stand_in" for r in gold)
    assert {r["arm"] for r in gold} == {"solo_cute", "solo_tirx", "cute2tirx_skill", "tirx2cute_skill"}
    # noskill: solo arms run; every skill arm is skipped because its source wrote no SKILL.md.
    assert {r["status"] for r in noskill if r["arm"].startswith("solo")} == {"passed"}
    assert {r["status"] for r in noskill if r["arm"].endswith("skill")} == {"skipped"}
    # the transfer prompt carried the source skill, verbatim, under the fixed heading
    gold_slug = gold[0]["attempt_id"].split("/")[0]
    skill = (exp / "attempts" / gold_slug / "p28_r2_solo_cute" / "SKILL.md").read_text()
    first = json.loads((exp / "attempts" / gold_slug / "p28_r2_cute2tirx_skill" / "transcript.jsonl")
                       .read_text().splitlines()[0])
    assert "## Skill from an attempt in another DSL (SKILL.md)" in first["user"]
    assert skill.strip() in first["user"]
    solo_first = json.loads((exp / "attempts" / gold_slug / "p28_r2_solo_tirx" / "transcript.jsonl")
                            .read_text().splitlines()[0])
    assert "Skill from an attempt" not in solo_first["user"]


def test_store_records_everything_a_reader_needs(recorded):
    _, exp = recorded
    with Store(exp) as store:
        row = next(r for r in store.attempts() if r["attempt_id"].endswith("p36_r1_solo_tirx")
                   and r["model"] == "scripted/gold")
        subs = store.submissions(row["attempt_id"])
        kinds = sorted((s["kind"], s["n"], s["status"]) for s in subs)
        assert kinds == [("final", 2, "passed"), ("submit", 1, "rule_violation"), ("submit", 2, "passed")]
        d = store.attempt_dir(row["attempt_id"])
        for name in ("kernel_v01.py", "kernel_v02.py", "grades/v01.json", "grades/v02.json", "final_grade.json",
                     "SKILL.md", "transcript.jsonl", "result.json"):
            assert (d / name).is_file(), name
        assert "import triton" in (d / "kernel_v01.py").read_text()
        exp_row = store.experiment()
        assert exp_row is not None
        cfg = exp_row["config"]
        assert cfg["budget"]["submissions"] == 10 and len(cfg["prompt_hash"]) == 64
        assert "api_key" not in json.dumps(cfg).replace("api_key_env", "")
        assert exp_row["provenance"]["versions"]["litellm"]
    con = sqlite3.connect(exp / "metakernel.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    n_calls = con.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0]
    assert n_calls > 0


def test_replay_reproduces_with_zero_model_calls(recorded, tmp_path):
    _, exp = recorded
    summary, again = _run(tmp_path, "replayed", ["scripted/gold", "scripted/noskill"], llm_mode="replay",
                          llm_cache=exp / "llm_cache.sqlite")
    assert summary["outcome"] == "complete"
    assert summary["model_calls"] == 0 and summary["replayed_calls"] > 0

    def key(r):
        return (r["attempt_id"], r["status"], r["submissions"], r["turns"], r["final_submission"], r["speedup"])

    assert sorted(map(key, _rows(again))) == sorted(map(key, _rows(exp)))


def _wait_until_done(exp, proc, count: int, timeout_s: float = 240) -> None:
    """Poll the experiment's store until `count` attempts are done (or the run ended, or time ran out)."""
    db = exp / "metakernel.sqlite"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if db.is_file():
            try:
                con = sqlite3.connect(db, timeout=1)
                done = con.execute("SELECT COUNT(*) FROM attempts WHERE state='done'").fetchone()[0]
                con.close()
            except sqlite3.OperationalError:
                done = 0
            if done >= count:
                return
        time.sleep(0.05)


def test_sigkill_half_way_then_the_same_command_completes(tmp_path):
    exp = tmp_path / "killed"
    cmd = [sys.executable, "-m", "metakernel", "run", "--model", "scripted/gold", "--problems", "28,36",
           "--executor", "stand-in", "--no-docs", "--concurrency", "2", "--experiment", str(exp)]
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_until_done(exp, proc, 5)
    assert proc.poll() is None, "the run finished before it could be killed: " + proc.stdout.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["attempt_id"]: r for r in _rows(exp)}
    finished_before = {a for a, r in before.items() if r["state"] == "done"}
    assert 5 <= len(finished_before) < 16
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"16 attempts planned ({len(finished_before)} already done: resuming)" in result.stdout
    rows = _rows(exp)
    assert len(rows) == 16 and all(r["state"] == "done" for r in rows)
    for r in rows:
        if r["attempt_id"] in finished_before:  # never redone
            old = before[r["attempt_id"]]
            assert (r["tries"], r["finished"]) == (old["tries"], old["finished"])
    with Store(exp) as store:
        for r in rows:  # exactly one final grade and one set of submissions per attempt
            subs = store.submissions(r["attempt_id"])
            assert sorted(s["n"] for s in subs if s["kind"] == "submit") == [1, 2]
            assert len([s for s in subs if s["kind"] == "final"]) == 1
            assert {s["try"] for s in subs} == {r["tries"]}
        runs = store.runs()
    assert [r["outcome"] for r in runs] == [None, "complete"]  # the killed run never closed


def test_ctrl_c_says_what_was_kept_and_that_the_same_command_resumes(tmp_path):
    exp = tmp_path / "interrupted"
    cmd = [sys.executable, "-m", "metakernel", "run", "--model", "scripted/gold", "--problems", "28,36",
           "--executor", "stand-in", "--no-docs", "--experiment", str(exp)]
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a"}

    def ctrl_c_as_in_a_terminal() -> None:  # a test runner's worker may ignore SIGINT, and children inherit that
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_as_in_a_terminal)
    _wait_until_done(exp, proc, 2)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    kept = sum(r["state"] == "done" for r in _rows(exp))
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert f"interrupted: {kept} of 16 attempts finished and kept; the same command resumes" in err, err[-2000:]


def test_garbage_costs_turns_not_submissions(tmp_path):
    summary, exp = _run(tmp_path, "garbage", ["scripted/garbage"], problems=[28], direction="cute2tirx",
                        replicates=1, budget=Budget(submissions=10, turns=14), trials=["p28_r1_solo_cute"])
    assert summary["outcome"] == "complete"
    (row,) = _rows(exp)
    assert row["ended_by"] == "turns" and row["turns"] == 14
    # 14 turns cycle the 7 garbage moves twice; only "non-Python text" reaches the grader (twice).
    assert row["submissions"] == 2 and row["status"] != "passed"
    events = [json.loads(x) for x in (exp / "attempts" / row["attempt_id"] / "transcript.jsonl").read_text()
              .splitlines()]
    errors = [e["result"] for e in events if e["type"] == "tool" and str(e.get("result", "")).startswith("error")]
    assert any("not valid JSON" in e for e in errors)
    assert any("unknown tool" in e for e in errors)
    assert any("code is empty" in e for e in errors)
    assert any("must be a JSON object" in e for e in errors)


def test_outage_becomes_infra_error_then_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("METAKERNEL_SCRIPTED_FAIL", "p28_solo_cute")
    summary, exp = _run(tmp_path, "outage", ["scripted/flaky"], problems=[28], direction="cute2tirx")
    assert summary["outcome"] == "incomplete" and summary["infra_error"] == 2
    states = {r["attempt_id"].split("/")[1]: r["state"] for r in _rows(exp)}
    assert states["p28_r1_solo_cute"] == "infra_error" and states["p28_r1_cute2tirx_skill"] == "pending"
    assert states["p28_r1_solo_tirx"] == "done"
    with Store(exp) as store:
        err = store.attempt(next(r["attempt_id"] for r in store.attempts() if r["arm"] == "solo_cute"))
        assert err is not None and "503" in (err["error"] or "") or "ServiceUnavailable" in (err["error"] or "")
    monkeypatch.delenv("METAKERNEL_SCRIPTED_FAIL")
    summary, _ = _run(tmp_path, "outage", ["scripted/flaky"], problems=[28], direction="cute2tirx")
    assert summary["outcome"] == "complete"
    assert all(r["state"] == "done" for r in _rows(exp))


def test_resume_refuses_a_changed_budget(recorded):
    _, exp = recorded
    from metakernel.errors import UserError

    cfg = RunConfig(models=["scripted/gold", "scripted/noskill"], problems=PROBLEMS, direction="both",
                    experiment=exp, executor="stand-in", docs=False, budget=Budget(submissions=5))
    with pytest.raises(UserError, match="submissions"):
        asyncio.run(Experiment(cfg).run(["test"], echo=lambda s: None))


@pytest.mark.parametrize("args, message", [
    (["--model", "nosuchprovider/x"], "nosuchprovider"),
    (["--model", "scripted/nosuchpolicy"], "unknown scripted policy"),
    (["--model", "openai/gpt-4o", "--api-key-env", "MK_TEST_NO_SUCH_KEY"], "MK_TEST_NO_SUCH_KEY"),
    (["--model", "scripted/gold", "--problems", "99"], "99"),
    (["--model", "scripted/gold", "--submissions", "0"], "submissions"),
    (["--model", "scripted/gold", "--wall", "soon"], "soon"),
])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, message):
    exp = tmp_path / "never"
    full = ["run", *args, "--executor", "stand-in", "--experiment", str(exp)]
    if "--problems" not in args:
        full += ["--problems", "28"]
    result = subprocess.run([sys.executable, "-m", "metakernel", *full], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in result.stderr
    assert not exp.exists()


def test_dry_run_prints_counts_and_bounds(tmp_path):
    result = subprocess.run([sys.executable, "-m", "metakernel", "run", "--model", "scripted/gold", "--problems",
                             "28,36", "--experiment", str(tmp_path / "x"), "--dry-run"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "16" in result.stdout and "GPU-h" in result.stdout
    assert not (tmp_path / "x").exists()


def test_spent_submissions_leave_two_wrap_up_turns_for_the_skill(tmp_path):
    """With 2 submissions the gold policy spends both, then still writes SKILL.md and finishes (every arm alike)."""
    summary, exp = _run(tmp_path, "wrap", ["scripted/gold"], problems=[28], direction="cute2tirx", replicates=1,
                        budget=Budget(submissions=2), trials=["p28_r1_solo_cute"])
    (row,) = _rows(exp)
    assert row["submissions"] == 2 and row["ended_by"] == "finish" and row["status"] == "passed"
    with Store(exp) as store:
        assert store.skill(row["attempt_id"]) is not None
    events = [json.loads(x) for x in (exp / "attempts" / row["attempt_id"] / "transcript.jsonl").read_text()
              .splitlines()]
    assert any(e["type"] == "budget" and "submission budget is spent" in e["text"] for e in events)
