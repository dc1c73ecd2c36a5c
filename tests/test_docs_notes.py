"""The notes agents find with docs_search: every snippet compiles, the claims about the generated code hold, and
agent-like questions find the document that answers them in the top three of the full index."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metakernel.docs_index import SOURCES, DocsIndex, build_index
from metakernel.paths import guides_dir

ROOT = Path(__file__).resolve().parents[1]
NOTES = ("cute-notes", "tirx-notes")
FAST = "guide:cute-notes#fast-math-exp-tanh-division-and-the-ptx-they-become"
BOUNDS = "guide:cute-notes#launch-bounds-and-occupancy-hints-min-blocks-per-mp"
SMEM = "guide:cute-notes#dynamic-shared-memory-above-48-kb-smemallocator"
FAKE = "guide:cute-notes#fake-tensors-for-n-d-inputs-stride-order-nchw-row-major"
ROUTE = "guide:cute-notes#streams-and-the-cost-of-a-launch-route"
T_FAST = "guide:tirx-notes#fast-math-tvm-compiles-cuda-with-use-fast-math-exp-tanh-division"
T_PTX = "guide:tirx-notes#ptx-intrinsics-tx-ptx-operand-order-and-calling-convention"
T_BOUNDS = "guide:tirx-notes#launch-bounds-registers-and-occupancy"
T_SMEM = "guide:tirx-notes#shared-memory-above-48-kb-shared-dyn"
DYN = "guide:cute-notes#dynamic-shapes-vs-compile-time-constants-cute-sym-int-cutlass-constexpr"
PRINT = "guide:cute-notes#debugging-printing-from-inside-a-kernel-cute-printf-cute-print-tensor"
T_DYN = "guide:tirx-notes#dynamic-shapes-tx-int32-symbolic-sizes-atomics-and-printf"

#: (dsl, what an agent typed, the document that answers it). The first eight are the questions a capable agent
#: asked while writing problem 31 and did not get answered (issue 15); the rest are ours.
QUERIES = [
    ("cute", "approx tanh hardware approximation", FAST),
    ("cute", "sigmoid silu", FAST),
    ("cute", "kernel launch min_blocks_per_mp max_number_threads launch bounds", BOUNDS),
    ("tirx", "Tx.ptx.tanh operand order", T_PTX),
    ("tirx", "launch_bounds", T_BOUNDS),
    ("tirx", "Tx.exp fast or accurate", T_FAST),
    ("cute", "shared memory above 48 KB", SMEM),
    ("cute", "stride order 4-D NCHW fake tensor", FAKE),
    ("cute", "DynamicLibNotFoundError cuda driver library", BOUNDS),
    ("cute", "dynamic shared memory limit SmemAllocator", SMEM),
    # a held-out question whose words API one-liners repeat (ranked 4th-6th before `DocsIndex._by_coverage`)
    ("cute", "how do I allocate shared memory in a kernel and what is the max dynamic smem size", SMEM),
    ("cute", "make_fake_compact_tensor row-major stride_order", FAKE),
    ("cute", "fast exp accuracy ex2", FAST),
    ("cute", "division exact or approximate reciprocal", FAST),
    ("cute", "tanh approx=True", FAST),
    ("cute", "launch overhead per call route from_dlpack cost", ROUTE),
    ("cute", "which stream does the kernel run on", "guide:cute#streams"),
    ("cute", "warpgroup mma wgmma tensor cores gemm", "guide:cute#tensor-cores-warpgroup-mma-a-worked-gemm"),
    ("cute", "occupancy registers per thread", BOUNDS),
    ("tirx", "ptx intrinsic calling convention destination", T_PTX),
    ("tirx", "use_fast_math division approximate", T_FAST),
    ("tirx", "exact division div.rn", T_FAST),
    ("tirx", "denormals flushed ftz", T_FAST),
    ("tirx", "shared memory larger than 48KB shared.dyn", T_SMEM),
    ("tirx", "dynamic shared memory", T_SMEM),
    ("tirx", "registers per thread occupancy", T_BOUNDS),
    ("tirx", "mma.sync ldmatrix tensor cores", "guide:tirx#tensor-cores-a-worked-gemm"),
    ("tirx", "which stream does tvm launch on", "guide:tirx-notes#streams-and-the-cost-of-a-call"),
    ("tirx", "compile once cache executable", "guide:tirx#imports-and-compiling-once"),
    ("tirx", "bf16 vector load 16 bytes", "guide:tirx#writing-the-kernel"),
    ("tirx", "cta_sum scratch reduction", "guide:tirx#writing-the-kernel"),
    # Held-out questions written by a reviewer who had not seen the list above (those it missed, and CUDA C
    # spellings): answered since by the notes and by searching CUDA C words as the DSLs spell them.
    ("cute", "__syncthreads equivalent barrier for all threads in the block", "cute:cute.arch.sync_threads"),
    ("cute", "make tensor shape dynamic vs cutlass.Constexpr compile-time constant", DYN),
    ("cute", "one compiled kernel for every batch size", DYN),
    ("cute", "print tensor values from inside a kernel for debugging", PRINT),
    ("cute", "printf in kernel", PRINT),
    ("cute", "ceil division and computing global index from block_idx and thread_idx", "cute:cute.arch.block_idx"),
    ("tirx", "atomicAdd into a global buffer", "tirx:Tx.cuda.atomic_add"),
    ("tirx", "symbolic dynamic shape variable for buffer dimension", T_DYN),
    ("tirx", "__syncthreads", "tirx:Tx.cuda.cta_sync"),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("docs")
    build_index(SOURCES, directory=directory)  # the index agents search: guides, notes and both DSLs' packages
    with DocsIndex.open(build_if_missing=False, directory=directory) as opened:
        yield opened


def test_agent_questions_find_their_answer_in_the_top_three(index) -> None:
    assert len(QUERIES) >= 28
    missed = []
    for dsl, query, want in QUERIES:
        hits = [h.doc_id for h in index.search(query, dsl=dsl, k=3)]
        if want not in hits:
            missed.append(f"{dsl} {query!r}: wanted {want}, got {hits}")
    assert not missed, "\n".join(missed)


def _snippets(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (guides_dir() / f"{name}.md").read_text(encoding="utf-8"), re.S)


def _env() -> dict[str, str]:
    from metakernel.dsl.tirx import ADAPTER as TIRX

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(TIRX.environment(dry_run=True))
    return env


def _run_all(scripts: dict[str, str], tmp_path: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    procs = {}
    for key, code in scripts.items():
        path = tmp_path / f"{key}.py"
        path.write_text(code, encoding="utf-8")
        procs[key] = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=_env(), cwd=tmp_path)
    done = {}
    for key, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def test_every_note_and_guide_snippet_runs(tmp_path: Path) -> None:
    """Every ```python block of the notes (each compiles its kernel) and of the guides (imports and definitions;
    the guides' complete examples are also dry-run by tests/test_dsl_cute.py and test_dsl_tirx.py) runs as a
    script. Schematic pieces with placeholders use a plain ``` fence."""
    scripts = {f"{name}_{i}": code for name in (*NOTES, "cute", "tirx") for i, code in enumerate(_snippets(name))}
    assert len(scripts) >= 12
    failed = {k: r.stderr[-1500:] for k, r in _run_all(scripts, tmp_path).items() if r.returncode}
    assert not failed, failed


CUTE_PTX = textwrap.dedent('''
    import glob, json, os
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    def ops(variant):
        @cute.kernel
        def k(a: cute.Tensor, b: cute.Tensor):
            tidx, _, _ = cute.arch.thread_idx()
            x = a[tidx]
            if cutlass.const_expr(variant == "tanh"):
                b[tidx] = cute.math.tanh(x)
            elif cutlass.const_expr(variant == "tanh_approx"):
                b[tidx] = cute.math.tanh(x, approx=True)
            elif cutlass.const_expr(variant == "exp"):
                b[tidx] = cute.math.exp(x)
            else:
                b[tidx] = x / a[tidx + 1]

        @cute.jit
        def run(a: cute.Tensor, b: cute.Tensor):
            k(a, b).launch(grid=(1, 1, 1), block=(128, 1, 1))

        out = os.path.abspath(variant)
        os.makedirs(out, exist_ok=True)
        a, b = (make_fake_compact_tensor(cutlass.Float32, (n,)) for n in (129, 128))
        cute.compile(run, a, b, options=f"--keep-ptx --dump-dir {out}")
        ptx = open(glob.glob(out + "/*.ptx")[0]).read()
        return sorted({ln.split()[0] for ln in ptx.splitlines()
                       if re.search(r"\\b(tanh|ex2|rcp|div)\\.", ln) and not ln.strip().startswith("//")})

    import re
    print("RESULT " + json.dumps({v: ops(v) for v in ("tanh", "tanh_approx", "exp", "div")}))
''')

TIRX_PTX = textwrap.dedent('''
    import json
    import torch
    import tvm
    from tvm.script import tirx as Tx
    from tvm.support import nvcc
    from metakernel.dsl.tirx_host import cuda_sources

    @Tx.prim_func
    def k(x_ptr: Tx.handle, y_ptr: Tx.handle):
        X = Tx.match_buffer(x_ptr, (4096,), "float32")
        Y = Tx.match_buffer(y_ptr, (4096,), "float32")
        Tx.device_entry()
        bx = Tx.cta_id([16])
        tx = Tx.thread_id([256])
        r = Tx.alloc_local((1,), "float32")
        i: Tx.let = bx * 256 + tx
        Tx.ptx["div.rn.f32"](r[0], X[i], X[i] + 3.0)
        Y[i] = Tx.exp(X[i]) + Tx.tanh(X[i]) + X[i] / (X[i] + 1.0) + r[0]

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    src = cuda_sources(tvm.compile(k, target=target, tir_pipeline="tirx").mod)[0]
    with target:
        ptx = nvcc.compile_cuda(src, target_format="ptx", compiler="nvcc")
    ptx = ptx.decode() if isinstance(ptx, (bytes, bytearray)) else ptx
    ops = sorted({ln.split()[0] for ln in ptx.splitlines() if any(w in ln for w in ("tanh.", "ex2.", "div."))})
    print("RESULT " + json.dumps({"launch_bounds": "__launch_bounds__(256)" in src, "ops": ops}))
''')


def test_the_notes_claims_about_generated_code_hold(tmp_path: Path) -> None:
    """CuTe: default tanh is ex2+rcp, approx=True the hardware tanh, exp is ex2.approx, `/` is IEEE. TIRx (fast
    math always on): expf/tanhf/`/` become ex2.approx, tanh.approx and div.approx, `Tx.ptx["div.rn.f32"]` stays
    exact, and every kernel carries __launch_bounds__ of its thread extent."""
    runs = _run_all({"cute_ptx": CUTE_PTX, "tirx_ptx": TIRX_PTX}, tmp_path)
    results = {}
    for key, run in runs.items():
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line, f"{key} failed (exit {run.returncode}):\n{run.stderr[-3000:]}"
        results[key] = json.loads(line[len("RESULT "):])
    cute = results["cute_ptx"]
    assert "tanh.approx.f32" not in cute["tanh"] and {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"} <= set(cute["tanh"])
    assert cute["tanh_approx"] == ["tanh.approx.f32"]
    assert cute["exp"] == ["ex2.approx.ftz.f32"]
    assert cute["div"] == ["div.rn.f32"]
    tirx = results["tirx_ptx"]
    assert tirx["launch_bounds"]
    assert {"tanh.approx.f32", "ex2.approx.ftz.f32", "div.approx.ftz.f32", "div.rn.f32"} <= set(tirx["ops"])


#: The table rows of each note's fast-math section, by the case names of scripts/check_notes_accuracy.py.
NOTE_CASES = {
    "cute": ("exp", "exp_fastmath", "exp2", "tanh", "tanh_approx", "div", "rcp_approx", "sigmoid", "silu"),
    "tirx": ("exp", "ptx_ex2", "tanh", "div", "ptx_div_rn", "ptx_rcp", "sigmoid", "silu"),
}


def test_the_notes_figures_are_the_committed_h200_measurements() -> None:
    """Each ulp figure in a note's table is the H200 run's (validation/h200-notes-accuracy.json), rounded as printed;
    the 'all but 0.02 % round to the same bf16' and '227 KB launches, 228 KB is refused' claims hold there too."""
    data = json.loads((ROOT / "validation" / "h200-notes-accuracy.json").read_text(encoding="utf-8"))
    assert "H200" in data["provenance"]["gpu"]["name"]
    records = {(r["dsl"], r["case"]): r for r in data["records"]}
    for dsl, cases in NOTE_CASES.items():
        note = (ROOT / "docs" / "guides" / f"{dsl}-notes.md").read_text(encoding="utf-8")
        for case in cases:
            r = records[(dsl, case)]
            ulp = r["max_ulp_fp32"]
            shown = f"{ulp:.0f} ulp" if ulp >= 10 else f"{ulp:.1f} ulp"
            assert shown in note, f"{dsl} {case}: the H200 measured {ulp:.3g} ulp; the note should say {shown}"
            assert r["bf16_mismatch_fraction"] <= 0.0002 and r["bf16_max_ulp_diff"] <= 1, (dsl, case)
        for kb in (96, 160, 200, 227, 228):  # up to 227 KB launched with exact output; 228 KB refused
            assert records[(dsl, f"smem_{kb}KB")]["as_expected"], (dsl, kb)
        assert records[(dsl, "smem_227KB")]["correct"] and not records[(dsl, "smem_228KB")]["ok"]
