"""The major providers through litellm's real code path, each against the loopback stub answering in its own wire
format (OpenAI chat completions for OpenAI, DeepSeek and OpenAI-compatible servers; Anthropic Messages; Gemini
generateContent): the request litellm sends, prompt caching (Anthropic's explicit breakpoints, the others' implicit
prefix cache) and what the cached tokens cost, priced from litellm's local cost map."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from metakernel.agents.llm import LLMClient, ModelSpec, RetryPolicy, cache_breakpoints, uses_cache_breakpoints
from metakernel.agents.models import resolve_model

from metakernel.budget import litellm_cache_price, litellm_prices
from tests import test_agents_llm as loopback
from tests.test_agents_llm import KEY_ENV, Stub

stub_server, stub = loopback.stub_server, loopback.stub  # the loopback stub's fixtures, shared

MESSAGES = [{"role": "system", "content": "You write GPU kernels."}, {"role": "user", "content": "TASK: problem 28"},
            {"role": "assistant", "content": "checking"}, {"role": "user", "content": "the newest tool output"}]


def _openai(model: str, prompt: int, cached: int, completion: int) -> tuple[int, dict[str, str], dict[str, Any]]:
    return 200, {}, {"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}}}


def _anthropic(model: str, prompt: int, cached: int, completion: int) -> tuple[int, dict[str, str], dict[str, Any]]:
    return 200, {}, {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                     "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
                     "usage": {"input_tokens": prompt - cached, "output_tokens": completion,
                               "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}


def _gemini(model: str, prompt: int, cached: int, completion: int) -> tuple[int, dict[str, str], dict[str, Any]]:
    return 200, {}, {"candidates": [{"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP",
                                     "index": 0}],
                     "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": completion,
                                       "cachedContentTokenCount": cached, "totalTokenCount": prompt + completion},
                     "modelVersion": model}


#: (litellm model, the path litellm posts to, the stub's reply in that provider's format)
PROVIDERS = [
    ("anthropic/claude-sonnet-4-5-20250929", "/v1/messages", _anthropic),
    ("openai/gpt-4o", "/chat/completions", _openai),
    ("deepseek/deepseek-chat", "/chat/completions", _openai),
    ("gemini/gemini-2.5-pro", "/models/gemini-2.5-pro:generateContent", _gemini),
]


def _call(stub: Stub, model: str, reply: Any, **spec: Any) -> Any:
    stub.script.append(reply)
    client = LLMClient(ModelSpec(model=model, api_base=f"http://127.0.0.1:{stub.port}", api_key_env=KEY_ENV,
                                 max_tokens=16, timeout_s=10.0, retry=RetryPolicy(max_retries=0), **spec))
    return asyncio.run(client.complete(MESSAGES))


@pytest.mark.parametrize("model, path, reply", PROVIDERS, ids=[p[0].split("/")[0] for p in PROVIDERS])
def test_each_provider_s_cached_tokens_are_counted_and_priced_at_the_cached_rate(stub, model, path, reply) -> None:
    name = model.split("/", 1)[1]
    response = _call(stub, model, reply(name, 1000, 800, 50))
    assert stub.requests[-1]["path"].startswith(path)
    assert (response.content, response.prompt_tokens, response.completion_tokens, response.cached_tokens) == \
        ("ok", 1000, 50, 800)
    pin, pout = litellm_prices(model)  # type: ignore[misc]
    cached = litellm_cache_price(model)
    assert cached is not None and cached < pin
    assert response.cost_usd == pytest.approx(200 * pin + 800 * cached + 50 * pout, rel=1e-6)
    uncached = _call(stub, model, reply(name, 1000, 0, 50))
    assert uncached.cached_tokens == 0 and uncached.cost_usd == pytest.approx(1000 * pin + 50 * pout, rel=1e-6)


def test_anthropic_gets_breakpoints_on_the_task_and_the_newest_message(stub) -> None:
    _call(stub, "anthropic/claude-sonnet-4-5-20250929", _anthropic("claude-sonnet-4-5-20250929", 100, 0, 5))
    body = stub.requests[-1]["body"]
    marked = [i for i, m in enumerate(body["messages"])
              if any(isinstance(b, dict) and b.get("cache_control") for b in m["content"])]
    assert marked == [0, len(body["messages"]) - 1]  # the task (the system prompt sits before it) and the newest
    assert body["messages"][0]["content"][0]["text"] == "TASK: problem 28"
    assert "cache_control" not in json.dumps(body["system"])  # cached as part of the prefix up to the task
    _call(stub, "anthropic/claude-sonnet-4-5-20250929", _anthropic("claude-sonnet-4-5-20250929", 100, 0, 5),
          prompt_cache=False)
    assert "cache_control" not in json.dumps(stub.requests[-1]["body"])


@pytest.mark.parametrize("model, path, reply", PROVIDERS[1:], ids=[p[0].split("/")[0] for p in PROVIDERS[1:]])
def test_providers_that_cache_by_themselves_get_the_plain_conversation(stub, model, path, reply) -> None:
    _call(stub, model, reply(model.split("/", 1)[1], 100, 0, 5))
    assert "cache_control" not in json.dumps(stub.requests[-1]["body"])
    assert not uses_cache_breakpoints(model)


def test_breakpoints_leave_the_conversation_otherwise_unchanged() -> None:
    marked = cache_breakpoints(MESSAGES)
    assert [m["role"] for m in marked] == [m["role"] for m in MESSAGES]
    ephemeral = {"type": "ephemeral"}
    assert marked[1]["content"] == [{"type": "text", "text": "TASK: problem 28", "cache_control": ephemeral}]
    assert marked[2] == MESSAGES[2] and MESSAGES[1]["content"] == "TASK: problem 28"  # the input is not modified
    assert uses_cache_breakpoints("anthropic/claude-opus-4") and uses_cache_breakpoints("bedrock/anthropic.claude-3")


@pytest.mark.parametrize("name", ["anthropic-claude-sonnet-4-5", "openai-gpt-5", "gemini-2-5-pro", "deepseek-chat"])
def test_shipped_model_specs_resolve_and_are_priced_with_a_cache_rate(name) -> None:
    spec = resolve_model(name, require_key=False)
    assert spec.prompt_cache
    assert litellm_prices(spec.model) is not None and litellm_cache_price(spec.model) is not None
