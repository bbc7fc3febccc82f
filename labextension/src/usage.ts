import { IGoal, ISessionSnapshot } from './api';
import { el } from './views';

/*
 * What work costs, in words: a chat's usage line (the header) and a Goal's budget burn (the Goal box and
 * the panel's Goal view). Unknowns are never shown as zero; the hover says what each unknown is.
 */

/** Seconds as a short duration: "42 s", "3 min", "1 h 5 min". */
export function duration(seconds: number): string {
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const minutes = Math.round(seconds / 60);
  return minutes < 60 ? `${minutes} min` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/**
 * The chat's usage in the header: the server's display sentence (known cost, unknown usage kept
 * apart, never an invented zero), tokens and active time; the hover explains unknown intervals.
 */
export function usageLine(usage: ISessionSnapshot['usage'] | undefined): HTMLElement {
  const node = el('span', 'jp-goals-session-usage', undefined, 'goals-session-usage');
  if (!usage) {
    return node;
  }
  const parts = [usage.display];
  const tokens = usage.known_tokens;
  if (tokens) {
    parts.push(`${(tokens.input + tokens.output).toLocaleString('en-US')} tokens`);
  }
  parts.push(`active ${duration(usage.active_seconds)}${usage.running ? ' (running)' : ''}`);
  node.append(el('span', 'jp-goals-meta-label', 'Usage '), el('span', undefined, parts.join(' · ')));
  const gaps = usage.unknown_intervals ?? [];
  const hover: string[] = [];
  if (usage.unknown_usage_requests) {
    hover.push(
      `${usage.unknown_usage_requests} request(s) whose usage is unknown: the provider's receipt never arrived ` +
        '(a crash or a lost connection); they are not counted as zero.'
    );
  }
  for (const gap of gaps) {
    const from = new Date(gap.from * 1000).toLocaleTimeString();
    const to = gap.to === null ? 'now' : new Date(gap.to * 1000).toLocaleTimeString();
    hover.push(`Active time from ${from} to ${to} is unknown: the process running it died unseen.`);
  }
  if (hover.length > 0) {
    node.title = hover.join('\n');
    node.dataset.unknown = String(gaps.length + (usage.unknown_usage_requests ?? 0));
  }
  return node;
}

function count(n: number): string {
  return n.toLocaleString('en-US');
}

/**
 * A Goal's budget burn beside each hard limit, from the Goal answer's `budget_status` and `budget`:
 * "$0.12 known + $0.03 reserved of $1.00", "1,234 known + 500 reserved of 10,000 tokens", "3 min active
 * of 10 min"; the hover explains unknown usage (requests without a receipt, intervals when a process died
 * unseen, unpriced requests). `null` without a hard limit on cost, tokens or time.
 */
export function budgetBurn(goal: IGoal, testid = 'goals-goal-budget'): HTMLElement | null {
  const status = goal.budget_status;
  const limits = goal.budget ?? {};
  if (!status) {
    return null;
  }
  const parts: string[] = [];
  if (limits.max_cost_usd !== undefined && limits.max_cost_usd !== null) {
    const reserved = status.reserved_usd === null ? 'an unbounded cost' : `$${status.reserved_usd.toFixed(2)}`;
    parts.push(`$${status.known_cost_usd.toFixed(2)} known + ${reserved} reserved of $${limits.max_cost_usd.toFixed(2)}`);
  }
  if (limits.max_tokens !== undefined && limits.max_tokens !== null) {
    const reserved = status.reserved_tokens === null ? 'unbounded' : count(status.reserved_tokens);
    parts.push(`${count(status.known_tokens)} known + ${reserved} reserved of ${count(limits.max_tokens)} tokens`);
  }
  if (limits.max_active_seconds !== undefined && limits.max_active_seconds !== null) {
    parts.push(`${duration(status.active_seconds)} active of ${duration(limits.max_active_seconds)}`);
  }
  if (parts.length === 0) {
    return null;
  }
  const hover: string[] = [];
  if (status.uncertain_requests) {
    parts.push(`usage unknown for ${status.uncertain_requests} request(s)`);
    hover.push(
      `${status.uncertain_requests} request(s) whose usage is not known: still running, or their receipt never ` +
        'arrived (a crash or a lost connection). They count at their reservation, never as zero.'
    );
  }
  if (status.unknown_active_seconds > 0) {
    hover.push(
      `${duration(status.unknown_active_seconds)} of active time is unknown: a process running this Goal died ` +
        'unseen, between its last heartbeat and when the death was found.'
    );
  }
  if (status.unpriced_requests) {
    hover.push(`${status.unpriced_requests} request(s) have no price (unknown model or tier): their cost is unknown.`);
  }
  if (status.ledger_error) {
    hover.push(`The usage ledger cannot be read now (${status.ledger_error}): figures may be behind.`);
  }
  const node = el('div', 'jp-goals-budget-burn', undefined, testid);
  node.append(el('span', 'jp-goals-meta-label', 'Budget '), el('span', undefined, parts.join(' · ')));
  if (hover.length > 0) {
    node.title = hover.join('\n');
    node.dataset.unknown = 'true';
  }
  return node;
}
