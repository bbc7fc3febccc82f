"""Model providers: the scripted offline provider and real adapters behind one interface."""

from jupyter_goals.providers.base import Provider, ProviderError, ProviderUnavailable
from jupyter_goals.providers.resolve import check_model, resolve_provider

__all__ = ["Provider", "ProviderError", "ProviderUnavailable", "check_model", "resolve_provider"]
