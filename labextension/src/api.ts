import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

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

/** One entry of `GET /api/goals/events?format=json`. */
export interface IGoalsEvent {
  seq: number;
  kind: string;
  session_id: string | null;
  work_id: string | null;
  payload: Record<string, unknown>;
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

/** A request to the goals REST API that did not produce the expected JSON. */
export class GoalsAPIError extends Error {
  constructor(
    readonly path: string,
    message: string,
    /** HTTP status, when the server answered (409: version conflict). */
    readonly status: number = 0,
    /** The server's error `message`, without the path prefix. */
    readonly detail: string = message
  ) {
    super(`${path}: ${message}`);
    this.name = 'GoalsAPIError';
  }
}

/**
 * GET a JSON document under `<baseUrl>/api/goals/…`.
 *
 * Network failures, non-2xx answers and bodies that are not JSON all reject
 * with a `GoalsAPIError`; callers never see a half-parsed value.
 */
export async function requestGoalsAPI<T>(
  path: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  method: 'GET' | 'POST' | 'PATCH' = 'GET',
  body?: unknown
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'api/goals', path);
  const init: RequestInit = { method, cache: 'no-store' };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'Content-Type': 'application/json' };
  }
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new GoalsAPIError(path, `network error: ${describe(error)}`);
  }
  if (!response.ok) {
    const status = `HTTP ${response.status} ${response.statusText}`.trim();
    const detail = await serverMessage(response);
    throw new GoalsAPIError(
      path,
      detail ? `${status}: ${detail}` : status,
      response.status,
      detail || status
    );
  }
  try {
    return (await response.json()) as T;
  } catch (error) {
    throw new GoalsAPIError(path, `invalid JSON: ${describe(error)}`);
  }
}

/** The `message` of a Jupyter server JSON error body, if there is one. */
async function serverMessage(response: Response): Promise<string> {
  try {
    const body: unknown = await response.json();
    const message =
      typeof body === 'object' && body !== null
        ? (body as { message?: unknown }).message
        : undefined;
    return typeof message === 'string' ? message.slice(0, 300) : '';
  } catch {
    return '';
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Runtime shape checks: the panel never renders from a malformed body. */
export function isHealth(value: unknown): value is IHealth {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { status?: unknown }).status === 'string'
  );
}

export function isSessionList(value: unknown): value is ISessionList {
  return (
    typeof value === 'object' &&
    value !== null &&
    Array.isArray((value as { sessions?: unknown }).sessions)
  );
}

/** POST a JSON body under `<baseUrl>/api/goals/…`; rejects like `requestGoalsAPI`. */
export function postGoalsAPI<T>(
  path: string,
  body: unknown,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  return requestGoalsAPI<T>(path, settings, 'POST', body);
}
