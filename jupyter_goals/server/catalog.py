"""The model catalog behind ``GET /models`` and ``POST /sessions {model}`` (DESIGN §14 ``models``).

A session's model is a listed name or a ``provider:model`` string. A name is stored resolved to the
``provider:model`` string that means the same thing (``scripted:<path>``, ``openai:<model>``), so
workers need no catalog; only a named model with its own ``base_url`` or ``api_key_env`` keeps its
name, and workers resolve it through ``JUPYTER_GOALS_MODELS`` (:func:`export_named`), which the
server sets before it starts them. Pure apart from reading the environment it is given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from jupyter_goals.models import ModelInfo, ModelSpec
from jupyter_goals.providers.base import DEFAULT_KEY_ENV, key_required, read_key
from jupyter_goals.providers.named import NAMED_ENV, model_string, named_from_env, parse_specs
from jupyter_goals.usage.prices import PriceTable

__all__ = ["NAMED_ENV", "ModelCatalog", "UnknownModel", "model_string", "named_from_env", "parse_specs"]

DEMO_NAME = "demo"
DEMO_DESCRIPTION = (
    'The offline demo model (no API key): say "list" to run ls -la, "slow" for a 10 s command you can'
    ' interrupt, "write hello.txt" for a file write that asks for your approval, or set the Goal'
    ' "write hello.txt saying hello" and watch it get verified and achieved.'
)


class UnknownModel(ValueError):
    """A session asked for a model that is neither listed nor a ``provider:model`` string."""


def key_env(spec: ModelSpec) -> str | None:
    return spec.api_key_env or DEFAULT_KEY_ENV.get(spec.provider)


def needs_name(spec: ModelSpec) -> bool:
    """True when ``provider:model`` alone would lose the spec's endpoint, credentials, tier or output limit."""
    return (spec.base_url is not None or spec.api_key_file is not None or spec.service_tier is not None
            or spec.max_output_tokens is not None or spec.context_window is not None
            or (spec.api_key_env is not None and spec.api_key_env != DEFAULT_KEY_ENV.get(spec.provider)))


def spec_of(model: str) -> ModelSpec | None:
    """The spec a ``provider:model`` string stands for (None when it is not one)."""
    provider, sep, rest = model.partition(":")
    if not sep or not rest or provider not in ("scripted", "openai", "anthropic"):
        return None
    return ModelSpec(provider=provider, model=rest)  # type: ignore[arg-type]


class ModelCatalog:
    """The server's listed models: the configured ones, plus its default model (named ``demo`` when it
    is the bundled demo script). ``default_model`` is the string a session gets when it names none."""

    def __init__(self, default_model: str, specs: Mapping[str, ModelSpec], demo_model: str,
                 prices: PriceTable, environ: Mapping[str, str] | None = None) -> None:
        self.specs = dict(specs)
        self.prices = prices
        self.environ = os.environ if environ is None else environ
        self.default_name = default_model
        if default_model not in self.specs:
            found = next((n for n, s in self.specs.items() if model_string(s) == default_model and not needs_name(s)), None)
            if found is not None:
                self.default_name = found
            elif default_model == demo_model:
                self.default_name = DEMO_NAME
                spec = spec_of(default_model)
                assert spec is not None
                self.specs = {DEMO_NAME: spec.model_copy(update={"description": DEMO_DESCRIPTION}), **self.specs}
            elif (spec := spec_of(default_model)) is not None:
                self.specs = {default_model: spec, **self.specs}
        self.default_model = default_model if self.default_name not in self.specs else self.resolve(self.default_name)

    def info(self) -> list[ModelInfo]:
        listed = []
        for name, spec in self.specs.items():
            price = self.prices.price(model_string(spec))
            listed.append(ModelInfo(
                name=name, provider=spec.provider, model=spec.model, credentials_present=self.credentials_present(spec),
                priced=price is not None, default=name == self.default_name, description=spec.description,
                context_window=spec.context_window, max_output_tokens=spec.max_output_tokens,
                price=price.model_dump(exclude_none=True, exclude_defaults=True) if price is not None else None))
        if self.default_name not in self.specs:  # a default that is no provider:model string is still shown
            listed.insert(0, ModelInfo(name=self.default_name, provider="unknown", model=self.default_name,
                                       credentials_present=False, priced=False, default=True,
                                       description="The server's default model is not a provider:model string."))
        return listed

    def credentials_present(self, spec: ModelSpec) -> bool:
        """A key in the environment or the model's key file, or none needed (a local endpoint)."""
        env = key_env(spec)
        if env is None:
            return True
        if read_key(env, spec.api_key_file, self.environ) is not None:
            return True
        default_url = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}[spec.provider]
        base_url = spec.base_url or self.environ.get(f"{spec.provider.upper()}_BASE_URL") or None
        return not key_required(spec, base_url, default_url)

    def resolve(self, requested: str) -> str:
        """The model string to store for a session: a listed name, or a ``provider:model`` string."""
        spec = self.specs.get(requested)
        if spec is not None:
            return requested if needs_name(spec) else model_string(spec)
        if spec_of(requested) is not None:
            return requested
        names = ", ".join(sorted(self.specs))
        raise UnknownModel(f"unknown model {requested!r}: use one of {names}, or a provider:model string"
                           " (scripted:<path.json>, openai:<model>, anthropic:<model>)")

    def export_named(self) -> str:
        """JSON of the named models workers resolve by name (only those :func:`needs_name`)."""
        return json.dumps({n: s.model_dump(exclude_none=True) for n, s in self.specs.items() if needs_name(s)})


