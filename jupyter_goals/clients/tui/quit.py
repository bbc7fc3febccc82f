"""Quitting with messages not sent yet: typed while the server was away, they wait in the outbox (only
in this process: JupyterLab keeps such messages in the browser, the TUI keeps them while it runs). Quit
asks first, naming how many would be lost: ``y`` quits anyway, ``n`` or ``escape`` stays (they are sent
when the server answers)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from jupyter_goals.clients.tui.render import unsent_question


class QuitScreen(ModalScreen[bool]):
    """Dismissed with True (quit anyway) or False (stay)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Quit anyway", tooltip="quit anyway: the messages not sent are lost"),
        Binding("n,escape", "answer(False)", "Stay", tooltip="stay: the messages are sent when the server answers"),
    ]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 64; max-width: 100%; height: auto; border: heavy $warning; padding: 0 1;
                            background: $surface; }
    """

    def __init__(self, unsent: int) -> None:
        super().__init__()
        self.unsent = unsent

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(unsent_question(self.unsent), id="quit-question", markup=False)
            yield Static("They were typed while the server could not be reached and exist only here.\n"
                         "y quit anyway (they are lost) | n / Esc stay (they are sent when it is back)",
                         markup=False)

    def action_answer(self, quit_anyway: bool) -> None:
        self.dismiss(quit_anyway)
