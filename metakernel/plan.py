"""The experiment plan: models × problems × replicates × arms as a DAG, its run order, budgets and cost bounds.

An attempt is named by an `AttemptKey`; within one model its address is ``p<NN>_r<k>_<arm>`` (DESIGN.md section 5),
the same string the experiment directory and `--trials` use. The plan is a networkx DAG whose only edges run from a
source solo attempt to the skill attempt that reads its SKILL.md, so the scheduler can start anything whose
predecessors are finished. `estimate` bounds what a plan can cost before a single call is made: `--dry-run` prints
it and a spend cap (`SpendCap`) stops new attempts once an experiment has spent its money.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx

from metakernel.analysis.records import CORE_ARMS, DIRECTIONS, DSL_OF_ARM, N_PROBLEMS, Direction
from metakernel.errors import UserError

#: Arms a plan schedules. The control arms of `analysis.records.ARMS` take their DSL from the row, which an address
#: cannot express yet, so they are not plannable.
ARMS: tuple[str, ...] = CORE_ARMS
SOLO_ARMS: tuple[str, ...] = tuple(d.source_arm for d in DIRECTIONS.values())
SKILL_ARMS: tuple[str, ...] = tuple(d.skill_arm for d in DIRECTIONS.values())
PLAN_DIRECTIONS: tuple[str, ...] = (*DIRECTIONS, "both")
#: Skill arm -> its direction, so a key can find its source and its comparison without a search.
_DIRECTION_OF_SKILL: dict[str, Direction] = {d.skill_arm: d for d in DIRECTIONS.values()}

_SLUG_OK = re.compile(r"[a-z0-9._-]")
_SLUG_MAX = 80
_ADDRESS = re.compile(r"p(\d+)_r(\d+)_([a-z0-9_]+)")


def model_slug(model: str) -> str:
    """The directory-safe name of a model, unique per model name.

    Lower-cased, with every character outside ``[a-z0-9._-]`` replaced by ``-``. Whenever the slug differs from the
    name (a replacement, a case change, a leading dot, truncation) a short hash of the full name is appended, because
    ``openai/gpt-4o``, ``openai:gpt-4o`` and ``OpenAI/GPT-4o`` would otherwise share one attempts folder and one
    replay cache key.
    """
    if not model or not model.strip():
        raise UserError("a model name must not be empty")
    slug = "".join(c if _SLUG_OK.fullmatch(c) else "-" for c in model.lower())
    if slug.startswith("."):  # ".", ".." and hidden folders are not names a person should have to debug
        slug = "-" + slug[1:]
    slug = slug[:_SLUG_MAX]
    if slug != model:
        slug = f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
    return slug


@dataclass(frozen=True, order=True)
class AttemptKey:
    """One attempt: a model writes one problem in one arm, replicate `replicate` (1-based)."""

    model: str
    problem: int
    arm: str
    replicate: int

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise UserError(f"attempt model must be a non-empty string, got {self.model!r}")
        if self.arm not in ARMS:
            raise UserError(f"unknown arm {self.arm!r}; arms: {', '.join(ARMS)}")
        if not _is_int(self.problem) or not 1 <= self.problem <= N_PROBLEMS:
            raise UserError(f"problem must be an integer in 1..{N_PROBLEMS}, got {self.problem!r}")
        if not _is_int(self.replicate) or self.replicate < 1:
            raise UserError(f"replicate must be an integer >= 1, got {self.replicate!r}")

    @classmethod
    def from_address(cls, model: str, text: str) -> AttemptKey:
        """The key of `model`'s attempt at `text` (an address such as ``p28_r1_solo_cute``)."""
        problem, replicate, arm = parse_address(text)
        return cls(model, problem, arm, replicate)

    @property
    def address(self) -> str:
        """The attempt's name within its model, e.g. ``p28_r1_solo_cute``: folder name and `--trials` entry."""
        return f"p{self.problem:02d}_r{self.replicate}_{self.arm}"

    @property
    def dsl(self) -> str:
        """The DSL this attempt writes (a skill arm writes its target DSL)."""
        dsl = DSL_OF_ARM[self.arm]
        assert dsl is not None, "plannable arms all have a fixed DSL"
        return dsl

    @property
    def is_skill(self) -> bool:
        """Whether the attempt reads another attempt's SKILL.md."""
        return self.arm in _DIRECTION_OF_SKILL

    @property
    def source(self) -> AttemptKey | None:
        """For a skill arm, the solo attempt (same replicate) whose SKILL.md it is given; None for a solo arm."""
        direction = _DIRECTION_OF_SKILL.get(self.arm)
        if direction is None:
            return None
        return AttemptKey(self.model, self.problem, direction.source_arm, self.replicate)

    @property
    def target_solo(self) -> AttemptKey | None:
        """For a skill arm, the solo attempt in the same DSL it is compared with; None for a solo arm."""
        direction = _DIRECTION_OF_SKILL.get(self.arm)
        if direction is None:
            return None
        return AttemptKey(self.model, self.problem, direction.target_arm, self.replicate)

    @property
    def attempt_id(self) -> str:
        """``<model_slug>/<address>``: unique across an experiment, the relative folder and the replay-cache key."""
        return f"{model_slug(self.model)}/{self.address}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_address(text: str) -> tuple[int, int, str]:
    """Split an address such as ``p28_r1_solo_cute`` into (problem, replicate, arm).

    Only the canonical spelling is accepted (two-digit problem, no leading zeros in the replicate) because the
    address is also a folder name: ``p5_r1_solo_cute`` and ``p05_r1_solo_cute`` must not name two attempts.
    """
    match = _ADDRESS.fullmatch(text.strip())
    if not match:
        raise UserError(f"bad attempt address {text!r}: expected p<NN>_r<k>_<arm>, e.g. p28_r1_solo_cute")
    problem, replicate, arm = int(match[1]), int(match[2]), match[3]
    if arm not in ARMS:
        raise UserError(f"bad attempt address {text!r}: unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    if not 1 <= problem <= N_PROBLEMS:
        raise UserError(f"bad attempt address {text!r}: problem {problem} is outside 1..{N_PROBLEMS}")
    if replicate < 1:
        raise UserError(f"bad attempt address {text!r}: replicates start at 1")
    canonical = f"p{problem:02d}_r{replicate}_{arm}"
    if canonical != text.strip():
        raise UserError(f"bad attempt address {text!r}: write it as {canonical}")
    return problem, replicate, arm


def build_plan(
    models: Sequence[str],
    problems: Iterable[int],
    direction: str,
    replicates: int = 2,
    trials: Sequence[str] | None = None,
) -> nx.DiGraph:
    """The DAG of attempts: nodes are `AttemptKey`s, an edge runs from a source solo attempt to its skill attempt.

    Every direction schedules both solo arms, because the target DSL's solo arm is what the skill arm is compared
    with. `trials` (addresses, applied to every model) keeps only those attempts and the attempts they need; an
    address the plan does not contain is an error rather than a silent no-op, since a typo would otherwise run
    nothing.
    """
    if direction not in PLAN_DIRECTIONS:
        raise UserError(f"unknown direction {direction!r}; choose one of {', '.join(PLAN_DIRECTIONS)}")
    if not _is_int(replicates) or not 1 <= replicates <= 100:
        raise UserError(f"replicates must be an integer in 1..100, got {replicates!r}")
    models = list(dict.fromkeys(models))
    if not models:
        raise UserError("a plan needs at least one model")
    slugs: dict[str, str] = {}
    for model in models:
        other = slugs.setdefault(model_slug(model), model)
        if other != model:
            raise UserError(f"models {other!r} and {model!r} share the folder name {model_slug(model)!r}")
    problems = list(problems)
    bad = [p for p in problems if not _is_int(p)]
    if bad:
        raise UserError(f"problems must be integers, got {bad[0]!r}")
    numbers = sorted(set(problems))
    if not numbers:
        raise UserError("a plan needs at least one problem")
    chosen = list(DIRECTIONS.values()) if direction == "both" else [DIRECTIONS[direction]]
    arms = [*SOLO_ARMS, *(d.skill_arm for d in chosen)]

    plan = nx.DiGraph(direction=direction, replicates=replicates, models=tuple(models), problems=tuple(numbers),
                      arms=tuple(a for a in ARMS if a in arms))
    for model in models:
        for problem in numbers:
            for replicate in range(1, replicates + 1):
                for arm in arms:
                    key = AttemptKey(model, problem, arm, replicate)
                    plan.add_node(key)
                    if key.source is not None:
                        plan.add_edge(key.source, key)
    if not trials:  # None or empty (a CLI option given no value): the whole plan
        return plan

    wanted = [parse_address(t) for t in trials]
    known = {(k.problem, k.replicate, k.arm) for k in plan}
    unknown = [t for t, w in zip(trials, wanted, strict=True) if w not in known]
    if unknown:
        raise UserError(f"trial(s) not in the plan (direction {direction}, {replicates} replicate(s), problems "
                        f"{_ranges(numbers)}): {', '.join(unknown)}")
    keep: set[AttemptKey] = set()
    wanted_set = set(wanted)
    for key in plan:
        if (key.problem, key.replicate, key.arm) in wanted_set:
            keep.add(key)
            keep.update(nx.ancestors(plan, key))
    kept = plan.subgraph(keep).copy()
    kept.graph["trials"] = tuple(dict.fromkeys(t.strip() for t in trials))
    return kept


def _ranges(numbers: Sequence[int]) -> str:
    """``1-3,7`` for [1, 2, 3, 7]: an error message names the problems without listing 74 numbers."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def _order_key(key: AttemptKey) -> tuple[int, int, int, str, int]:
    return (key.replicate, int(key.is_skill), key.problem, key.model, ARMS.index(key.arm))


def order(plan: nx.DiGraph) -> list[AttemptKey]:
    """The order in which to start attempts, deterministic for one plan.

    Replicate by replicate; within a replicate every solo arm precedes every skill arm; each stage walks all
    problems (and, per problem, all models). A run cut short therefore holds complete replicate-1 pairs over many
    problems rather than every arm of the first few problems, and a skill arm never waits behind a source that was
    queued after it.
    """
    return list(nx.lexicographical_topological_sort(plan, key=_order_key))


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def parse_duration(text: str) -> float:
    """Seconds in ``40m``, ``90s``, ``1h30m``, ``1.5h`` or a bare number of seconds (``2400``)."""
    cleaned = str(text).strip().lower().replace(" ", "")
    try:
        seconds = float(cleaned)
    except ValueError:
        match = _DURATION.fullmatch(cleaned)
        if not cleaned or not match or not any(match.groups()):
            raise UserError(f"bad duration {text!r}: use e.g. 40m, 90s, 1h30m, 1.5h or seconds") from None
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not math.isfinite(seconds) or seconds < 0:
        raise UserError(f"bad duration {text!r}: must be a finite, non-negative time")
    return seconds


@dataclass(frozen=True)
class Budget:
    """What one attempt may spend; paired arms get the same budget so a difference is not a budget difference.

    `tokens` counts prompt plus completion tokens over the whole attempt; `cost_usd` is dollars per attempt;
    `turns` counts model calls. None means no limit.
    """

    submissions: int = 10
    wall_s: float = 2400.0
    tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None

    def validate(self) -> Budget:
        """Reject a budget no attempt could live within (or one that is surely a typo); returns self to chain."""
        if not _is_int(self.submissions) or not 1 <= self.submissions <= 100:
            raise UserError(f"budget: submissions must be an integer in 1..100, got {self.submissions!r}")
        if not _is_real(self.wall_s) or not 0 < self.wall_s <= 24 * 3600:
            raise UserError(f"budget: wall clock must be more than 0 and at most 24 h, got {self.wall_s!r} s")
        if self.tokens is not None and (not _is_int(self.tokens) or self.tokens < 1000):
            raise UserError(f"budget: tokens must be an integer >= 1000, got {self.tokens!r}")
        if self.cost_usd is not None and (not _is_real(self.cost_usd) or self.cost_usd <= 0):
            raise UserError(f"budget: cost must be a positive number of dollars, got {self.cost_usd!r}")
        if self.turns is not None and (not _is_int(self.turns) or self.turns < 2):
            raise UserError(f"budget: turns must be an integer >= 2 (one to write, one to finish), got {self.turns!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The budget as the experiment record stores it (None for no limit)."""
        return asdict(self)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: Models served by us (scripted replies, a local llama.cpp server): no price, but also no bill.
OFFLINE_PREFIXES = ("scripted/", "local/")

Prices = tuple[float, float]
"""(dollars per input token, dollars per output token)."""


def litellm_prices(model: str) -> Prices | None:
    """The model's per-token prices from litellm's local cost map; None when unpriced (or scripted/local).

    A price of zero for both directions is read as unknown, not free, matching how the client records cost.
    """
    if model.startswith(OFFLINE_PREFIXES):
        return None
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else importing litellm fetches a cost map
    import litellm

    litellm.suppress_debug_info = True
    try:
        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - litellm raises plain exceptions for models it does not know
        return None
    pin, pout = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if not _is_real(pin) or not _is_real(pout) or (pin == 0 and pout == 0):
        return None
    return float(pin), float(pout)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ModelEstimate:
    """One model's share of a plan: attempts per arm, what is left, and its worst-case GPU time and dollars."""

    model: str
    planned: dict[str, int]
    remaining: dict[str, int]
    gpu_hours: float
    dollars: float | None
    dollars_note: str

    @property
    def attempts(self) -> int:
        """Attempts this model has in the plan."""
        return sum(self.planned.values())

    @property
    def attempts_remaining(self) -> int:
        """Attempts not yet done."""
        return sum(self.remaining.values())


@dataclass(frozen=True)
class Estimate:
    """What a plan can still cost at most; `dollars` is None when any model's spending is unbounded."""

    arms: tuple[str, ...]
    models: tuple[ModelEstimate, ...]
    budget: Budget
    grade_s: float
    attempts: int
    attempts_remaining: int
    gpu_hours: float
    dollars: float | None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """For ``--dry-run --json``."""
        return asdict(self)


def estimate(
    plan: nx.DiGraph,
    budget: Budget,
    prices: Mapping[str, Prices | None],
    grade_s: float = 90.0,
    done: Collection[AttemptKey] = frozenset(),
) -> Estimate:
    """Bound the GPU time and dollars the attempts not in `done` can spend.

    GPU: every remaining attempt grades at most ``submissions`` times plus one final regrade, each at most `grade_s`
    seconds (`check` runs on the CPU). Dollars, per model: offline models (`OFFLINE_PREFIXES`) cost nothing; otherwise
    only a priced model under a token or cost budget has a bound: ``tokens`` all at the dearer of its two prices,
    capped by ``cost_usd`` when both are set. The last model call of an attempt can overshoot a budget, which this
    bound does not include.
    """
    budget.validate()
    if not _is_real(grade_s) or grade_s <= 0:
        raise UserError(f"grade time must be a positive number of seconds, got {grade_s!r}")
    arms = tuple(plan.graph.get("arms") or (a for a in ARMS if any(k.arm == a for k in plan)))
    per_model: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for model in plan.graph.get("models") or sorted({k.model for k in plan}):
        per_model[model] = (dict.fromkeys(arms, 0), dict.fromkeys(arms, 0))
    done_set = set(done)
    for key in plan:
        planned, remaining = per_model.setdefault(key.model, (dict.fromkeys(arms, 0), dict.fromkeys(arms, 0)))
        planned[key.arm] += 1
        if key not in done_set:
            remaining[key.arm] += 1

    grade_h = (budget.submissions + 1) * grade_s / 3600
    rows = []
    for model, (planned, remaining) in per_model.items():
        left = sum(remaining.values())
        dollars, note = _dollars(left, budget, prices.get(model), model.startswith(OFFLINE_PREFIXES))
        rows.append(ModelEstimate(model, planned, remaining, left * grade_h, dollars, note))
    notes = []
    if any(r.dollars is None and r.attempts_remaining for r in rows):
        notes.append("dollars: some models have no bound (see their rows)")
    bounded = [r.dollars for r in rows if r.attempts_remaining]
    return Estimate(
        arms=arms,
        models=tuple(rows),
        budget=budget,
        grade_s=float(grade_s),
        attempts=sum(r.attempts for r in rows),
        attempts_remaining=sum(r.attempts_remaining for r in rows),
        gpu_hours=sum(r.gpu_hours for r in rows),
        dollars=None if any(d is None for d in bounded) else sum(d for d in bounded if d is not None),
        notes=tuple(notes),
    )


def _dollars(attempts: int, budget: Budget, prices: Prices | None, offline: bool) -> tuple[float | None, str]:
    """A model's worst-case dollars over `attempts` attempts, or None with the reason it has no bound."""
    if attempts == 0:
        return 0.0, "nothing left"
    if offline:
        return 0.0, "offline"
    if prices is None:
        return None, "unpriced"
    bounds: list[tuple[float, str]] = []
    if budget.tokens is not None:
        bounds.append((attempts * budget.tokens * max(prices), "token budget"))
    if budget.cost_usd is not None:
        bounds.append((attempts * budget.cost_usd, "cost budget"))
    if not bounds:
        return None, "unbounded: no token budget"
    return min(bounds)


def render(est: Estimate) -> str:
    """The dry-run table: attempts per model and arm (planned, and left when some are done), GPU-hours, dollars."""
    b = est.budget
    limits = [f"{b.submissions} submissions", f"{b.wall_s / 60:g} min"]
    limits += [f"{b.tokens} tokens"] if b.tokens is not None else []
    limits += [f"${b.cost_usd:g}"] if b.cost_usd is not None else []
    limits += [f"{b.turns} turns"] if b.turns is not None else []
    header = ["model", *est.arms, "total", "left", "GPU-h", "$"]
    body = []
    for m in est.models:
        cells = [str(m.planned[a]) if m.remaining[a] == m.planned[a] else f"{m.remaining[a]}/{m.planned[a]}"
                 for a in est.arms]
        cost = f"{m.dollars:.2f}" if m.dollars is not None else m.dollars_note
        body.append([m.model, *cells, str(m.attempts), str(m.attempts_remaining), f"{m.gpu_hours:.1f}", cost])
    total_cost = f"{est.dollars:.2f}" if est.dollars is not None else "unbounded"
    body.append(["total", *[""] * len(est.arms), str(est.attempts), str(est.attempts_remaining),
                 f"{est.gpu_hours:.1f}", total_cost])
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        f"budget per attempt: {', '.join(limits)}; worst case: every attempt left uses every submission plus a final "
        f"regrade, {est.grade_s:g} s each",
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))),
    ]
    for row in body:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    lines += list(est.notes)
    return "\n".join(lines)


@dataclass
class SpendCap:
    """Dollars one experiment has spent against an optional cap; at the cap no new attempt starts.

    Attempts already running finish (stopping one midway would waste what it spent and break its pair). A resumed
    experiment passes what the store says it spent as `spent_usd`. Unpriced calls cannot be counted and are tallied
    so the report can say the cap did not see them.
    """

    cap_usd: float | None = None
    spent_usd: float = 0.0
    unpriced_calls: int = 0

    def __post_init__(self) -> None:
        if self.cap_usd is not None and (not _is_real(self.cap_usd) or self.cap_usd <= 0):
            raise UserError(f"spend cap must be a positive number of dollars, got {self.cap_usd!r}")
        if not _is_real(self.spent_usd) or self.spent_usd < 0:
            raise UserError(f"money already spent must be a non-negative number, got {self.spent_usd!r}")

    def add(self, cost_usd: float | None) -> None:
        """Count one model call's cost (None for an unpriced call)."""
        if cost_usd is None:
            self.unpriced_calls += 1
        elif _is_real(cost_usd) and cost_usd > 0:
            self.spent_usd += float(cost_usd)

    def allows_new(self) -> bool:
        """Whether a new attempt may start."""
        return self.cap_usd is None or self.spent_usd < self.cap_usd

    def describe(self) -> str:
        """One line for the progress display and the stop message."""
        spent = f"${self.spent_usd:.2f}" + (f" of ${self.cap_usd:.2f} cap" if self.cap_usd is not None else "")
        if self.unpriced_calls:
            spent += f" (+{self.unpriced_calls} unpriced call(s) not counted)"
        if not self.allows_new():
            spent += ": spend cap reached, no new attempts"
        return spent
