"""The facade of control.db's statements: ``from jupyter_goals.store import control as c``, then ``c.<name>``.

No statement lives here: each lives with its aggregate (issue 13), and this module only re-exports
their public names:

- ``store/shared.py``: time-ordered ids (``new_id``), JSON (``dumps``, ``digest``), counters, the event
  log (``emit``, ``events_after``, ``last_event_seq``), ``server_state`` flags (``get_flag``, ``set_flag``)
- ``store/sessions.py``: sessions (``page_sessions``), work items (``set_phase``, ``create_work``,
  ``finish_work``, ``set_retry_at``, …) and messages (``accept_message``, ``pending_steer``)
- ``store/controls.py``: user controls (``apply_control``, ``finish_cancelled``, ``stop_all``,
  ``change_permissions``)
- ``store/transcript.py``: transcript items (``append_item``), reads and keyset pages, drafts
- ``store/attempts.py``: workers, heartbeats and fencing (``fence``, ``mark_worker_dead``), turns and
  attempts (``admit``, ``claim_attempt``, ``end_turn``, ``end_attempt``, ``continuation_key``)
- ``store/effects.py``: effects (``plan_call``, ``mark_dispatched``, ``set_effect_state``,
  ``commit_cancelled``, ``reconcile_effect``, the unknown-effect set) and approvals
- ``store/requests.py``: paid requests and usage attribution (``record_request``, ``settle_request``,
  ``lose_request``), the usage outbox rows, ``active_time``

The other store modules keep their own tables (``goals.py``, ``waits.py``, ``recovery.py``,
``recovery_passes.py``, ``notebooks.py``; usage.db in ``usage.py``). Functions take a ``Tx`` and run
inside the caller's single transaction; each state change writes its event row (monotonic ``seq``) in
the same transaction; attempt writes start with ``fence()``.

The names are not copied here: each is a property of this module's type that reads its aggregate
module's attribute at every access (mypy reads the star imports below instead). So ``c.<name>`` always
reaches what the aggregate holds now, and a test that wraps a transition in its own module
(``tests/faultstore.py``: ``effects.mark_dispatched``, ``sessions.set_phase``, …) sees the calls made
through this facade as well as those inside the store.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING

from jupyter_goals.models import (
    AttemptState,
    DesiredState,
    EffectState,
    ItemKind,
    Phase,
    ReasonCode,
    TranscriptItem,
    TurnState,
    Usage,
    reason_text,
)
from jupyter_goals.store import attempts as _attempts
from jupyter_goals.store import controls as _controls
from jupyter_goals.store import effects as _effects
from jupyter_goals.store import requests as _requests
from jupyter_goals.store import sessions as _sessions
from jupyter_goals.store import shared as _shared
from jupyter_goals.store import transcript as _transcript
from jupyter_goals.store.db import FencedError, NotFound, Row, Tx, VersionConflict

_AGGREGATES: tuple[ModuleType, ...] = (_shared, _sessions, _controls, _transcript, _attempts, _effects, _requests)
_HOME: dict[str, ModuleType] = {name: module for module in _AGGREGATES for name in module.__all__}

if TYPE_CHECKING:
    from jupyter_goals.store.attempts import *  # noqa: F403
    from jupyter_goals.store.controls import *  # noqa: F403
    from jupyter_goals.store.effects import *  # noqa: F403
    from jupyter_goals.store.requests import *  # noqa: F403
    from jupyter_goals.store.sessions import *  # noqa: F403
    from jupyter_goals.store.shared import *  # noqa: F403
    from jupyter_goals.store.transcript import *  # noqa: F403
else:

    class _Facade(ModuleType):
        """This module's type: each re-exported name is a property that reads its aggregate module's
        attribute at every access (a property costs ~30 ns; a module ``__getattr__`` ~10x that)."""

    def _reader(module: ModuleType, name: str) -> property:
        return property(lambda _self: getattr(module, name))

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOME})

    for _name, _module in _HOME.items():
        setattr(_Facade, _name, _reader(_module, _name))
    sys.modules[__name__].__class__ = _Facade


__all__ = [
    "AttemptState",
    "DesiredState",
    "EffectState",
    "FencedError",
    "ItemKind",
    "NotFound",
    "Phase",
    "ReasonCode",
    "Row",
    "TranscriptItem",
    "TurnState",
    "Tx",
    "Usage",
    "VersionConflict",
    "reason_text",
]
