import { ServerConnection } from '@jupyterlab/services';

import {
  IGoal,
  IHistoryList,
  IHistoryRecord,
  ISessionSnapshot,
  RequestBody,
  requestGoalsAPI
} from './api';
import { debounce, sharedEventFeed } from './events';
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

interface ILoaded {
  snapshot: ISessionSnapshot;
  goal: IGoal | null;
  history: IHistoryRecord[];
}

/**
 * The selected session: work state, phase, reason and the backend's actions; its active Goal (only
 * when the session has one); pending approvals; terminal Goal records (read-only). Rebuilt from
 * REST on every relevant event, after the event feed reconnects, and after every action.
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
    this._sessionId = sessionId;
    this._unsubscribe?.();
    this._unsubscribe = null;
    showAlert(this._alert, null);
    this._body.replaceChildren();
    this._error.replaceChildren();
    this.node.hidden = sessionId === null;
    this.node.dataset.sessionId = sessionId ?? '';
    this._follow();
    void this.refresh();
  }

  /** Follow the event feed only while the panel is visible; catch up when it shows again. */
  setLive(live: boolean): void {
    if (live === this._live) {
      return;
    }
    this._live = live;
    this._unsubscribe?.();
    this._unsubscribe = null;
    if (live) {
      this._follow();
      void this.refresh();
    }
  }

  private _follow(): void {
    const sessionId = this._sessionId;
    if (!this._live || sessionId === null || this._unsubscribe !== null) {
      return;
    }
    const later = debounce(() => void this.refresh(), 150);
    this._unsubscribe = sharedEventFeed().subscribe(events => {
      if (events === null || events.some(e => e.session_id === sessionId)) {
        later();
      }
    });
  }

  /** Re-read the selected session; never rejects (failures are rendered). */
  async refresh(): Promise<void> {
    const sessionId = this._sessionId;
    if (sessionId === null) {
      return;
    }
    const token = ++this._token;
    let loaded: ILoaded | null = null;
    let failure = '';
    try {
      loaded = await this._load(sessionId);
    } catch (error) {
      failure = error instanceof Error ? error.message : String(error);
    }
    if (token !== this._token || sessionId !== this._sessionId) {
      return; // a newer read or another selection won
    }
    if (loaded === null) {
      this._error.replaceChildren(
        unavailableNode(failure, () => void this.refresh(), 'goals-detail-error')
      );
      this._body.classList.add('jp-goals-mod-stale');
      return;
    }
    this._error.replaceChildren();
    this._body.classList.remove('jp-goals-mod-stale');
    this._render(sessionId, loaded);
  }

  dispose(): void {
    this._unsubscribe?.();
    this._unsubscribe = null;
  }

  private async _load(sessionId: string): Promise<ILoaded> {
    const id = encodeURIComponent(sessionId);
    const [snapshot, history] = await Promise.all([
      requestGoalsAPI<ISessionSnapshot>(`sessions/${id}`, this._settings),
      requestGoalsAPI<IHistoryList>(`sessions/${id}/history`, this._settings)
    ]);
    // the snapshot's goal has no usage; the Goal answer has it
    const goal = snapshot.goal
      ? await requestGoalsAPI<IGoal>(
          `goals/${encodeURIComponent(snapshot.goal.goal_id)}`,
          this._settings
        )
      : null;
    return { snapshot, goal, history: history.records ?? [] };
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
        this._act(`sessions/${encodeURIComponent(sessionId)}/actions`, {
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
            this._act(`goals/${encodeURIComponent(goal.goal_id)}/actions`, {
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

  private async _act(path: string, body: RequestBody): Promise<void> {
    await postAction(path, body, this._settings, this._alert);
    this._onChanged();
    await this.refresh();
  }

  private readonly _alert: HTMLElement;
  private readonly _error: HTMLElement;
  private readonly _body: HTMLElement;
  private _sessionId: string | null = null;
  private _live = false;
  private _token = 0;
  private _unsubscribe: (() => void) | null = null;
}
