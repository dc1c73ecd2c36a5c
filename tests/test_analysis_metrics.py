"""Analysis metrics against hand-computed values (docs/metrics.md works the same fixture by hand)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from metakernel.analysis import metrics as M
from metakernel.analysis.records import (
    COLUMNS,
    SCHEMA,
    classify_pair,
    clipped_speedup,
    is_synthetic,
    pairs,
    scored_attempts,
    synthetic_experiment,
    validate_attempts,
)

F = None  # a failed attempt in the fixture grid

# The fixture of docs/metrics.md: one model, problems 1 (attention) and 2 (moe), three replicates.
# Each entry: speedup of a passed attempt, F (failed, with the status after it) or "skip".
GRID: dict[int, dict[str, list[object]]] = {
    1: {
        "solo_cute": [2.0, 1.0, (F, "wrong")],
        "solo_tirx": [1.0, 0.5, 2.0],
        "cute2tirx_skill": [2.0, 0.25, 2.0],
        "tirx2cute_skill": [4.0, "skip", (F, "compile_error")],
    },
    2: {
        "solo_cute": [(F, "timeout"), 0.25, 4.0],
        "solo_tirx": [(F, "runtime_error"), 1.0, (F, "wrong")],
        "cute2tirx_skill": [1.0, 1.0, (F, "wrong")],
        "tirx2cute_skill": [(F, "wrong"), 0.125, 8.0],
    },
}
FAMILY = {1: "attention", 2: "moe"}
DSL = {"solo_cute": "cute", "solo_tirx": "tirx", "cute2tirx_skill": "tirx", "tirx2cute_skill": "cute"}


def row(problem: int, arm: str, replicate: int, cell: object, model: str = "m") -> dict[str, object]:
    skill = arm.endswith("_skill")
    if cell == "skip":
        status, passed, speedup = "skipped", False, math.nan  # the store need not copy the baseline: we rescore
    elif isinstance(cell, tuple):
        status, passed, speedup = str(cell[1]), False, math.nan
    else:
        status, passed, speedup = "passed", True, float(cell)  # type: ignore[arg-type]
    return {
        "experiment": "fx", "model": model, "problem": problem, "family": FAMILY[problem], "arm": arm,
        "dsl": DSL[arm], "replicate": replicate, "status": status, "passed": passed, "speedup": speedup,
        "roofline_fraction": speedup / 10 if passed else math.nan,
        "tokens_in": 0 if status == "skipped" else 1000, "tokens_out": 0 if status == "skipped" else 200,
        "cost_usd": math.nan if (arm == "solo_tirx" and problem == 2) else (0.0 if status == "skipped" else 0.01),
        "wall_s": 0.0 if status == "skipped" else 60.0 * replicate,
        "submissions": 0 if status == "skipped" else 3, "source_replicate": float(replicate) if skill else math.nan,
        "synthetic": False,
    }


def fixture() -> pd.DataFrame:
    rows = [row(p, arm, r + 1, cell) for p, arms in GRID.items() for arm, cells in arms.items()
            for r, cell in enumerate(cells)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.fixture()
def fx() -> pd.DataFrame:
    df = fixture()
    validate_attempts(df)
    return df


def one(table: pd.DataFrame, **where: object) -> pd.Series:
    sel = table
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"{where}: {len(sel)} rows"
    return sel.iloc[0]


def assert_nan_explained(table: pd.DataFrame) -> None:
    """No NaN without a note: the contract every metrics table keeps."""
    numeric = table.select_dtypes("number")
    for i in range(len(table)):
        if numeric.iloc[i].isna().any():
            assert table["note"].iloc[i], f"row {i} has NaN but no note:\n{table.iloc[i]}"


# --- records ---------------------------------------------------------------------------------------------------------


def test_schema_matches_columns_and_fixture_validates(fx: pd.DataFrame) -> None:
    assert [c.name for c in SCHEMA] == list(COLUMNS)
    assert all(c.doc for c in SCHEMA)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("arm", "solo_triton", "'arm'"),
        ("dsl", "tirx", "disagree with their arm"),
        ("problem", 75, "1..74"),
        ("replicate", 0, "below 1"),
        ("status", "passed", "disagree with status"),
        ("speedup", -1.0, "finite positive speedup"),
        ("source_replicate", 2.0, "set on a solo arm"),
    ],
)
def test_validate_names_the_bad_column(fx: pd.DataFrame, column: str, value: object, message: str) -> None:
    bad = fx.copy()
    # row 2 is solo_cute p1 r3, a failed cute attempt (status wrong, speedup NaN)
    bad.loc[2, column] = value
    if column == "speedup":
        bad.loc[0, column] = value  # a passed row with a negative speedup
    with pytest.raises(ValueError, match=message):
        validate_attempts(bad)


def test_validate_missing_column_and_duplicates(fx: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="lacks column.*cost_usd"):
        validate_attempts(fx.drop(columns="cost_usd"))
    with pytest.raises(ValueError, match="duplicate"):
        validate_attempts(pd.concat([fx, fx.iloc[:1]], ignore_index=True))


def test_synthetic_generator_is_valid_marked_and_deterministic() -> None:
    a = synthetic_experiment(n_problems=12, models=("a", "b"), replicates=2, effect={"cute2tirx": 0.5}, seed=3,
                             skip_prob=0.2, control_arms=True)
    validate_attempts(a)
    assert a["synthetic"].all()
    assert len(a) == 2 * 12 * 2 * 8
    pd.testing.assert_frame_equal(a, synthetic_experiment(n_problems=12, models=("a", "b"), replicates=2,
                                                          effect={"cute2tirx": 0.5}, seed=3, skip_prob=0.2,
                                                          control_arms=True))
    assert (a["status"] == "skipped").any()
    assert is_synthetic(a) and not is_synthetic(fixture())
    with pytest.raises(ValueError, match="unknown direction"):
        synthetic_experiment(effect={"cute2triton": 1.0})


def test_synthetic_planted_effect_is_recovered() -> None:
    df = synthetic_experiment(n_problems=74, replicates=3, effect={"cute2tirx": 0.7, "tirx2cute": 0.0},
                              seed=1, pass_rate=0.9)
    lift = M.paired_lift(df, floor=0.05)
    # mostly passes, so the log ratio is close to the planted log-speedup effect
    assert one(lift, direction="cute2tirx")["mean_log_ratio"] == pytest.approx(0.7, abs=0.2)
    assert one(lift, direction="tirx2cute")["mean_log_ratio"] == pytest.approx(0.0, abs=0.2)


# --- scalar definitions ----------------------------------------------------------------------------------------------


def test_tier_bounds() -> None:
    assert [M.tier(False, math.nan)] + [M.tier(True, s) for s in (0.49, 0.5, 0.99, 1.0, 1.99, 2.0, 3.99, 4.0, 100)] \
        == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    with pytest.raises(ValueError):
        M.tier(True, math.nan)


def test_clipped_speedup_and_classes() -> None:
    assert clipped_speedup(False, math.nan) == 0.05
    assert clipped_speedup(True, 0.01) == 0.05
    assert clipped_speedup(True, 0.01, floor=0.001) == 0.01
    assert clipped_speedup(True, 3.0) == 3.0
    kw = {"skill_passed": True, "solo_passed": True}
    assert classify_pair(1.06, 1.0, **kw) == "helped"
    assert classify_pair(1.04, 1.0, **kw) == "neutral"
    assert classify_pair(0.96, 1.0, **kw) == "neutral"  # 1/1.05 = 0.952
    assert classify_pair(0.95, 1.0, **kw) == "harmed"
    assert classify_pair(0.05, 0.05, skill_passed=False, solo_passed=False) == "both_failed"
    assert classify_pair(0.05, 0.05, skill_passed=False, solo_passed=False, skipped=True) == "skipped"
    assert classify_pair(1.06, 1.0, tau=0.1, **kw) == "neutral"


# --- per arm ---------------------------------------------------------------------------------------------------------


def test_per_arm_hand_values(fx: pd.DataFrame) -> None:
    t = M.per_arm(fx)
    assert list(t["arm"]) == ["solo_cute", "solo_tirx", "cute2tirx_skill", "tirx2cute_skill"]
    expected = {
        # arm: n_passed, R@0, R@0.5, R@1, R@2, R@4 (in sixths), S, gm, roofline share
        "solo_cute": (4, [4, 3, 3, 2, 1], 100 * 13 / 30, 2 ** 0.25, 0.18125),
        "solo_tirx": (4, [4, 4, 3, 1, 0], 40.0, 1.0, 0.1125),
        "cute2tirx_skill": (5, [5, 4, 4, 2, 0], 50.0, 1.0, 0.125),
        # the skipped p1 r2 attempt is scored as solo_cute p1 r2 (passed, 1.0)
        "tirx2cute_skill": (4, [4, 3, 3, 2, 2], 100 * 14 / 30, 2 ** 0.5, 0.328125),
    }
    for arm, (k, sixths, s, gm, roof) in expected.items():
        r = one(t, arm=arm)
        assert r["n"] == 6 and r["n_passed"] == k
        assert r["pass_rate"] == pytest.approx(k / 6)
        assert [r[f"R@{x:g}"] for x in M.THRESHOLDS] == pytest.approx([v / 6 for v in sixths])
        assert r["S"] == pytest.approx(s)
        assert r["gm_speedup_passed"] == pytest.approx(gm)
        assert r["roofline_share"] == pytest.approx(roof)
        assert r["note"] == ""


def test_per_arm_by_family(fx: pd.DataFrame) -> None:
    t = M.per_arm(fx, by_family=True)
    r = one(t, arm="solo_cute", family="moe")
    assert (r["n"], r["n_passed"]) == (3, 2)
    assert r["S"] == pytest.approx(100 * (2 + 1 + 1 + 1 + 1) / 15)


def test_tiers_and_tier_counts(fx: pd.DataFrame) -> None:
    t = M.tiers(fx)
    cute = fx["arm"] == "solo_cute"
    assert list(t[cute]) == [4, 3, 0, 0, 1, 5]
    assert list(t[fx["arm"] == "solo_tirx"]) == [3, 2, 4, 0, 3, 0]
    counts = one(M.tier_counts(fx), arm="tirx2cute_skill")
    assert [counts[f"tier_{k}"] for k in range(6)] == [2, 1, 0, 1, 0, 2]  # 4.0, (1.0), F, F, 0.125, 8.0


# --- pairs -----------------------------------------------------------------------------------------------------------


def test_pair_classes(fx: pd.DataFrame) -> None:
    p = pairs(fx)
    c2t = p[p["direction"] == "cute2tirx"]["pair_class"].tolist()
    t2c = p[p["direction"] == "tirx2cute"]["pair_class"].tolist()
    assert c2t == ["helped", "harmed", "neutral", "helped", "neutral", "both_failed"]
    assert t2c == ["helped", "skipped", "both_failed", "both_failed", "harmed", "helped"]
    skipped = one(p, direction="tirx2cute", problem=1, replicate=2)
    assert (skipped["c_skill"], skipped["c_solo"], skipped["log_ratio"]) == (1.0, 1.0, 0.0)
    flip = one(p, direction="cute2tirx", problem=2, replicate=1)
    assert flip["log_ratio"] == pytest.approx(math.log(20))


def test_pair_rates_hand_values(fx: pd.DataFrame) -> None:
    t = M.pair_rates(fx)
    c = one(t, direction="cute2tirx")
    assert [c[k] for k in ("n_pairs", "n_informative", "helped", "harmed", "neutral", "both_failed", "skipped")] \
        == [6, 5, 2, 1, 2, 1, 0]
    assert (c["help_rate_all"], c["harm_rate_all"]) == pytest.approx((2 / 6, 1 / 6))
    assert (c["help_rate_informative"], c["harm_rate_informative"]) == pytest.approx((2 / 5, 1 / 5))
    t2c = one(t, direction="tirx2cute")
    assert [t2c[k] for k in ("n_pairs", "n_informative", "helped", "harmed", "neutral", "both_failed", "skipped")] \
        == [6, 3, 2, 1, 0, 2, 1]
    assert (t2c["help_rate_informative"], t2c["harm_rate_informative"]) == pytest.approx((2 / 3, 1 / 3))


def test_paired_lift_hand_values(fx: pd.DataFrame) -> None:
    t = M.paired_lift(fx)
    c = one(t, direction="cute2tirx")
    assert (c["n_problems"], c["n_pairs"]) == (2, 6)
    assert c["mean_log_ratio"] == pytest.approx(math.log(20) / 6)
    assert c["dgm"] == pytest.approx(20 ** (1 / 6) - 1)  # 0.647548
    assert one(t, direction="tirx2cute")["dgm"] == pytest.approx(2 ** (1 / 6) - 1)  # 0.122462
    plr = M.problem_log_ratios(fx)
    assert one(plr, direction="cute2tirx", problem=2)["mean_log_ratio"] == pytest.approx(math.log(20) / 3)
    assert one(plr, direction="tirx2cute", problem=1)["n_replicates"] == 3


def test_lift_is_problem_level_not_pair_level() -> None:
    # problem 1: one pair at ratio 4; problem 2: three pairs at ratio 1. Problem level: (ln4 + 0)/2 = ln2 -> +100 %.
    # Pooling pairs would give ln4/4 -> +41 %.
    rows = [row(1, "solo_tirx", 1, 1.0), row(1, "cute2tirx_skill", 1, 4.0)]
    for r in (1, 2, 3):
        rows += [row(2, "solo_tirx", r, 1.0), row(2, "cute2tirx_skill", r, 1.0)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    validate_attempts(df)
    assert one(M.paired_lift(df), direction="cute2tirx")["dgm"] == pytest.approx(1.0)


def test_floor_sensitivity_hand_values(fx: pd.DataFrame) -> None:
    t = M.floor_sensitivity(fx)
    c2t = t[t["direction"] == "cute2tirx"]
    assert list(c2t["floor"]) == [0.01, 0.05, 0.1]
    # only p2 r1 (a failure-to-pass flip, ratio 1/f) moves: dGM = (1/f)^(1/6) - 1
    assert list(c2t["dgm"]) == pytest.approx([100 ** (1 / 6) - 1, 20 ** (1 / 6) - 1, 10 ** (1 / 6) - 1])
    assert list(c2t["n_flips"]) == [1, 1, 1]
    t2c = t[t["direction"] == "tirx2cute"]
    assert list(t2c["dgm"]) == pytest.approx([2 ** (1 / 6) - 1] * 3)
    assert list(t2c["n_flips"]) == [0, 0, 0]


def test_per_family_hand_values(fx: pd.DataFrame) -> None:
    t = M.per_family(fx)
    assert one(t, direction="cute2tirx", family="attention")["dgm"] == pytest.approx(0.0)
    moe = one(t, direction="cute2tirx", family="moe")
    assert moe["dgm"] == pytest.approx(20 ** (1 / 3) - 1)
    assert (moe["n_problems"], moe["n_pairs"], moe["helped"], moe["neutral"], moe["both_failed"]) == (1, 3, 1, 1, 1)
    assert one(t, direction="tirx2cute", family="attention")["dgm"] == pytest.approx(2 ** (1 / 3) - 1)
    assert one(t, direction="tirx2cute", family="attention")["help_rate_informative"] == pytest.approx(1.0)


# --- standing, reverse, A/A ----------------------------------------------------------------------------------------


def counts_by_standing(table: pd.DataFrame, direction: str) -> dict[str, dict[str, int]]:
    sel = table[table["direction"] == direction]
    return {s: {c: int(r[c]) for c in ("helped", "neutral", "harmed", "both_failed", "skipped") if r[c]}
            for s, r in zip(sel["standing"], sel.to_dict("records"), strict=True) if r["n"]}


def test_relative_standing_hand_values(fx: pd.DataFrame) -> None:
    st = M.relative_standing(fx)
    assert counts_by_standing(st.independent, "cute2tirx") == {
        "above": {"helped": 1, "neutral": 1, "both_failed": 1},
        "below": {"harmed": 1, "neutral": 1, "helped": 1},
    }
    assert counts_by_standing(st.naive, "cute2tirx") == {
        "above": {"helped": 1, "harmed": 1, "both_failed": 1},
        "same": {"helped": 1},
        "below": {"neutral": 2},
    }
    assert counts_by_standing(st.independent, "tirx2cute") == {
        "same": {"helped": 2, "both_failed": 1},
        "above": {"skipped": 1},
        "below": {"both_failed": 1, "harmed": 1},
    }
    assert counts_by_standing(st.placebo, "cute2tirx") == {
        "same": {"harmed": 1, "helped": 2},
        "below": {"harmed": 1},
        "above": {"harmed": 1, "both_failed": 1},
    }
    assert counts_by_standing(st.placebo_naive, "cute2tirx") == {
        "above": {"harmed": 1, "helped": 1, "both_failed": 1},
        "same": {"helped": 1},
        "below": {"harmed": 2},
    }
    above = one(st.independent, direction="cute2tirx", standing="above")
    assert (above["n"], above["n_informative"], above["help_rate"], above["harm_rate"]) == (3, 2, 0.5, 0.0)
    same = one(st.independent, direction="cute2tirx", standing="same")
    assert same["n"] == 0 and math.isnan(same["help_rate"]) and same["note"]
    for table in (st.independent, st.naive, st.placebo, st.placebo_naive):
        assert_nan_explained(table)


def test_placebo_needs_three_replicates(fx: pd.DataFrame) -> None:
    two = fx[fx["replicate"] <= 2].reset_index(drop=True)
    st = M.relative_standing(two)
    unavailable = one(st.placebo, direction="cute2tirx", standing="unavailable")
    assert unavailable["n"] == 4 and "fewer than 3 solo_tirx replicates" in unavailable["note"]
    assert one(st.placebo_naive, direction="cute2tirx", standing="above")["n"] > 0


def test_reverse_direction_hand_values(fx: pd.DataFrame) -> None:
    t = M.reverse_direction(fx)

    def fate(frm: str, cls: str) -> dict[str, int]:
        r = one(t, from_direction=frm, from_class=cls)
        return {c: int(r[c]) for c in ("helped", "neutral", "harmed", "both_failed", "skipped") if r[c]}

    assert fate("cute2tirx", "helped") == {"skipped": 1, "harmed": 1}
    assert fate("cute2tirx", "harmed") == {"both_failed": 1}
    assert fate("cute2tirx", "neutral") == {"helped": 2}
    assert fate("cute2tirx", "both_failed") == {"both_failed": 1}
    assert fate("tirx2cute", "helped") == {"harmed": 1, "helped": 1}
    assert fate("tirx2cute", "skipped") == {"neutral": 1}
    assert fate("tirx2cute", "both_failed") == {"helped": 1, "neutral": 1}
    assert fate("tirx2cute", "harmed") == {"both_failed": 1}
    assert (t["unmatched"] == 0).all()
    single = M.reverse_direction(fx[fx["replicate"] == 1].reset_index(drop=True))
    assert (single["unmatched"] == single["n"]).all() and single["note"].str.contains("another replicate").all()


def test_aa_spread_hand_values(fx: pd.DataFrame) -> None:
    aa = M.aa_spread(fx)
    cute = one(aa.table, arm="solo_cute")
    values = sorted(math.log(x) for x in (2, 40, 20, 5, 80, 16))
    assert cute["n"] == 6 and cute["n_both_failed_excluded"] == 0
    assert cute["q_abs_log"] == pytest.approx(values[4] + 0.5 * (values[5] - values[4]))  # 4.035453
    tirx = one(aa.table, arm="solo_tirx")
    assert (tirx["n"], tirx["n_both_failed_excluded"]) == (5, 1)
    assert tirx["median_abs_log"] == pytest.approx(math.log(4))
    assert tirx["q_abs_log"] == pytest.approx(math.log(20))
    assert one(aa.table, arm="all_solo")["n"] == 11
    assert aa.warning and len(aa.messages) == 3 and "tau = 0.05" in aa.messages[0]


def test_aa_spread_quiet_when_replicates_agree() -> None:
    rows = [row(1, "solo_cute", r, s) for r, s in ((1, 1.0), (2, 1.01), (3, 1.02))]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    aa = M.aa_spread(df)
    assert not aa.warning and aa.messages == []
    assert one(aa.table, arm="solo_cute")["q_relative"] == pytest.approx(0.02 - 0.2 * 0.01, rel=0.05)
    tirx = one(aa.table, arm="solo_tirx")
    assert tirx["n"] == 0 and tirx["note"] and not tirx["warn"]


def test_usage_hand_values(fx: pd.DataFrame) -> None:
    t = M.usage(fx)
    cute = one(t, arm="solo_cute")
    assert (cute["n"], cute["tokens_in_total"], cute["tokens_out_total"]) == (6, 6000, 1200)
    assert cute["cost_usd_total"] == pytest.approx(0.06) and cute["note"] == ""
    assert cute["wall_s_total"] == pytest.approx(2 * 60 * (1 + 2 + 3))
    tirx = one(t, arm="solo_tirx")
    assert tirx["n_priced"] == 3 and tirx["cost_usd_total"] == pytest.approx(0.03)
    assert "3 of 6 attempts unpriced" in tirx["note"]
    t2c = one(t, arm="tirx2cute_skill")
    assert t2c["tokens_in_total"] == 5000 and t2c["submissions_mean"] == pytest.approx(15 / 6)


# --- edge cases ------------------------------------------------------------------------------------------------------


def every_table(df: pd.DataFrame) -> list[pd.DataFrame]:
    st = M.relative_standing(df)
    return [M.per_arm(df), M.tier_counts(df), M.pair_rates(df), M.paired_lift(df), M.floor_sensitivity(df),
            M.per_family(df), st.independent, st.naive, st.placebo, st.placebo_naive, M.reverse_direction(df),
            M.aa_spread(df).table, M.usage(df)]


def test_no_pairs_and_missing_arm(fx: pd.DataFrame) -> None:
    solo_only = fx[fx["arm"].isin(["solo_cute", "solo_tirx"])].reset_index(drop=True)
    p = pairs(solo_only)
    assert p.empty and "no pairs" in p.attrs["notes"][0]
    rates = M.pair_rates(solo_only)
    assert list(rates["n_pairs"]) == [0, 0]
    assert rates["note"].str.contains("no cute2tirx_skill attempts|no tirx2cute_skill attempts").all()
    arm = one(M.per_arm(solo_only), arm="cute2tirx_skill")
    assert arm["n"] == 0 and "no attempts for arm cute2tirx_skill" in arm["note"]
    no_target = fx[fx["arm"] != "solo_tirx"].reset_index(drop=True)
    assert "no solo_tirx attempts" in one(M.paired_lift(no_target), direction="cute2tirx")["note"]
    for table in every_table(solo_only) + every_table(no_target):
        assert "n" in table.columns or "n_pairs" in table.columns
        assert_nan_explained(table)


def test_all_attempts_failed(fx: pd.DataFrame) -> None:
    failed = fx.copy()
    failed["passed"] = False
    failed["speedup"] = math.nan
    failed["roofline_fraction"] = math.nan
    failed.loc[failed["status"].isin(["passed"]), "status"] = "wrong"
    validate_attempts(failed)
    arm = one(M.per_arm(failed), arm="solo_cute")
    assert arm["pass_rate"] == 0 and arm["S"] == 0 and "no passed attempts" in arm["note"]
    rates = one(M.pair_rates(failed), direction="cute2tirx")
    assert rates["both_failed"] == 6 and rates["n_informative"] == 0 and "no informative pairs" in rates["note"]
    assert one(M.paired_lift(failed), direction="cute2tirx")["dgm"] == 0.0
    for table in every_table(failed):
        assert_nan_explained(table)


def test_empty_table() -> None:
    empty = pd.DataFrame(columns=list(COLUMNS))
    validate_attempts(empty)
    assert M.per_arm(empty).empty and pairs(empty).empty and M.problem_log_ratios(empty).empty
    assert not M.aa_spread(empty).warning


def test_scored_attempts_copies_baseline(fx: pd.DataFrame) -> None:
    s = scored_attempts(fx)
    r = s[(s["status"] == "skipped")].iloc[0]
    assert bool(r["passed"]) and r["speedup"] == 1.0
    assert fx[fx["status"] == "skipped"]["speedup"].isna().all()  # the input is not modified


# --- simulation: the regression-to-the-mean artefact -----------------------------------------------------------------


def asymmetry(table: pd.DataFrame) -> float:
    """(help - harm) rate among "above" minus the same among "below", pooled over models and directions."""
    def net(standing: str) -> float:
        sel = table[table["standing"] == standing]
        return float((sel["helped"].sum() - sel["harmed"].sum()) / sel["n_informative"].sum())

    return net("above") - net("below")


def test_naive_standing_shows_regression_to_the_mean_independent_does_not() -> None:
    df = synthetic_experiment(n_problems=74, models=("a", "b"), replicates=4, effect=0.0, seed=7, pass_rate=0.7)
    st = M.relative_standing(df)
    naive, indep = asymmetry(st.naive), asymmetry(st.independent)
    # ~350 informative pairs per standing row: the sampling sd of the asymmetry is about 0.075, so 0.2 is ~2.7 sd
    # (seeds 0-7 give |independent| <= 0.08) while the artefact is ~0.85 (seeds 0-7: 0.79-0.93)
    assert naive > 0.5, naive  # above -> helped, below -> harmed, from noise alone
    assert abs(indep) < 0.2, indep
    assert asymmetry(st.placebo_naive) > 0.5  # the artefact with no skill at all
    assert abs(asymmetry(st.placebo)) < 0.2
    for s in ("above", "below"):
        sel = st.naive[st.naive["standing"] == s]
        helped, harmed = sel["helped"].sum(), sel["harmed"].sum()
        assert (helped > harmed) if s == "above" else (harmed > helped)


def test_floor_sensitivity_of_an_empty_table_is_an_empty_table():
    """Regression: an empty attempt table crashed floor_sensitivity (a column-less pair table has no 'note')."""
    import pandas as pd
    from metakernel.analysis import metrics
    from metakernel.analysis.records import COLUMNS

    out = metrics.floor_sensitivity(pd.DataFrame(columns=list(COLUMNS)))
    assert out.empty and {"model", "direction", "floor"} <= set(out.columns)
