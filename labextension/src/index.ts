import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { LabIcon } from '@jupyterlab/ui-components';

import { newChat } from './newchat';
import { startNotifications } from './notify';
import { SessionView } from './session';
import { GoalsSidebar } from './sidebar';

export { GoalsSidebar } from './sidebar';
export { SessionView } from './session';
export * from './api';

/** Command ids. */
export namespace CommandIDs {
  export const open = 'jupyter-goals:open';
  export const refresh = 'jupyter-goals:refresh';
  export const newChat = 'jupyter-goals:new-chat';
  export const openSession = 'jupyter-goals:open-session';
}

const GOALS_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20zm0 18a8 8 0 1 1 0-16 8 8 0 0 1 0 16z"/>
    <path d="M12 6a6 6 0 1 0 0 12 6 6 0 0 0 0-12zm0 10a4 4 0 1 1 0-8 4 4 0 0 1 0 8z"/>
    <circle cx="12" cy="12" r="2"/>
  </g>
</svg>`;

export const goalsIcon = new LabIcon({
  name: 'jupyter-goals:goals',
  svgstr: GOALS_SVG
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-goals:sidebar',
  description:
    'A left-sidebar panel showing jupyter_goals server health and sessions.',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    fileBrowser: IDefaultFileBrowser | null
  ): void => {
    const tracker = new WidgetTracker<MainAreaWidget<SessionView>>({ namespace: 'jupyter-goals-session' });

    app.commands.addCommand(CommandIDs.openSession, {
      label: args => (args.session_id ? `Goals: Open session ${String(args.session_id)}` : 'Goals: Open session'),
      execute: async args => {
        const sessionId = String(args.session_id ?? '');
        if (!sessionId) {
          return null;
        }
        const found = tracker.find(w => w.content.sessionId === sessionId);
        if (found) {
          if (!found.isAttached) {
            app.shell.add(found, 'main');
          }
          app.shell.activateById(found.id);
          return found;
        }
        const content = new SessionView(sessionId);
        const widget = new MainAreaWidget({ content });
        widget.id = `jupyter-goals-session-${sessionId}`;
        widget.title.label = 'Chat';
        widget.title.icon = goalsIcon;
        widget.title.closable = true;
        widget.node.dataset.testid = 'goals-session-widget';
        content.title.changed.connect(() => {
          widget.title.label = content.title.label;
          widget.title.caption = content.title.caption;
        });
        await tracker.add(widget);
        if (!widget.isAttached) {
          app.shell.add(widget, 'main', { mode: args.mode === 'split-right' ? 'split-right' : 'tab-after' });
        }
        if (args.activate !== false) {
          app.shell.activateById(widget.id);
        }
        return widget;
      }
    });

    app.commands.addCommand(CommandIDs.newChat, {
      label: 'Goals: New chat',
      caption: 'Start a chat with an AI agent whose work survives restarts',
      icon: goalsIcon,
      execute: async () => {
        const folder = fileBrowser?.model.path ?? '';
        // the file browser's path is relative to the server root, which may carry a drive prefix
        const relative = folder.includes(':') ? folder.split(':').slice(1).join(':') : folder;
        const sessionId = await newChat(relative);
        if (sessionId) {
          await app.commands.execute(CommandIDs.openSession, { session_id: sessionId });
          sidebar.refresh();
        }
        return sessionId;
      }
    });

    if (restorer) {
      void restorer.restore(tracker, {
        command: CommandIDs.openSession,
        args: widget => ({ session_id: widget.content.sessionId, activate: false }),
        name: widget => widget.content.sessionId
      });
    }

    const sidebar = new GoalsSidebar(undefined, {
      openSession: sessionId => void app.commands.execute(CommandIDs.openSession, { session_id: sessionId }),
      newChat: () => void app.commands.execute(CommandIDs.newChat)
    });
    sidebar.title.icon = goalsIcon;
    sidebar.title.caption = 'Goals';
    app.shell.add(sidebar, 'left', { rank: 600 });
    if (restorer) {
      restorer.add(sidebar, sidebar.id);
    }

    app.commands.addCommand(CommandIDs.open, {
      label: 'Goals: Open sidebar',
      caption: 'Show the Goals sidebar (server health and sessions)',
      icon: goalsIcon,
      execute: () => {
        if (!sidebar.isAttached) {
          app.shell.add(sidebar, 'left', { rank: 600 });
        }
        app.shell.activateById(sidebar.id);
      }
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Goals: Refresh sidebar',
      execute: () => sidebar.refresh()
    });

    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'Goals' });
      palette.addItem({ command: CommandIDs.refresh, category: 'Goals' });
      palette.addItem({ command: CommandIDs.newChat, category: 'Goals' });
    }
    void app.restored.then(() =>
      startNotifications(sessionId => void app.commands.execute(CommandIDs.openSession, { session_id: sessionId }))
    );
  }
};

export default plugin;
