import { IRecovery, IRecoveryItem } from './api';
import { badge, button, el } from './views';

/** Outcome groups in the order a person reads them, with a heading each. */
const GROUPS: [string, string][] = [
  ['continued', 'Continued by itself'],
  ['waiting', 'Waiting, and why'],
  ['paused', 'Stayed paused or stopped by you'],
  ['stopped', 'Stayed paused or stopped by you'],
  ['failed', 'Failed']
];

/** Action flags of a decision, as the buttons' names. */
const ACTION_WORDS: [string, string][] = [
  ['can_resume', 'Resume'],
  ['can_retry', 'Retry'],
  ['can_pause', 'Pause'],
  ['can_stop', 'Stop'],
  ['can_verify', 'Verify']
];

const DISMISSED_KEY = 'jupyter-goals:recovery-dismissed';

/**
 * "After the restart": what the last recovery pass decided for each unfinished work item, from
 * `GET /api/goals/recovery` (recorded decisions, not guesses): what continued, what waits and why,
 * what stayed paused or stopped, what failed and which action can take it on. Hidden when the pass
 * had nothing to decide, or after Dismiss (until the next restart).
 */
export class RecoverySummary {
  readonly node: HTMLElement;

  constructor(private readonly _open: (sessionId: string) => void) {
    this.node = el('section', 'jp-goals-recovery', undefined, 'goals-recovery');
    this.node.setAttribute('aria-label', 'Recovery summary');
    this.node.hidden = true;
  }

  render(recovery: IRecovery | null): void {
    const stamp = recovery ? `${recovery.boot_id ?? ''}:${recovery.recovered_at ?? ''}` : '';
    if (!recovery || recovery.items.length === 0 || stamp === dismissed()) {
      this.node.hidden = true;
      this.node.replaceChildren();
      return;
    }
    if (stamp === this._stamp && this._rendered === JSON.stringify(recovery)) {
      return; // unchanged: keep focus and scroll where they are
    }
    this._stamp = stamp;
    this._rendered = JSON.stringify(recovery);
    const when = recovery.recovered_at ? new Date(recovery.recovered_at * 1000).toLocaleString() : 'the last start';
    const heading = el('h3', 'jp-goals-subheading', `After the restart (${when})`, 'goals-recovery-heading');
    const counts = Object.entries(recovery.counts ?? {})
      .filter(([, n]) => n > 0)
      .map(([outcome, n]) => `${n} ${outcome}`)
      .join(' · ');
    const parts: HTMLElement[] = [heading, el('div', 'jp-goals-recovery-counts', counts, 'goals-recovery-counts')];
    const seen = new Set<string>();
    for (const [outcome, title] of GROUPS) {
      const items = recovery.items.filter(i => i.outcome === outcome);
      if (items.length === 0) {
        continue;
      }
      if (!seen.has(title)) {
        parts.push(el('div', 'jp-goals-recovery-group', title));
        seen.add(title);
      }
      for (const item of items) {
        parts.push(this._row(item));
      }
    }
    const other = recovery.items.filter(i => !GROUPS.some(([o]) => o === i.outcome));
    for (const item of other) {
      parts.push(this._row(item));
    }
    parts.push(
      button('Dismiss', 'goals-recovery-dismiss', () => {
        try {
          window.localStorage.setItem(DISMISSED_KEY, stamp);
        } catch {
          // private mode: dismissed for this page only
        }
        this._dismissed = stamp;
        this.node.hidden = true;
      }, 'Hide this summary until the next restart')
    );
    this.node.replaceChildren(...parts);
    this.node.hidden = this._dismissed === stamp;
  }

  private _row(item: IRecoveryItem): HTMLElement {
    const row = el('div', 'jp-goals-recovery-item', undefined, 'goals-recovery-item');
    row.dataset.outcome = item.outcome;
    row.dataset.sessionId = item.session_id;
    const top = el('div', 'jp-goals-session-top');
    top.append(
      el('span', 'jp-goals-session-title', item.session_title || 'Untitled chat'),
      badge(item.outcome, 'goals-recovery-outcome')
    );
    row.append(top);
    if (item.reason || item.reason_code) {
      const reason = el('div', 'jp-goals-session-reason', item.reason || item.reason_code || '');
      reason.dataset.reasonCode = item.reason_code ?? '';
      row.append(reason);
    }
    const actions = ACTION_WORDS.filter(([flag]) => (item.actions as Record<string, unknown> | null)?.[flag] === true)
      .map(([, word]) => word);
    if (actions.length > 0) {
      row.append(el('div', 'jp-goals-recovery-actions', `You can: ${actions.join(', ')}`, 'goals-recovery-actions'));
    }
    row.append(button('Open', 'goals-recovery-open', () => this._open(item.session_id),
      `Open ${item.session_title || 'this session'}`));
    return row;
  }

  private _stamp = '';
  private _rendered = '';
  private _dismissed = '';
}

function dismissed(): string {
  try {
    return window.localStorage.getItem(DISMISSED_KEY) ?? '';
  } catch {
    return '';
  }
}
