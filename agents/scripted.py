"""Offline models (`scripted/<policy>`) behind litellm's real custom-provider hook, for tests and demos.

`register()` puts a `litellm.CustomLLM` under the provider name "scripted" into `litellm.custom_provider_map`, so a
call goes `LLMClient.complete -> litellm.acompletion -> handler` exactly as a hosted model's would, and answers come
back as litellm `ModelResponse`s with native tool calls and estimated token usage (about four characters a token).

A policy is stateless: its next action is a pure function of the messages so far (`next_action`), read from the task
heading ``# Problem NN: slug (CuTe DSL|TIRx variant)``, the transfer-skill heading and the tool results already in
the conversation. Policies:

- `gold`: docs_search; a deliberately broken kernel (the gold file plus ``import triton``, a static-rule violation
  that costs no GPU time); the gold kernel; write_skill; finish(0). Without a gold kernel for that DSL it submits a
  broken stub (a `solve` that returns its inputs, plus the same import) once instead of both kernels.
- `gold-text`: the same actions in the text protocol (``ACTION: ...`` lines and fenced blocks, no tool calls).
- `noskill`: `gold` without write_skill.
- `garbage`: cycles through free text, malformed tool arguments, an empty submit, a non-Python submit, unknown
  tools and an unknown text action; it never finishes, so only the loop's budgets end it.
- `flaky`: `gold`, except that a call raises a 503 (`litellm.ServiceUnavailableError`, ``Retry-After: 0``) when
  its *pseudo-key* contains an entry of ``METAKERNEL_SCRIPTED_FAIL`` (comma-separated substrings). The handler never
  sees the loop's ``<attempt_id>#<turn>`` key, so it builds ``p<NN>_<arm>#<turn>`` from the messages: the arm from
  the task's DSL and whether a transfer skill is present (``p28_solo_cute``, ``p28_cute2tirx_skill``), the turn as
  the number of assistant messages already sent (0 for the first call). The replicate is invisible, so an entry
  matches every replicate. ``*`` matches every call; ``SUBSTR@N`` fails only the first N matching calls of this
  process, for retry-then-recover tests.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metakernel.agents.prompts import SKILL_HEADING

from metakernel.gold import solutions_dir

PROVIDER = "scripted"
POLICIES = ("gold", "gold-text", "noskill", "garbage", "flaky")
FAIL_ENV = "METAKERNEL_SCRIPTED_FAIL"

_HEADING = re.compile(r"^# Problem (?P<nn>\d+): (?P<slug>\S+) \((?P<dsl>CuTe DSL|TIRx) variant\)", re.MULTILINE)
_DSL_OF_NAME = {"CuTe DSL": "cute", "TIRx": "tirx"}
_RESULT_PREFIX = re.compile(r"^Result of (?P<tool>[a-z_]+):")
BROKEN_IMPORT = "import triton  # deliberately forbidden: the scripted model's first submission must fail\n"
BROKEN_STUB = f'''"""Scripted stub: no gold kernel exists for this problem in this DSL; returns its inputs."""

{BROKEN_IMPORT}

def solve(*inputs):
    return inputs
'''
"""What `gold` submits when there is no gold kernel: wrong twice over (no DSL launch, a forbidden import)."""


@dataclass(frozen=True)
class Conversation:
    """What a stateless policy reads from the messages so far."""

    number: int
    slug: str
    dsl: str
    has_skill: bool
    results: tuple[tuple[str, str], ...]  # (tool name, result text) in order
    turn: int  # assistant messages already sent

    @property
    def arm(self) -> str:
        """The arm this conversation belongs to, as far as the messages show it."""
        if not self.has_skill:
            return f"solo_{self.dsl}"
        source = "tirx" if self.dsl == "cute" else "cute"
        return f"{source}2{self.dsl}_skill"

    @property
    def pseudo_key(self) -> str:
        """``p<NN>_<arm>#<turn>``: what `flaky` matches ``METAKERNEL_SCRIPTED_FAIL`` against."""
        return f"p{self.number:02d}_{self.arm}#{self.turn}"


@dataclass(frozen=True)
class Action:
    """One reply: a tool call (raw JSON `arguments`, malformed on purpose for `garbage`) and/or free text."""

    tool: str | None
    arguments: str = "{}"
    text: str = ""


def _text(content: Any) -> str:
    """Message content as text, whether a string or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


def read_conversation(messages: Sequence[Mapping[str, Any]]) -> Conversation:
    """Parse the task heading, the transfer skill and the tool results out of a chat transcript."""
    first_user = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    match = _HEADING.search(first_user)
    if match is None:
        raise ValueError("scripted model: no '# Problem NN: slug (DSL variant)' heading in the first user message")
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    turn = 0
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            turn += 1
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                names[str(call.get("id"))] = str(function.get("name"))
        elif role == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id")), "")
            results.append((str(name), _text(message.get("content"))))
        elif role == "user":
            text = _text(message.get("content"))
            prefix = _RESULT_PREFIX.match(text)
            if prefix:
                results.append((prefix["tool"], text[prefix.end():].strip()))
    return Conversation(number=int(match["nn"]), slug=match["slug"], dsl=_DSL_OF_NAME[match["dsl"]],
                        has_skill=SKILL_HEADING in first_user, results=tuple(results), turn=turn)


def gold_kernel(number: int, dsl: str, root: Path | None = None) -> Path | None:
    """``solutions/<family>/<NN>_<slug>/correct/<dsl>.py`` if it exists (see metakernel.gold)."""
    found = sorted((root or solutions_dir()).glob(f"*/{number:02d}_*/correct/{dsl}.py"))
    return found[0] if found else None


def break_kernel(source: str) -> str:
    """The kernel with a forbidden import before its first import line: rejected by the static rules, unrun."""
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("import ", "from ")):
            return "".join(lines[:i]) + BROKEN_IMPORT + "".join(lines[i:])
    return BROKEN_IMPORT + source


def _status_line(text: str) -> str:
    """The grader's status line of a submit result ("submission 2: status: passed" -> "status: passed")."""
    for line in text.splitlines():
        at = line.find("status:")
        if at >= 0:
            return line[at:].strip()
    return "no status"


def skill_text(conv: Conversation) -> str:
    """A plausible SKILL.md: DSL-neutral, problem-specific, every bullet tied to a result seen in this attempt."""
    topic = conv.slug.replace("_", " ")
    submits = [text for tool, text in conv.results if tool == "submit"]
    statuses = [_status_line(text) for text in submits]
    lines = [f"# {topic} (problem {conv.number})", "", "## Evidence from this attempt"]
    for i, (text, status) in enumerate(zip(submits, statuses, strict=True), 1):
        lines.append(f"- Submission {i} graded '{status}'.")
        speed = next((line.strip() for line in text.splitlines() if "speedup" in line), None)
        if speed:
            lines.append(f"- Submission {i} measured: {speed}.")
    lines += ["", "## What to do"]
    if any(status.startswith("status: rule_violation") for status in statuses):
        lines.append("- A file that pulls in a second kernel language is rejected before it runs: that costs a "
                     "submission and teaches nothing about speed, so run the free check first.")
    if "status: passed" in statuses:
        lines.append(f"- For {topic}, giving each independent slice of the output its own thread block, keeping "
                     "that slice on chip and writing every output element once passed here.")
    else:
        lines.append(f"- No submission for {topic} passed here; start from the simplest correct version (one "
                     "independent output slice per thread block) before any tuning.")
    lines += [
        "- Match the reference's rounding points (round intermediate results where the reference rounds them): "
        "the tolerance is tight relative to the reference's own error.",
        "- Use wide, aligned vector accesses along the contiguous dimension; when the roofline report puts the "
        "kernel near the memory bound, only fewer bytes moved make it faster.",
    ]
    return "\n".join(lines) + "\n"


def _gold_plan(conv: Conversation, with_skill: bool) -> list[Action]:
    query = json.dumps({"query": conv.slug.replace("_", " "), "dsl": conv.dsl})
    gold = gold_kernel(conv.number, conv.dsl)
    plan = [Action("docs_search", query)]
    if gold is None:
        plan.append(Action("submit", json.dumps({"code": BROKEN_STUB})))
    else:
        source = gold.read_text(encoding="utf-8")
        plan += [Action("submit", json.dumps({"code": break_kernel(source)})),
                 Action("submit", json.dumps({"code": source}))]
    if with_skill:
        plan.append(Action("write_skill", json.dumps({"content": skill_text(conv)})))
    plan.append(Action("finish", json.dumps({"submission": 0})))
    return plan


_GARBAGE = (
    Action(None, text="Let me think about coalescing and occupancy before writing anything."),
    Action("submit", '{"code": "def solve(*inputs):\\n    return inp'),  # truncated JSON
    Action("submit", json.dumps({"code": ""})),
    Action("submit", json.dumps({"code": "Here is my kernel. It is very fast ))) ]]"})),
    Action("compile_and_run", json.dumps({"code": "print(1)"})),
    Action(None, text="ACTION: teleport to the solution"),
    Action("submit", "[1, 2, 3]"),  # arguments that are JSON but not an object
)


def next_action(policy: str, messages: Sequence[Mapping[str, Any]]) -> Action:
    """The policy's next reply to `messages` (pure: same messages, same action)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown scripted policy {policy!r}")
    conv = read_conversation(messages)
    if policy == "garbage":
        return _GARBAGE[conv.turn % len(_GARBAGE)]
    plan = _gold_plan(conv, with_skill=policy != "noskill")
    return plan[min(len(conv.results), len(plan) - 1)]


def text_protocol(action: Action) -> str:
    """Render an action as the text-protocol reply (``ACTION: <tool> [arg]`` plus a fenced block)."""
    if action.tool is None:
        return action.text
    args = json.loads(action.arguments)
    if action.tool in ("submit", "check"):
        code = args["code"] if args["code"].endswith("\n") else args["code"] + "\n"
        return f"ACTION: {action.tool}\n```python\n{code}```\n"
    if action.tool == "write_skill":
        return f"ACTION: write_skill\n```markdown\n{args['content']}```\n"
    if action.tool == "docs_search":
        return f"ACTION: docs_search {args['query']}"
    if action.tool == "docs_read":
        return f"ACTION: docs_read {args['doc_id']}"
    if action.tool == "finish":
        return f"ACTION: finish {args.get('submission', 0)}"
    return f"ACTION: {action.tool}"


def _failures() -> list[tuple[str, int | None]]:
    entries = []
    for raw in os.environ.get(FAIL_ENV, "").split(","):
        raw = raw.strip()
        if not raw:
            continue
        pattern, _, times = raw.partition("@")
        entries.append((pattern, int(times) if times else None))
    return entries


_FAILED: dict[str, int] = {}
"""Calls failed so far per ``SUBSTR@N`` entry in this process: the only state, and only for `flaky`."""


def should_fail(pseudo_key: str) -> bool:
    """Whether `flaky` answers this call with a 503 (counts the failure for ``@N`` entries)."""
    for pattern, times in _failures():
        if pattern != "*" and pattern not in pseudo_key:
            continue
        if times is None:
            return True
        entry = f"{pattern}@{times}"
        if _FAILED.get(entry, 0) < times:
            _FAILED[entry] = _FAILED.get(entry, 0) + 1
            return True
    return False


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def respond(model: str, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> Any:
    """Build the litellm `ModelResponse` for `scripted/<model>`; raises litellm's 503 error for `flaky` outages."""
    import httpx
    import litellm

    policy = model.removeprefix(f"{PROVIDER}/")
    if policy not in POLICIES:
        raise litellm.BadRequestError(message=f"unknown scripted policy {policy!r}", model=model,
                                      llm_provider=PROVIDER)
    conv = read_conversation(messages)
    if policy == "flaky" and should_fail(conv.pseudo_key):
        request = httpx.Request("POST", "http://scripted.invalid/v1/chat/completions")
        raise litellm.ServiceUnavailableError(
            message=f"scripted outage for {conv.pseudo_key}", llm_provider=PROVIDER, model=model,
            response=httpx.Response(503, headers={"retry-after": "0"}, request=request))
    action = next_action("gold" if policy == "flaky" else policy, messages)
    if policy == "gold-text" or action.tool is None:
        message: dict[str, Any] = {"role": "assistant", "content": text_protocol(action)}
        finish_reason = "stop"
        completion = message["content"]
    else:
        call = {"id": f"call_{conv.turn}_{action.tool}", "type": "function",
                "function": {"name": action.tool, "arguments": action.arguments}}
        message = {"role": "assistant", "content": action.text or None, "tool_calls": [call]}
        finish_reason = "tool_calls"
        completion = action.text + action.tool + action.arguments
    prompt = _tokens(json.dumps([dict(m) for m in messages], default=str) + json.dumps(tools or [], default=str))
    usage = litellm.Usage(prompt_tokens=prompt, completion_tokens=_tokens(completion),
                          total_tokens=prompt + _tokens(completion))
    return litellm.ModelResponse(model=f"{PROVIDER}/{policy}", usage=usage,
                                 choices=[{"index": 0, "finish_reason": finish_reason, "message": message}])


def _handler() -> Any:
    """A `litellm.CustomLLM` whose sync and async completions call `respond` (litellm imported only here)."""
    import litellm

    class ScriptedLLM(litellm.CustomLLM):
        def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            return respond(model, messages, (kwargs.get("optional_params") or {}).get("tools"))

        async def acompletion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> Any:
            return respond(model, messages, (kwargs.get("optional_params") or {}).get("tools"))

    return ScriptedLLM()


def register() -> None:
    """Make ``scripted/<policy>`` routable by litellm (idempotent)."""
    import litellm

    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": _handler()})
