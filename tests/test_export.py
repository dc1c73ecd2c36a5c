"""The store -> attempt table translation, the export bundle, and reports that agree between the two."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from click.testing import CliRunner
from metakernel.analysis.loading import load_attempts
from metakernel.analysis.records import ALL_COLUMNS, validate_attempts, with_speed_metric
from metakernel.analysis.render import render_json
from metakernel.analysis.report import build_report

from metakernel.cli import cli
from metakernel.cli_results import export
from metakernel.errors import UserError
from metakernel.export import EXPORT_SCHEMA, attempt_table, export_bundle, missing_attempts, read_bundle
from metakernel.plan import AttemptKey, model_slug
from metakernel.store import Store

MODEL = "acme/coder-1"
SLUG = model_slug(MODEL)
FAMILY = {1: "attention", 28: "mlp_norm", 40: "mlp_norm"}
CLEAN_SKILL = """# Wide row reductions

- One block per row with vector loads reached 87% of peak bandwidth; scalar loads stopped at 35%.
"""
#: address -> (final status, speedup, writes a skill). Comments give the pair each skill arm forms.
OUTCOMES: dict[str, tuple[str, float | None, bool]] = {
    "p01_r1_solo_cute": ("passed", 2.0, True),
    "p01_r1_solo_tirx": ("passed", 1.0, True),
    "p01_r1_cute2tirx_skill": ("passed", 1.5, True),  # 1.5 vs solo_tirx 1.0: helped
    "p01_r1_tirx2cute_skill": ("wrong", 1.3, False),  # failed (stray speedup dropped) vs solo_cute 2.0: harmed
    "p01_r2_solo_cute": ("wrong", None, False),  # no skill -> cute2tirx_skill r2 skipped
    "p01_r2_solo_tirx": ("passed", 0.8, True),
    "p01_r2_tirx2cute_skill": ("passed", 0.051, False),  # 0.051 vs failed solo_cute (0.05 floor): neutral
    "p28_r1_solo_cute": ("compile_error", None, True),
    "p28_r1_solo_tirx": ("wrong", None, True),
    "p28_r1_cute2tirx_skill": ("wrong", None, False),  # both failed
    "p28_r1_tirx2cute_skill": ("passed", 3.0, False),  # 3.0 vs failed solo_cute: helped
    "p28_r2_solo_cute": ("passed", 1.2, True),
    "p28_r2_solo_tirx": ("passed", 1.2, True),
    "p28_r2_cute2tirx_skill": ("passed", 1.21, False),  # within tau of 1.2: neutral
}
SKIPPED = "p01_r2_cute2tirx_skill"
INFRA = "p28_r2_tirx2cute_skill"  # fails for infrastructure reasons: missing, its pair pending
PENDING = "p40_r1_solo_cute"  # planned, never started
UNPRICED = "p28_r2_solo_cute"  # the model had no price
PARTIAL = "p01_r1_solo_tirx"  # one of two calls unpriced
SYNTHETIC = "p01_r1_solo_cute"  # graded by the CPU stand-in
TRUNCATED = "p28_r1_solo_cute"  # skill cut at the cap, one lint finding


def aid(address: str) -> str:
    return f"{SLUG}/{address}"


def _report(status: str, speedup: float | None) -> dict:
    return {"status": status, "reason": None if status == "passed" else "draw 0", "speedup": speedup,
            "timing": {"median_us": 10.0}}


def make_experiment(root: Path) -> Path:
    """A real store: 2 problems x both directions x 2 replicates, with skipped, infra-failed and pending attempts."""
    keys = [AttemptKey.from_address(MODEL, a) for a in [*OUTCOMES, SKIPPED, INFRA, PENDING]]
    with Store(root, create=True) as store:
        store.init_experiment("exp-test", {"budget": {"submissions": 10}, "models": [MODEL]}, {"git": "abc123"},
                              identity_keys=["budget"])
        run = store.begin_run(["metakernel", "run", "--experiment", str(root)], {"git": "abc123"})
        store.ensure_attempts({"attempt_id": k.attempt_id, "model": k.model, "problem": k.problem,
                               "family": FAMILY[k.problem], "arm": k.arm, "dsl": k.dsl, "replicate": k.replicate,
                               "source_attempt": k.source.attempt_id if k.source else None} for k in keys)
        for address, (status, speedup, skill) in OUTCOMES.items():
            attempt = aid(address)
            try_no = store.start_attempt(attempt, run)
            kernel = store.attempt_dir(attempt) / "kernel_v01.py"
            kernel.write_text(f"# kernel of {address}\n")
            store.record_submission(attempt, try_no, "check", 1, kernel, "0" * 64, _report("passed", None), 0, 0.1)
            store.record_submission(attempt, try_no, "submit", 1, kernel, "1" * 64, _report(status, speedup), 2, 30)
            store.record_submission(attempt, try_no, "final", 1, kernel, "1" * 64, _report(status, speedup), 1, 40)
            store.append_transcript(attempt, {"role": "assistant", "content": "ACTION: finish"})
            for turn in (1, 2):
                unpriced = address == UNPRICED or (address == PARTIAL and turn == 2)
                response = SimpleNamespace(prompt_tokens=1000, completion_tokens=100,
                                           cost_usd=None if unpriced else 0.25,
                                           cost_status="unpriced" if unpriced else "priced", latency_s=2.0,
                                           attempts=1, finish_reason="tool_calls")
                store.record_llm_call(attempt, try_no, turn, MODEL, response, replayed=False)
            if skill:
                truncated = address == TRUNCATED
                lint = [{"code": "dsl-identifier", "line": 3, "message": "names cute.make_layout", "soft": False}]
                store.record_skill(attempt, CLEAN_SKILL + f"<!-- {address} -->\n", sha256="ab" * 32,
                                   original_bytes=20000 if truncated else 200, truncated=truncated,
                                   lint=lint if truncated else [])
            store.finish_attempt(attempt, {
                "status": status, "reason": None if status == "passed" else "draw 0", "passed": status == "passed",
                "speedup": speedup, "speedup_gpu": 1.5 * speedup if speedup else None,
                "roofline_fraction": 0.25 if speedup else None, "final_submission": 1,
                "submissions": 1, "checks": 1, "turns": 2, "tokens_in": 2000, "tokens_out": 200,
                "cost_usd": None if address == UNPRICED else 0.5,
                "cost_status": {UNPRICED: "unpriced", PARTIAL: "partial"}.get(address, "priced"),
                "wall_s": 600.0, "queue_s": 5.0, "ended_by": "finish", "synthetic": int(address == SYNTHETIC)})
        store.skip_attempt(aid(SKIPPED), "source wrote no SKILL.md")
        store.start_attempt(aid(INFRA), run)
        store.fail_attempt(aid(INFRA), "provider outage: 503")
        store.end_run(run, "incomplete")
    return root


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    return make_experiment(tmp_path / "exp")


def row(df: pd.DataFrame, address: str) -> pd.Series:
    key = AttemptKey.from_address(MODEL, address)
    hit = df[(df["problem"] == key.problem) & (df["arm"] == key.arm) & (df["replicate"] == key.replicate)]
    assert len(hit) == 1, address
    return hit.iloc[0]


# ------------------------------------------------------------------------------------------------- attempt table


def test_attempt_table_is_valid_and_holds_only_finished_attempts(experiment):
    with Store(experiment) as store:
        df = attempt_table(store)
    validate_attempts(df)
    assert tuple(df.columns) == ALL_COLUMNS
    assert len(df) == len(OUTCOMES) + 1  # + the skipped arm; the infra-failed and the pending one are not results
    assert set(df["experiment"]) == {"exp-test"} and set(df["model"]) == {MODEL}
    assert df["passed"].dtype == bool and df["synthetic"].dtype == bool
    passed = {a for a, (s, _, _) in OUTCOMES.items() if s == "passed"}
    assert int(df["passed"].sum()) == len(passed)


def test_attempt_table_values(experiment):
    """Invariant: speedup only when passed, cost NaN when any call was unpriced, source replicate on skill arms."""
    with Store(experiment) as store:
        df = attempt_table(store)
    solo = row(df, "p01_r1_solo_cute")
    assert solo["status"] == "passed" and solo["speedup"] == 2.0 and solo["roofline_fraction"] == 0.25
    assert solo["family"] == "attention" and solo["dsl"] == "cute" and math.isnan(solo["source_replicate"])
    assert solo["tokens_in"] == 2000 and solo["submissions"] == 1 and solo["wall_s"] == 600.0
    assert solo["cost_usd"] == 0.5 and bool(solo["synthetic"])
    wrong = row(df, "p01_r1_tirx2cute_skill")
    assert not wrong["passed"] and math.isnan(wrong["speedup"]) and math.isnan(wrong["roofline_fraction"])
    assert wrong["source_replicate"] == 1.0 and wrong["dsl"] == "cute" and not wrong["synthetic"]
    skipped = row(df, SKIPPED)
    assert skipped["status"] == "skipped" and not skipped["passed"] and skipped["source_replicate"] == 2.0
    assert skipped["tokens_in"] == 0 and skipped["cost_usd"] == 0.0
    assert math.isnan(row(df, UNPRICED)["cost_usd"]) and math.isnan(row(df, PARTIAL)["cost_usd"])
    assert row(df, "p28_r2_cute2tirx_skill")["speedup"] == 1.21


def test_missing_attempts_lists_infra_errors_and_pending(experiment):
    with Store(experiment) as store:
        missing = {m["attempt_id"]: m for m in missing_attempts(store)}
    assert set(missing) == {aid(INFRA), aid(PENDING)}
    assert missing[aid(INFRA)]["state"] == "infra_error" and missing[aid(INFRA)]["error"] == "provider outage: 503"
    assert missing[aid(PENDING)]["state"] == "pending" and missing[aid(PENDING)]["tries"] == 0


def test_store_without_experiment_is_a_user_error(tmp_path):
    with Store(tmp_path / "empty", create=True) as store, pytest.raises(UserError, match="no experiment yet"):
        attempt_table(store)


# -------------------------------------------------------------------------------------------------------- bundle


def test_bundle_contents(experiment, tmp_path):
    out = export_bundle(experiment, tmp_path / "bundle")
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == EXPORT_SCHEMA
    assert set(data["legend"]["columns"]) == set(ALL_COLUMNS)
    assert {"passed", "wrong", "skipped"} <= set(data["legend"]["status"])
    assert set(data["legend"]["arm"]) >= {"solo_cute", "cute2tirx_skill"}
    assert data["experiment"]["name"] == "exp-test" and data["experiment"]["config"]["budget"]["submissions"] == 10
    assert data["experiment"]["provenance"] == {"git": "abc123"}
    assert data["runs"][0]["command"][:2] == ["metakernel", "run"] and data["runs"][0]["outcome"] == "incomplete"
    assert len(data["attempts"]) == len(OUTCOMES) + 1
    first = next(a for a in data["attempts"] if a["attempt_id"] == aid("p01_r1_tirx2cute_skill"))
    assert first["speedup"] is None and first["source_replicate"] == 1.0 and set(first) == {"attempt_id", *ALL_COLUMNS}
    assert {m["attempt_id"] for m in data["missing"]} == {aid(INFRA), aid(PENDING)}

    # every submission row, with the bundle's copy named where one was shipped
    subs = [s for s in data["submissions"] if s["attempt_id"] == aid("p01_r1_solo_cute")]
    assert {s["kind"] for s in subs} == {"check", "submit", "final"}
    by_kind = {s["kind"]: s for s in subs}
    assert by_kind["submit"]["kernel_file"] == f"kernels/{aid('p01_r1_solo_cute')}/kernel_v01.py"
    assert by_kind["submit"]["report_file"] == f"kernels/{aid('p01_r1_solo_cute')}/grades/v01.json"
    assert by_kind["final"]["report_file"] == f"kernels/{aid('p01_r1_solo_cute')}/final_grade.json"
    assert by_kind["check"]["report_file"] is None  # checks are not shipped
    assert by_kind["submit"]["speedup"] == 2.0 and by_kind["submit"]["median_us"] == 10.0

    calls = {c["attempt_id"]: c for c in data["llm_calls"]}
    assert calls[aid(PARTIAL)]["calls"] == 2 and calls[aid(PARTIAL)]["unpriced_calls"] == 1
    assert calls[aid(PARTIAL)]["cost_usd_priced"] == 0.25 and calls[aid(PARTIAL)]["prompt_tokens"] == 2000

    skills = {s["attempt_id"]: s for s in data["skills"]}
    writers = {aid(a) for a, (_, _, skill) in OUTCOMES.items() if skill}
    assert set(skills) == writers
    cut = skills[aid(TRUNCATED)]
    assert cut["truncated"] is True and cut["original_bytes"] == 20000 and cut["lint"][0]["code"] == "dsl-identifier"

    # the files: every finished attempt's kernels, grades, transcript and result; every skill's text
    for address in OUTCOMES:
        folder = out / "kernels" / SLUG / address
        assert (folder / "kernel_v01.py").read_text() == f"# kernel of {address}\n"
        for name in ("final_grade.json", "grades/v01.json", "transcript.jsonl", "result.json"):
            assert (folder / name).is_file(), (address, name)
        assert not (folder / "checks").exists()
        assert len(data["files"][aid(address)]) == 5 + (1 if OUTCOMES[address][2] else 0)
    for writer in writers:
        text = (out / "skills" / writer / "SKILL.md").read_text()
        assert text.endswith(f"<!-- {writer.split('/')[1]} -->\n")
    assert json.loads((out / "kernels" / aid(SKIPPED) / "result.json").read_text())["status"] == "skipped"
    assert not (out / "kernels" / aid(INFRA)).exists() and not (out / "kernels" / aid(PENDING)).exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # the staging folder is gone


def test_reports_from_store_and_bundle_are_identical(experiment, tmp_path):
    """Invariant (docs/design.md section 7): identical numbers from the database and from an export."""
    out = export_bundle(experiment, tmp_path / "bundle")
    with Store(experiment) as store:
        reference = render_json(build_report(attempt_table(store), n_resamples=200))
    for source in (experiment, out, out / "results.json"):
        df = load_attempts(source)
        assert tuple(df.columns) == ALL_COLUMNS
        assert render_json(build_report(df, n_resamples=200)) == reference, source
    report = json.loads(reference)
    lift = {(r["model"], r["direction"]) for r in report["tables"]["headline"]["records"]}
    assert lift == {(MODEL, "cute2tirx"), (MODEL, "tirx2cute")}


def test_bundle_from_results_json_alone(experiment, tmp_path):
    """Invariant: results.json alone is enough for a report (the copied files are for people)."""
    out = export_bundle(experiment, tmp_path / "bundle")
    lone = tmp_path / "lone" / "results.json"
    lone.parent.mkdir()
    lone.write_text((out / "results.json").read_text())
    assert render_json(build_report(load_attempts(lone), n_resamples=200)) == \
        render_json(build_report(load_attempts(out), n_resamples=200))


def test_refuses_a_non_empty_directory_that_is_not_a_bundle(experiment, tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="non-empty directory that is not a previous export bundle"):
        export_bundle(experiment, target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        export_bundle(experiment, tmp_path / "file")
    with pytest.raises(UserError, match="not an experiment directory"):
        export_bundle(tmp_path / "busy", tmp_path / "new")
    (target / "results.json").write_text(json.dumps({"schema": "metakernel.export/0"}))
    with pytest.raises(UserError, match="not a previous export bundle"):
        export_bundle(experiment, target)


def test_reexport_replaces_a_previous_bundle_and_keeps_other_files(experiment, tmp_path):
    out = export_bundle(experiment, tmp_path / "bundle")
    (out / "report").mkdir()
    (out / "report" / "report.md").write_text("old report")
    stale = out / "kernels" / SLUG / "p99_r1_solo_cute"
    stale.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_bundle(experiment, empty) == empty and (empty / "results.json").is_file()
    export_bundle(experiment, out)
    assert not stale.exists() and (out / "report" / "report.md").read_text() == "old report"
    assert read_bundle(out)["schema"] == EXPORT_SCHEMA


def test_load_attempts_rejects_an_unknown_export_schema(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"schema": "metakernel.export/9", "attempts": []}))
    with pytest.raises(UserError, match="not an export bundle of schema metakernel.export/1"):
        load_attempts(tmp_path)


def test_cli_export_prints_what_it_wrote(experiment, tmp_path):
    runner = CliRunner()
    result = runner.invoke(export, [str(experiment), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (f"wrote {tmp_path / 'b' / 'results.json'}: 15 attempts (9 passed, 1 skipped), 2 missing, "
                        "42 submissions, 8 skills")
    assert lines[1] == f"copied 79 files under {tmp_path / 'b' / 'kernels'} and {tmp_path / 'b' / 'skills'}"
    assert lines[2] == "missing (not in the attempt table): 1 infra_error, 1 pending"
    result = runner.invoke(export, [str(experiment)])
    assert result.exit_code == 2 and "--out" in result.output


# ------------------------------------------------------------------------------------------------- GPU-time speedup
def test_gpu_speedup_reaches_the_table_the_bundle_and_the_report(experiment, tmp_path):
    with Store(experiment) as store:
        df = attempt_table(store)
    passed = df["passed"].astype(bool)
    assert (df.loc[passed, "speedup_gpu"] == 1.5 * df.loc[passed, "speedup"]).all()
    assert df.loc[~passed, "speedup_gpu"].isna().all()
    bundle = load_attempts(export_bundle(experiment, tmp_path / "bundle"))
    pd.testing.assert_series_equal(bundle["speedup_gpu"], df["speedup_gpu"], check_names=False)
    swapped = with_speed_metric(df, "gpu")
    assert (swapped.loc[passed, "speedup"] == df.loc[passed, "speedup_gpu"]).all()
    e2e, gpu = build_report(df, n_resamples=200), build_report(df, n_resamples=200, speed="gpu")
    assert (e2e["parameters"]["speed"], gpu["parameters"]["speed"]) == ("e2e", "gpu")
    assert "GPU time" in " ".join(gpu["sections"][0]["text"])
    # every GPU-time speedup is 1.5x its end-to-end one here, so the per-arm geometric means move with the choice
    assert e2e["tables"]["per_arm"]["records"] != gpu["tables"]["per_arm"]["records"]


def test_gpu_speedup_missing_is_a_clear_error(experiment, tmp_path):
    with Store(experiment) as store:
        df = attempt_table(store)
    unmeasured = df.assign(speedup_gpu=math.nan)
    with pytest.raises(ValueError, match=r"passed attempt\(s\) have no speedup_gpu"):
        with_speed_metric(unmeasured, "gpu")
    with pytest.raises(ValueError, match="no 'speedup_gpu' column"):
        with_speed_metric(df.drop(columns=["speedup_gpu"]), "gpu")
    with pytest.raises(ValueError, match="unknown speed metric"):
        with_speed_metric(df, "wall")
    table = tmp_path / "old.json"
    table.write_text(json.dumps(unmeasured.drop(columns=["speedup_gpu"]).to_dict(orient="records")))
    result = CliRunner().invoke(cli, ["report", str(table), "--speed", "gpu", "--out", str(tmp_path / "r")])
    assert isinstance(result.exception, UserError) and "speedup_gpu" in str(result.exception)  # main(): 1 line, exit 2


def test_a_store_written_before_the_column_gains_it(tmp_path):
    root = make_experiment(tmp_path / "old")
    db = sqlite3.connect(root / "metakernel.sqlite")
    db.execute("ALTER TABLE attempts DROP COLUMN speedup_gpu")
    db.commit()
    db.close()
    with Store(root) as store:
        df = attempt_table(store)
        assert "speedup_gpu" in store.attempts()[0]
    assert df["speedup_gpu"].isna().all() and df["passed"].any()
