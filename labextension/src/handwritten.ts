/**
 * The answers of the REST API as they were written by hand, before the OpenAPI document described
 * them: `api.ts` uses one only where the document still says no more than "an object" (its `Answer`
 * type), so each goes away once the server describes that answer. Refer to them through `api.ts`.
 */

/** `GET /api/goals/health` */
export interface IHealth {
  status: string;
  databases?: unknown;
  workers?: unknown;
  recovery?: unknown;
  host_name?: string;
  boot_id?: string;
}

/** The `work` part of a session summary. */
export interface IWorkView {
  work_id?: string;
  desired_state?: string;
  phase: string;
  reason_code: string;
  reason: string;
  control_version?: number;
}

/** Backend-computed button permissions; the UI never infers them from state strings. */
export interface IActions {
  can_pause: boolean;
  can_resume: boolean;
  /** A session's `stop` (the button "Stop"). */
  can_stop: boolean;
  /** A Goal's `end` (the button "End"); for a session, the older name of `can_stop`. */
  can_end: boolean;
  can_retry: boolean;
  can_verify: boolean;
  reason_code: string;
}

export interface IRequirement {
  id: string;
  text: string;
  kind: string;
  command?: string | null;
  path?: string | null;
  sha256?: string | null;
}

export interface IVerdict {
  requirement_id: string;
  verdict: string;
  evidence?: unknown;
  /** In a Goal's ``verdicts``: checked for its current revision (else ``unknown``, not checked yet). */
  checked?: boolean;
}

export interface ITodoItem {
  id?: string;
  text: string;
  status: string;
  required?: boolean;
}

/** `GET /api/goals/goals/{id}` (the snapshot's `goal` has the same shape, without usage). */
export interface IGoal {
  goal_id: string;
  session_id: string;
  objective: string;
  original_objective?: string;
  requirements: IRequirement[];
  state: string;
  phase: string;
  reason_code: string;
  reason: string;
  revision: number;
  usage?: { display?: string } | null;
  actions: IActions;
  acceptance?: {
    revision: number;
    result_version: number;
    outcome: string;
    verdicts: IVerdict[];
  } | null;
  /** The verdicts that count now, one per requirement, computed by the server. */
  verdicts?: IVerdict[];
  todo?: ITodoItem[];
}

export interface IApproval {
  approval_id: string;
  session_id: string;
  tool: string;
  arguments: unknown;
  capability?: string;
  reason?: string;
  state: string;
  unknown_effects?: unknown[];
}

/** A terminal Goal record: read-only, with its own snapshot and transcript anchor. */
export interface IHistoryRecord {
  record_id: string;
  goal_id: string;
  session_id: string;
  state: string;
  snapshot: IGoal;
  anchor: { seq: number; item_id: string };
  created_at: number;
  read_only: boolean;
}

/** One durable transcript record (DESIGN §10: at least item_id, seq, kind, role, content). */
export interface ITranscriptItem {
  item_id: string;
  seq: number;
  kind: string;
  role: string;
  content: string;
  call_id?: string | null;
  tool?: string | null;
  arguments?: Record<string, unknown> | null;
  state?: string | null;
  work_id?: string | null;
  turn_id?: string | null;
  meta?: Record<string, unknown>;
}

/** A page of the transcript: `next_cursor` pages forward (`after=`), `prev_cursor` backward (`before=`). */
export interface ITranscriptPage {
  items: ITranscriptItem[];
  next_cursor?: number | null;
  prev_cursor?: number | null;
}

/** The session row itself (`model` is a configured model name or `provider:model`). */
export interface ISessionInfo {
  session_id: string;
  title?: string | null;
  cwd?: string | null;
  model?: string | null;
  permissions?: { mode?: string; allow?: unknown[] } | null;
}

/** `GET /api/goals/sessions/{id}` */
export interface ISessionSnapshot {
  session: ISessionInfo;
  work: IWorkView | null;
  goal: IGoal | null;
  todo?: ITodoItem[];
  approvals: IApproval[];
  actions: IActions;
  event_seq: number;
  transcript?: ITranscriptPage;
}

/** One entry of `GET /api/goals/models`. */
export interface IModelInfo {
  name: string;
  provider: string;
  model: string;
  credentials_present: boolean;
  priced: boolean;
  default?: boolean;
  description?: string | null;
}

/** `GET /api/goals/models` */
export interface IModelList {
  models: IModelInfo[];
  default_model?: string | null;
}

/** One recorded recovery decision of `GET /api/goals/recovery`. */
export interface IRecoveryItem {
  work_id: string;
  session_id: string;
  session_title?: string | null;
  kind?: string;
  outcome: string;
  reason_code?: string | null;
  reason?: string | null;
  decided_at?: number | null;
  actions?: Partial<IActions> | null;
}

/** `GET /api/goals/recovery`: the last recovery pass. */
export interface IRecovery {
  recovered_at?: number | null;
  host_name?: string;
  boot_id?: string;
  counts: Record<string, number>;
  items: IRecoveryItem[];
}

/** `POST /api/goals/sessions/{id}/messages` → 202 */
export interface IMessageAccepted {
  message_id: string;
  work_id: string;
  /** How the server delivers it (a `queue` sent during a recovery becomes `steer`). */
  delivery?: 'queue' | 'steer';
}

/** One entry of `GET /api/goals/sessions`. */
export interface ISessionSummary {
  session_id: string;
  title?: string | null;
  model?: string | null;
  work: IWorkView | null;
}

/** `GET /api/goals/sessions?limit=&cursor=` (keyset paging: `next_cursor` null on the last page). */
export interface ISessionList {
  sessions: ISessionSummary[];
  next_cursor?: string | number | null;
}

/** `GET /api/goals/approvals` */
export interface IApprovalList {
  approvals: IApproval[];
}

/** `GET /api/goals/sessions/{id}/history` */
export interface IHistoryList {
  records: IHistoryRecord[];
}

/** `POST /api/goals/sessions` → 201 */
export interface ISessionCreated {
  session_id: string;
}
