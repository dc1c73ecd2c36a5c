"""What an experiment may spend: per-attempt budgets, model prices, the dry-run cost bound and the spend cap.

A separate module from `plan` because money and time limits are not the shape of a plan: `plan` says which attempts
exist and in what order they start; this module says how much each may use (`Budget`, also what `agents.attempt`
enforces), what the attempts a plan has left can cost at most (`estimate`, printed by `--dry-run` via `render`),
and when an experiment must stop starting new attempts because it has spent its money (`SpendCap`).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx

from metakernel.errors import UserError
from metakernel.plan import ARMS, AttemptKey


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


@functools.cache
def _model_info(model: str) -> dict[str, Any] | None:
    """The local cost-map entry litellm has for a model; None when offline (scripted/local) or unknown to it."""
    if model.startswith(OFFLINE_PREFIXES):
        return None
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else importing litellm fetches a cost map
    import litellm

    litellm.suppress_debug_info = True
    try:
        return dict(litellm.get_model_info(model))
    except Exception:  # noqa: BLE001 - litellm raises plain exceptions for models it does not know
        return None


def litellm_prices(model: str) -> Prices | None:
    """The model's per-token prices from litellm's local cost map; None when unpriced (or scripted/local).

    A price of zero for both directions is read as unknown, not free, matching how the client records cost.
    """
    info = _model_info(model)
    if info is None:
        return None
    pin, pout = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if not _is_real(pin) or not _is_real(pout) or (pin == 0 and pout == 0):
        return None
    return float(pin), float(pout)  # type: ignore[arg-type]


def litellm_cache_price(model: str) -> float | None:
    """Dollars per input token read from the provider's prompt cache (litellm's local cost map), None if unknown."""
    price = (_model_info(model) or {}).get("cache_read_input_token_cost")
    return float(price) if _is_real(price) and price else None


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
    cache_prices: Mapping[str, float | None] | None = None,
    gpu: bool = True,
) -> Estimate:
    """Bound the GPU time and dollars the attempts not in `done` can spend.

    GPU: every remaining attempt grades at most ``submissions`` times plus one final regrade, each at most
    `grade_s` seconds (`check` runs on the CPU), and its submissions fit in its wall clock (which counts grading).
    With `gpu=False` (the stand-in executor) nothing runs on a GPU. Dollars, per model: offline models
    (`OFFLINE_PREFIXES`) cost nothing; otherwise only a priced model under a token or cost budget has a bound:
    ``tokens`` all at the dearer of its two prices, capped by ``cost_usd`` when both are set. The last model call
    of an attempt can overshoot a budget, which this bound does not include. The bound prices every input token
    in full; `cache_prices` (dollars per cached input token) only adds a note: an attempt resends its
    conversation every turn, so with the provider's prompt cache most of its input is billed at that rate and
    the real cost sits well below the bound.
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

    grade_h = (min(budget.submissions * grade_s, budget.wall_s) + grade_s) / 3600 if gpu else 0.0
    rows = []
    for model, (planned, remaining) in per_model.items():
        left = sum(remaining.values())
        dollars, note = _dollars(left, budget, prices.get(model), model.startswith(OFFLINE_PREFIXES))
        rows.append(ModelEstimate(model, planned, remaining, left * grade_h, dollars, note))
    notes = [] if gpu else ["GPU-h: the stand-in executor grades on the CPU, no GPU time"]
    if any(r.dollars is None and r.attempts_remaining for r in rows):
        notes.append("dollars: some models have no bound (see their rows)")
    for model, cached in (cache_prices or {}).items():
        full = (prices.get(model) or (None, None))[0]
        if cached and full:
            notes.append(f"prompt cache: {model} bills cached input at ${cached * 1e6:.3g}/M tokens "
                         f"({100 * cached / full:.0f} % of ${full * 1e6:.3g}/M); the bound above assumes no cache hits")
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


def duration(seconds: float) -> str:
    """A wall-clock budget as a person writes it: 5 s, 90 s, 40 min, 2.5 h (not 0.0833333 min)."""
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 2 * 3600:
        return f"{round(seconds / 60, 1):g} min"
    return f"{round(seconds / 3600, 2):g} h"


def render(est: Estimate) -> str:
    """The dry-run table: attempts per model and arm (planned, and left when some are done), GPU-hours, dollars."""
    b = est.budget
    limits = [f"{b.submissions} submissions", duration(b.wall_s)]
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
        f"budget per attempt: {', '.join(limits)}; worst case: every attempt left uses every submission its wall "
        f"clock allows plus a final regrade, {est.grade_s:g} s each",
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
