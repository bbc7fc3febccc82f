import { ServerConnection } from '@jupyterlab/services';

import { IModelInfo, IModelList, requestGoalsAPI } from './api';
import { sharedEventFeed } from './events';
import { urls } from './urls';

const TTL_MS = 300000;

/**
 * `GET /api/goals/models`, read when a view first needs it, then again only when the event feed
 * reconnects (a restarted server may have another config) or, asked after 5 minutes, for credentials
 * set meanwhile. Never read on a timer.
 */
export class ModelCatalog {
  constructor(private readonly _settings: ServerConnection.ISettings) {
    sharedEventFeed().subscribe(events => {
      if (events === null && this._at > 0) {
        this._at = 0; // the next `list()` reads again
      }
    });
  }

  /** The configured models; rejects like `requestGoalsAPI` when the server cannot say. */
  list(): Promise<IModelList> {
    const now = Date.now();
    if (this._pending === null || this._at === 0 || now - this._at > TTL_MS) {
      this._at = now;
      this._pending = requestGoalsAPI<IModelList>(urls.models(), this._settings).catch(error => {
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
