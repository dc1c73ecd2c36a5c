"""SKILL.md handling: the 16 KB cap, a diagnostic linter, and diffs between skills.

A skill is meant to be evidence-backed, DSL-neutral kernel knowledge: no code, API names, commands or
narratives (DESIGN 5). The linter only reports; skills are transferred exactly as written (after the cap), so
an experiment measures what models actually write, and the findings become a covariate of the analysis.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

SKILL_CAP_BYTES = 16384

#: Identifiers that tie a skill to one DSL: module paths, decorators and the API names kernels use most.
DSL_IDENTIFIERS = (
    # CuTe DSL / CUTLASS
    r"@cute\.(?:kernel|jit)", r"\bcute\.\w+", r"\bcutlass\.\w+", r"\bcute_dsl\b", r"\bfrom_dlpack\b",
    r"\bmake_layout\w*", r"\bmake_tensor\b", r"\bmake_fragment\w*", r"\bmake_rmem_tensor\b", r"\blocal_tile\b",
    r"\blocal_partition\b", r"\bzipped_divide\b", r"\blogical_divide\b", r"\btiled_divide\b",
    r"\bmake_tiled_copy\w*", r"\bmake_tiled_mma\b", r"\bTiledCopy\b", r"\bTiledMma\b", r"\bCopyAtom\b",
    r"\bmake_copy_atom\b", r"\bmark_layout_dynamic\b", r"\bget_tma_copy\b", r"\brange_constexpr\b",
    r"\bconst_expr\b", r"\bthread_idx\b", r"\bblock_idx\b", r"\bsync_threads\b",
    # TVM / TIRx
    r"\bTx\.\w+", r"\bT\.\w+", r"\btvm\.\w+", r"\btirx\b", r"\bprim_func\b", r"\bmatch_buffer\b",
    r"\balloc_shared\b", r"\balloc_local\b", r"\balloc_buffer\b", r"\bdecl_buffer\b", r"\bthread_binding\b",
    r"\bcta_id\b", r"\bthread_id\b", r"\bdevice_entry\b", r"\btir_pipeline\b", r"\bir_module\b",
    r"\bT\.grid\b", r"\bT\.serial\b", r"\bT\.vectorized\b",
    # CUDA spellings that are code rather than concepts
    r"\b__syncthreads\b", r"\b__shfl\w*", r"\bthreadIdx\.\w\b", r"\bblockIdx\.\w\b", r"\bcp\.async\w*",
)
_IDENTIFIER = re.compile("|".join(DSL_IDENTIFIERS))
#: Shell command lines: a prompt, or a line starting with a tool name.
_SHELL = re.compile(
    r"^\s*(?:>\s*)?(?:\$\s+\S|(?:sudo\s+)?(?:pip3?|uv|conda|apt(?:-get)?|nvcc|ncu|nsys|nvidia-smi|cuobjdump|"
    r"git|metakernel)\s+\S|python3?\s+(?:-m\s+)?\S|export\s+\w+=)")
_SHELL_INLINE = re.compile(r"\b(?:pip3? install\b|python3? -m\b|nvcc\s+-|ncu\s+-|nsys profile\b)")
_DSL_NAME = re.compile(r"\b(?:cute(?:\s+dsl)?|cutlass|tirx|tvm(?:script)?)\b(?!\.)", re.IGNORECASE)
#: Evidence: a number with a unit of time, bandwidth or throughput, a ratio or a percentage; or a number beside
#: a word that says it was measured.
_MEASUREMENT = re.compile(
    r"\d(?:[\d.,]*\d)?\s*(?:x\b|×|%|(?:us|µs|ms|ns|s|sec|seconds?|cycles?|[GT]i?B/s|T?FLOPS?|GFLOPS?)(?!\w))",
    re.IGNORECASE)
_EVIDENCE_WORD = re.compile(r"\b(?:measured|speedups?|faster|slower|latency|throughput|bandwidth|profil\w*|"
                            r"benchmark\w*)\b", re.IGNORECASE)
_NARRATIVE = re.compile(
    r"\b(?:I|we)\s+(?:tried|attempted|submitted|wrote|started|noticed|realized|realised|then|first|finally)\b|"
    r"\b(?:my|our)\s+(?:kernel|code|attempt|submission|first|second)\b|\bsubmission\s+#?\d", re.IGNORECASE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")


@dataclass(frozen=True)
class CappedSkill:
    """A skill as it is stored and transferred: at most SKILL_CAP_BYTES of UTF-8, with a marker when cut."""

    text: str
    truncated: bool
    original_bytes: int


@dataclass(frozen=True)
class Finding:
    """One linter finding; `line` is 1-based (0: the whole file); soft findings are hints, not violations."""

    code: str
    line: int
    message: str
    soft: bool = False

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        return f"{where}: [{self.code}{' (soft)' if self.soft else ''}] {self.message}"


def truncation_marker(original_bytes: int) -> str:
    """The last line of a truncated skill: the model and a reader both see that the end is missing."""
    return f"[SKILL.md truncated: {original_bytes} bytes exceeded the {SKILL_CAP_BYTES}-byte cap; the rest was cut]"


def cap_skill(text: str) -> CappedSkill:
    """Cut `text` to SKILL_CAP_BYTES of UTF-8 (marker line included), never inside a multi-byte character."""
    data = text.encode("utf-8")
    if len(data) <= SKILL_CAP_BYTES:
        return CappedSkill(text, False, len(data))
    marker = truncation_marker(len(data))
    budget = SKILL_CAP_BYTES - len(("\n" + marker + "\n").encode("utf-8"))
    kept = data[:budget].decode("utf-8", errors="ignore")  # drops only a trailing partial character
    if not kept.endswith("\n"):
        kept += "\n"
    return CappedSkill(kept + marker + "\n", True, len(data))


def _fenced_lines(lines: list[str]) -> tuple[set[int], list[tuple[int, int]]]:
    """0-based indexes of lines inside ``` / ~~~ fences (fence lines included), and each block's (start, length)."""
    inside: set[int] = set()
    blocks = []
    fence, start = "", 0
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if fence:
            inside.add(i)
            if stripped.startswith(fence):
                blocks.append((start, i - start + 1))
                fence = ""
        elif stripped.startswith(("```", "~~~")):
            fence, start = stripped[:3], i
            inside.add(i)
    if fence:
        blocks.append((start, len(lines) - start))
    return inside, blocks


def _indented_blocks(lines: list[str], fenced: set[int]) -> list[tuple[int, int]]:
    """Markdown indented code: 4+ spaces (or a tab) after a blank line, unless it continues a list item."""
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if (i not in fenced and line.strip() and line.startswith(("    ", "\t"))
                and (i == 0 or not lines[i - 1].strip())):
            j = i
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(("    ", "\t"))):
                j += 1
            while j > i and not lines[j - 1].strip():  # trailing blank lines are not part of the block
                j -= 1
            if not _in_list(lines, i):
                blocks.append((i, j - i))
            i = j
        else:
            i += 1
    return blocks


def _in_list(lines: list[str], index: int) -> bool:
    """Whether the nearest unindented non-blank line above is a list item (the indented text continues it)."""
    for j in range(index - 1, -1, -1):
        if lines[j].strip() and not lines[j].startswith((" ", "\t")):
            return bool(_LIST_ITEM.match(lines[j]))
    return False


def lint_skill(text: str) -> list[Finding]:
    """Diagnostic findings for a SKILL.md, sorted by line.

    Codes: `empty`; `over-cap` (bytes beyond SKILL_CAP_BYTES: the tail would be cut); `code-block` (fenced or
    indented); `dsl-identifier` (module paths, decorators and API names of either DSL: see DSL_IDENTIFIERS);
    `shell-command` ($ prompts, pip, python -m, nvcc, ncu, ...); soft: `dsl-name` (naming a DSL in prose),
    `narrative` (a story of the attempt instead of knowledge), `no-evidence` (no number with a unit anywhere).
    Lines inside fenced code are reported once as the block, not again per rule.
    """
    if not text.strip():
        return [Finding("empty", 0, "the skill is empty: write what you learned (evidence-backed, DSL-neutral)")]
    findings = []
    size = len(text.encode("utf-8"))
    lines = text.splitlines()
    if size > SKILL_CAP_BYTES:
        cut_line = len(text.encode("utf-8")[:SKILL_CAP_BYTES].decode("utf-8", errors="ignore").splitlines())
        findings.append(Finding("over-cap", cut_line, f"{size} bytes, over the {SKILL_CAP_BYTES}-byte cap: "
                                                      "everything after this line is cut"))
    fenced, blocks = _fenced_lines(lines)
    for start, length in blocks + _indented_blocks(lines, fenced):
        findings.append(Finding("code-block", start + 1, f"code block ({length} lines): describe the technique "
                                                         "in words, without code"))
    for number, line in enumerate(lines, start=1):
        if number - 1 in fenced:
            continue
        names = list(dict.fromkeys(m.group(0) for m in _IDENTIFIER.finditer(line)))
        if names:
            findings.append(Finding("dsl-identifier", number, f"DSL API names: {', '.join(names[:6])}"))
        if _SHELL.match(line) or _SHELL_INLINE.search(line):
            findings.append(Finding("shell-command", number, f"shell command: {line.strip()[:80]}"))
        prose = _IDENTIFIER.sub("", line)
        dsl_names = list(dict.fromkeys(m.group(0) for m in _DSL_NAME.finditer(prose)))
        if dsl_names:
            findings.append(Finding("dsl-name", number, f"names a DSL ({', '.join(dsl_names)}): keep the skill "
                                                        "DSL-neutral", soft=True))
        if _NARRATIVE.search(line):
            findings.append(Finding("narrative", number, "reads as a story of the attempt: state the lesson and "
                                                         "its evidence instead", soft=True))
    if not (_MEASUREMENT.search(text) or (re.search(r"\d", text) and _EVIDENCE_WORD.search(text))):
        findings.append(Finding("no-evidence", 0, "no measurements (e.g. 1.8x, 40%, 12 us, 3.1 TB/s): back "
                                                  "each claim with what was measured", soft=True))
    return sorted(findings, key=lambda f: (f.line, f.code))


def diff_skills(a_text: str, b_text: str, a_name: str = "a/SKILL.md", b_name: str = "b/SKILL.md") -> str:
    """Unified diff of two skills ("" when identical); each line ends with a newline."""
    a_lines = a_text.splitlines(keepends=True)
    b_lines = b_text.splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(a_lines, b_lines, fromfile=a_name, tofile=b_name):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
