"""The versioned price table: known prices kept apart from known tokens.

A table is a JSON file (``GoalsApp.price_table``)::

    {"version": "2026-12-01",
     "models": {"openai:gpt-4o-mini": {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60,
                                       "cached_input_usd_per_mtok": 0.075},
                "openai:*": {...}},
     "free_providers": ["scripted"]}

Its identity is the declared version plus a digest of the content, so editing a file without
bumping its version still gives a new version: receipts keep the version and the quote they were
priced with, and a changed table never rewrites them. A model the table does not name has an
unknown price (never zero), unless its provider is listed as free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jupyter_goals.models import Usage

BUNDLED = {"version": "bundled-1", "models": {}, "free_providers": ["scripted"]}


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)


class PriceTableFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1)
    models: dict[str, ModelPrice] = {}
    free_providers: list[str] = []


class PriceTableError(ValueError):
    pass


class PriceTable:
    def __init__(self, table: PriceTableFile, digest: str) -> None:
        self.declared = table.version
        self.version = f"{table.version}:{digest[:12]}"
        self.models = table.models
        self.free_providers = set(table.free_providers)

    @classmethod
    def parse(cls, raw: bytes) -> PriceTable:
        try:
            table = PriceTableFile.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            raise PriceTableError(f"price table is not valid: {exc}") from exc
        canonical = json.dumps(table.model_dump(), sort_keys=True).encode()
        return cls(table, hashlib.sha256(canonical).hexdigest())

    def price(self, model: str) -> ModelPrice | None:
        provider = model.partition(":")[0]
        found = self.models.get(model) or self.models.get(f"{provider}:*")
        if found is None and provider in self.free_providers:
            return ModelPrice(input_usd_per_mtok=0, output_usd_per_mtok=0)
        return found

    def quote(self, model: str, usage: Usage) -> float | None:
        """The cost of ``usage`` in USD, or None when the model's price is unknown."""
        p = self.price(model)
        if p is None:
            return None
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_rate = p.input_usd_per_mtok if p.cached_input_usd_per_mtok is None else p.cached_input_usd_per_mtok
        return (
            (usage.input_tokens - cached) * p.input_usd_per_mtok
            + cached * cached_rate
            + usage.output_tokens * p.output_usd_per_mtok
        ) / 1_000_000


def load_price_table(path: str | None) -> PriceTable:
    """The configured table, or the bundled one (no paid prices; the offline scripted provider is free)."""
    if not path:
        return PriceTable.parse(json.dumps(BUNDLED).encode())
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PriceTableError(f"cannot read price table {path}: {exc}") from exc
    return PriceTable.parse(raw)
