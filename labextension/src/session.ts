import { ServerConnection } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  GoalsAPIError,
  IGoalsEvent,
  IModelInfo,
  ISessionSnapshot,
  ITranscriptItem,
  payloadOf,
  RequestBody,
  requestGoalsAPI
} from './api';
import { ContinuityBanner } from './banner';
import { Composer } from './composer';
import { editPermissions } from './edit';
import { sharedEventFeed } from './events';
import { goalsStore, ISessionChange, SessionEntry } from './store';
import { modelCatalog } from './models';
import { TranscriptList } from './transcript';
import { usageLine } from './usage';
import {
  actionBar,
  actionErrorText,
  alertNode,
  approvalView,
  badge,
  button,
  el,
  postAction,
  replaceKeepingFocus,
  SESSION_VIEW_ACTIONS,
  showAlert,
  showHistoryDetails,
  unavailableNode
} from './views';
import { GoalsURL, urls } from './urls';


/** One sentence each, so a person knows which to press. */
export const PAUSE_WORDS = 'Pause lets the running step finish and starts nothing new.';
export const STOP_WORDS = 'Stop ends the work now: a running command is cancelled.';

/**
 * One session in the main area: header (title, model, state, reason, backend actions), the
 * windowed transcript, pending approvals and the composer. It reads `GET /sessions/{id}` when it
 * opens (newest page first), when it is shown again, after the event feed reconnects and when an
 * event names its session; it reads forward with `?after=<last seq>` (the transcript is append-only),
 * so it never holds state the server did not give it.
 */
export class SessionView extends Widget {
  constructor(
    readonly sessionId: string,
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    super();
    this.addClass('jp-goals-SessionView');
    this.node.dataset.testid = 'goals-session-view';
    this.node.dataset.sessionId = sessionId;

    this._header = el('header', 'jp-goals-session-header', undefined, 'goals-session-header');
    this._title = el('h2', 'jp-goals-session-heading', 'Loading…', 'goals-session-heading');
    this._meta = el('div', 'jp-goals-session-meta', undefined, 'goals-session-meta');
    this._state = el('div', 'jp-goals-detail-state', undefined, 'goals-session-state');
    this._actions = el('div', 'jp-goals-session-actions');
    this._connection = el('span', 'jp-goals-connection', '', 'goals-connection');
    this._connection.setAttribute('role', 'status');
    this._header.append(this._title, this._meta, this._state, this._actions, this._connection);

    this._error = el('div');
    this._alert = alertNode('goals-session-alert');
    this._banner = new ContinuityBanner(sessionId, this._settings, {
      act: async (action, version) => {
        const body = { action, expected_control_version: version };
        const ok = await postAction(urls.sessionActions(this.sessionId), body, this._settings, this._alert);
        void this.refresh(); // the banner answers now: taken, this read's new version reads it again
        return ok;
      },
      focusApproval: () => focusIn(this._approvals, '[data-testid="goals-approval-approve"]'),
      focusCall: callId => focusIn(this._transcript.node, `[data-call-id="${CSS.escape(callId)}"] button`)
    });
    this._transcript = new TranscriptList({
      openGoalRecord: item => void this._openRecord(item),
      loadOlder: () => void this._loadOlder(),
      cancelCall: callId =>
        void this._act(urls.sessionActions(this.sessionId), {
          action: 'cancel_tool',
          effect_id: callId
        }),
      settleCall: (callId, outcome) =>
        void this._act(urls.sessionActions(this.sessionId), {
          action: 'settle',
          effect_id: callId,
          outcome
        })
    });
    this._approvals = el('section', 'jp-goals-approvals', undefined, 'goals-session-approvals');
    this._approvals.setAttribute('aria-label', 'Waiting for you');
    this._draft = el('div', 'jp-goals-item jp-goals-item-assistant jp-goals-draft', undefined, 'goals-draft');
    this._draft.hidden = true;
    this._draft.setAttribute('aria-live', 'polite');
    this._composer = new Composer(sessionId, this._settings, {
      showsItem: itemId => this._transcript.hasItem(itemId),
      onSent: () => undefined, // what it sent arrives as events of this session, read by the store
      onGoalAction: (path, body) => this._act(path, body)
    });
    // the feed emits nothing while the server is gone: it tells when it cannot reach it
    this._stopConnection = sharedEventFeed().onMode(mode =>
      this._showConnection(mode === 'down' ? 'Reconnecting to the server…' : '')
    );
    this.node.append(
      this._header,
      this._banner.node,
      this._error,
      this._alert,
      this._transcript.node,
      this._draft,
      this._approvals,
      this._composer.node
    );
  }

  /** Read what is new of the session (the store's shared read); never rejects. */
  refresh(): Promise<void> {
    return this._entry?.refresh() ?? Promise.resolve();
  }

  /** Resolves once the first page is rendered (tests and the open command time this). */
  get ready(): Promise<void> {
    return this._ready;
  }

  dispose(): void {
    this._unfollow();
    this._composer.dispose();
    this._stopConnection();
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._follow();
  }

  protected onBeforeDetach(msg: Message): void {
    this._unfollow();
    super.onBeforeDetach(msg);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._transcript.update();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._transcript.update();
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    this._composer.focus();
  }

  /** The store's entry of this session feeds the view; the feed itself only wakes the banner. */
  private _follow(): void {
    if (this._entry !== null) {
      return;
    }
    this._entry = goalsStore().session(this.sessionId);
    this._unsubscribeEntry = this._entry.subscribe((entry, change) => this._onChange(entry, change));
    this._unsubscribe = sharedEventFeed().subscribe(events => {
      if (events === null || events.some(e => e.kind === 'recovery.summary')) {
        void this._banner.refresh(); // the server came back: what did its recovery do here?
      }
    });
  }

  private _unfollow(): void {
    this._unsubscribe?.();
    this._unsubscribe = null;
    this._unsubscribeEntry?.();
    this._unsubscribeEntry = null;
    this._entry = null;
  }

  private _onChange(entry: SessionEntry, change: ISessionChange): void {
    for (const event of change.events) {
      this._onEvent(event);
    }
    if (!change.changed) {
      return;
    }
    if (entry.error !== null || entry.snapshot === null) {
      this._showError(entry.error);
      return;
    }
    if (change.reset) {
      this._transcript.reset(entry.items);
      void this._banner.refresh();
    } else if (change.added.length > 0) {
      this._transcript.append(change.added);
    }
    this._transcript.setOlderState(entry.prevCursor === null ? 'start' : 'more');
    this._error.replaceChildren();
    this.node.classList.remove('jp-goals-mod-stale');
    void this._render(entry.snapshot).then(() => this._resolveReady());
  }

  private _showError(error: unknown): void {
    const detail = error instanceof Error ? error.message : String(error);
    const shown = this._error.querySelector<HTMLElement>('[data-testid="goals-session-error-detail"]');
    if (shown) {
      shown.textContent = detail; // keep the box (and its Refresh button) in place while reads fail
    } else {
      this._error.replaceChildren(unavailableNode(detail, () => void this.refresh(), 'goals-session-error'));
    }
    this.node.classList.add('jp-goals-mod-stale');
    if (error instanceof GoalsAPIError && error.status === 404) {
      this._title.textContent = 'Session not found';
    }
  }

  /** Says "Reconnecting…" while the feed cannot reach the server (told by the feed, not polled). */
  private _showConnection(text: string): void {
    if (this._connection.textContent !== text) {
      this._connection.textContent = text;
      this.node.classList.toggle('jp-goals-mod-reconnecting', text !== '');
    }
  }

  /** Event payloads are hints: effect states move a call's badge, drafts show streamed text. */
  private _onEvent(event: IGoalsEvent): void {
    const payload = payloadOf(event);
    if (event.kind === 'effect.state' && typeof payload.call_id === 'string' && typeof payload.state === 'string') {
      this._transcript.setEffectState(payload.call_id, payload.state);
    } else if (/draft|delta/.test(event.kind)) {
      const piece = payload.text ?? payload.delta ?? payload.chunk;
      if (typeof piece === 'string') {
        this._draftText = payload.full === true ? piece : this._draftText + piece;
        this._draft.replaceChildren(
          el('div', 'jp-goals-item-who', 'Assistant (streaming)'),
          el('div', 'jp-goals-item-text', this._draftText)
        );
        this._draft.hidden = false;
      }
    } else if (event.kind === 'transcript.item' && payload.kind === 'assistant') {
      this._clearDraft();
    }
  }

  private _clearDraft(): void {
    this._draftText = '';
    this._draft.hidden = true;
    this._draft.replaceChildren();
  }

  private async _loadOlder(): Promise<void> {
    const entry = this._entry;
    if (this._loadingOlder || entry === null || entry.prevCursor === null || !entry.opened) {
      return;
    }
    this._loadingOlder = true;
    this._transcript.setOlderState('loading');
    try {
      this._transcript.prepend(await entry.loadOlder());
    } catch (error) {
      showAlert(this._alert, `Older messages could not be read: ${actionErrorText(error)}`);
    } finally {
      this._loadingOlder = false;
      this._transcript.setOlderState(entry.prevCursor === null ? 'start' : 'more');
    }
  }

  private async _render(snapshot: ISessionSnapshot): Promise<void> {
    const session = snapshot.session;
    const title = session.title || 'Untitled chat';
    this._title.textContent = title;
    this.title.label = title;
    this.title.caption = `Goals session ${this.sessionId}`;

    const work = snapshot.work;
    const version = work?.control_version ?? null;
    if (version !== this._version && this._version !== null && !this._banner.node.hidden) {
      void this._banner.refresh(); // a control since the banner's read: its actions follow (Resume gone once resumed)
    }
    this._version = version;

    const model = await modelCatalog(this._settings).find(session.model ?? '');
    this._renderMeta(snapshot, model);

    this._state.replaceChildren();
    if (work) {
      this._state.append(badge(work.phase, 'goals-session-phase'));
      if (work.reason) {
        const reason = el('span', 'jp-goals-reason', work.reason, 'goals-session-reason');
        reason.dataset.reasonCode = work.reason_code;
        this._state.append(reason);
        if (work.reason_code === 'permission_revoked') {
          this._state.append(
            button('Change permissions', 'goals-session-reason-permissions', () => void this._editPermissions())
          );
        }
      }
      this.node.dataset.phase = work.phase;
      if (!['working', 'recovering'].includes(work.phase)) {
        this._clearDraft();
      }
    } else {
      this._state.append(el('span', 'jp-goals-empty', 'No work yet: send a message to start.'));
      this.node.dataset.phase = '';
    }
    const why = work?.reason || snapshot.actions.reason_code || '';
    replaceKeepingFocus(
      this._actions,
      actionBar('goals-session-view', SESSION_VIEW_ACTIONS, snapshot.actions, why, action =>
        this._act(urls.sessionActions(this.sessionId), {
          action,
          ...(work?.control_version !== undefined ? { expected_control_version: work.control_version } : {})
        })
      ),
      ...(snapshot.actions.can_takeover
        ? [
            button(
              'Take over',
              'goals-session-view-takeover',
              () =>
                void this._act(urls.sessionActions(this.sessionId), {
                  action: 'takeover',
                  ...(work?.control_version !== undefined ? { expected_control_version: work.control_version } : {})
                }),
              'Take over: run this work on this server\'s host; its running commands there become unknown outcomes, never run again without approval'
            )
          ]
        : []),
      el('div', 'jp-goals-help', `${PAUSE_WORDS} ${STOP_WORDS}`, 'goals-session-help')
    );

    const approvals: HTMLElement[] = [];
    if (snapshot.approvals.length > 0) {
      approvals.push(el('div', 'jp-goals-subheading', 'Waiting for you'));
      for (const approval of snapshot.approvals) {
        approvals.push(
          approvalView(approval, (path, body) => this._act(path, body))
        );
      }
    }
    replaceKeepingFocus(this._approvals, ...approvals);
    this._approvals.hidden = snapshot.approvals.length === 0;

    this._composer.update(snapshot);
  }

  private _renderMeta(snapshot: ISessionSnapshot, model: IModelInfo | null): void {
    const session = snapshot.session;
    const parts: HTMLElement[] = [];
    const modelName = session.model ?? 'default';
    const modelNode = el('span', 'jp-goals-session-model', undefined, 'goals-session-model');
    modelNode.append(el('span', 'jp-goals-meta-label', 'Model '), el('code', undefined, model?.name ?? modelName));
    if (model && !model.credentials_present) {
      modelNode.append(el('span', 'jp-goals-warn', ' (credentials missing)'));
    }
    parts.push(modelNode);
    if (model?.description) {
      parts.push(el('span', 'jp-goals-model-description', model.description, 'goals-session-model-description'));
    }
    if (session.cwd) {
      const cwd = el('span', 'jp-goals-session-cwd', undefined, 'goals-session-cwd');
      cwd.append(el('span', 'jp-goals-meta-label', 'Folder '), el('code', undefined, session.cwd));
      parts.push(cwd);
    }
    const mode = session.permissions?.mode ?? 'ask';
    const allow = (session.permissions?.allow ?? []).map(a => (typeof a === 'string' ? a : JSON.stringify(a)));
    const permissions = el('span', 'jp-goals-session-permissions-line');
    permissions.append(
      el(
        'span',
        'jp-goals-session-permissions',
        `Permissions: ${mode === 'bypass' ? 'bypass (no approvals)' : 'ask before writes and commands'}${
          allow.length ? `; allowed without asking: ${allow.join(', ')}` : ''
        }`,
        'goals-session-permissions'
      ),
      button('Permissions', 'goals-session-permissions-edit', () => void this._editPermissions(),
        'Change the mode, revoke an always-allowed tool, add folders')
    );
    parts.push(permissions, usageLine(snapshot.usage));
    replaceKeepingFocus(this._meta, ...parts);
  }

  private async _openRecord(item: ITranscriptItem): Promise<void> {
    try {
      const answer = await requestGoalsAPI(
        urls.sessionHistory(this.sessionId),
        this._settings
      );
      const goalId = item.meta?.goal_id;
      const record = (answer.records ?? []).find(
        r => r.anchor?.item_id === item.item_id || (goalId !== undefined && r.goal_id === goalId)
      );
      if (!record) {
        showAlert(this._alert, 'This Goal record could not be found.');
        return;
      }
      await showHistoryDetails(record);
    } catch (error) {
      showAlert(this._alert, actionErrorText(error));
    }
  }

  private async _editPermissions(): Promise<void> {
    const outcome = await editPermissions(this.sessionId, this._settings);
    if (outcome !== null) {
      showAlert(this._alert, outcome.ok ? null : outcome.message);
      await this.refresh();
    }
  }

  private async _act(path: GoalsURL, body: RequestBody): Promise<void> {
    await postAction(path, body, this._settings, this._alert);
    await this.refresh();
  }

  private _resolveReady: () => void = () => undefined;
  private readonly _ready = new Promise<void>(resolve => (this._resolveReady = resolve));
  private readonly _header: HTMLElement;
  private readonly _title: HTMLElement;
  private readonly _meta: HTMLElement;
  private readonly _state: HTMLElement;
  private readonly _actions: HTMLElement;
  private readonly _connection: HTMLElement;
  private readonly _error: HTMLElement;
  private readonly _alert: HTMLElement;
  private readonly _banner: ContinuityBanner;
  /** The control version of the last snapshot rendered (a change refreshes a shown banner). */
  private _version: number | null = null;
  private readonly _approvals: HTMLElement;
  private readonly _draft: HTMLElement;
  private readonly _transcript: TranscriptList;
  private readonly _composer: Composer;
  private readonly _stopConnection: () => void;
  private _draftText = '';
  private _loadingOlder = false;
  private _entry: SessionEntry | null = null;
  private _unsubscribeEntry: (() => void) | null = null;
  private _unsubscribe: (() => void) | null = null;
}

/** Scrolls to and focuses the first control matching `selector` under `root`; false when there is none. */
function focusIn(root: HTMLElement, selector: string): boolean {
  const target = root.querySelector<HTMLElement>(selector);
  target?.scrollIntoView({ block: 'center' });
  target?.focus();
  return target !== null;
}
