import { ServerConnection } from '@jupyterlab/services';

import { IGoalsEvent, requestGoalsAPI } from './api';

/**
 * A listener gets new events in order, or `null`: "rebuild from REST", sent when the feed starts,
 * after it reconnects from a failure, and when the server's event log went backwards (a new store).
 */
export type EventListener = (events: IGoalsEvent[] | null) => void;

export const POLL_INTERVAL_MS = 1000;
const MAX_BACKOFF_MS = 10000;
const PAGE = 500;
/** `after=` larger than any seq: answers no events, only `last_seq`. */
const NEWEST = Number.MAX_SAFE_INTEGER;

interface IEventPage {
  events: IGoalsEvent[];
  last_seq: number;
}

/**
 * One JSON-polling reader of `GET /api/goals/events?after=SEQ` shared by every view of a page
 * (the sidebar and every notebook output). It runs only while someone listens. Views never apply
 * events as state: they re-read the REST snapshot they show when a relevant event arrives, so a
 * missed or repeated event cannot leave a view wrong.
 */
export class EventFeed {
  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private readonly _intervalMs = POLL_INTERVAL_MS
  ) {}

  /** Start listening; the returned function stops. */
  subscribe(listener: EventListener): () => void {
    this._listeners.add(listener);
    if (this._timer === null && !this._busy) {
      this._schedule(0);
    }
    return () => {
      this._listeners.delete(listener);
      if (this._listeners.size === 0) {
        if (this._timer !== null) {
          window.clearTimeout(this._timer);
          this._timer = null;
        }
        this._cursor = null; // a later subscriber starts with a resync
      }
    };
  }

  /** True while the last poll failed (views may say their data could be stale). */
  get failing(): boolean {
    return this._failures > 0;
  }

  private _schedule(ms: number): void {
    this._timer = window.setTimeout(() => {
      this._timer = null;
      void this._poll();
    }, ms);
  }

  private async _poll(): Promise<void> {
    if (this._listeners.size === 0) {
      return;
    }
    this._busy = true;
    let delay = this._intervalMs;
    try {
      if (this._cursor === null) {
        const page = await this._page(NEWEST, 1);
        this._cursor = page.last_seq;
        this._failures = 0;
        this._emit(null);
      } else {
        const page = await this._page(this._cursor, PAGE);
        const resync = this._failures > 0 || page.last_seq < this._cursor;
        this._failures = 0;
        if (resync) {
          this._cursor = page.last_seq;
          this._emit(null);
        } else if (page.events.length > 0) {
          this._cursor = page.events[page.events.length - 1].seq;
          this._emit(page.events);
          if (page.events.length >= PAGE) {
            delay = 0;
          }
        }
      }
    } catch {
      this._failures += 1;
      delay = Math.min(this._intervalMs * 2 ** this._failures, MAX_BACKOFF_MS);
    } finally {
      this._busy = false;
    }
    if (this._listeners.size > 0 && this._timer === null) {
      this._schedule(delay);
    }
  }

  private async _page(after: number, limit: number): Promise<IEventPage> {
    const page = await requestGoalsAPI<IEventPage>(
      `events?format=json&after=${after}&limit=${limit}`,
      this._settings
    );
    if (!page || !Array.isArray(page.events) || typeof page.last_seq !== 'number') {
      throw new Error('events: unexpected response');
    }
    return page;
  }

  private _emit(events: IGoalsEvent[] | null): void {
    for (const listener of Array.from(this._listeners)) {
      try {
        listener(events);
      } catch (error) {
        console.error('jupyter-goals: event listener failed', error);
      }
    }
  }

  private readonly _listeners = new Set<EventListener>();
  private _cursor: number | null = null;
  private _failures = 0;
  private _timer: number | null = null;
  private _busy = false;
}

let shared: EventFeed | null = null;

/** The page's one feed (default server settings). */
export function sharedEventFeed(): EventFeed {
  if (shared === null) {
    shared = new EventFeed();
  }
  return shared;
}

/** Call `fn` once, `ms` after the last of a burst of calls. */
export function debounce(fn: () => void, ms: number): () => void {
  let timer: number | null = null;
  return () => {
    if (timer !== null) {
      window.clearTimeout(timer);
    }
    timer = window.setTimeout(() => {
      timer = null;
      fn();
    }, ms);
  };
}
