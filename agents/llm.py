"""The LLM client of the attempt loop: one model, litellm underneath, our own retries.

litellm is imported lazily so that importing this module does no network and stays fast; its cost map is pinned
to the local copy (`LITELLM_LOCAL_MODEL_COST_MAP`) so that no import ever fetches one. Retries are ours, not
litellm's or the OpenAI SDK's, so that every attempt is counted, Retry-After is honoured, and errors that a retry
cannot fix (context window, authentication, bad request) fail at once with the provider's message.

API keys are read from the environment at call time only: a `ModelSpec` holds the *name* of the variable, and no
returned object carries the key.

Prompt caching: an attempt resends its whole conversation every turn, so the provider's prompt cache decides most
of its input cost. OpenAI, DeepSeek and Gemini cache a repeated prefix by themselves; Anthropic caches only up to
explicit breakpoints, which `cache_breakpoints` adds (the task message, and the newest message so the next turn
reads everything before it from the cache). The attempt keeps the prefix stable (`attempt.trim_context` trims in
steps), the tokens read from the cache are recorded (`LLMResponse.cached_tokens`) and litellm prices them at the
provider's cached rate.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from metakernel.errors import UserError
from metakernel.yamlio import load_yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

UNPRICED = "unpriced"
"""`LLMResponse.cost_status` when litellm has no price for the model (cost_usd is then None)."""


class LLMError(Exception):
    """A model call that failed for good; the message is the provider's, prefixed with the model."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class NonRetryableLLMError(LLMError):
    """An error no retry can fix: context window exceeded, authentication, or a bad request."""


class RetriesExhaustedError(LLMError):
    """Transient errors (rate limit, 5xx, timeout, connection) outlasted the retry budget."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying a transient failure; defaults suit hosted APIs, tests shrink them."""

    max_retries: int = 6
    base_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_total_wait_s: float = 300.0

    def backoff_s(self, retry: int) -> float:
        """Exponential backoff with full jitter for the `retry`-th retry (1-based), so clients don't synchronise."""
        return random.uniform(0.0, min(self.max_backoff_s, self.base_backoff_s * 2 ** (retry - 1)))


@dataclass(frozen=True)
class ModelSpec:
    """Which model to call and how: recorded with every experiment, so it must never hold a secret."""

    model: str
    api_base: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None
    timeout_s: float = 600.0
    max_concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Anthropic-style cache breakpoints (`cache_control`) on the task and the newest message; providers that
    # cache by themselves ignore it. Off: every call pays the full input price.
    prompt_cache: bool = True

    @classmethod
    def from_yaml(cls, path: Path, *, check_key: bool = True) -> ModelSpec:
        """Load a spec from YAML (keys as the fields; `retry` a mapping) and check the key variable is set.

        `check_key=False` skips the key check for a replay, which never calls the model and so needs no key.
        """
        data = load_yaml(path)
        if not isinstance(data, dict):
            raise UserError("a model spec must be a mapping", str(path))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown model spec keys: {', '.join(map(str, unknown))}", str(path))
        if "model" not in data:
            raise UserError("a model spec needs `model`", str(path))
        retry = data.pop("retry", None) or {}
        try:
            spec = cls(**data, retry=RetryPolicy(**retry))
        except TypeError as exc:
            raise UserError(f"bad model spec: {exc}", str(path)) from exc
        if check_key:
            spec.api_key()
        return spec

    def api_key(self) -> str | None:
        """Read the key from its variable now (never cached), raising `UserError` naming a missing variable."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise UserError(f"environment variable {self.api_key_env} (API key for {self.model}) is not set")
        return key

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters that are set, as litellm keyword arguments."""
        params = {"temperature": self.temperature, "max_tokens": self.max_tokens, "top_p": self.top_p}
        params["seed"] = self.seed
        return {k: v for k, v in params.items() if v is not None}


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; `arguments` is the raw JSON text, parsed by the tool layer."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class LLMResponse:
    """One completed call: what the model said and what it cost (tokens, dollars when priced, time, attempts)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    cost_status: str
    latency_s: float
    attempts: int
    finish_reason: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache (priced lower)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (tool calls as a list of mappings), so a recorded call can be replayed exactly."""
        data = asdict(self)
        data["tool_calls"] = [asdict(c) for c in self.tool_calls]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LLMResponse:
        """Inverse of `to_dict`; unknown keys are an error so a record from a newer schema is not half-read."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown LLMResponse fields: {', '.join(unknown)}")
        values = dict(data)
        values["tool_calls"] = tuple(ToolCall(**c) for c in values.get("tool_calls") or ())
        return cls(**values)


def _classify(exc: Exception) -> str:
    """Return "fatal", "retry" or "unknown" for a litellm exception."""
    from litellm import exceptions as lx

    fatal = (
        lx.ContextWindowExceededError,
        lx.AuthenticationError,
        lx.BadRequestError,
        lx.PermissionDeniedError,
        lx.NotFoundError,
        lx.UnprocessableEntityError,
    )
    transient = (
        lx.RateLimitError,
        lx.ServiceUnavailableError,
        lx.InternalServerError,
        lx.BadGatewayError,
        lx.Timeout,
        lx.APIConnectionError,
    )
    if isinstance(exc, fatal):
        return "fatal"
    if isinstance(exc, transient):
        return "retry"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status >= 500 or status == 429):
        return "retry"
    return "unknown"


def _retry_after_s(exc: Exception) -> float | None:
    """The Retry-After header in seconds, if the provider sent one (HTTP-date forms are ignored)."""
    candidates = [
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ]
    for headers in candidates:
        if not headers:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):
            continue
    return None


def _cost(response: Any) -> tuple[float | None, str]:
    """Price the call from litellm's local cost map; an unknown model is recorded as unpriced, not as free."""
    import litellm

    litellm.suppress_debug_info = True  # else an unpriced model prints litellm's provider banner to stdout
    try:
        cost = litellm.completion_cost(completion_response=response)
    except Exception:  # noqa: BLE001 - litellm raises plain exceptions for models it has no price for
        return None, UNPRICED
    return (float(cost), "priced") if cost else (None, UNPRICED)


def _parse(response: Any, latency_s: float, attempts: int) -> LLMResponse:
    """Turn litellm's ModelResponse into our frozen record."""
    choice = response.choices[0]
    message = choice.message
    calls = tuple(
        ToolCall(id=str(c.id), name=str(c.function.name), arguments=str(c.function.arguments or ""))
        for c in (getattr(message, "tool_calls", None) or [])
    )
    usage = getattr(response, "usage", None)
    cost_usd, cost_status = _cost(response)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    if not cached:  # Anthropic's own field, where litellm did not fold it into the details
        cached = getattr(usage, "cache_read_input_tokens", None)
    return LLMResponse(
        content=message.content,
        tool_calls=calls,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=cost_usd,
        cost_status=cost_status,
        latency_s=latency_s,
        attempts=attempts,
        finish_reason=getattr(choice, "finish_reason", None),
        cached_tokens=int(cached or 0),
    )


def uses_cache_breakpoints(model: str) -> bool:
    """Whether the provider caches only up to explicit `cache_control` breakpoints.

    That is Anthropic's API, direct or through Bedrock / Vertex; the others cache a repeated prefix by themselves.
    """
    name = model.lower()
    return name.startswith(("anthropic/", "claude")) or "/anthropic." in name or (
        name.startswith(("bedrock/", "vertex_ai/")) and "claude" in name)


def cache_breakpoints(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A copy of `messages` with cache breakpoints on the task (message 1) and on the newest message.

    The provider then caches the system prompt and the task once, and each turn reads the whole earlier
    conversation from the cache (Anthropic allows four breakpoints; two are used).
    """
    out = [dict(m) for m in messages]
    marks = {min(1, len(out) - 1), len(out) - 1}
    for i in sorted(marks):
        m = out[i]
        content = m.get("content")
        if isinstance(content, str) and content:
            m["content"] = [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]
        elif isinstance(content, list) and content and isinstance(content[-1], dict):
            m["content"] = [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]
    return out


class LLMClient:
    """Calls one model with bounded concurrency and our own retry policy; make one client per model."""

    def __init__(self, spec: ModelSpec) -> None:
        spec.api_key()  # fail before any call if the key variable is missing
        self.spec = spec
        self._semaphore = asyncio.Semaphore(spec.max_concurrency)

    def __repr__(self) -> str:
        return f"LLMClient(model={self.spec.model!r})"

    async def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> LLMResponse:
        """One chat completion, retried on transient errors; raises `LLMError` subclasses when it gives up."""
        import litellm

        spec, policy = self.spec, self.spec.retry
        kwargs: dict[str, Any] = {
            "model": spec.model,
            "messages": (cache_breakpoints(messages) if spec.prompt_cache and uses_cache_breakpoints(spec.model)
                         else [dict(m) for m in messages]),
            "timeout": spec.timeout_s,
            "num_retries": 0,  # retries are ours (see module docstring)
            "max_retries": 0,  # and not the OpenAI SDK's either
            **spec.sampling(),
        }
        if spec.api_base:
            kwargs["api_base"] = spec.api_base
        if tools:
            kwargs["tools"] = [dict(t) for t in tools]
        waited = 0.0
        attempt = 0
        async with self._semaphore:
            while True:
                attempt += 1
                key = spec.api_key()
                start = time.monotonic()
                try:
                    if key is None:
                        response = await litellm.acompletion(**kwargs)
                    else:
                        response = await litellm.acompletion(**kwargs, api_key=key)
                except Exception as exc:  # noqa: BLE001 - classified below, unknown ones re-raised
                    kind = _classify(exc)
                    message = f"{spec.model}: {type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
                    if kind == "fatal":
                        raise NonRetryableLLMError(message, attempt) from exc
                    if kind == "unknown":
                        raise
                    retry = attempt  # the retry this would be
                    delay = _retry_after_s(exc)
                    if delay is None:
                        delay = policy.backoff_s(retry)
                    if retry > policy.max_retries or waited + delay > policy.max_total_wait_s:
                        raise RetriesExhaustedError(f"gave up after {attempt} attempts: {message}", attempt) from exc
                    waited += delay
                    await asyncio.sleep(delay)
                    continue
                return _parse(response, time.monotonic() - start, attempt)
