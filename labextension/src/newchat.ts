import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { ICreateSession, IModelList, ISessionCreated, postGoalsAPI } from './api';
import { field } from './composer';
import { modelCatalog } from './models';
import { actionErrorText, el } from './views';
import { urls } from './urls';

/** What the "New chat" form sends as `POST /api/goals/sessions` (an `ICreateSession`). */
export interface INewChat extends ICreateSession {
  title?: string;
  cwd?: string;
  model?: string;
  permissions: { mode: 'ask' | 'bypass'; allow: string[] };
}

/** The form: title, working folder, model (with credentials state), permission mode, allow rules. */
export class NewChatForm extends Widget implements Dialog.IBodyWidget<INewChat> {
  constructor(folder: string, models: IModelList | null, modelsError: string) {
    super();
    this.addClass('jp-goals-form');
    this.node.dataset.testid = 'goals-new-chat-form';

    this._title = el('input', 'jp-mod-styled', undefined, 'goals-new-chat-title');
    this._title.placeholder = 'Untitled chat';
    this._cwd = el('input', 'jp-mod-styled', undefined, 'goals-new-chat-cwd');
    this._cwd.value = folder;
    this._cwd.placeholder = 'the server root';
    this._model = el('select', 'jp-mod-styled', undefined, 'goals-new-chat-model');
    this._about = el('div', 'jp-goals-model-description', '', 'goals-new-chat-model-description');
    this._mode = el('select', 'jp-mod-styled', undefined, 'goals-new-chat-mode');
    for (const [value, label] of [
      ['ask', 'ask: approve writes and commands'],
      ['bypass', 'bypass: no approvals']
    ]) {
      const option = el('option', undefined, label);
      option.value = value;
      this._mode.append(option);
    }
    this._allow = el('input', 'jp-mod-styled', undefined, 'goals-new-chat-allow');
    this._allow.placeholder = 'e.g. shell, write_file';

    this._models = models;
    const list = models?.models ?? [];
    if (list.length === 0) {
      const option = el('option', undefined, 'server default');
      option.value = '';
      this._model.append(option);
    }
    for (const m of list) {
      const missing = m.credentials_present ? '' : ' (credentials missing)';
      const option = el('option', undefined, `${m.name}${missing}`);
      option.value = m.name;
      option.selected = m.default === true || m.name === models?.default_model;
      this._model.append(option);
    }
    this._model.addEventListener('change', () => this._describe());
    this._describe();

    this.node.append(
      field('Title', this._title),
      field('Working folder', this._cwd),
      field('Model', this._model),
      this._about,
      field('Permission mode', this._mode),
      field('Allowed tools (comma separated)', this._allow)
    );
    if (modelsError) {
      this.node.append(el('div', 'jp-goals-reason', `Models could not be listed: ${modelsError}`));
    }
  }

  getValue(): INewChat {
    const allow = this._allow.value
      .split(',')
      .map(s => s.trim())
      .filter(s => s.length > 0);
    const value: INewChat = {
      permissions: { mode: this._mode.value === 'bypass' ? 'bypass' : 'ask', allow }
    };
    if (this._title.value.trim()) {
      value.title = this._title.value.trim();
    }
    if (this._cwd.value.trim()) {
      value.cwd = this._cwd.value.trim();
    }
    if (this._model.value) {
      value.model = this._model.value;
    }
    return value;
  }

  private _describe(): void {
    const m = this._models?.models.find(x => x.name === this._model.value);
    const parts: string[] = [];
    if (m?.description) {
      parts.push(m.description);
    }
    if (m && !m.credentials_present) {
      parts.push('Its credentials are not set on the server, so it cannot answer yet.');
    }
    this._about.textContent = parts.join(' ');
    this._about.hidden = parts.length === 0;
  }

  private readonly _title: HTMLInputElement;
  private readonly _cwd: HTMLInputElement;
  private readonly _model: HTMLSelectElement;
  private readonly _about: HTMLElement;
  private readonly _mode: HTMLSelectElement;
  private readonly _allow: HTMLInputElement;
  private readonly _models: IModelList | null;
}

/**
 * Ask for a new chat and create it. Resolves to the new session id, or null when the person
 * cancelled; a refused create is shown in a second dialog and resolves null.
 */
export async function newChat(
  folder: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<string | null> {
  let models: IModelList | null = null;
  let modelsError = '';
  try {
    models = await modelCatalog(settings).list();
  } catch (error) {
    modelsError = actionErrorText(error);
  }
  const result = await showDialog({
    title: 'New chat',
    body: new NewChatForm(folder, models, modelsError),
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Create' })],
    focusNodeSelector: 'input'
  });
  if (!result.button.accept || !result.value) {
    return null;
  }
  try {
    const created = await postGoalsAPI<ISessionCreated>(urls.sessions(), result.value, settings);
    return created.session_id;
  } catch (error) {
    await showDialog({
      title: 'The chat was not created',
      body: actionErrorText(error),
      buttons: [Dialog.okButton({ label: 'Close' })]
    });
    return null;
  }
}
