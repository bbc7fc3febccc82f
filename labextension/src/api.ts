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
  phase: string;
  reason_code: string;
  reason: string;
}

/** One entry of `GET /api/goals/sessions`. */
export interface ISessionSummary {
  session_id: string;
  title?: string | null;
  work: IWorkView | null;
}

/** `GET /api/goals/sessions` */
export interface ISessionList {
  sessions: ISessionSummary[];
}

/** A request to the goals REST API that did not produce the expected JSON. */
export class GoalsAPIError extends Error {
  constructor(
    readonly path: string,
    message: string
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
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'api/goals', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      url,
      { method: 'GET', cache: 'no-store' },
      settings
    );
  } catch (error) {
    throw new GoalsAPIError(path, `network error: ${describe(error)}`);
  }
  if (!response.ok) {
    const status = `HTTP ${response.status} ${response.statusText}`.trim();
    const detail = await serverMessage(response);
    throw new GoalsAPIError(path, detail ? `${status}: ${detail}` : status);
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
    return typeof message === 'string' ? message.slice(0, 200) : '';
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
