import { Notification } from '@jupyterlab/apputils';

import { IApproval, IApprovalList, IGoalsEvent, payloadOf, requestGoalsAPI } from './api';
import { editGoal } from './edit';
import { sharedEventFeed } from './events';
import { urls } from './urls';

/** What a notification says and the key that makes it appear once. */
export interface INotice {
  key: string;
  type: 'warning' | 'error' | 'success';
  message: string;
  sessionId: string | null;
  /** A budget stop: the notice offers "Edit Goal" for this Goal. */
  goalId?: string;
}

/**
 * The events that need the person, in words: a pending approval, failed work, a budget stop, a Goal
 * achieved. Pure: the same event always gives the same key, so a repeated event is not shown twice.
 */
export function noticeFor(event: IGoalsEvent): INotice | null {
  const p = payloadOf(event);
  const sessionId = event.session_id ?? null;
  switch (event.kind) {
    case 'approval.requested':
      return {
        key: `approval:${String(p.approval_id)}`,
        type: 'warning',
        message: `Approval needed: a ${String(p.tool ?? 'tool')} call waits for you.`,
        sessionId
      };
    case 'work.phase':
      if (p.phase === 'failed') {
        return {
          key: `failed:${String(event.work_id)}:${String(p.reason_code)}`,
          type: 'error',
          message: `Work failed: ${String(p.reason || p.reason_code || 'see the session')}`,
          sessionId
        };
      }
      return null;
    case 'goal.updated':
      if (p.state === 'achieved') {
        return { key: `achieved:${String(p.goal_id)}`, type: 'success', message: 'Goal achieved.', sessionId };
      }
      if (p.state === 'budget_exhausted') {
        return {
          key: `budget:${String(p.goal_id)}:${String(p.revision)}`,
          type: 'warning',
          message: 'A Goal stopped at its budget: raise the budget or end it.',
          sessionId,
          goalId: String(p.goal_id)
        };
      }
      return null;
    default:
      return null;
  }
}

/** The notice of an approval that is already pending (the same key as its `approval.requested` event). */
export function noticeForPending(approval: IApproval): INotice {
  return {
    key: `approval:${approval.approval_id}`,
    type: 'warning',
    message: `Approval needed: a ${approval.tool || 'tool'} call waits for you.`,
    sessionId: approval.session_id || null
  };
}

/**
 * JupyterLab notifications (the notification center) for work that needs the person, each once
 * per key for the life of the page: approvals already pending when the page opens (read from
 * `GET /approvals?state=pending`, since their events came before this page), then what the event
 * feed reports. `open` shows the session the notice is about.
 */
export function startNotifications(open: (sessionId: string) => void): () => void {
  const shown = new Set<string>();
  const show = (notice: INotice | null): void => {
    if (notice === null || shown.has(notice.key)) {
      return;
    }
    shown.add(notice.key);
    const sessionId = notice.sessionId;
    const actions = sessionId
      ? [{ label: 'Open', caption: 'Open the session', callback: () => open(sessionId) }]
      : [];
    const goalId = notice.goalId;
    if (goalId) {
      actions.push({
        label: 'Edit Goal',
        caption: 'Raise the budget (or change the Goal)',
        callback: () =>
          void editGoal(goalId).then(outcome => {
            if (outcome && !outcome.ok) {
              Notification.error(outcome.message, { autoClose: 15000 });
            }
          })
      });
    }
    // the toast steps aside after a while (it covers the composer's buttons); the notification
    // center keeps it until dismissed
    Notification.emit(notice.message, notice.type, { autoClose: notice.type === 'error' ? 15000 : 8000, actions });
  };
  requestGoalsAPI<IApprovalList>(urls.approvals('pending'))
    .then(answer => {
      for (const approval of answer.approvals ?? []) {
        if (approval.state === 'pending') {
          show(noticeForPending(approval));
        }
      }
    })
    .catch(() => undefined); // the panel shows an unavailable server; the event feed still follows
  return sharedEventFeed().subscribe(events => {
    for (const event of events ?? []) {
      show(noticeFor(event));
    }
  });
}
