"""The attempt loop's conversation rules, checked on every request a provider would receive.

Hosted APIs reject a conversation in which an assistant message's tool calls are not answered by tool messages
that follow it directly, one per call id; the scripted provider would not notice, so these tests check the
messages themselves (real store, real dry run of a gold TIRx kernel on the stand-in executor).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from metakernel.agents import scripted
from metakernel.agents.attempt import AttemptSetup, run_attempt, trim_context
from metakernel.agents.llm import LLMResponse, ModelSpec, ToolCall

from metakernel.budget import Budget
from metakernel.catalog import load_catalog
from metakernel.executor import StandInExecutor
from metakernel.plan import AttemptKey
from metakernel.store import Store


def check_order(messages: list[dict[str, Any]]) -> None:
    """Fail unless every tool call is answered right after its assistant message, and nothing else is a tool msg."""
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            raise AssertionError(f"tool message at {i} does not follow an assistant tool call")
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            answers = messages[i + 1:i + 1 + len(ids)]
            assert [a.get("role") for a in answers] == ["tool"] * len(ids), (i, answers)
            assert [a["tool_call_id"] for a in answers] == ids
            for c in m["tool_calls"]:
                json.loads(c["function"]["arguments"])  # trimmed or not, arguments stay JSON
            i += 1 + len(ids)
            continue
        i += 1


class ScriptedCapture:
    """A client that checks each request, then answers like `scripted/<policy>` (or from a fixed script)."""

    def __init__(self, policy: str = "gold", script: list[list[tuple[str, dict[str, Any]]]] | None = None) -> None:
        self.spec = ModelSpec(model=f"scripted/{policy}")
        self.cache = None
        self.policy = policy
        self.script = script
        self.requests: list[list[dict[str, Any]]] = []

    async def complete(self, messages, tools=None, *, key: str) -> LLMResponse:  # noqa: ANN001 - test double
        check_order(list(messages))
        self.requests.append([dict(m) for m in messages])
        n = len(self.requests)
        if self.script is not None:
            calls = tuple(ToolCall(f"c{n}_{j}", name, json.dumps(args))
                          for j, (name, args) in enumerate(self.script[min(n, len(self.script)) - 1]))
            content = ""
        else:
            action = scripted.next_action(self.policy, messages)
            calls = (ToolCall(f"c{n}", action.tool, action.arguments),) if action.tool else ()
            content = action.text
        return LLMResponse(content=content, tool_calls=calls, prompt_tokens=10, completion_tokens=5, cost_usd=None,
                           cost_status="unpriced", latency_s=0.0, attempts=1)


def _setup(tmp_path: Path, client: Any, budget: Budget) -> tuple[AttemptSetup, Store]:
    store = Store(tmp_path / "exp", create=True)
    store.init_experiment("t", {}, {}, ())
    key = AttemptKey("scripted/gold", 28, "solo_tirx", 1)
    store.ensure_attempts([{"attempt_id": key.attempt_id, "model": key.model, "problem": 28, "family": "mlp_norm",
                            "arm": key.arm, "dsl": key.dsl, "replicate": 1, "source_attempt": None}])
    run_id = store.begin_run(["test"], {})
    setup = AttemptSetup(key=key, problem=load_catalog().problem(28), budget=budget, client=client,
                         executor=StandInExecutor(), store=store, run_id=run_id)
    return setup, store


def test_wrap_up_note_never_splits_a_tool_call_from_its_result(tmp_path):
    client = ScriptedCapture("gold")
    setup, store = _setup(tmp_path, client, Budget(submissions=2))
    result = asyncio.run(run_attempt(setup))
    store.close()
    assert result["ended_by"] == "finish" and result["submissions"] == 2
    # the wrap-up note reached the model, after the submit's result
    last = client.requests[-1]
    notes = [i for i, m in enumerate(last) if m["role"] == "user" and "submission budget is spent" in m["content"]]
    assert notes and last[notes[0] - 1]["role"] == "tool"


def test_two_calls_in_one_reply_after_the_budget_is_spent(tmp_path):
    gold = scripted.gold_kernel(28, "tirx")
    assert gold is not None
    code = gold.read_text()
    client = ScriptedCapture(script=[[("submit", {"code": code}), ("submit", {"code": code})],
                                     [("write_skill", {"content": "- keep rows on chip: one pass, measured 2x"}),
                                      ("finish", {"submission": 1})]])
    setup, store = _setup(tmp_path, client, Budget(submissions=1))
    result = asyncio.run(run_attempt(setup))
    store.close()
    assert result["submissions"] == 1 and result["final_submission"] == 1 and result["ended_by"] == "finish"
    second = client.requests[1]
    answers = [m for m in second if m["role"] == "tool"]
    assert answers[0]["content"].startswith("submission 1: status: passed")
    assert answers[1]["content"].startswith("error:") and "spent" in answers[1]["content"]


def test_trimming_keeps_the_cached_prefix_stable_across_turns():
    """Prompt caching: what was sent before the newest messages must stay byte-identical from one turn to the
    next except when trimming steps forward; each step frees (1 - TRIM_TO) x the limit, so it comes every few
    turns, where trimming just under the limit changed the prefix at every turn past it."""
    from metakernel.agents.attempt import TRIM_TO

    big, limit, turns = "y" * 4000, 60_000, 60
    growth = len(big) + len(json.dumps({"code": big}))  # one turn: the kernel in the call and its output

    def changes(stepped: bool) -> int:
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "TASK " + big}]
        upto, previous, count = 2, None, 0
        for i in range(turns):
            call = {"name": "check", "arguments": json.dumps({"code": big})}
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"id": f"c{i}", "type": "function", "function": call}]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "name": "check", "content": big})
            sent, upto = trim_context(messages, limit, upto if stepped else 2)
            check_order(sent)
            assert sum(len(m.get("content") or "") + sum(len(c["function"]["arguments"])
                                                         for c in m.get("tool_calls", ())) for m in sent) <= limit
            count += previous is not None and sent[:len(previous)] != previous
            previous = sent
        return count

    stepped, every_turn = changes(True), changes(False)
    assert 0 < stepped <= turns * growth / ((1 - TRIM_TO) * limit) + 1, stepped
    assert stepped < every_turn / 2, (stepped, every_turn)


def test_trim_context_keeps_task_and_recent_and_valid_json():
    big = "x" * 5000
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "TASK " + big}]
    for i in range(10):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"id": f"c{i}", "type": "function",
                                         "function": {"name": "submit", "arguments": json.dumps({"code": big})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "name": "submit", "content": big})
    trimmed, upto = trim_context(messages, 40_000)
    assert 2 < upto <= len(messages) - 6
    check_order(trimmed)
    assert trimmed[1] == messages[1] and trimmed[-6:] == messages[-6:]
    assert trimmed[2]["tool_calls"][0]["function"]["arguments"] != messages[2]["tool_calls"][0]["function"]["arguments"]
    assert "trimmed" in trimmed[3]["content"]
    size = sum(len(m.get("content") or "") + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", ()))
               for m in trimmed)
    assert size <= 40_000
    assert messages[3]["content"] == big  # the original is untouched
