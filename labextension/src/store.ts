import { ServerConnection } from '@jupyterlab/services';

import { IGoalsEvent, ISessionSnapshot, ITranscriptItem, payloadOf, requestGoalsAPI } from './api';
import { debounce, EventListener, OneAtATime, sharedEventFeed } from './events';
import { urls } from './urls';

/** The newest page a session opens with; older pages load on request (scrolling up). */
export const PAGE_SIZE = 100;
/** A forward read asks for at most this many items (more: it reads on). */
const FORWARD_PAGE = 500;
/** The events of one burst share one read. */
const SETTLE_MS = 60;

/**
 * Events whose payload is the whole change: the store applies them to the snapshot it holds and reads
 * nothing. Drafts are hints views show as they stream (the durable answer arrives as a transcript item).
 */
const APPLIED_IN_PLACE = new Set(['session.updated', 'assistant.draft']);

/** What a session listener is told. */
export interface ISessionChange {
  /** The items were replaced (the first read, or a read after the server's event log started anew). */
  reset: boolean;
  /** Items appended since the last change (none when `reset`: read `entry.items`). */
  added: ITranscriptItem[];
  /** The snapshot (session, work, actions, Goal, approvals, usage) or `error` changed. */
  changed: boolean;
  /** This session's events of the batch, in order (drafts, effect states: hints a view may show at once). */
  events: IGoalsEvent[];
  /** The feed (re)connected: what a view reads beside the store (a banner, a history list) may be stale. */
  resync?: boolean;
}

export type SessionListener = (entry: SessionEntry, change: ISessionChange) => void;

/**
 * One session as the page knows it: the latest snapshot and the transcript items read so far (the
 * newest page, then forward; older pages on request), shared by every view that shows the session (its
 * chat view, the Goals panel's detail, the notebook's chat cards). One read serves them all: the first
 * opens the newest page, each later one reads forward from the last seq (the transcript is append-only),
 * and a burst of events of the session is one read. Nothing polls: reads follow events, a reconnect of
 * the feed, and the actions a view sends.
 */
export class SessionEntry {
  constructor(
    readonly sessionId: string,
    private readonly _settings: ServerConnection.ISettings,
    private readonly _release: (entry: SessionEntry) => void
  ) {}

  /** The last snapshot read (null until the first read answers). */
  snapshot: ISessionSnapshot | null = null;
  /** The transcript items read so far, in seq order. */
  items: ITranscriptItem[] = [];
  /** Where older items start (`before=`), null when the first item is loaded. */
  prevCursor: number | null = null;
  /** Why the last read failed (null after a good one). */
  error: unknown = null;

  /** The newest seq read (0 before the first read). */
  get lastSeq(): number {
    return this.items.length > 0 ? this.items[this.items.length - 1].seq : 0;
  }

  /** True once a read answered. */
  get opened(): boolean {
    return this._opened;
  }

  /** Listen; the first listener opens the session, the last one's leaving forgets it. */
  subscribe(listener: SessionListener): () => void {
    this._listeners.add(listener);
    if (this._opened || this.error !== null) {
      listener(this, { reset: true, added: [], changed: true, events: [] }); // what the others see
    }
    if (!this._opened && !this._reads.running) {
      void this.refresh(); // the first listener opens it; later ones are told when that read answers
    }
    return () => {
      this._listeners.delete(listener);
      if (this._listeners.size === 0) {
        this._release(this);
      }
    };
  }

  /** Read what is new (concurrent calls share one read, and one more after it); never rejects. */
  refresh(): Promise<void> {
    return this._reads.run();
  }

  /** The page before the oldest item read; resolves with those items (also prepended to `items`). */
  async loadOlder(): Promise<ITranscriptItem[]> {
    if (this.prevCursor === null) {
      return [];
    }
    const snapshot = await requestGoalsAPI(
      urls.session(this.sessionId, { before: this.prevCursor, limit: PAGE_SIZE }),
      this._settings
    );
    const older = (snapshot.transcript?.items ?? []).filter(i => this.items.length === 0 || i.seq < this.items[0].seq);
    this.prevCursor = snapshot.transcript?.prev_cursor ?? null;
    this.items = [...older, ...this.items];
    return older;
  }

  /** The feed's events of this session (`null`: the feed (re)connected, read again). */
  take(events: IGoalsEvent[] | null): void {
    if (events === null) {
      this._tell({ reset: false, added: [], changed: false, events: [], resync: true });
      this._readSoon();
      return;
    }
    let read = false;
    let changed = false;
    for (const event of events) {
      if (!APPLIED_IN_PLACE.has(event.kind)) {
        read = true;
      } else if (event.kind === 'session.updated' && this.snapshot !== null) {
        const payload = payloadOf(event);
        const session = { ...this.snapshot.session };
        if (typeof payload.title === 'string') {
          session.title = payload.title;
        }
        if (typeof payload.model === 'string') {
          session.model = payload.model;
        }
        this.snapshot = { ...this.snapshot, session };
        changed = true;
      }
    }
    this._tell({ reset: false, added: [], changed, events });
    if (read) {
      this._readSoon();
    }
  }

  private _readSoon = debounce(() => void this.refresh(), SETTLE_MS);

  private async _read(): Promise<void> {
    try {
      if (!this._opened) {
        const snapshot = await requestGoalsAPI(
          urls.session(this.sessionId, { before: 'latest', limit: PAGE_SIZE }),
          this._settings
        );
        this.items = [...(snapshot.transcript?.items ?? [])];
        this.prevCursor = snapshot.transcript?.prev_cursor ?? null;
        this._opened = true;
        this._accept(snapshot, { reset: true, added: [], changed: true, events: [] });
        return;
      }
      const snapshot = await requestGoalsAPI(
        urls.session(this.sessionId, { after: this.lastSeq, limit: FORWARD_PAGE }),
        this._settings
      );
      const last = this.lastSeq;
      const added = (snapshot.transcript?.items ?? []).filter(i => i.seq > last);
      this.items.push(...added);
      if (snapshot.transcript?.next_cursor) {
        this._reads.again(); // more than a page arrived: read on
      }
      this._accept(snapshot, { reset: false, added, changed: true, events: [] });
    } catch (error) {
      this.error = error;
      this._tell({ reset: false, added: [], changed: true, events: [] });
    }
  }

  private _accept(snapshot: ISessionSnapshot, change: ISessionChange): void {
    this.snapshot = snapshot;
    this.error = null;
    sharedEventFeed().nudge(); // the server answers: the feed need not wait out its backoff
    this._tell(change);
  }

  private _tell(change: ISessionChange): void {
    for (const listener of Array.from(this._listeners)) {
      try {
        listener(this, change);
      } catch (error) {
        console.error('jupyter-goals: session listener failed', error);
      }
    }
  }

  private readonly _listeners = new Set<SessionListener>();
  private _opened = false;
  private readonly _reads = new OneAtATime(() => this._read(), () => this._listeners.size > 0);
}

/**
 * The page's one client-side store of sessions, fed by the one event feed: an event updates the
 * session it names (in place when its payload is the whole change, else by one shared forward read),
 * and views subscribe to the store instead of reading REST on events themselves.
 */
export class GoalsStore {
  constructor(private readonly _settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** The session's shared entry (kept while someone listens). */
  session(sessionId: string): SessionEntry {
    let entry = this._sessions.get(sessionId);
    if (entry === undefined) {
      entry = new SessionEntry(sessionId, this._settings, gone => this._forget(gone));
      this._sessions.set(sessionId, entry);
      this._follow();
    }
    return entry;
  }

  private _forget(entry: SessionEntry): void {
    if (this._sessions.get(entry.sessionId) === entry) {
      this._sessions.delete(entry.sessionId);
    }
    if (this._sessions.size === 0) {
      this._unsubscribe?.();
      this._unsubscribe = null;
    }
  }

  private _follow(): void {
    if (this._unsubscribe !== null) {
      return;
    }
    const listener: EventListener = events => {
      if (events === null) {
        for (const entry of Array.from(this._sessions.values())) {
          entry.take(null);
        }
        return;
      }
      const bySession = new Map<string, IGoalsEvent[]>();
      for (const event of events) {
        if (event.session_id && this._sessions.has(event.session_id)) {
          const list = bySession.get(event.session_id) ?? [];
          list.push(event);
          bySession.set(event.session_id, list);
        }
      }
      for (const [sessionId, list] of bySession) {
        this._sessions.get(sessionId)?.take(list);
      }
    };
    this._unsubscribe = sharedEventFeed().subscribe(listener);
  }

  private readonly _sessions = new Map<string, SessionEntry>();
  private _unsubscribe: (() => void) | null = null;
}

let shared: GoalsStore | null = null;

/** The page's one store (default server settings). */
export function goalsStore(): GoalsStore {
  if (shared === null) {
    shared = new GoalsStore();
  }
  return shared;
}
