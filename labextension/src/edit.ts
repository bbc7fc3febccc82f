import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  GoalsAPIError,
  IGoal,
  IRequirement,
  ISessionList,
  ISessionSnapshot,
  postGoalsAPI,
  requestGoalsAPI,
  Schemas
} from './api';
import { button, el } from './views';
import { urls } from './urls';

/*
 * The dialogs that act on a reason the views show: Edit Goal (objective, requirements, budget, the
 * waiver reason), a chat's Permissions (mode, allowed tools, folders; each rule revocable) and Stop
 * all work. Each reads the object fresh, sends the version it was decided on, and turns a 409 into
 * the current state in words.
 */

type IPermissions = Schemas['Permissions'];
type IAllowRule = IPermissions['allow'] extends (infer R)[] | undefined ? R : never;

/** What an edit dialog did: `null` when the person cancelled. */
export type EditOutcome = { ok: true; message: string } | { ok: false; message: string } | null;

/** A labelled form field (the label is the control's accessible name). */
function field(label: string, control: HTMLElement, hint = ''): HTMLElement {
  const node = el('label', 'jp-goals-field');
  node.append(el('span', 'jp-goals-field-label', label), control);
  if (hint) {
    node.append(el('span', 'jp-goals-field-hint', hint));
  }
  return node;
}

function numberInput(testid: string, value: number | null | undefined, step: string): HTMLInputElement {
  const input = el('input', 'jp-mod-styled', undefined, testid);
  input.type = 'number';
  input.min = '0';
  input.step = step;
  input.placeholder = 'unlimited';
  input.value = value === null || value === undefined ? '' : String(value);
  return input;
}

function readNumber(input: HTMLInputElement): number | null | 'invalid' {
  const text = input.value.trim();
  if (text === '') {
    return null;
  }
  const value = Number(text);
  return Number.isFinite(value) && value >= 0 ? value : 'invalid';
}

function conflictText(error: unknown, what: string): string {
  if (error instanceof GoalsAPIError) {
    return error.status === 409
      ? `${what} changed meanwhile and was not saved: ${error.detail}. The view shows its current state; edit again.`
      : `${what} was not saved: ${error.detail}`;
  }
  return `${what} was not saved: ${error instanceof Error ? error.message : String(error)}`;
}

// --------------------------------------------------------------------------------------- Edit Goal

interface IGoalEdit {
  objective: string;
  requirements: string[];
  maxCost: number | null | 'invalid';
  maxTokens: number | null | 'invalid';
  maxMinutes: number | null | 'invalid';
  reason: string;
}

class GoalEditForm extends Widget implements Dialog.IBodyWidget<IGoalEdit> {
  constructor(goal: IGoal) {
    super();
    this.addClass('jp-goals-form');
    this._objective = el('textarea', 'jp-mod-styled', undefined, 'goals-edit-objective');
    this._objective.rows = 3;
    this._objective.value = goal.objective;
    this._requirements = el('textarea', 'jp-mod-styled', undefined, 'goals-edit-requirements');
    this._requirements.rows = Math.max(3, goal.requirements.length + 1);
    this._requirements.value = goal.requirements.map(r => r.text).join('\n');
    const b = goal.budget ?? {};
    this._cost = numberInput('goals-edit-budget-cost', b.max_cost_usd, '0.01');
    this._tokens = numberInput('goals-edit-budget-tokens', b.max_tokens, '1');
    this._minutes = numberInput(
      'goals-edit-budget-minutes',
      b.max_active_seconds === undefined || b.max_active_seconds === null ? null : b.max_active_seconds / 60,
      '1'
    );
    this._reason = el('input', 'jp-mod-styled', undefined, 'goals-edit-reason');
    this._reason.type = 'text';
    this._reason.placeholder = 'needed when a requirement is removed or changed';
    const spent = goal.budget_status;
    const burn = spent
      ? `Spent so far: $${spent.known_cost_usd.toFixed(2)}, ${spent.known_tokens} tokens, ` +
        `${Math.round(spent.active_seconds)} s active` +
        (spent.reserved_usd ? `; $${spent.reserved_usd.toFixed(2)} reserved` : '') +
        (spent.uncertain_requests ? `; ${spent.uncertain_requests} request(s) of unknown usage` : '')
      : '';
    this.node.append(
      field('Objective', this._objective),
      field('Requirements', this._requirements, 'One per line. Removing or rewording one is a waiver.'),
      field('Budget in $', this._cost, burn),
      field('Budget in tokens', this._tokens),
      field('Budget in active minutes', this._minutes),
      field('Reason', this._reason, 'Why: recorded with the new revision.')
    );
  }

  getValue(): IGoalEdit {
    return {
      objective: this._objective.value.trim(),
      requirements: this._requirements.value
        .split('\n')
        .map(line => line.trim())
        .filter(line => line.length > 0),
      maxCost: readNumber(this._cost),
      maxTokens: readNumber(this._tokens),
      maxMinutes: readNumber(this._minutes),
      reason: this._reason.value.trim()
    };
  }

  private readonly _objective: HTMLTextAreaElement;
  private readonly _requirements: HTMLTextAreaElement;
  private readonly _cost: HTMLInputElement;
  private readonly _tokens: HTMLInputElement;
  private readonly _minutes: HTMLInputElement;
  private readonly _reason: HTMLInputElement;
}

/** The requirements a text edit stands for: an unchanged line keeps its requirement (id, kind, check). */
export function editedRequirements(old: IRequirement[], lines: string[]): IRequirement[] {
  const unused = [...old];
  return lines.map(text => {
    const i = unused.findIndex(r => r.text === text);
    if (i >= 0) {
      return unused.splice(i, 1)[0];
    }
    return { text, kind: 'semantic' };
  });
}

/** Ids of requirements an edit removes or rewords (a waiver: the server asks for a reason). */
export function waivedRequirements(old: IRequirement[], edited: IRequirement[]): string[] {
  const kept = new Set(edited.map(r => r.id).filter(id => id));
  return old.filter(r => !kept.has(r.id)).map(r => r.id ?? r.text);
}

/**
 * "Edit Goal": reads the Goal, shows its objective, requirements and budget (with what is spent),
 * sends `PATCH /goals/{id}` with the revision it showed. A budget-stopped Goal whose budget is raised
 * runs again (the server rechecks it).
 */
export async function editGoal(
  goalId: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<EditOutcome> {
  let goal: IGoal;
  try {
    goal = await requestGoalsAPI(urls.goal(goalId), settings);
  } catch (error) {
    return { ok: false, message: conflictText(error, 'The Goal') };
  }
  const result = await showDialog({
    title: `Edit Goal (revision ${goal.revision})`,
    body: new GoalEditForm(goal),
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save Goal' })],
    focusNodeSelector: 'textarea'
  });
  if (!result.button.accept || !result.value) {
    return null;
  }
  const value = result.value;
  if (!value.objective) {
    return { ok: false, message: 'A Goal needs an objective: nothing was saved.' };
  }
  if ([value.maxCost, value.maxTokens, value.maxMinutes].includes('invalid')) {
    return { ok: false, message: 'A budget is a number of 0 or more, or empty for unlimited: nothing was saved.' };
  }
  const body: Schemas['UpdateGoal'] = { expected_revision: goal.revision };
  if (value.objective !== goal.objective) {
    body.objective = value.objective;
  }
  const requirements = editedRequirements(goal.requirements, value.requirements);
  const changed =
    requirements.length !== goal.requirements.length || requirements.some((r, i) => r !== goal.requirements[i]);
  if (changed) {
    body.requirements = requirements;
  }
  const waived = changed ? waivedRequirements(goal.requirements, requirements) : [];
  if (waived.length > 0 && !value.reason) {
    return {
      ok: false,
      message: `Removing or rewording ${waived.join(', ')} is a waiver: give a reason. Nothing was saved.`
    };
  }
  const old = goal.budget ?? {};
  const budget: Schemas['Budget'] = {
    ...(old.max_input_tokens_per_request ? { max_input_tokens_per_request: old.max_input_tokens_per_request } : {}),
    ...(old.max_output_tokens_per_request ? { max_output_tokens_per_request: old.max_output_tokens_per_request } : {}),
    max_cost_usd: value.maxCost as number | null,
    max_tokens: value.maxTokens === null ? null : Math.round(value.maxTokens as number),
    max_active_seconds: value.maxMinutes === null ? null : (value.maxMinutes as number) * 60
  };
  const oldSeconds = old.max_active_seconds ?? null;
  if (
    budget.max_cost_usd !== (old.max_cost_usd ?? null) ||
    budget.max_tokens !== (old.max_tokens ?? null) ||
    (budget.max_active_seconds ?? null) !== oldSeconds
  ) {
    body.budget = budget;
  }
  if (value.reason) {
    body.reason = value.reason;
  }
  if (Object.keys(body).length === 1) {
    return { ok: true, message: 'Nothing changed.' };
  }
  try {
    const saved = await requestGoalsAPI(urls.goal(goalId), settings, 'PATCH', body);
    return { ok: true, message: `Goal saved as revision ${saved.revision}.` };
  } catch (error) {
    return { ok: false, message: conflictText(error, 'The Goal') };
  }
}

// ------------------------------------------------------------------------------------- Permissions

function ruleText(rule: IAllowRule): string {
  return typeof rule === 'string' ? rule : `${rule.tool} in ${rule.path}`;
}

const RULE_SOURCES: Record<string, string> = {
  created: 'with the chat',
  permissions: 'in Permissions',
  approval: 'approving a call',
  inherited: 'with the chat that started this one'
};

/** "added by alice, 07/12/2026 03:40 (approving a call)"; "unknown" for a rule saved before who and when were kept. */
export function provenanceText(rule: IRuleProvenance): string {
  if (!rule.added_by || rule.added_at === null || rule.added_at === undefined) {
    return 'added by unknown (saved before who and when were recorded)';
  }
  const how = rule.via ? RULE_SOURCES[rule.via] : '';
  return `added by ${rule.added_by}, ${new Date(rule.added_at * 1000).toLocaleString()}${how ? ` (${how})` : ''}`;
}

type IRuleProvenance = ISessionSnapshot['allow_rules'][number];

interface IPermissionsEdit {
  mode: 'ask' | 'bypass';
  added: string[];
  folders: string[];
}

class PermissionsForm extends Widget implements Dialog.IBodyWidget<IPermissionsEdit> {
  /** Whether a rule was revoked while the dialog was open (the view re-reads then, even on Cancel). */
  revoked = false;

  constructor(
    public snapshot: ISessionSnapshot,
    private readonly _settings: ServerConnection.ISettings
  ) {
    super();
    this.addClass('jp-goals-form');
    const current = snapshot.session.permissions;
    this._mode = el('select', 'jp-mod-styled', undefined, 'goals-permissions-mode');
    for (const [value, label] of [
      ['ask', 'ask before writes and commands'],
      ['bypass', 'bypass (no approvals)']
    ]) {
      const option = el('option', undefined, label);
      option.value = value;
      this._mode.append(option);
    }
    this._mode.value = current.mode ?? 'ask';
    this._rules = el('ul', 'jp-goals-rules', undefined, 'goals-permissions-rules');
    this._rules.setAttribute('aria-label', 'Always allowed');
    this._status = el('div', 'jp-goals-field-hint', '', 'goals-permissions-status');
    this._status.setAttribute('role', 'status');
    this._add = el('input', 'jp-mod-styled', undefined, 'goals-permissions-add');
    this._add.type = 'text';
    this._add.placeholder = 'tool names, comma separated';
    this._folders = el('textarea', 'jp-mod-styled', undefined, 'goals-permissions-folders');
    this._folders.rows = 2;
    this._folders.value = (current.folders ?? []).join('\n');
    const ruleBox = el('div', 'jp-goals-field');
    ruleBox.append(el('span', 'jp-goals-field-label', 'Always allowed'), this._rules, this._status);
    this.node.append(
      field('Permission mode', this._mode, 'Unknown outcomes still ask once, in either mode.'),
      ruleBox,
      field('Allow without asking', this._add),
      field('Folders the chat may read', this._folders, 'One per line, besides the chat folder.')
    );
    this._renderRules();
  }

  getValue(): IPermissionsEdit {
    return {
      mode: this._mode.value === 'bypass' ? 'bypass' : 'ask',
      added: this._add.value
        .split(',')
        .map(name => name.trim())
        .filter(name => name.length > 0),
      folders: this._folders.value
        .split('\n')
        .map(line => line.trim())
        .filter(line => line.length > 0)
    };
  }

  /** Each rule with who added it and when, and a Revoke button that saves at once. */
  private _renderRules(): void {
    const rules = this.snapshot.allow_rules ?? [];
    const rows: HTMLElement[] = [];
    if (rules.length === 0) {
      rows.push(el('li', 'jp-goals-empty', 'No tool is always allowed.'));
    }
    for (const rule of rules) {
      const text = ruleText(rule.rule);
      const row = el('li', 'jp-goals-rule', undefined, 'goals-permissions-rule');
      row.dataset.rule = text;
      const revoke = button('Revoke', 'goals-permissions-revoke', () => void this._revoke(rule.rule),
        `Revoke ${text}: its next call asks again`);
      revoke.setAttribute('aria-label', `Revoke ${text}`);
      row.append(
        el('code', undefined, text),
        el('span', 'jp-goals-field-hint jp-goals-rule-provenance', ` ${provenanceText(rule)} `, 'goals-permissions-provenance'),
        revoke
      );
      rows.push(row);
    }
    this._rules.replaceChildren(...rows);
  }

  /**
   * `PATCH /sessions/{id}` without the rule, with the control version this dialog shows; a 409 says so and
   * shows the current rules (the person decides again on them).
   */
  private async _revoke(rule: IAllowRule): Promise<void> {
    const current = this.snapshot.session.permissions;
    const key = JSON.stringify(rule);
    const permissions: IPermissions = { ...current, allow: (current.allow ?? []).filter(r => JSON.stringify(r) !== key) };
    const work = this.snapshot.work;
    const id = this.snapshot.session.session_id;
    const body: Schemas['UpdateSession'] = {
      permissions,
      ...(work ? { expected_control_version: work.control_version } : {})
    };
    try {
      this.snapshot = await requestGoalsAPI(urls.session(id), this._settings, 'PATCH', body);
      this.revoked = true;
      this._status.textContent = `Revoked ${ruleText(rule)}: its next call asks again.`;
    } catch (error) {
      this._status.textContent = conflictText(error, 'The permissions');
      try {
        this.snapshot = await requestGoalsAPI(urls.session(id, { before: 'latest', limit: 1 }), this._settings);
      } catch {
        // the message above says what failed; the list stays as it was
      }
    }
    this._renderRules();
  }

  private readonly _mode: HTMLSelectElement;
  private readonly _rules: HTMLElement;
  private readonly _status: HTMLElement;
  private readonly _add: HTMLInputElement;
  private readonly _folders: HTMLTextAreaElement;
}

/**
 * A chat's Permissions: mode, each always-allowed rule with who added it and when and a Revoke button
 * (saved at once), new rules and folders (Save); each `PATCH /sessions/{id}` carries the control version
 * the dialog showed. A revoked rule makes the next such call ask; approvals waiting under the old scope
 * are withdrawn by the server.
 */
export async function editPermissions(
  sessionId: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<EditOutcome> {
  let snapshot: ISessionSnapshot;
  try {
    snapshot = await requestGoalsAPI(urls.session(sessionId, { before: 'latest', limit: 1 }), settings);
  } catch (error) {
    return { ok: false, message: conflictText(error, 'The permissions') };
  }
  const form = new PermissionsForm(snapshot, settings);
  const result = await showDialog({
    title: `Permissions of “${snapshot.session.title || 'Untitled chat'}”`,
    body: form,
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save permissions' })],
    focusNodeSelector: 'select'
  });
  if (!result.button.accept || !result.value) {
    return form.revoked ? { ok: true, message: 'Rule revoked.' } : null;
  }
  const value = result.value;
  const current = form.snapshot.session.permissions; // as it is after any Revoke in the dialog
  const allow = [...(current.allow ?? [])];
  for (const name of value.added) {
    if (!allow.some(rule => rule === name)) {
      allow.push(name);
    }
  }
  const permissions: IPermissions = { ...current, mode: value.mode, allow, folders: value.folders };
  if (JSON.stringify(permissions) === JSON.stringify({ ...current, folders: current.folders ?? [] })) {
    // saving the same scope would still withdraw pending approvals: send nothing
    return form.revoked ? { ok: true, message: 'Rule revoked.' } : { ok: true, message: 'Nothing changed.' };
  }
  const body: Schemas['UpdateSession'] = {
    permissions,
    ...(form.snapshot.work ? { expected_control_version: form.snapshot.work.control_version } : {})
  };
  try {
    await requestGoalsAPI(urls.session(sessionId), settings, 'PATCH', body);
    return { ok: true, message: 'Permissions saved.' };
  } catch (error) {
    return { ok: false, message: conflictText(error, 'The permissions') };
  }
}

// ----------------------------------------------------------------------------------- Stop all work

const STOPPED_PHASES = new Set(['done', 'cancelled', 'failed']);

/** How many sessions have work that a Stop all would stop (their shown work item still runs or waits). */
async function runningCount(settings: ServerConnection.ISettings): Promise<number> {
  let count = 0;
  let cursor: string | null = null;
  do {
    const page: ISessionList = await requestGoalsAPI(urls.sessions({ limit: 500, cursor }), settings);
    for (const s of page.sessions) {
      if (s.work && s.work.desired_state !== 'cancelled' && s.work.desired_state !== 'done' && !STOPPED_PHASES.has(s.work.phase)) {
        count += 1;
      }
    }
    cursor = page.next_cursor ?? null;
  } while (cursor);
  return count;
}

/**
 * "Stop all work": says how many chats have work that stops, then `POST /actions {action: stop_all}`.
 * The stop is durable: nothing of it resumes after a restart.
 */
export async function stopAllWork(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<EditOutcome> {
  let count: number;
  try {
    count = await runningCount(settings);
  } catch (error) {
    return { ok: false, message: conflictText(error, 'Stop all') };
  }
  const body = el('div', 'jp-goals-form', undefined, 'goals-stop-all-confirm');
  body.append(
    el(
      'p',
      undefined,
      count === 0
        ? 'No chat has work that runs or waits now. Stop all still stops anything that starts meanwhile.'
        : `Work in ${count} chat${count === 1 ? '' : 's'} stops now: running commands are cancelled, waiting ` +
            'approvals are withdrawn, and nothing resumes after a restart.'
    )
  );
  const result = await showDialog({
    title: 'Stop all work?',
    body: new Widget({ node: body }),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop all work' })]
  });
  if (!result.button.accept) {
    return null;
  }
  try {
    const answer = await postGoalsAPI<{ stopped: string[] }>(urls.actions(), { action: 'stop_all' }, settings);
    const n = answer.stopped.length;
    return { ok: true, message: `Stopped ${n} work item${n === 1 ? '' : 's'}.` };
  } catch (error) {
    return { ok: false, message: conflictText(error, 'Stop all') };
  }
}
