"""``python -m jupyter_goals.acp``: the ACP agent over stdio."""

import sys

from jupyter_goals.clients.acp import main

sys.exit(main())
