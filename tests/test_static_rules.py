"""Every static rule has a case that must be caught, and clean kernels pass (DESIGN 3 and 4.1)."""

from __future__ import annotations

import pytest

from metakernel.grader.static import MAX_BYTES, check_source

CLEAN_CUTE = """
import torch
import cutlass
import cutlass.cute as cute

def solve(x):
    return x
"""
CLEAN_TIRX = """
import torch
import tvm
from tvm.script import tirx as Tx

def solve(x):
    return x
"""


def test_clean_kernels_pass():
    assert check_source(CLEAN_CUTE, "cute").ok
    assert check_source(CLEAN_TIRX, "tirx").ok


@pytest.mark.parametrize("snippet, needle", [
    ("import triton", "Triton"),
    ("import triton.language as tl", "Triton"),
    ("from torch.utils.cpp_extension import load_inline", "cpp_extension"),
    ("from torch.utils import cpp_extension", "cpp_extension"),
    ("f = torch.compile(lambda x: x)", "torch.compile"),
    ("from torch import compile as c", "torch.compile"),
    ("t = torch.jit.script", "TorchScript"),
    ("g = torch.cuda.CUDAGraph()", "CUDA graphs"),
    ("with torch.cuda.graph(g): pass", "CUDA graphs"),
    ("import ctypes", "ctypes"),
    ("import subprocess", "subprocesses"),
    ("import os", "os"),
    ("from cuda.bindings import nvrtc", "NVRTC"),
    ("import cupy", "CuPy"),
    ("import tvm.contrib.cublas", "library kernels"),
    ("torch.cuda.Event.elapsed_time = lambda a, b: 1.0", "timers"),
    ("s = torch.initial_seed()", "seeds"),
    ("s = torch.cuda.get_rng_state()", "seeds"),
    ("exec('x = 1')", "exec"),
    ("m = __import__('triton')", "dynamic imports"),
    ("from metakernel import compare", "harness"),
    ("y = reference(x)", "reference"),
    ("y = make_inputs('cuda')", "make_inputs"),
    ("import time", "timers"),
    ("f = open('/proc/self/maps')", "file access"),
    ("setattr(torch, 'add', None)", "patching"),
    ("x = torch._C._cuda_getCurrentRawStream(0)", "torch internals"),
    ("f = tvm.get_global_func('ffi.ModuleGetFunction')", "raw FFI"),
    ("import tvm_ffi", "raw FFI"),
])
def test_forbidden_constructs_are_caught_with_line_numbers(snippet, needle):
    source = CLEAN_CUTE + "\n" + snippet + "\n"
    result = check_source(source, "cute")
    assert result.status == "rule_violation", snippet
    line = source.count("\n", 0, source.index(snippet)) + 1
    assert any(needle in v.rule or needle in v.detail for v in result.violations), result.violations
    assert any(v.line == line for v in result.violations)


def test_the_other_dsl_is_forbidden_and_own_dsl_required():
    result = check_source(CLEAN_TIRX + "\nimport cutlass\n", "tirx")
    assert result.status == "rule_violation" and any("cute DSL" in v.rule for v in result.violations)
    result = check_source("import torch\n\ndef solve(x):\n    return x * 2\n", "cute")
    assert result.status == "rule_violation" and "never imports cutlass" in result.violations[0].detail


def test_size_parse_and_missing_solve():
    assert "300 KB" in check_source("#" * (MAX_BYTES + 1), "cute").problem
    bad = check_source("def solve(:\n", "cute")
    assert bad.status == "compile_error" and "does not parse: line 1" in bad.problem
    none = check_source("import cutlass\n\ndef other():\n    pass\n", "cute")
    assert none.status == "compile_error" and "no top-level solve" in none.problem
    assert check_source(b"\xff\xfe", "cute").status == "compile_error"


def test_unrelated_names_are_not_flagged():
    ok = CLEAN_CUTE + "\nclass K:\n    reference = 1\n\ndef helper(cfg):\n    return cfg.seed_like + cfg.reference\n"
    assert check_source(ok, "cute").ok
