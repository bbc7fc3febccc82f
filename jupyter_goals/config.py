"""The server's configuration, frozen and validated once: built from ``GoalsApp``'s traits and handed,
as this one object, to the service, its Coordinator, each worker and ``jupyter goals`` (the CLI), so
each decides with the same settings under the same names (every field is named as its trait,
``GoalsApp.<name>``).

A worker receives it as one JSON document on its stdin (``document()``, the secrets included; never on
its command line or in its environment) and validates it again on arrival (``from_document``). At start
the service saves it without its secrets as ``<state_dir>/server_config.json``; the CLI, which runs
without the server's traits, reads that file, so ``recover --explain`` explains the decisions the
server would make (same default model, named models, tools, prices, limits).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CONFIG_FILE = "server_config.json"

Seconds = Annotated[float, Field(gt=0)]
Delay = Annotated[float, Field(ge=0)]


class ConfigError(ValueError):
    """A configuration refused as a whole; the message names each wrong setting (``GoalsApp.<name>``)."""


class GoalsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path
    control_db_url: str = ""  # empty: SQLite in the state dir
    usage_db_url: str = ""  # empty: SQLite in the state dir
    default_model: str
    workers: Annotated[int, Field(ge=0)] = 1
    max_concurrent_turns: Annotated[int, Field(ge=1)] = 4  # the shared quota, and each worker's capacity
    lease_ttl_s: Seconds = 10.0
    heartbeat_s: Seconds = 2.0
    auto_recover: bool = True
    allow_cross_host_takeover: bool = False
    reconcile_interval_s: Seconds = 5.0
    safety_tick_s: Seconds = 1.0  # admission and worker claim checks without a wake-up (reads only when idle)
    price_table: str = ""
    trusted_tools: dict[str, Any] = Field(default_factory=dict)
    max_recovery_attempts: Annotated[int, Field(ge=0)] = 5
    recovery_backoff_s: Delay = 1.0
    provider_retry_base_s: Delay = 1.0
    shutdown_timeout_s: Seconds = 10.0
    models: dict[str, Any] = Field(default_factory=dict)  # GoalsApp.models, validated when the service is built
    cancel_grace_s: Delay = 5.0
    max_request_bytes: Annotated[int, Field(gt=0)] = 8 * 1024 * 1024  # a larger REST body: 413, before parsing
    max_message_chars: Annotated[int, Field(gt=0)] = 1_000_000  # any longer string of a request body: 413
    tool_env_allow: tuple[str, ...] = ()
    demo_model: str = ""  # not a trait: the bundled demo script's model string (listed as "demo")
    # not a trait: credentials of the server itself (its token), redacted from tool output; a worker gets
    # them in its stdin document only, never in its env or argv; never saved, never in a repr
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _stores_in_state_dir(cls, values: Any) -> Any:
        """The state dir made absolute; a store URL left empty becomes the SQLite file in it."""
        if isinstance(values, dict) and isinstance(values.get("state_dir"), str | Path) and values["state_dir"]:
            state = Path(values["state_dir"]).expanduser().absolute()
            values = {**values, "state_dir": str(state)}
            for name, file in (("control_db_url", "control.db"), ("usage_db_url", "usage.db")):
                if not values.get(name):
                    values[name] = f"sqlite:///{state / file}"
        return values

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> GoalsConfig:
        if self.heartbeat_s >= self.lease_ttl_s:
            raise ValueError(f"GoalsApp.heartbeat_s ({self.heartbeat_s}) must be shorter than GoalsApp.lease_ttl_s"
                             f" ({self.lease_ttl_s}): a worker's lease would expire between two of its heartbeats")
        return self

    @classmethod
    def validated(cls, values: dict[str, Any]) -> GoalsConfig:
        """The configuration of ``values`` (traits by name); ``ConfigError`` naming each wrong setting."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(problems(exc)) from None

    def replace(self, **changes: Any) -> GoalsConfig:
        """This configuration with ``changes``, validated again."""
        return self.validated({**self.model_dump(), **changes})

    # ------------------------------------------------------------------ a worker's document
    def document(self) -> str:
        """The whole configuration, secrets included, as the one JSON document a worker reads on stdin."""
        return self.model_dump_json()

    @classmethod
    def from_document(cls, text: str) -> GoalsConfig:
        """A worker's configuration from its stdin document; ``ConfigError`` saying what is wrong."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ConfigError(problems(exc)) from None

    # ------------------------------------------------------------------ server_config.json
    def public(self) -> dict[str, Any]:
        """Everything but the secrets, as JSON values."""
        return self.model_dump(mode="json", exclude={"secrets"})

    def save(self) -> Path:
        """Write ``server_config.json`` into the state dir (replaced atomically; secrets left out)."""
        path = self.state_dir / CONFIG_FILE
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.public(), indent=2, sort_keys=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, state_dir: Path) -> GoalsConfig | None:
        """The configuration the server last started with on this state dir (None: never saved, unreadable
        or invalid). Keys this code does not know are ignored; the state dir is the one given."""
        try:
            raw = json.loads((state_dir / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        known = set(cls.model_fields) - {"secrets", "state_dir"}
        try:
            return cls.model_validate({**{k: v for k, v in raw.items() if k in known}, "state_dir": state_dir})
        except ValidationError:
            return None


def problems(exc: ValidationError) -> str:
    """One line per refused setting, named as its trait; a secret's value is never repeated."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        where = f"GoalsApp.{'.'.join(loc)}: " if loc else ""
        value = error.get("input")
        # only a setting's own plain value is repeated (a missing field's input is the whole document)
        plain = loc and loc[0] != "secrets" and error["type"] != "missing" and isinstance(value, str | int | float)
        given = f" (given {value!r})" if plain else ""
        message = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        lines.append(f"{where}{message}{given}")
    return "; ".join(lines)
