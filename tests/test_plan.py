"""The experiment plan: addresses, DAG shape, trials, run order, durations, budgets, the dry-run estimate, spend cap."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from metakernel.analysis.records import ARMS as RECORD_ARMS
from metakernel.analysis.records import DIRECTIONS as RECORD_DIRECTIONS
from metakernel.analysis.records import DSL_OF_ARM

from metakernel.budget import Budget, SpendCap, estimate, litellm_prices, parse_duration, render
from metakernel.errors import UserError
from metakernel.plan import (
    ARMS,
    AttemptKey,
    build_plan,
    model_slug,
    order,
    parse_address,
)

M = "openai/gpt-4o"


# --- addresses ---------------------------------------------------------------------------------------------------


def test_arms_match_the_records_module() -> None:
    """Plan arms are the records' core arms, so every attempt the plan makes is a valid analysis row."""
    assert set(ARMS) <= set(RECORD_ARMS)
    assert set(ARMS) == {a for d in RECORD_DIRECTIONS.values() for a in (d.source_arm, d.skill_arm)}


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("problem", [1, 9, 28, 74])
@pytest.mark.parametrize("replicate", [1, 2, 12])
def test_address_round_trip(arm: str, problem: int, replicate: int) -> None:
    key = AttemptKey(M, problem, arm, replicate)
    assert parse_address(key.address) == (problem, replicate, arm)
    assert AttemptKey.from_address(M, key.address) == key


def test_address_format_and_properties() -> None:
    solo = AttemptKey(M, 28, "solo_cute", 1)
    assert solo.address == "p28_r1_solo_cute"
    assert AttemptKey(M, 5, "solo_tirx", 2).address == "p05_r2_solo_tirx"
    assert solo.dsl == "cute" and solo.source is None and solo.target_solo is None and not solo.is_skill

    skill = AttemptKey(M, 28, "cute2tirx_skill", 2)
    assert skill.address == "p28_r2_cute2tirx_skill"
    assert skill.dsl == "tirx" == DSL_OF_ARM["cute2tirx_skill"]
    assert skill.source == AttemptKey(M, 28, "solo_cute", 2)
    assert skill.target_solo == AttemptKey(M, 28, "solo_tirx", 2)

    back = AttemptKey(M, 3, "tirx2cute_skill", 1)
    assert back.dsl == "cute"
    assert back.source == AttemptKey(M, 3, "solo_tirx", 1)
    assert back.target_solo == AttemptKey(M, 3, "solo_cute", 1)
    assert back.attempt_id == f"{model_slug(M)}/p03_r1_tirx2cute_skill"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("p28_r1_solo_cuda", "unknown arm 'solo_cuda'"),
        ("p5_r1_solo_cute", "write it as p05_r1_solo_cute"),
        ("p028_r1_solo_cute", "write it as p28_r1_solo_cute"),
        ("p28_r01_solo_cute", "write it as p28_r1_solo_cute"),
        ("p28_r0_solo_cute", "replicates start at 1"),
        ("p00_r1_solo_cute", "outside 1..74"),
        ("p75_r1_solo_cute", "outside 1..74"),
        ("28_r1_solo_cute", "expected p<NN>_r<k>_<arm>"),
        ("p28-r1-solo_cute", "expected p<NN>_r<k>_<arm>"),
        ("", "expected p<NN>_r<k>_<arm>"),
        ("p28_r1_placebo_skill", "unknown arm"),
    ],
)
def test_bad_addresses_say_why(text: str, fragment: str) -> None:
    with pytest.raises(UserError, match="bad attempt address") as info:
        parse_address(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"arm": "solo_cuda"}, "unknown arm"),
        ({"problem": 0}, "problem must be"),
        ({"problem": True}, "problem must be"),
        ({"problem": "28"}, "problem must be"),
        ({"replicate": 0}, "replicate must be"),
        ({"model": ""}, "model must be"),
    ],
)
def test_attempt_key_rejects_nonsense(kwargs: dict[str, object], fragment: str) -> None:
    fields: dict[str, object] = {"model": M, "problem": 28, "arm": "solo_cute", "replicate": 1} | kwargs
    with pytest.raises(UserError, match=fragment):
        AttemptKey(**fields)  # type: ignore[arg-type]


def test_model_slug_is_safe_and_never_collides() -> None:
    """Distinct model names get distinct folders even when they differ only in replaced characters or case."""
    names = ["openai/gpt-4o", "openai:gpt-4o", "openai-gpt-4o", "OpenAI/GPT-4o", "openai/GPT-4o", "openai gpt-4o",
             "scripted/pass", "scripted/pass ", "a/b", "a-b", "a_b", "a.b", ".", "..", ".hidden", "x" * 300]
    slugs = [model_slug(n) for n in names]
    assert len(set(slugs)) == len(names)
    for slug in slugs:
        assert all(c in "abcdefghijklmnopqrstuvwxyz0123456789._-" for c in slug), slug
        assert not slug.startswith(".") and len(slug) <= 90
    assert model_slug("openai-gpt-4o") == "openai-gpt-4o", "a name that is already safe is kept as is"
    assert model_slug("openai/gpt-4o").startswith("openai-gpt-4o-")
    assert model_slug("openai/gpt-4o") == model_slug("openai/gpt-4o"), "stable across calls"
    with pytest.raises(UserError):
        model_slug("  ")


# --- the DAG -----------------------------------------------------------------------------------------------------


def test_both_directions_two_problems_two_replicates() -> None:
    plan = build_plan([M], [28, 3], "both", replicates=2)
    assert plan.number_of_nodes() == 16  # 2 problems x 2 replicates x 4 arms
    assert nx.is_directed_acyclic_graph(plan)
    assert plan.number_of_edges() == 8  # one per skill attempt
    for source, skill in plan.edges:
        assert skill.source == source
        assert (source.problem, source.replicate) == (skill.problem, skill.replicate)
    for key in plan:
        if key.is_skill:
            assert plan.in_degree(key) == 1 and key.target_solo in plan
        else:
            assert plan.in_degree(key) == 0
    assert {k.arm for k in plan} == set(ARMS)
    assert {(k.problem, k.replicate) for k in plan} == {(3, 1), (3, 2), (28, 1), (28, 2)}


@pytest.mark.parametrize(("direction", "skill", "source"), [
    ("cute2tirx", "cute2tirx_skill", "solo_cute"),
    ("tirx2cute", "tirx2cute_skill", "solo_tirx"),
])
def test_one_direction_keeps_both_solo_arms(direction: str, skill: str, source: str) -> None:
    """The target DSL's solo arm is the comparison, so one direction still schedules both solo arms."""
    plan = build_plan([M], [28, 3], direction, replicates=2)
    assert plan.number_of_nodes() == 12  # 2 problems x 2 replicates x (2 solo + 1 skill)
    arms = [k.arm for k in plan]
    assert arms.count("solo_cute") == arms.count("solo_tirx") == arms.count(skill) == 4
    assert set(arms) == {"solo_cute", "solo_tirx", skill}
    assert {(s.arm, t.arm) for s, t in plan.edges} == {(source, skill)}
    assert plan.number_of_edges() == 4


def test_models_multiply_and_duplicates_collapse() -> None:
    plan = build_plan([M, "scripted/pass", M], [1, 1, 2], "both", replicates=1)
    assert plan.number_of_nodes() == 2 * 2 * 1 * 4
    assert plan.graph["models"] == (M, "scripted/pass") and plan.graph["problems"] == (1, 2)
    assert len({k.attempt_id for k in plan}) == plan.number_of_nodes()


@pytest.mark.parametrize(("args", "fragment"), [
    (([M], [1], "sideways"), "unknown direction"),
    (([], [1], "both"), "at least one model"),
    (([M], [], "both"), "at least one problem"),
    (([M], [99], "both"), "problem must be"),
    (([M], [1, "2"], "both"), "problems must be integers"),
])
def test_build_plan_rejects(args: tuple[list[str], list[int], str], fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        build_plan(*args)


def test_build_plan_rejects_zero_replicates() -> None:
    with pytest.raises(UserError, match="replicates"):
        build_plan([M], [1], "both", replicates=0)


def test_trials_keep_their_ancestors() -> None:
    plan = build_plan([M, "scripted/pass"], [28, 3], "both", replicates=2,
                      trials=["p28_r2_cute2tirx_skill", "p03_r1_solo_tirx"])
    expected = set()
    for model in (M, "scripted/pass"):
        expected |= {AttemptKey(model, 28, "cute2tirx_skill", 2), AttemptKey(model, 28, "solo_cute", 2),
                     AttemptKey(model, 3, "solo_tirx", 1)}
    assert set(plan) == expected
    assert {(s.address, t.address) for s, t in plan.edges} == {("p28_r2_solo_cute", "p28_r2_cute2tirx_skill")}
    assert plan.graph["trials"] == ("p28_r2_cute2tirx_skill", "p03_r1_solo_tirx")
    assert build_plan([M], [28, 3], "both", trials=[]).number_of_nodes() == 16, "no trials means the whole plan"


def test_unknown_trials_are_listed() -> None:
    """A trial the plan does not hold must fail loudly: a typo would otherwise run nothing."""
    with pytest.raises(UserError) as info:
        build_plan([M], [28, 3], "cute2tirx", replicates=2,
                   trials=["p28_r1_solo_cute", "p28_r1_tirx2cute_skill", "p28_r3_solo_cute", "p04_r1_solo_cute"])
    message = str(info.value)
    assert "p28_r1_tirx2cute_skill" in message and "p28_r3_solo_cute" in message and "p04_r1_solo_cute" in message
    assert "p28_r1_solo_cute," not in message and "problems 3,28" in message
    with pytest.raises(UserError, match="bad attempt address"):
        build_plan([M], [28], "both", trials=["p28_r1_solo"])


# --- order -------------------------------------------------------------------------------------------------------


def test_order_respects_edges_and_puts_solo_first() -> None:
    plan = build_plan([M, "scripted/pass"], [28, 3, 40], "both", replicates=2)
    seq = order(plan)
    assert len(seq) == len(set(seq)) == plan.number_of_nodes()
    position = {k: i for i, k in enumerate(seq)}
    assert all(position[s] < position[t] for s, t in plan.edges)
    for replicate in (1, 2):
        stage = [k for k in seq if k.replicate == replicate]
        kinds = [k.is_skill for k in stage]
        assert kinds == sorted(kinds), f"replicate {replicate}: a skill arm precedes a solo arm"
    assert [k.replicate for k in seq] == sorted(k.replicate for k in seq), "replicate 1 completes before 2 starts"
    assert seq == order(build_plan(["scripted/pass", M], [40, 3, 28], "both", replicates=2)), "deterministic"


def test_order_interleaves_problems() -> None:
    """A run cut short covers every problem's replicate-1 solo arms before any problem's second attempt."""
    plan = build_plan([M], list(range(1, 11)), "cute2tirx", replicates=2)
    seq = order(plan)
    assert {k.problem for k in seq[:20]} == set(range(1, 11))
    assert all(k.arm in ("solo_cute", "solo_tirx") and k.replicate == 1 for k in seq[:20])
    assert [k.address for k in seq[:3]] == ["p01_r1_solo_cute", "p01_r1_solo_tirx", "p02_r1_solo_cute"]
    assert seq[20].address == "p01_r1_cute2tirx_skill"


# --- durations and budgets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("40m", 2400.0), ("90s", 90.0), ("1h30m", 5400.0), ("2400", 2400.0), ("1.5h", 5400.0), ("1h 30m 15s", 5415.0),
    (" 2H ", 7200.0), ("0.5m", 30.0), ("2400.5", 2400.5), ("0", 0.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "40 minutes", "m", "h", "-5", "1m1h", "nan", "inf", "40x", "1..5h", "1h-30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UserError, match="bad duration"):
        parse_duration(text)


def test_budget_defaults_and_dict() -> None:
    budget = Budget().validate()
    assert budget.to_dict() == {"submissions": 10, "wall_s": 2400.0, "tokens": None, "cost_usd": None, "turns": None}
    full = Budget(submissions=1, wall_s=24 * 3600, tokens=1000, cost_usd=0.01, turns=2).validate()
    assert full.to_dict()["tokens"] == 1000


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"submissions": 0}, "submissions"),
    ({"submissions": 101}, "submissions"),
    ({"submissions": 2.0}, "submissions"),
    ({"wall_s": 0}, "wall clock"),
    ({"wall_s": 24 * 3600 + 1}, "wall clock"),
    ({"wall_s": math.nan}, "wall clock"),
    ({"tokens": 999}, "tokens"),
    ({"cost_usd": 0.0}, "cost"),
    ({"cost_usd": -1.0}, "cost"),
    ({"turns": 1}, "turns"),
])
def test_budget_rejects_impossible(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        Budget(**kwargs).validate()  # type: ignore[arg-type]


# --- estimate ----------------------------------------------------------------------------------------------------

PRICE = (2e-6, 8e-6)


def test_estimate_by_hand() -> None:
    plan = build_plan([M, "scripted/pass", "mystery/model"], [28, 3], "cute2tirx", replicates=2)  # 12 per model
    done = {AttemptKey(M, 28, "solo_cute", 1), AttemptKey(M, 3, "solo_tirx", 2), AttemptKey("other", 1, "solo_cute", 1)}
    budget = Budget(submissions=10, tokens=500_000)
    est = estimate(plan, budget, {M: PRICE, "mystery/model": None}, grade_s=60.0, done=done)
    assert est.arms == ("solo_cute", "solo_tirx", "cute2tirx_skill")
    assert est.attempts == 36 and est.attempts_remaining == 34
    gpt, scripted, mystery = est.models
    assert gpt.planned == {"solo_cute": 4, "solo_tirx": 4, "cute2tirx_skill": 4}
    assert gpt.remaining == {"solo_cute": 3, "solo_tirx": 3, "cute2tirx_skill": 4}
    # 10 attempts x (10 submissions + 1 regrade) x 60 s = 6600 s
    assert gpt.gpu_hours == pytest.approx(6600 / 3600)
    assert est.gpu_hours == pytest.approx(34 * 11 * 60 / 3600)
    # 10 attempts x 500k tokens, all at the dearer (output) price
    assert gpt.dollars == pytest.approx(10 * 500_000 * 8e-6) and gpt.dollars_note == "token budget"
    assert scripted.dollars == 0.0 and scripted.dollars_note == "offline"
    assert mystery.dollars is None and mystery.dollars_note == "unpriced"
    assert est.dollars is None

    text = render(est)
    assert "unpriced" in text and "40.00" in text and "3/4" in text and "unbounded" in text
    assert "10 submissions" in text and "500000 tokens" in text


def test_gpu_time_is_capped_by_the_wall_clock_and_zero_for_the_stand_in() -> None:
    """The wall clock counts grading, so a 5-minute attempt cannot grade ten 90-second submissions; the stand-in
    executor grades on the CPU and books no GPU time (the dry run once quoted GPU-hours for it)."""
    plan = build_plan([M], [28], "cute2tirx", replicates=1)  # 3 attempts
    short = estimate(plan, Budget(submissions=10, wall_s=300.0), {M: PRICE}, grade_s=90.0)
    assert short.gpu_hours == pytest.approx(3 * (300 + 90) / 3600)
    long = estimate(plan, Budget(submissions=10, wall_s=7200.0), {M: PRICE}, grade_s=90.0)
    assert long.gpu_hours == pytest.approx(3 * 11 * 90 / 3600)
    stand_in = estimate(plan, Budget(submissions=10), {M: PRICE}, grade_s=90.0, gpu=False)
    assert stand_in.gpu_hours == 0 and "no GPU time" in render(stand_in)


@pytest.mark.parametrize("seconds, shown", [(5, "5 s"), (90, "90 s"), (2400, "40 min"), (150, "2.5 min"),
                                             (9000, "2.5 h")])
def test_wall_budgets_read_as_people_write_them(seconds: float, shown: str) -> None:
    from metakernel.budget import duration

    assert duration(seconds) == shown


def test_estimate_dollar_bounds() -> None:
    plan = build_plan([M], [1], "both", replicates=1)  # 4 attempts
    no_tokens = estimate(plan, Budget(), {M: PRICE})
    assert no_tokens.models[0].dollars is None
    assert no_tokens.models[0].dollars_note == "unbounded: no token budget"
    assert "unbounded: no token budget" in render(no_tokens)

    capped = estimate(plan, Budget(tokens=1_000_000, cost_usd=2.0), {M: PRICE})  # tokens: 4 x $8, cost: 4 x $2
    assert capped.models[0].dollars == pytest.approx(8.0) and capped.models[0].dollars_note == "cost budget"
    assert capped.dollars == pytest.approx(8.0)

    by_cost = estimate(plan, Budget(cost_usd=0.5), {M: PRICE})
    assert by_cost.dollars == pytest.approx(2.0)

    unpriced_cost_cap = estimate(plan, Budget(cost_usd=0.5), {})
    assert unpriced_cost_cap.dollars is None, "an unpriced model's cost cap cannot be enforced"

    finished = estimate(plan, Budget(), {M: PRICE}, done=set(plan))
    assert finished.attempts_remaining == 0 and finished.gpu_hours == 0 and finished.dollars == 0.0
    assert finished.to_dict()["models"][0]["remaining"] == dict.fromkeys(ARMS, 0)


def test_estimate_rejects_bad_inputs() -> None:
    plan = build_plan([M], [1], "both", replicates=1)
    with pytest.raises(UserError, match="grade time"):
        estimate(plan, Budget(), {}, grade_s=0)
    with pytest.raises(UserError, match="submissions"):
        estimate(plan, Budget(submissions=0), {})


def test_litellm_prices() -> None:
    """Prices come from litellm's bundled map; offline and unknown models are unpriced rather than free."""
    assert litellm_prices("scripted/pass") is None
    assert litellm_prices("local/smollm2") is None
    assert litellm_prices("no-such-provider/no-such-model-xyz") is None
    prices = litellm_prices("gpt-4o")
    assert prices is not None and all(p > 0 for p in prices)
    assert litellm_prices("openai/gpt-4o") == prices


# --- spend cap ---------------------------------------------------------------------------------------------------


def test_spend_cap() -> None:
    cap = SpendCap(cap_usd=1.0, spent_usd=0.25)  # a resumed experiment starts from what it already spent
    assert cap.allows_new()
    cap.add(0.5)
    cap.add(None)
    assert cap.allows_new() and cap.unpriced_calls == 1
    assert "$0.75 of $1.00 cap" in cap.describe() and "1 unpriced" in cap.describe()
    cap.add(0.25)
    assert not cap.allows_new()
    assert "spend cap reached" in cap.describe()

    uncapped = SpendCap()
    uncapped.add(1e6)
    assert uncapped.allows_new()
    with pytest.raises(UserError):
        SpendCap(cap_usd=0)
    with pytest.raises(UserError):
        SpendCap(spent_usd=-1)
