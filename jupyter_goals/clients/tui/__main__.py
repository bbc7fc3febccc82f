"""``python -m jupyter_goals.clients.tui``: the terminal UI."""

import sys

from jupyter_goals.clients.tui import main

sys.exit(main())
