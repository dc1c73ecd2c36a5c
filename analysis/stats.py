"""Uncertainty layer: confidence intervals, p-values and multiplicity correction over per-problem values.

The problem is the unit of analysis (docs/design.md section 7): callers average log ratios over the replicates of a
problem first and hand this module one value per problem. Everything here is a pure function of those values and a
fixed seed, so a report recomputed from an export gives the same numbers as one computed from the database.

Rules that live here so no report can bypass them:

- no confidence interval and no p-value below ``MIN_N_FOR_CI`` (10) problems: the result says "n too small";
- the percentile bootstrap below ``MIN_N_FOR_BCA`` (20) problems and BCa from there on (BCa's acceleration and
  bias corrections are themselves estimated from the sample and are unstable in small samples);
- the primary endpoint is one number per model x direction cell, Holm-corrected across cells; everything else is
  labelled ``secondary`` and left uncorrected.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
from scipy import stats as sps

MIN_N_FOR_CI = 10
MIN_N_FOR_BCA = 20
DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
# Sign patterns are enumerated exactly up to this many problems (2**16 = 65,536 patterns); above it the sign-flip
# test samples patterns with the fixed seed.
EXACT_SIGNFLIP_MAX_N = 16
N_TOO_SMALL = "n too small"

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class BootstrapCI:
    """A mean of per-problem values with its bootstrap interval, carrying enough to reproduce it.

    Attributes:
        estimate: The mean of the values; None when there are none.
        ci: (low, high) on the scale of the values; None below ``MIN_N_FOR_CI`` problems (see ``note``).
        n: Number of problems.
        method: "BCa", "percentile", "degenerate" (all values equal: zero-width interval) or None (no interval).
        confidence: Two-sided confidence level.
        n_resamples: Bootstrap resamples drawn.
        seed: Seed of the resampling generator.
        note: Why an interval is missing or unusual; None when there is nothing to say.
    """

    estimate: float | None
    ci: tuple[float, float] | None
    n: int
    method: str | None
    confidence: float
    n_resamples: int
    seed: int
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Give reports a JSON-ready view without each one re-deriving the field list."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PrimaryEndpoint:
    """Paired lift dGM of one model x direction cell with its interval and p-value.

    Attributes:
        dgm: exp(mean per-problem log ratio) - 1; None when there are no problems.
        ci: 95 % (or ``confidence``) interval on the dGM scale; None below ``MIN_N_FOR_CI`` problems.
        p_value: Unadjusted two-sided p-value of ``test``; None below ``MIN_N_FOR_CI`` problems.
        p_holm: Holm-adjusted p-value across the cells passed together to ``primary_endpoints``; None until then.
        n: Number of problems.
        mean_log_ratio: Mean of the per-problem log ratios (the scale the interval is computed on).
        log_ci: The interval on the log-ratio scale.
        ci_method: Bootstrap method used ("BCa", "percentile", "degenerate") or None.
        test: The hypothesis test behind ``p_value``, in words.
        confidence: Two-sided confidence level.
        n_resamples: Bootstrap (and Monte Carlo sign-flip) resamples.
        seed: Seed of every random draw.
        label: Always "primary", so a rendered table cannot mix it up with the secondary tests.
        note: Why something is missing or unusual.
    """

    dgm: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    n: int
    mean_log_ratio: float | None
    log_ci: tuple[float, float] | None
    ci_method: str | None
    test: str
    confidence: float
    n_resamples: int
    seed: int
    p_holm: float | None = None
    label: str = "primary"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Give reports a JSON-ready view without each one re-deriving the field list."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SecondaryTest:
    """Result of one secondary hypothesis test; never Holm-corrected and always labelled "secondary".

    Attributes:
        name: Short test name ("wilcoxon_signed_rank", "sign_test", "mcnemar_exact").
        statistic: The test statistic (documented per function); None when the test could not run.
        p_value: Two-sided p-value; None when the test could not run (see ``note``).
        n: Units the test was given (problems for Wilcoxon, discordant pairs for the count tests).
        method: How the p-value was computed, in words, including every choice that changes it.
        parameters: The same choices and counts as machine-readable values (e.g. ``zero_method``).
        label: Always "secondary".
        note: Why the p-value is missing or what the reader must keep in mind.
    """

    name: str
    statistic: float | None
    p_value: float | None
    n: int
    method: str
    parameters: dict[str, Any] = field(default_factory=dict)
    label: str = "secondary"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Give reports a JSON-ready view without each one re-deriving the field list."""
        return dataclasses.asdict(self)


def _as_values(values: Sequence[float] | np.ndarray, what: str = "values") -> np.ndarray:
    """Reject NaN and infinities up front: a silently dropped problem would change n without a trace."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional (one value per problem), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{what} must be finite; positions {np.flatnonzero(bad).tolist()} are {arr[bad].tolist()}")
    return arr


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> BootstrapCI:
    """Bootstrap interval for the mean over problems, with the small-sample rules applied in one place.

    Problems are resampled with replacement (``scipy.stats.bootstrap``, generator seeded with ``seed``): percentile
    intervals for ``MIN_N_FOR_CI <= n < MIN_N_FOR_BCA`` and BCa for ``n >= MIN_N_FOR_BCA``. Below ``MIN_N_FOR_CI``
    there is no interval at all, because a percentile bootstrap of a handful of problems under-covers badly and a
    printed interval would look more trustworthy than it is. When every value is equal the bootstrap distribution
    is a single point (BCa is undefined there), so the interval is that point and says so.

    Args:
        values: One value per problem, e.g. the problem's mean log ratio.
        confidence: Two-sided confidence level.
        n_resamples: Bootstrap resamples; tests and simulations pass fewer for speed.
        seed: Seed of the resampling generator; the same seed gives the same interval.

    Returns:
        The mean, the interval (or None with a note) and the method used.

    Raises:
        ValueError: On non-finite values, a non-1-D input, or a confidence level outside (0, 1).

    Example:
        With 12 problems whose mean log ratios average 0.1, the result has ``estimate == 0.1``, a percentile
        interval around it and ``method == "percentile"``; with 9 problems, ``ci is None`` and ``note`` starts with
        "n too small".
    """
    _check_confidence(confidence)
    arr = _as_values(values)
    n = int(arr.size)
    estimate = float(arr.mean()) if n else None

    def result(ci: tuple[float, float] | None, method: str | None, note: str | None) -> BootstrapCI:
        return BootstrapCI(estimate, ci, n, method, confidence, n_resamples, seed, note)

    if n < MIN_N_FOR_CI:
        return result(None, None, f"{N_TOO_SMALL}: {n} problems, an interval needs at least {MIN_N_FOR_CI}")
    if np.ptp(arr) == 0.0:
        point = float(arr[0])
        return result(
            (point, point), "degenerate", "all per-problem values are equal: the bootstrap distribution is a point"
        )
    method = "BCa" if n >= MIN_N_FOR_BCA else "percentile"
    note = None
    low, high = _scipy_bootstrap(arr, method, confidence, n_resamples, seed)
    if not (math.isfinite(low) and math.isfinite(high)):
        # BCa needs a non-degenerate jackknife and bootstrap distribution; near-constant data can still break it.
        note = "BCa interval undefined for these data; percentile interval reported instead"
        method = "percentile"
        low, high = _scipy_bootstrap(arr, method, confidence, n_resamples, seed)
    return result((low, high), method, note)


def _scipy_bootstrap(
    arr: np.ndarray, method: str, confidence: float, n_resamples: int, seed: int
) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)
        res = sps.bootstrap(
            (arr,),
            np.mean,
            n_resamples=n_resamples,
            vectorized=True,
            confidence_level=confidence,
            method=method,
            rng=np.random.default_rng(seed),
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def signflip_test(
    values: Sequence[float] | np.ndarray, *, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> tuple[float | None, str]:
    """Two-sided sign-flip randomization p-value for "the per-problem values are centred on zero".

    Why this test for the primary endpoint: under the sharp null (the skill changes nothing) the skill attempt and
    the target solo attempt of a pair are exchangeable, so every problem's mean log ratio is as likely to carry
    either sign. Flipping signs therefore gives the exact null distribution of the sum without assuming normality,
    which per-problem log ratios (point masses from pass/fail flips at the speedup floor) do not have. All 2**n
    patterns are enumerated up to ``EXACT_SIGNFLIP_MAX_N`` problems; above that ``n_resamples`` random patterns are
    drawn with ``seed`` and p = (1 + hits) / (1 + n_resamples), which never reports an impossible p of 0.

    Returns:
        The p-value (None when there are no values) and a description of how it was computed.
    """
    arr = _as_values(values)
    n = int(arr.size)
    if n == 0:
        return None, "sign-flip randomization test: no values"
    observed = abs(float(arr.sum()))
    # Sums that equal the observed one up to rounding must count as "at least as extreme".
    tol = 1e-9 * max(1.0, float(np.abs(arr).sum()))
    if n <= EXACT_SIGNFLIP_MAX_N:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        sums = np.abs(signs @ arr)
        p = float(np.mean(sums >= observed - tol))
        return p, f"two-sided sign-flip randomization test on the sum, exact (all {2**n} sign patterns)"
    rng = np.random.default_rng(seed)
    hits = 0
    batch = 2_000
    for start in range(0, n_resamples, batch):
        size = min(batch, n_resamples - start)
        signs = rng.choice((-1.0, 1.0), size=(size, n))
        hits += int(np.count_nonzero(np.abs(signs @ arr) >= observed - tol))
    p = (1 + hits) / (1 + n_resamples)
    return p, f"two-sided sign-flip randomization test on the sum, Monte Carlo ({n_resamples} patterns, seed {seed})"


def primary_endpoint(
    per_problem_log_ratios: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    test: Literal["signflip", "t"] = "signflip",
) -> PrimaryEndpoint:
    """Paired lift dGM of one cell with its interval and an unadjusted p-value.

    dGM = exp(mean log ratio) - 1 over problems. The interval is bootstrapped on the log scale and mapped through
    exp(x) - 1; both bootstrap methods respect monotone transformations, so this is the interval of dGM itself.
    The p-value comes from the sign-flip randomization test by default (see ``signflip_test`` for why); ``test="t"``
    gives a one-sample t-test of mean log ratio = 0 instead, for readers who expect one. The interval and the
    p-value come from different procedures and can disagree right at the 5 % boundary.

    Below ``MIN_N_FOR_CI`` problems there is neither an interval nor a p-value ("n too small"): a cell that small
    should not enter the Holm family as if it had been tested.

    Args:
        per_problem_log_ratios: One value per problem: mean over replicates of log(c_skill / c_solo).
        confidence: Two-sided confidence level of the interval.
        n_resamples: Bootstrap resamples, also the Monte Carlo sign patterns above ``EXACT_SIGNFLIP_MAX_N``.
        seed: Seed of every random draw.
        test: "signflip" (default) or "t".

    Returns:
        The cell's dGM, interval, p-value and n; ``p_holm`` stays None until ``primary_endpoints`` fills it.

    Example:
        Log ratios of 12 problems averaging log(1.15) give ``dgm == 0.15`` (a 15 % geometric-mean lift) and an
        interval such as (0.02, 0.30); with 9 problems ``ci`` and ``p_value`` are None and the note says
        "n too small".
    """
    if test not in ("signflip", "t"):
        raise ValueError(f"test must be 'signflip' or 't', got {test!r}")
    arr = _as_values(per_problem_log_ratios, "per_problem_log_ratios")
    boot = bootstrap_mean_ci(arr, confidence=confidence, n_resamples=n_resamples, seed=seed)
    n = boot.n
    mean = boot.estimate
    dgm = math.expm1(mean) if mean is not None else None
    ci = (math.expm1(boot.ci[0]), math.expm1(boot.ci[1])) if boot.ci is not None else None
    note = boot.note
    p: float | None
    if n < MIN_N_FOR_CI:
        p = None
        description = "sign-flip randomization test (not run)" if test == "signflip" else "one-sample t-test (not run)"
    elif test == "signflip":
        p, description = signflip_test(arr, n_resamples=n_resamples, seed=seed)
    else:
        description = "two-sided one-sample t-test of mean log ratio = 0"
        if np.ptp(arr) == 0.0:
            p = 1.0 if arr[0] == 0.0 else None
            extra = "zero variance: p = 1 (all zero)" if p == 1.0 else "zero variance: t-test undefined"
            note = f"{note}; {extra}" if note else extra
        else:
            p = float(sps.ttest_1samp(arr, 0.0).pvalue)
    return PrimaryEndpoint(
        dgm=dgm,
        ci=ci,
        p_value=p,
        n=n,
        mean_log_ratio=mean,
        log_ci=boot.ci,
        ci_method=boot.method,
        test=description,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        note=note,
    )


def primary_endpoints(
    cells: Mapping[K, Sequence[float] | np.ndarray],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    test: Literal["signflip", "t"] = "signflip",
) -> dict[K, PrimaryEndpoint]:
    """Primary endpoints of all model x direction cells with Holm-adjusted p-values across them.

    The family for the correction is exactly the cells passed in that have a p-value; cells with "n too small"
    keep ``p_holm = None`` and do not inflate the correction of the others.

    Args:
        cells: Key (e.g. ``(model, direction)``) to that cell's per-problem log ratios.
        confidence: Two-sided confidence level of every interval.
        n_resamples: Bootstrap resamples per cell.
        seed: Seed used for every cell, so adding a cell does not change the others' intervals.
        test: Test behind the p-values, see ``primary_endpoint``.

    Returns:
        Key to ``PrimaryEndpoint`` with ``p_holm`` filled, in the input's order.
    """
    results = {
        key: primary_endpoint(values, confidence=confidence, n_resamples=n_resamples, seed=seed, test=test)
        for key, values in cells.items()
    }
    adjusted = holm([r.p_value for r in results.values()])
    return {key: dataclasses.replace(r, p_holm=a) for (key, r), a in zip(results.items(), adjusted, strict=True)}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    Holm controls the family-wise error rate under any dependence between cells (the cells of one model share
    problems), and is uniformly more powerful than Bonferroni. Sorted ascending, the i-th smallest of m p-values
    (i from 1) becomes max over j <= i of min(1, (m - j + 1) * p_(j)): monotone in the original p-values and capped
    at 1. None entries (cells without a test) pass through as None and do not count towards m.

    Raises:
        ValueError: When a p-value is NaN or outside [0, 1].

    Example:
        ``holm([0.01, 0.04, 0.03])`` gives ``[0.03, 0.06, 0.06]``: 0.01 * 3, then 0.03 * 2 = 0.06, then
        max(0.06, 0.04 * 1) = 0.06.
    """
    present = [(i, float(p)) for i, p in enumerate(pvalues) if p is not None]
    for i, p in present:
        if not 0.0 <= p <= 1.0:  # NaN fails this too
            raise ValueError(f"p-value at position {i} must be in [0, 1], got {pvalues[i]!r}")
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (i, p) in enumerate(sorted(present, key=lambda item: item[1])):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def wilcoxon_signed_rank(
    per_problem_log_ratios: Sequence[float] | np.ndarray,
    *,
    zero_method: Literal["wilcox", "zsplit"] = "wilcox",
) -> SecondaryTest:
    """Secondary: Wilcoxon signed-rank test of per-problem log ratios against zero.

    ``zero_method="wilcox"`` (default) drops problems whose mean log ratio is exactly 0, which in practice are
    problems where every pair failed on both sides at the floor and so say nothing about direction; "zsplit" keeps
    them and splits their ranks between the two signs, pulling the p-value towards 1 (scipy's definitions).

    The p-value is always exact: the null distribution of the positive rank sum is computed by enumerating sign
    flips of the observed ranks (``_signed_rank_pvalue``), which is Wilcoxon's exact distribution when there are
    no ties or zeros and the exact conditional (permutation) distribution when floor-clipped values create ties.
    scipy would switch to a normal approximation there, which is poor at benchmark sizes, or sample at random.

    The statistic is the sum of ranks of positive values (zsplit: plus half the zeros' ranks); scipy's two-sided
    statistic is the smaller rank sum, the positive one keeps the direction visible. Below ``MIN_N_FOR_CI``
    problems nothing is tested, as for the primary endpoint.
    """
    if zero_method not in ("wilcox", "zsplit"):
        raise ValueError(f"zero_method must be 'wilcox' or 'zsplit', got {zero_method!r}")
    arr = _as_values(per_problem_log_ratios, "per_problem_log_ratios")
    n = int(arr.size)
    n_zero = int(np.count_nonzero(arr == 0.0))
    used = arr[arr != 0.0] if zero_method == "wilcox" else arr
    n_used = int(used.size)
    ties = bool(np.unique(np.abs(used)).size < n_used)
    params: dict[str, Any] = {"zero_method": zero_method, "n_zero": n_zero, "n_used": n_used, "ties": ties}
    base = f"two-sided Wilcoxon signed-rank test, zero_method={zero_method!r}"
    if n < MIN_N_FOR_CI:
        note = f"{N_TOO_SMALL}: {n} problems, a test needs at least {MIN_N_FOR_CI}"
        return SecondaryTest("wilcoxon_signed_rank", None, None, n, f"{base} (not run)", params, note=note)
    if not np.any(used != 0.0):
        note = "every per-problem log ratio is 0: no signed differences to rank"
        return SecondaryTest("wilcoxon_signed_rank", None, None, n, f"{base} (not run)", params, note=note)
    # Ranks of |d| are integers or halves (average ranks of ties), so twice a rank is an exact integer weight.
    twice = np.rint(2 * sps.rankdata(np.abs(used))).astype(np.int64)
    p = _signed_rank_pvalue(twice[used > 0], twice[used < 0])
    # zsplit: zeros add half their rank sum to the positive side whatever the signs.
    r_plus = (float(twice[used > 0].sum()) + float(twice[used == 0].sum()) / 2) / 2
    if ties or (zero_method == "zsplit" and n_zero):
        params["p_method"] = "exact conditional"
        how = "exact permutation distribution of the observed ranks (ties or zeros present)"
    else:
        params["p_method"] = "exact"
        how = "exact null distribution"
    return SecondaryTest("wilcoxon_signed_rank", r_plus, p, n, f"{base}, {how}", params)


def _signed_rank_pvalue(pos: np.ndarray, neg: np.ndarray) -> float:
    """Exact two-sided p of the positive rank sum under independent fair sign flips of the nonzero values.

    Weights are twice the ranks, so the distribution is over integers and built by convolution in O(n * sum), exact
    at any n. Zeros add a constant under every sign pattern and are left out. Two-sided p = min(1, 2 * min(P(T <=
    t), P(T >= t))), as scipy's permutation test defines it.
    """
    weights = np.concatenate([pos, neg])
    total = int(weights.sum())
    dist = np.zeros(total + 1)
    dist[0] = 1.0
    for w in weights:
        shifted = np.zeros_like(dist)
        shifted[w:] = dist[: dist.size - w]
        dist = 0.5 * (dist + shifted)
    observed = int(pos.sum())
    return min(1.0, 2.0 * min(float(dist[: observed + 1].sum()), float(dist[observed:].sum())))


def sign_test(helped: int, harmed: int, *, n_pairs: int | None = None) -> SecondaryTest:
    """Secondary: exact two-sided sign test of helped vs harmed pair counts (binomial, p = 1/2).

    Neutral, skipped and both-failed pairs carry no sign and are left out, so n is ``helped + harmed``; pass
    ``n_pairs`` to record how many pairs there were in all. The binomial treats pairs as independent, which
    replicates of one problem are not; read it next to the problem-level primary endpoint, not instead of it.

    The statistic is ``helped``.
    """
    return _binomial_counts(
        "sign_test",
        helped,
        harmed,
        "exact two-sided sign test (binomial, p = 1/2) of helped vs harmed pairs",
        {"helped": helped, "harmed": harmed, "n_pairs": n_pairs},
        "no helped or harmed pairs",
    )


def mcnemar_exact(gained: int, lost: int, *, n_pairs: int | None = None) -> SecondaryTest:
    """Secondary: exact McNemar test on pass/fail flips between the skill attempt and its target solo attempt.

    ``gained`` counts pairs where the skill attempt passed and the solo attempt failed, ``lost`` the reverse. Only
    these discordant pairs carry information about a change in pass rate, and under the null each is a fair coin,
    so the exact test is a two-sided binomial test on them (n = ``gained + lost``). Pass ``n_pairs`` to record the
    total including concordant pairs. Pairs are treated as independent (see ``sign_test``).

    The statistic is ``gained``.
    """
    return _binomial_counts(
        "mcnemar_exact",
        gained,
        lost,
        "exact McNemar test (two-sided binomial, p = 1/2, on discordant pairs)",
        {"gained": gained, "lost": lost, "n_pairs": n_pairs},
        "no discordant pairs",
    )


def _binomial_counts(
    name: str, k: int, other: int, method: str, params: dict[str, Any], empty_note: str
) -> SecondaryTest:
    for label, value in params.items():
        if value is None:
            continue
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{label} must be a non-negative integer, got {value!r}")
    n = int(k + other)
    if params.get("n_pairs") is not None and params["n_pairs"] < n:
        raise ValueError(f"n_pairs ({params['n_pairs']}) is smaller than the counted pairs ({n})")
    if n == 0:
        return SecondaryTest(name, None, None, 0, f"{method} (not run)", params, note=empty_note)
    p = float(sps.binomtest(int(k), n, 0.5, alternative="two-sided").pvalue)
    return SecondaryTest(name, float(k), p, n, method, params)
