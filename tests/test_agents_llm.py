"""LLMClient against a loopback stub that speaks the OpenAI chat-completions format and its error formats."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from metakernel.agents.llm import (
    UNPRICED,
    LLMClient,
    ModelSpec,
    NonRetryableLLMError,
    RetriesExhaustedError,
    RetryPolicy,
)

from metakernel.errors import UserError

KEY_ENV = "METAKERNEL_TEST_STUB_KEY"
KEY = "sk-stub-secret-0123456789"


def _ok(content: str = "hello", prompt: int = 11, completion: int = 7) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
    return 200, {}, body


def _err(status: int, message: str, type_: str, code: str | None = None, headers: dict[str, str] | None = None):
    return status, headers or {}, {"error": {"message": message, "type": type_, "param": None, "code": code}}


class Stub:
    """Answers each request with the next scripted reply; ("hang", s) sleeps s seconds without answering."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub.lock:
                    stub.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                    reply: Any = stub.script.pop(0) if stub.script else _ok()
                if reply[0] == "hang":  # not counted in flight: it outlives its test
                    time.sleep(reply[1])
                    return
                with stub.lock:
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    self._reply(reply)
                finally:
                    with stub.lock:
                        stub.in_flight -= 1

            def _reply(self, reply: Any) -> None:
                time.sleep(stub.delay_s)
                status, headers, payload = reply
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stub_server() -> Iterator[Stub]:
    stub = Stub()
    yield stub
    stub.close()


@pytest.fixture()
def stub(stub_server: Stub, monkeypatch: pytest.MonkeyPatch) -> Stub:
    monkeypatch.setenv(KEY_ENV, KEY)
    stub_server.script.clear()
    stub_server.requests.clear()
    stub_server.delay_s = 0.0
    stub_server.max_in_flight = 0
    return stub_server


def _spec(stub: Stub, **retry: Any) -> ModelSpec:
    policy = RetryPolicy(**{"base_backoff_s": 0.01, "max_backoff_s": 0.05, **retry})
    return ModelSpec(
        model="openai/stub",
        api_base=f"http://127.0.0.1:{stub.port}/v1",
        api_key_env=KEY_ENV,
        temperature=0.0,
        max_tokens=64,
        timeout_s=5.0,
        retry=policy,
    )


def _ask(spec: ModelSpec) -> Any:
    return asyncio.run(LLMClient(spec).complete([{"role": "user", "content": "hi"}]))


def test_success_parses_usage_and_marks_stub_unpriced(stub: Stub) -> None:
    stub.script.append(_ok("done", prompt=123, completion=45))
    response = _ask(_spec(stub))
    assert response.content == "done"
    assert (response.prompt_tokens, response.completion_tokens) == (123, 45)
    assert response.cost_usd is None and response.cost_status == UNPRICED
    assert response.attempts == 1 and response.latency_s > 0
    assert stub.requests[0]["path"].endswith("/chat/completions")
    assert stub.requests[0]["auth"] == f"Bearer {KEY}"
    assert stub.requests[0]["body"]["temperature"] == 0.0


def test_rate_limit_honours_retry_after(stub: Stub) -> None:
    stub.script.append(_err(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"Retry-After": "1"}))
    start = time.monotonic()
    response = _ask(_spec(stub))
    assert time.monotonic() - start >= 0.9
    assert response.attempts == 2 and len(stub.requests) == 2


def test_service_unavailable_retried_with_backoff(stub: Stub) -> None:
    stub.script += [_err(503, "overloaded", "server_error")] * 2
    response = _ask(_spec(stub))
    assert response.attempts == 3 and len(stub.requests) == 3


def test_context_window_exceeded_is_not_retried(stub: Stub) -> None:
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    stub.script.append(_err(400, message, "invalid_request_error", "context_length_exceeded"))
    with pytest.raises(NonRetryableLLMError, match="maximum context length") as info:
        _ask(_spec(stub))
    assert info.value.attempts == 1 and len(stub.requests) == 1


def test_authentication_error_is_not_retried(stub: Stub) -> None:
    stub.script.append(_err(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"))
    with pytest.raises(NonRetryableLLMError, match="Incorrect API key") as info:
        _ask(_spec(stub))
    assert info.value.attempts == 1 and len(stub.requests) == 1
    assert KEY not in str(info.value)


def test_timeout_is_retried_then_gives_up(stub: Stub) -> None:
    stub.script += [("hang", 3.0)] * 3
    spec = replace(_spec(stub, max_retries=1), timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match="gave up after 2 attempts") as info:
        _ask(spec)
    assert info.value.attempts == 2 and len(stub.requests) == 2
    assert time.monotonic() - start < 10


def test_total_wait_budget_caps_retry_after(stub: Stub) -> None:
    stub.script.append(_err(429, "slow down", "requests", "rate_limit_exceeded", {"Retry-After": "30"}))
    with pytest.raises(RetriesExhaustedError):
        _ask(_spec(stub, max_total_wait_s=5.0))
    assert len(stub.requests) == 1


def test_missing_key_variable_fails_before_any_request(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(UserError, match=KEY_ENV):
        _ask(_spec(stub))
    assert stub.requests == []


def test_from_yaml(stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(
        f"model: openai/stub\napi_base: http://127.0.0.1:{stub.port}/v1\napi_key_env: {KEY_ENV}\n"
        "temperature: 0.2\nmax_concurrency: 2\nretry:\n  max_retries: 3\n"
    )
    spec = ModelSpec.from_yaml(path)
    assert spec.temperature == 0.2 and spec.max_concurrency == 2 and spec.retry.max_retries == 3
    assert _ask(spec).content == "hello"
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(UserError, match=KEY_ENV) as info:
        ModelSpec.from_yaml(path)
    assert "\n" not in str(info.value)
    path.write_text("model: x\nbogus: 1\n")
    with pytest.raises(UserError, match="bogus"):
        ModelSpec.from_yaml(path)


def test_key_never_in_repr(stub: Stub) -> None:
    spec = _spec(stub)
    response = _ask(spec)
    for text in (repr(spec), repr(response), repr(LLMClient(spec))):
        assert KEY not in text
    assert KEY_ENV in repr(spec)


def test_concurrency_is_bounded(stub: Stub) -> None:
    spec = replace(_spec(stub), max_concurrency=1)
    stub.delay_s = 0.1

    async def run() -> list[Any]:
        client = LLMClient(spec)
        return await asyncio.gather(*(client.complete([{"role": "user", "content": str(i)}]) for i in range(3)))

    responses = asyncio.run(run())
    assert [r.attempts for r in responses] == [1, 1, 1]
    assert len(stub.requests) == 3 and stub.max_in_flight == 1


def test_import_is_lazy() -> None:
    import subprocess
    import sys

    code = "import sys, metakernel.agents.llm; assert 'litellm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
