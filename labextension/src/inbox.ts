import { ServerConnection } from '@jupyterlab/services';
import { Title, Widget } from '@lumino/widgets';

import { IAttention, IAttentionItem, IGoalsEvent, payloadOf, postGoalsAPI, requestGoalsAPI } from './api';
import { editGoal, EditOutcome, editPermissions } from './edit';
import { debounce, OneAtATime, sharedEventFeed } from './events';
import { settleButtons } from './settle';
import { actionErrorText, alertNode, badge, button, el, replaceKeepingFocus, showAlert } from './views';
import { GoalsURL, urls } from './urls';

export type { IAttention, IAttentionItem } from './api';

/** What each kind says in the list (the reason sentence follows it). */
const KIND_WORDS: Record<IAttentionItem['kind'], string> = {
  approval: 'Approval',
  question: 'Question',
  failed: 'Failed',
  budget: 'Budget',
  blocked: 'Blocked',
  unknown_outcome: 'Outcome unknown',
  permissions: 'Permissions',
  host_unreachable: 'Host unreachable',
  needs_you: 'Needs you'
};


/**
 * One attention inbox: everything across chats that waits for the person (approvals, questions,
 * failures, budget stops, blocked Goals, unknown outcomes, unreachable hosts), each with its action in
 * place, from `GET /attention` (rebuilt from the server's records, so the same after any restart). It
 * follows the event feed from the page's start, hidden or not, and keeps the Goals tab's count badge.
 */
export class AttentionInbox {
  readonly node: HTMLElement;

  constructor(
    private readonly _title: Title<Widget>,
    private readonly _open: (sessionId: string) => void,
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    this.node = el('section', 'jp-goals-inbox', undefined, 'goals-inbox');
    this.node.setAttribute('aria-label', 'Waiting for you');
    this._heading = el('h3', 'jp-goals-subheading', 'Waiting for you', 'goals-inbox-heading');
    this._list = el('ul', 'jp-goals-inbox-list', undefined, 'goals-inbox-list');
    this._alert = alertNode('goals-inbox-alert');
    this.node.append(this._heading, this._alert, this._list);
    this.node.hidden = true;
    const later = debounce(() => void this.refresh(), 150);
    this._unsubscribe = sharedEventFeed().subscribe(events => {
      if (events === null || this._take(events)) {
        later();
      }
    });
    void this.refresh();
  }

  /**
   * Apply what an event says by itself (an answered or withdrawn approval leaves the list); true when
   * `GET /attention` must be read again: something may have started to wait (a new approval, a failure,
   * a reason that waits for a person, an unknown outcome, a recovery pass), or a listed chat changed.
   */
  private _take(events: IGoalsEvent[]): boolean {
    let read = false;
    let removed = false;
    for (const event of events) {
      const payload = payloadOf(event);
      const listed = this._items.some(i => i.session_id === event.session_id);
      if (event.kind === 'approval.decided' || event.kind === 'approval.invalidated') {
        const before = this._items.length;
        this._items = this._items.filter(i => i.approval_id !== payload.approval_id);
        removed ||= this._items.length !== before;
      } else if (event.kind === 'approval.requested' || event.kind.startsWith('recovery.')) {
        read = true;
      } else if (event.kind === 'work.phase') {
        read ||= listed || payload.needs_person === true; // the server says whether it now waits for a person
      } else if (event.kind === 'effect.state') {
        read ||= listed || payload.state === 'unknown';
      } else if (/^(work\.control|goal\.updated|effect\.settled|session\.permissions)$/.test(event.kind)) {
        read ||= listed;
      }
    }
    if (removed && !read) {
      this._render({ items: this._items, count: this._items.length });
    }
    return read;
  }

  /** How many things wait for the person (the tab's badge). */
  get count(): number {
    return this._count;
  }

  dispose(): void {
    this._unsubscribe();
  }

  /** Read `GET /attention` again (concurrent calls share one read). Never rejects. */
  refresh(): Promise<void> {
    return this._reads.run();
  }

  private async _read(): Promise<void> {
    let answer: IAttention;
    try {
      answer = await requestGoalsAPI(urls.attention(), this._settings);
    } catch {
      return; // the panel shows an unavailable server; the list keeps what it showed, and re-reads on reconnect
    }
    this._render(answer);
  }

  private _render(answer: IAttention): void {
    this._items = [...answer.items];
    this._count = answer.count;
    // keep the dataset JupyterLab's sidebar set (its data-id names the tab)
    const { count: _old, ...dataset } = this._title.dataset; // eslint-disable-line @typescript-eslint/no-unused-vars
    this._title.dataset = answer.count > 0 ? { ...dataset, count: String(answer.count) } : dataset;
    this._title.className = answer.count > 0 ? 'jp-goals-mod-attention' : '';
    this._title.caption = answer.count > 0 ? `Goals: ${answer.count} waiting for you` : 'Goals';
    this._heading.textContent = `Waiting for you (${answer.count})`;
    this.node.hidden = answer.count === 0;
    replaceKeepingFocus(this._list, ...answer.items.map(item => this._row(item)));
  }

  private _row(item: IAttentionItem): HTMLElement {
    const row = el('li', 'jp-goals-inbox-item', undefined, 'goals-inbox-item');
    row.dataset.key = item.key;
    row.dataset.kind = item.kind;
    row.dataset.sessionId = item.session_id;
    const top = el('div', 'jp-goals-goal-top');
    top.append(badge(KIND_WORDS[item.kind], 'goals-inbox-kind'), el('span', 'jp-goals-inbox-title', item.title || 'Untitled chat'));
    if (item.tool) {
      top.append(el('code', 'jp-goals-approval-tool', item.tool));
    }
    row.append(top, el('div', 'jp-goals-reason', item.reason, 'goals-inbox-reason'));
    const bar = el('div', 'jp-goals-actions', undefined, 'goals-inbox-actions');
    const label = item.title || 'this chat';
    const open = button('Open', 'goals-inbox-open', () => this._open(item.session_id), `Open ${label}`);
    open.setAttribute('aria-label', `Open ${label}`);
    switch (item.action) {
      case 'decide':
        if (item.approval_id) {
          const id = item.approval_id;
          bar.append(
            button('Approve', 'goals-inbox-approve', () => void this._post(urls.approval(id), { decision: 'approve' })),
            button('Always allow', 'goals-inbox-always',
              () => void this._post(urls.approval(id), { decision: 'approve', always: true }),
              `Approve, and always allow ${item.tool ?? 'this tool'} in this chat (revocable in Permissions)`),
            button('Deny', 'goals-inbox-deny', () => void this._post(urls.approval(id), { decision: 'deny' }))
          );
        }
        break;
      case 'edit_goal':
        if (item.goal_id) {
          const goalId = item.goal_id;
          bar.append(button('Edit Goal', 'goals-inbox-edit-goal', () => void this._edit(() => editGoal(goalId, this._settings))));
        }
        break;
      case 'permissions':
        bar.append(
          button('Permissions', 'goals-inbox-permissions', () =>
            void this._edit(() => editPermissions(item.session_id, this._settings))
          )
        );
        break;
      case 'retry':
        bar.append(
          button('Retry', 'goals-inbox-retry', () =>
            void this._post(urls.sessionActions(item.session_id), {
              action: 'retry',
              ...(item.control_version !== null ? { expected_control_version: item.control_version } : {})
            })
          )
        );
        break;
      case 'takeover':
        bar.append(
          button('Take over', 'goals-inbox-takeover', () =>
            void this._post(urls.sessionActions(item.session_id), {
              action: 'takeover',
              ...(item.control_version !== null ? { expected_control_version: item.control_version } : {})
            }),
            'Run this work on this server\'s host; its running commands become unknown outcomes, never run again without approval'
          )
        );
        break;
      case 'settle':
        if (item.effect_id) {
          const effectId = item.effect_id;
          bar.append(
            settleButtons(item.tool, outcome =>
              void this._post(urls.sessionActions(item.session_id), {
                action: 'settle',
                effect_id: effectId,
                outcome
              })
            )
          );
        }
        break;
      default:
        break; // answer, open: in the chat itself
    }
    bar.append(open);
    row.append(bar);
    return row;
  }

  private async _post(path: GoalsURL, body: Parameters<typeof postGoalsAPI>[1]): Promise<void> {
    try {
      await postGoalsAPI(path, body, this._settings);
      showAlert(this._alert, null);
    } catch (error) {
      showAlert(this._alert, actionErrorText(error));
    }
    await this.refresh();
  }

  private async _edit(run: () => Promise<EditOutcome>): Promise<void> {
    const outcome = await run();
    if (outcome !== null) {
      showAlert(this._alert, outcome.ok ? null : outcome.message);
      await this.refresh();
    }
  }

  private readonly _heading: HTMLElement;
  private readonly _list: HTMLElement;
  private readonly _alert: HTMLElement;
  private readonly _unsubscribe: () => void;
  private _count = 0;
  private _items: IAttentionItem[] = [];
  private readonly _reads = new OneAtATime(() => this._read());
}
