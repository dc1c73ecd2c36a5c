"""Record/replay of model calls: a recorded run replays with zero model calls, divergence is counted, misses raise."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from metakernel.agents.llm import LLMResponse, NonRetryableLLMError, ToolCall
from metakernel.agents.models import CachedClient, model_runtime, open_client, resolve_model
from metakernel.agents.replay import CACHE_FILE, ReplayCache, ReplayMissError, parse_mode, request_digest

from metakernel.errors import UserError

TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
         for n in ("submit", "docs_search", "write_skill", "finish")]


def task(budget: str = "Budget left: 10 submissions, 40 min") -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You write GPU kernels."},
            {"role": "user", "content": f"# Problem 28: fused_add_rmsnorm_h4096 (TIRx variant)\n\n{budget}"}]


def after_search(timing: str) -> list[dict[str, Any]]:
    messages = task()
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "docs_search", "arguments": "{}"}}]})
    messages.append({"role": "tool", "tool_call_id": "c1", "content": f"hits (search took {timing} ms)"})
    return messages


def test_llm_response_json_round_trip():
    response = LLMResponse("hi", (ToolCall("c1", "submit", '{"code": "x"}'),), 10, 3, 0.25, "priced", 1.5, 2, "stop")
    data = json.loads(json.dumps(response.to_dict()))
    assert LLMResponse.from_dict(data) == response
    with pytest.raises(ValueError, match="unknown LLMResponse fields: extra"):
        LLMResponse.from_dict({**data, "extra": 1})


def test_record_then_replay_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    async def record() -> list[LLMResponse]:
        cache = ReplayCache.for_experiment(tmp_path, "record")
        assert cache is not None and cache.path == tmp_path / CACHE_FILE
        async with model_runtime(resolve_model("scripted/gold")) as spec:
            client = open_client(spec, cache)
            first = await client.complete(task(), TOOLS, key="scripted-gold/p28_r1_solo_tirx#0")
            second = await client.complete(after_search("3.1"), TOOLS, key="scripted-gold/p28_r1_solo_tirx#1")
        assert client.model_calls == 2
        cache.close()
        return [first, second]

    recorded = asyncio.run(record())
    assert [r.tool_calls[0].name for r in recorded] == ["docs_search", "submit"]

    async def replay() -> CachedClient:
        # A key variable that is not set: replay must not need it, since it builds no LLMClient.
        monkeypatch.delenv("METAKERNEL_NEVER_SET_KEY", raising=False)
        spec = resolve_model("scripted/gold", api_key_env="METAKERNEL_NEVER_SET_KEY", require_key=False)
        with ReplayCache(tmp_path / CACHE_FILE, "replay") as cache:
            client = open_client(spec, cache)
            assert client._client is None
            assert await client.complete(task(), TOOLS, key="scripted-gold/p28_r1_solo_tirx#0") == recorded[0]
            # Same conversation, different grader timing: served as recorded, counted as diverged (exact only).
            again = await client.complete(after_search("4.7"), TOOLS, key="scripted-gold/p28_r1_solo_tirx#1")
            assert again == recorded[1]
            assert (client.diverged, client.diverged_shape) == (1, 0)
            # A different conversation under the same key still replays deterministically, and counts as both.
            other = task("Budget left: 10 submissions, 40 min. Also: hello")
            assert await client.complete(other, TOOLS, key="scripted-gold/p28_r1_solo_tirx#0") == recorded[0]
            assert (client.diverged, client.diverged_shape) == (2, 1)
            with pytest.raises(ReplayMissError, match=r"p28_r1_solo_tirx#7") as miss:
                await client.complete(task(), TOOLS, key="scripted-gold/p28_r1_solo_tirx#7")
            assert isinstance(miss.value, NonRetryableLLMError) and miss.value.key.endswith("#7")
        return client

    client = asyncio.run(replay())
    assert client.model_calls == 0 and client.replayed == 3


def test_rerecording_a_key_replaces_its_row(tmp_path: Path):
    digest = request_digest(task(), TOOLS, {})
    old = LLMResponse("old", (), 1, 1, None, "unpriced", 0.1, 1)
    new = LLMResponse("new", (), 2, 2, None, "unpriced", 0.2, 1)
    with ReplayCache(tmp_path / CACHE_FILE, "record") as cache:
        cache.put("m", "a#0", digest, old)
        cache.put("m", "a#0", digest, new)
        cache.put("other", "a#0", digest, old)
        assert cache.keys() == [("m", "a#0"), ("other", "a#0")]
        got = cache.get("m", "a#0")
        assert got is not None and got.response == new and got.request == digest
    with sqlite3.connect(tmp_path / CACHE_FILE) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_tasks_record_every_call(tmp_path: Path):
    async def go() -> CachedClient:
        cache = ReplayCache(tmp_path / CACHE_FILE, "record")
        async with model_runtime(resolve_model("scripted/gold")) as spec:
            client = open_client(spec, cache)
            await asyncio.gather(*(client.complete(task(f"Budget left: {i} submissions"), TOOLS, key=f"a{i}#0")
                                   for i in range(24)))
        assert len(cache.keys("scripted/gold")) == 24
        cache.close()
        return client

    assert asyncio.run(go()).model_calls == 24


def test_digest_is_canonical_and_masks_digits_only_in_shape():
    a = request_digest([{"role": "user", "content": "t=1.5 us", "name": "x"}], None, {"temperature": 0.0})
    b = request_digest([{"name": "x", "content": "t=1.5 us", "role": "user"}], [], {"temperature": 0.0})
    c = request_digest([{"role": "user", "content": "t=2.75 us", "name": "x"}], None, {"temperature": 0.0})
    assert a == b, "key order and an empty tool list do not change the request"
    assert a.exact != c.exact and a.shape == c.shape
    assert request_digest([{"role": "user", "content": "t=1.5 us", "name": "x"}], None, {"seed": 1}) != a


def test_modes_and_missing_cache(tmp_path: Path):
    assert parse_mode("replay") == "replay"
    with pytest.raises(UserError, match="unknown LLM cache mode 'replai'"):
        parse_mode("replai")
    assert ReplayCache.for_experiment(tmp_path, "off") is None
    with pytest.raises(UserError, match="replay needs a recorded cache"):
        ReplayCache(tmp_path / "nothing.sqlite", "replay")
