import { ServerConnection } from '@jupyterlab/services';

import { IRecovery, IRecoveryItem, requestGoalsAPI, ISessionAction } from './api';
import { button, el } from './views';
import { urls } from './urls';

/*
 * The continuity banner of a chat (issue 32 item 4): after a restart whose recovery pass touched this
 * chat's work, the chat view says once when the server came back and what happened to the work — it
 * continued from its last safe checkpoint, went on in a new turn after repair, waits (and why), or left a
 * command whose outcome is unknown — with the action that fits, as the server's `actions` allow. The
 * source is the recorded pass (`GET /recovery?session_id=`), never a guess. Dismiss hides it for that
 * pass and chat (localStorage), so it shows once.
 */

const DISMISSED_PREFIX = 'jupyter-goals:continuity-dismissed:';

/** What the session view lends the banner: its controls and where its approval and call buttons are. */
export interface IBannerHost {
  /**
   * A session action, sent with `version`: the control version of the work the banner read, the one its
   * `actions` were computed from (the view's own snapshot may be older or newer than the banner's read).
   * True when the server took it: the view then renders the new control version and reads the banner again.
   */
  act(action: Extract<ISessionAction['action'], 'resume' | 'retry'>, version: number): Promise<boolean>;
  /** Moves focus to the first pending approval's Approve button; false when there is none. */
  focusApproval(): boolean;
  /** Moves focus to the "It ran" button of a call whose outcome is unknown; false when it is not shown. */
  focusCall(callId: string): boolean;
}

/** One sentence of what the pass did with a work item of this chat. */
export function continuityText(item: IRecoveryItem): string {
  const what = item.kind === 'goal' ? "This chat's Goal" : item.kind === 'chat' ? "This chat's work" : `This chat's ${item.kind}`;
  switch (item.outcome) {
    case 'continued':
      if (item.mode === 'resume_checkpoint') {
        return `${what} continued from its last safe checkpoint.`;
      }
      if (item.mode === 'new_turn') {
        return `${what} went on in a new turn after repair: the interrupted turn was closed and its history repaired.`;
      }
      return `${what} continued.`;
    case 'waiting':
      return `${what} is waiting: ${item.reason || item.reason_code}`;
    case 'paused':
      return `${what} stayed paused, as you left it.`;
    case 'stopped':
      return `${what} stayed stopped, as you left it.`;
    case 'failed':
      return `${what} failed: ${item.reason || item.reason_code}`;
  }
  return `${what}: ${item.reason || item.outcome}`;
}

export class ContinuityBanner {
  readonly node: HTMLElement;

  constructor(
    private readonly _sessionId: string,
    private readonly _settings: ServerConnection.ISettings,
    private readonly _host: IBannerHost
  ) {
    this.node = el('section', 'jp-goals-continuity', undefined, 'goals-continuity');
    this.node.setAttribute('aria-label', 'After the restart');
    this.node.hidden = true;
  }

  /** Reads this chat's part of the last recovery pass and shows it (unless dismissed). */
  async refresh(): Promise<void> {
    try {
      const summary = await requestGoalsAPI<IRecovery>(
        urls.recovery(this._sessionId),
        this._settings
      );
      this.render(summary);
    } catch {
      // the view's own read says when the server cannot be read; the banner waits for the next try
    }
  }

  render(summary: IRecovery): void {
    const items = summary.items.filter(i => i.session_id === this._sessionId);
    const key = `${DISMISSED_PREFIX}${summary.boot_id}:${summary.recovered_at ?? ''}:${this._sessionId}`;
    // what the last read found, for tests and the curious: none, shown, or dismissed (earlier, or here)
    this.node.dataset.state = items.length === 0 || summary.recovered_at === null ? 'none' : 'shown';
    if (this.node.dataset.state === 'shown' && (isDismissed(key) || this._dismissed.has(key))) {
      this.node.dataset.state = 'dismissed';
    }
    if (this.node.dataset.state !== 'shown') {
      this.node.hidden = true;
      this.node.replaceChildren();
      return;
    }
    const rendered = JSON.stringify([key, items]);
    if (rendered === this._rendered && !this.node.hidden) {
      return; // unchanged: keep focus where it is
    }
    this._rendered = rendered;
    const when = new Date((summary.recovered_at ?? 0) * 1000).toLocaleString();
    const parts: HTMLElement[] = [
      el('div', 'jp-goals-continuity-heading', `The server came back at ${when}.`, 'goals-continuity-heading')
    ];
    for (const item of items) {
      parts.push(this._item(item));
    }
    parts.push(
      button('Dismiss', 'goals-continuity-dismiss', () => {
        try {
          window.localStorage.setItem(key, String(Date.now()));
        } catch {
          // private mode: hidden for this page only
        }
        this._dismissed.add(key);
        this.node.dataset.state = 'dismissed';
        this.node.hidden = true;
      }, 'Hide this until the next restart')
    );
    this.node.replaceChildren(...parts);
    this.node.hidden = false;
  }

  private _item(item: IRecoveryItem): HTMLElement {
    const row = el('div', 'jp-goals-continuity-item', undefined, 'goals-continuity-item');
    row.dataset.outcome = item.outcome;
    row.dataset.mode = item.mode ?? '';
    row.append(el('div', 'jp-goals-continuity-text', continuityText(item), 'goals-continuity-text'));
    const bar = el('div', 'jp-goals-actions', undefined, 'goals-continuity-actions');
    for (const call of item.unknown_outcomes ?? []) {
      row.append(
        el(
          'div',
          'jp-goals-continuity-text',
          `A command's outcome is unknown: ${call.tool} (${call.call_id}) may or may not have run. It is never ` +
            'run again by itself; say whether it ran.',
          'goals-continuity-unknown'
        )
      );
      bar.append(
        button(`Settle ${call.tool}…`, 'goals-continuity-settle', () => {
          if (!this._host.focusCall(call.call_id)) {
            this._say(row, 'This call is settled already, or not on this page: scroll to it in the transcript.');
          }
        }, 'Go to the call to say whether it ran')
      );
    }
    const actions = item.actions;
    if (actions.can_resume) {
      bar.append(button('Resume', 'goals-continuity-resume', () => void this._act('resume', item)));
    }
    if (actions.can_retry) {
      bar.append(button('Retry', 'goals-continuity-retry', () => void this._act('retry', item)));
    }
    if (item.current_phase === 'waiting' && actions.reason_code === 'awaiting_approval') {
      bar.append(
        button('Approve…', 'goals-continuity-approve', () => {
          if (!this._host.focusApproval()) {
            this._say(row, 'No approval is waiting now.');
          }
        }, 'Go to the call waiting for your approval')
      );
    }
    if (bar.childElementCount > 0) {
      row.append(bar);
    }
    return row;
  }

  /**
   * Acts on what the banner shows. Refused (a control since the banner's read), it reads the pass again so
   * its actions and version are today's; taken, the view's new control version reads it (not twice).
   */
  private async _act(action: 'resume' | 'retry', item: IRecoveryItem): Promise<void> {
    if (!(await this._host.act(action, item.control_version))) {
      await this.refresh();
    }
  }

  private _say(row: HTMLElement, text: string): void {
    let note = row.querySelector<HTMLElement>('[data-testid="goals-continuity-note"]');
    if (!note) {
      note = el('div', 'jp-goals-field-hint', '', 'goals-continuity-note');
      note.setAttribute('role', 'status');
      row.append(note);
    }
    note.textContent = text;
  }

  private _rendered = '';
  private readonly _dismissed = new Set<string>();
}

function isDismissed(key: string): boolean {
  try {
    return window.localStorage.getItem(key) !== null;
  } catch {
    return false;
  }
}
