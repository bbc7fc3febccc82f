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

The names are plain re-exports (star imports of each aggregate's ``__all__``). A test that wraps a
transition (``tests/faultstore.py``) replaces it in its aggregate module and in this facade, so it sees
the calls made through ``c.<name>`` as well as those inside the store.
"""

from __future__ import annotations

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
from jupyter_goals.store.attempts import *  # noqa: F403
from jupyter_goals.store.controls import *  # noqa: F403
from jupyter_goals.store.db import FencedError, NotFound, Row, Tx, VersionConflict
from jupyter_goals.store.effects import *  # noqa: F403
from jupyter_goals.store.requests import *  # noqa: F403
from jupyter_goals.store.sessions import *  # noqa: F403
from jupyter_goals.store.shared import *  # noqa: F403
from jupyter_goals.store.transcript import *  # noqa: F403

#: the aggregate modules whose public names this facade re-exports
AGGREGATES = (_shared, _sessions, _controls, _transcript, _attempts, _effects, _requests)

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
__all__ += [name for module in AGGREGATES for name in module.__all__]
