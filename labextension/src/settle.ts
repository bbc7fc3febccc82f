import { ITranscriptItem } from './api';
import { button, el } from './views';

/** What a person may say of a call whose outcome is unknown (`settle`); `check` reads its evidence again. */
export type SettleOutcome = 'ran' | 'did_not_run' | 'check';

const SETTLE_BUTTONS: { outcome: SettleOutcome; label: string; hint: string }[] = [
  {
    outcome: 'ran',
    label: 'It ran',
    hint: 'Say that this call ran: the model is told so, and it is never run again'
  },
  {
    outcome: 'did_not_run',
    label: 'It did not run',
    hint: 'Say that this call did not run: the model is told so; once no outcome is left unknown, later writes follow the chat\'s permissions again'
  },
  {
    outcome: 'check',
    label: 'Check again',
    hint: "Read the command's exit file again and settle from it if it is there"
  }
];

/**
 * The answers to a call whose outcome is unknown: "It ran", "It did not run" and, for a shell command
 * (the one call whose evidence, its exit file, the server can read again), "Check again". The server
 * records who answered and when; a refusal (409: not unknown any more, no evidence found) is the
 * caller's to show.
 */
export function settleButtons(
  tool: string | null | undefined,
  onSettle: (outcome: SettleOutcome) => void
): HTMLElement {
  const bar = el('div', 'jp-goals-settle jp-goals-actions', undefined, 'goals-settle');
  bar.setAttribute('role', 'group');
  bar.setAttribute('aria-label', `Did this ${tool ?? 'call'} run?`);
  for (const spec of SETTLE_BUTTONS) {
    if (spec.outcome !== 'check' || tool === 'shell') {
      bar.append(button(spec.label, `goals-settle-${spec.outcome}`, () => onSettle(spec.outcome), spec.hint));
    }
  }
  return bar;
}

/**
 * The words of a reconciliation item: a person's answer ("You said it did not run (shell), settled by
 * alice at …"), evidence read again on request, or a late result the server found by itself.
 */
export function reconciliationLabel(item: ITranscriptItem): string {
  const tool = item.tool ?? 'a tool';
  const meta = (item.meta ?? {}) as Record<string, unknown>;
  const by = typeof meta.by === 'string' ? meta.by : '';
  const at = typeof meta.at === 'number' ? new Date(meta.at * 1000).toLocaleString() : '';
  const who = by ? `, settled by ${by}${at ? ` at ${at}` : ''}` : '';
  if (meta.settled === 'ran' || meta.settled === 'did_not_run') {
    return `${item.content.replace(/\.$/, '')} (${tool})${who}`;
  }
  if (meta.settled === 'check') {
    return `Checked again: the real result of ${tool}${who}`;
  }
  return `Late result of ${tool}, reconciled after a restart`;
}
