"""From a model name on the command line to a client the attempt loop calls.

`resolve_model` accepts, in this order: ``scripted/<policy>`` (offline, see `scripted`), ``local/smollm2`` (a real
local model, see `local`), a YAML spec path, the bare name of a YAML spec in ``agents/models/``, or any model string
litellm can route. Every error is a one-line `UserError` raised before anything starts, a missing API key variable
included (unless the caller replays, which needs no key).

`model_runtime` starts what a model needs for the length of a run (the llama.cpp server, the scripted provider)
and yields the spec to call. `open_client` wraps the `LLMClient` in `CachedClient`, which records calls into or
replays them from the experiment's `ReplayCache`; in replay it never builds an `LLMClient` at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from metakernel.agents import local, scripted
from metakernel.agents.llm import LLMClient, LLMResponse, ModelSpec
from metakernel.agents.replay import ReplayCache, ReplayMissError, request_digest

from metakernel.errors import UserError
from metakernel.plan import model_slug as model_slug  # one rule for model folder names, re-exported for callers here

SPECS_DIR = Path(__file__).resolve().parent / "models"
"""Bundled YAML specs, addressed by file stem (``resolve_model("openai-gpt-4.1")``)."""

def bundled_specs() -> list[str]:
    """Names of the YAML specs shipped in ``agents/models/``."""
    return sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))


def _override(spec: ModelSpec, api_key_env: str | None, api_base: str | None) -> ModelSpec:
    changes = {k: v for k, v in (("api_key_env", api_key_env), ("api_base", api_base)) if v is not None}
    return dataclasses.replace(spec, **changes) if changes else spec


def _check_route(model: str, api_base: str | None, where: str | None = None) -> None:
    """Fail in one line when litellm cannot tell which provider serves `model`."""
    import litellm  # after agents.llm (imported above), which pins litellm's cost map to the local copy

    litellm.suppress_debug_info = True  # else an unknown provider prints a banner to stdout
    try:
        litellm.get_llm_provider(model, api_base=api_base)
    except Exception as exc:  # noqa: BLE001 - litellm raises BadRequestError and plain errors alike
        raise UserError(f"unknown model {model!r}: litellm cannot route it (write <provider>/<model>, e.g. "
                        f"openai/gpt-4.1, or give a YAML spec; bundled: {', '.join(bundled_specs())})",
                        where) from exc


def _litellm_spec(name: str, api_key_env: str | None, api_base: str | None, require_key: bool) -> ModelSpec:
    import litellm

    _check_route(name, api_base)
    if require_key and api_key_env is None:
        env = litellm.validate_environment(name, api_base=api_base)
        if not env.get("keys_in_environment", True):
            missing = " or ".join(env.get("missing_keys") or ["its key"])
            raise UserError(f"{name}: set {missing} (or name the key's variable with --api-key-env)")
    return ModelSpec(model=name, api_key_env=api_key_env, api_base=api_base)


def resolve_model(name: str, api_key_env: str | None = None, api_base: str | None = None, *,
                  require_key: bool = True) -> ModelSpec:
    """The `ModelSpec` a model name stands for; `require_key=False` when replaying (no call, so no key)."""
    name = name.strip()
    if not name:
        raise UserError("a model name must not be empty")
    if name.startswith(f"{scripted.PROVIDER}/"):
        policy = name.removeprefix(f"{scripted.PROVIDER}/")
        if policy not in scripted.POLICIES:
            raise UserError(f"unknown scripted policy {policy!r} (known: {', '.join(scripted.POLICIES)})")
        spec = ModelSpec(model=name, max_concurrency=64)
    elif name.startswith("local/"):
        if name != local.MODEL:
            raise UserError(f"unknown local model {name!r} (known: {local.MODEL})")
        # Greedy and short: a 135M model is a smoke test of the plumbing, not a contestant.
        spec = ModelSpec(model=name, temperature=0.0, seed=0, max_tokens=512, max_concurrency=1)
    elif name.endswith((".yaml", ".yml")) or Path(name).is_file():
        path = Path(name)
        if not path.is_file():
            raise UserError("model spec file not found", name)
        spec = ModelSpec.from_yaml(path, check_key=False)
        _check_route(spec.model, api_base or spec.api_base, str(path))
    elif (SPECS_DIR / f"{name}.yaml").is_file():
        spec = ModelSpec.from_yaml(SPECS_DIR / f"{name}.yaml", check_key=False)
        _check_route(spec.model, api_base or spec.api_base, f"{name}.yaml")
    else:
        spec = _litellm_spec(name, api_key_env, api_base, require_key)
    spec = _override(spec, api_key_env, api_base)
    if require_key:
        spec.api_key()
    return spec


@contextlib.asynccontextmanager
async def model_runtime(spec: ModelSpec, *, serve: bool = True) -> AsyncIterator[ModelSpec]:
    """Start what `spec` needs for the block and yield the spec to call; `serve=False` (replay) starts nothing.

    ``local/smollm2`` becomes ``openai/smollm2`` at the running server's address whether or not it is served, so
    recorded and replayed calls share one model key.
    """
    if spec.model.startswith(f"{scripted.PROVIDER}/"):
        scripted.register()
        yield spec
    elif spec.model == local.MODEL:
        served = dataclasses.replace(spec, model=local.SERVED_MODEL, api_key_env=None)
        if not serve:
            yield served
            return
        os.environ.setdefault(local.KEY_ENV, local.DUMMY_KEY)
        async with local.serve_smollm2() as base:
            yield dataclasses.replace(served, api_base=base, api_key_env=local.KEY_ENV)
    else:
        yield spec


class CachedClient:
    """An `LLMClient` behind the record/replay cache; `complete` needs the caller's ``<attempt_id>#<turn>`` key.

    `model_calls` counts calls that reached the model (each may have been retried inside `LLMClient`), `diverged`
    replayed calls whose request differs from the recorded one, and `diverged_shape` those that differ even with
    every digit masked, i.e. by more than timings and budget counts.
    """

    def __init__(self, spec: ModelSpec, cache: ReplayCache | None) -> None:
        self.spec = spec
        self.cache = cache
        self.model_calls = 0
        self.replayed = 0
        self.diverged = 0
        self.diverged_shape = 0
        replaying = cache is not None and cache.mode == "replay"
        self._client: LLMClient | None = None if replaying else LLMClient(spec)

    def __repr__(self) -> str:
        mode = self.cache.mode if self.cache else "off"
        return f"CachedClient(model={self.spec.model!r}, cache={mode})"

    async def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                       *, key: str) -> LLMResponse:
        """Answer from the recording (replay) or call the model, recording the answer (record)."""
        digest = request_digest(messages, tools, self.spec.sampling())
        if self._client is None:
            assert self.cache is not None
            recorded = self.cache.get(self.spec.model, key)
            if recorded is None:
                raise ReplayMissError(self.spec.model, key, self.cache.path)
            self.replayed += 1
            if recorded.request.exact != digest.exact:
                self.diverged += 1
            if recorded.request.shape != digest.shape:
                self.diverged_shape += 1
            return recorded.response
        self.model_calls += 1
        response = await self._client.complete(messages, tools)
        if self.cache is not None:
            self.cache.put(self.spec.model, key, digest, response)
        return response


def open_client(spec: ModelSpec, cache: ReplayCache | None) -> CachedClient:
    """The client the attempt loop calls for one model (one per model: it holds the concurrency limit)."""
    return CachedClient(spec, cache)
