import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  GoalsAPIError,
  IApproval,
  IGoal,
  IGoalsEvent,
  IHistoryRecord,
  IWorkView,
  ITranscriptItem,
  payloadOf,
  postGoalsAPI,
  RequestBody,
  requestGoalsAPI
} from './api';
import { debounce, sharedEventFeed } from './events';
import { goalsStore, SessionEntry } from './store';
import { editGoal, EditOutcome } from './edit';
import { reconciliationLabel, settleButtons } from './settle';
import {
  actionErrorText,
  alertNode,
  approvalView,
  badge,
  el,
  goalView,
  historyRow,
  showAlert,
  unavailableNode
} from './views';
import { GoalsURL, urls } from './urls';

export const GOAL_MIME = 'application/vnd.jupyter-goals.goal+json';
export const APPROVAL_MIME = 'application/vnd.jupyter-goals.approval+json';
export const HISTORY_MIME = 'application/vnd.jupyter-goals.history+json';
export const CHAT_MIME = 'application/vnd.jupyter-goals.chat+json';

/**
 * A notebook output that carries only ids and reads everything else from REST: the chat and Goal
 * cards from the session's entry of the page's store, the others on the events that concern them.
 * Nothing lives in the kernel, so the output stays live after a kernel restart, a server restart, and
 * when the notebook is reopened with no kernel at all.
 */
abstract class LiveOutput extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('jp-goals-Output');
    this.node.dataset.testid = 'goals-output';
    this._alert = alertNode('goals-action-error');
    this._content = el('div', 'jp-goals-output-content');
    this.node.append(this._alert, this._content);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this._mimeType];
    this.ids = typeof data === 'object' && data !== null ? (data as Record<string, string>) : {};
    this.node.dataset.kind = this.kind;
    if (this._unsubscribe === null) {
      this._unsubscribe = this.follow();
    }
    await this.refresh();
  }

  /** Start following what the card shows; the returned function stops. */
  protected follow(): () => void {
    const later = debounce(() => void this.refresh(), 150);
    return sharedEventFeed().subscribe(events => {
      if (events === null || events.some(e => this.concerns(e))) {
        later();
      }
    });
  }

  /** Re-read and re-render; never rejects. */
  async refresh(): Promise<void> {
    const token = ++this._token;
    let content: HTMLElement;
    try {
      content = await this.load();
    } catch (error) {
      if (token === this._token) {
        this.showFailure(error);
      }
      return;
    }
    if (token === this._token) {
      this._content.classList.remove('jp-goals-mod-stale');
      this._content.replaceChildren(content);
    }
  }

  /** "State temporarily unavailable" with Refresh above the last good view, marked stale. */
  protected showFailure(error: unknown): void {
    const detail = error instanceof Error ? error.message : String(error);
    this._content.querySelector('[data-testid="goals-output-error"]')?.remove();
    this._content.classList.add('jp-goals-mod-stale');
    this._content.prepend(unavailableNode(detail, () => void this.refresh(), 'goals-output-error'));
  }

  dispose(): void {
    this._unsubscribe?.();
    this._unsubscribe = null;
    super.dispose();
  }

  protected abstract readonly kind: string;
  protected abstract load(): Promise<HTMLElement>;
  protected abstract concerns(event: IGoalsEvent): boolean;

  /** POST an action, show a refusal (409 included) clearly, then re-read. */
  protected async act(path: GoalsURL, body: RequestBody): Promise<void> {
    try {
      await postGoalsAPI(path, body, this.settings);
      showAlert(this._alert, null);
    } catch (error) {
      showAlert(this._alert, actionErrorText(error));
    }
    await this.refresh();
  }

  /** An edit dialog's outcome: a refusal goes to the alert line, then the card is read again. */
  protected async edit(run: () => Promise<EditOutcome>): Promise<void> {
    const outcome = await run();
    if (outcome !== null) {
      showAlert(this._alert, outcome.ok ? null : outcome.message);
      await this.refresh();
    }
  }

  protected ids: Record<string, string> = {};
  protected readonly settings = ServerConnection.makeSettings();
  private readonly _mimeType: string;
  private readonly _alert: HTMLElement;
  private readonly _content: HTMLElement;
  private _token = 0;
  private _unsubscribe: (() => void) | null = null;
}

class GoalOutput extends LiveOutput {
  protected readonly kind = 'goal';

  /**
   * While its Goal is the session's current one it is shown from the session's entry of the page's
   * store (the snapshot's Goal, with its usage: the read the session's other views share); once it is
   * not (it ended, another Goal came), an event naming it reads `GET /goals/{id}`.
   */
  protected follow(): () => void {
    const sessionId = this.ids.session_id;
    if (!sessionId) {
      return super.follow();
    }
    const entry = goalsStore().session(sessionId);
    this._entry = entry;
    return entry.subscribe((_entry, change) => {
      const current = entry.snapshot?.goal ?? null;
      const mine = current !== null && current.goal_id === this.ids.goal_id;
      if (change.resync) {
        this._shown = null; // the server came back: read it
        void this.refresh();
      } else if (change.changed && entry.error !== null) {
        this.showFailure(entry.error); // the session's read failed: its Refresh reads again
      } else if (change.changed && mine) {
        this._shown = current;
        void this.refresh();
      } else if (!mine && change.events.some(e => payloadOf(e).goal_id === this.ids.goal_id)) {
        this._shown = null; // not the session's current Goal (any more): read it
        void this.refresh();
      }
    });
  }

  protected async load(): Promise<HTMLElement> {
    const entry = this._entry;
    if (entry !== null && entry.error !== null) {
      await entry.refresh(); // after a failed read of the session (Refresh): read it again
      if (entry.error !== null) {
        throw entry.error;
      }
      const current = entry.snapshot?.goal ?? null;
      this._shown = current !== null && current.goal_id === this.ids.goal_id ? current : null;
    }
    const goal = this._shown ?? (await requestGoalsAPI(urls.goal(this.ids.goal_id ?? ''), this.settings));
    return goalView(goal, {
      onAction: action =>
        this.act(urls.goalActions(goal.goal_id), {
          action,
          expected_revision: goal.revision
        }),
      onEdit: () => void this.edit(() => editGoal(goal.goal_id, this.settings))
    });
  }

  protected concerns(event: IGoalsEvent): boolean {
    return payloadOf(event).goal_id === this.ids.goal_id; // only without a session id (see `follow`)
  }

  /** The Goal as the store holds it (its session's current Goal), else null: read it. */
  private _shown: IGoal | null = null;
  private _entry: SessionEntry | null = null;
}

class ApprovalOutput extends LiveOutput {
  protected readonly kind = 'approval';

  protected async load(): Promise<HTMLElement> {
    let approval: IApproval;
    try {
      // the one approval it shows (GET /approvals/{id}), not every approval of the server
      approval = await requestGoalsAPI<IApproval>(
        urls.approval(this.ids.approval_id ?? ''),
        this.settings
      );
    } catch (error) {
      if (error instanceof GoalsAPIError && error.status === 404) {
        throw new Error(`approval ${this.ids.approval_id} not found on this server`);
      }
      throw error;
    }
    this._callId = approval.call_id;
    return approvalView(approval, (path, body) => this.act(path, body));
  }

  protected concerns(event: IGoalsEvent): boolean {
    // its own approval's events (requested, decided, invalidated), and its call's dispatch (consumed)
    const payload = payloadOf(event);
    return (
      (event.kind.startsWith('approval.') && payload.approval_id === this.ids.approval_id) ||
      (event.kind === 'effect.state' && this._callId !== null && payload.call_id === this._callId)
    );
  }

  private _callId: string | null = null;
}

class HistoryOutput extends LiveOutput {
  protected readonly kind = 'history';

  protected async load(): Promise<HTMLElement> {
    const record = await requestGoalsAPI<IHistoryRecord>(
      urls.historyRecord(this.ids.record_id ?? ''),
      this.settings
    );
    return historyRow(record);
  }

  protected concerns(): boolean {
    return false; // a terminal record never changes; it is only re-read after a reconnect
  }
}

/** Transcript kinds a chat card shows (Goal prompts and records are internal). */
const CHAT_KINDS = new Set(['user', 'assistant', 'tool_call', 'tool_result', 'interruption', 'reconciliation', 'notice']);

/** A chat card reads its work item's items in pages of this many (at most this many pages). */
const CHAT_PAGE = 500;
const CHAT_MAX_PAGES = 10;

/**
 * `%chat`: one message of the notebook's session and its answer, read from the session's
 * transcript (the items of the message's work item) and its work state while it is current.
 */
class ChatOutput extends LiveOutput {
  protected readonly kind = 'chat';

  /**
   * Its work item's items: read once (`?work_id=`, a page at a time), then taken from the session's
   * entry of the page's store as they arrive (the read the session's other views share); read again
   * from the start only after the feed reconnects.
   */
  protected follow(): () => void {
    const entry = goalsStore().session(this.ids.session_id ?? '');
    return entry.subscribe((_entry, change) => {
      if (change.resync) {
        this._loaded = false; // the server came back: its items are read again from the start
        void this.refresh();
        return;
      }
      if (!change.changed || entry.snapshot === null) {
        return;
      }
      const mine = (change.reset ? entry.items : change.added).filter(i => i.work_id === this.ids.work_id);
      // its work item's state while it is the session's current one (then the items say how it ended)
      const current = entry.snapshot.work;
      const work = current !== null && current.work_id === this.ids.work_id ? current : null;
      if (this._loaded && (mine.length > 0 || JSON.stringify(work) !== JSON.stringify(this._work))) {
        this._merge(mine);
        this._work = work;
        void this.refresh();
      }
    });
  }

  protected async load(): Promise<HTMLElement> {
    const sid = this.ids.session_id ?? '';
    const workId = this.ids.work_id ?? '';
    if (!this._loaded) {
      // only its work item's items, a page at a time while that work item has more
      let snap = await requestGoalsAPI(urls.session(sid, { work_id: workId || undefined, after: 0, limit: CHAT_PAGE }),
        this.settings);
      const found: ITranscriptItem[] = workId ? [...(snap.transcript?.items ?? [])] : [];
      for (let pages = 1; workId && snap.transcript?.next_cursor != null && pages < CHAT_MAX_PAGES; pages++) {
        snap = await requestGoalsAPI(urls.session(sid, { work_id: workId, after: snap.transcript.next_cursor,
          limit: CHAT_PAGE }), this.settings);
        found.push(...(snap.transcript?.items ?? []));
      }
      this._items.clear();
      this._merge(found);
      this._work = snap.work && snap.work.work_id === workId ? snap.work : null;
      this._loaded = true;
    }
    return this._render();
  }

  protected concerns(): boolean {
    return false; // it follows the store (see `follow`)
  }

  private _merge(items: ITranscriptItem[]): void {
    for (const item of items) {
      if (item.work_id === this.ids.work_id) {
        this._items.set(item.seq, item);
      }
    }
  }

  private _render(): HTMLElement {
    const items = Array.from(this._items.values())
      .sort((a, b) => a.seq - b.seq)
      .filter(i => CHAT_KINDS.has(i.kind));
    const node = el('div', 'jp-goals-chat', undefined, 'goals-chat');
    node.dataset.workId = this.ids.work_id ?? '';
    const settled = new Set(items.filter(i => i.kind === 'reconciliation').map(i => i.call_id));
    for (const item of items) {
      const row = el('div', `jp-goals-chat-item jp-goals-chat-${item.kind}`, undefined, 'goals-chat-item');
      row.dataset.kind = item.kind;
      const who = item.kind === 'user' ? 'You' : item.kind === 'assistant' ? 'Assistant' : item.tool || item.kind;
      row.append(el('b', 'jp-goals-chat-who', `${who}: `));
      const content =
        item.kind === 'tool_call'
          ? JSON.stringify(item.arguments ?? {})
          : item.kind === 'reconciliation' && item.meta?.settled
            ? reconciliationLabel(item)
            : item.content;
      row.append(el('span', 'jp-goals-chat-text', content.length > 2000 ? `${content.slice(0, 2000)}…` : content));
      if (item.state) {
        row.append(badge(item.state, 'goals-chat-effect-state'));
      }
      if (item.kind === 'tool_result' && item.state === 'unknown' && item.call_id && !settled.has(item.call_id)) {
        const callId = item.call_id;
        row.append(
          settleButtons(item.tool, outcome =>
            void this.act(urls.sessionActions(this.ids.session_id ?? ''), {
              action: 'settle',
              effect_id: callId,
              outcome
            })
          )
        );
      }
      node.append(row);
    }
    const work = this._work;
    const phase = work ? work.phase : items.some(i => i.kind === 'assistant') ? 'done' : 'queued';
    const status = el('div', 'jp-goals-chat-status');
    status.append(badge(phase, 'goals-chat-phase'));
    if (work?.reason) {
      status.append(el('span', 'jp-goals-reason', work.reason, 'goals-chat-reason'));
    }
    node.append(status);
    return node;
  }

  private _loaded = false;
  private readonly _items = new Map<number, ITranscriptItem>();
  private _work: IWorkView | null = null;
}

function factory(
  mimeType: string,
  create: (options: IRenderMime.IRendererOptions) => IRenderMime.IRenderer
): IRenderMime.IRendererFactory {
  // safe: the renderer shows server data as text, never as HTML, so untrusted notebooks use it too
  return { safe: true, mimeTypes: [mimeType], defaultRank: 0, createRenderer: create };
}

const extensions: IRenderMime.IExtension[] = [
  {
    id: 'jupyter-goals:goal-output',
    description: 'Live Goal outputs of %goal (ids only; state read from the server).',
    rendererFactory: factory(GOAL_MIME, options => new GoalOutput(options)),
    rank: 0,
    dataType: 'json'
  },
  {
    id: 'jupyter-goals:approval-output',
    description: 'Live approval outputs (Approve / Deny).',
    rendererFactory: factory(APPROVAL_MIME, options => new ApprovalOutput(options)),
    rank: 0,
    dataType: 'json'
  },
  {
    id: 'jupyter-goals:chat-output',
    description: 'Live %chat outputs: a message and its answer (ids only; read from the server).',
    rendererFactory: factory(CHAT_MIME, options => new ChatOutput(options)),
    rank: 0,
    dataType: 'json'
  },
  {
    id: 'jupyter-goals:history-output',
    description: 'Terminal Goal records (read-only).',
    rendererFactory: factory(HISTORY_MIME, options => new HistoryOutput(options)),
    rank: 0,
    dataType: 'json'
  }
];

export default extensions;
