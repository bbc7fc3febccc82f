import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IEventPage, IGoalsEvent, requestGoalsAPI } from './api';
import { urls } from './urls';

/**
 * A listener gets new events in order, or `null`: "rebuild from REST", sent when the feed starts,
 * after it reconnects from a failure, and when the server's event log went backwards (a new store).
 */
export type EventListener = (events: IGoalsEvent[] | null) => void;

/** How the feed follows the server now (views show "reconnecting…" while it is `down`). */
export type FeedMode = 'idle' | 'streaming' | 'polling' | 'down';

export const POLL_INTERVAL_MS = 1000;
const FIRST_BACKOFF_MS = 250;
const MAX_BACKOFF_MS = 3000;
/** In polling fallback, try the stream again after this many good polls. */
const POLLS_BEFORE_STREAM_RETRY = 10;
const PAGE = 500;
/** `after=` larger than any seq: answers no events, only `last_seq`. */
const NEWEST = Number.MAX_SAFE_INTEGER;

/** The stream ended or broke after it had opened (the server went away, a proxy cut it). */
class StreamClosed extends Error {}
/** The stream could not be opened or read at all (streaming does not work here). */
class StreamUnsupported extends Error {}

/**
 * The page's one reader of `GET /api/goals/events` shared by every view (the sidebar, the session
 * views and every notebook output). It follows the Server-Sent Events stream read with `fetch()`
 * and Jupyter's auth headers (token + XSRF, through `ServerConnection.makeRequest`), resuming after
 * the last seen `seq`; it falls back to JSON polling (`?format=json`) only while streaming fails,
 * and reconnects with backoff when the server is gone. It runs only while someone listens. Views
 * never apply events as state: they re-read the REST snapshot they show when a relevant event
 * arrives, so a missed or repeated event cannot leave a view wrong.
 */
export class EventFeed {
  constructor(
    private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private readonly _intervalMs = POLL_INTERVAL_MS
  ) {}

  /** Start listening; the returned function stops. */
  subscribe(listener: EventListener): () => void {
    this._listeners.add(listener);
    if (!this._running) {
      void this._run();
    }
    return () => {
      this._listeners.delete(listener);
      if (this._listeners.size === 0) {
        this._abort?.abort();
        this._wake?.();
      }
    };
  }

  /**
   * Another read just reached the server: while the feed waits to reconnect, try now (so an open
   * view follows events again at once instead of after the rest of the backoff).
   */
  nudge(): void {
    if (this._mode === 'down') {
      this._wake?.();
    }
  }

  /** True while the server cannot be read (views may say their data could be stale). */
  get failing(): boolean {
    return this._failures > 0;
  }

  get mode(): FeedMode {
    return this._mode;
  }

  /** Be told each change of `mode` (and the mode now, at once); the returned function stops. */
  onMode(listener: (mode: FeedMode) => void): () => void {
    this._modeListeners.add(listener);
    listener(this._mode);
    return () => this._modeListeners.delete(listener);
  }

  private _setMode(mode: FeedMode): void {
    if (mode === this._mode) {
      return;
    }
    this._mode = mode;
    for (const listener of Array.from(this._modeListeners)) {
      try {
        listener(mode);
      } catch (error) {
        console.error('jupyter-goals: feed mode listener failed', error);
      }
    }
  }

  /** The last seq every listener has been given. */
  get cursor(): number | null {
    return this._cursor;
  }

  private async _run(): Promise<void> {
    this._running = true;
    this._cursor = null; // a new run starts with a resync
    // back online: reconnect now instead of after the rest of the backoff
    const onOnline = (): void => this.nudge();
    window.addEventListener('online', onOnline);
    let streamBroken = 0;
    let goodPolls = 0;
    try {
      while (this._listeners.size > 0) {
        let delay = 0;
        try {
          await this._catchUp();
          if (streamBroken === 0 || goodPolls >= POLLS_BEFORE_STREAM_RETRY) {
            goodPolls = 0;
            this._setMode('streaming');
            try {
              await this._stream();
            } catch (error) {
              if (error instanceof StreamUnsupported) {
                streamBroken += 1;
              } else {
                throw error;
              }
            }
            if (streamBroken > 0) {
              this._setMode('polling');
            }
          } else {
            this._setMode('polling');
            goodPolls += 1;
            delay = this._intervalMs;
          }
        } catch {
          if (this._listeners.size === 0) {
            break;
          }
          this._failures += 1;
          this._setMode('down');
          delay = Math.min(FIRST_BACKOFF_MS * 2 ** (this._failures - 1), MAX_BACKOFF_MS);
        }
        if (delay > 0 && this._listeners.size > 0) {
          await this._sleep(delay);
        }
      }
    } finally {
      window.removeEventListener('online', onOnline);
      this._running = false;
      this._setMode('idle');
      this._abort = null;
    }
  }

  /** Read what is new with one JSON page; the first read and any read after a failure resync. */
  private async _catchUp(): Promise<void> {
    if (this._cursor === null) {
      const page = await this._page(NEWEST, 1);
      this._cursor = page.last_seq;
      this._failures = 0;
      this._emit(null);
      return;
    }
    const page = await this._page(this._cursor, PAGE);
    const resync = this._failures > 0 || page.last_seq < this._cursor;
    this._failures = 0;
    if (resync) {
      this._cursor = page.last_seq;
      this._emit(null);
    } else if (page.events.length > 0) {
      this._cursor = page.events[page.events.length - 1].seq;
      this._emit(page.events);
    }
  }

  /**
   * Follow the SSE stream from the cursor until it ends; events go to listeners as they arrive. When
   * the browser goes offline the stream is cut (a connection that silently died would otherwise wait
   * for bytes forever) and the feed reconnects from its cursor as after any broken stream.
   */
  private async _stream(): Promise<void> {
    const abort = new AbortController();
    this._abort = abort;
    let offline = false;
    const onOffline = (): void => {
      offline = true;
      abort.abort();
    };
    window.addEventListener('offline', onOffline);
    try {
      await this._follow(abort, () => offline);
    } finally {
      window.removeEventListener('offline', onOffline);
    }
  }

  /** The stream itself; `offline()` tells a cut by going offline (a break) from unsubscribing (a stop). */
  private async _follow(abort: AbortController, offline: () => boolean): Promise<void> {
    const stopped = (): boolean => abort.signal.aborted && !offline();
    const url = URLExt.join(this._settings.baseUrl, 'api/goals/events') + `?after=${this._cursor ?? 0}`;
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(
        url,
        {
          method: 'GET',
          cache: 'no-store',
          signal: abort.signal,
          headers: { Accept: 'text/event-stream' }
        },
        this._settings
      );
    } catch (error) {
      if (stopped()) {
        return;
      }
      throw new StreamClosed(String(error)); // the server is not there: back off and catch up
    }
    const type = response.headers.get('Content-Type') ?? '';
    if (!response.ok || !response.body || !type.includes('text/event-stream')) {
      if (response.status >= 500 || response.status === 0) {
        throw new StreamClosed(`HTTP ${response.status}`);
      }
      throw new StreamUnsupported(`HTTP ${response.status} ${type}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        buffer += decoder.decode(value, { stream: true });
        const frames = buffer.split(/\r?\n\r?\n/);
        buffer = frames.pop() ?? '';
        const batch: IGoalsEvent[] = [];
        for (const frame of frames) {
          const event = parseFrame(frame);
          if (event && (this._cursor === null || event.seq > this._cursor)) {
            batch.push(event);
            this._cursor = event.seq;
          }
        }
        if (batch.length > 0) {
          this._emit(batch);
        }
      }
    } catch (error) {
      if (stopped()) {
        return;
      }
      throw new StreamClosed(String(error));
    } finally {
      reader.cancel().catch(() => undefined);
    }
    if (!stopped()) {
      throw new StreamClosed(offline() ? 'the browser went offline' : 'the event stream ended');
    }
  }

  private async _page(after: number, limit: number): Promise<IEventPage> {
    const page = await requestGoalsAPI<IEventPage>(
      urls.events(after, limit),
      this._settings
    );
    if (!page || !Array.isArray(page.events) || typeof page.last_seq !== 'number') {
      throw new Error('events: unexpected response');
    }
    return page;
  }

  private _sleep(ms: number): Promise<void> {
    return new Promise(resolve => {
      const timer = window.setTimeout(() => {
        this._wake = null;
        resolve();
      }, ms);
      this._wake = () => {
        window.clearTimeout(timer);
        this._wake = null;
        resolve();
      };
    });
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
  private readonly _modeListeners = new Set<(mode: FeedMode) => void>();
  private _cursor: number | null = null;
  private _failures = 0;
  private _running = false;
  private _mode: FeedMode = 'idle';
  private _abort: AbortController | null = null;
  private _wake: (() => void) | null = null;
}

/** One SSE frame (`id:`, `event:`, `data:` lines; `:` comments are keep-alives) → event or null. */
export function parseFrame(frame: string): IGoalsEvent | null {
  const data: string[] = [];
  for (const line of frame.split(/\r?\n/)) {
    if (line.startsWith('data:')) {
      data.push(line.slice(5).replace(/^ /, ''));
    }
  }
  if (data.length === 0) {
    return null;
  }
  try {
    const event = JSON.parse(data.join('\n')) as IGoalsEvent;
    return typeof event?.seq === 'number' ? event : null;
  } catch {
    return null;
  }
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

/**
 * One read at a time: a call while `read` runs shares it and asks for one more read after it (so what
 * changed meanwhile is read too); `wanted()` false drops that further read (nobody listens any more).
 */
export class OneAtATime {
  constructor(
    private readonly _read: () => Promise<void>,
    private readonly _wanted: () => boolean = () => true
  ) {}

  run(): Promise<void> {
    if (this._pending) {
      this._again = true;
      return this._pending;
    }
    this._pending = this._read().finally(() => {
      this._pending = null;
      if (this._again && this._wanted()) {
        this._again = false;
        void this.run();
      }
    });
    return this._pending;
  }

  /** Read once more after the running read (more arrived than one read answers). */
  again(): void {
    this._again = true;
  }

  get running(): boolean {
    return this._pending !== null;
  }

  private _pending: Promise<void> | null = null;
  private _again = false;
}
