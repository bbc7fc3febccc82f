import { ServerConnection } from '@jupyterlab/services';

import { IModelInfo, IModelList, requestGoalsAPI } from './api';

const TTL_MS = 30000;

/** `GET /api/goals/models`, read at most every 30 s per page (the list changes with the config only). */
export class ModelCatalog {
  constructor(private readonly _settings: ServerConnection.ISettings) {}

  /** The configured models; rejects like `requestGoalsAPI` when the server cannot say. */
  list(): Promise<IModelList> {
    const now = Date.now();
    if (this._pending === null || now - this._at > TTL_MS) {
      this._at = now;
      this._pending = requestGoalsAPI<IModelList>('models', this._settings).catch(error => {
        this._pending = null;
        throw error;
      });
    }
    return this._pending;
  }

  /** The model a session names (a configured name, or a `provider:model` string); null if unknown. */
  async find(name: string): Promise<IModelInfo | null> {
    try {
      const list = await this.list();
      const wanted = name || list.default_model || '';
      return (
        list.models.find(m => m.name === wanted) ??
        list.models.find(m => `${m.provider}:${m.model}` === wanted) ??
        null
      );
    } catch {
      return null;
    }
  }

  private _pending: Promise<IModelList> | null = null;
  private _at = 0;
}

let shared: ModelCatalog | null = null;

export function modelCatalog(settings: ServerConnection.ISettings): ModelCatalog {
  if (shared === null) {
    shared = new ModelCatalog(settings);
  }
  return shared;
}
