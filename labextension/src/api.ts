import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { components, paths } from './openapi';
import type { GoalsURL } from './urls';

/*
 * The REST API's types come from its OpenAPI document: `labextension/openapi.json` is a snapshot of
 * `GET /api/goals/openapi.json` (refreshed with `python -m jupyter_goals.server.openapi >
 * labextension/openapi.json`; tests/test_openapi_snapshot.py fails while it is stale), and every
 * build generates `src/openapi.ts` from it with openapi-typescript (`jlpm build:types`). Every
 * answer has its schema there (the server builds each from a pydantic response model).
 */

/** The document's named schemas: request bodies, `Error`, `Event`, `EventPage`, and what they refer to. */
export type Schemas = components['schemas'];

type Method = 'get' | 'put' | 'post' | 'patch' | 'delete';
type Responses<P extends keyof paths, M extends Method> =
  NonNullable<paths[P][M]> extends { responses: infer R } ? R : never;
type JsonOf<T> = T extends { content: { 'application/json': infer B } } ? B : never;
/** The JSON answer `status` of `method path` as the document describes it. */
export type Answer<P extends keyof paths, M extends Method, S extends keyof Responses<P, M>> = JsonOf<
  Responses<P, M>[S]
>;

/** Every JSON request body the document lists (a POST, PUT or PATCH of this API sends one of them). */
export type RequestBody = {
  [P in keyof paths]: {
    [M in Method]: NonNullable<paths[P][M]> extends { requestBody?: infer B } ? JsonOf<NonNullable<B>> : never;
  }[Method];
}[keyof paths];

/** `POST /api/goals/sessions` */
export type ICreateSession = Schemas['CreateSession'];
/** `POST /api/goals/sessions/{id}/messages` */
export type IPostMessage = Schemas['PostMessage'];
/** `POST /api/goals/sessions/{id}/actions` */
export type ISessionAction = Schemas['SessionAction'];
/** `POST /api/goals/goals` */
export type ICreateGoal = Schemas['CreateGoal'];
/** `POST /api/goals/goals/{id}/actions` */
export type IGoalAction = Schemas['GoalAction'];
/** `POST /api/goals/approvals/{id}` */
export type IApprovalDecision = Schemas['ApprovalDecision'];

/** One entry of `GET /api/goals/events?format=json`, and the `data` of each event of the stream. */
export type IGoalsEvent = Schemas['Event'];

/**
 * An event's payload as a plain record, for views that read it as a hint (a badge to move, a card to
 * refresh); the document types each kind's payload (`IGoalsEvent` narrows on `kind`).
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function payloadOf(event: IGoalsEvent): Record<string, any> {
  return (event.payload ?? {}) as Record<string, unknown>;
}

/** `GET /api/goals/attention` */
export type IAttention = Answer<'/attention', 'get', 200>;
export type IAttentionItem = IAttention['items'][number];

/** `GET /api/goals/events?format=json` */
export type IEventPage = Answer<'/events', 'get', 200>;

/** `GET /api/goals/health` */
export type IHealth = Answer<'/health', 'get', 200>;
/** `GET /api/goals/models` */
export type IModelList = Answer<'/models', 'get', 200>;
/** One entry of `GET /api/goals/models`. */
export type IModelInfo = IModelList['models'][number];
/** `GET /api/goals/recovery`: the last recovery pass. */
export type IRecovery = Answer<'/recovery', 'get', 200>;
/** One recorded recovery decision of `GET /api/goals/recovery`. */
export type IRecoveryItem = IRecovery['items'][number];
/** `GET /api/goals/sessions?limit=&cursor=` (keyset paging: `next_cursor` null on the last page). */
export type ISessionList = Answer<'/sessions', 'get', 200>;
/** One entry of `GET /api/goals/sessions`. */
export type ISessionSummary = ISessionList['sessions'][number];
/** `POST /api/goals/sessions` → 201 */
export type ISessionCreated = Answer<'/sessions', 'post', 201>;
/** `GET /api/goals/sessions/{id}` */
export type ISessionSnapshot = Answer<'/sessions/{session_id}', 'get', 200>;
/** The session row itself (`model` is a configured model name or `provider:model`). */
export type ISessionInfo = ISessionSnapshot['session'];
/** The `work` part of a session summary. */
export type IWorkView = NonNullable<ISessionSnapshot['work']>;
/** Backend-computed button permissions; the UI never infers them from state strings. */
export type IActions = ISessionSnapshot['actions'];
/** A page of the transcript: `next_cursor` pages forward (`after=`), `prev_cursor` backward (`before=`). */
export type ITranscriptPage = NonNullable<ISessionSnapshot['transcript']>;
/** One durable transcript record (DESIGN §10: at least item_id, seq, kind, role, content). */
export type ITranscriptItem = ITranscriptPage['items'][number];
/** `POST /api/goals/sessions/{id}/messages` → 202 */
export type IMessageAccepted = Answer<'/sessions/{session_id}/messages', 'post', 202>;
/** `GET /api/goals/approvals` */
export type IApprovalList = Answer<'/approvals', 'get', 200>;
/** A tool call waiting for a person's decision. */
export type IApproval = IApprovalList['approvals'][number];
/** `GET /api/goals/goals/{id}` (the snapshot's `goal` has the same shape, without usage). */
export type IGoal = Answer<'/goals/{goal_id}', 'get', 200>;
export type IRequirement = IGoal['requirements'][number];
export type IVerdict = NonNullable<IGoal['verdicts']>[number];
export type ITodoItem = NonNullable<IGoal['todo']>[number];
/** `GET /api/goals/sessions/{id}/history` */
export type IHistoryList = Answer<'/sessions/{session_id}/history', 'get', 200>;
/** A terminal Goal record: read-only, with its own snapshot and transcript anchor. */
export type IHistoryRecord = Answer<'/history/{record_id}', 'get', 200>;

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
  path: GoalsURL<T>,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  method: 'GET' | 'POST' | 'PATCH' = 'GET',
  body?: RequestBody
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
  path: GoalsURL<unknown>,
  body: RequestBody,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  return requestGoalsAPI<T>(path as GoalsURL<T>, settings, 'POST', body);
}
