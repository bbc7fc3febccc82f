"""The server's configuration, frozen: built once from ``GoalsApp``'s traits and handed to the service,
its Coordinator and workers, and to ``jupyter goals`` (the CLI), so each decides with the same settings.

At start the service saves it (without its secrets) as ``<state_dir>/server_config.json``; the CLI,
which runs without the server's traits, reads that file, so ``recover --explain`` explains the
decisions the server would make (same default model, named models, tools, prices, limits).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CONFIG_FILE = "server_config.json"


@dataclass(frozen=True)
class GoalsConfig:
    state_dir: Path
    control_db_url: str
    usage_db_url: str
    default_model: str
    workers: int = 1
    max_concurrent_turns: int = 4
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    auto_recover: bool = True
    allow_cross_host_takeover: bool = False
    reconcile_interval_s: float = 5.0
    safety_tick_s: float = 1.0  # admission and worker claim checks without a wake-up (reads only when idle)
    trusted_tools: dict[str, Any] | None = None
    max_recovery_attempts: int = 5
    recovery_backoff_s: float = 1.0
    retry_base_s: float = 1.0
    price_table: str = ""
    models: dict[str, Any] | None = None  # GoalsApp.models, validated when the service is built
    demo_model: str = ""  # the bundled demo script's model string (listed as "demo")
    tool_env_allow: tuple[str, ...] = ()
    cancel_grace_s: float = 5.0
    max_request_bytes: int = 8 * 1024 * 1024  # a REST request body larger than this: 413, before parsing
    max_message_chars: int = 1_000_000  # any string of a request body (a message's text …) longer: 413
    # credentials of the server itself (its token): redacted from tool output, never given to workers'
    # env, never saved
    secrets: dict[str, str] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """Everything but the secrets, as JSON values."""
        out = asdict(self)
        out.pop("secrets")
        out["state_dir"] = str(self.state_dir)
        out["tool_env_allow"] = list(self.tool_env_allow)
        return out

    def save(self) -> Path:
        """Write ``server_config.json`` into the state dir (replaced atomically; secrets left out)."""
        path = self.state_dir / CONFIG_FILE
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.public(), indent=2, sort_keys=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, state_dir: Path) -> GoalsConfig | None:
        """The configuration the server last started with on this state dir (None: never saved or
        unreadable). Keys this code does not know are ignored; the state dir is the one given."""
        try:
            raw = json.loads((state_dir / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        known = {f.name for f in fields(cls)} - {"secrets", "state_dir"}
        values = {k: v for k, v in raw.items() if k in known}
        values["tool_env_allow"] = tuple(values.get("tool_env_allow") or ())
        try:
            return cls(state_dir=state_dir, **values)
        except TypeError:
            return None
