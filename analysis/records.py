"""The attempt table every analysis reads, its validation, a synthetic generator, and the pair table.

One row per attempt (docs/design.md sections 5 and 7). The store will emit exactly `COLUMNS`; until it exists,
`synthetic_experiment` produces tables with a planted transfer effect so the metrics and the statistics can be
checked against a known truth. Every generated row carries ``synthetic=True`` so that no report can pass generated
numbers off as measurements.

The pair table lives here rather than in `metrics` because the statistics module needs it too and because it fixes
the two numbers every later metric depends on: the clipped speedup and the pair class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

#: Arms run for every (model, problem, replicate); the two control arms are optional.
SOLO_ARMS = ("solo_cute", "solo_tirx")
TRANSFER_ARMS = ("cute2tirx_skill", "tirx2cute_skill")
CONTROL_ARMS = ("placebo_skill", "self_skill")
CORE_ARMS = SOLO_ARMS + TRANSFER_ARMS
ARMS = CORE_ARMS + CONTROL_ARMS
SKILL_ARMS = TRANSFER_ARMS + CONTROL_ARMS
DSLS = ("cute", "tirx")
#: The DSL an arm writes; control arms exist in both DSLs, so theirs comes from the row.
DSL_OF_ARM: dict[str, str | None] = {
    "solo_cute": "cute",
    "solo_tirx": "tirx",
    "cute2tirx_skill": "tirx",
    "tirx2cute_skill": "cute",
    "placebo_skill": None,
    "self_skill": None,
}
FAMILIES = ("attention", "kv_cache", "mlp_norm", "moe", "quantization", "linear_attention")
FAIL_STATUSES = ("wrong", "compile_error", "runtime_error", "timeout", "rule_violation", "infra_error")
STATUSES = ("passed", *FAIL_STATUSES, "skipped")
N_PROBLEMS = 74
#: Pair classes, in the order tables print them.
PAIR_CLASSES = ("helped", "neutral", "harmed", "both_failed", "skipped")
#: Classes that carry information about transfer: a skipped pair never saw a skill, a both-failed pair cannot move.
INFORMATIVE_CLASSES = ("helped", "neutral", "harmed")

TAU = 0.05
FLOOR = 0.05


@dataclass(frozen=True)
class Direction:
    """One transfer direction: the source solo arm writes the skill, the skill arm uses it in the target DSL."""

    name: str
    source_arm: str
    skill_arm: str
    target_arm: str
    source_dsl: str
    target_dsl: str


DIRECTIONS: dict[str, Direction] = {
    "cute2tirx": Direction("cute2tirx", "solo_cute", "cute2tirx_skill", "solo_tirx", "cute", "tirx"),
    "tirx2cute": Direction("tirx2cute", "solo_tirx", "tirx2cute_skill", "solo_cute", "tirx", "cute"),
}


@dataclass(frozen=True)
class Column:
    """A column of the attempt table; `doc` is the contract the store and the generator both honour."""

    name: str
    dtype: str
    doc: str


SCHEMA: tuple[Column, ...] = (
    Column("experiment", "str", "experiment name; pairs never cross experiments"),
    Column("model", "str", "model name as the store records it (snapshot id included where known)"),
    Column("problem", "int", f"problem number, 1..{N_PROBLEMS}"),
    Column("family", "str", "problem family: " + ", ".join(FAMILIES)),
    Column("arm", "str", "one of " + ", ".join(ARMS)),
    Column("dsl", "str", "DSL the attempt wrote: solo_cute/tirx2cute_skill -> cute, solo_tirx/cute2tirx_skill -> tirx"),
    Column("replicate", "int", "replicate number >= 1; skill replicate r used source solo replicate r"),
    Column("status", "str", "grader status (" + ", ".join(STATUSES[:-1]) + ") or skipped (source wrote no skill)"),
    Column("passed", "bool", "the final kernel passed the grader (skipped rows are rescored as their solo baseline)"),
    Column("speedup", "float", "eager median / kernel median; NaN unless passed"),
    Column("roofline_fraction", "float", "share of the roofline bound reached; NaN where unknown or not passed"),
    Column("tokens_in", "int", "prompt tokens over the whole attempt"),
    Column("tokens_out", "int", "completion tokens over the whole attempt"),
    Column("cost_usd", "float", "dollars spent; NaN for an unpriced model"),
    Column("wall_s", "float", "wall-clock seconds of the attempt, model time plus grading, not queueing"),
    Column("submissions", "int", "graded submissions used (budget 10)"),
    Column("source_replicate", "float", "skill arms: the source solo replicate whose SKILL.md was used; NaN for solo"),
    Column("synthetic", "bool", "True for generated rows: reports must then say SYNTHETIC prominently"),
)
COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA)
#: Columns a table may lack (tables written before they existed); `with_speed_metric` says when one is needed.
OPTIONAL_SCHEMA: tuple[Column, ...] = (
    Column("speedup_gpu", "float", "eager GPU kernel time / kernel GPU kernel time (host time left out); NaN unless "
           "passed and profiled on a GPU"),
)
#: Every column a table written now carries.
ALL_COLUMNS: tuple[str, ...] = COLUMNS + tuple(c.name for c in OPTIONAL_SCHEMA)
#: Speed metrics a report can rest on: name -> (column, what it means).
SPEED_METRICS = {
    "e2e": ("speedup", "end-to-end: eager median / kernel median, host launch and sync time included"),
    "gpu": ("speedup_gpu", "GPU time: eager GPU kernel time / kernel GPU kernel time, host time left out"),
}


def with_speed_metric(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The table with `speedup` taken from `metric` (see SPEED_METRICS), so every metric follows the choice.

    The end-to-end speedup is the protocol's; the GPU-time one exists because end-to-end times of host-bound calls
    move 5-30 % between two gradings of the same kernel on the H200 while GPU kernel time repeats within 2 %, so
    a lift smaller than that noise can be checked on the steadier measure.

    Raises:
        ValueError: On an unknown metric, or a passed attempt without the chosen speedup.
    """
    if metric not in SPEED_METRICS:
        raise ValueError(f"unknown speed metric {metric!r}; use one of {', '.join(SPEED_METRICS)}")
    column = SPEED_METRICS[metric][0]
    if column == "speedup":
        return df
    if column not in df.columns:
        raise ValueError(f"the attempt table has no {column!r} column (written before it existed): use the "
                         "end-to-end speedup")
    out = df.copy()
    passed = out["passed"].astype(bool) & (out["status"] != "skipped")
    values = pd.to_numeric(out[column], errors="coerce").astype(float)
    lacking = passed & ~(np.isfinite(values) & (values > 0))
    if bool(lacking.any()):
        first = out.loc[lacking].iloc[0]
        raise ValueError(f"{int(lacking.sum())} passed attempt(s) have no {column} (graded on a CPU, by the stand-in, "
                         f"or before baselines were profiled); first: model={first['model']!r}, "
                         f"problem={first['problem']!r}, arm={first['arm']!r}, replicate={first['replicate']!r}")
    out["speedup"] = values.where(out["passed"].astype(bool))
    return out


def validate_attempts(df: pd.DataFrame) -> None:
    """Reject a table the metrics would silently misread.

    Every check names the column and the offending value, because the table usually comes from a store or an export
    the reader did not write and a vague error would send them searching.

    Raises:
        ValueError: on a missing column, an unknown category, an impossible value or a duplicated attempt.
    """
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"attempt table lacks column(s): {', '.join(missing)}")
    if df.empty:
        return

    def bad(column: str, mask: pd.Series, why: str) -> None:
        if bool(mask.any()):
            first = df.loc[mask].iloc[0]
            raise ValueError(
                f"column {column!r}: {int(mask.sum())} row(s) {why}; first: {column}={first[column]!r} "
                f"(model={first['model']!r}, problem={first['problem']!r}, arm={first['arm']!r}, "
                f"replicate={first['replicate']!r})"
            )

    for column in ("experiment", "model", "family", "arm", "dsl", "status"):
        values = df[column]
        bad(column, ~values.map(lambda v: isinstance(v, str) and v != ""), "are not non-empty strings")
    for column, allowed in (("family", FAMILIES), ("arm", ARMS), ("dsl", DSLS), ("status", STATUSES)):
        bad(column, ~df[column].isin(allowed), "hold a value outside " + "/".join(allowed))
    for column in ("passed", "synthetic"):
        bad(column, ~df[column].map(lambda v: isinstance(v, bool | np.bool_)), "are not booleans")
    for column in ("problem", "replicate", "tokens_in", "tokens_out", "submissions"):
        bad(column, ~df[column].map(_is_int), "are not integers")
    bad("problem", ~df["problem"].between(1, N_PROBLEMS), f"lie outside 1..{N_PROBLEMS}")
    bad("replicate", df["replicate"] < 1, "are below 1")
    for column in ("tokens_in", "tokens_out", "submissions"):
        bad(column, df[column] < 0, "are negative")
    for column in ("speedup", "roofline_fraction", "cost_usd", "wall_s", "source_replicate"):
        bad(column, ~df[column].map(lambda v: isinstance(v, int | float | np.number) and not isinstance(v, bool)),
            "are not numbers")
    wall = df["wall_s"].astype(float)
    bad("wall_s", ~np.isfinite(wall) | (wall < 0), "are not finite non-negative seconds")
    cost = df["cost_usd"].astype(float)
    bad("cost_usd", cost < 0, "are negative")
    roof = df["roofline_fraction"].astype(float)
    bad("roofline_fraction", roof < 0, "are negative")

    expected = df["arm"].map(DSL_OF_ARM)
    bad("dsl", expected.notna() & (expected != df["dsl"]), "disagree with their arm's DSL")
    passed = df["passed"].astype(bool)
    speed = df["speedup"].astype(float)
    bad("passed", (df["status"] != "skipped") & ((df["status"] == "passed") != passed),
        "disagree with status (passed is True exactly when status is 'passed'; skipped rows may carry either)")
    bad("speedup", passed & ~(np.isfinite(speed) & (speed > 0)), "are passed without a finite positive speedup")
    bad("speedup", ~passed & speed.notna(), "carry a speedup although the attempt did not pass")
    bad("status", (df["status"] == "skipped") & ~df["arm"].isin(SKILL_ARMS), "are 'skipped' on a solo arm")
    src = df["source_replicate"].astype(float)
    is_skill = df["arm"].isin(SKILL_ARMS)
    bad("source_replicate", ~is_skill & src.notna(), "are set on a solo arm")
    bad("source_replicate", is_skill & src.isna(), "are missing on a skill arm")
    bad("source_replicate", df["arm"].isin(TRANSFER_ARMS) & src.notna() & (src != df["replicate"]),
        "differ from the replicate (skill replicate r uses source solo replicate r)")

    key = ["experiment", "model", "problem", "arm", "dsl", "replicate"]
    bad("replicate", df.duplicated(key, keep=False), "duplicate an (experiment, model, problem, arm, dsl, replicate)")
    families = df.groupby("problem")["family"].nunique()
    if (families > 1).any():
        problem = int(families[families > 1].index[0])
        raise ValueError(f"column 'family': problem {problem} appears under more than one family")


def _is_int(value: object) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | np.integer):
        return True
    return isinstance(value, float | np.floating) and math.isfinite(value) and float(value).is_integer()


def is_synthetic(df: pd.DataFrame) -> bool:
    """Whether any row was generated: one such row is enough to make every number in a report untrustworthy."""
    return bool(len(df)) and bool(df["synthetic"].astype(bool).any())


def clipped_speedup(passed: object, speedup: object, floor: float = FLOOR) -> float:
    """Put failures and slow passes on one log scale, so a failure-to-pass flip gives a finite, floor-sized ratio.

    c = max(e, floor) with e = speedup when passed, else 0. Works on scalars; `pairs` applies it column-wise.
    """
    if floor <= 0:
        raise ValueError(f"floor must be positive (log ratios of clipped speedups), got {floor}")
    e = float(cast(float, speedup)) if bool(passed) else 0.0
    if bool(passed) and not (math.isfinite(e) and e > 0):
        raise ValueError(f"a passed attempt needs a finite positive speedup, got {speedup!r}")
    return max(e, floor)


def classify_pair(c_skill: float, c_solo: float, *, skill_passed: bool, solo_passed: bool,
                  skipped: bool = False, tau: float = TAU) -> str:
    """Name what the skill did to one pair; tau is a dead band so replicate noise alone is not called help or harm.

    Skipped wins over both_failed (the skill never existed); both_failed wins over the ratio (which is then 1 by
    construction and says nothing).
    """
    if skipped:
        return "skipped"
    if not skill_passed and not solo_passed:
        return "both_failed"
    if c_skill > c_solo * (1 + tau):
        return "helped"
    if c_skill < c_solo / (1 + tau):
        return "harmed"
    return "neutral"


def scored_attempts(df: pd.DataFrame) -> pd.DataFrame:
    """Score each skipped skill attempt as its solo baseline (same model, problem, DSL and replicate).

    docs/design.md section 5 says a skill arm whose source wrote no skill counts as its solo baseline; the store may or
    may not copy the baseline's outcome into the row, so every per-arm metric goes through here instead of trusting
    it. A skipped row with no baseline keeps its own values.
    """
    out = df.copy()
    skipped = out["status"] == "skipped"
    if not skipped.any():
        return out
    solo = out[out["arm"].isin(SOLO_ARMS)].set_index(["experiment", "model", "problem", "dsl", "replicate"])
    for idx in out.index[skipped]:
        row = out.loc[idx]
        key = (row["experiment"], row["model"], row["problem"], row["dsl"], row["replicate"])
        if key in solo.index:
            base = solo.loc[key]
            for column in ("passed", "speedup", "speedup_gpu", "roofline_fraction"):
                if column in out.columns:
                    out.at[idx, column] = base[column]
    return out


PAIR_COLUMNS = (
    "experiment", "model", "direction", "problem", "family", "replicate", "skill_status", "solo_status",
    "skill_passed", "solo_passed", "skill_speedup", "solo_speedup", "c_skill", "c_solo", "log_ratio", "pair_class",
)


def pairs(df: pd.DataFrame, tau: float = TAU, floor: float = FLOOR) -> pd.DataFrame:
    """Build the pair table: skill attempt r against the target solo attempt r, one row per pair.

    A skipped pair is scored as its solo baseline (c_skill = c_solo, log ratio 0) so it dilutes the all-pairs rates
    exactly as the reference design does. Skill attempts without their target solo replicate cannot be paired; they
    are dropped and counted in ``attrs["notes"]`` so a report can say so.
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if floor <= 0:
        raise ValueError(f"floor must be positive, got {floor}")
    rows: list[dict[str, object]] = []
    notes: list[str] = []
    key = ["experiment", "model", "problem", "replicate"]
    for name, d in DIRECTIONS.items():
        skill = df[df["arm"] == d.skill_arm]
        solo = df[df["arm"] == d.target_arm]
        merged = skill.merge(solo, on=key, how="left", suffixes=("_skill", "_solo"), indicator=True)
        lonely = merged[merged["_merge"] == "left_only"]
        if len(lonely):
            notes.append(f"{name}: {len(lonely)} {d.skill_arm} attempt(s) have no {d.target_arm} attempt of the same "
                         "replicate and are not paired")
        for _, m in merged[merged["_merge"] == "both"].iterrows():
            skipped = m["status_skill"] == "skipped"
            solo_passed = bool(m["passed_solo"])
            c_solo = clipped_speedup(solo_passed, m["speedup_solo"], floor)
            skill_passed = solo_passed if skipped else bool(m["passed_skill"])
            skill_speed = m["speedup_solo"] if skipped else m["speedup_skill"]
            c_skill = c_solo if skipped else clipped_speedup(skill_passed, skill_speed, floor)
            rows.append({
                "experiment": m["experiment"], "model": m["model"], "direction": name, "problem": int(m["problem"]),
                "family": m["family_skill"], "replicate": int(m["replicate"]),
                "skill_status": m["status_skill"], "solo_status": m["status_solo"],
                "skill_passed": skill_passed, "solo_passed": solo_passed,
                "skill_speedup": float(skill_speed), "solo_speedup": float(m["speedup_solo"]),
                "c_skill": c_skill, "c_solo": c_solo, "log_ratio": math.log(c_skill / c_solo),
                "pair_class": classify_pair(c_skill, c_solo, skill_passed=skill_passed, solo_passed=solo_passed,
                                            skipped=skipped, tau=tau),
            })
    out = pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
    if out.empty:
        notes.append("no pairs: the table has no skill attempt with a matching target solo attempt")
    else:
        out = out.sort_values(["model", "direction", "problem", "replicate"], kind="stable").reset_index(drop=True)
    out.attrs["notes"] = notes
    out.attrs["tau"] = tau
    out.attrs["floor"] = floor
    return out


def synthetic_experiment(
    n_problems: int = 24,
    models: Sequence[str] = ("model-a",),
    replicates: int = 3,
    effect: float | Mapping[str, float] = 0.0,
    seed: int = 0,
    *,
    pass_effect: float | Mapping[str, float] = 0.0,
    noise_sd: float = 0.35,
    difficulty_sd: float = 0.8,
    pass_rate: float = 0.6,
    skip_prob: float = 0.0,
    control_arms: bool = False,
    experiment: str = "synthetic",
) -> pd.DataFrame:
    """Generate an attempt table whose true transfer effect is known, to test that the analysis recovers it.

    Model: problem p has a difficulty d_p ~ N(0, difficulty_sd) shared by both DSLs plus a per-DSL deviation; an
    attempt's log speedup is d_p + deviation + N(0, noise_sd) replicate noise, plus the planted ``effect`` (a log
    speedup, per direction when a mapping) on the transfer skill arm; it passes with probability
    sigmoid(logit(pass_rate) + d_p), plus ``pass_effect`` on the logit for skill arms. With both effects zero a skill
    attempt is just another independent draw of the target solo arm: the null the standing tables are checked
    against. ``skip_prob`` marks skill attempts as skipped (scored as their baseline); ``control_arms`` adds
    placebo_skill and self_skill in both DSLs with no effect.
    """
    if not 1 <= n_problems <= N_PROBLEMS:
        raise ValueError(f"n_problems must be within 1..{N_PROBLEMS}, got {n_problems}")
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    if not 0 < pass_rate < 1:
        raise ValueError(f"pass_rate must lie strictly between 0 and 1, got {pass_rate}")

    def per_direction(value: float | Mapping[str, float], what: str) -> dict[str, float]:
        if isinstance(value, Mapping):
            unknown = set(value) - set(DIRECTIONS)
            if unknown:
                raise ValueError(f"{what}: unknown direction(s) {sorted(unknown)}; use {sorted(DIRECTIONS)}")
            return {d: float(value.get(d, 0.0)) for d in DIRECTIONS}
        return {d: float(value) for d in DIRECTIONS}

    effects = per_direction(effect, "effect")
    pass_effects = per_direction(pass_effect, "pass_effect")
    rng = np.random.default_rng(seed)
    base_logit = math.log(pass_rate / (1 - pass_rate))
    arms: list[tuple[str, str, float, float]] = [
        ("solo_cute", "cute", 0.0, 0.0),
        ("solo_tirx", "tirx", 0.0, 0.0),
        ("cute2tirx_skill", "tirx", effects["cute2tirx"], pass_effects["cute2tirx"]),
        ("tirx2cute_skill", "cute", effects["tirx2cute"], pass_effects["tirx2cute"]),
    ]
    if control_arms:
        arms += [(arm, dsl, 0.0, 0.0) for arm in CONTROL_ARMS for dsl in DSLS]
    fail_choices = np.array(FAIL_STATUSES[:4])
    rows: list[dict[str, object]] = []
    for model in models:
        model_offset = rng.normal(0.0, 0.3)
        for problem in range(1, n_problems + 1):
            family = FAMILIES[(problem - 1) % len(FAMILIES)]
            difficulty = rng.normal(0.0, difficulty_sd)
            deviation = {dsl: rng.normal(0.0, 0.3) for dsl in DSLS}
            roof_scale = rng.uniform(0.05, 0.3)
            solo_outcome: dict[tuple[str, int], tuple[bool, float]] = {}
            for arm, dsl, eff, peff in arms:  # solo arms come first: a skipped skill row copies their outcome
                mean = model_offset + difficulty + deviation[dsl] + eff
                p_pass = 1.0 / (1.0 + math.exp(-(base_logit + difficulty + peff)))
                for r in range(1, replicates + 1):
                    passed = bool(rng.random() < p_pass)
                    speedup = float(math.exp(mean + rng.normal(0.0, noise_sd))) if passed else math.nan
                    status = "passed" if passed else str(rng.choice(fail_choices))
                    skill = arm in SKILL_ARMS
                    if arm in SOLO_ARMS:
                        solo_outcome[(dsl, r)] = (passed, speedup)
                    if skill and rng.random() < skip_prob:
                        status = "skipped"
                        passed, speedup = solo_outcome[(dsl, r)]
                    tokens_in = int(rng.integers(20_000, 200_000))
                    tokens_out = int(rng.integers(2_000, 30_000))
                    rows.append({
                        "experiment": experiment, "model": model, "problem": problem, "family": family,
                        "arm": arm, "dsl": dsl, "replicate": r, "status": status, "passed": passed,
                        "speedup": speedup,
                        "roofline_fraction": min(1.0, speedup * roof_scale) if passed else math.nan,
                        "tokens_in": tokens_in, "tokens_out": tokens_out,
                        "cost_usd": round(tokens_in * 3e-6 + tokens_out * 15e-6, 6),
                        "wall_s": float(rng.uniform(120.0, 2400.0)),
                        "submissions": int(rng.integers(1, 11)),
                        "source_replicate": float(r) if skill else math.nan,
                        "synthetic": True,
                    })
    return pd.DataFrame(rows, columns=list(COLUMNS))
