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
