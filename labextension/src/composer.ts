import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  GoalsAPIError,
  ICreateGoal,
  IGoal,
  IGoalAction,
  IMessageAccepted,
  ISessionSnapshot,
  postGoalsAPI
} from './api';
import { editGoal } from './edit';
import { budgetBurn } from './usage';
import {
  actionBar,
  actionErrorText,
  alertNode,
  badge,
  button,
  editGoalButton,
  el,
  GOAL_ACTIONS,
  replaceKeepingFocus,
  showAlert
} from './views';
import { GoalsURL, urls } from './urls';

/** Phases in which a turn is under way, so a new message is queued or steers it. */
const RUNNING_PHASES = new Set(['queued', 'working', 'waiting', 'recovering']);
/** Goal states that end it; a Goal in any other state is shown in the composer. */
const TERMINAL_GOAL_STATES = new Set(['achieved', 'cancelled']);
const MAX_RETRY_MS = 10000;

export interface IComposerHost {
  /** The transcript holds the item with this id (`input:<work>`, `steer:<message>`). */
  showsItem(itemId: string): boolean;
  /** A message or Goal was accepted: re-read the session. */
  onSent(): void;
  /** A Goal action (Verify, End) from the composer's Goal line. */
  onGoalAction(path: GoalsURL, body: IGoalAction): Promise<void>;
}

type OutgoingState = 'sending' | 'retrying' | 'accepted' | 'failed';

interface IOutgoing {
  id: string;
  text: string;
  delivery: 'queue' | 'steer';
  state: OutgoingState;
  detail: string;
  accepted: IMessageAccepted | null;
  /** Accepted into work whose turn already runs: only its `steer:` item acknowledges it. */
  joined: boolean;
  attempts: number;
}

/** A client request id: one per typed message, kept across retries. */
export function newRequestId(): string {
  const c = globalThis.crypto as Crypto | undefined;
  if (c && typeof c.randomUUID === 'function') {
    return c.randomUUID();
  }
  return `cr-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}

/**
 * The message box of a session view. Each message gets its `client_request_id` when the person
 * starts typing it; after Send it is listed as "sending…" until the server's 202, retried with the
 * same id (so the server keeps one copy) on a network error or 503, and only the transcript (the
 * server's record) ever shows it as a user message. While a turn runs the person picks Queue or
 * Steer. "Set as Goal" turns the text into a Goal; while a Goal is on, the composer shows that Goal
 * (objective, state, revision) and its Verify / End actions.
 */
export class Composer {
  readonly node: HTMLElement;

  constructor(
    private readonly _sessionId: string,
    private readonly _settings: ServerConnection.ISettings,
    private readonly _host: IComposerHost
  ) {
    this.node = el('section', 'jp-goals-composer', undefined, 'goals-composer');
    this.node.setAttribute('aria-label', 'Composer');
    this._goal = el('div', 'jp-goals-composer-goal', undefined, 'goals-composer-goal');
    this._goal.hidden = true;
    this._outbox = el('ul', 'jp-goals-outbox', undefined, 'goals-outbox');
    this._outbox.setAttribute('aria-label', 'Messages not yet in the transcript');
    this._alert = alertNode('goals-composer-alert');

    this._text = el('textarea', 'jp-goals-composer-text jp-mod-styled', undefined, 'goals-composer-text');
    this._text.setAttribute('aria-label', 'Message');
    this._text.placeholder = 'Message (Enter sends, Shift+Enter adds a line)';
    this._text.rows = 3;
    this._text.addEventListener('input', () => {
      if (this._text.value.trim() && this._draftId === null) {
        this._draftId = newRequestId();
      } else if (!this._text.value.trim()) {
        this._draftId = null;
      }
    });
    this._text.addEventListener('keydown', event => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });

    this._delivery = el('fieldset', 'jp-goals-delivery', undefined, 'goals-delivery');
    this._delivery.append(el('legend', undefined, 'While a turn runs'));
    const words: Record<'queue' | 'steer', string> = {
      queue: 'Queue: runs after the current turn',
      steer: 'Steer: joins the current turn at its next step'
    };
    for (const value of ['queue', 'steer'] as const) {
      const label = el('label', 'jp-goals-delivery-option');
      const input = el('input');
      input.type = 'radio';
      input.name = `jp-goals-delivery-${_sessionId}`;
      input.value = value;
      input.checked = value === 'queue';
      input.setAttribute('aria-label', value === 'queue' ? 'Queue' : 'Steer');
      label.title = words[value];
      label.append(input, el('span', undefined, value === 'queue' ? 'Queue' : 'Steer'));
      this._delivery.append(label);
      this._radios.push(input);
    }
    this._delivery.hidden = true;

    const row = el('div', 'jp-goals-composer-row');
    const buttons = el('div', 'jp-goals-composer-buttons');
    this._send = button('Send', 'goals-composer-send', () => this.send(), 'Send the message (Enter)');
    this._send.classList.add('jp-mod-accept');
    this._setGoal = button('Set as Goal', 'goals-composer-set-goal', () => void this.setAsGoal(),
      'Turn this text into a Goal: it keeps working until its requirements are verified');
    buttons.append(this._send, this._setGoal);
    row.append(this._text, buttons);
    this.node.append(this._goal, this._outbox, this._alert, this._delivery, row);
    this._restore();
  }

  focus(): void {
    this._text.focus();
  }

  dispose(): void {
    this._disposed = true;
    for (const timer of this._timers) {
      window.clearTimeout(timer);
    }
  }

  /** Show the running state, the current Goal, and drop messages the transcript now shows. */
  update(snapshot: ISessionSnapshot): void {
    const phase = snapshot.work?.phase ?? '';
    this._delivery.hidden = !RUNNING_PHASES.has(phase);
    if (snapshot.goal) {
      this._reported.add(snapshot.goal.goal_id);
    }
    this._renderGoal(snapshot.goal && !TERMINAL_GOAL_STATES.has(snapshot.goal.state) ? snapshot.goal : null);
    this.prune();
  }

  prune(): void {
    const before = this._items.length;
    this._items = this._items.filter(m => !this._acknowledged(m));
    if (this._items.length !== before) {
      this._renderOutbox();
    }
  }

  /** Send the box's text (no-op when empty). */
  send(): void {
    const text = this._text.value.trim();
    if (!text) {
      return;
    }
    const delivery = !this._delivery.hidden && this._radios[1].checked ? 'steer' : 'queue';
    const message: IOutgoing = {
      id: this._draftId ?? newRequestId(),
      text,
      delivery,
      state: 'sending',
      detail: '',
      accepted: null,
      joined: false,
      attempts: 0
    };
    this._draftId = null;
    this._text.value = '';
    this._items.push(message);
    this._renderOutbox();
    void this._post(message);
  }

  /** "Set as Goal": a small form (objective, requirements one per line, budget $) → `POST /goals`. */
  async setAsGoal(): Promise<void> {
    const form = new GoalForm(this._text.value.trim());
    const result = await showDialog({
      title: 'Set as Goal',
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Set Goal' })],
      focusNodeSelector: 'textarea'
    });
    if (!result.button.accept || !result.value) {
      return;
    }
    const value = result.value;
    if (!value.objective) {
      showAlert(this._alert, 'A Goal needs an objective.');
      return;
    }
    const body: ICreateGoal = { session_id: this._sessionId, objective: value.objective };
    if (value.requirements.length > 0) {
      body.requirements = value.requirements.map(text => ({ text, kind: 'semantic' }));
    }
    if (value.budget !== null) {
      body.budget = { max_cost_usd: value.budget };
    }
    try {
      const goal = await postGoalsAPI<IGoal>(urls.goals(), body, this._settings);
      showAlert(this._alert, null);
      // the server's 201 answer is the Goal as committed: show it at once, unless a snapshot read
      // after the commit already reported it (then that snapshot is as new or newer)
      if (!this._reported.has(goal.goal_id) && !TERMINAL_GOAL_STATES.has(goal.state)) {
        this._renderGoal(goal);
      }
      this._text.value = '';
      this._draftId = null;
      this._host.onSent();
    } catch (error) {
      showAlert(this._alert, `The Goal was not set: ${actionErrorText(error)}`);
    }
  }

  private async _post(message: IOutgoing): Promise<void> {
    for (;;) {
      if (this._disposed) {
        return;
      }
      message.attempts += 1;
      try {
        const accepted = await postGoalsAPI<IMessageAccepted>(
          urls.sessionMessages(this._sessionId),
          { text: message.text, client_request_id: message.id, delivery: message.delivery },
          this._settings
        );
        message.accepted = accepted;
        // a steer into running work: the work's own input is already in the transcript, so only the
        // message's `steer:` item (at the turn's next step) shows it arrived
        message.joined =
          (accepted.delivery ?? message.delivery) === 'steer' &&
          this._host.showsItem(`input:${accepted.work_id}`);
        message.state = 'accepted';
        message.detail = '';
        this._renderOutbox();
        this._host.onSent();
        return;
      } catch (error) {
        const status = error instanceof GoalsAPIError ? error.status : 0;
        const transient = status === 0 || status === 502 || status === 503 || status === 504;
        if (!transient) {
          message.state = 'failed';
          message.detail = actionErrorText(error);
          this._renderOutbox();
          return;
        }
        const wait = Math.min(500 * 2 ** (message.attempts - 1), MAX_RETRY_MS);
        message.state = 'retrying';
        message.detail = status ? `the server answered ${status}` : 'the server cannot be reached';
        this._renderOutbox();
        await new Promise<void>(resolve => this._timers.push(window.setTimeout(resolve, wait)));
      }
    }
  }

  /** The transcript shows this accepted message: its `steer:` item, or the `input:` item of the work it started. */
  private _acknowledged(message: IOutgoing): boolean {
    const accepted = message.accepted;
    if (accepted === null) {
      return false;
    }
    if (this._host.showsItem(`steer:${accepted.message_id}`)) {
      return true;
    }
    return !message.joined && this._host.showsItem(`input:${accepted.work_id}`);
  }

  /** Messages not yet acknowledged survive a page reload: kept in localStorage, resent with their id. */
  private get _storageKey(): string {
    return `jupyter-goals:outbox:${this._sessionId}`;
  }

  private _save(): void {
    const unsent = this._items
      .filter(m => m.accepted === null)
      .map(({ id, text, delivery }) => ({ id, text, delivery }));
    try {
      if (unsent.length > 0) {
        window.localStorage.setItem(this._storageKey, JSON.stringify(unsent));
      } else {
        window.localStorage.removeItem(this._storageKey);
      }
    } catch {
      // storage unavailable (private mode, quota): the outbox lives as long as the page
    }
  }

  private _restore(): void {
    let saved: unknown = null;
    try {
      saved = JSON.parse(window.localStorage.getItem(this._storageKey) ?? 'null');
    } catch {
      saved = null;
    }
    if (!Array.isArray(saved)) {
      return;
    }
    for (const entry of saved as Partial<IOutgoing>[]) {
      if (typeof entry?.id !== 'string' || typeof entry.text !== 'string') {
        continue;
      }
      const message: IOutgoing = {
        id: entry.id,
        text: entry.text,
        delivery: entry.delivery === 'steer' ? 'steer' : 'queue',
        state: 'sending',
        detail: '',
        accepted: null,
        joined: false,
        attempts: 0
      };
      this._items.push(message);
      void this._post(message);
    }
    this._renderOutbox();
  }

  private _renderOutbox(): void {
    this._save();
    const rows = this._items.map(message => {
      const row = el('li', 'jp-goals-outgoing', undefined, 'goals-outgoing');
      row.dataset.state = message.state;
      row.dataset.clientRequestId = message.id;
      const status =
        message.state === 'sending'
          ? 'sending…'
          : message.state === 'retrying'
            ? `sending… (${message.detail}; retrying)`
            : message.state === 'accepted'
              ? message.joined
                ? 'accepted; joins the running turn at its next step'
                : 'accepted; waiting for its turn'
              : `not sent: ${message.detail}`;
      const statusNode = el('span', 'jp-goals-outgoing-status', status, 'goals-outgoing-status');
      statusNode.setAttribute('role', 'status');
      row.append(el('span', 'jp-goals-outgoing-text', message.text), statusNode);
      if (message.state === 'failed') {
        row.append(
          button('Send again', 'goals-outgoing-again', () => {
            message.state = 'sending';
            message.attempts = 0;
            this._renderOutbox();
            void this._post(message);
          }),
          button('Discard', 'goals-outgoing-discard', () => {
            this._items = this._items.filter(m => m !== message);
            this._renderOutbox();
          })
        );
      }
      return row;
    });
    this._outbox.replaceChildren(...rows);
    this._outbox.hidden = rows.length === 0;
  }

  private _renderGoal(goal: IGoal | null): void {
    this._goal.hidden = goal === null;
    if (goal === null) {
      this._goal.replaceChildren();
      delete this.node.dataset.goalId;
      return;
    }
    this.node.dataset.goalId = goal.goal_id;
    const line = el('div', 'jp-goals-composer-goal-line');
    line.append(
      el('span', 'jp-goals-goal-label', 'Goal'),
      el('span', 'jp-goals-goal-objective', goal.objective, 'goals-composer-goal-objective'),
      badge(goal.state, 'goals-composer-goal-state'),
      el('span', 'jp-goals-goal-revision', `revision ${goal.revision}`, 'goals-composer-goal-revision')
    );
    const specs = GOAL_ACTIONS.filter(s => s.action === 'verify' || s.action === 'end');
    const bar = actionBar('goals-composer-goal', specs, goal.actions, goal.reason, action =>
      this._host.onGoalAction(urls.goalActions(goal.goal_id), {
        action,
        expected_revision: goal.revision
      })
    );
    bar.append(
      editGoalButton('goals-composer-goal-edit', () => {
        void editGoal(goal.goal_id, this._settings).then(outcome => {
          if (outcome !== null) {
            showAlert(this._alert, outcome.ok ? null : outcome.message);
            this._host.onSent(); // re-read the session
          }
        });
      })
    );
    const burn = budgetBurn(goal, 'goals-composer-goal-budget');
    replaceKeepingFocus(this._goal, line, ...(burn ? [burn] : []), bar);
  }

  private readonly _goal: HTMLElement;
  private readonly _outbox: HTMLElement;
  private readonly _alert: HTMLElement;
  private readonly _text: HTMLTextAreaElement;
  private readonly _delivery: HTMLFieldSetElement;
  private readonly _radios: HTMLInputElement[] = [];
  private readonly _send: HTMLButtonElement;
  private readonly _setGoal: HTMLButtonElement;
  private readonly _timers: number[] = [];
  private _items: IOutgoing[] = [];
  private _draftId: string | null = null;
  private _disposed = false;
  /** Goals a session snapshot has shown (a later 201 answer must not overwrite what it said). */
  private readonly _reported = new Set<string>();
}

interface IGoalFormValue {
  objective: string;
  requirements: string[];
  budget: number | null;
}

/** The "Set as Goal" dialog body. */
class GoalForm extends Widget implements Dialog.IBodyWidget<IGoalFormValue> {
  constructor(objective: string) {
    super();
    this.addClass('jp-goals-form');
    this._objective = el('textarea', 'jp-mod-styled', undefined, 'goals-goal-form-objective');
    this._objective.value = objective;
    this._objective.rows = 3;
    this._requirements = el('textarea', 'jp-mod-styled', undefined, 'goals-goal-form-requirements');
    this._requirements.rows = 3;
    this._requirements.placeholder = 'One per line; leave empty to let the model propose them';
    this._budget = el('input', 'jp-mod-styled', undefined, 'goals-goal-form-budget');
    this._budget.type = 'number';
    this._budget.min = '0';
    this._budget.step = '0.01';
    this._budget.placeholder = 'unlimited';
    this.node.append(
      field('Objective', this._objective),
      field('Requirements (optional)', this._requirements),
      field('Budget in $ (optional)', this._budget)
    );
  }

  getValue(): IGoalFormValue {
    const budget = this._budget.value.trim() === '' ? null : Number(this._budget.value);
    return {
      objective: this._objective.value.trim(),
      requirements: this._requirements.value
        .split('\n')
        .map(line => line.trim())
        .filter(line => line.length > 0),
      budget: budget !== null && Number.isFinite(budget) && budget >= 0 ? budget : null
    };
  }

  private readonly _objective: HTMLTextAreaElement;
  private readonly _requirements: HTMLTextAreaElement;
  private readonly _budget: HTMLInputElement;
}

/** A labelled form field (the label is the control's accessible name). */
export function field(label: string, control: HTMLElement): HTMLElement {
  const node = el('label', 'jp-goals-field');
  node.append(el('span', 'jp-goals-field-label', label), control);
  return node;
}
