import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { GoalsSidebar } from './sidebar';

export { GoalsSidebar } from './sidebar';
export * from './api';

/** Command ids. */
export namespace CommandIDs {
  export const open = 'jupyter-goals:open';
  export const refresh = 'jupyter-goals:refresh';
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
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ): void => {
    const sidebar = new GoalsSidebar();
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
    }
  }
};

export default plugin;
