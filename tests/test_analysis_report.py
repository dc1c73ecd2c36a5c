"""The report layer: a golden Markdown file, JSON numbers equal to the metric functions, HTML, bad input, the CLI."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from metakernel.analysis import metrics as M
from metakernel.analysis import stats as S
from metakernel.analysis.loading import load_attempts
from metakernel.analysis.plots import write_plots
from metakernel.analysis.records import SOLO_ARMS, synthetic_experiment
from metakernel.analysis.render import (
    DASH,
    DASH_FOOTNOTE,
    render_html,
    render_json,
    render_markdown,
    write_report,
)
from metakernel.analysis.report import build_report

from metakernel.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "report_synthetic.md"
RESAMPLES = 2_000  # fixed, and fewer than the default so the suite stays fast
NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def small_experiment() -> pd.DataFrame:
    """The golden file's experiment: 12 problems (percentile CIs), 2 models (Holm over 4 cells), lift in cute2tirx."""
    return synthetic_experiment(n_problems=12, models=("model-a", "model-b"), replicates=3,
                                effect={"cute2tirx": 0.5}, pass_effect={"cute2tirx": 1.0}, seed=7, skip_prob=0.05)


@pytest.fixture(scope="module")
def df() -> pd.DataFrame:
    return small_experiment()


@pytest.fixture(scope="module")
def report(df: pd.DataFrame) -> dict:
    return build_report(df, n_resamples=RESAMPLES)


@pytest.fixture(scope="module")
def written(df: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return write_report(df, tmp_path_factory.mktemp("report"), n_resamples=RESAMPLES)


def test_markdown_golden(report):
    """The Markdown report of `small_experiment` matches tests/golden/report_synthetic.md exactly.

    Deterministic: fixed generator seed, bootstrap seed 0 and 2,000 resamples. After an intended change to the
    report (or a numpy/scipy upgrade that moves the bootstrap draws), regenerate and review the diff:
    ``METAKERNEL_UPDATE_GOLDEN=1 pytest tests/test_analysis_report.py -k golden``.
    """
    text = render_markdown(report)
    if os.environ.get("METAKERNEL_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def _same(records: list[dict], frame: pd.DataFrame) -> None:
    """Every field of every record equals the metric function's DataFrame (NaN there is None here)."""
    assert len(records) == len(frame)
    for rec, (_, row) in zip(records, frame.iterrows(), strict=True):
        for key, value in row.items():
            got = rec[str(key)]
            if isinstance(value, float | np.floating) and math.isnan(value):
                assert got is None, (key, rec)
            elif isinstance(value, float | np.floating):
                assert got == pytest.approx(float(value), rel=1e-12, abs=1e-15), (key, rec)
            else:
                assert got == (value.item() if hasattr(value, "item") else value), (key, rec)


def test_json_numbers_equal_the_metric_functions(df, report):
    data = json.loads(render_json(report))
    t = data["tables"]
    _same(t["per_arm"]["records"], M.per_arm(df))
    _same(t["floor_sensitivity"]["records"], M.floor_sensitivity(df, floors=(0.01, 0.05, 0.1)))
    st = M.relative_standing(df)
    for name in ("independent", "naive", "placebo", "placebo_naive"):
        _same(t[f"standing_{name}"]["records"], getattr(st, name))
    _same(t["reverse_direction"]["records"], M.reverse_direction(df))
    _same(t["aa_spread"]["records"], M.aa_spread(df).table)
    _same(t["per_family"]["records"], M.per_family(df))
    _same(t["usage"]["records"], M.usage(df))

    rates = M.pair_rates(df).set_index(["model", "direction"])
    lift = M.paired_lift(df).set_index(["model", "direction"])
    plr = M.problem_log_ratios(df)
    cells = {(m, d): plr.loc[(plr["model"] == m) & (plr["direction"] == d), "mean_log_ratio"].to_numpy()
             for m in ("model-a", "model-b") for d in ("cute2tirx", "tirx2cute")}
    endpoints = S.primary_endpoints(cells, n_resamples=RESAMPLES, seed=0)
    arm = M.per_arm(df).set_index(["model", "arm"])
    assert t["headline"]["n"] == int(rates["n_pairs"].sum()) == 144
    for rec in t["headline"]["records"]:
        key = (rec["model"], rec["direction"])
        ep = endpoints[key]
        assert rec["dgm"] == pytest.approx(lift.loc[key, "dgm"], rel=1e-12)
        assert (rec["dgm"], rec["p_value"], rec["p_holm"], rec["n_problems"]) == (ep.dgm, ep.p_value, ep.p_holm, ep.n)
        assert ep.ci is not None and [rec["ci_low"], rec["ci_high"]] == list(ep.ci)
        for col in ("n_pairs", "n_informative", "help_rate_all", "harm_rate_all", "help_rate_informative",
                    "harm_rate_informative"):
            assert rec[col] == rates.loc[key, col]
        assert rec["S_skill"] == arm.loc[(rec["model"], rec["skill_arm"]), "S"]
        assert rec["S_solo"] == arm.loc[(rec["model"], rec["target_arm"]), "S"]
    by_cell = {(r["model"], r["direction"], r["test"]): r for r in t["secondary_tests"]["records"]}
    wil = S.wilcoxon_signed_rank(cells[("model-a", "cute2tirx")], zero_method="wilcox")
    assert by_cell[("model-a", "cute2tirx", "wilcoxon_signed_rank")]["p_value"] == wil.p_value
    assert all(r["label"] == "secondary" for r in by_cell.values())
    assert t["headline"]["label"] == "primary"


def test_every_table_prints_n(report):
    md = render_markdown(report)
    for table in report["tables"].values():
        assert isinstance(table["n"], int)
        if table["key"] != "problem_lift":
            assert f"n = {table['n']} {table['n_label']}" in md


def test_synthetic_banner_first_line_of_every_format(report, written):
    for fmt in ("md", "html", "json"):
        first = written[fmt].read_text(encoding="utf-8").splitlines()[0]
        assert "SYNTHETIC DATA" in first, fmt
    assert json.loads(written["json"].read_text())["synthetic"] is True
    real = small_experiment().assign(synthetic=False)
    text = render_markdown(build_report(real[real["model"] == "model-a"], n_resamples=200))
    assert "SYNTHETIC" not in text and text.startswith("# metakernel transfer report")


def test_html_embeds_the_pngs(written):
    html = written["html"].read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 3 == len(written["png"])
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert "<link" not in html and "<script" not in html and 'src="http' not in html
    md = written["md"].read_text(encoding="utf-8")
    assert all(f"]({p.name})" in md for p in written["png"])


def test_plots_are_deterministic(report, written, tmp_path):
    again = write_plots(report, tmp_path)
    for path in written["png"]:
        assert again[path.stem].read_bytes() == path.read_bytes(), path.name


def _bad_inputs() -> dict[str, pd.DataFrame]:
    base = synthetic_experiment(n_problems=10, replicates=2, seed=3)
    failed = base.assign(passed=False, status="wrong", speedup=math.nan, roofline_fraction=math.nan)
    return {
        "no_pairs": base[base["arm"].isin(SOLO_ARMS)],
        "missing_arm": base[base["arm"] != "tirx2cute_skill"],
        "all_failed": failed,
        "empty": base.iloc[0:0],
    }


@pytest.mark.parametrize("case", ["no_pairs", "missing_arm", "all_failed", "empty"])
def test_bad_input_renders_with_sentences_and_no_nan(case):
    rep = build_report(_bad_inputs()[case], n_resamples=200)
    md, js, html = render_markdown(rep), render_json(rep), render_html(rep)
    for text in (md, js, html):
        assert not NAN.search(text), case
    json.loads(js)
    expected = {
        "no_pairs": "There are no transfer pairs",
        "missing_arm": "Model model-a has no tirx2cute_skill attempts",
        "all_failed": "No attempt passed",
        "empty": "The attempt table has no rows",
    }[case]
    assert any(m.startswith(expected) for m in rep["missing"]), rep["missing"]
    assert expected in md and expected in html
    if case != "empty":
        assert DASH in md and DASH_FOOTNOTE in md
        # every dashed row explains itself
        for table in rep["tables"].values():
            for rec in table["records"]:
                shown = [c["key"] for c in table["columns"] if c["format"] not in ("str", "ci")]
                if any(rec.get(k) is None for k in shown):
                    assert rec.get("note"), (table["key"], rec)


def test_csv_and_json_exports_give_the_same_report(df, tmp_path):
    one = df[df["model"] == "model-a"]
    csv, js = tmp_path / "attempts.csv", tmp_path / "attempts.json"
    one.to_csv(csv, index=False)
    # json.dumps, not DataFrame.to_json: the latter rounds floats to 10 digits by default
    js.write_text(json.dumps(one.astype(object).where(one.notna(), None).to_dict(orient="records")))
    from_csv, from_json = load_attempts(tmp_path), load_attempts(js)
    reference = render_json(build_report(one, n_resamples=200))
    assert render_json(build_report(from_csv, n_resamples=200)) == reference
    assert render_json(build_report(from_json, n_resamples=200)) == reference


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "metakernel", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_cli_synthetic_writes_every_format(tmp_path):
    result = run_cli("report", "--synthetic", "--out", "tmp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "tmp"
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "report.json", "lift_per_problem.png", "forest_dgm.png",
            "standing_bars.png"} <= names
    assert result.stdout.startswith("SYNTHETIC DATA")
    data = json.loads((out / "report.json").read_text())
    lift = {(r["model"], r["direction"]): r["dgm"] for r in data["tables"]["headline"]["records"]}
    assert lift[("model-a", "cute2tirx")] > 0.5 and lift[("model-b", "cute2tirx")] > 0.5  # the planted effect


def test_cli_bad_path_is_one_line_exit_2(tmp_path):
    result = run_cli("report", "missing.csv", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "metakernel: error: missing.csv: no such file or directory"


@pytest.mark.parametrize("content,expected", [
    ("a,b\n1,2\n", "invalid attempt table: attempt table lacks column(s): experiment"),
    ("", "cannot read attempt table"),
])
def test_invalid_file_is_a_user_error(tmp_path, content, expected):
    # The CLI turns UserError into one line and exit 2 (test_cli_bad_path_is_one_line_exit_2 runs that path).
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises(UserError, match=re.escape(expected)) as info:
        load_attempts(tmp_path / "bad.csv")
    assert "\n" not in str(info.value)
    (tmp_path / "bad.json").write_text('{"rows": 1}')
    with pytest.raises(UserError, match="expected a JSON list"):
        load_attempts(tmp_path / "bad.json")
    (tmp_path / "experiment").mkdir(exist_ok=True)
    with pytest.raises(UserError, match="no attempts.csv"):
        load_attempts(tmp_path / "experiment")
    (tmp_path / "attempts.txt").write_text("x")
    with pytest.raises(UserError, match="use .csv or .json"):
        load_attempts(tmp_path / "attempts.txt")
