import { ServerConnection } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  IHealth,
  ISessionList,
  ISessionSummary,
  isHealth,
  isSessionList,
  requestGoalsAPI
} from './api';
import { SessionDetail } from './detail';
import { debounce, sharedEventFeed } from './events';
import { cssToken, el } from './views';

/** How often the visible panel re-reads the server state. */
export const REFRESH_INTERVAL_MS = 5000;

export const UNAVAILABLE_TEXT = 'State temporarily unavailable';
export const EMPTY_TEXT = 'No sessions yet';

/** Outcome of one refresh: each part is either fresh data or an error text. */
interface ISnapshot {
  health: IHealth | null;
  sessions: ISessionSummary[] | null;
  errors: string[];
  at: Date;
}

/**
 * The "Goals" left-sidebar panel: server health plus the session list.
 *
 * Plain DOM in a Lumino widget. Every element a test or a style needs has a
 * stable `data-testid` and a `jp-goals-*` class. A failed request never
 * leaves the panel blank: it shows "State temporarily unavailable" with a
 * Refresh button, and keeps the last good data below it, marked stale.
 */
export class GoalsSidebar extends Widget {
  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    super();
    this.id = 'jupyter-goals-sidebar';
    this.addClass('jp-goals-Sidebar');
    this.node.dataset.testid = 'goals-sidebar';

    const header = el('div', 'jp-goals-header');
    header.append(
      el('h2', 'jp-goals-heading', 'Goals'),
      this._button('goals-refresh', 'Refresh')
    );

    this._errorNode = el('div', 'jp-goals-error');
    this._errorNode.dataset.testid = 'goals-error';
    this._errorNode.setAttribute('role', 'alert');
    this._errorNode.hidden = true;

    this._healthNode = el('section', 'jp-goals-health');
    this._healthNode.dataset.testid = 'goals-health';

    this._sessionsNode = el('section', 'jp-goals-sessions');
    this._sessionsNode.dataset.testid = 'goals-sessions';

    this._detail = new SessionDetail(this._settings, () => void this.refresh());
    this._sessionsNode.addEventListener('click', event => this._onSessionClick(event));
    this._sessionsNode.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        this._onSessionClick(event);
      }
    });

    this._updatedNode = el('div', 'jp-goals-updated');
    this._updatedNode.dataset.testid = 'goals-updated';

    this._healthNode.append(el('div', 'jp-goals-loading', 'Loading…'));
    this.node.append(
      header,
      this._errorNode,
      this._healthNode,
      this._sessionsNode,
      this._detail.node,
      this._updatedNode
    );
  }

  /**
   * Re-read health and sessions. Concurrent calls share one request.
   * Never rejects: failures are rendered.
   */
  refresh(): Promise<void> {
    if (!this._pending) {
      this._pending = this._load()
        .then(snapshot => {
          if (!this.isDisposed) {
            this._render(snapshot);
          }
        })
        .finally(() => {
          this._pending = null;
        });
    }
    return this._pending;
  }

  /** Show one session's state, Goal, approvals and history below the list. */
  selectSession(sessionId: string | null): void {
    this._detail.select(sessionId);
    for (const row of Array.from(
      this._sessionsNode.querySelectorAll<HTMLElement>('.jp-goals-session')
    )) {
      const selected = row.dataset.sessionId === sessionId;
      row.classList.toggle('jp-mod-selected', selected);
      row.setAttribute('aria-selected', String(selected));
    }
  }

  dispose(): void {
    this._stopTimer();
    this._detail.dispose();
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    // A panel restored as the open sidebar is attached visible and gets no
    // after-show message: start reading the state here as well.
    if (this.isVisible) {
      void this.refresh();
      this._startTimer();
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
    this._startTimer();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._stopTimer();
  }

  protected onBeforeDetach(msg: Message): void {
    this._stopTimer();
    super.onBeforeDetach(msg);
  }

  private _onSessionClick(event: Event): void {
    const row = (event.target as HTMLElement | null)?.closest<HTMLElement>(
      '.jp-goals-session'
    );
    if (row?.dataset.sessionId) {
      event.preventDefault();
      this.selectSession(row.dataset.sessionId);
    }
  }

  private _startTimer(): void {
    this._detail.setLive(true);
    if (this._unsubscribe === null) {
      // new sessions and phase changes show up at once; the timer below is the backstop
      const later = debounce(() => void this.refresh(), 300);
      this._unsubscribe = sharedEventFeed().subscribe(() => later());
    }
    if (this._timer === null) {
      this._timer = window.setInterval(() => {
        if (this.isVisible && document.visibilityState !== 'hidden') {
          void this.refresh();
        }
      }, REFRESH_INTERVAL_MS);
    }
  }

  private _stopTimer(): void {
    this._detail.setLive(false);
    this._unsubscribe?.();
    this._unsubscribe = null;
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private async _load(): Promise<ISnapshot> {
    const [health, sessions] = await Promise.allSettled([
      requestGoalsAPI<unknown>('health', this._settings),
      requestGoalsAPI<unknown>('sessions', this._settings)
    ]);
    const errors: string[] = [];
    let healthValue: IHealth | null = null;
    let sessionsValue: ISessionSummary[] | null = null;

    if (health.status === 'rejected') {
      errors.push(message(health.reason));
    } else if (!isHealth(health.value)) {
      errors.push('health: unexpected response');
    } else {
      healthValue = health.value;
    }
    if (sessions.status === 'rejected') {
      errors.push(message(sessions.reason));
    } else if (!isSessionList(sessions.value)) {
      errors.push('sessions: unexpected response');
    } else {
      sessionsValue = (sessions.value as ISessionList).sessions;
    }
    return {
      health: healthValue,
      sessions: sessionsValue,
      errors,
      at: new Date()
    };
  }

  private _render(snapshot: ISnapshot): void {
    this._renderError(snapshot.errors);
    if (snapshot.health) {
      this._renderHealth(snapshot.health);
    }
    if (snapshot.sessions) {
      this._renderSessions(snapshot.sessions);
    }
    // Data that could not be re-read this time is kept but marked stale;
    // a part that never loaded is left empty (the error line explains it).
    this._markStale(this._healthNode, snapshot.health === null);
    this._markStale(this._sessionsNode, snapshot.sessions === null);
    if (snapshot.health === null && !this._hasHealth) {
      this._healthNode.replaceChildren();
    }
    const time = snapshot.at.toLocaleTimeString();
    this._updatedNode.textContent =
      snapshot.errors.length === 0
        ? `Updated ${time}`
        : `Last attempt ${time}`;
  }

  private _renderError(errors: string[]): void {
    if (errors.length === 0) {
      this._errorNode.hidden = true;
      this._errorNode.replaceChildren();
      this.removeClass('jp-goals-mod-unavailable');
      return;
    }
    const text = el('div', 'jp-goals-error-text', UNAVAILABLE_TEXT);
    text.dataset.testid = 'goals-error-text';
    const detail = el('div', 'jp-goals-error-detail', errors.join('; '));
    detail.dataset.testid = 'goals-error-detail';
    this._errorNode.replaceChildren(
      text,
      detail,
      this._button('goals-error-refresh', 'Refresh')
    );
    this._errorNode.hidden = false;
    this.addClass('jp-goals-mod-unavailable');
  }

  private _renderHealth(health: IHealth): void {
    this._hasHealth = true;
    const status = el('span', 'jp-goals-status', health.status);
    status.dataset.testid = 'goals-health-status';
    status.dataset.status = health.status;
    status.classList.add(`jp-goals-status-${cssToken(health.status)}`);

    const list = el('dl', 'jp-goals-health-list');
    const row = (label: string, value: Node | string, testid: string) => {
      const dd = el('dd');
      dd.dataset.testid = testid;
      dd.append(value);
      list.append(el('dt', undefined, label), dd);
    };
    row('Status', status, 'goals-health-status-row');
    row('Host', health.host_name ?? '—', 'goals-health-host');
    row('Workers', formatValue(health.workers), 'goals-health-workers');
    this._healthNode.replaceChildren(list);
  }

  private _renderSessions(sessions: ISessionSummary[]): void {
    const heading = el('h3', 'jp-goals-subheading', 'Sessions');
    if (sessions.length === 0) {
      const empty = el('div', 'jp-goals-empty', EMPTY_TEXT);
      empty.dataset.testid = 'goals-sessions-empty';
      this._sessionsNode.replaceChildren(heading, empty);
      return;
    }
    const list = el('ul', 'jp-goals-session-list');
    list.setAttribute('role', 'listbox');
    const selected = this._detail.sessionId;
    for (const session of sessions) {
      const row = sessionRow(session);
      row.classList.toggle('jp-mod-selected', session.session_id === selected);
      row.setAttribute('aria-selected', String(session.session_id === selected));
      list.append(row);
    }
    this._sessionsNode.replaceChildren(heading, list);
  }

  private _markStale(node: HTMLElement, stale: boolean): void {
    node.classList.toggle('jp-goals-mod-stale', stale);
  }

  private _button(testid: string, label: string): HTMLButtonElement {
    const button = el('button', 'jp-goals-button jp-mod-styled', label);
    button.type = 'button';
    button.dataset.testid = testid;
    button.title = 'Re-read the Goals server state';
    button.addEventListener('click', () => void this.refresh());
    return button;
  }

  private readonly _errorNode: HTMLElement;
  private readonly _healthNode: HTMLElement;
  private readonly _sessionsNode: HTMLElement;
  private readonly _updatedNode: HTMLElement;
  private readonly _detail: SessionDetail;
  private _unsubscribe: (() => void) | null = null;
  private _hasHealth = false;
  private _pending: Promise<void> | null = null;
  private _timer: number | null = null;
}

function sessionRow(session: ISessionSummary): HTMLLIElement {
  const row = el('li', 'jp-goals-session');
  row.dataset.testid = 'goals-session';
  row.dataset.sessionId = session.session_id;
  row.setAttribute('role', 'option');
  row.tabIndex = 0;
  row.title = 'Show this session';

  const title = el(
    'span',
    'jp-goals-session-title',
    session.title || 'Untitled session'
  );
  title.dataset.testid = 'goals-session-title';
  title.title = session.session_id;

  const phaseText = session.work?.phase || 'idle';
  const phase = el('span', 'jp-goals-phase', phaseText);
  phase.dataset.testid = 'goals-session-phase';
  phase.dataset.phase = phaseText;
  phase.classList.add(`jp-goals-phase-${cssToken(phaseText)}`);

  const top = el('div', 'jp-goals-session-top');
  top.append(title, phase);
  row.append(top);

  const reasonText = session.work?.reason || session.work?.reason_code || '';
  if (reasonText) {
    const reason = el('div', 'jp-goals-session-reason', reasonText);
    reason.dataset.testid = 'goals-session-reason';
    if (session.work?.reason_code) {
      reason.dataset.reasonCode = session.work.reason_code;
    }
    row.append(reason);
  }
  return row;
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Render a health field whose exact shape the server may refine: numbers and
 * strings as they are, lists by their length, flat objects as `key: value`.
 */
export function formatValue(value: unknown): string {
  if (value === null || value === undefined) {
    return '—';
  }
  if (Array.isArray(value)) {
    return String(value.length);
  }
  if (typeof value === 'object') {
    const parts = Object.entries(value as Record<string, unknown>).map(
      ([key, item]) =>
        `${key}: ${
          typeof item === 'object' && item !== null
            ? JSON.stringify(item)
            : String(item)
        }`
    );
    return parts.length > 0 ? parts.join(', ') : '—';
  }
  return String(value);
}
