"""control.db's migrations (sessions, run intent, transcript, effects, approvals, Goals, waits, recovery
decisions, outbox, the event log), oldest first."""

from __future__ import annotations

from jupyter_goals.store.migrations import Migration

CONTROL_MIGRATIONS: list[Migration] = [
    (
        1,
        "initial control schema",
        """
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO counters (name, value) VALUES ('event_seq', 0);
INSERT INTO counters (name, value) VALUES ('worker_generation', 0);
INSERT INTO counters (name, value) VALUES ('transcript_seq', 0);
CREATE TABLE events (
  seq BIGINT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, session_id TEXT, work_id TEXT,
  kind TEXT NOT NULL, payload TEXT NOT NULL);
CREATE TABLE sessions (
  session_id TEXT PRIMARY KEY, title TEXT NOT NULL, cwd TEXT NOT NULL, model TEXT NOT NULL,
  permissions TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
  last_admitted_at DOUBLE PRECISION NOT NULL DEFAULT 0);
CREATE TABLE work_items (
  work_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, parent_work_id TEXT,
  input TEXT NOT NULL, input_consumed BIGINT NOT NULL DEFAULT 0,
  desired_state TEXT NOT NULL, control_version BIGINT NOT NULL, phase TEXT NOT NULL,
  reason_code TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
  permission_scope TEXT NOT NULL, objective_revision BIGINT NOT NULL DEFAULT 0,
  host_name TEXT NOT NULL, auto_recover BIGINT NOT NULL DEFAULT 1,
  commit_point BIGINT NOT NULL DEFAULT 0, recovery_attempts BIGINT NOT NULL DEFAULT 0,
  next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE INDEX work_items_phase ON work_items (phase, session_id);
CREATE TABLE messages (
  message_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, client_request_id TEXT NOT NULL,
  work_id TEXT NOT NULL, text TEXT NOT NULL, delivery TEXT NOT NULL, consumed BIGINT NOT NULL DEFAULT 0,
  created_at DOUBLE PRECISION NOT NULL, UNIQUE (session_id, client_request_id));
CREATE TABLE transcript (
  item_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  kind TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', call_id TEXT,
  provider_call_id TEXT, response_id TEXT, tool TEXT, arguments TEXT, state TEXT, meta TEXT NOT NULL DEFAULT '{}',
  created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX transcript_session_seq ON transcript (session_id, seq);
CREATE TABLE turns (
  turn_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, session_id TEXT NOT NULL, state TEXT NOT NULL,
  restricted BIGINT NOT NULL DEFAULT 0, started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION,
  end_reason TEXT);
CREATE INDEX turns_work ON turns (work_id, state);
CREATE TABLE attempts (
  attempt_id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, work_id TEXT NOT NULL, session_id TEXT NOT NULL,
  state TEXT NOT NULL, mode TEXT NOT NULL, control_version BIGINT NOT NULL,
  continuation_key TEXT NOT NULL UNIQUE, worker_id TEXT, generation BIGINT,
  heartbeat_at DOUBLE PRECISION, admitted_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION, end_reason TEXT);
CREATE INDEX attempts_state ON attempts (state);
CREATE INDEX attempts_work ON attempts (work_id);
CREATE TABLE workers (
  worker_id TEXT PRIMARY KEY, generation BIGINT NOT NULL UNIQUE, host_name TEXT NOT NULL,
  boot_id TEXT NOT NULL, pid BIGINT NOT NULL, start_time BIGINT, state TEXT NOT NULL,
  registered_at DOUBLE PRECISION NOT NULL, heartbeat_at DOUBLE PRECISION NOT NULL,
  lease_expires_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, end_reason TEXT);
CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY, call_id TEXT NOT NULL UNIQUE, work_id TEXT NOT NULL, turn_id TEXT NOT NULL,
  session_id TEXT NOT NULL, attempt_id TEXT, tool TEXT NOT NULL, arguments TEXT NOT NULL,
  capability TEXT NOT NULL, impl_identity TEXT NOT NULL, impl_digest TEXT NOT NULL, state TEXT NOT NULL,
  result TEXT, process TEXT, created_at DOUBLE PRECISION NOT NULL, dispatched_at DOUBLE PRECISION,
  ended_at DOUBLE PRECISION, seq BIGINT NOT NULL);
CREATE INDEX effects_turn ON effects (turn_id, state);
CREATE TABLE approvals (
  approval_id TEXT PRIMARY KEY, call_id TEXT NOT NULL, work_id TEXT NOT NULL, session_id TEXT NOT NULL,
  tool TEXT NOT NULL, arguments TEXT NOT NULL, arguments_digest TEXT NOT NULL, capability TEXT NOT NULL,
  control_version BIGINT NOT NULL, unknown_set_digest TEXT NOT NULL DEFAULT '', unknown_set TEXT NOT NULL DEFAULT '[]',
  state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', created_at DOUBLE PRECISION NOT NULL,
  decided_at DOUBLE PRECISION, consumed_by_attempt TEXT);
CREATE INDEX approvals_state ON approvals (state);
CREATE TABLE recovery_decisions (
  decision_key TEXT PRIMARY KEY, work_id TEXT NOT NULL, claimed_by TEXT NOT NULL, state TEXT NOT NULL,
  mode TEXT, phase TEXT, reason_code TEXT, detail TEXT NOT NULL DEFAULT '{}', control_version BIGINT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL);
CREATE TABLE outbox (
  op_key TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL,
  attempts BIGINT NOT NULL DEFAULT 0, next_attempt_at DOUBLE PRECISION NOT NULL, last_error TEXT,
  created_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION);
CREATE INDEX outbox_due ON outbox (state, next_attempt_at);
CREATE TABLE requests (
  request_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, turn_id TEXT NOT NULL,
  attempt_id TEXT NOT NULL, purpose TEXT NOT NULL, model TEXT NOT NULL, goal_id TEXT, goal_revision BIGINT,
  state TEXT NOT NULL, error TEXT, created_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE TABLE server_state (key TEXT PRIMARY KEY, value TEXT NOT NULL)
""",
    ),
    (
        2,
        "append-only logs keyed by rowid on SQLite; effects indexed by turn only; requests by attempt",
        {
            # Each tool call commits twice; every B-tree page a commit touches is one more WAL frame
            # to write and fsync. On SQLite the event and transcript logs take their seq from the
            # rowid (writers are serialized, so it is commit order) instead of a counter row, and
            # the effects index no longer moves when an effect changes state (bench/README.md).
            "sqlite": """
CREATE TABLE events_v2 (
  seq INTEGER PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, session_id TEXT, work_id TEXT,
  kind TEXT NOT NULL, payload TEXT NOT NULL);
INSERT INTO events_v2 (seq, ts, session_id, work_id, kind, payload)
  SELECT seq, ts, session_id, work_id, kind, payload FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE TABLE transcript_v2 (
  seq INTEGER PRIMARY KEY, item_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  kind TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', call_id TEXT,
  provider_call_id TEXT, response_id TEXT, tool TEXT, arguments TEXT, state TEXT, meta TEXT NOT NULL DEFAULT '{}',
  created_at DOUBLE PRECISION NOT NULL);
INSERT INTO transcript_v2 (seq, item_id, session_id, work_id, turn_id, kind, role, content, call_id,
  provider_call_id, response_id, tool, arguments, state, meta, created_at)
  SELECT seq, item_id, session_id, work_id, turn_id, kind, role, content, call_id,
  provider_call_id, response_id, tool, arguments, state, meta, created_at FROM transcript;
DROP TABLE transcript;
ALTER TABLE transcript_v2 RENAME TO transcript;
CREATE INDEX transcript_session_seq ON transcript (session_id, seq);
DELETE FROM counters WHERE name IN ('event_seq', 'transcript_seq');
DROP INDEX effects_turn;
CREATE INDEX effects_turn ON effects (turn_id);
CREATE INDEX requests_attempt ON requests (attempt_id)
""",
            "postgresql": """
DROP INDEX effects_turn;
CREATE INDEX effects_turn ON effects (turn_id);
CREATE INDEX requests_attempt ON requests (attempt_id)
""",
        },
    ),
    (
        3,
        "goals: objective revisions, todos, acceptance results, terminal history",
        """
CREATE TABLE goals (
  goal_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, objective TEXT NOT NULL,
  original_objective TEXT NOT NULL, requirements TEXT NOT NULL, requirements_state TEXT NOT NULL,
  state TEXT NOT NULL, phase TEXT NOT NULL, reason_code TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
  revision BIGINT NOT NULL, budget TEXT NOT NULL DEFAULT '{}', result_version BIGINT NOT NULL DEFAULT 0,
  verified_result_version BIGINT NOT NULL DEFAULT 0, verified_todo_version BIGINT NOT NULL DEFAULT 0,
  blocker TEXT NOT NULL DEFAULT '', blocker_count BIGINT NOT NULL DEFAULT 0, turns BIGINT NOT NULL DEFAULT 0,
  created_by TEXT NOT NULL DEFAULT 'user', created_at DOUBLE PRECISION NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION);
CREATE INDEX goals_session ON goals (session_id, created_at);
CREATE INDEX goals_work ON goals (work_id);
CREATE TABLE goal_revisions (
  goal_id TEXT NOT NULL, revision BIGINT NOT NULL, objective TEXT NOT NULL, requirements TEXT NOT NULL,
  budget TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', actor TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (goal_id, revision));
CREATE TABLE todos (
  session_id TEXT PRIMARY KEY, goal_id TEXT, items TEXT NOT NULL, version BIGINT NOT NULL,
  updated_at DOUBLE PRECISION NOT NULL);
CREATE TABLE acceptance_results (
  goal_id TEXT NOT NULL, result_version BIGINT NOT NULL, revision BIGINT NOT NULL, outcome TEXT NOT NULL,
  verdicts TEXT NOT NULL, request_ids TEXT NOT NULL DEFAULT '[]', created_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (goal_id, result_version));
CREATE TABLE goal_history (
  record_id TEXT PRIMARY KEY, goal_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL, state TEXT NOT NULL,
  snapshot TEXT NOT NULL, anchor_seq BIGINT NOT NULL, anchor_item_id TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX goal_history_session ON goal_history (session_id, anchor_seq)
""",
    ),
    (
        4,
        "hard budgets: per-request reservations and the settled usage each request is charged with",
        """
ALTER TABLE requests ADD COLUMN reserved_usd DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN reserved_tokens BIGINT;
ALTER TABLE requests ADD COLUMN reservation_expires_at DOUBLE PRECISION;
ALTER TABLE requests ADD COLUMN usage_known BIGINT;
ALTER TABLE requests ADD COLUMN partial BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN tokens BIGINT;
ALTER TABLE requests ADD COLUMN cost_usd DOUBLE PRECISION;
CREATE INDEX requests_goal ON requests (goal_id)
""",
    ),
    (
        5,
        "background Jobs, subtask results and durable waits",
        """
ALTER TABLE work_items ADD COLUMN goal_id TEXT;
ALTER TABLE work_items ADD COLUMN goal_revision BIGINT;
ALTER TABLE work_items ADD COLUMN job_id TEXT;
CREATE INDEX work_items_parent ON work_items (parent_work_id);
CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY, work_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL,
  caller_session_id TEXT NOT NULL, caller_work_id TEXT, client_request_id TEXT, goal_id TEXT, goal_revision BIGINT,
  created_at DOUBLE PRECISION NOT NULL, UNIQUE (caller_session_id, client_request_id));
CREATE TABLE work_results (
  work_id TEXT PRIMARY KEY, outcome TEXT NOT NULL, result TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE waits (
  wait_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, kind TEXT NOT NULL, handle TEXT NOT NULL, call_id TEXT,
  goal_revision BIGINT NOT NULL, control_version BIGINT NOT NULL, consumption_key TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL, outcome TEXT, result TEXT, deadline_at DOUBLE PRECISION,
  next_check_at DOUBLE PRECISION NOT NULL DEFAULT 0, checks BIGINT NOT NULL DEFAULT 0, last_error TEXT,
  created_at DOUBLE PRECISION NOT NULL, notified_at DOUBLE PRECISION, consumed_at DOUBLE PRECISION);
CREATE INDEX waits_work ON waits (work_id, state);
CREATE INDEX waits_handle ON waits (handle, state)
""",
    ),
    (
        6,
        "notebook sessions: one durable session per notebook path, kept across renames",
        """
CREATE TABLE notebook_sessions (
  path TEXT PRIMARY KEY, session_id TEXT NOT NULL,
  created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL);
CREATE INDEX notebook_sessions_session ON notebook_sessions (session_id)
""",
    ),
    (
        7,
        "front door: work and attempts by session (session lists, snapshots), recovery summaries by pass",
        """
CREATE INDEX work_items_session ON work_items (session_id, created_at);
CREATE INDEX attempts_session ON attempts (session_id);
CREATE INDEX recovery_decisions_claimed ON recovery_decisions (claimed_by)
""",
    ),
    (
        8,
        "Stop cancels running tools: a durable cancel request per effect (cancel_tool)",
        """
ALTER TABLE effects ADD COLUMN cancel_requested_at DOUBLE PRECISION
""",
    ),
    (
        9,
        "constant-cost steps and admission: a turn's open tool calls, and unknown outcomes, without reading settled calls",
        """
CREATE INDEX effects_open ON effects (turn_id, seq) WHERE state IN ('planned', 'dispatched');
CREATE INDEX effects_unknown ON effects (work_id) WHERE state = 'unknown';
CREATE INDEX jobs_caller ON jobs (caller_work_id);
CREATE INDEX transcript_response ON transcript (response_id) WHERE response_id IS NOT NULL
""",
    ),
    (
        10,
        "a call's dispatch and settling move no index entry: the open calls' index lists calls until a step tidies it",
        # v9's effects_open was partial on the state, so ``planned`` -> ``dispatched`` deleted and re-inserted
        # its entry and settling deleted it: one more WAL page on each of a tool call's two commits
        # (bench/README.md). ``listed`` is 1 from planning until a later step of the turn unlists
        # settled calls in batches (effects.open_effects_of_turn), so neither commit touches the index.
        """
ALTER TABLE effects ADD COLUMN listed INTEGER DEFAULT 1;
UPDATE effects SET listed = NULL WHERE state NOT IN ('planned', 'dispatched');
DROP INDEX effects_open;
CREATE INDEX effects_open ON effects (turn_id, seq) WHERE listed = 1
""",
    ),
    (
        11,
        "a retried POST /goals answers the same Goal (client_request_id per session); a turn keeps the model it began with",
        # turns.model is set by the turn's first model request (sessions.turn_model): a PATCH of the session's
        # model applies from its next turn, never in the middle of a running one
        """
ALTER TABLE goals ADD COLUMN client_request_id TEXT;
CREATE UNIQUE INDEX goals_client_request ON goals (session_id, client_request_id) WHERE client_request_id IS NOT NULL;
ALTER TABLE turns ADD COLUMN model TEXT
""",
    ),
    (
        12,
        "who added each allow rule of a session's permissions, when and how (issue 32: revocable always-allow rules)",
        # keyed by the rule's canonical JSON; a rule of sessions.permissions without a row predates this table
        """
CREATE TABLE allow_rules (
  session_id TEXT NOT NULL, rule_key TEXT NOT NULL, added_by TEXT NOT NULL, via TEXT NOT NULL,
  added_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (session_id, rule_key))
""",
    ),
    (
        13,
        "a work item's transcript items in seq order without a scan of its session (a notebook chat card's read)",
        "CREATE INDEX transcript_work_seq ON transcript (work_id, seq)",
    ),
]
