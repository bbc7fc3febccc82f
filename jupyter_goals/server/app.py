"""GoalsApp: the Jupyter server extension hosting the Coordinator, worker supervisor and outbox."""

from __future__ import annotations

import asyncio
import os
from importlib.resources import files
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, default, validate

from jupyter_goals.config import ConfigError, GoalsConfig
from jupyter_goals.host.secrecy import allow_entry_problem
from jupyter_goals.server import guard
from jupyter_goals.server.handlers import handlers
from jupyter_goals.server.service import GoalsService

CONTENTS_EVENTS = "https://events.jupyter.org/jupyter_server/contents_service/v1"


def demo_model() -> str:
    return "scripted:" + str(files("jupyter_goals") / "data" / "demo_script.json")


class GoalsApp(ExtensionApp):
    name = "jupyter_goals"
    load_other_extensions = True

    state_dir = Unicode(help="Where control.db, usage.db, tool output and fault markers live.").tag(config=True)
    control_db_url = Unicode("", help="control.db URL: sqlite:///path (default: in state_dir) or postgresql://…").tag(config=True)
    usage_db_url = Unicode("", help="usage.db URL: sqlite:///path (default: in state_dir) or postgresql://…").tag(config=True)
    default_model = Unicode(help="Model for new sessions: scripted:<path.json>, openai:<model>, anthropic:<model>.").tag(config=True)
    workers = Int(1, help="Worker processes.").tag(config=True)
    max_concurrent_turns = Int(4, help="Shared quota of turn attempts running at once.").tag(config=True)
    lease_ttl_s = Float(10.0, help="Worker lease length in seconds.").tag(config=True)
    heartbeat_s = Float(2.0, help="Worker heartbeat interval in seconds.").tag(config=True)
    auto_recover = Bool(True, help="Continue interrupted work automatically after a restart.").tag(config=True)
    allow_cross_host_takeover = Bool(False, help="Take over work whose owner on another host stopped heartbeating.").tag(config=True)
    reconcile_interval_s = Float(5.0, help="The Coordinator's periodic full reconcile tick in seconds.").tag(config=True)
    safety_tick_s = Float(1.0, help="Without a wake-up, the admission loop and each worker still look for due"
                          " work this often (reads only when nothing changed); commits that create work"
                          " wake them at once.").tag(config=True)
    price_table = Unicode("", help="Path of a price table (JSON).").tag(config=True)
    trusted_tools = Dict(help="Extra tools by implementation identity: {name: {impl: 'module:qualname', capability}}.").tag(config=True)
    max_recovery_attempts = Int(5, help="Recoveries allowed in a row after executor deaths charged to a work item; the next death fails it.").tag(config=True)
    recovery_backoff_s = Float(1.0, help="Base of the growing backoff between repeated recoveries.").tag(config=True)
    provider_retry_base_s = Float(1.0, help="Base of the durable backoff after a temporary provider fault.").tag(config=True)
    shutdown_timeout_s = Float(10.0, help="Bound on graceful shutdown.").tag(config=True)
    models = Dict(help="Named models: {name: {provider: scripted|openai|anthropic, model, base_url?, api_key_env?,"
                  " context_window?, max_output_tokens?, description?}}; listed by GET /api/goals/models.").tag(config=True)
    cancel_grace_s = Float(5.0, help="Stop / cancel: SIGTERM to a running tool's process group, SIGKILL after this many seconds.").tag(config=True)
    max_request_bytes = Int(8 * 1024 * 1024, help="Largest REST request body in bytes; a larger one is refused"
                            " (413 request_too_large) before it is parsed.").tag(config=True)
    max_message_chars = Int(1_000_000, help="Longest text in a REST request (a message, a Job's input, a Goal's"
                            " objective or requirement, a title) in characters; a longer one is refused"
                            " (413 text_too_large) and nothing is saved.").tag(config=True)
    tool_env_allow = List(
        Unicode(),
        help="Environment variables a tool process may see beyond PATH, HOME, LANG, TERM, … (names or globs; "
        "a secret-looking name such as *TOKEN*, *KEY*, *SECRET*, *PASSWORD* passes only when named exactly). "
        "One entry per flag: --GoalsApp.tool_env_allow=MY_SETTING --GoalsApp.tool_env_allow='PROJ_*'.",
    ).tag(config=True)

    @validate("tool_env_allow")
    def _validate_tool_env_allow(self, proposal: Any) -> list[str]:
        """An entry that cannot be a variable name or glob (e.g. a whole JSON list given as one flag,
        which traitlets keeps as one string) is refused loudly instead of silently matching nothing."""
        value = list(proposal["value"])
        for entry in value:
            problem = allow_entry_problem(entry)
            if problem:
                raise TraitError(
                    f"GoalsApp.tool_env_allow: {entry!r} is not an environment variable name or glob ({problem}); "
                    "give one name or glob per flag, e.g. --GoalsApp.tool_env_allow=MY_SETTING "
                    "--GoalsApp.tool_env_allow='PROJ_*', or c.GoalsApp.tool_env_allow = ['MY_SETTING', 'PROJ_*'] "
                    "in jupyter_server_config.py"
                )
        return value

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.environ.get("JUPYTER_GOALS_STATE_DIR") or os.path.join(jupyter_data_dir(), "jupyter_goals")

    @default("default_model")
    def _default_model(self) -> str:
        return demo_model()

    def service_config(self) -> GoalsConfig:
        """The one configuration, validated once (``ConfigError`` names each wrong setting): every trait
        under its own name, ``JUPYTER_GOALS_STATE_DIR`` before ``state_dir``, and the server's secrets."""
        names = set(self.trait_names(config=True)) & set(GoalsConfig.model_fields)
        traits = {name: getattr(self, name) for name in names}
        return GoalsConfig.validated({**traits, "state_dir": os.environ.get("JUPYTER_GOALS_STATE_DIR") or self.state_dir,
                                      "demo_model": demo_model(), "secrets": self._server_secrets()})

    def _server_secrets(self) -> dict[str, str]:
        """The server's own token, redacted from every tool result (it never enters a worker's env)."""
        token = getattr(getattr(self.serverapp, "identity_provider", None), "token", "") if self.serverapp else ""
        return {"JUPYTER_GOALS_TOKEN": token} if token else {}

    # why linking this extension's configuration failed (a TraitError such as a bad tool_env_allow entry)
    _config_error: str = ""

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        try:
            super()._link_jupyter_server_extension(serverapp)
        except Exception as exc:
            self._config_error = str(exc) or type(exc).__name__
            raise

    def initialize_settings(self) -> None:
        try:
            config = self.service_config() if not self._config_error else None
        except ConfigError as exc:  # a value traitlets accepts but the configuration refuses, e.g. heartbeat_s=0
            config, self._config_error = None, str(exc)
        if config is None:
            # traitlets rolled back every GoalsApp setting; running on defaults (another state dir or
            # database, another model) would hide the mistake: the extension is not started at all
            self.log.error("jupyter_goals is not started, its configuration is invalid: %s", self._config_error)
            raise TraitError(f"jupyter_goals is not started, its configuration is invalid: {self._config_error}")
        self.service = GoalsService(config)
        self.settings["jupyter_goals_service"] = self.service
        # Jupyter's terminals, kernels and sessions are refused to our tool processes (server/guard.py)
        guard.install(self.settings)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers(""))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self._config_error:  # not started (initialize_settings said why)
            return
        # kernels started by this server find it through these variables (the notebook client)
        os.environ["JUPYTER_GOALS_SERVER_URL"] = serverapp.connection_url
        if getattr(serverapp.identity_provider, "token", None):
            os.environ["JUPYTER_GOALS_TOKEN"] = serverapp.identity_provider.token
        # a renamed or moved notebook keeps its session (jupyter_server's contents events)
        serverapp.event_logger.add_listener(schema_id=CONTENTS_EVENTS, listener=self._on_contents_event)
        guard.install(serverapp.web_app.settings)  # again, should an extension loaded after us have replaced it
        await self.service.start()

    async def _on_contents_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data.get("action") != "rename" or not data.get("source_path"):
            return
        try:
            await self.service.notebook_renamed(str(data["source_path"]), str(data["path"]))
        except Exception:  # a listener error must not fail the user's rename
            self.log.exception("jupyter_goals: could not follow the rename of %s", data.get("source_path"))

    def current_activity(self) -> list[dict[str, Any]] | None:
        if self._config_error:
            return None
        sup = self.service.supervisor
        return [{"workers": len(sup.procs)}] if sup and sup.procs else None

    async def stop_extension(self) -> None:
        if self._config_error:
            return
        try:
            await asyncio.wait_for(self.service.stop(self.shutdown_timeout_s), self.shutdown_timeout_s + 5)
        except TimeoutError:
            self.log.warning("jupyter_goals: graceful shutdown timed out")
