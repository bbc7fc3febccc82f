"""Model providers: the scripted offline provider and real adapters behind one interface.

Owns the ``Provider`` protocol and its errors, the adapters (``scripted``, ``openai_compat``,
``anthropic``), named models as workers see them (``named``) and resolution of a model string to an
adapter (``resolve``). May import only the ground modules.
"""

from jupyter_goals.providers.base import Provider, ProviderError, ProviderUnavailable
from jupyter_goals.providers.resolve import check_model, resolve_provider

__all__ = ["Provider", "ProviderError", "ProviderUnavailable", "check_model", "resolve_provider"]
