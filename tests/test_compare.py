"""The comparator on hand-made cases: every rule, its edges, and the mismatch it reports."""

from __future__ import annotations

import math

import pytest
import torch

from metakernel.compare import (
    Expected,
    compare,
    compare_exact,
    compare_float,
    compare_quantized,
    compare_topk,
    compare_topk_values,
    ulp,
)
from metakernel.expected import compute_expected
from metakernel.problem import ComparatorSpec, load_problem_file
from metakernel.structure import flatten
from tests.helpers import write_problem


def _expected(returned, anchor=None, specs=None, names=None, mutated=(), mutated_anchor=None, scores=None):
    leaves = [leaf.tensor for leaf in flatten(returned)]
    names = names or (("out",) if isinstance(returned, torch.Tensor) else tuple(f"out{i}" for i in range(len(leaves))))
    anchors = anchor if anchor is not None else [t.double() for t in leaves]
    anchors = [anchors] if isinstance(anchors, torch.Tensor) else list(anchors)
    ref = dict(zip(names, leaves, strict=True))
    anc = dict(zip(names, anchors, strict=True))
    for name, (r, a) in (mutated_anchor or {}).items():
        ref[name], anc[name] = r, a
    return Expected(returned=returned, names=names, mutated=tuple(mutated), anchor=anc, reference=ref,
                    specs=specs or {}, scores=scores or {})


# ------------------------------------------------------------------------------------------------ float rule


def test_float_allowance_is_three_times_max_of_ref_err_and_eps_scale():
    """Pins DESIGN 4.3: allowance = 3·max(ref_err, eps(dtype)·max|anchor|)."""
    anchor = torch.tensor([1.0, -4.0, 2.0], dtype=torch.float64)
    ref = torch.tensor([1.0, -4.0, 2.1], dtype=torch.float32)  # ref_err 0.1 (float32 rounding of 2.1 aside)
    ref_err = abs(float(ref[2]) - 2.0)
    allow = 3 * max(ref_err, torch.finfo(torch.float32).eps * 4.0)
    ok = torch.tensor([1.0, -4.0, 2.0 + allow * 0.99], dtype=torch.float32)
    bad = torch.tensor([1.0, -4.0 - allow * 1.5, 2.0], dtype=torch.float32)
    assert compare_float("y", ok, anchor, ref)[1] is None
    check, mm = compare_float("y", bad, anchor, ref)
    assert not check.passed and mm is not None
    assert mm.output == "y" and mm.index == (1,)
    assert mm.allowance == pytest.approx(allow)
    assert mm.error == pytest.approx(allow * 1.5, rel=1e-5)


def test_float_uses_eps_of_the_output_dtype_when_reference_is_exact():
    anchor = torch.full((4,), 100.0, dtype=torch.float64)
    ref = anchor.to(torch.bfloat16)  # exact: ref_err = 0
    eps_allow = 3 * torch.finfo(torch.bfloat16).eps * 100.0  # 2.34
    assert compare_float("y", torch.full((4,), 102.0).to(torch.bfloat16), anchor, ref)[1] is None
    mm = compare_float("y", torch.full((4,), 104.0).to(torch.bfloat16), anchor, ref)[1]
    assert mm is not None and mm.allowance == pytest.approx(eps_allow)


def test_nan_fails_where_anchor_is_finite_and_passes_where_anchor_is_nan():
    anchor = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_float("y", torch.tensor([1.0, float("nan"), float("inf")]), anchor, ref)[1] is None
    mm = compare_float("y", torch.tensor([float("nan"), float("nan"), float("inf")]), anchor, ref)[1]
    assert mm is not None and "NaN/Inf where the anchor is finite" in mm.detail and mm.index == (0,)
    mm = compare_float("y", torch.tensor([1.0, 0.0, float("inf")]), anchor, ref)[1]
    assert mm is not None and mm.index == (1,)
    mm = compare_float("y", torch.tensor([1.0, float("nan"), -float("inf")]), anchor, ref)[1]
    assert mm is not None and mm.index == (2,)


def test_overflowing_reference_does_not_open_an_infinite_allowance():
    """A reference that is Inf where the anchor is finite must not make every candidate pass."""
    anchor = torch.tensor([1e5, 1.0], dtype=torch.float64)
    ref = torch.tensor([float("inf"), 1.0], dtype=torch.float16)
    mm = compare_float("y", torch.tensor([0.0, 0.0], dtype=torch.float16), anchor, ref)[1]
    assert mm is not None


def test_poisoned_float_buffer_is_rejected():
    """An output buffer the kernel never wrote (NaN poison from the grader) must fail."""
    torch.manual_seed(1)
    ref = torch.randn(4, 8, dtype=torch.bfloat16)
    out = ref.clone()
    out[2, 3:] = float("nan")  # a tail never written
    mm = compare_float("y", out, ref.double(), ref)[1]
    assert mm is not None and mm.index == (2, 3) and mm.count == 5


# ------------------------------------------------------------------------------------------------ exact


def test_exact_ints_bools_and_poisoned_int_buffer():
    a = torch.tensor([[3, 1], [4, 1]], dtype=torch.int32)
    assert compare_exact("slots", a.clone(), a)[1] is None
    poisoned = a.clone()
    poisoned[1, 1] = -0x7F7F7F7F  # the grader's integer poison pattern
    mm = compare_exact("slots", poisoned, a)[1]
    assert mm is not None and mm.index == (1, 1) and mm.got == -0x7F7F7F7F and mm.expected == 1
    b = torch.tensor([True, False, True])
    assert compare_exact("mask", b.clone(), b)[1] is None
    assert compare_exact("mask", ~b, b)[1].count == 3


def test_exact_on_floats_compares_bits():
    a = torch.tensor([0.0, 1.0])
    assert compare_exact("x", torch.tensor([-0.0, 1.0]), a)[1] is not None


# ------------------------------------------------------------------------------------------------ top-k


def _scores():
    # Row 0 has a three-way tie for ranks 2-4 (value 0.5); row 1 has no ties.
    return torch.tensor([[0.9, 0.5, 0.1, 0.5, 0.5, 0.2], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]], dtype=torch.float64)


def test_topk_accepts_any_tie_break_and_any_order():
    s = _scores()
    for idx in ([[0, 1, 3], [5, 4, 3]], [[4, 0, 3], [3, 5, 4]], [[0, 4, 1], [4, 3, 5]]):
        check, mm = compare_topk("ids", torch.tensor(idx), s.float(), s)
        assert mm is None, idx


def test_topk_rejects_a_non_top_index_duplicates_and_out_of_range():
    s = _scores()
    mm = compare_topk("ids", torch.tensor([[0, 1, 5], [5, 4, 3]]), s.float(), s)[1]  # 0.2 instead of 0.5
    assert mm is not None and "not the top-k" in mm.detail and mm.index[0] == 0
    mm = compare_topk("ids", torch.tensor([[0, 1, 1], [5, 4, 3]]), s.float(), s)[1]
    assert mm is not None and "twice" in mm.detail
    mm = compare_topk("ids", torch.tensor([[0, 1, 6], [5, 4, 3]]), s.float(), s)[1]
    assert mm is not None and "out of range" in mm.detail and mm.index == (0, 2)
    mm = compare_topk("ids", torch.tensor([[0.0, 1, 3], [5, 4, 3]]), s.float(), s)[1]
    assert mm is not None and "integers" in mm.detail


def test_topk_values_follow_their_indices_through_reordering_and_ties():
    s = _scores()
    ref_idx = torch.tensor([[0, 1, 3], [5, 4, 3]])
    ref_w = s.gather(-1, ref_idx) / s.gather(-1, ref_idx).sum(-1, keepdim=True)
    # The candidate breaks the tie the other way and lists row 1 in another order: same weights, moved along.
    cand_idx = torch.tensor([[4, 0, 3], [3, 5, 4]])
    cand_w = s.gather(-1, cand_idx) / s.gather(-1, cand_idx).sum(-1, keepdim=True)
    args = (ref_w.double(), ref_idx, ref_w.float(), ref_idx, s)
    assert compare_topk_values("w", cand_w.float(), cand_idx, *args)[1] is None
    # Weights detached from their indices (row 1 reversed) must fail.
    mm = compare_topk_values("w", cand_w.flip(-1).float(), cand_idx, *args)[1]
    assert mm is not None and mm.output == "w"


# ------------------------------------------------------------------------------------------------ quantized


def test_fp8_one_ulp_passes_two_ulps_fail():
    """fp8 last-bit differences are allowed (1 ulp of e4m3 times the scale); two ulps are not."""
    q = torch.tensor([[1.0, 2.0, 3.0, 448.0]]).to(torch.float8_e4m3fn)
    scale = torch.tensor([[0.5]], dtype=torch.float32)
    spec = ComparatorSpec(kind="quantized", scale="s", block=(1, 0), format="float8_e4m3fn")
    one_up = torch.tensor([[1.125, 2.0, 3.0, 448.0]]).to(torch.float8_e4m3fn)  # ulp at 1.0 is 0.125
    two_up = torch.tensor([[1.25, 2.0, 3.0, 448.0]]).to(torch.float8_e4m3fn)
    assert compare_quantized("q", one_up, scale, q, scale.double(), spec, 0.0)[1] is None
    mm = compare_quantized("q", two_up, scale, q, scale.double(), spec, 0.0)[1]
    assert mm is not None and mm.index == (0, 0)
    assert mm.allowance == pytest.approx(0.125 * 0.5 + 3 * torch.finfo(torch.float32).eps * 224.0)


def test_quantized_allows_the_scale_its_own_allowance_and_no_more():
    q = torch.tensor([[100.0, -50.0]]).to(torch.float8_e4m3fn)
    s_anchor = torch.tensor([[0.01]], dtype=torch.float64)
    spec = ComparatorSpec(kind="quantized", scale="s", block=(1, 0), format="float8_e4m3fn")
    s_allow = 1e-4  # what the float rule allows the scale output
    near = torch.tensor([[0.01 + 0.9e-4]], dtype=torch.float64)
    far = torch.tensor([[0.012]], dtype=torch.float64)  # 20 % off: beyond 1 ulp plus the scale allowance
    assert compare_quantized("q", q, near, q, s_anchor, spec, s_allow)[1] is None
    assert compare_quantized("q", q, far, q, s_anchor, spec, s_allow)[1] is not None


def test_ulp_table():
    v = torch.tensor([0.0, 1.0, 1.9, 2.0, 448.0], dtype=torch.float64)
    assert ulp(v, "float8_e4m3fn").tolist() == [2.0**-9, 0.125, 0.125, 0.25, 32.0]
    assert ulp(torch.tensor([1.0, 2.5, 6.0]), "e2m1").tolist() == [0.5, 1.0, 2.0]
    assert ulp(torch.tensor([-7.0]), "int8").tolist() == [1.0]


def test_block_scales_expand_per_group():
    """Per-(token, 128-group) scales: each scale covers its own group only."""
    q = torch.ones(2, 256).to(torch.float8_e4m3fn)
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    spec = ComparatorSpec(kind="quantized", scale="s", block=(1, 128), format="float8_e4m3fn")
    assert compare_quantized("q", q, s, q, s.double(), spec, 0.0)[1] is None
    wrong = s.clone()
    wrong[1, 1] = 8.0
    mm = compare_quantized("q", q, wrong, q, s.double(), spec, 0.0)[1]
    assert mm is not None and mm.index == (1, 128)


# ------------------------------------------------------------------------------------------------ structures


def test_wrong_container_types_lengths_dtypes_shapes():
    a, b = torch.randn(3), torch.randn(2, 2)
    exp = _expected((a, b))
    assert compare((a.clone(), b.clone()), {}, exp).passed
    cases = {
        "expected tuple of length 2, got list": [a, b],
        "expected tuple of length 2, got tuple of length 3": (a, b, b),
        "expected dtype torch.float32, got torch.float64": (a.double(), b),
        "expected shape (2, 2), got (4,)": (a, b.reshape(4)),
        "got NoneType": (a, None),
        "got float": 1.0,
    }
    for needle, cand in cases.items():
        v = compare(cand, {}, exp)
        assert not v.passed and needle in v.mismatch.detail, (needle, v.text())


def test_nested_structures_are_named_in_order():
    a, b, c = torch.randn(2), torch.randn(3), torch.randn(4)
    exp = _expected((a, (b, c)), anchor=[a.double(), b.double(), c.double()], names=("x", "y", "z"))
    wrong_c = c + 1
    v = compare((a, (b, wrong_c)), {}, exp)
    assert not v.passed and v.mismatch.output == "z"
    assert [o.name for o in v.outputs] == ["x", "y", "z"]


# ------------------------------------------------------------------------------------------------ MUTATES via a file

MUTATING = """
MUTATES = ("cache",)
OUTPUT_NAMES = ("y",)

def reference(x, cache, slots):
    cache[slots] = x * 2
    return x.sum(-1)

def make_inputs(device="cuda", scale="full"):
    return [torch.randn(4, 8, device=device), torch.randn(16, 8, device=device),
            torch.randperm(16, device=device)[:4]]

def roofline(x, cache, slots):
    return {"flops": 32, "bytes": 1}
"""


def test_mutated_inputs_are_compared_like_outputs(tmp_path):
    problem = load_problem_file(write_problem(tmp_path, "kv_cache", "19_tmp", MUTATING))
    torch.manual_seed(0)
    x, cache, slots = problem.make_inputs("cpu", "small")
    exp = compute_expected(problem, [x, cache, slots])
    good_cache = cache.clone()
    good_cache[slots] = x * 2
    assert compare(x.sum(-1), {"cache": good_cache}, exp).passed
    assert compare(x.sum(-1), {"cache": cache}, exp).mismatch.output == "cache"  # never written
    wrong = good_cache.clone()
    wrong[slots[0]] = float("nan")
    v = compare(x.sum(-1), {"cache": wrong}, exp)
    assert not v.passed and v.mismatch.index[0] == int(slots[0])
    assert not compare(x.sum(-1), {}, exp).passed


TOPK = """
OUTPUT_NAMES = ("weights", "ids")
COMPARATORS = {"ids": {"kind": "topk", "scores": "router_scores"},
               "weights": {"kind": "topk_values", "indices": "ids", "scores": "router_scores"}}

def router_scores(x, w):
    return torch.sigmoid(x @ w)

def reference(x, w):
    s = router_scores(x, w)
    vals, ids = s.topk(2, dim=-1)
    return vals / vals.sum(-1, keepdim=True), ids

def make_inputs(device="cuda", scale="full"):
    return [torch.randn(6, 4, device=device), torch.randn(4, 5, device=device)]

def roofline(x, w):
    return {"flops": 240, "bytes": 1}
"""


def test_topk_problem_end_to_end(tmp_path):
    problem = load_problem_file(write_problem(tmp_path, "moe", "44_tmp", TOPK))
    torch.manual_seed(3)
    inputs = problem.make_inputs("cpu", "small")
    exp = compute_expected(problem, inputs)
    w, ids = exp.returned
    assert compare((w.clone(), ids.clone()), {}, exp).passed
    assert compare((w.flip(-1), ids.flip(-1)), {}, exp).passed  # order within a row is free
    bad = ids.clone()
    bad[0, 1] = (set(range(5)) - set(ids[0].tolist())).pop()
    v = compare((w, bad), {}, exp)
    assert not v.passed and {o.name for o in v.outputs if not o.passed} >= {"ids"}
    assert math.isfinite(v.outputs[0].max_error or 0.0)


@pytest.mark.parametrize("case", ["pass", "over", "nonfinite", "anchor_nan", "ref_overflow"])
def test_float_rule_in_slices_decides_as_the_whole_output_does(monkeypatch, case):
    """The rule runs CHUNK elements at a time (bounded float64 temporaries); verdict, first index, counts and errors
    are those of one pass over the whole output, whichever slice holds the first failure."""
    import metakernel.compare as cmp

    gen = torch.Generator().manual_seed(7)
    anchor = torch.randn(6, 7, 5, dtype=torch.float64, generator=gen)
    ref = anchor.to(torch.bfloat16)
    cand = anchor.to(torch.bfloat16).clone()
    if case == "over":
        cand[3, 2, 1] += 1.0
        cand[5, 6, 4] -= 2.0
        cand[1, 0, 0] += 0.5
    if case == "nonfinite":
        cand[2, 2, 2] = float("nan")
        cand[4, 0, 3] = float("inf")
        cand[0, 1, 1] += 3.0  # a tolerance failure earlier in order: the NaN/Inf still decides
    if case == "anchor_nan":
        anchor[3, 3, 3] = float("nan")
        cand[3, 3, 3] = 1.0
    if case == "ref_overflow":
        ref = ref.clone()
        ref[4, 4, 4] = float("inf")
    cand = cand.transpose(0, 2).contiguous().transpose(0, 2)  # a non-contiguous output: logical order still counts

    whole = cmp.compare_float("y", cand, anchor, ref)
    monkeypatch.setattr(cmp, "CHUNK", 16)
    sliced = cmp.compare_float("y", cand, anchor, ref)
    assert repr(sliced) == repr(whole)  # repr: NaN fields compare equal there
    assert whole[0].passed == (case in ("pass", "ref_overflow"))
    if case == "over":
        assert whole[1].index == (1, 0, 0) and whole[1].count == 3
    if case == "nonfinite":
        assert whole[1].index == (2, 2, 2) and whole[1].count == 2
