"""Scripted offline models: each policy's action sequence, driven by hand-built transcripts and through litellm."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from metakernel.agents.llm import LLMClient, RetriesExhaustedError, RetryPolicy
from metakernel.agents.models import bundled_specs, model_runtime, model_slug, resolve_model
from metakernel.agents.scripted import (
    BROKEN_IMPORT,
    BROKEN_STUB,
    FAIL_ENV,
    SKILL_HEADING,
    gold_kernel,
    next_action,
    read_conversation,
    should_fail,
)

from metakernel.errors import UserError
from metakernel.grader.static import check_source

TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
         for n in ("submit", "check", "docs_search", "docs_read", "write_skill", "finish")]
PASSED = "status: passed\ntime: 8.0 us median over 30 draws\neager PyTorch: 12.0 us -> speedup 1.500x"
STATIC = "status: rule_violation (static)\n- kernel.py:3: forbidden import triton"


def task(nn: int = 28, dsl: str = "CuTe DSL", slug: str = "fused_add_rmsnorm_h4096", skill: str | None = None):
    text = f"# Problem {nn}: {slug} ({dsl} variant)\n\nFused residual add + RMSNorm.\n\n## Rules\n..."
    if skill is not None:
        text += f"\n\n{SKILL_HEADING}\n{skill}"
    return [{"role": "system", "content": "You write GPU kernels."}, {"role": "user", "content": text}]


def native(messages: list[dict[str, Any]], name: str, arguments: str, result: str) -> None:
    """Append one native tool call and its result, the way the attempt loop will."""
    call_id = f"call_{len(messages)}"
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call_id, "content": result})


def drive(policy: str, messages: list[dict[str, Any]], results: list[str], steps: int = 8) -> list[Any]:
    """Run `next_action` against canned results; stop at finish."""
    actions = []
    for i in range(steps):
        action = next_action(policy, messages)
        actions.append(action)
        if action.tool == "finish":
            break
        if action.tool is None:
            messages.append({"role": "assistant", "content": action.text})
            messages.append({"role": "user", "content": "Your reply had no action."})
            continue
        native(messages, action.tool, action.arguments, results[min(i, len(results) - 1)])
    return actions


def test_gold_sequence_broken_then_gold_then_skill_then_finish():
    actions = drive("gold", task(), ["hit1\nhit2", STATIC, PASSED, "SKILL.md written (900 bytes)"])
    assert [a.tool for a in actions] == ["docs_search", "submit", "submit", "write_skill", "finish"]
    assert json.loads(actions[0].arguments) == {"query": "fused add rmsnorm h4096", "dsl": "cute"}
    gold = gold_kernel(28, "cute")
    assert gold is not None
    broken, good = (json.loads(a.arguments)["code"] for a in actions[1:3])
    assert good == gold.read_text()
    assert broken.count(BROKEN_IMPORT) == 1 and broken.replace(BROKEN_IMPORT, "") == good
    assert not check_source(broken, "cute").ok, "the first submission must be a cheap static-rule rejection"
    assert check_source(good, "cute").ok
    skill = json.loads(actions[3].arguments)["content"]
    assert "status: passed" in skill and "speedup 1.500x" in skill and "fused add rmsnorm" in skill
    assert "```" not in skill and "import" not in skill and "cute" not in skill.lower().replace("execute", "")
    assert json.loads(actions[4].arguments) == {"submission": 0}


def test_the_skill_reads_the_status_from_the_submit_tool_s_own_wording():
    """The attempt loop prefixes each result ("submission 2: status: passed ..."): the demo's SKILL.md once said no
    submission passed while its attempt had passed at 1.86x."""
    prefixed = [f"submission {i}: {text}" for i, text in enumerate((STATIC, PASSED), 1)]
    actions = drive("gold", task(), ["hit1", *prefixed, "SKILL.md written"])
    skill = json.loads(actions[3].arguments)["content"]
    assert "Submission 2 graded 'status: passed'" in skill and "No submission" not in skill
    assert "passed here" in skill and "rejected before it runs" in skill


def test_gold_is_a_pure_function_of_the_messages():
    messages = task(dsl="TIRx")
    native(messages, "docs_search", "{}", "hits")
    assert next_action("gold", messages) == next_action("gold", [dict(m) for m in messages])
    assert json.loads(next_action("gold", messages).arguments)["code"].count("import triton") == 1
    nudged = messages + [{"role": "user", "content": "Budget left: 9 submissions, 38 min"}]
    assert next_action("gold", nudged) == next_action("gold", messages), "only tool results advance the policy"


def test_gold_without_a_gold_kernel_submits_the_broken_stub_once():
    assert gold_kernel(3, "cute") is None
    actions = drive("gold", task(nn=3, slug="gqa_paged_decode_h16_kv2_d256_ps64"), ["hits", STATIC, "ok"])
    assert [a.tool for a in actions] == ["docs_search", "submit", "write_skill", "finish"]
    assert json.loads(actions[1].arguments)["code"] == BROKEN_STUB
    assert not check_source(BROKEN_STUB, "cute").ok
    assert "No submission" in json.loads(actions[2].arguments)["content"]


def test_noskill_never_writes_a_skill():
    actions = drive("noskill", task(), ["hits", STATIC, PASSED])
    assert [a.tool for a in actions] == ["docs_search", "submit", "submit", "finish"]


def test_gold_text_uses_the_text_protocol():
    from metakernel.agents.scripted import text_protocol

    messages = task(dsl="TIRx")
    replies = []
    for result in ["hits", STATIC, PASSED, "written", None]:
        reply = text_protocol(next_action("gold-text", messages))
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
        if result is not None:
            tool = reply.split()[1]
            messages.append({"role": "user", "content": f"Result of {tool}:\n{result}"})
    assert [r.splitlines()[0] for r in replies] == [
        "ACTION: docs_search fused add rmsnorm h4096", "ACTION: submit", "ACTION: submit", "ACTION: write_skill",
        "ACTION: finish 0"]
    assert "```python\n" in replies[2] and replies[2].rstrip().endswith("```")
    assert "```markdown\n" in replies[3]


def test_garbage_cycles_and_never_finishes():
    actions = drive("garbage", task(), ["status: infra_error (bad arguments)"], steps=20)
    assert len(actions) == 20 and all(a.tool != "finish" for a in actions)
    assert any(a.tool is None and "ACTION" not in a.text for a in actions), "free text with no action"
    assert any(a.tool == "submit" and _bad_json(a.arguments) for a in actions), "malformed JSON arguments"
    assert any(a.tool == "submit" and a.arguments == '{"code": ""}' for a in actions), "empty code"
    assert any(a.tool == "compile_and_run" for a in actions), "unknown tool"
    assert any(a.tool is None and a.text.startswith("ACTION: teleport") for a in actions), "unknown text action"
    assert actions[:7] == actions[7:14], "deterministic cycle"


def _bad_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    return False


def test_conversation_reads_arm_and_pseudo_key():
    conv = read_conversation(task(nn=7, dsl="TIRx", skill="- rows per block"))
    assert (conv.number, conv.dsl, conv.arm, conv.pseudo_key) == (7, "tirx", "cute2tirx_skill",
                                                                   "p07_cute2tirx_skill#0")
    messages = task()
    native(messages, "docs_search", "{}", "hits")
    assert read_conversation(messages).pseudo_key == "p28_solo_cute#1"
    with pytest.raises(ValueError, match="heading"):
        read_conversation([{"role": "user", "content": "hello"}])


def test_should_fail_matches_substrings_and_counts(monkeypatch):
    monkeypatch.setenv(FAIL_ENV, "p28_solo_cute#1, p07_@2")
    assert should_fail("p28_solo_cute#1") and not should_fail("p28_solo_cute#2")
    assert [should_fail("p07_solo_tirx#0") for _ in range(3)] == [True, True, False]
    monkeypatch.setenv(FAIL_ENV, "*")
    assert should_fail("p99_anything#5")


def complete(policy: str, messages: list[dict[str, Any]], retry: RetryPolicy | None = None):
    async def go():
        async with model_runtime(resolve_model(f"scripted/{policy}")) as spec:
            if retry is not None:
                from dataclasses import replace

                spec = replace(spec, retry=retry)
            return await LLMClient(spec).complete(messages, TOOLS)

    return asyncio.run(go())


def test_through_litellm_native_tool_calls_and_usage():
    response = complete("gold", task())
    assert response.content is None and response.finish_reason == "tool_calls"
    assert [c.name for c in response.tool_calls] == ["docs_search"]
    assert json.loads(response.tool_calls[0].arguments)["dsl"] == "cute"
    assert response.prompt_tokens > 50 and response.completion_tokens > 0
    assert response.cost_status == "unpriced" and response.cost_usd is None


def test_through_litellm_text_protocol_has_no_tool_calls():
    response = complete("gold-text", task())
    assert response.tool_calls == () and response.content == "ACTION: docs_search fused add rmsnorm h4096"


def test_flaky_outage_retries_then_recovers_or_gives_up(monkeypatch):
    fast = RetryPolicy(max_retries=2, base_backoff_s=0.0, max_backoff_s=0.0)
    monkeypatch.setenv(FAIL_ENV, "p28_solo_cute#0")
    with pytest.raises(RetriesExhaustedError, match="503|ServiceUnavailable"):
        complete("flaky", task(), fast)
    monkeypatch.setenv(FAIL_ENV, "p36_solo_tirx#0@1")
    response = complete("flaky", task(nn=36, dsl="TIRx", slug="per_head_rmsnorm_d128"), fast)
    assert response.attempts == 2 and response.tool_calls[0].name == "docs_search"
    assert complete("flaky", task(nn=29, slug="x"), fast).attempts == 1, "unlisted keys behave as gold"


# Resolving model names (agents.models): every mistake is one line, before anything starts.


def test_resolve_model_rejects_unknown_policy_provider_and_local():
    with pytest.raises(UserError, match=r"unknown scripted policy 'golden' \(known: gold, gold-text"):
        resolve_model("scripted/golden")
    with pytest.raises(UserError, match=r"unknown model 'nosuchprovider/model-x': litellm cannot route it"):
        resolve_model("nosuchprovider/model-x")
    with pytest.raises(UserError, match="unknown local model 'local/llama70b'"):
        resolve_model("local/llama70b")
    with pytest.raises(UserError, match="not found"):
        resolve_model("missing-spec.yaml")


def test_resolve_model_checks_a_yaml_specs_route(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model: opneai/gpt-4.1\n")
    with pytest.raises(UserError, match=r"typo.yaml: unknown model 'opneai/gpt-4.1'"):
        resolve_model(str(path))


def test_resolve_model_missing_key_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("METAKERNEL_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(UserError, match="METAKERNEL_TEST_NO_SUCH_KEY .* is not set"):
        resolve_model("openai/gpt-4.1", api_key_env="METAKERNEL_TEST_NO_SUCH_KEY")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="openai/gpt-4.1: set OPENAI_API_KEY"):
        resolve_model("openai/gpt-4.1")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic-claude-sonnet-4-5")  # a bundled YAML spec
    assert resolve_model("anthropic-claude-sonnet-4-5", require_key=False).api_key_env == "ANTHROPIC_API_KEY"
    monkeypatch.setenv("METAKERNEL_TEST_SOME_KEY", "sk-test")
    spec = resolve_model("openai/gpt-4.1", api_key_env="METAKERNEL_TEST_SOME_KEY", api_base="http://127.0.0.1:9/v1")
    assert (spec.model, spec.api_key_env, spec.api_base) == ("openai/gpt-4.1", "METAKERNEL_TEST_SOME_KEY",
                                                             "http://127.0.0.1:9/v1")
    path = tmp_path / "mine.yaml"
    path.write_text("model: openai/gpt-4.1\napi_key_env: METAKERNEL_TEST_SOME_KEY\ntemperature: 0.3\n")
    assert resolve_model(str(path)).temperature == 0.3


def test_bundled_specs_are_valid_and_hold_no_secret():
    for name in bundled_specs():
        spec = resolve_model(name, require_key=False)
        assert spec.model and "sk-" not in repr(spec)
    assert {"openai-gpt-5", "anthropic-claude-sonnet-4-5"} <= set(bundled_specs())


def test_model_slug_is_safe_and_collision_free():
    assert model_slug("gpt-5") == "gpt-5"
    slugs = {model_slug(n) for n in ("openai/gpt-4o", "openai:gpt-4o", "OpenAI/GPT-4o", "scripted/gold")}
    assert len(slugs) == 4 and all(re.fullmatch(r"[a-z0-9._-]+", s) for s in slugs)
    assert model_slug("../etc").startswith("-") and "/" not in model_slug("../etc")
    try:
        from metakernel.plan import model_slug as plan_slug
    except ImportError:
        return
    for name in ("openai/gpt-4o", "scripted/gold", "gpt-5", "A" * 100):
        assert model_slug(name) == plan_slug(name), "attempt folders and cache keys must agree"
