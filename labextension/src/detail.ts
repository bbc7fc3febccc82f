import { ServerConnection } from '@jupyterlab/services';

import {
  IGoal,
  IHistoryRecord,
  ISessionSnapshot,
  RequestBody,
  requestGoalsAPI
} from './api';
import { goalsStore, SessionEntry } from './store';
import { editGoal, EditOutcome } from './edit';
import {
  actionBar,
  alertNode,
  approvalView,
  badge,
  el,
  goalView,
  historyRow,
  postAction,
  replaceKeepingFocus,
  SESSION_ACTIONS,
  showAlert,
  unavailableNode
} from './views';
import { budgetBurn } from './usage';
import { GoalsURL, urls } from './urls';

interface ILoaded {
  snapshot: ISessionSnapshot;
  goal: IGoal | null;
  history: IHistoryRecord[];
}

/**
 * The selected session: work state, phase, reason and the backend's actions; its active Goal (only
 * when the session has one); pending approvals; terminal Goal records (read-only). Shown from the
 * page's store (the same entry, and read, as the session's chat view); the ended Goals are read when
 * the session is selected, when a Goal of it ends, and after the event feed reconnects.
 */
export class SessionDetail {
  readonly node: HTMLElement;

  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    /** Called after each action, so the session list shows the new phase at once. */
    private readonly _onChanged: () => void = () => undefined
  ) {
    this.node = el('section', 'jp-goals-detail', undefined, 'goals-detail');
    this.node.hidden = true;
    this._alert = alertNode('goals-action-error');
    this._error = el('div');
    this._body = el('div', 'jp-goals-detail-body', undefined, 'goals-detail-body');
    this.node.append(this._error, this._alert, this._body);
  }

  get sessionId(): string | null {
    return this._sessionId;
  }

  select(sessionId: string | null): void {
    if (sessionId === this._sessionId) {
      return;
    }
    this._unfollow();
    this._sessionId = sessionId;
    this._history = [];
    showAlert(this._alert, null);
    this._body.replaceChildren();
    this._error.replaceChildren();
    this.node.hidden = sessionId === null;
    this.node.dataset.sessionId = sessionId ?? '';
    this._follow();
  }

  /** Follow the session only while the panel is visible; catch up when it shows again. */
  setLive(live: boolean): void {
    if (live === this._live) {
      return;
    }
    this._live = live;
    this._unfollow();
    this._follow();
  }

  /** The session's entry of the page's store (shared with its chat view); the history list beside it. */
  private _follow(): void {
    const sessionId = this._sessionId;
    if (!this._live || sessionId === null || this._entry !== null) {
      return;
    }
    this._entry = goalsStore().session(sessionId);
    void this._readHistory(sessionId);
    this._unsubscribe = this._entry.subscribe((entry, change) => {
      if (change.resync || change.events.some(e => e.kind === 'goal.history')) {
        void this._readHistory(sessionId); // a Goal ended (or the server came back): its record
      }
      if (change.changed) {
        this._show(entry);
      }
    });
  }

  private _unfollow(): void {
    this._unsubscribe?.();
    this._unsubscribe = null;
    this._entry = null;
  }

  /** Read the selected session again (after an action); never rejects (failures are rendered). */
  async refresh(): Promise<void> {
    await this._entry?.refresh();
  }

  dispose(): void {
    this._unfollow();
  }

  private _show(entry: SessionEntry): void {
    if (entry.sessionId !== this._sessionId) {
      return;
    }
    if (entry.snapshot === null || entry.error !== null) {
      const failure = entry.error instanceof Error ? entry.error.message : String(entry.error);
      this._error.replaceChildren(unavailableNode(failure, () => void this.refresh(), 'goals-detail-error'));
      this._body.classList.add('jp-goals-mod-stale');
      return;
    }
    this._error.replaceChildren();
    this._body.classList.remove('jp-goals-mod-stale');
    this._render(entry.sessionId, { snapshot: entry.snapshot, goal: entry.snapshot.goal ?? null, history: this._history });
  }

  /** The session's ended Goals (read when it is selected, when a Goal of it ends, and after a reconnect). */
  private async _readHistory(sessionId: string): Promise<void> {
    try {
      const answer = await requestGoalsAPI(urls.sessionHistory(sessionId), this._settings);
      if (sessionId === this._sessionId) {
        this._history = answer.records ?? [];
        if (this._entry?.snapshot) {
          this._show(this._entry);
        }
      }
    } catch {
      // the snapshot's read says when the server cannot be read; the list keeps what it showed
    }
  }

  private _render(sessionId: string, { snapshot, goal, history }: ILoaded): void {
    const parts: HTMLElement[] = [];
    const title = snapshot.session.title || 'Untitled session';
    parts.push(el('h3', 'jp-goals-subheading', title, 'goals-detail-title'));

    const work = snapshot.work;
    const state = el('div', 'jp-goals-detail-state', undefined, 'goals-detail-work');
    if (work) {
      state.append(badge(work.phase, 'goals-detail-phase'));
      if (work.desired_state) {
        const intent = `intent: ${work.desired_state}`;
        state.append(el('span', 'jp-goals-desired', intent, 'goals-detail-desired'));
      }
      parts.push(state);
      if (work.reason) {
        const reason = el('div', 'jp-goals-reason', work.reason, 'goals-detail-reason');
        reason.dataset.reasonCode = work.reason_code;
        parts.push(reason);
      }
    } else {
      state.append(el('span', 'jp-goals-empty', 'No work yet'));
      parts.push(state);
    }
    parts.push(
      actionBar('goals-session', SESSION_ACTIONS, snapshot.actions, work?.reason ?? '', action =>
        this._act(urls.sessionActions(sessionId), {
          action,
          ...(work?.control_version !== undefined
            ? { expected_control_version: work.control_version }
            : {})
        })
      )
    );

    // Only an explicitly activated Goal produces Goal UI.
    if (goal) {
      parts.push(
        goalView(goal, {
          onAction: action =>
            this._act(urls.goalActions(goal.goal_id), {
              action,
              expected_revision: goal.revision
            }),
          onEdit: () => void this._edit(() => editGoal(goal.goal_id, this._settings))
        })
      );
      const burn = budgetBurn(goal, 'goals-detail-goal-budget');
      if (burn) {
        parts.push(burn);
      }
    }

    if (snapshot.approvals.length > 0) {
      const box = el('div', 'jp-goals-approvals', undefined, 'goals-approvals');
      box.append(el('div', 'jp-goals-subheading', 'Waiting for you'));
      for (const approval of snapshot.approvals) {
        box.append(
          approvalView(approval, (path, body) => this._act(path, body))
        );
      }
      parts.push(box);
    }

    if (history.length > 0) {
      const box = el('div', 'jp-goals-history', undefined, 'goals-history');
      box.append(el('div', 'jp-goals-subheading', 'Ended Goals'));
      for (const record of history) {
        box.append(historyRow(record));
      }
      parts.push(box);
    }
    replaceKeepingFocus(this._body, ...parts);
  }

  private async _edit(run: () => Promise<EditOutcome>): Promise<void> {
    const outcome = await run();
    if (outcome !== null) {
      showAlert(this._alert, outcome.ok ? null : outcome.message);
      this._onChanged();
      await this.refresh();
    }
  }

  private async _act(path: GoalsURL, body: RequestBody): Promise<void> {
    await postAction(path, body, this._settings, this._alert);
    this._onChanged();
    await this.refresh();
  }

  private readonly _alert: HTMLElement;
  private readonly _error: HTMLElement;
  private readonly _body: HTMLElement;
  private _sessionId: string | null = null;
  private _live = false;
  private _history: IHistoryRecord[] = [];
  private _entry: SessionEntry | null = null;
  private _unsubscribe: (() => void) | null = null;
}
