import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  IApproval,
  IGoal,
  IGoalsEvent,
  IHistoryRecord,
  postGoalsAPI,
  requestGoalsAPI
} from './api';
import { debounce, sharedEventFeed } from './events';
import {
  actionErrorText,
  alertNode,
  approvalView,
  el,
  goalView,
  historyRow,
  showAlert,
  unavailableNode
} from './views';

export const GOAL_MIME = 'application/vnd.jupyter-goals.goal+json';
export const APPROVAL_MIME = 'application/vnd.jupyter-goals.approval+json';
export const HISTORY_MIME = 'application/vnd.jupyter-goals.history+json';

/**
 * A notebook output that carries only ids and reads everything else from REST, re-reading it on
 * the events that concern it. Nothing lives in the kernel, so the output stays live after a
 * kernel restart, a server restart, and when the notebook is reopened with no kernel at all.
 */
abstract class LiveOutput extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('jp-goals-Output');
    this.node.dataset.testid = 'goals-output';
    this._alert = alertNode('goals-action-error');
    this._content = el('div', 'jp-goals-output-content');
    this.node.append(this._alert, this._content);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this._mimeType];
    this.ids = typeof data === 'object' && data !== null ? (data as Record<string, string>) : {};
    this.node.dataset.kind = this.kind;
    if (this._unsubscribe === null) {
      const later = debounce(() => void this.refresh(), 150);
      this._unsubscribe = sharedEventFeed().subscribe(events => {
        if (events === null || events.some(e => this.concerns(e))) {
          later();
        }
      });
    }
    await this.refresh();
  }

  /** Re-read and re-render; never rejects. */
  async refresh(): Promise<void> {
    const token = ++this._token;
    let content: HTMLElement;
    try {
      content = await this.load();
    } catch (error) {
      if (token !== this._token) {
        return;
      }
      const detail = error instanceof Error ? error.message : String(error);
      // keep the last good view below, marked stale
      this._content.querySelector('[data-testid="goals-output-error"]')?.remove();
      this._content.classList.add('jp-goals-mod-stale');
      this._content.prepend(unavailableNode(detail, () => void this.refresh(), 'goals-output-error'));
      return;
    }
    if (token === this._token) {
      this._content.classList.remove('jp-goals-mod-stale');
      this._content.replaceChildren(content);
    }
  }

  dispose(): void {
    this._unsubscribe?.();
    this._unsubscribe = null;
    super.dispose();
  }

  protected abstract readonly kind: string;
  protected abstract load(): Promise<HTMLElement>;
  protected abstract concerns(event: IGoalsEvent): boolean;

  /** POST an action, show a refusal (409 included) clearly, then re-read. */
  protected async act(path: string, body: unknown): Promise<void> {
    try {
      await postGoalsAPI(path, body, this.settings);
      showAlert(this._alert, null);
    } catch (error) {
      showAlert(this._alert, actionErrorText(error));
    }
    await this.refresh();
  }

  protected ids: Record<string, string> = {};
  protected readonly settings = ServerConnection.makeSettings();
  private readonly _mimeType: string;
  private readonly _alert: HTMLElement;
  private readonly _content: HTMLElement;
  private _token = 0;
  private _unsubscribe: (() => void) | null = null;
}

class GoalOutput extends LiveOutput {
  protected readonly kind = 'goal';

  protected async load(): Promise<HTMLElement> {
    const goal = await requestGoalsAPI<IGoal>(
      `goals/${encodeURIComponent(this.ids.goal_id ?? '')}`,
      this.settings
    );
    this._sessionId = goal.session_id;
    return goalView(goal, {
      onAction: action =>
        this.act(`goals/${encodeURIComponent(goal.goal_id)}/actions`, {
          action,
          expected_revision: goal.revision
        })
    });
  }

  protected concerns(event: IGoalsEvent): boolean {
    const sessionId = this._sessionId ?? this.ids.session_id;
    return (
      event.payload?.goal_id === this.ids.goal_id ||
      (!!sessionId && event.session_id === sessionId)
    );
  }

  private _sessionId: string | null = null;
}

class ApprovalOutput extends LiveOutput {
  protected readonly kind = 'approval';

  protected async load(): Promise<HTMLElement> {
    const { approvals } = await requestGoalsAPI<{ approvals: IApproval[] }>('approvals', this.settings);
    const approval = approvals.find(a => a.approval_id === this.ids.approval_id);
    if (!approval) {
      throw new Error(`approval ${this.ids.approval_id} not found on this server`);
    }
    return approvalView(approval, decision =>
      this.act(`approvals/${encodeURIComponent(approval.approval_id)}`, { decision })
    );
  }

  protected concerns(event: IGoalsEvent): boolean {
    return (
      event.kind.startsWith('approval.') &&
      (event.payload?.approval_id === this.ids.approval_id || event.session_id === this.ids.session_id)
    );
  }
}

class HistoryOutput extends LiveOutput {
  protected readonly kind = 'history';

  protected async load(): Promise<HTMLElement> {
    const record = await requestGoalsAPI<IHistoryRecord>(
      `history/${encodeURIComponent(this.ids.record_id ?? '')}`,
      this.settings
    );
    return historyRow(record);
  }

  protected concerns(): boolean {
    return false; // a terminal record never changes; it is only re-read after a reconnect
  }
}

function factory(
  mimeType: string,
  create: (options: IRenderMime.IRendererOptions) => IRenderMime.IRenderer
): IRenderMime.IRendererFactory {
  // safe: the renderer shows server data as text, never as HTML, so untrusted notebooks use it too
  return { safe: true, mimeTypes: [mimeType], defaultRank: 0, createRenderer: create };
}

const extensions: IRenderMime.IExtension[] = [
  {
    id: 'jupyter-goals:goal-output',
    description: 'Live Goal outputs of %goal (ids only; state read from the server).',
    rendererFactory: factory(GOAL_MIME, options => new GoalOutput(options)),
    rank: 0,
    dataType: 'json'
  },
  {
    id: 'jupyter-goals:approval-output',
    description: 'Live approval outputs (Approve / Deny).',
    rendererFactory: factory(APPROVAL_MIME, options => new ApprovalOutput(options)),
    rank: 0,
    dataType: 'json'
  },
  {
    id: 'jupyter-goals:history-output',
    description: 'Terminal Goal records (read-only).',
    rendererFactory: factory(HISTORY_MIME, options => new HistoryOutput(options)),
    rank: 0,
    dataType: 'json'
  }
];

export default extensions;
