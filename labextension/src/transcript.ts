import { ITranscriptItem } from './api';
import { reconciliationLabel, settleButtons, SettleOutcome } from './settle';
import { badge, button, el } from './views';

/** Item kinds the chat shows; `goal_prompt` is a continuation prompt for the model only. */
const HIDDEN_KINDS = new Set(['goal_prompt']);

/** Effect states in the order they can follow each other (a badge never moves backwards). */
const EFFECT_RANK: Record<string, number> = {
  planned: 0,
  dispatched: 1,
  committed: 2,
  unknown: 2,
  never_started: 2,
  denied: 2,
  cancelled: 2,
  reconciled: 3
};

/** Words for an effect state, shown beside its badge. */
export const EFFECT_WORDS: Record<string, string> = {
  planned: 'planned, not started',
  dispatched: 'running (dispatched)',
  committed: 'finished, result recorded',
  unknown: 'outcome unknown',
  reconciled: 'outcome reconciled (a late result, or your answer)',
  never_started: 'never started',
  denied: 'denied',
  cancelled: 'cancelled'
};

/** How many item nodes the window may hold at most (the DOM stays bounded for any length). */
export const MAX_RENDERED = 160;
const OVERSCAN_PX = 900;
const ESTIMATE_PX = 64;

export interface ITranscriptCallbacks {
  /** Open the read-only record of a terminal Goal card. */
  openGoalRecord(item: ITranscriptItem): void;
  /** The person scrolled near the top: load the previous page (if any). */
  loadOlder(): void;
  /** Cancel one running call (`cancel_tool`): it ends `cancelled` and the turn goes on. */
  cancelCall(callId: string): void;
  /** Say whether a call whose outcome is unknown ran (`settle`), or read its evidence again. */
  settleCall(callId: string, outcome: SettleOutcome): void;
}

/**
 * A windowed transcript: it holds every loaded item as data, but only the items near the viewport
 * (at most `MAX_RENDERED`) as DOM nodes between two spacers sized from measured (or estimated)
 * heights, so a 20,000-item session scrolls with a few hundred nodes at most.
 */
export class TranscriptList {
  readonly node: HTMLElement;

  constructor(private readonly _callbacks: ITranscriptCallbacks) {
    this.node = el('div', 'jp-goals-transcript', undefined, 'goals-transcript');
    this.node.setAttribute('role', 'log');
    this.node.setAttribute('aria-label', 'Transcript');
    this.node.tabIndex = 0;
    this._top = el('div', 'jp-goals-transcript-spacer');
    this._content = el('div', 'jp-goals-transcript-items');
    this._bottom = el('div', 'jp-goals-transcript-spacer');
    this._older = el('div', 'jp-goals-transcript-older', '', 'goals-transcript-older');
    this._empty = el('div', 'jp-goals-empty', 'No messages yet', 'goals-transcript-empty');
    this.node.append(this._older, this._top, this._content, this._bottom, this._empty);
    this.node.addEventListener('scroll', () => this._onScroll(), { passive: true });
  }

  get length(): number {
    return this._items.length;
  }

  get lastSeq(): number {
    return this._lastSeq;
  }

  get firstSeq(): number | null {
    return this._items.length > 0 ? this._items[0].seq : null;
  }

  hasItem(itemId: string): boolean {
    return this._ids.has(itemId);
  }

  /** "Loading older messages…" / "Beginning of the conversation" above the first item. */
  setOlderState(state: 'more' | 'loading' | 'start'): void {
    this._older.textContent =
      state === 'loading'
        ? 'Loading older messages…'
        : state === 'start'
          ? 'Beginning of the conversation'
          : 'Scroll up for older messages';
    this._older.dataset.state = state;
  }

  /** Replace everything (the first page). */
  reset(items: ITranscriptItem[]): void {
    this._items = [];
    this._ids.clear();
    this._lastSeq = 0;
    this._nodes.clear();
    this._stick = true;
    this.append(items);
  }

  /** Add items after the newest (seqs at or below the newest are ignored: re-reads are harmless). */
  append(items: ITranscriptItem[]): void {
    let changed = false;
    for (const item of items) {
      if (item.seq > this._lastSeq) {
        this._lastSeq = item.seq;
      }
      this._noteState(item);
      if (this._ids.has(item.item_id) || !this._visibleKind(item)) {
        continue;
      }
      if (this._items.length > 0 && item.seq < this._items[this._items.length - 1].seq) {
        continue;
      }
      this._ids.add(item.item_id);
      this._items.push(item);
      changed = true;
    }
    if (changed) {
      this._schedule();
    }
  }

  /** Add an older page before the first item, keeping what the person looks at in place. */
  prepend(items: ITranscriptItem[]): void {
    const first = this.firstSeq;
    const added: ITranscriptItem[] = [];
    for (const item of items) {
      this._noteState(item);
      if (first !== null && item.seq >= first) {
        continue;
      }
      if (this._ids.has(item.item_id) || !this._visibleKind(item)) {
        continue;
      }
      this._ids.add(item.item_id);
      added.push(item);
    }
    if (added.length === 0) {
      return;
    }
    added.sort((a, b) => a.seq - b.seq);
    this._items = added.concat(this._items);
    let height = 0;
    for (const item of added) {
      height += this._height(item);
    }
    this._renderNow();
    this.node.scrollTop += height;
  }

  /** An effect state from the event stream (a tool call's badge only moves forward). */
  setEffectState(callId: string, state: string): void {
    if (this._raise(callId, state)) {
      this._schedule();
    }
  }

  /** Re-measure after the widget became visible or was resized. */
  update(): void {
    this._schedule();
  }

  scrollToEnd(): void {
    this._stick = true;
    this._schedule();
  }

  private _visibleKind(item: ITranscriptItem): boolean {
    if (HIDDEN_KINDS.has(item.kind)) {
      return false;
    }
    // an assistant response with only tool calls has no text to show; its calls follow it
    return !(item.kind === 'assistant' && !item.content && !item.meta?.interrupted);
  }

  private _noteState(item: ITranscriptItem): void {
    if (item.call_id && item.state) {
      this._raise(item.call_id, item.state);
    } else if (item.call_id && item.kind === 'tool_call' && !this._states.has(item.call_id)) {
      this._states.set(item.call_id, 'planned');
    }
  }

  private _raise(callId: string, state: string): boolean {
    const old = this._states.get(callId);
    if (old !== undefined && (EFFECT_RANK[state] ?? 2) < (EFFECT_RANK[old] ?? 2)) {
      return false;
    }
    if (old === state) {
      return false;
    }
    this._states.set(callId, state);
    return true;
  }

  private _schedule(): void {
    if (this._frame !== null) {
      return;
    }
    this._frame = window.requestAnimationFrame(() => {
      this._frame = null;
      this._renderNow();
    });
  }

  private _onScroll(): void {
    const n = this.node;
    this._stick = n.scrollHeight - n.scrollTop - n.clientHeight < 40;
    if (n.scrollTop < OVERSCAN_PX) {
      this._callbacks.loadOlder();
    }
    this._schedule();
  }

  private _height(item: ITranscriptItem): number {
    return this._heights.get(item.item_id) ?? ESTIMATE_PX;
  }

  /** Render the window around the viewport, measure it, and correct the spacers. */
  private _renderNow(): void {
    const n = this.node;
    this._empty.hidden = this._items.length > 0;
    const viewTop = this._stick ? Number.MAX_SAFE_INTEGER : n.scrollTop - this._older.offsetHeight;
    const viewHeight = n.clientHeight || 600;
    const heights = this._items.map(item => this._height(item));
    const total = heights.reduce((a, b) => a + b, 0);
    const top = Math.min(viewTop, Math.max(0, total - viewHeight));

    let start = 0;
    let acc = 0;
    while (start < this._items.length && acc + heights[start] < top - OVERSCAN_PX) {
      acc += heights[start];
      start += 1;
    }
    const before = acc;
    let end = start;
    while (end < this._items.length && acc < top + viewHeight + OVERSCAN_PX && end - start < MAX_RENDERED) {
      acc += heights[end];
      end += 1;
    }
    const after = total - acc;

    const keep = new Map<string, { node: HTMLElement; key: string }>();
    const nodes: HTMLElement[] = [];
    for (let i = start; i < end; i++) {
      const item = this._items[i];
      const key = this._key(item);
      const old = this._nodes.get(item.item_id);
      const node = old && old.key === key ? old.node : this._build(item);
      keep.set(item.item_id, { node, key });
      nodes.push(node);
    }
    this._nodes = keep;
    // replacing the children blurs a focused button inside them (a call's It ran, Cancel): focus it again
    const focused = document.activeElement instanceof HTMLElement && this._content.contains(document.activeElement)
      ? document.activeElement
      : null;
    this._content.replaceChildren(...nodes);
    if (focused?.isConnected && document.activeElement !== focused) {
      focused.focus({ preventScroll: true });
    }
    this._top.style.height = `${before}px`;
    this._bottom.style.height = `${after}px`;

    // measure what is rendered; keep the first visible item where it was
    let shift = 0;
    const anchorTop = n.scrollTop - this._older.offsetHeight;
    let offset = before;
    for (let i = start; i < end; i++) {
      const item = this._items[i];
      const measured = this._nodes.get(item.item_id)?.node.offsetHeight ?? 0;
      const old = heights[i];
      if (measured > 0 && measured !== old) {
        this._heights.set(item.item_id, measured);
        if (offset + old <= anchorTop) {
          shift += measured - old;
        }
      }
      offset += old;
    }
    if (this._stick) {
      n.scrollTop = n.scrollHeight;
    } else if (shift !== 0) {
      n.scrollTop += shift;
    }
  }

  /** A node is rebuilt when what it shows changed (a tool call's effect state). */
  private _key(item: ITranscriptItem): string {
    return item.call_id ? `${item.seq}:${this._states.get(item.call_id) ?? ''}` : String(item.seq);
  }

  private _build(item: ITranscriptItem): HTMLElement {
    const node = el('div', `jp-goals-item jp-goals-item-${item.kind}`, undefined, 'goals-item');
    node.dataset.kind = item.kind;
    node.dataset.seq = String(item.seq);
    node.dataset.itemId = item.item_id;
    switch (item.kind) {
      case 'user':
        node.append(el('div', 'jp-goals-item-who', 'You'), text(item.content));
        break;
      case 'assistant':
        node.append(el('div', 'jp-goals-item-who', 'Assistant'), text(item.content));
        if (item.meta?.interrupted) {
          node.append(marker(partialWords(item.meta?.interrupted)));
        }
        break;
      case 'tool_call':
        node.append(this._call(item));
        break;
      case 'tool_result':
      case 'reconciliation':
      case 'subtask_result':
        node.append(result(item));
        break;
      case 'interruption':
        node.append(interruption(item));
        break;
      case 'goal_record':
        node.append(this._goalCard(item));
        break;
      case 'compaction':
        node.append(compaction(item));
        break;
      default:
        node.append(el('div', 'jp-goals-item-notice', item.content));
    }
    return node;
  }

  private _call(item: ITranscriptItem): HTMLElement {
    // an event seen since, else the call's state when the page was read (the server sets it on tool calls)
    const state = (item.call_id && this._states.get(item.call_id)) || item.state || 'planned';
    const box = el('div', 'jp-goals-call');
    const top = el('div', 'jp-goals-call-top');
    top.append(
      el('span', 'jp-goals-item-who', 'Tool call'),
      el('code', 'jp-goals-call-tool', item.tool ?? '?', 'goals-call-tool'),
      effectBadge(state)
    );
    box.append(top);
    const args = item.arguments ?? {};
    const command = typeof args.command === 'string' ? args.command : null;
    const shown = command ?? JSON.stringify(args);
    box.append(
      el('code', 'jp-goals-call-args', shown.length > 400 ? `${shown.slice(0, 400)}…` : shown, 'goals-call-args')
    );
    box.dataset.callId = item.call_id ?? '';
    box.dataset.state = state;
    if (state === 'dispatched' && item.call_id && item.tool === 'shell') {
      // only a shell command has a process group to end; other calls finish by themselves (409)
      const callId = item.call_id;
      top.append(
        button('Cancel', 'goals-call-cancel', () => this._callbacks.cancelCall(callId),
          'Cancel this running call: its process group is terminated, the call ends cancelled and the turn goes on')
      );
    }
    if (state === 'unknown' && item.call_id) {
      const callId = item.call_id;
      box.append(settleButtons(item.tool, outcome => this._callbacks.settleCall(callId, outcome)));
    }
    return box;
  }

  private _goalCard(item: ITranscriptItem): HTMLElement {
    const state = String(item.meta?.state ?? '');
    const card = el('div', 'jp-goals-goal-card', undefined, 'goals-goal-card');
    card.dataset.state = state;
    card.append(
      badge(state || 'ended', 'goals-goal-card-state'),
      el('span', 'jp-goals-goal-card-text', item.content),
      button('Open Goal record', 'goals-goal-card-open', () => this._callbacks.openGoalRecord(item),
        'Open this ended Goal (read-only)')
    );
    return card;
  }

  private readonly _top: HTMLElement;
  private readonly _content: HTMLElement;
  private readonly _bottom: HTMLElement;
  private readonly _older: HTMLElement;
  private readonly _empty: HTMLElement;
  private _items: ITranscriptItem[] = [];
  private readonly _ids = new Set<string>();
  private readonly _heights = new Map<string, number>();
  private readonly _states = new Map<string, string>();
  private _nodes = new Map<string, { node: HTMLElement; key: string }>();
  private _lastSeq = 0;
  private _stick = true;
  private _frame: number | null = null;
}

function text(content: string): HTMLElement {
  return el('div', 'jp-goals-item-text', content);
}

/** The marker under an answer cut short (`meta.interrupted`: "restart" or "stopped"), its partial text kept. */
export function partialWords(interrupted: unknown): string {
  const cause =
    interrupted === 'stopped'
      ? 'Stopped by you'
      : interrupted === 'restart'
        ? 'Interrupted by a server restart'
        : 'Interrupted';
  return `${cause}: the answer was cut short here; its partial text is kept.`;
}

function marker(words: string): HTMLElement {
  const node = el('div', 'jp-goals-marker', words, 'goals-marker');
  node.setAttribute('role', 'note');
  return node;
}

/** The effect state as a labelled badge: "committed" plus words for a screen reader and a tooltip. */
export function effectBadge(state: string): HTMLElement {
  const node = badge(state, 'goals-effect-state');
  const words = EFFECT_WORDS[state] ?? state;
  node.title = `Effect state: ${words}`;
  node.setAttribute('aria-label', `Effect state: ${state}`);
  return node;
}

function result(item: ITranscriptItem): HTMLElement {
  const state = item.state ?? (item.kind === 'reconciliation' ? 'reconciled' : '');
  const details = el('details', 'jp-goals-result', undefined, 'goals-result');
  details.dataset.state = state;
  const summary = el('summary', 'jp-goals-result-summary');
  const label =
    item.kind === 'reconciliation'
      ? reconciliationLabel(item)
      : item.kind === 'subtask_result'
        ? 'Subtask result'
        : `Result of ${item.tool ?? 'a tool'}`;
  summary.append(el('span', undefined, label));
  if (state) {
    summary.append(effectBadge(state));
  }
  details.append(summary, el('pre', 'jp-goals-result-text', item.content, 'goals-result-text'));
  if (state === 'unknown') {
    details.append(marker("Interrupted by a restart; the command's outcome is unknown and it is not run again."));
  }
  return details;
}

/** Where older history was compacted: requests send the summary instead; the items above stay. */
function compaction(item: ITranscriptItem): HTMLElement {
  const box = el('details', 'jp-goals-compaction', undefined, 'goals-compaction');
  const summary = el('summary', 'jp-goals-marker',
    'Earlier conversation compacted here to fit the model\'s context window: the model now reads this summary ' +
      'instead of the items above (they stay in your transcript).');
  summary.setAttribute('role', 'note');
  box.append(summary, el('pre', 'jp-goals-result-text', item.content, 'goals-compaction-text'));
  return box;
}

/**
 * The interruption marker in words, from what the server recorded: a person's stop
 * (`meta.reason_code`), a recovery (`meta.mode`), or neither (no cause is claimed). The server's own
 * sentence is kept below it.
 */
export function interruptionWords(meta: ITranscriptItem['meta']): string {
  const mode = String(meta?.mode ?? '');
  const reason = String(meta?.reason_code ?? '');
  if (reason === 'user_stopped') {
    return 'Stopped by you.';
  }
  if (mode === 'new_turn') {
    return "Interrupted by a server restart; the command's outcome is unknown. A new turn continues without running it again.";
  }
  if (mode === 'resume_checkpoint') {
    return 'Interrupted by a server restart; the turn resumes from its last safe checkpoint (a command still running is reconnected, not restarted).';
  }
  return mode ? 'Interrupted by a server restart.' : 'Interrupted.';
}

function interruption(item: ITranscriptItem): HTMLElement {
  const mode = String(item.meta?.mode ?? '');
  const words = interruptionWords(item.meta);
  const box = el('div', 'jp-goals-interruption', undefined, 'goals-interruption');
  box.setAttribute('role', 'note');
  box.dataset.mode = mode;
  box.dataset.reasonCode = String(item.meta?.reason_code ?? '');
  box.append(el('div', 'jp-goals-interruption-words', words), el('div', 'jp-goals-reason', item.content));
  return box;
}
