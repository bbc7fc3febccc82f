import { ServerConnection } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  IGoalsEvent,
  IHealth,
  IRecovery,
  ISessionList,
  ISessionSummary,
  isHealth,
  isSessionList,
  payloadOf,
  requestGoalsAPI
} from './api';
import { SessionDetail } from './detail';
import { stopAllWork } from './edit';
import { AttentionInbox } from './inbox';
import { debounce, OneAtATime, sharedEventFeed } from './events';
import { modelCatalog } from './models';
import { RecoverySummary } from './recovery';
import { urls } from './urls';
import { button, cssToken, el, replaceKeepingFocus } from './views';

/** Sessions per page of `GET /sessions` (keyset paging); "Show more sessions" reads the next. */
export const SESSIONS_PAGE = 100;

/** What the panel asks of the application: open a session in the main area, start a new chat. */
export interface ISidebarHost {
  openSession(sessionId: string): void;
  newChat(): void;
}

export const UNAVAILABLE_TEXT = 'State temporarily unavailable';
export const EMPTY_TEXT = 'No sessions yet';

/** Outcome of one refresh: each part is either fresh data or an error text. */
interface ISnapshot {
  health: IHealth | null;
  sessions: ISessionSummary[] | null;
  /** Cursor of the page after the loaded ones (null: everything is loaded). */
  more: string | number | null;
  recovery: IRecovery | null;
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
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private readonly _host: ISidebarHost | null = null
  ) {
    super();
    this.id = 'jupyter-goals-sidebar';
    this.addClass('jp-goals-Sidebar');
    this.node.dataset.testid = 'goals-sidebar';

    const header = el('div', 'jp-goals-header');
    const tools = el('div', 'jp-goals-header-buttons');
    if (_host) {
      const create = button('New chat', 'goals-new-chat', () => _host.newChat(),
        'Start a chat: pick a folder, a model and what it may do without asking');
      create.classList.add('jp-mod-accept');
      tools.append(create);
    }
    tools.append(this._button('goals-refresh', 'Refresh'));
    const stopAll = button('Stop all work', 'goals-stop-all', () => void this._stopAll(),
      'Quit and stop all tasks: every chat\'s running or waiting work stops, durably');
    stopAll.classList.add('jp-mod-warn');
    tools.append(stopAll);
    header.append(el('h2', 'jp-goals-heading', 'Goals'), tools);
    this._stopAllNote = el('div', 'jp-goals-alert', undefined, 'goals-stop-all-result');
    this._stopAllNote.setAttribute('role', 'status');
    this._stopAllNote.hidden = true;
    header.append(this._stopAllNote);
    this._recovery = new RecoverySummary(sessionId => this._open(sessionId));
    this._inbox = new AttentionInbox(this.title, sessionId => this._open(sessionId), this._settings);

    this._errorNode = el('div', 'jp-goals-error');
    this._errorNode.dataset.testid = 'goals-error';
    this._errorNode.setAttribute('role', 'alert');
    this._errorNode.hidden = true;

    this._healthNode = el('section', 'jp-goals-health');
    this._healthNode.dataset.testid = 'goals-health';

    this._filterNode = this._filterBar();
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
      this._recovery.node,
      this._inbox.node,
      this._healthNode,
      this._filterNode,
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
    // a call while a read runs reads again once it is done (a filter or page count changed meanwhile)
    return this._reads.run();
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
    this._inbox.dispose();
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
    const target = event.target as HTMLElement | null;
    if (target?.closest('button')) {
      return; // "Show more sessions" and other buttons inside the list
    }
    const row = target?.closest<HTMLElement>('.jp-goals-session');
    if (row?.dataset.sessionId) {
      event.preventDefault();
      this._open(row.dataset.sessionId);
    }
  }

  /** Select the session here and open its view in the main area. */
  private _open(sessionId: string): void {
    this.selectSession(sessionId);
    this._host?.openSession(sessionId);
  }

  /**
   * Follow the feed while visible: an event that changes a listed session's title or phase patches its
   * row, activity moves it to the top (the list's order), and only what the rows cannot show says read
   * the list again (a new session, one not listed, a filter the change may affect, a recovery pass, a
   * worker starting or dying, a reconnect). Nothing polls: when the feed cannot reach the server the
   * panel reads once, to show what is unavailable, and again when the feed is back.
   */
  private _startTimer(): void {
    this._detail.setLive(true);
    if (this._unsubscribe === null) {
      const later = debounce(() => void this.refresh(), 300);
      const feed = sharedEventFeed();
      const unsubscribe = feed.subscribe(events => {
        if (events === null || this._apply(events)) {
          later();
        }
      });
      const stopMode = feed.onMode(mode => {
        if (mode === 'down') {
          void this.refresh();
        }
      });
      this._unsubscribe = () => {
        unsubscribe();
        stopMode();
      };
    }
  }

  private _stopTimer(): void {
    this._detail.setLive(false);
    this._unsubscribe?.();
    this._unsubscribe = null;
  }

  /** Patch the listed rows from events; true when the list must be read again. */
  private _apply(events: IGoalsEvent[]): boolean {
    let read = false;
    let changed = false;
    for (const event of events) {
      if (/^(session\.created|recovery\.summary|worker\.)/.test(event.kind)) {
        read = true;
        continue;
      }
      const sid = event.session_id;
      if (!sid || !/^(session\.updated|work\.(phase|created)|message\.accepted)$/.test(event.kind)) {
        continue;
      }
      const index = this._sessions.findIndex(s => s.session_id === sid);
      if (index < 0 || this._text !== '' || (this._state !== '' && event.kind.startsWith('work.'))) {
        read = true; // a session the list does not show, or a change a filter may decide on
        continue;
      }
      const payload = payloadOf(event);
      let row = this._sessions[index];
      if (event.kind === 'session.updated') {
        row = { ...row, title: String(payload.title ?? row.title), model: String(payload.model ?? row.model) };
      } else if (event.kind === 'work.phase') {
        if (row.work === null) {
          read = true;
          continue;
        }
        row = { ...row, work: { ...row.work, work_id: event.work_id ?? row.work.work_id, phase: payload.phase,
          reason_code: payload.reason_code, reason: payload.reason, desired_state: payload.desired_state } };
      }
      this._sessions.splice(index, 1);
      // newest activity first: created, renamed, a message accepted, a turn admitted (a phase alone keeps its place)
      this._sessions.splice(event.kind === 'work.phase' ? index : 0, 0, row);
      changed = true;
    }
    if (changed && !read) {
      this._renderSessions(this._sessions, this._more);
    }
    return read;
  }

  /** The loaded pages, read again from the first (a page at most `SESSIONS_PAGE` long). */
  private async _loadSessions(): Promise<{ sessions: ISessionSummary[]; more: string | number | null }> {
    const all: ISessionSummary[] = [];
    let cursor: string | number | null = null;
    for (let page = 0; page < this._pages; page++) {
      const query = urls.sessions({ limit: SESSIONS_PAGE, cursor, q: this._text, state: this._state });
      const answer: unknown = await requestGoalsAPI(query, this._settings);
      if (!isSessionList(answer)) {
        throw new Error('sessions: unexpected response');
      }
      all.push(...(answer as ISessionList).sessions);
      cursor = (answer as ISessionList).next_cursor ?? null;
      if (cursor === null) {
        break;
      }
    }
    return { sessions: all, more: cursor };
  }

  private async _load(): Promise<ISnapshot> {
    const [health, sessions, recovery, models] = await Promise.allSettled([
      requestGoalsAPI(urls.health(), this._settings),
      this._loadSessions(),
      requestGoalsAPI(urls.recovery(), this._settings),
      modelCatalog(this._settings).list()
    ]);
    if (models.status === 'fulfilled') {
      // a session records the resolved `provider:model`; the panel says the configured name
      this._modelNames = new Map(models.value.models.map(m => [`${m.provider}:${m.model}`, m.name]));
      this._modelAbout = new Map(models.value.models.map(m => [m.name, m.description ?? '']));
    }
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
    let more: string | number | null = null;
    if (sessions.status === 'rejected') {
      errors.push(message(sessions.reason));
    } else {
      sessionsValue = sessions.value.sessions;
      more = sessions.value.more;
    }
    // the recovery summary is optional: a server without it shows none, and no error
    const recoveryValue =
      recovery.status === 'fulfilled' && Array.isArray(recovery.value?.items) ? recovery.value : null;
    return {
      health: healthValue,
      sessions: sessionsValue,
      more,
      recovery: recoveryValue,
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
      this._sessions = [...snapshot.sessions];
      this._more = snapshot.more;
      this._renderSessions(this._sessions, this._more);
    }
    this._recovery.render(snapshot.recovery);
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

  private _renderSessions(sessions: ISessionSummary[], more: string | number | null = null): void {
    const heading = el('h3', 'jp-goals-subheading', 'Sessions');
    if (sessions.length === 0) {
      const filtered = this._text !== '' || this._state !== '';
      const empty = el('div', 'jp-goals-empty', filtered ? 'No sessions match' : EMPTY_TEXT);
      empty.dataset.testid = 'goals-sessions-empty';
      this._sessionsNode.replaceChildren(heading, empty);
      return;
    }
    const list = el('ul', 'jp-goals-session-list');
    list.setAttribute('role', 'listbox');
    const selected = this._detail.sessionId;
    for (const session of sessions) {
      const model = session.model ? this._modelNames.get(session.model) ?? session.model : '';
      const row = sessionRow({ ...session, model }, model ? this._modelAbout.get(model) ?? '' : '');
      row.classList.toggle('jp-mod-selected', session.session_id === selected);
      row.setAttribute('aria-selected', String(session.session_id === selected));
      list.append(row);
    }
    const parts: HTMLElement[] = [heading, list];
    if (more !== null) {
      parts.push(
        button('Show more sessions', 'goals-sessions-more', () => {
          this._pages += 1;
          void this.refresh();
        }, `Load the next ${SESSIONS_PAGE} sessions`)
      );
    }
    parts.push(el('div', 'jp-goals-updated', `${sessions.length} session${sessions.length === 1 ? '' : 's'} shown`,
      'goals-sessions-count'));
    replaceKeepingFocus(this._sessionsNode, ...parts);
  }

  /** Text and state filters of `GET /sessions` (`q`, `state`); a change reads from the first page. */
  private _filterBar(): HTMLElement {
    const bar = el('div', 'jp-goals-filter', undefined, 'goals-filter');
    const text = el('input', undefined, undefined, 'goals-filter-text');
    text.type = 'search';
    text.placeholder = 'Filter sessions';
    text.setAttribute('aria-label', 'Filter sessions');
    const state = el('select', undefined, undefined, 'goals-filter-state');
    state.setAttribute('aria-label', 'State');
    for (const value of ['', 'working', 'waiting', 'queued', 'recovering', 'paused', 'failed', 'interrupted',
      'done', 'cancelled', 'idle']) {
      const option = el('option', undefined, value || 'All states');
      option.value = value;
      state.append(option);
    }
    const apply = debounce(() => {
      this._text = text.value.trim();
      this._state = state.value;
      this._pages = 1;
      void this.refresh();
    }, 250);
    text.addEventListener('input', apply);
    state.addEventListener('change', apply);
    bar.append(text, state);
    return bar;
  }

  private _markStale(node: HTMLElement, stale: boolean): void {
    node.classList.toggle('jp-goals-mod-stale', stale);
  }

  private async _stopAll(): Promise<void> {
    const outcome = await stopAllWork(this._settings);
    if (outcome !== null) {
      this._stopAllNote.textContent = outcome.message;
      this._stopAllNote.hidden = false;
      await this.refresh();
    }
  }

  private _button(testid: string, label: string): HTMLButtonElement {
    const button = el('button', 'jp-goals-button jp-mod-styled', label);
    button.type = 'button';
    button.dataset.testid = testid;
    button.title = 'Re-read the Goals server state';
    button.addEventListener('click', () => void this.refresh());
    return button;
  }

  private readonly _stopAllNote: HTMLElement;
  private readonly _inbox: AttentionInbox;
  private readonly _errorNode: HTMLElement;
  private readonly _healthNode: HTMLElement;
  private readonly _sessionsNode: HTMLElement;
  private readonly _updatedNode: HTMLElement;
  private readonly _detail: SessionDetail;
  private readonly _recovery: RecoverySummary;
  private _pages = 1;
  private _text = '';
  private _state = '';
  private readonly _filterNode: HTMLElement;
  private _modelNames = new Map<string, string>();
  private _modelAbout = new Map<string, string>();
  private _unsubscribe: (() => void) | null = null;
  private _hasHealth = false;
  private readonly _reads = new OneAtATime(
    async () => {
      const snapshot = await this._load();
      if (!this.isDisposed) {
        this._render(snapshot);
      }
      if (snapshot.errors.length === 0) {
        sharedEventFeed().nudge();
      }
    },
    () => !this.isDisposed
  );
  private _sessions: ISessionSummary[] = [];
  private _more: string | number | null = null;
}

function sessionRow(session: ISessionSummary, modelAbout = ''): HTMLLIElement {
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
  if (session.model) {
    const model = el('div', 'jp-goals-session-model', `model: ${session.model}`);
    model.dataset.testid = 'goals-session-model';
    if (modelAbout) {
      model.title = modelAbout; // what the model can do (the demo model's description)
    }
    row.append(model);
  }

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
