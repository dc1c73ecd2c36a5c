"""Every metric of docs/design.md section 7 as a pure function from the attempt table to a small table.

Conventions shared by every function, so a report can print tables without second-guessing them:

- Input is the attempt table of `metakernel.analysis.records` (validate it first); skipped skill attempts are scored
  as their solo baseline (`records.scored_attempts`) before anything is counted.
- Every table has an ``n`` column (or several: ``n_pairs``, ``n_problems``...) and a ``note`` column. A number that
  cannot be computed is NaN *only* in a row whose ``note`` says why; a number that can be computed never is.
- Rows exist for every model present and, for pair metrics, for both directions even when a direction has no pairs,
  so a missing arm shows up as a row with n = 0 and a note rather than as a silently absent line.

docs/metrics.md gives each definition with a worked example checked by tests/test_analysis_metrics.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from metakernel.analysis.records import (
    CORE_ARMS,
    DIRECTIONS,
    DSL_OF_ARM,
    FLOOR,
    INFORMATIVE_CLASSES,
    PAIR_CLASSES,
    SOLO_ARMS,
    TAU,
    classify_pair,
    clipped_speedup,
    pairs,
    scored_attempts,
)

__all__ = [
    "FLOORS", "STANDINGS", "THRESHOLDS", "AASpread", "StandingTables", "aa_spread", "classify_pair",
    "clipped_speedup", "floor_sensitivity", "paired_lift", "pair_rates", "per_arm", "per_family",
    "problem_log_ratios", "relative_standing", "reverse_direction", "standing_of", "tier", "tier_counts", "tiers",
    "usage",
]

#: Speedup thresholds of R@t; S averages over exactly these.
THRESHOLDS = (0.0, 0.5, 1.0, 2.0, 4.0)
#: Floors of the clipped-speedup sensitivity analysis.
FLOORS = (0.01, 0.05, 0.1)
#: Tier upper bounds: tier k+1 holds passed speedups below TIER_BOUNDS[k]; tier 5 is everything >= 4.
TIER_BOUNDS = (0.5, 1.0, 2.0, 4.0)
STANDINGS = ("above", "same", "below")


def _join(notes: Iterable[str]) -> str:
    return "; ".join(n for n in notes if n)


def _rate(k: int, n: int) -> float:
    return k / n if n else math.nan


def _models(df: pd.DataFrame) -> list[str]:
    return sorted(str(m) for m in df["model"].unique())


# --- per-arm scores -------------------------------------------------------------------------------------------------


def tier(passed: bool, speedup: float) -> int:
    """Coarse speedup band, so standing compares 'how good' without pretending small speedup gaps mean anything.

    0 failed; passed with speedup s: 1 (s < 0.5), 2 (< 1), 3 (< 2), 4 (< 4), 5 (>= 4).
    """
    if not passed:
        return 0
    s = float(speedup)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"a passed attempt needs a finite positive speedup, got {speedup!r}")
    return 1 + sum(s >= b for b in TIER_BOUNDS)


def tiers(df: pd.DataFrame) -> pd.Series:
    """Tier of every attempt (skipped ones scored as their baseline), aligned with ``df``'s index."""
    scored = scored_attempts(df)
    return pd.Series([tier(bool(p), s) for p, s in zip(scored["passed"], scored["speedup"], strict=True)],
                     index=df.index, dtype="int64", name="tier")


def _arm_groups(df: pd.DataFrame, extra: Sequence[str] = ()) -> list[tuple[tuple[object, ...], pd.DataFrame]]:
    """Groups by model, arm, DSL (and ``extra``), adding empty groups for absent core arms so they are visible."""
    keys = ["model", "arm", "dsl", *extra]
    present = {tuple(k): g for k, g in df.groupby(keys, sort=True)} if len(df) else {}
    groups: list[tuple[tuple[object, ...], pd.DataFrame]] = list(present.items())
    if not extra:
        for model in _models(df):
            for arm in CORE_ARMS:
                if not any(k[0] == model and k[1] == arm for k in present):
                    groups.append(((model, arm, DSL_OF_ARM[arm]), df.iloc[0:0]))
    order = {a: i for i, a in enumerate(CORE_ARMS)}
    groups.sort(key=lambda kg: (str(kg[0][0]), order.get(str(kg[0][1]), 99), *map(str, kg[0][1:])))
    return groups


def per_arm(df: pd.DataFrame, *, by_family: bool = False, thresholds: Sequence[float] = THRESHOLDS) -> pd.DataFrame:
    """Primary per-arm scores: pass rate, R@t and S, plus the survivor-biased geometric mean and roofline share.

    R@t is the share of ALL attempts that passed with speedup >= t (failures count against it), so unlike the
    geometric mean over passed attempts it cannot improve by failing the hard problems. S = 100 * mean_t R@t.
    Roofline share is the mean roofline fraction over passed attempts with a known roofline.
    """
    scored = scored_attempts(df)
    rows = []
    for key, g in _arm_groups(scored, ("family",) if by_family else ()):
        n = len(g)
        passed = g[g["passed"].astype(bool)]
        speed = passed["speedup"].astype(float).to_numpy()
        roof = passed["roofline_fraction"].astype(float).dropna().to_numpy()
        notes = []
        row: dict[str, object] = dict(zip(["model", "arm", "dsl", *(["family"] if by_family else [])], key,
                                          strict=True))
        row.update(n=n, n_passed=len(passed), pass_rate=_rate(len(passed), n))
        for t in thresholds:
            row[f"R@{t:g}"] = _rate(int((speed >= t).sum()), n)
        row["S"] = 100 * float(np.mean([row[f"R@{t:g}"] for t in thresholds])) if n else math.nan
        row["gm_speedup_passed"] = float(np.exp(np.log(speed).mean())) if len(speed) else math.nan
        row["n_roofline"] = len(roof)
        row["roofline_share"] = float(roof.mean()) if len(roof) else math.nan
        if n == 0:
            notes.append(f"no attempts for arm {key[1]}: rates undefined")
        elif not len(passed):
            notes.append("no passed attempts: geometric mean and roofline share undefined")
        elif not len(roof):
            notes.append("no passed attempt has a known roofline: roofline share undefined")
        row["note"] = _join(notes)
        rows.append(row)
    return pd.DataFrame(rows)


def tier_counts(df: pd.DataFrame) -> pd.DataFrame:
    """How many attempts of each arm landed in each tier: the distribution behind the standing tables."""
    t = tiers(df)
    scored = df.assign(tier=t)
    rows = []
    for key, g in _arm_groups(scored):
        row: dict[str, object] = dict(zip(["model", "arm", "dsl"], key, strict=True))
        row["n"] = len(g)
        for k in range(6):
            row[f"tier_{k}"] = int((g["tier"] == k).sum()) if len(g) else 0
        row["note"] = "" if len(g) else f"no attempts for arm {key[1]}"
        rows.append(row)
    return pd.DataFrame(rows)


# --- pairs: rates and lift ------------------------------------------------------------------------------------------


def _why_no_pairs(df: pd.DataFrame, model: str, direction: str) -> str:
    d = DIRECTIONS[direction]
    arms = set(df.loc[df["model"] == model, "arm"])
    if d.skill_arm not in arms:
        return f"no pairs: no {d.skill_arm} attempts for model {model}"
    if d.target_arm not in arms:
        return f"no pairs: no {d.target_arm} attempts for model {model}"
    return f"no pairs: no {d.skill_arm} attempt has a {d.target_arm} attempt of the same replicate"


def _counts(p: pd.DataFrame) -> dict[str, object]:
    counts = {c: int((p["pair_class"] == c).sum()) for c in PAIR_CLASSES}
    n = len(p)
    n_inf = sum(counts[c] for c in INFORMATIVE_CLASSES)
    return {
        "n_pairs": n, "n_informative": n_inf, **counts,
        "help_rate_all": _rate(counts["helped"], n), "harm_rate_all": _rate(counts["harmed"], n),
        "help_rate_informative": _rate(counts["helped"], n_inf),
        "harm_rate_informative": _rate(counts["harmed"], n_inf),
    }


def _lift(p: pd.DataFrame) -> dict[str, object]:
    per_problem = p.groupby("problem")["log_ratio"].mean()
    mean = float(per_problem.mean()) if len(per_problem) else math.nan
    return {"n_problems": len(per_problem), "n_pairs": len(p), "mean_log_ratio": mean,
            "dgm": math.exp(mean) - 1 if len(per_problem) else math.nan}


def _pair_table(df: pd.DataFrame, p: pd.DataFrame, summarise: Callable[[pd.DataFrame], dict[str, object]],
                by_family: bool) -> pd.DataFrame:
    rows = []
    for model in _models(df):
        for direction in DIRECTIONS:
            sub = p[(p["model"] == model) & (p["direction"] == direction)]
            if sub.empty:
                empty = summarise(sub)
                row = {"model": model, "direction": direction, **({"family": ""} if by_family else {}), **empty}
                row["note"] = _why_no_pairs(df, model, direction)
                rows.append(row)
                continue
            groups = sub.groupby("family", sort=True) if by_family else [(None, sub)]
            for family, g in groups:
                row = {"model": model, "direction": direction, **({"family": family} if by_family else {}),
                       **summarise(g)}
                notes = []
                if "n_informative" in row and row["n_informative"] == 0:
                    notes.append("no informative pairs (all skipped or both failed): informative rates undefined")
                row["note"] = _join(notes)
                rows.append(row)
    return pd.DataFrame(rows)


def pair_rates(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR, by_family: bool = False) -> pd.DataFrame:
    """Help and harm rates over all pairs (comparable with the reference design) and over informative pairs.

    Informative pairs exclude skipped and both-failed pairs, which cannot show a skill's effect; the all-pairs rates
    are kept because they are what the reference design published.
    """
    return _pair_table(df, pairs(df, tau, floor), _counts, by_family)


def paired_lift(df: pd.DataFrame, *, floor: float = FLOOR, by_family: bool = False) -> pd.DataFrame:
    """Paired lift dGM = exp(mean log(c_skill / c_solo)) - 1 with the problem as the unit.

    Log ratios are averaged over replicates within a problem first, then over problems, so a problem with more
    replicates does not weigh more and the value matches what the problem-level bootstrap resamples.
    """
    return _pair_table(df, pairs(df, TAU, floor), _lift, by_family)


def problem_log_ratios(df: pd.DataFrame, *, floor: float = FLOOR) -> pd.DataFrame:
    """Per-problem mean log ratio, the input of every problem-level statistic (bootstrap, Wilcoxon).

    Columns: model, direction, problem, family, n_replicates, mean_log_ratio; one row per problem with a pair.
    """
    p = pairs(df, TAU, floor)
    cols = ["model", "direction", "problem", "family", "n_replicates", "mean_log_ratio"]
    if p.empty:
        return pd.DataFrame(columns=cols)
    g = p.groupby(["model", "direction", "problem", "family"], sort=True)["log_ratio"]
    out = g.agg(n_replicates="size", mean_log_ratio="mean").reset_index()
    return out[cols]


def floor_sensitivity(df: pd.DataFrame, *, floors: Sequence[float] = FLOORS, tau: float = TAU) -> pd.DataFrame:
    """DGM and help/harm counts at each floor, because pass/fail flips make dGM depend on the arbitrary floor.

    A flip from failure to a pass with speedup s contributes log(s / f); only pairs where exactly one side failed
    move with f, so a large spread across floors says the lift is driven by flips, not by faster kernels.
    """
    frames = []
    for f in floors:
        p = pairs(df, tau, f)
        lift = _pair_table(df, p, _lift, False)
        counts = _pair_table(df, p, _counts, False)
        # An empty attempt table gives column-less frames; reindex so the merge still has its keys.
        count_cols = ["model", "direction", "n_informative", "helped", "harmed", "note"]
        lift = lift.reindex(columns=list(dict.fromkeys(["model", "direction", *lift.columns])))
        merged = lift.drop(columns="note", errors="ignore").merge(counts.reindex(columns=count_cols),
                                                                   on=["model", "direction"])
        flips = p[p["skill_passed"] != p["solo_passed"]].groupby(["model", "direction"]).size()
        merged["n_flips"] = [int(flips.get((m, d), 0)) for m, d in zip(merged["model"], merged["direction"],
                                                                          strict=True)]
        merged.insert(2, "floor", f)
        merged["note"] = merged.pop("note")
        frames.append(merged)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["model", "direction", "floor"], kind="stable").reset_index(drop=True)


def per_family(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR) -> pd.DataFrame:
    """Pair counts, rates and dGM per model x direction x family: a secondary table, labelled so in reports."""
    p = pairs(df, tau, floor)

    def both(g: pd.DataFrame) -> dict[str, object]:
        return {**_lift(g), **_counts(g)}

    return _pair_table(df, p, both, True)


# --- relative standing ----------------------------------------------------------------------------------------------


def standing_of(source_tier: int, target_tier: int) -> str:
    """Where the source solo attempt stood relative to the target solo attempt it is compared with."""
    if source_tier > target_tier:
        return "above"
    if source_tier < target_tier:
        return "below"
    return "same"


def _next_other(reps: Sequence[int], r: int, exclude: Iterable[int]) -> int | None:
    """The replicate after r in cyclic order that is not excluded: a fixed, documented choice of r'."""
    skip = set(exclude)
    for x in [x for x in reps if x > r] + [x for x in reps if x < r]:
        if x not in skip:
            return x
    return None


@dataclass
class _Solo:
    """Solo attempts indexed for lookups: tier and clipped speedup by (experiment, model, problem, arm, replicate)."""

    tier: dict[tuple[object, ...], int]
    c: dict[tuple[object, ...], float]
    passed: dict[tuple[object, ...], bool]
    reps: dict[tuple[object, ...], list[int]]

    @classmethod
    def build(cls, df: pd.DataFrame, floor: float) -> _Solo:
        solo = df[df["arm"].isin(SOLO_ARMS)]
        t: dict[tuple[object, ...], int] = {}
        c: dict[tuple[object, ...], float] = {}
        ok: dict[tuple[object, ...], bool] = {}
        reps: dict[tuple[object, ...], list[int]] = {}
        for e, m, pr, a, r, p, s in zip(solo["experiment"], solo["model"], solo["problem"], solo["arm"],
                                        solo["replicate"], solo["passed"], solo["speedup"], strict=True):
            key = (e, m, int(pr), a, int(r))
            t[key] = tier(bool(p), s)
            c[key] = clipped_speedup(bool(p), s, floor)
            ok[key] = bool(p)
            reps.setdefault((e, m, int(pr), a), []).append(int(r))
        return cls(t, c, ok, {k: sorted(v) for k, v in reps.items()})


@dataclass
class StandingTables:
    """The three standing cross-tabulations; only ``independent`` is a finding, the others show the artefact.

    Attributes:
        independent: source solo r vs an independent target solo replicate r' != r (r' = next replicate, cyclic).
        naive: source solo r vs target solo r, the attempt the pair is compared against (regression-to-the-mean
            artefact: a low target r makes both "above" and "helped" likely).
        placebo: solo vs solo: target solo r'' (r'' = next after r) plays the skill attempt against target solo r,
            standing against a third replicate r' (needs >= 3 solo replicates); true effect zero by construction.
        placebo_naive: the same placebo pairs with the naive standing (r' = r): the artefact's size with no skill.
        notes: why a table is empty or has an "unavailable" row.
    """

    independent: pd.DataFrame
    naive: pd.DataFrame
    placebo: pd.DataFrame
    placebo_naive: pd.DataFrame
    notes: list[str] = field(default_factory=list)


_STANDING_COLS = ["model", "direction", "standing", "n", "helped", "neutral", "harmed", "both_failed", "skipped",
                  "n_informative", "help_rate", "harm_rate", "note"]


def _crosstab(records: list[tuple[str, str, str | None, str, str]], models: list[str]) -> pd.DataFrame:
    """Records are (model, direction, standing or None, pair_class, why-unavailable)."""
    rows = []
    for model in models:
        for direction in DIRECTIONS:
            mine = [r for r in records if r[0] == model and r[1] == direction]
            if not mine:
                rows.append({"model": model, "direction": direction, "standing": "unavailable", "n": 0,
                             **dict.fromkeys(PAIR_CLASSES, 0), "n_informative": 0, "help_rate": math.nan,
                             "harm_rate": math.nan, "note": "no pairs for this model and direction"})
                continue
            for standing in (*STANDINGS, None):
                cell = [r for r in mine if r[2] == standing]
                if standing is None and not cell:
                    continue
                counts = {c: sum(r[3] == c for r in cell) for c in PAIR_CLASSES}
                n_inf = sum(counts[c] for c in INFORMATIVE_CLASSES)
                notes = []
                if standing is None:
                    whys = sorted({r[4] for r in cell})
                    notes.append("standing unavailable: " + ", ".join(whys))
                elif not cell:
                    notes.append(f"no pairs stand {standing}: rates undefined")
                elif not n_inf:
                    notes.append("no informative pairs: rates undefined")
                rows.append({"model": model, "direction": direction, "standing": standing or "unavailable",
                             "n": len(cell), **counts, "n_informative": n_inf,
                             "help_rate": _rate(counts["helped"], n_inf), "harm_rate": _rate(counts["harmed"], n_inf),
                             "note": _join(notes)})
    return pd.DataFrame(rows, columns=_STANDING_COLS)


def relative_standing(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR) -> StandingTables:
    """Cross-tabulate the source solo's standing against the pair class, without the regression-to-the-mean trap.

    Rates in each row are over that row's informative pairs. Standing compares tiers: "above" when the source solo
    attempt's tier exceeds the target solo replicate's tier.
    """
    scored = scored_attempts(df)
    solo = _Solo.build(scored, floor)
    p = pairs(df, tau, floor)
    indep: list[tuple[str, str, str | None, str, str]] = []
    naive: list[tuple[str, str, str | None, str, str]] = []
    for row in p.itertuples(index=False):
        d = DIRECTIONS[str(row.direction)]
        base: tuple[object, ...] = (row.experiment, row.model, int(row.problem))
        src = (*base, d.source_arm, int(row.replicate))
        cls = str(row.pair_class)
        if src not in solo.tier:
            why = f"no {d.source_arm} replicate {row.replicate}"
            indep.append((str(row.model), d.name, None, cls, why))
            naive.append((str(row.model), d.name, None, cls, why))
            continue
        naive.append((str(row.model), d.name, standing_of(solo.tier[src], solo.tier[(*base, d.target_arm,
                                                                                       int(row.replicate))]), cls, ""))
        other = _next_other(solo.reps.get((*base, d.target_arm), []), int(row.replicate), {int(row.replicate)})
        if other is None:
            indep.append((str(row.model), d.name, None, cls, f"no independent {d.target_arm} replicate"))
        else:
            indep.append((str(row.model), d.name, standing_of(solo.tier[src], solo.tier[(*base, d.target_arm,
                                                                                          other)]), cls, ""))

    placebo: list[tuple[str, str, str | None, str, str]] = []
    placebo_naive: list[tuple[str, str, str | None, str, str]] = []
    for (e, m, pr, arm), reps in solo.reps.items():
        for d in DIRECTIONS.values():
            if arm != d.target_arm:
                continue
            for r in reps:
                fake = _next_other(reps, r, {r})
                if fake is None:
                    continue
                base = (e, m, pr)
                cls = classify_pair(solo.c[(*base, arm, fake)], solo.c[(*base, arm, r)],
                                    skill_passed=solo.passed[(*base, arm, fake)],
                                    solo_passed=solo.passed[(*base, arm, r)], tau=tau)
                src = (*base, d.source_arm, r)
                if src not in solo.tier:
                    why = f"no {d.source_arm} replicate {r}"
                    placebo.append((str(m), d.name, None, cls, why))
                    placebo_naive.append((str(m), d.name, None, cls, why))
                    continue
                placebo_naive.append((str(m), d.name, standing_of(solo.tier[src], solo.tier[(*base, arm, r)]),
                                      cls, ""))
                third = _next_other(reps, r, {r, fake})
                if third is None:
                    placebo.append((str(m), d.name, None, cls, f"fewer than 3 {arm} replicates"))
                else:
                    placebo.append((str(m), d.name, standing_of(solo.tier[src], solo.tier[(*base, arm, third)]),
                                    cls, ""))
    models = _models(df)
    notes = list(p.attrs.get("notes", []))
    if not placebo:
        notes.append("placebo tables empty: they need >= 2 (naive) or >= 3 (independent) solo replicates")
    return StandingTables(_crosstab(indep, models), _crosstab(naive, models), _crosstab(placebo, models),
                          _crosstab(placebo_naive, models), notes)


# --- reverse direction ----------------------------------------------------------------------------------------------


def reverse_direction(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR) -> pd.DataFrame:
    """For pairs of each class in one direction, the class of the same problem's pair in the other direction.

    The pair in the other direction is taken at replicate r' != r (next replicate, cyclic): the pair at the same r
    would reuse both solo attempts (each direction's source is the other's baseline), so any noise in them would be
    counted twice and manufacture a correlation. One row per (model, from_direction, from_class) with n > 0.
    """
    p = pairs(df, tau, floor)
    names = list(DIRECTIONS)
    lookup = {(r.experiment, r.model, r.direction, int(r.problem), int(r.replicate)): str(r.pair_class)
              for r in p.itertuples(index=False)}
    reps: dict[tuple[object, ...], list[int]] = {}
    for r in p.itertuples(index=False):
        reps.setdefault((r.experiment, r.model, r.direction, int(r.problem)), []).append(int(r.replicate))
    rows = []
    for model in _models(df):
        for a in names:
            b = names[1 - names.index(a)]
            mine = p[(p["model"] == model) & (p["direction"] == a)]
            if mine.empty:
                rows.append({"model": model, "from_direction": a, "to_direction": b, "from_class": "", "n": 0,
                             **dict.fromkeys(PAIR_CLASSES, 0), "unmatched": 0, "note": _why_no_pairs(df, model, a)})
                continue
            for cls in PAIR_CLASSES:
                sel = mine[mine["pair_class"] == cls]
                if sel.empty:
                    continue
                counts = dict.fromkeys(PAIR_CLASSES, 0)
                unmatched = 0
                for r in sel.itertuples(index=False):
                    other = _next_other(sorted(reps.get((r.experiment, r.model, b, int(r.problem)), [])),
                                        int(r.replicate), {int(r.replicate)})
                    if other is None:
                        unmatched += 1
                    else:
                        counts[lookup[(r.experiment, r.model, b, int(r.problem), other)]] += 1
                note = (f"{unmatched} pair(s) have no {b} pair of the same problem at another replicate"
                        if unmatched else "")
                rows.append({"model": model, "from_direction": a, "to_direction": b, "from_class": cls,
                             "n": len(sel), **counts, "unmatched": unmatched, "note": note})
    return pd.DataFrame(rows)


# --- A/A spread -----------------------------------------------------------------------------------------------------


@dataclass
class AASpread:
    """Replicate-to-replicate noise of the solo arms, measured in the same units as the tau dead band.

    Attributes:
        table: per model x solo arm (and "all_solo" pooled per model): n replicate pairs, median and 90th percentile
            of |log c_r - log c_r'|, the same as relative spread exp(.) - 1, and ``warn``.
        warning: any row warns.
        messages: one sentence per warning row, ready for a report.
    """

    table: pd.DataFrame
    warning: bool
    messages: list[str]


def aa_spread(df: pd.DataFrame, *, tau: float = TAU, floor: float = FLOOR, quantile: float = 0.9) -> AASpread:
    """Measure how far two solo replicates of the same problem differ, to judge whether tau is wide enough.

    Every unordered pair of replicates (r < r') of a problem and solo arm contributes |log c_r - log c_r'|, except
    pairs where both failed (they would be classed both_failed, never neutral, so they say nothing about the band).
    The warning fires when the ``quantile`` (numpy's linear interpolation) of the relative spread exceeds tau: then
    more than 10 % of pure-noise pairs would be called helped or harmed.
    """
    solo = _Solo.build(df, floor)
    diffs: dict[tuple[str, str], list[float]] = {}
    excluded: dict[tuple[str, str], int] = {}
    problems: dict[tuple[str, str], set[tuple[object, ...]]] = {}
    for (e, m, pr, arm), reps in solo.reps.items():
        for i, r in enumerate(reps):
            for r2 in reps[i + 1:]:
                k1, k2 = (e, m, pr, arm, r), (e, m, pr, arm, r2)
                for key in ((str(m), str(arm)), (str(m), "all_solo")):
                    if not solo.passed[k1] and not solo.passed[k2]:
                        excluded[key] = excluded.get(key, 0) + 1
                        continue
                    diffs.setdefault(key, []).append(abs(math.log(solo.c[k1]) - math.log(solo.c[k2])))
                    problems.setdefault(key, set()).add((e, pr))
    rows = []
    messages = []
    threshold = math.log(1 + tau)
    for model in _models(df):
        for arm in (*SOLO_ARMS, "all_solo"):
            key = (model, arm)
            values = np.array(diffs.get(key, []))
            row: dict[str, object] = {"model": model, "arm": arm, "n": len(values),
                                      "n_problems": len(problems.get(key, ())),
                                      "n_both_failed_excluded": excluded.get(key, 0)}
            if len(values):
                q = float(np.quantile(values, quantile))
                row.update(median_abs_log=float(np.median(values)), q_abs_log=q, q_relative=math.exp(q) - 1,
                           tau=tau, warn=q > threshold, note="")
                if q > threshold:
                    messages.append(f"A/A spread ({model}, {arm}): the {quantile:.0%} quantile of solo replicate "
                                    f"differences is {math.exp(q) - 1:.3g} (relative) > tau = {tau:g}; replicate "
                                    "noise alone exceeds the neutral band, so helped/harmed counts are mostly noise")
            else:
                row.update(median_abs_log=math.nan, q_abs_log=math.nan, q_relative=math.nan, tau=tau, warn=False,
                           note="no pair of solo replicates with at least one pass (needs >= 2 replicates)")
            rows.append(row)
    table = pd.DataFrame(rows)
    return AASpread(table, bool(len(table)) and bool(table["warn"].any()), messages)


# --- cost -----------------------------------------------------------------------------------------------------------


def usage(df: pd.DataFrame) -> pd.DataFrame:
    """Tokens, dollars and wall time per model x arm: what each arm cost, to weigh lift against spend.

    Cost sums priced attempts only; the note says how many were unpriced (cost_usd NaN) so a partial sum is never
    read as the total.
    """
    rows = []
    for key, g in _arm_groups(df):
        n = len(g)
        cost = g["cost_usd"].astype(float)
        priced = cost.dropna()
        notes = []
        if n == 0:
            notes.append(f"no attempts for arm {key[1]}")
        elif priced.empty:
            notes.append("unpriced model: no cost")
        elif len(priced) < n:
            notes.append(f"{n - len(priced)} of {n} attempts unpriced: cost covers priced attempts only")
        row: dict[str, object] = dict(zip(["model", "arm", "dsl"], key, strict=True))
        row.update(
            n=n, tokens_in_total=int(g["tokens_in"].sum()), tokens_out_total=int(g["tokens_out"].sum()),
            tokens_in_mean=float(g["tokens_in"].mean()) if n else math.nan,
            tokens_out_mean=float(g["tokens_out"].mean()) if n else math.nan,
            n_priced=len(priced), cost_usd_total=float(priced.sum()) if len(priced) else math.nan,
            cost_usd_mean=float(priced.mean()) if len(priced) else math.nan,
            wall_s_total=float(g["wall_s"].sum()), wall_s_mean=float(g["wall_s"].mean()) if n else math.nan,
            wall_s_median=float(g["wall_s"].median()) if n else math.nan,
            submissions_mean=float(g["submissions"].mean()) if n else math.nan, note=_join(notes))
        rows.append(row)
    return pd.DataFrame(rows)
