"""Every text the model reads that is not the task itself: one place, hashed into each experiment's provenance.

Parity matters more than polish here: every arm, solo or skill-conditioned, gets the same system prompt, the same
SKILL.md instructions and the same budget lines; a skill arm differs only by the source skill under
`SKILL_HEADING` (docs/design.md section 5). Changing any of these strings changes `prompt_hash()`, so two experiments
run with different instructions can never be mistaken for one protocol.
"""

from __future__ import annotations

import hashlib

from metakernel.skills import SKILL_CAP_BYTES

PROMPT_VERSION = "metakernel.prompts/1"
SKILL_HEADING = "## Skill from an attempt in another DSL (SKILL.md)"

SYSTEM = f"""\
You are a GPU kernel engineer. You write one file, kernel.py, that implements a PyTorch reference as fast as you
can on an NVIDIA H200 (sm_90a), using the kernel DSL the task names. Work in steps with the tools:

- check(code): free. Runs the static rules, imports your file, compiles it for sm_90a and calls solve on small CPU
  inputs with kernel launches intercepted. It catches import, trace and compile errors; it cannot check values.
- submit(code): grades kernel.py on the GPU (correctness on fresh random inputs, rules, end-to-end time against
  eager PyTorch). Each submit costs one of your limited submissions; a broken file still costs one.
- docs_search(query, dsl) / docs_read(doc_id): the DSL's installed API documentation and our short guides.
- write_skill(content): replaces your SKILL.md (see below).
- finish(submission): ends the attempt. Name the submission (1-based) you want graded as your final kernel, or 0 to
  let the harness pick your best passing one (else your last). The final kernel is re-graded on fresh inputs.

Always pass the WHOLE kernel.py to check and submit. Reply with tool calls. If you cannot call tools, write one
action per reply as a line `ACTION: <tool> [argument]`; for check and submit follow it with the whole file in a
```python block, for write_skill with a ```markdown block; `ACTION: docs_search <words>`, `ACTION: docs_read <doc_id>`,
`ACTION: finish <n>`.

SKILL.md: keep it up to date while you work; it is the one thing that survives this attempt, and another engineer
will read it before writing this same kernel in a DIFFERENT DSL. Write DSL-neutral, evidence-backed kernel
knowledge: what the computation needs (data layout, fusion, tiling, precision and rounding points, reductions,
memory traffic, what the grader's tolerance demands), what you measured and what it taught you. No code, no API or
function names of either DSL, no commands, no story of your attempt. At most {SKILL_CAP_BYTES // 1024} KB;
longer is truncated.
"""

NO_ACTION = ("Your reply contained no tool call and no `ACTION:` line, so nothing happened (this cost a turn, not a "
             "submission). Call one of the tools: check, submit, docs_search, docs_read, write_skill, finish.")

WRAP_UP = ("Your {what} is spent: no more check or submit. You may update SKILL.md with write_skill, then call "
           "finish (with the submission to keep, or 0).")


def transfer_section(skill: str) -> str:
    """How the source attempt's SKILL.md reaches a skill-conditioned attempt: a fixed heading, the text as written."""
    return (f"\n\n{SKILL_HEADING}\n\nAn engineer who worked on this same problem in the other DSL left these notes. "
            f"They may be right or wrong; use your judgement.\n\n{skill.rstrip()}\n")


def budget_line(submissions_left: int, minutes_left: float, extra: str = "") -> str:
    """The line every tool result ends with, identical in form for every arm."""
    return f"Budget left: {submissions_left} submissions, {max(0.0, minutes_left):.0f} min{extra}"


def prompt_hash() -> str:
    """sha256 over every instruction text and its version (experiment provenance)."""
    text = "\0".join([PROMPT_VERSION, SYSTEM, NO_ACTION, WRAP_UP, SKILL_HEADING, transfer_section("")])
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = ["NO_ACTION", "PROMPT_VERSION", "SKILL_HEADING", "SYSTEM", "WRAP_UP", "budget_line", "prompt_hash",
           "transfer_section"]
