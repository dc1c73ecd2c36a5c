"""The six tools an attempt offers, as OpenAI function schemas, and the text-protocol fallback parser.

A model that cannot call tools natively (or a small local one that tries and fails) still gets a way to act:
``ACTION: <tool> [argument]`` plus a fenced block. Both routes end in the same `Request`, so the loop has one code
path; anything unparseable becomes a `Request` with an `error` the model is told about (costing a turn, never a
submission).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_NAMES = ("submit", "check", "docs_search", "docs_read", "write_skill", "finish")


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_CODE = {"code": {"type": "string", "description": "the whole kernel.py"}}
TOOLS: list[dict[str, Any]] = [
    _fn("submit", "Grade kernel.py on the GPU. Costs one submission.", _CODE, ["code"]),
    _fn("check", "Free CPU dry run: static rules, import, compile for sm_90a, launches intercepted.", _CODE, ["code"]),
    _fn("docs_search", "Search the DSL documentation and guides.",
        {"query": {"type": "string"}, "dsl": {"type": "string", "enum": ["", "cute", "tirx"],
                                              "description": "restrict to one DSL (empty: both)"}}, ["query"]),
    _fn("docs_read", "Read one document found by docs_search.", {"doc_id": {"type": "string"}}, ["doc_id"]),
    _fn("write_skill", "Replace SKILL.md with this text (DSL-neutral, evidence-backed, no code).",
        {"content": {"type": "string"}}, ["content"]),
    _fn("finish", "End the attempt; name the submission to keep (1-based), or 0 for the best passing one.",
        {"submission": {"type": "integer", "minimum": 0}}, []),
]


@dataclass
class Request:
    """One action the model asked for; `error` set when it could not be understood."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None
    error: str | None = None


def from_tool_call(call_id: str, name: str, arguments: str) -> Request:
    """A native tool call, with its JSON arguments checked against the schema's required fields."""
    if name not in TOOL_NAMES:
        return Request(name, call_id=call_id, error=f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return Request(name, call_id=call_id, error=f"the arguments of {name} are not valid JSON ({exc.msg} at "
                                                    f"character {exc.pos}); send a JSON object")
    if not isinstance(args, dict):
        return Request(name, call_id=call_id, error=f"the arguments of {name} must be a JSON object, "
                                                    f"not {type(args).__name__}")
    return _checked(Request(name, args, call_id))


def _checked(req: Request) -> Request:
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == req.tool)
    for key in schema["required"]:
        if not isinstance(req.args.get(key), str):
            req.error = f"{req.tool} needs a string argument {key!r}"
            return req
    if req.tool == "finish":
        value = req.args.get("submission", 0)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            req.error = "finish takes a submission number >= 0 (0: let the harness choose)"
            return req
        req.args["submission"] = value
    return req


_ACTION = re.compile(r"^\s*ACTION:\s*(?P<tool>[A-Za-z_]+)\s*(?P<arg>.*)$", re.MULTILINE)
_FENCE = re.compile(r"```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<body>.*?)(?:\n```|\Z)", re.DOTALL)


def from_text(text: str) -> Request | None:
    """The text-protocol action in a reply, or None when the reply names no action at all."""
    match = _ACTION.search(text or "")
    if match is None:
        return None
    tool, arg = match["tool"], match["arg"].strip()
    if tool not in TOOL_NAMES:
        return Request(tool, error=f"unknown action {tool!r}; the actions are {', '.join(TOOL_NAMES)}")
    after = text[match.end():]
    if tool in ("submit", "check", "write_skill"):
        fence = _FENCE.search(after)
        if fence is None:
            what = "```python block with the whole kernel.py" if tool != "write_skill" else "```markdown block"
            return Request(tool, error=f"ACTION: {tool} must be followed by a {what}")
        key = "content" if tool == "write_skill" else "code"
        return Request(tool, {key: fence["body"]})
    if tool == "docs_search":
        return _checked(Request(tool, {"query": arg, "dsl": ""}))
    if tool == "docs_read":
        return _checked(Request(tool, {"doc_id": arg}))
    return _checked(Request(tool, {"submission": arg or 0}))


__all__ = ["TOOLS", "TOOL_NAMES", "Request", "from_text", "from_tool_call"]
