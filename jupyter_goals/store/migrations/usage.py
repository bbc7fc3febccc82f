"""usage.db's migrations (the ledger of record: requests, receipts, activity, prices), oldest first."""

from __future__ import annotations

from jupyter_goals.store.migrations import Migration

USAGE_MIGRATIONS: list[Migration] = [
    (
        1,
        "initial usage schema",
        """
CREATE TABLE receipts (
  receipt_key TEXT PRIMARY KEY, request_id TEXT NOT NULL, session_id TEXT NOT NULL, work_id TEXT,
  turn_id TEXT, goal_id TEXT, goal_revision BIGINT, job_id TEXT, purpose TEXT, provider TEXT, model TEXT,
  usage_known BIGINT NOT NULL, input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,
  cached_tokens BIGINT NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL, applied_at DOUBLE PRECISION NOT NULL);
CREATE INDEX receipts_session ON receipts (session_id);
CREATE INDEX receipts_goal ON receipts (goal_id);
CREATE TABLE activity (
  interval_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, work_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL, stopped_at DOUBLE PRECISION, last_heartbeat_at DOUBLE PRECISION NOT NULL,
  stop_known BIGINT NOT NULL DEFAULT 1)
""",
    ),
    (
        2,
        "request ledger with attribution, receipt quotes and lower bounds, versioned prices",
        """
CREATE TABLE requests (
  request_id TEXT PRIMARY KEY, attempt_id TEXT, session_id TEXT NOT NULL, work_id TEXT, turn_id TEXT,
  goal_id TEXT, goal_revision BIGINT, job_id TEXT, reservation_id TEXT, parent_request_id TEXT,
  purpose TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, service_tier TEXT,
  state TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, settled_at DOUBLE PRECISION);
CREATE INDEX requests_session ON requests (session_id);
CREATE INDEX requests_goal ON requests (goal_id);
CREATE INDEX requests_work ON requests (work_id);
CREATE INDEX receipts_work ON receipts (work_id);
ALTER TABLE receipts ADD COLUMN attempt_id TEXT;
ALTER TABLE receipts ADD COLUMN partial BIGINT NOT NULL DEFAULT 0;
ALTER TABLE receipts ADD COLUMN price_version TEXT;
ALTER TABLE receipts ADD COLUMN cost_usd DOUBLE PRECISION;
CREATE TABLE prices (
  price_version TEXT NOT NULL, model TEXT NOT NULL, input_usd_per_mtok DOUBLE PRECISION NOT NULL,
  output_usd_per_mtok DOUBLE PRECISION NOT NULL, cached_input_usd_per_mtok DOUBLE PRECISION,
  loaded_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (price_version, model))
""",
    ),
]
