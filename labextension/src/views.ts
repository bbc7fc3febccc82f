import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  GoalsAPIError,
  IActions,
  IApproval,
  IGoal,
  IGoalAction,
  IHistoryRecord,
  ISessionAction,
  postGoalsAPI,
  RequestBody
} from './api';
import { GoalsURL, urls } from './urls';

/**
 * DOM builders shared by the sidebar and the notebook outputs. They render what the server
 * answered and nothing else: button permissions come from the backend's `actions`, never from a
 * state string. Every element a test needs has a stable `data-testid`.
 */

export const UNAVAILABLE_TEXT = 'State temporarily unavailable';

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string,
  testid?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  if (testid) {
    node.dataset.testid = testid;
  }
  return node;
}

export function cssToken(value: string): string {
  return value.toLowerCase().replace(/[^a-z0-9_-]+/g, '-') || 'unknown';
}

/** A small state badge (`jp-goals-phase-<value>` picks its colour). */
export function badge(value: string, testid: string): HTMLElement {
  const node = el('span', 'jp-goals-phase', value, testid);
  node.dataset.value = value;
  node.classList.add(`jp-goals-phase-${cssToken(value)}`);
  return node;
}

export function button(
  label: string,
  testid: string,
  onClick: () => void,
  title?: string
): HTMLButtonElement {
  const node = el('button', 'jp-goals-button jp-mod-styled', label, testid);
  node.type = 'button';
  if (title) {
    node.title = title;
  }
  node.addEventListener('click', onClick);
  return node;
}

/** The controls of a session's action bar (`cancel_tool` and `settle` are a call's own buttons). */
export type SessionControl = Exclude<ISessionAction['action'], 'cancel_tool' | 'settle'>;
/** The controls of a Goal's action bar. */
export type GoalControl = IGoalAction['action'];

/** One button of an action bar and the backend flag that enables it. */
export interface IActionSpec<A extends string = string> {
  action: A;
  label: string;
  flag: keyof Omit<IActions, 'reason_code'>;
  /** The tooltip of an enabled button (what it does). */
  hint?: string;
}

export const SESSION_ACTIONS: IActionSpec<SessionControl>[] = [
  { action: 'pause', label: 'Pause', flag: 'can_pause' },
  { action: 'resume', label: 'Resume', flag: 'can_resume' },
  { action: 'retry', label: 'Retry', flag: 'can_retry' },
  { action: 'stop', label: 'Stop', flag: 'can_stop' }
];

/** The session view's bar, with what each action does as its tooltip. */
export const SESSION_VIEW_ACTIONS: IActionSpec<SessionControl>[] = [
  {
    action: 'pause',
    label: 'Pause',
    flag: 'can_pause',
    hint: 'Pause: lets the running step finish and starts nothing new'
  },
  { action: 'resume', label: 'Resume', flag: 'can_resume', hint: 'Resume: continue this work' },
  {
    action: 'stop',
    label: 'Stop',
    flag: 'can_stop',
    hint: 'Stop: ends the work now; a running command is cancelled'
  },
  { action: 'retry', label: 'Retry', flag: 'can_retry', hint: 'Retry: run the failed work again' }
];

export const GOAL_ACTIONS: IActionSpec<GoalControl>[] = [
  { action: 'pause', label: 'Pause', flag: 'can_pause' },
  { action: 'resume', label: 'Resume', flag: 'can_resume' },
  { action: 'verify', label: 'Verify', flag: 'can_verify' },
  { action: 'end', label: 'End', flag: 'can_end' }
];

/**
 * Buttons `<prefix>-<action>`, enabled exactly when the backend's flag is true; a disabled one
 * says why in its tooltip. While one request runs, the whole bar is disabled.
 */
export function actionBar<A extends string>(
  prefix: string,
  specs: IActionSpec<A>[],
  actions: IActions,
  why: string,
  onAction: (action: A) => Promise<void>
): HTMLElement {
  const bar = el('div', 'jp-goals-actions', undefined, `${prefix}-actions`);
  const buttons: HTMLButtonElement[] = [];
  for (const spec of specs) {
    const allowed = actions[spec.flag] === true;
    const node = button(spec.label, `${prefix}-${spec.action}`, () => {
      buttons.forEach(b => (b.disabled = true));
      void onAction(spec.action).finally(() => {
        buttons.forEach(b => (b.disabled = b.dataset.allowed !== 'true'));
      });
    });
    node.dataset.allowed = String(allowed);
    node.disabled = !allowed;
    if (!allowed) {
      node.title = `Not available now${why ? `: ${why}` : ''}`;
    } else if (spec.hint) {
      node.title = spec.hint;
    }
    buttons.push(node);
    bar.append(node);
  }
  if (actions.reason_code) {
    bar.dataset.reasonCode = actions.reason_code;
  }
  return bar;
}

/** The server's verdicts that count now, by requirement id (only those checked for this revision). */
export function currentVerdicts(goal: IGoal): Map<string, string> {
  const verdicts = new Map<string, string>();
  for (const v of goal.verdicts ?? []) {
    if (v.checked && v.requirement_id) {
      verdicts.set(v.requirement_id, v.verdict);
    }
  }
  return verdicts;
}

export interface IGoalViewOptions {
  /** A terminal record: no buttons, marked read-only. */
  readOnly?: boolean;
  onAction?: (action: GoalControl) => Promise<void>;
  /** "Edit Goal" (objective, requirements, budget): shown while the Goal has not ended. */
  onEdit?: () => void;
}

/** Goal states that end it: nothing to edit or act on any more. */
export const ENDED_GOAL_STATES = new Set(['achieved', 'cancelled']);

/** The "Edit Goal" button (objective, requirements, budget; the waiver reason). */
export function editGoalButton(testid: string, onEdit: () => void): HTMLButtonElement {
  return button('Edit Goal', testid, onEdit, 'Edit Goal: change the objective, requirements or budget');
}

/** The Goal: objective, state / phase / reason, requirements with verdicts, Todo, usage, actions. */
export function goalView(goal: IGoal, options: IGoalViewOptions = {}): HTMLElement {
  const root = el('section', 'jp-goals-goal', undefined, 'goals-goal');
  root.dataset.goalId = goal.goal_id;
  root.dataset.state = goal.state;
  root.dataset.revision = String(goal.revision);

  const top = el('div', 'jp-goals-goal-top');
  top.append(
    el('span', 'jp-goals-goal-label', 'Goal'),
    badge(goal.state, 'goals-goal-state'),
    badge(goal.phase, 'goals-goal-phase')
  );
  root.append(top, el('div', 'jp-goals-goal-objective', goal.objective, 'goals-goal-objective'));

  if (goal.reason) {
    const reason = el('div', 'jp-goals-reason', goal.reason, 'goals-goal-reason');
    reason.dataset.reasonCode = goal.reason_code;
    root.append(reason);
  }

  const verdicts = currentVerdicts(goal);
  if (goal.requirements.length > 0) {
    const list = el('ul', 'jp-goals-requirements', undefined, 'goals-goal-requirements');
    for (const req of goal.requirements) {
      const id = req.id ?? '';
      const verdict = verdicts.get(id) ?? 'unknown';
      const item = el('li', 'jp-goals-requirement', undefined, 'goals-goal-requirement');
      item.dataset.requirementId = id;
      item.dataset.verdict = verdict;
      const cls = `jp-goals-verdict jp-goals-verdict-${cssToken(verdict)}`;
      const mark = el('span', cls, verdict, 'goals-goal-verdict');
      if (!verdicts.has(id)) {
        mark.title = 'Not checked for this revision yet';
      }
      item.append(mark, el('span', 'jp-goals-requirement-text', req.text));
      list.append(item);
    }
    root.append(el('div', 'jp-goals-subheading', 'Requirements'), list);
  }

  // An empty Todo shows nothing: no placeholder, no separator.
  const todo = goal.todo ?? [];
  if (todo.length > 0) {
    const list = el('ul', 'jp-goals-todo', undefined, 'goals-goal-todo');
    for (const t of todo) {
      const item = el('li', 'jp-goals-todo-item', undefined, 'goals-goal-todo-item');
      item.dataset.status = t.status;
      item.append(el('span', 'jp-goals-todo-status', t.status), el('span', undefined, t.text));
      list.append(item);
    }
    root.append(el('div', 'jp-goals-subheading', 'Todo'), list);
  }

  const usage = goal.usage?.display;
  if (usage) {
    root.append(el('div', 'jp-goals-usage', usage, 'goals-goal-usage'));
  }

  if (options.readOnly) {
    root.classList.add('jp-goals-mod-readonly');
    root.append(el('div', 'jp-goals-readonly', 'Read-only record', 'goals-goal-readonly'));
  } else if (options.onAction) {
    const bar = actionBar('goals-goal', GOAL_ACTIONS, goal.actions, goal.reason, options.onAction);
    if (options.onEdit && !ENDED_GOAL_STATES.has(goal.state)) {
      bar.append(editGoalButton('goals-goal-edit', options.onEdit));
    }
    root.append(bar);
  }
  return root;
}

/**
 * A tool call waiting for a person: Approve / Always allow (approve it and add its tool to the chat's
 * allow rules) / Deny while pending, each one `POST approvals/{id}` through `post`; its outcome after.
 * Without `post` the card is read-only.
 */
export function approvalView(
  approval: IApproval,
  post?: (path: GoalsURL, body: RequestBody) => Promise<void>
): HTMLElement {
  const root = el('div', 'jp-goals-approval', undefined, 'goals-approval');
  root.dataset.approvalId = approval.approval_id;
  root.dataset.state = approval.state;
  const top = el('div', 'jp-goals-goal-top');
  top.append(
    el('span', 'jp-goals-goal-label', 'Approval'),
    el('code', 'jp-goals-approval-tool', approval.tool, 'goals-approval-tool'),
    badge(approval.state, 'goals-approval-state')
  );
  root.append(top);
  const args = JSON.stringify(approval.arguments ?? {});
  root.append(
    el(
      'code',
      'jp-goals-approval-arguments',
      args.length > 300 ? `${args.slice(0, 300)}…` : args,
      'goals-approval-arguments'
    )
  );
  if (approval.reason) {
    root.append(el('div', 'jp-goals-reason', approval.reason, 'goals-approval-reason'));
  }
  const unknown = approval.unknown_effects ?? [];
  if (unknown.length > 0) {
    root.append(
      el(
        'div',
        'jp-goals-reason',
        `Follows ${unknown.length} call(s) whose outcome is unknown`,
        'goals-approval-unknown'
      )
    );
  }
  if (post && approval.state === 'pending') {
    const bar = el('div', 'jp-goals-actions', undefined, 'goals-approval-actions');
    const buttons = [
      button('Approve', 'goals-approval-approve', () => decide('approve')),
      button('Always allow', 'goals-approval-always', () => decide('approve', true),
        `Approve, and always allow ${approval.tool} in this chat (revocable in Permissions)`),
      button('Deny', 'goals-approval-deny', () => decide('deny'))
    ];
    const decide = (decision: 'approve' | 'deny', always = false) => {
      buttons.forEach(b => (b.disabled = true));
      const body = always ? { decision, always: true } : { decision };
      void post(urls.approval(approval.approval_id), body).finally(() => {
        buttons.forEach(b => (b.disabled = false));
      });
    };
    bar.append(...buttons);
    root.append(bar);
  }
  return root;
}

/** One compact terminal record; Details opens the Goal view read-only. */
export function historyRow(record: IHistoryRecord): HTMLElement {
  const row = el('div', 'jp-goals-history-record', undefined, 'goals-history-record');
  row.dataset.recordId = record.record_id;
  row.dataset.state = record.state;
  row.append(
    badge(record.state, 'goals-history-state'),
    el(
      'span',
      'jp-goals-history-objective',
      record.snapshot?.objective ?? '',
      'goals-history-objective'
    ),
    button(
      'Details',
      'goals-history-details',
      () => void showHistoryDetails(record),
      'Open this Goal record (read-only)'
    )
  );
  return row;
}

/** The Goal details dialog in read-only historical mode; focus returns where it was on close. */
export async function showHistoryDetails(record: IHistoryRecord): Promise<void> {
  const body = el('div', 'jp-goals-history-dialog', undefined, 'goals-history-dialog');
  body.append(goalView(record.snapshot as IGoal, { readOnly: true })); // the Goal answer as it ended
  const when = new Date(record.created_at * 1000).toLocaleString();
  const where = `Ended ${when} · transcript position ${record.anchor.seq}`;
  body.append(el('div', 'jp-goals-updated', where, 'goals-history-anchor'));
  const opener = document.activeElement as HTMLElement | null;
  const key = opener ? focusKey(opener) : null;
  await showDialog({
    title: `Goal ${record.state} (read-only)`,
    body: new Widget({ node: body }),
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
  if (opener && !opener.isConnected && key) {
    // the view re-rendered while the dialog was open: focus the same button in its new DOM
    refocus(document.body, key);
  }
}

/**
 * Replace a container's children, keeping keyboard focus: when the focused element was inside, the
 * element with the same `data-testid` under the same record (`data-record-id`, `data-approval-id`,
 * `data-goal-id`, `data-item-id`, `data-session-id`) gets the focus back, so a re-read of the server state never drops a keyboard user.
 */
export function replaceKeepingFocus(container: HTMLElement, ...nodes: HTMLElement[]): void {
  const active = document.activeElement as HTMLElement | null;
  const key = active && container.contains(active) ? focusKey(active) : null;
  container.replaceChildren(...nodes);
  if (key !== null) {
    refocus(container, key);
  }
}

interface IFocusKey {
  testid: string;
  owner: string;
}

function refocus(container: HTMLElement, key: IFocusKey): void {
  for (const candidate of Array.from(container.querySelectorAll<HTMLElement>(`[data-testid="${key.testid}"]`))) {
    if (focusKey(candidate)?.owner === key.owner) {
      candidate.focus();
      return;
    }
  }
}

function focusKey(node: HTMLElement): IFocusKey | null {
  const testid = node.dataset.testid;
  if (!testid) {
    return null;
  }
  const owner = node.closest<HTMLElement>(
    '[data-record-id], [data-approval-id], [data-goal-id], [data-item-id], [data-session-id]'
  );
  const d = owner?.dataset;
  return {
    testid,
    owner: d ? [d.recordId, d.approvalId, d.goalId, d.itemId, d.sessionId].map(v => v ?? '').join('|') : ''
  };
}

/** What a failed action says: a 409 names the conflict; the view re-reads the state afterwards. */
export function actionErrorText(error: unknown): string {
  if (error instanceof GoalsAPIError) {
    if (error.status === 409) {
      return `Conflict (409): ${error.detail}. Showing the current state.`;
    }
    return error.status ? `Refused (${error.status}): ${error.detail}` : error.message;
  }
  return error instanceof Error ? error.message : String(error);
}

/** POST an action; its refusal (a 409 included) goes to `alert`, success clears it. Never rejects. */
export async function postAction(
  path: GoalsURL,
  body: RequestBody,
  settings: ServerConnection.ISettings,
  alert: HTMLElement
): Promise<boolean> {
  try {
    await postGoalsAPI(path, body, settings);
    showAlert(alert, null);
    return true;
  } catch (error) {
    showAlert(alert, actionErrorText(error));
    return false;
  }
}

/** The alert line under a view: action errors and read failures. */
export function alertNode(testid: string): HTMLElement {
  const node = el('div', 'jp-goals-alert', undefined, testid);
  node.setAttribute('role', 'alert');
  node.hidden = true;
  return node;
}

export function showAlert(node: HTMLElement, text: string | null): void {
  node.textContent = text ?? '';
  node.hidden = !text;
}

/** "State temporarily unavailable", the reason and a Refresh button. */
export function unavailableNode(detail: string, onRefresh: () => void, testid: string): HTMLElement {
  const box = el('div', 'jp-goals-error', undefined, testid);
  box.setAttribute('role', 'alert');
  box.append(
    el('div', 'jp-goals-error-text', UNAVAILABLE_TEXT, `${testid}-text`),
    el('div', 'jp-goals-error-detail', detail, `${testid}-detail`),
    button('Refresh', `${testid}-refresh`, onRefresh, 'Re-read the state from the server')
  );
  return box;
}
