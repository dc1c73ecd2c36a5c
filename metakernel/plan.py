"""The experiment plan: models × problems × replicates × arms as a DAG, and the order its attempts start in.

An attempt is named by an `AttemptKey`; within one model its address is ``p<NN>_r<k>_<arm>`` (docs/design.md section 5),
the same string the experiment directory and `--trials` use. The plan is a networkx DAG whose only edges run from a
source solo attempt to the skill attempt that reads its SKILL.md, so the scheduler can start anything whose
predecessors are finished. What the attempts may spend (budgets, the dry-run cost bound, the spend cap) lives in
`metakernel.budget`.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
