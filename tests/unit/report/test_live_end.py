"""A live display ends its last frame with a newline on a console that is not a terminal,
so the next message starts on its own line (issue 25: `└───┘report written: …`)."""

from __future__ import annotations

import io

from rich.console import Console

from rankpack.report.multiplex_live import MultiplexLive


def test_the_next_message_starts_on_its_own_line() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=60)
    display = MultiplexLive(console)
    display.update(1.0, [])
    display.close()
    console.print("report written: r.html")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "report written: r.html"
    assert lines[-2].startswith("└") and lines[-2].rstrip().endswith("┘")
