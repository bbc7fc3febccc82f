"""Model string → adapter: ``scripted:``, ``openai:``, ``anthropic:`` and named models.

The only module that imports every adapter; the adapters import ``base`` (errors, protocol, keys), so
the arrows point one way. The key is read at resolution, so the Coordinator's per-pass ``check_model``
sees a key file that appears.
"""

from __future__ import annotations

import os

from jupyter_goals.models import ModelSpec, ReasonCode
from jupyter_goals.providers.anthropic import AnthropicProvider
from jupyter_goals.providers.base import Provider, ProviderUnavailable
from jupyter_goals.providers.named import named_from_env
from jupyter_goals.providers.openai_compat import OpenAICompatProvider
from jupyter_goals.providers.scripted import ScriptedProvider


def check_model(model: str) -> ReasonCode | None:
    """Resource check used by recovery: None when the model can be served, else the waiting reason."""
    try:
        resolve_provider(model)
    except ProviderUnavailable as exc:
        return exc.reason_code
    return None


def resolve_provider(model: str) -> Provider:
    if ":" not in model:  # a named model (GoalsApp.models) that keeps its own endpoint or key variable
        spec = named_from_env().get(model)
        if spec is None:
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"model {model!r} is not configured here")
        return provider_for(spec)
    kind, _, rest = model.partition(":")
    if kind == "scripted":
        if not rest or not os.path.isfile(rest):
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"script file not found: {rest!r}")
        return ScriptedProvider(rest)
    if kind in ("openai", "anthropic"):
        if not rest.strip():
            raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"no model name after '{kind}:'")
        return provider_for(ModelSpec(provider=kind, model=rest))  # type: ignore[arg-type]
    raise ProviderUnavailable(ReasonCode.RESOURCE_MISSING_MODEL, f"unknown model kind in {model!r}")


def provider_for(spec: ModelSpec) -> Provider:
    """The provider for one model spec; ``<PROVIDER>_BASE_URL`` applies when the spec has no ``base_url``."""
    if spec.provider == "scripted":
        return resolve_provider(f"scripted:{spec.model}")
    if spec.provider == "openai":
        return OpenAICompatProvider.for_spec(spec)
    return AnthropicProvider.for_spec(spec)
