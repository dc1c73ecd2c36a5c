"""The report layer's computing half: every docs/design.md section 7 table, gathered once into a JSON-ready dict.

Why a module of its own: `build_report` is the only place that computes anything. The renderers of
`metakernel.analysis.render` (Markdown, HTML, JSON) and the PNG plots of `metakernel.analysis.plots` only format the
dict it returns, so the formats cannot disagree, and a report rebuilt from an export prints the same numbers as one
built from the store. Reading an attempt table from disk lives in `metakernel.analysis.loading`.

What the dict guarantees, because a report is read by people who will not open the code:

- Any synthetic row sets ``banner`` (SYNTHETIC DATA), which every format prints first.
- Every table carries its n (what it counts, too) and every row its own count columns.
- A number that cannot be computed is None in the JSON (the renderers print "—" with a footnote pointing at the
  row's note); the text "nan" never appears.
- Missing input (no pairs, an absent arm, nothing passed) is stated in plain sentences in ``missing``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from metakernel.analysis import metrics, stats
from metakernel.analysis.records import (
    CORE_ARMS,
    DIRECTIONS,
    FLOOR,
    SOLO_ARMS,
    SPEED_METRICS,
    TAU,
    is_synthetic,
    pairs,
    validate_attempts,
    with_speed_metric,
)

__all__ = ["REPORT_VERSION", "SYNTHETIC_BANNER", "build_report"]

REPORT_VERSION = 1
SYNTHETIC_BANNER = ("SYNTHETIC DATA — every number in this report was drawn at random by `metakernel report "
                    "--synthetic` (a stand-in experiment that shows the report's layout), not measured. Do not cite "
                    "it.")
NAIVE_BIAS = ("The naive table is biased: it compares the source with the very target solo attempt the pair is "
              "measured against, so an unluckily low target attempt makes both \"source above\" and \"helped\" "
              "likely, and regression to the mean alone produces \"above -> helped, below -> harmed\" even when the "
              "skill does nothing.")
WILCOXON_ZERO_METHOD = "wilcox"

Record = dict[str, Any]
Table = dict[str, Any]


# --- JSON-ready values ----------------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """Turn numpy/pandas scalars into plain Python and NaN into None, so json.dumps(allow_nan=False) accepts it."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    return value


def _records(frame: pd.DataFrame) -> list[Record]:
    return [_clean(r) for r in frame.to_dict(orient="records")]


def _col(key: str, header: str, fmt: str = "str") -> dict[str, str]:
    return {"key": key, "header": header, "format": fmt}


def _table(key: str, title: str, records: list[Record], columns: list[dict[str, str]], *, label: str, n: int,
           n_label: str, description: str = "", notes: Iterable[str] = ()) -> Table:
    """One table as the JSON carries it: all fields of every record, plus the columns the renderers print."""
    return {"key": key, "title": title, "label": label, "description": description, "n": int(n), "n_label": n_label,
            "columns": columns, "records": records, "notes": [n for n in notes if n]}


def _join(*notes: object) -> str:
    out: list[str] = []
    for note in notes:
        if note and str(note) not in out:
            out.append(str(note))
    return "; ".join(out)


# --- building -------------------------------------------------------------------------------------------------------


def build_report(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR, seed: int = stats.DEFAULT_SEED,
                 n_resamples: int = stats.DEFAULT_RESAMPLES, confidence: float = stats.DEFAULT_CONFIDENCE,
                 speed: str = "e2e") -> dict:
    """Compute every table of the report from the attempt table, once, as JSON-ready records.

    Args:
        df: The attempt table (`records.COLUMNS`); validated here so a bad store never yields a plausible report.
        tau: Dead band of the pair classes.
        floor: Floor of the clipped speedup for the headline; the sensitivity table adds 0.01, 0.05 and 0.1.
        seed: Seed of every bootstrap and Monte Carlo draw, so a rebuilt report is identical.
        n_resamples: Bootstrap resamples per cell (tests pass fewer for speed).
        confidence: Two-sided level of the primary intervals.
        speed: Which speedup every metric uses: "e2e" (the protocol's) or "gpu" (`records.SPEED_METRICS`).

    Returns:
        A dict with ``banner`` (first key: None unless synthetic), ``synthetic``, ``parameters``, ``overview``,
        ``missing`` (plain sentences), ``warnings``, ``tables`` (name -> table with ``records`` and ``n``) and
        ``sections`` (the order and prose the renderers follow).

    Raises:
        ValueError: When `records.validate_attempts` rejects the table, or `speed` is unknown or not measured.
    """
    validate_attempts(df)
    df = with_speed_metric(df, speed)
    synthetic = is_synthetic(df)
    report: dict[str, Any] = {
        "banner": SYNTHETIC_BANNER if synthetic else None,
        "title": "metakernel transfer report",
        "report_version": REPORT_VERSION,
        "synthetic": synthetic,
        "parameters": {"tau": tau, "floor": floor, "floors": sorted({*metrics.FLOORS, floor}), "seed": seed,
                       "n_resamples": n_resamples, "confidence": confidence,
                       "wilcoxon_zero_method": WILCOXON_ZERO_METHOD, "speed": speed,
                       "speed_meaning": SPEED_METRICS[speed][1]},
        "overview": _overview(df),
        "missing": [],
        "warnings": [],
        "tables": {},
        "sections": [],
    }
    if df.empty:
        report["missing"] = ["The attempt table has no rows, so there is nothing to report."]
        report["sections"] = [_section("overview", "Overview", [], [])]
        return _clean(report)

    tables: dict[str, Table] = report["tables"]
    p = pairs(df, tau, floor)
    plr = metrics.problem_log_ratios(df, floor=floor)
    arm = metrics.per_arm(df)
    rates = metrics.pair_rates(df, tau=tau, floor=floor)
    cells = {(m, d): plr.loc[(plr["model"] == m) & (plr["direction"] == d), "mean_log_ratio"].to_numpy(float)
             for m in _models(df) for d in DIRECTIONS}
    endpoints = stats.primary_endpoints(cells, confidence=confidence, n_resamples=n_resamples, seed=seed)
    aa = metrics.aa_spread(df, tau=tau, floor=floor)
    standing = metrics.relative_standing(df, tau=tau, floor=floor)

    tables["headline"] = _headline(arm, rates, endpoints, confidence)
    tables["per_arm"] = _per_arm(arm)
    tables["floor_sensitivity"] = _floor_table(metrics.floor_sensitivity(df, floors=report["parameters"]["floors"],
                                                                         tau=tau))
    tables.update(_standing_tables(standing))
    tables["reverse_direction"] = _reverse(metrics.reverse_direction(df, tau=tau, floor=floor))
    tables["aa_spread"] = _aa(aa)
    tables["per_family"] = _per_family(metrics.per_family(df, tau=tau, floor=floor))
    tables["secondary_tests"] = _secondary(p, cells, _models(df))
    tables["usage"] = _usage(metrics.usage(df))
    tables["problem_lift"] = _problem_lift(plr)

    report["warnings"] = list(aa.messages)
    report["missing"] = _missing(df, p, standing.notes)
    report["sections"] = _sections(report, tau, floor, confidence)
    return _clean(report)


def _models(df: pd.DataFrame) -> list[str]:
    return sorted(str(m) for m in df["model"].unique())


def _overview(df: pd.DataFrame) -> dict[str, Any]:
    solo = df[df["arm"].isin(SOLO_ARMS)]
    reps = solo.groupby(["model", "problem", "arm"])["replicate"].nunique() if len(solo) else pd.Series(dtype=int)
    return {
        "experiments": sorted(str(e) for e in df["experiment"].unique()),
        "models": _models(df),
        "n_attempts": len(df),
        "n_problems": int(df["problem"].nunique()),
        "n_synthetic_rows": int(df["synthetic"].astype(bool).sum()) if len(df) else 0,
        "attempts_per_arm": {str(a): int(n) for a, n in df["arm"].value_counts().sort_index().items()},
        "max_solo_replicates": int(reps.max()) if len(reps) else 0,
    }


def _section(key: str, title: str, text: list[str], table_keys: list[str]) -> dict[str, Any]:
    return {"key": key, "title": title, "text": text, "tables": table_keys}


_RATE_COLS = [
    _col("help_rate_all", "help (all)", "rate"), _col("harm_rate_all", "harm (all)", "rate"),
    _col("help_rate_informative", "help (inf.)", "rate"), _col("harm_rate_informative", "harm (inf.)", "rate"),
]


def _headline(arm: pd.DataFrame, rates: pd.DataFrame, endpoints: Mapping[tuple[str, str], stats.PrimaryEndpoint],
              confidence: float) -> Table:
    """Join per-arm S, the primary endpoint and the pair rates into one row per model x direction."""
    s_of = {(r["model"], r["arm"]): r for r in arm.to_dict(orient="records")}
    records = []
    for rate in rates.to_dict(orient="records"):
        model, name = str(rate["model"]), str(rate["direction"])
        d = DIRECTIONS[name]
        ep = endpoints[(model, name)]
        solo, skill = s_of.get((model, d.target_arm), {}), s_of.get((model, d.skill_arm), {})
        notes = [rate.get("note", "")]
        for row, arm_name in ((solo, d.target_arm), (skill, d.skill_arm)):
            if not row or not row.get("n"):
                notes.append(f"no {arm_name} attempts: its S is undefined")
        if ep.n:
            notes.append(ep.note or "")
        records.append({
            "model": model, "direction": name, "source_arm": d.source_arm, "skill_arm": d.skill_arm,
            "target_arm": d.target_arm, "S_solo": solo.get("S", math.nan), "n_solo": solo.get("n", 0),
            "S_skill": skill.get("S", math.nan), "n_skill": skill.get("n", 0),
            "dgm": ep.dgm, "ci_low": ep.ci[0] if ep.ci else None, "ci_high": ep.ci[1] if ep.ci else None,
            "ci_method": ep.ci_method, "p_value": ep.p_value, "p_holm": ep.p_holm, "test": ep.test,
            "mean_log_ratio": ep.mean_log_ratio, "n_problems": ep.n,
            **{k: rate[k] for k in ("n_pairs", "n_informative", "helped", "neutral", "harmed", "both_failed",
                                    "skipped", "help_rate_all", "harm_rate_all", "help_rate_informative",
                                    "harm_rate_informative")},
            "note": _join(*notes),
        })
    columns = [
        _col("model", "model"), _col("direction", "direction"), _col("S_solo", "S solo (target)", "score"),
        _col("S_skill", "S skill", "score"), _col("dgm", "ΔGM", "pct"), _col("ci", f"{confidence:.0%} CI", "ci"),
        _col("p_value", "p", "p"), _col("p_holm", "p (Holm)", "p"), *_RATE_COLS,
        _col("n_problems", "n problems", "int"), _col("n_pairs", "n pairs", "int"),
        _col("n_informative", "n inf.", "int"), _col("note", "note"),
    ]
    return _table("headline", "Headline: paired lift and help/harm rates per model x direction", _clean(records),
                  columns, label="primary", n=sum(int(r["n_pairs"]) for r in records), n_label="pairs",
                  description=(f"ΔGM = exp(mean log(c_skill / c_solo)) - 1 over problems (replicates averaged within "
                               f"a problem first), {confidence:.0%} bootstrap CI, p from the sign-flip test, "
                               "Holm-adjusted across the model x direction cells. S = 100 x mean R@t of the target "
                               "solo arm and of the skill arm. Help/harm rates over all pairs and over informative "
                               "pairs (not skipped, not both failed)."))


def _per_arm(arm: pd.DataFrame) -> Table:
    thresholds = [c for c in arm.columns if c.startswith("R@")]
    columns = [_col("model", "model"), _col("arm", "arm"), _col("n", "n", "int"), _col("pass_rate", "pass", "rate"),
               *[_col(t, t, "rate") for t in thresholds], _col("S", "S", "score"),
               _col("gm_speedup_passed", "GM speedup (passed)", "speed"),
               _col("roofline_share", "roofline", "rate"), _col("note", "note")]
    return _table("per_arm", "Per-arm scores", _records(arm), columns, label="descriptive", n=int(arm["n"].sum()),
                  n_label="attempts",
                  description=("R@t = share of all attempts that passed with speedup >= t; S = 100 x mean R@t. The "
                               "geometric mean is over passed attempts only (survivor-biased, descriptive)."))


def _floor_table(frame: pd.DataFrame) -> Table:
    columns = [_col("model", "model"), _col("direction", "direction"), _col("floor", "floor", "float"),
               _col("dgm", "ΔGM", "pct"), _col("n_problems", "n problems", "int"), _col("n_pairs", "n pairs", "int"),
               _col("n_flips", "flips", "int"), _col("helped", "helped", "int"), _col("harmed", "harmed", "int"),
               _col("note", "note")]
    n_floors = max(1, frame["floor"].nunique()) if len(frame) else 1
    return _table("floor_sensitivity", "Floor sensitivity", _records(frame), columns, label="sensitivity",
                  n=int(frame["n_pairs"].sum()) // n_floors if len(frame) else 0, n_label="pairs (at each floor)",
                  description=("ΔGM at each clipped-speedup floor f. Only pass/fail flips move with f (a flip to a "
                               "pass at speedup s contributes log(s / f)): a lift that swings with f is driven by "
                               "flips, not by faster kernels."))


_STANDING_COLUMNS = [
    _col("model", "model"), _col("direction", "direction"), _col("standing", "standing"), _col("n", "n", "int"),
    _col("helped", "helped", "int"), _col("neutral", "neutral", "int"), _col("harmed", "harmed", "int"),
    _col("both_failed", "both failed", "int"), _col("skipped", "skipped", "int"),
    _col("n_informative", "n inf.", "int"), _col("help_rate", "help rate", "rate"),
    _col("harm_rate", "harm rate", "rate"), _col("note", "note"),
]

_STANDING_TEXT = {
    "independent": ("Relative standing, independent replicate (the finding)", "primary standing",
                    "Tier of the source solo attempt r against an INDEPENDENT target solo replicate r' != r (next "
                    "replicate, cyclic), cross-tabulated with the pair class; rates over the row's informative pairs."),
    "naive": ("Relative standing, naive (same replicate; biased, shown for contrast)", "artefact",
              "Standing against target solo replicate r, the attempt the pair is compared with. " + NAIVE_BIAS),
    "placebo": ("Relative standing, placebo (solo vs solo, independent standing)", "control",
                "A target solo replicate plays the skill attempt against another; standing against a third "
                "replicate. The true effect is zero by construction: this is what the independent table looks like "
                "without any skill (needs >= 3 solo replicates)."),
    "placebo_naive": ("Relative standing, placebo with naive standing", "control",
                      "The placebo pairs with standing against the compared attempt: the naive artefact's size with "
                      "no skill at all."),
}


def _standing_tables(st: metrics.StandingTables) -> dict[str, Table]:
    out: dict[str, Table] = {}
    contrast: list[Record] = []
    for name, (title, label, text) in _STANDING_TEXT.items():
        frame: pd.DataFrame = getattr(st, name)
        out[f"standing_{name}"] = _table(f"standing_{name}", title, _records(frame), _STANDING_COLUMNS, label=label,
                                         n=int(frame["n"].sum()) if len(frame) else 0, n_label="pairs",
                                         description=text)
        for (model, direction), g in frame.groupby(["model", "direction"], sort=True) if len(frame) else []:
            by = {str(r["standing"]): r for r in g.to_dict(orient="records")}
            diff = {s: (by[s]["help_rate"] - by[s]["harm_rate"]) if s in by and by[s]["n_informative"] else math.nan
                    for s in ("above", "below")}
            value = diff["above"] - diff["below"]
            missing = [s for s, v in diff.items() if not math.isfinite(v)]
            contrast.append({"table": name, "model": model, "direction": direction,
                             "n_above": int(by["above"]["n"]) if "above" in by else 0,
                             "n_below": int(by["below"]["n"]) if "below" in by else 0,
                             "net_help_above": diff["above"], "net_help_below": diff["below"], "contrast": value,
                             "note": (f"no informative pairs standing {' or '.join(missing)}" if missing else "")})
    columns = [_col("table", "table"), _col("model", "model"), _col("direction", "direction"),
               _col("n_above", "n above", "int"), _col("n_below", "n below", "int"),
               _col("net_help_above", "help-harm | above", "signed"),
               _col("net_help_below", "help-harm | below", "signed"), _col("contrast", "contrast", "signed"),
               _col("note", "note")]
    out["standing_contrast"] = _table(
        "standing_contrast", "Standing contrast: (help - harm | above) - (help - harm | below)", _clean(contrast),
        columns, label="summary", n=sum(r["n_above"] + r["n_below"] for r in contrast), n_label="pairs standing above "
        "or below", description=("One number per table: how much more often pairs whose source stood above were "
                                 "helped (net of harmed) than pairs whose source stood below. Compare the "
                                 "independent row with the placebo row, not with zero: the naive row shows the "
                                 "regression-to-the-mean artefact."))
    if st.notes:
        out["standing_independent"]["notes"] = list(st.notes)
    return out


def _reverse(frame: pd.DataFrame) -> Table:
    columns = [_col("model", "model"), _col("from_direction", "from"), _col("from_class", "class there"),
               _col("n", "n", "int"), _col("to_direction", "to"), _col("helped", "helped", "int"),
               _col("neutral", "neutral", "int"), _col("harmed", "harmed", "int"),
               _col("both_failed", "both failed", "int"), _col("skipped", "skipped", "int"),
               _col("unmatched", "unmatched", "int"), _col("note", "note")]
    return _table("reverse_direction", "Reverse direction", _records(frame), columns, label="secondary",
                  n=int(frame["n"].sum()) if len(frame) else 0, n_label="pairs",
                  description=("For the pairs of each class in one direction, the classes of the same problem's "
                               "pairs in the other direction at another replicate (same-replicate pairs would share "
                               "both solo attempts)."))


def _aa(aa: metrics.AASpread) -> Table:
    frame = aa.table
    columns = [_col("model", "model"), _col("arm", "arm"), _col("n", "n", "int"),
               _col("n_problems", "n problems", "int"), _col("median_abs_log", "median |Δlog c|", "float"),
               _col("q_abs_log", "q90 |Δlog c|", "float"), _col("q_relative", "q90 relative", "float"),
               _col("tau", "tau", "float"), _col("warn", "warn", "bool"), _col("note", "note")]
    solo = frame[frame["arm"] != "all_solo"] if len(frame) else frame
    return _table("aa_spread", "A/A spread of solo replicates", _records(frame), columns, label="diagnostic",
                  n=int(solo["n"].sum()) if len(solo) else 0, n_label="solo replicate pairs",
                  description=("|log c_r - log c_r'| over pairs of solo replicates of one problem (both-failed pairs "
                               "excluded). When its 90th percentile exceeds tau, replicate noise alone would call "
                               "more than 10 % of no-effect pairs helped or harmed."))


def _per_family(frame: pd.DataFrame) -> Table:
    columns = [_col("model", "model"), _col("direction", "direction"), _col("family", "family"),
               _col("n_problems", "n problems", "int"), _col("n_pairs", "n pairs", "int"), _col("dgm", "ΔGM", "pct"),
               _col("n_informative", "n inf.", "int"), _col("helped", "helped", "int"),
               _col("harmed", "harmed", "int"), _col("help_rate_informative", "help (inf.)", "rate"),
               _col("harm_rate_informative", "harm (inf.)", "rate"), _col("note", "note")]
    return _table("per_family", "Per family (secondary)", _records(frame), columns, label="secondary",
                  n=int(frame["n_pairs"].sum()) if len(frame) else 0, n_label="pairs",
                  description="Pair counts, rates and problem-level ΔGM per family; no intervals, no correction.")


def _secondary(p: pd.DataFrame, cells: Mapping[tuple[str, str], np.ndarray], models: list[str]) -> Table:
    """Wilcoxon, sign test and McNemar per model x direction: labelled secondary, never Holm-corrected."""
    records: list[Record] = []
    for model in models:
        for name in DIRECTIONS:
            sub = p[(p["model"] == model) & (p["direction"] == name)]
            helped, harmed = int((sub["pair_class"] == "helped").sum()), int((sub["pair_class"] == "harmed").sum())
            gained = int((sub["skill_passed"].astype(bool) & ~sub["solo_passed"].astype(bool)).sum())
            lost = int((~sub["skill_passed"].astype(bool) & sub["solo_passed"].astype(bool)).sum())
            tests = [
                (stats.wilcoxon_signed_rank(cells[(model, name)], zero_method=WILCOXON_ZERO_METHOD), "problems"),
                (stats.sign_test(helped, harmed, n_pairs=len(sub)), "helped + harmed pairs"),
                (stats.mcnemar_exact(gained, lost, n_pairs=len(sub)), "discordant pairs"),
            ]
            for t, unit in tests:
                note = t.note or ""
                if sub.empty:
                    note = _join("no pairs for this model and direction", note)
                records.append({"model": model, "direction": name, "test": t.name, "label": t.label,
                                "statistic": t.statistic, "p_value": t.p_value, "n": t.n, "n_unit": unit,
                                "method": t.method, "parameters": t.parameters, "note": note})
    columns = [_col("model", "model"), _col("direction", "direction"), _col("test", "test"),
               _col("statistic", "statistic", "float"), _col("p_value", "p", "p"), _col("n", "n", "int"),
               _col("n_unit", "n counts"), _col("method", "method"), _col("note", "note")]
    return _table("secondary_tests", "Secondary tests", _clean(records), columns, label="secondary",
                  n=len({(r["model"], r["direction"]) for r in records}), n_label="model x direction cells",
                  description=(f"Labelled secondary and not corrected for multiplicity. Wilcoxon signed-rank on "
                               f"per-problem mean log ratios with zero_method={WILCOXON_ZERO_METHOD!r} (problems with "
                               "a zero mean log ratio are dropped); exact sign test of helped vs harmed pairs; exact "
                               "McNemar on pass/fail flips (statistic: pairs where only the skill attempt passed). "
                               "The two count tests treat the replicates of a problem as independent."))


def _usage(frame: pd.DataFrame) -> Table:
    columns = [_col("model", "model"), _col("arm", "arm"), _col("n", "n", "int"),
               _col("tokens_in_total", "tokens in", "count"), _col("tokens_out_total", "tokens out", "count"),
               _col("tokens_in_mean", "in / attempt", "count"), _col("tokens_out_mean", "out / attempt", "count"),
               _col("n_priced", "n priced", "int"), _col("cost_usd_total", "cost", "usd"),
               _col("cost_usd_mean", "cost / attempt", "usd"), _col("wall_s_total", "wall s", "count"),
               _col("wall_s_mean", "wall s / attempt", "count"), _col("submissions_mean", "submissions", "float"),
               _col("note", "note")]
    return _table("usage", "Tokens, cost and wall time per arm", _records(frame), columns, label="descriptive",
                  n=int(frame["n"].sum()) if len(frame) else 0, n_label="attempts")


def _problem_lift(plr: pd.DataFrame) -> Table:
    frame = plr.assign(ratio_gm=np.exp(plr["mean_log_ratio"].astype(float)) - 1) if len(plr) else plr
    columns = [_col("model", "model"), _col("direction", "direction"), _col("problem", "problem", "int"),
               _col("family", "family"), _col("n_replicates", "n replicates", "int"),
               _col("mean_log_ratio", "mean log ratio", "signed"), _col("ratio_gm", "lift", "pct")]
    return _table("problem_lift", "Per-problem lift", _records(frame), columns, label="descriptive",
                  n=len(frame), n_label="problem x cell rows",
                  description="The per-problem mean log ratios every problem-level statistic uses (JSON and plot).")


def _missing(df: pd.DataFrame, p: pd.DataFrame, standing_notes: Sequence[str]) -> list[str]:
    """Plain sentences naming what the input lacks and which tables that empties."""
    out: list[str] = []
    for model in _models(df):
        present = set(df.loc[df["model"] == model, "arm"])
        for arm in CORE_ARMS:
            if arm not in present:
                dirs = [n for n, d in DIRECTIONS.items() if arm in (d.skill_arm, d.target_arm)]
                out.append(f"Model {model} has no {arm} attempts, so the {' and '.join(dirs)} direction(s) have no "
                           f"pairs from it and its rows show n = 0.")
    if p.empty:
        out.append("There are no transfer pairs (no skill attempt has a target solo attempt of the same replicate), "
                   "so lift, help/harm rates, standing, reverse-direction and secondary tests are empty.")
    else:
        for model in _models(df):
            for name in DIRECTIONS:
                if p[(p["model"] == model) & (p["direction"] == name)].empty:
                    out.append(f"Model {model}, direction {name}: no pairs.")
    out.extend(f"{n[0].upper()}{n[1:]}." for n in p.attrs.get("notes", []) if not n.startswith("no pairs"))
    if not df["passed"].astype(bool).any():
        out.append("No attempt passed: every speedup, geometric mean and roofline share is undefined, every pair is "
                   "both_failed (lift 0 by construction) and the informative rates are undefined.")
    solo = df[df["arm"].isin(SOLO_ARMS)]
    if len(solo):
        reps = int(solo.groupby(["model", "problem", "arm"])["replicate"].nunique().max())
        if reps < 2:
            out.append("Only one solo replicate per problem: the A/A spread, the independent standing table, the "
                       "placebo tables and the reverse-direction table need at least two.")
        elif reps < 3:
            out.append("Only two solo replicates per problem: the independent placebo table needs three.")
    else:
        out.append("There are no solo attempts: per-arm baselines, standing and the A/A spread are empty.")
    for note in standing_notes:
        if note.startswith("placebo") and not any("placebo" in s for s in out):
            out.append(f"{note[0].upper()}{note[1:]}.")
    return out


def _floor_paragraphs() -> list[str]:
    """The DSLs' launch floors measured per GPU (metakernel.floors): the least an end-to-end time can be."""
    from metakernel.floors import measured

    out = []
    for gpu, routes in sorted(measured().items()):
        if routes:
            listed = ", ".join(f"{route} {us:.1f} us" for route, us in routes.items())
            out.append(f"Launch floor on {gpu} (a trivial kernel through the grader's bracket, "
                       f"scripts/bench_overhead.py --floors): {listed}. An end-to-end time near its DSL's floor is "
                       "decided by the launch route, not by the kernel.")
    return out


def _sections(report: dict[str, Any], tau: float, floor: float, confidence: float) -> list[dict[str, Any]]:
    ov = report["overview"]
    aa_warn = [f"Warning: {m}." for m in report["warnings"]]
    aa_rows = report["tables"]["aa_spread"]["records"]
    headline_warn = [] if not aa_warn else [
        f"Warning: the A/A spread of solo replicates exceeds tau = {tau:g} in {len(aa_warn)} of {len(aa_rows)} rows "
        "(see \"A/A spread and tau\"): replicate noise alone exceeds the neutral band, so helped/harmed counts are "
        "dominated by noise; read ΔGM and its interval first."]
    return [
        _section("overview", "Overview", [
            f"Experiment(s): {', '.join(ov['experiments'])}. Models: {', '.join(ov['models'])}. "
            f"{ov['n_attempts']} attempts over {ov['n_problems']} problems; up to {ov['max_solo_replicates']} solo "
            f"replicate(s) per problem.",
            f"tau = {tau:g} (dead band of helped/harmed), floor = {floor:g} (clipped speedup), bootstrap "
            f"{report['parameters']['n_resamples']} resamples with seed {report['parameters']['seed']}, "
            f"{confidence:.0%} intervals; no interval or p-value below {stats.MIN_N_FOR_CI} problems, BCa from "
            f"{stats.MIN_N_FOR_BCA}.",
            f"Speedup used throughout: {report['parameters']['speed']} "
            f"({report['parameters']['speed_meaning']}).",
            *_floor_paragraphs(),
        ], []),
        _section("headline", "Primary endpoint", [
            "The primary endpoint is ΔGM per model x direction with its interval and Holm-adjusted p-value; "
            "everything after this section is secondary, descriptive or diagnostic.", *headline_warn], ["headline"]),
        _section("per_arm", "Per-arm scores", [], ["per_arm"]),
        _section("floor", "Floor sensitivity", [], ["floor_sensitivity"]),
        _section("standing", "Relative standing", [
            "Does the skill help more when the source solved the problem better than the target usually does? The "
            "independent table is the finding; the naive and placebo tables show the size of the "
            "regression-to-the-mean artefact.", NAIVE_BIAS],
            ["standing_independent", "standing_naive", "standing_placebo", "standing_placebo_naive",
             "standing_contrast"]),
        _section("reverse", "Reverse direction", [], ["reverse_direction"]),
        _section("aa", "A/A spread and tau", aa_warn or [
            f"The 90th percentile of the solo replicate spread is within tau = {tau:g} wherever it is computable."],
            ["aa_spread"]),
        _section("per_family", "Per family (secondary)", [], ["per_family"]),
        _section("secondary", "Secondary tests", [], ["secondary_tests"]),
        _section("usage", "Tokens, cost and wall time", [], ["usage"]),
    ]
