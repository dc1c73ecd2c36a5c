"""The comparator: decides whether a candidate's outputs match, and says where they first do not.

Rules (docs/design.md 4.3): the anchor is `reference` on float64-upcast inputs;
ref_err = max|reference(native) − anchor|; a float output passes iff
max|out − anchor| ≤ 3·max(ref_err, eps(dtype)·max|anchor|), NaN/Inf failing where the anchor is finite.
Integers and bools are exact. `topk` compares index sets through the anchor scores they select (ties may break
either way), `topk_values` aligns values by those scores, and `quantized` compares dequantized values allowing
one unit in the last place of the storage format plus the scale's error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from metakernel.problem import ComparatorSpec
from metakernel.structure import flatten, structure_mismatch

#: An output compared as it is when no comparator is declared.
FLOAT = ComparatorSpec(kind="float")
EXACT = ComparatorSpec(kind="exact")


@dataclass(frozen=True)
class Mismatch:
    """The first place a candidate output is wrong."""

    output: str
    detail: str
    index: tuple[int, ...] | None = None
    error: float | None = None
    allowance: float | None = None
    got: float | None = None
    expected: float | None = None
    count: int | None = None  # how many elements are out of tolerance

    def text(self) -> str:
        """One line for people and agents."""
        parts = [f"{self.output}: {self.detail}"]
        if self.index is not None:
            parts.append(f"at index {list(self.index)}")
        if self.got is not None and self.expected is not None:
            parts.append(f"got {self.got:.6g}, expected {self.expected:.6g}")
        if self.error is not None and self.allowance is not None:
            parts.append(f"error {self.error:.3g} > allowance {self.allowance:.3g}")
        if self.count is not None:
            parts.append(f"({self.count} element(s) out of tolerance)")
        return " ".join(parts)


@dataclass(frozen=True)
class OutputCheck:
    """The comparison of one named output."""

    name: str
    kind: str
    passed: bool
    max_error: float | None = None
    allowance: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The comparator's answer for one candidate result."""

    passed: bool
    mismatch: Mismatch | None = None
    outputs: tuple[OutputCheck, ...] = field(default_factory=tuple)

    def text(self) -> str:
        """One line: `correct` or the first mismatch."""
        return "correct" if self.passed else (self.mismatch.text() if self.mismatch else "wrong")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form for reports."""
        mm = self.mismatch
        return {
            "passed": self.passed,
            "mismatch": None if mm is None else {k: getattr(mm, k) for k in mm.__dataclass_fields__},
            "outputs": [{k: getattr(o, k) for k in o.__dataclass_fields__} for o in self.outputs],
        }


@dataclass
class Expected:
    """Everything a candidate result is judged against, computed outside the candidate's process.

    `anchor` and `reference` map every named leaf (returned outputs, then mutated inputs) to the float64 anchor and
    the native-dtype reference; `scores` maps a topk scores-function name to its (native, anchor) score tensors.
    """

    returned: Any
    names: tuple[str, ...]
    mutated: tuple[str, ...]
    anchor: dict[str, torch.Tensor]
    reference: dict[str, torch.Tensor]
    specs: dict[str, ComparatorSpec]
    scores: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def spec(self, name: str) -> ComparatorSpec:
        """The declared comparator, or the dtype's default."""
        if name in self.specs:
            return self.specs[name]
        ref = self.reference[name]
        return FLOAT if ref.is_floating_point() else EXACT


# --------------------------------------------------------------------------------------------------- helpers


def eps_of(dtype: torch.dtype) -> float:
    """Machine epsilon of a float dtype (float8 included); 0 for non-float dtypes."""
    if dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    return 0.0


def _first(mask: torch.Tensor) -> tuple[int, ...] | None:
    flat = mask.reshape(-1).nonzero()
    if flat.numel() == 0:
        return None
    return _index(int(flat[0, 0]), mask.shape)


def _at(t: torch.Tensor, index: tuple[int, ...]) -> float:
    return float(t[index]) if index else float(t)


def _amax(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


#: Elements per slice of the float rule. Its float64 temporaries (about six of the output's size) stay near 1 GiB
#: however large the output: problem 43's 0.9 G-element gradient needed ~40 GB of them at once and ran the grader
#: out of memory on an 80 GB H100 (session 20).
CHUNK = 1 << 24


def _slices(a: torch.Tensor, b: torch.Tensor) -> Any:
    """(offset, a's slice, b's slice) over both flattened in logical (row-major) order, CHUNK elements at a time."""
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    for start in range(0, a_flat.numel(), CHUNK):
        yield start, a_flat[start:start + CHUNK], b_flat[start:start + CHUNK]


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), shape)) if len(shape) else ()


def float_allowance(anchor: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(allowance, ref_err) of the default float rule for one output, computed a slice at a time."""
    if anchor.shape != reference.shape:
        reference = reference.expand_as(anchor)
    ref_err, peak, finite_err = 0.0, 0.0, True
    for _, a, r in _slices(anchor, reference):
        a = a.double()
        finite = torch.isfinite(a)
        a_f = torch.where(finite, a, torch.zeros_like(a))
        diff = (r.double() - a_f).abs()
        err = _amax(torch.where(finite, diff, torch.zeros_like(diff)))
        if math.isfinite(err):
            ref_err = max(ref_err, err)
        else:
            finite_err = False
        peak = max(peak, _amax(a_f))
    if not finite_err:
        # A reference that overflows where the anchor does not must not widen the allowance to infinity;
        # `validate` reports such a problem as ill-conditioned.
        ref_err = 0.0
    return 3.0 * max(ref_err, eps_of(reference.dtype) * peak), ref_err


def _float_rule(name: str, cand: torch.Tensor, anchor: torch.Tensor, allowance: float, kind: str = "float"
                ) -> tuple[OutputCheck, Mismatch | None]:
    """The float rule a slice at a time; the first failing element in the output's own index order is reported.

    Precedence over the whole output: NaN/Inf where the anchor is finite, then a non-finite anchor value the output
    does not repeat, then the tolerance.
    """
    if anchor.shape != cand.shape:
        anchor = anchor.expand_as(cand)
    shape = cand.shape
    nonfinite_at: int | None = None
    nonfinite_count = 0
    differs_at: int | None = None
    over_at: int | None = None
    over_count = 0
    max_err = 0.0
    for offset, c, a in _slices(cand, anchor):
        c = c.double()
        a = a.double().to(c.device)
        finite = torch.isfinite(a)
        bad_nonfinite = finite & ~torch.isfinite(c)
        n_bad = int(bad_nonfinite.sum())
        if n_bad:
            nonfinite_count += n_bad
            if nonfinite_at is None:
                nonfinite_at = offset + int(bad_nonfinite.nonzero()[0, 0])
        if nonfinite_at is not None:
            continue  # the whole output is failed already; only the count is still wanted
        # Where the anchor itself is NaN/Inf the candidate must agree exactly (same NaN-ness, same infinity).
        nonfinite_a = ~finite
        if differs_at is None and bool(nonfinite_a.any()):
            same = (torch.isnan(a) & torch.isnan(c)) | (a == c)
            where = (nonfinite_a & ~same).nonzero()
            if where.numel():
                differs_at = offset + int(where[0, 0])
        err = torch.where(finite, (c - torch.where(finite, a, torch.zeros_like(a))).abs(), torch.zeros_like(c))
        max_err = max(max_err, _amax(err))
        over = err > allowance
        n_over = int(over.sum())
        if n_over:
            over_count += n_over
            if over_at is None:
                over_at = offset + int(over.nonzero()[0, 0])

    def values(flat: int) -> tuple[tuple[int, ...], float, float]:
        idx = _index(flat, shape)
        return idx, _at(cand, idx), _at(anchor, idx)

    if nonfinite_at is not None:
        idx, got, expected = values(nonfinite_at)
        return (OutputCheck(name, kind, False, math.inf, allowance),
                Mismatch(name, "NaN/Inf where the anchor is finite", idx, got=got, expected=expected,
                         count=nonfinite_count))
    if differs_at is not None:
        idx, got, expected = values(differs_at)
        return (OutputCheck(name, kind, False, math.inf, allowance),
                Mismatch(name, "the anchor is NaN/Inf here and the output differs", idx, got=got, expected=expected))
    if over_at is None:
        return OutputCheck(name, kind, True, max_err, allowance), None
    idx, got, expected = values(over_at)
    return (OutputCheck(name, kind, False, max_err, allowance),
            Mismatch(name, "value out of tolerance", idx, error=abs(got - expected), allowance=allowance,
                     got=got, expected=expected, count=over_count))


# --------------------------------------------------------------------------------------------------- comparators


def compare_float(name: str, cand: torch.Tensor, anchor: torch.Tensor, reference: torch.Tensor
                  ) -> tuple[OutputCheck, Mismatch | None]:
    """The default rule for floating outputs."""
    allowance, _ = float_allowance(anchor, reference.to(anchor.device))
    return _float_rule(name, cand, anchor, allowance)


def compare_exact(name: str, cand: torch.Tensor, anchor: torch.Tensor) -> tuple[OutputCheck, Mismatch | None]:
    """Bitwise equality (ints, bools, raw bytes; floats compared by their bits)."""
    expected = anchor.to(cand.device)
    if cand.is_floating_point() and cand.dtype == expected.dtype:
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[cand.element_size()]
        differ = cand.view(int_dtype) != expected.view(int_dtype)
    else:
        differ = cand != expected.to(cand.dtype)
    idx = _first(differ)
    if idx is None:
        return OutputCheck(name, "exact", True, 0.0, 0.0), None
    got, exp = _at(cand.double() if cand.dtype != torch.bool else cand.int(), idx), _at(
        expected.double() if expected.dtype != torch.bool else expected.int(), idx)
    return (OutputCheck(name, "exact", False, None, 0.0),
            Mismatch(name, "differs from the exact expected value", idx, got=got, expected=exp,
                     count=int(differ.sum())))


def _topk_index_problem(name: str, idx: torch.Tensor, n: int) -> Mismatch | None:
    if idx.is_floating_point() or idx.dtype == torch.bool:
        return Mismatch(name, f"top-k indices must be integers, got {idx.dtype}")
    out_of_range = (idx < 0) | (idx >= n)
    pos = _first(out_of_range)
    if pos is not None:
        return Mismatch(name, f"index out of range [0, {n})", pos, got=_at(idx.double(), pos))
    if idx.shape[-1] > 1:
        s = idx.sort(dim=-1).values
        dup = s[..., 1:] == s[..., :-1]
        pos = _first(dup)
        if pos is not None:
            return Mismatch(name, "an index is selected twice in one row", pos[:-1], count=int(dup.sum()))
    return None


def compare_topk(name: str, cand: torch.Tensor, scores_native: torch.Tensor, scores_anchor: torch.Tensor
                 ) -> tuple[OutputCheck, Mismatch | None]:
    """Index sets compared tie-aware: the anchor scores they select must be the k best, within the float rule."""
    s_a = scores_anchor.double().to(cand.device)
    k = cand.shape[-1]
    problem = _topk_index_problem(name, cand, s_a.shape[-1])
    if problem is not None:
        return OutputCheck(name, "topk", False), problem
    chosen = s_a.gather(-1, cand.long()).sort(dim=-1, descending=True).values
    best = s_a.topk(k, dim=-1).values
    allowance, _ = float_allowance(s_a, scores_native.to(s_a.device))
    check, mm = _float_rule(name, chosen, best, allowance, kind="topk")
    if mm is not None:
        mm = Mismatch(name, "selected indices are not the top-k (compared through the scores they select; "
                      "index is [row..., rank])", mm.index, mm.error, mm.allowance, mm.got, mm.expected, mm.count)
    return check, mm


def _by_score(values: torch.Tensor, idx: torch.Tensor, s_a: torch.Tensor) -> torch.Tensor:
    key = s_a.gather(-1, idx.long().to(s_a.device).clamp(0, s_a.shape[-1] - 1))
    order = key.argsort(dim=-1, descending=True, stable=True)
    return values.to(s_a.device).double().gather(-1, order)


def compare_topk_values(name: str, cand: torch.Tensor, cand_idx: torch.Tensor, anchor: torch.Tensor,
                        anchor_idx: torch.Tensor, reference: torch.Tensor, reference_idx: torch.Tensor,
                        scores_anchor: torch.Tensor) -> tuple[OutputCheck, Mismatch | None]:
    """Values aligned with top-k indices, compared after ordering every row by the anchor score of its index."""
    s_a = scores_anchor.double()
    problem = _topk_index_problem(name, cand_idx, s_a.shape[-1])
    if problem is not None:
        return OutputCheck(name, "topk_values", False), Mismatch(name, "its index output is invalid: " + problem.detail)
    c = _by_score(cand, cand_idx, s_a)
    a = _by_score(anchor, anchor_idx, s_a)
    r = _by_score(reference, reference_idx, s_a)
    allowance = 3.0 * max(_amax(r - a), eps_of(reference.dtype) * _amax(a))
    return _float_rule(name, c, a, allowance, kind="topk_values")


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                     dtype=torch.float64)


def decode(q: torch.Tensor, fmt: str) -> torch.Tensor:
    """Storage values as float64; e2m1 is packed two per uint8, low nibble first."""
    if fmt == "e2m1":
        lut = _E2M1.to(q.device)
        b = q.to(torch.uint8).long()
        return torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)
    return q.double()


def ulp(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """One unit in the last place of `fmt` at magnitude |v| (the gap to the next representable value)."""
    a = v.abs()
    if fmt in ("int8", "int4"):
        return torch.ones_like(a)
    if fmt == "e2m1":
        return torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).double()
    mant, min_exp = {"float8_e4m3fn": (3, -6), "float8_e5m2": (2, -14)}[fmt]
    # frexp gives the exact binade; floor(log2(8.0)) is 2 on CUDA (log2 returns 2.9999999999999996 there).
    _, exponent = torch.frexp(a.double().clamp_min(2.0 ** min_exp))
    return torch.pow(2.0, (exponent - 1).clamp_min(min_exp).double() - mant)


def expand_scale(scale: torch.Tensor, block: tuple[int, ...], shape: torch.Size) -> torch.Tensor:
    """Broadcast per-block scales to the element grid of `shape` (trailing missing dims cover whole dims)."""
    s = scale.double()
    while s.dim() < len(shape):
        s = s.unsqueeze(-1)
    block = tuple(block) + (0,) * (len(shape) - len(block))
    for d, (b, n) in enumerate(zip(block, shape, strict=True)):
        if b > 0 and s.shape[d] != n:
            s = s.repeat_interleave(b, dim=d).narrow(d, 0, n)
    return s.expand(shape)


def compare_quantized(name: str, cand: torch.Tensor, cand_scale: torch.Tensor, anchor: torch.Tensor,
                      anchor_scale: torch.Tensor, spec: ComparatorSpec, scale_allowance: float
                      ) -> tuple[OutputCheck, Mismatch | None]:
    """Dequantized comparison: 1 ulp of the storage format times the scale, plus |q| times the scale's allowance.

    The scale's allowance is its own float-rule allowance; the scale output is also checked on its own.
    """
    fmt = spec.format or "float8_e4m3fn"
    qc = decode(cand, fmt)
    qa = decode(anchor.to(cand.device), fmt)
    sc = expand_scale(cand_scale.to(cand.device), spec.block, qc.shape)
    sa = expand_scale(anchor_scale.to(cand.device), spec.block, qa.shape)
    dc, da = qc * sc, qa * sa
    bad = torch.isfinite(da) & ~torch.isfinite(dc)
    idx = _first(bad)
    if idx is not None:
        return (OutputCheck(name, "quantized", False, math.inf),
                Mismatch(name, "NaN/Inf after dequantization", idx, got=_at(dc, idx), expected=_at(da, idx)))
    slack = 3.0 * eps_of(torch.float32) * _amax(da)
    allow = ulp(qa, fmt) * sa.abs() + qa.abs() * scale_allowance + slack
    err = (dc - da).abs()
    over = err > allow
    idx = _first(over)
    if idx is None:
        return OutputCheck(name, "quantized", True, _amax(err), float(allow.max()) if allow.numel() else 0.0), None
    return (OutputCheck(name, "quantized", False, _amax(err), _at(allow, idx)),
            Mismatch(name, "dequantized value out of tolerance", idx, error=_at(err, idx),
                     allowance=_at(allow, idx), got=_at(dc, idx), expected=_at(da, idx), count=int(over.sum())))


# --------------------------------------------------------------------------------------------------- entry point


def named_leaves(returned: Any, mutated: Mapping[str, torch.Tensor], names: tuple[str, ...]
                 ) -> dict[str, torch.Tensor]:
    """Name a result's tensors (returned ones by `names`, then the mutated inputs by input name)."""
    leaves = flatten(returned)
    out = {n: leaf.tensor for n, leaf in zip(names, leaves, strict=False)}
    out.update(mutated)
    return out


def compare(candidate: Any, candidate_mutated: Mapping[str, torch.Tensor], expected: Expected) -> Verdict:
    """Judge a candidate's returned result and its mutated inputs against `expected`."""
    try:
        problem = structure_mismatch(candidate, expected.returned)
    except TypeError as exc:
        problem = str(exc)
    if problem is not None:
        return Verdict(False, Mismatch("result", f"wrong structure: {problem}"))
    for name in expected.mutated:
        got = candidate_mutated.get(name)
        ref = expected.reference[name]
        if got is None:
            return Verdict(False, Mismatch(name, "mutated input missing from the candidate's result"))
        problem = structure_mismatch(got, ref)
        if problem is not None:
            return Verdict(False, Mismatch(name, f"wrong structure: {problem}"))
    leaves = named_leaves(candidate, candidate_mutated, expected.names)
    checks: list[OutputCheck] = []
    first: Mismatch | None = None
    for name in (*expected.names, *expected.mutated):
        check, mismatch = compare_one(name, leaves, expected)
        checks.append(check)
        if mismatch is not None and first is None:
            first = mismatch
    return Verdict(first is None, first, tuple(checks))


def compare_one(name: str, leaves: Mapping[str, torch.Tensor], expected: Expected
                ) -> tuple[OutputCheck, Mismatch | None]:
    """Apply one output's comparator."""
    spec = expected.spec(name)
    cand, anchor, ref = leaves[name], expected.anchor[name], expected.reference[name]
    if spec.kind == "float":
        return compare_float(name, cand, anchor, ref)
    if spec.kind == "exact":
        return compare_exact(name, cand, anchor)
    if spec.kind == "topk":
        native, anchored = expected.scores[spec.scores or ""]
        return compare_topk(name, cand, native, anchored)
    if spec.kind == "topk_values":
        _, anchored = expected.scores[spec.scores or ""]
        idx = spec.indices or ""
        return compare_topk_values(name, cand, leaves[idx], anchor, expected.anchor[idx], ref,
                                   expected.reference[idx], anchored)
    if spec.kind == "quantized":
        scale = spec.scale or ""
        scale_allowance, _ = float_allowance(expected.anchor[scale], expected.reference[scale])
        return compare_quantized(name, cand, leaves[scale], anchor, expected.anchor[scale], spec, scale_allowance)
    raise ValueError(f"unknown comparator kind {spec.kind!r}")
