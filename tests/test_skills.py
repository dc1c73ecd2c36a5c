"""SKILL.md handling: the byte cap (UTF-8 safe, marked), every lint rule, diffs, and the `skills` commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from metakernel.cli_skills import skill_files, skills
from metakernel.errors import UserError
from metakernel.skills import SKILL_CAP_BYTES, Finding, cap_skill, diff_skills, lint_skill, truncation_marker

CLEAN = """# Row-wise reductions over a wide hidden dimension

- One block per row with 256 threads and 8-element vector loads reached 2.9 TB/s (87% of peak bandwidth);
  scalar loads stopped at 1.1 TB/s.
- Accumulate in fp32 and round once at the end: rounding per step failed the tolerance at 8192 columns.
- A second pass over the row from global memory cost 1.4x; keeping the row in registers avoided it.
"""


def _budget(original_bytes: int) -> int:
    return SKILL_CAP_BYTES - len(("\n" + truncation_marker(original_bytes) + "\n").encode())


def codes(text: str) -> list[str]:
    return [f.code for f in lint_skill(text)]


# ---------------------------------------------------------------------------------------------------------- cap


def test_cap_keeps_a_skill_of_exactly_the_cap():
    """Invariant: 16384 bytes is allowed as is, for ASCII and for multi-byte text alike."""
    for text in ("a" * SKILL_CAP_BYTES, "é" * (SKILL_CAP_BYTES // 2)):
        capped = cap_skill(text)
        assert capped.text == text and not capped.truncated and capped.original_bytes == SKILL_CAP_BYTES


def test_cap_cuts_one_byte_over_and_marks_it():
    text = "a" * (SKILL_CAP_BYTES + 1)
    capped = cap_skill(text)
    assert capped.truncated and capped.original_bytes == SKILL_CAP_BYTES + 1
    assert len(capped.text.encode()) <= SKILL_CAP_BYTES
    assert capped.text.endswith("\n" + truncation_marker(SKILL_CAP_BYTES + 1) + "\n")
    assert capped.text.startswith("a" * _budget(SKILL_CAP_BYTES + 1))
    assert "16385 bytes exceeded the 16384-byte cap" in capped.text


@pytest.mark.parametrize("char", ["é", "€", "🙂"])
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_cap_never_splits_a_multibyte_character(char, shift):
    """Invariant: the cut drops a character that straddles the budget whole; the result is valid, within the cap."""
    width = len(char.encode())
    text = "a" * (_budget(SKILL_CAP_BYTES + 4000) - shift) + char * (4000 // width + 2)
    original = len(text.encode())
    capped = cap_skill(text)
    data = capped.text.encode("utf-8")  # would raise on a broken character
    assert capped.truncated and len(data) <= SKILL_CAP_BYTES and capped.original_bytes == original
    kept = capped.text[: -len(truncation_marker(original)) - 1].rstrip("\n")
    assert text.startswith(kept)
    assert len(kept.encode()) > _budget(original) - width  # only the straddling character was dropped
    assert capped.text.endswith(truncation_marker(original) + "\n")


def test_cap_keeps_the_marker_on_its_own_line():
    text = ("line of text\n" * 2000)
    capped = cap_skill(text)
    assert capped.truncated and capped.text.splitlines()[-1] == truncation_marker(len(text.encode()))
    assert len(capped.text.encode()) <= SKILL_CAP_BYTES


# --------------------------------------------------------------------------------------------------------- lint


def test_clean_skill_has_no_findings():
    assert lint_skill(CLEAN) == []


@pytest.mark.parametrize("text", ["", "   \n\n  \t\n"])
def test_empty(text):
    assert lint_skill(text) == [Finding("empty", 0, lint_skill(text)[0].message)]
    assert "empty" in lint_skill(text)[0].message


def test_over_cap_names_the_line_where_the_cut_falls():
    text = CLEAN + ("- padding line that repeats 1.5x\n" * 600)
    found = [f for f in lint_skill(text) if f.code == "over-cap"]
    assert len(found) == 1 and f"over the {SKILL_CAP_BYTES}-byte cap" in found[0].message
    lines = text.splitlines(keepends=True)
    assert len("".join(lines[: found[0].line - 1]).encode()) < SKILL_CAP_BYTES
    assert len("".join(lines[: found[0].line]).encode()) >= SKILL_CAP_BYTES


def test_fenced_code_block_is_one_finding_and_hides_its_contents():
    text = CLEAN + "\n```python\nimport cutlass.cute as cute\n$ pip install x\n```\n"
    found = [f for f in lint_skill(text) if f.line > len(CLEAN.splitlines())]
    assert [(f.code, f.line) for f in found] == [("code-block", len(CLEAN.splitlines()) + 2)]
    assert "(4 lines)" in found[0].message
    assert "code-block" in codes(CLEAN + "\n~~~\nunterminated fence\n")


def test_indented_code_block_but_not_a_list_continuation():
    indented = CLEAN + "\nExample:\n\n    x = load(ptr)\n    y = x * 2\n"
    found = [f for f in lint_skill(indented) if f.code == "code-block"]
    assert len(found) == 1 and found[0].line == len(CLEAN.splitlines()) + 4 and "(2 lines)" in found[0].message
    continuation = CLEAN + "\n- a list item about tiles of 128 rows\n\n    continues the item in prose\n"
    assert "code-block" not in codes(continuation)


@pytest.mark.parametrize("line,names", [
    ("Use cute.make_layout with a stride of 1.", "cute.make_layout"),
    ("Decorate with @cute.kernel and launch once.", "@cute.kernel"),
    ("Tx.alloc_shared gives the staging buffer.", "Tx.alloc_shared"),
    ("A T.grid loop over tiles.", "T.grid"),
    ("Mark the entry with prim_func and compile with tvm.compile.", "prim_func, tvm.compile"),
    ("tirx lowers it; cutlass.Float32 accumulates.", "cutlass.Float32, tirx"),
    ("Call __syncthreads between phases; local_tile splits it.", "local_tile, __syncthreads"),
])
def test_dsl_identifiers(line, names):
    found = [f for f in lint_skill(CLEAN + line + "\n") if f.code == "dsl-identifier"]
    assert len(found) == 1 and found[0].line == len(CLEAN.splitlines()) + 1
    assert set(found[0].message.removeprefix("DSL API names: ").split(", ")) == set(names.split(", "))


@pytest.mark.parametrize("line", ["$ python kernel.py", "pip install nvidia-cutlass-dsl", "python -m pytest",
                                  "nvcc -arch=sm_90a k.cu", "ncu --set full python run.py",
                                  "Profile it with ncu --set full first.", "export CUDA_VISIBLE_DEVICES=0",
                                  "  > $ nsys profile x"])
def test_shell_commands(line):
    assert "shell-command" in codes(CLEAN + line + "\n")


@pytest.mark.parametrize("line", ["Make the tile 128 wide.", "Pipelining hides the 600-cycle latency.",
                                  "Exports of partial sums cost 3 us."])
def test_prose_is_not_a_shell_command(line):
    assert "shell-command" not in codes(CLEAN + line + "\n")


def test_dsl_name_in_prose_is_soft():
    found = [f for f in lint_skill(CLEAN + "In CuTe DSL this was easy; TIRx too.\n") if f.code == "dsl-name"]
    assert len(found) == 1 and found[0].soft and "CuTe DSL, TIRx" in found[0].message
    assert "dsl-name" not in codes(CLEAN + "cute.make_layout helps.\n")  # already an identifier finding


@pytest.mark.parametrize("line", ["I tried vector loads first.", "Then we noticed a bank conflict.",
                                  "My kernel failed at submission 3."])
def test_narrative_is_soft(line):
    found = [f for f in lint_skill(CLEAN + line + "\n") if f.code == "narrative"]
    assert len(found) == 1 and found[0].soft


@pytest.mark.parametrize("evidence", ["1.8x faster", "took 40% of the time", "12 us per call", "3.1 TB/s",
                                      "900 TFLOPS", "measured: 4 stages beat 2", "a speedup of 2 over eager"])
def test_evidence_words_satisfy_the_evidence_rule(evidence):
    assert "no-evidence" not in codes(f"- Double buffering helps: {evidence}.\n")


@pytest.mark.parametrize("text", ["- Double buffering helps a lot.\n", "- Use 128 threads and 4 warps.\n",
                                  "- Tiles of 4x4 are good.\n"])
def test_no_evidence_is_soft(text):
    found = [f for f in lint_skill(text) if f.code == "no-evidence"]
    assert len(found) == 1 and found[0].soft and found[0].line == 0


def test_findings_are_sorted_and_printable():
    found = lint_skill("$ pip install x\nuse cute.make_layout\n")
    assert [(f.line, f.code) for f in found] == sorted((f.line, f.code) for f in found)
    assert str(found[0]) == "file: [no-evidence (soft)] " + found[0].message
    assert str(found[1]).startswith("line 1: [shell-command] shell command: $ pip install x")


# --------------------------------------------------------------------------------------------------------- diff


def test_diff_identical_is_empty_and_changes_are_unified():
    assert diff_skills(CLEAN, CLEAN, "a", "b") == ""
    changed = CLEAN.replace("2.9 TB/s", "3.0 TB/s")
    text = diff_skills(CLEAN, changed, "solo/SKILL.md", "other/SKILL.md")
    assert text.startswith("--- solo/SKILL.md\n+++ other/SKILL.md\n@@ ")
    assert "\n-- One block per row with 256 threads and 8-element vector loads reached 2.9 TB/s" in text
    assert "\n+- One block per row with 256 threads and 8-element vector loads reached 3.0 TB/s" in text


def test_diff_marks_a_missing_final_newline():
    text = diff_skills("a\nb", "a\nc", "x", "y")
    assert text.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")


# ---------------------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "m" / "p28_r1_solo_cute").mkdir(parents=True)
    (tmp_path / "m" / "p28_r2_solo_cute").mkdir(parents=True)
    (tmp_path / "m" / "p28_r1_solo_cute" / "SKILL.md").write_text(CLEAN)
    (tmp_path / "m" / "p28_r2_solo_cute" / "SKILL.md").write_text(CLEAN + "Use cute.make_layout.\n")
    (tmp_path / "m" / "notes.md").write_text("not a skill\n")
    return tmp_path


def test_skill_files_finds_skill_md_recursively_once(tree):
    first = tree / "m" / "p28_r1_solo_cute" / "SKILL.md"
    found = skill_files((tree, first))
    assert found == sorted(tree.rglob("SKILL.md")) and len(found) == 2
    with pytest.raises(UserError, match="no such file or directory"):
        skill_files((tree / "nope",))


def test_cli_lint_reports_per_file_and_strict_exit(tree):
    runner = CliRunner()
    result = runner.invoke(skills, ["lint", str(tree)])
    assert result.exit_code == 0, result.output
    assert f"{tree}/m/p28_r1_solo_cute/SKILL.md: 0 findings" in result.output
    assert f"{tree}/m/p28_r2_solo_cute/SKILL.md: 1 finding\n  line 7: [dsl-identifier]" in result.output
    assert runner.invoke(skills, ["lint", str(tree), "--strict"]).exit_code == 1
    clean = tree / "m" / "p28_r1_solo_cute" / "SKILL.md"
    assert runner.invoke(skills, ["lint", str(clean), "--strict"]).exit_code == 0
    data = json.loads(runner.invoke(skills, ["lint", str(tree), "--json"]).output)
    assert data[str(tree / "m" / "p28_r2_solo_cute" / "SKILL.md")][0]["code"] == "dsl-identifier"
    empty = tree / "empty"
    empty.mkdir()
    result = runner.invoke(skills, ["lint", str(empty)])
    assert isinstance(result.exception, UserError) and "no SKILL.md found" in str(result.exception)


def test_cli_diff_accepts_files_and_attempt_directories(tree):
    runner = CliRunner()
    one, two = tree / "m" / "p28_r1_solo_cute", tree / "m" / "p28_r2_solo_cute"
    result = runner.invoke(skills, ["diff", str(one), str(two)])
    assert result.exit_code == 0
    assert result.output.startswith(f"--- {one}\n+++ {two}\n") and "+Use cute.make_layout.\n" in result.output
    result = runner.invoke(skills, ["diff", str(one / "SKILL.md"), str(one)])
    assert result.output == "identical\n"
    result = runner.invoke(skills, ["diff", str(one), str(tree / "m")])
    assert isinstance(result.exception, UserError) and "no such file" in str(result.exception)


# ------------------------------------------------------------------------------------------- list/show (store)


@pytest.fixture
def experiment(tmp_path):
    from tests.test_export import make_experiment

    return make_experiment(tmp_path / "exp")


def test_skill_outcomes_name_the_pair_each_solo_skill_fed(experiment):
    """Invariant: a solo attempt r's skill is judged by skill arm r vs target solo r, exactly as the report's pairs."""
    from metakernel.skill_outcomes import skill_outcomes
    from metakernel.store import Store
    from tests.test_export import MODEL, SLUG

    with Store(experiment) as store:
        found = {r["address"]: r for r in skill_outcomes(store)}
        assert skill_outcomes(store, model="someone/else") == []
        assert len(skill_outcomes(store, model=SLUG)) == len(found) == 8
    expected = {  # source address -> (pair class, c_skill, c_solo, skill tier, solo tier)
        "p01_r1_solo_cute": ("helped", 1.5, 1.0, 3, 3),
        "p01_r1_solo_tirx": ("harmed", 0.05, 2.0, 0, 4),
        "p01_r2_solo_tirx": ("neutral", 0.051, 0.05, 1, 0),
        "p28_r1_solo_cute": ("both_failed", 0.05, 0.05, 0, 0),
        "p28_r1_solo_tirx": ("helped", 3.0, 0.05, 4, 0),
        "p28_r2_solo_cute": ("neutral", 1.21, 1.2, 3, 3),
    }
    for address, (cls, c_skill, c_solo, t_skill, t_solo) in expected.items():
        rec = found[address]
        assert (rec["pair_class"], rec["skill_tier"], rec["solo_tier"]) == (cls, t_skill, t_solo), address
        assert rec["c_skill"] == pytest.approx(c_skill) and rec["c_solo"] == pytest.approx(c_solo), address
    tirx = found["p01_r1_solo_tirx"]
    assert tirx["direction"] == "tirx2cute" and tirx["fed"] == f"{SLUG}/p01_r1_tirx2cute_skill"
    assert tirx["compared_with"] == f"{SLUG}/p01_r1_solo_cute" and tirx["model"] == MODEL
    assert tirx["source_status"] == "passed" and tirx["source_speedup"] == 1.0 and tirx["source_tier"] == 3
    assert found["p28_r2_solo_tirx"]["pair_class"] == "pending"  # its skill arm failed on infrastructure
    own = found["p01_r1_cute2tirx_skill"]  # a skill arm's own SKILL.md feeds nothing
    assert own["fed"] is None and own["pair_class"] is None and own["source_tier"] == 3
    cut = found["p28_r1_solo_cute"]
    assert cut["truncated"] and cut["original_bytes"] == 20000 and cut["lint_findings"] == 1
    assert cut["source_status"] == "compile_error" and cut["source_speedup"] is None


def test_cli_list_prints_one_row_per_skill_with_its_pair(experiment):
    from tests.test_export import SLUG

    runner = CliRunner()
    result = runner.invoke(skills, ["list", str(experiment)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["ATTEMPT", "MODEL", "ARM", "SOURCE", "SRC_TIER", "BYTES", "TRUNC", "LINT", "PAIR",
                                "C_SKILL", "C_SOLO", "TIERS"]
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert len(rows) == 8
    assert rows["p01_r1_solo_tirx"][3:] == ["passed", "1.00x", "3", "147", "no", "0", "harmed", "0.05", "2.00", "0/4"]
    assert rows["p28_r1_solo_cute"][3:] == ["compile_error", "0", "147", "yes", "1", "both_failed", "0.05", "0.05",
                                            "0/0"]
    assert rows["p01_r1_cute2tirx_skill"][-4:] == ["—", "—", "—", "—"]
    assert lines[-1] == "8 skills; pairs fed: 1 both_failed, 1 harmed, 2 helped, 2 neutral, 1 pending"
    data = json.loads(runner.invoke(skills, ["list", str(experiment), "--json", "--model", SLUG]).output)
    assert [r["address"] for r in data] == [line.split()[0] for line in lines[1:-1]]
    assert {r["pair_class"] for r in data} == {"helped", "harmed", "neutral", "both_failed", "pending", None}
    result = runner.invoke(skills, ["list", str(experiment), "--model", "nope"])
    assert isinstance(result.exception, UserError) and "unknown model 'nope' (models: acme/coder-1)" in str(
        result.exception)
    result = runner.invoke(skills, ["list", str(experiment.parent)])
    assert isinstance(result.exception, UserError) and "not an experiment directory" in str(result.exception)


def test_cli_show_prints_header_findings_and_text(experiment):
    from tests.test_export import MODEL, SLUG

    runner = CliRunner()
    result = runner.invoke(skills, ["show", str(experiment), "p28_r1_solo_cute"])
    assert result.exit_code == 0, result.output
    head, _, text = result.output.partition("\n\n")
    assert head.splitlines() == [
        f"# {SLUG}/p28_r1_solo_cute  (model {MODEL}, problem 28 mlp_norm, arm solo_cute, replicate 1)",
        "# source: compile_error, tier 0",
        "# skill: 147 bytes, truncated from 20000, sha256 abababababab",
        f"# fed: {SLUG}/p28_r1_cute2tirx_skill vs {SLUG}/p28_r1_solo_tirx (cute2tirx): both_failed, c_skill 0.05, "
        "c_solo 0.05, tiers 0/0",
        "# lint: 1 finding",
        "#   line 3: [dsl-identifier] names cute.make_layout",
    ]
    assert text.startswith("# Wide row reductions") and text.endswith("<!-- p28_r1_solo_cute -->\n")
    full = runner.invoke(skills, ["show", str(experiment), f"{SLUG}/p28_r1_solo_cute", "--model", MODEL])
    assert full.output == result.output
    pending = runner.invoke(skills, ["show", str(experiment), "p28_r2_solo_tirx"]).output
    assert "(tirx2cute): pending\n" in pending
    own = runner.invoke(skills, ["show", str(experiment), "p01_r1_cute2tirx_skill"]).output
    assert "# fed: no pair" in own


def test_cli_show_unknown_address_lists_close_ones(experiment):
    runner = CliRunner()
    result = runner.invoke(skills, ["show", str(experiment), "p28_r1_solo_cut"])
    assert isinstance(result.exception, UserError)
    assert "no skill at 'p28_r1_solo_cut'; close: p28_r1_solo_cute" in str(result.exception)
    result = runner.invoke(skills, ["show", str(experiment), "p01_r2_solo_cute"])  # wrote no skill
    assert isinstance(result.exception, UserError)
    assert "attempt 'p01_r2_solo_cute' wrote no SKILL.md (state done, status wrong); close: " in str(result.exception)
