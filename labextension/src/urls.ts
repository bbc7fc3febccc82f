import type {
  IApproval,
  IApprovalList,
  IAttention,
  IEventPage,
  IGoal,
  IHealth,
  IHistoryList,
  IHistoryRecord,
  IModelList,
  IRecovery,
  ISessionList,
  ISessionSnapshot
} from './api';

/**
 * A URL of the goals REST API, relative to `<baseUrl>/api/goals/`, that only this module builds; `T` is
 * the JSON answer of a GET of it. `requestGoalsAPI` takes nothing else, so every URL the page asks is
 * built (and its ids and query values encoded) here, and a read's answer type follows from its URL.
 */
export type GoalsURL<T = unknown> = string & { readonly __goalsUrl: true; readonly __answer?: T };

type QueryValue = string | number | boolean | null | undefined;

function url<T>(path: string, query: Record<string, QueryValue> = {}): GoalsURL<T> {
  const parts = Object.entries(query)
    .filter(([, value]) => value !== undefined && value !== null && value !== '')
    .map(([key, value]) => `${key}=${encodeURIComponent(String(value))}`);
  return (parts.length > 0 ? `${path}?${parts.join('&')}` : path) as GoalsURL<T>;
}

const id = (value: string): string => encodeURIComponent(value);

/** A transcript page of `GET /sessions/{id}`: the newest (`before: 'latest'`), before a seq, or after one. */
export interface IPageQuery {
  before?: number | 'latest';
  after?: number;
  limit?: number;
  /** Only that work item's items. */
  work_id?: string;
}

/** Every URL of the REST API the page uses. */
export const urls = {
  health: () => url<IHealth>('health'),
  models: () => url<IModelList>('models'),
  /** The last recovery pass (of one session's work when `sessionId` is given). */
  recovery: (sessionId?: string) => url<IRecovery>('recovery', { session_id: sessionId }),
  attention: () => url<IAttention>('attention'),
  events: (after: number, limit: number) => url<IEventPage>('events', { format: 'json', after, limit }),
  /** `POST` (Stop all work). */
  actions: () => url<unknown>('actions'),
  sessions: (query: { limit?: number; cursor?: string | number | null; q?: string; state?: string } = {}) =>
    url<ISessionList>('sessions', query),
  session: (sessionId: string, page: IPageQuery = {}) =>
    url<ISessionSnapshot>(`sessions/${id(sessionId)}`, { ...page }),
  sessionActions: (sessionId: string) => url<unknown>(`sessions/${id(sessionId)}/actions`),
  sessionMessages: (sessionId: string) => url<unknown>(`sessions/${id(sessionId)}/messages`),
  sessionHistory: (sessionId: string) => url<IHistoryList>(`sessions/${id(sessionId)}/history`),
  goals: () => url<unknown>('goals'),
  goal: (goalId: string) => url<IGoal>(`goals/${id(goalId)}`),
  goalActions: (goalId: string) => url<unknown>(`goals/${id(goalId)}/actions`),
  approvals: (state?: string) => url<IApprovalList>('approvals', { state }),
  approval: (approvalId: string) => url<IApproval>(`approvals/${id(approvalId)}`),
  historyRecord: (recordId: string) => url<IHistoryRecord>(`history/${id(recordId)}`)
};
