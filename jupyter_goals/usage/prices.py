"""The versioned price table: known prices kept apart from known tokens.

A table is a JSON file (``GoalsApp.price_table``)::

    {"version": "2026-12-01",
     "models": {"openai:gpt-4o-mini": {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60,
                                       "cached_input_usd_per_mtok": 0.075,
                                       "service_tiers": {"flex": {...}}},
                "anthropic:claude-sonnet-4-5": {..., "cache_write_usd_per_mtok": 3.75},
                "openai:*": {...}},
     "free_providers": ["scripted"], "extends_shipped": false}

The package ships a dated table (``data/prices.json``: list prices of common OpenAI and Anthropic
models, with its ``as_of`` date and source) used when no file is configured. A configured file
replaces it, or, with ``"extends_shipped": true``, overrides only the entries it names. Cache reads
(``cached_tokens``) and cache writes (``cache_write_tokens``) are priced at their own rates (the input
rate when the table has none); a request served in a non-default service tier is priced with that
tier's entry, and is unknown when the table has none. A named model (``GoalsApp.models``) is priced
as the ``provider:model`` it stands for.

Its identity is the declared version plus a digest of the content, so editing a file without
bumping its version still gives a new version: receipts keep the version and the quote they were
priced with, and a changed table never rewrites them. A model the table does not name has an
unknown price (never zero), unless its provider is listed as free.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jupyter_goals.models import Usage
from jupyter_goals.providers.named import model_string, named_from_env
from jupyter_goals.store.usage import PriceRecord, Quote

_DATED = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
DEFAULT_TIERS = frozenset({"default", "standard", "auto"})  # what providers call their ordinary tier


class TierPrice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)
    cache_write_usd_per_mtok: float | None = Field(default=None, ge=0)


class ModelPrice(TierPrice):
    service_tiers: dict[str, TierPrice] = {}


class PriceTableFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1)
    as_of: str | None = None  # the date the prices were read
    source: str | None = None
    extends_shipped: bool = False
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
        if ":" not in model:
            model = _named_model_string(model)
        provider = model.partition(":")[0]
        # a dated snapshot id (claude-sonnet-4-5-20250929, gpt-4o-2024-08-06) falls back to its family
        undated = _DATED.sub("", model)
        found = self.models.get(model) or self.models.get(undated) or self.models.get(f"{provider}:*")
        if found is None and provider in self.free_providers:
            return ModelPrice(input_usd_per_mtok=0, output_usd_per_mtok=0)
        return found

    def receipt_quote(self, model: str, usage: Usage | None) -> Quote | None:
        """What the ledger records for a receipt: its cost with this table's version, or None (unknown)."""
        cost = self.quote(model, usage) if usage is not None else None
        return Quote(cost, self.version) if cost is not None else None

    def model_prices(self) -> list[PriceRecord]:
        """The table's known prices, as usage.db keeps them per version."""
        return [PriceRecord(model, p.input_usd_per_mtok, p.output_usd_per_mtok, p.cached_input_usd_per_mtok)
                for model, p in self.models.items()]

    def quote(self, model: str, usage: Usage) -> float | None:
        """The cost of ``usage`` in USD, or None when the model's (or its service tier's) price is unknown."""
        base = self.price(model)
        p: TierPrice | None = base
        tier = usage.service_tier
        if base is not None and tier and tier not in DEFAULT_TIERS and model.partition(":")[0] not in self.free_providers:
            p = base.service_tiers.get(tier)
        if p is None:
            return None
        cached = min(usage.cached_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        cached_rate = p.input_usd_per_mtok if p.cached_input_usd_per_mtok is None else p.cached_input_usd_per_mtok
        write_rate = p.input_usd_per_mtok if p.cache_write_usd_per_mtok is None else p.cache_write_usd_per_mtok
        return (
            (usage.input_tokens - cached - written) * p.input_usd_per_mtok
            + cached * cached_rate
            + written * write_rate
            + usage.output_tokens * p.output_usd_per_mtok
        ) / 1_000_000


def _named_model_string(name: str) -> str:
    """The ``provider:model`` a named model stands for (the name itself when it is not exported)."""
    spec = named_from_env().get(name)
    return model_string(spec) if spec is not None else name


def shipped_table_bytes() -> bytes:
    """The dated price table shipped with the package (``jupyter_goals/data/prices.json``)."""
    return resources.files("jupyter_goals").joinpath("data/prices.json").read_bytes()


def load_price_table(path: str | None) -> PriceTable:
    """The configured table (over the shipped one when it says ``extends_shipped``), else the shipped one."""
    shipped = shipped_table_bytes()
    if not path:
        return PriceTable.parse(shipped)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PriceTableError(f"cannot read price table {path}: {exc}") from exc
    try:
        mine = json.loads(raw)
    except ValueError as exc:
        raise PriceTableError(f"price table is not valid: {exc}") from exc
    if isinstance(mine, dict) and mine.get("extends_shipped") is True:
        base = json.loads(shipped)
        merged = {**base, **mine, "models": {**base["models"], **(mine.get("models") or {})},
                  "free_providers": sorted({*base["free_providers"], *(mine.get("free_providers") or [])})}
        return PriceTable.parse(json.dumps(merged).encode())
    return PriceTable.parse(raw)
